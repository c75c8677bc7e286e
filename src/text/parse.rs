//! Parsing rows of the Extreme Classification Repository text formats.
//!
//! Four line syntaxes occur:
//! - [`LineSyntax::LabelsFeatures`]: `l1,l2,... f:v f:v ...` (single-file and split layouts);
//!   the label field is absent when the line starts with a feature token or is blank;
//! - [`LineSyntax::Features`]: `f:v f:v ...` (BoW feature files);
//! - [`LineSyntax::LabelValues`]: `l:v l:v ...` (BoW label files; a listed label is a
//!   positive, its value is checked to be finite and otherwise ignored);
//! - [`LineSyntax::Libsvm`]: `v1[,v2...] [qid:N] f:v f:v ... [# comment]` (LIBSVM / SVMlight
//!   files): the labels are signed integer class *values*, mapped to label ids through the
//!   dataset's [`ClassMap`]; `qid:` tokens are counted and ignored.
//!
//! When the ingest assigns the label ids (LIBSVM, `--first-label`), rows are parsed twice:
//! first without a class map, to collect the label values and the largest feature id into
//! [`ParsedBlock::scan`], then with the map the scan decided (`crate::ingest::labels`).
//! `pipeline predict --input` parses new rows with the rules of the run's dataset (its
//! class map, index base, D and fitted transform), so they are read as its rows were.
//!
//! Every malformed token is an error naming the line, what was found and what was
//! expected. The parser is pure (bytes in, CSR rows out) so it can run on many threads.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::choice::choice_enum;
use crate::error::LineError;
use crate::store::chunks::{CsrChunk, RowRef};
use crate::store::classes::ClassMap;
use crate::transform::Transform;

/// How the numbers on a line are checked and transformed.
#[derive(Debug, Clone, PartialEq)]
pub struct RowRules {
    /// D: feature ids must be < D (after removing `index_base`).
    pub n_features: u32,
    /// L: label ids must be < L (after removing `index_base`).
    pub n_labels: u32,
    /// 0 or 1: the smallest id in the file.
    pub index_base: u32,
    /// What is done to the row's values before they are stored (fitted on the training
    /// split; [`Transform::None`] in the scan passes).
    pub transform: Transform,
    /// Skip bad rows (counting them) and accept CRLF line ends and a missing final newline.
    pub lenient: bool,
    /// Whether the command has `--lenient` (ingest), so messages may offer it; `predict
    /// --input` is always strict.
    pub offers_lenient: bool,
    /// Where D comes from, for messages: `"in the header"` or `"from --features"`.
    pub features_from: &'static str,
    /// How the labels become label ids.
    pub labels: LabelRules,
    /// What a feature id ≥ D is: an error (ingest, and `predict --input` by default), or
    /// dropped and counted (`predict --input --unknown-features drop`).
    pub unknown_features: UnknownFeatures,
}

choice_enum! {
    /// What `pipeline predict --input` does with a feature id the run's dataset does not
    /// have (≥ D): the model has no weight for it.
    #[derive(Default)]
    pub enum UnknownFeatures("unknown-features") {
        /// The row is an error naming its line and the id.
        #[default]
        Refuse = "refuse" => "stop at the first such feature, naming its line and id",
        /// The feature is left out of the row, as if the file lacked it, and counted.
        Drop = "drop" => "leave such features out of their rows (before the dataset's \
                          transform, as if the file lacked them) and report how many",
    }
}

/// The largest D and L a dataset may have, so every feature and label id (0-based) is below
/// it: 2³¹ − 1, the largest index the LIBSVM format's own tools write (a C `int`). Ids are
/// checked against it as they are parsed, before any size is derived from them, so a stray
/// id such as 4 000 000 000 is refused at its line instead of becoming a D no later stage
/// can allocate for (`docs/formats.md`, "Limits").
pub const MAX_IDS: u32 = i32::MAX as u32;

/// The label id the writing pass gives a row whose class is one of the class map's unseen
/// ones (`--class-map train`); never stored: ingest's `SplitSink` strips it, and a scored
/// row has no true class then.
pub const UNSEEN_CLASS: u32 = u32::MAX;

/// How a row's labels become label ids.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelRules {
    /// Keep only the first listed label of each row (`--first-label`).
    pub first_label: bool,
    /// Label values → label ids when the ingest assigns the ids (LIBSVM, `--first-label`).
    /// None with [`LabelRules::assigned`]: the scan pass, which collects the values.
    pub classes: Option<Arc<ClassMap>>,
    /// Refuse a row without exactly one label (binary and multi-class LIBSVM datasets).
    pub exactly_one: bool,
    /// With `exactly_one`, also accept a row without a label: new rows scored by `predict
    /// --input` need not carry one (several are still refused).
    pub unlabeled_ok: bool,
    /// Leave out a label value the class map does not hold instead of refusing the row:
    /// new rows of a multi-label model, whose scores use no label of the row, from test
    /// files that carry labels no training row had (common in extreme classification).
    pub unknown_left_out: bool,
}

impl LabelRules {
    /// Whether label ids are assigned by a class map rather than read from the file.
    pub fn assigned(&self, syntax: LineSyntax) -> bool {
        self.first_label || syntax == LineSyntax::Libsvm
    }
}

impl RowRules {
    /// Rules for ids as in the file, D and L from headers.
    pub fn new(n_features: u32, n_labels: u32, index_base: u32) -> Self {
        RowRules {
            n_features,
            n_labels,
            index_base,
            transform: Transform::None,
            lenient: false,
            offers_lenient: true,
            features_from: "in the header",
            labels: LabelRules::default(),
            unknown_features: UnknownFeatures::Refuse,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineSyntax {
    LabelsFeatures,
    Features,
    LabelValues,
    Libsvm,
}

/// What the scan pass learns of a block's rows (label values after `--first-label`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelScan {
    /// Distinct label values (bounded by the number of classes, not by N).
    pub values: BTreeSet<i64>,
    pub rows: u64,
    /// Rows with no label, and the source line of the first.
    pub unlabeled_rows: u64,
    pub first_unlabeled: Option<u64>,
    /// Rows with more than one label, and the source line of the first.
    pub multi_label_rows: u64,
    pub first_multi_label: Option<u64>,
    /// The largest feature id (after `index_base`) of any row.
    pub max_feature: Option<u32>,
}

impl LabelScan {
    /// Adds the counts of a later block (`other`'s lines come after this one's).
    pub fn merge(&mut self, other: LabelScan) {
        self.values.extend(other.values);
        self.rows += other.rows;
        self.unlabeled_rows += other.unlabeled_rows;
        self.first_unlabeled = self.first_unlabeled.or(other.first_unlabeled);
        self.multi_label_rows += other.multi_label_rows;
        self.first_multi_label = self.first_multi_label.or(other.first_multi_label);
        self.max_feature = self.max_feature.max(other.max_feature);
    }

    fn record(&mut self, line_no: u64, values: &[i64], features: &[(u32, f64)]) {
        self.rows += 1;
        self.values.extend(values.iter().copied());
        match values.len() {
            0 => {
                self.unlabeled_rows += 1;
                self.first_unlabeled.get_or_insert(line_no);
            }
            1 => {}
            _ => {
                self.multi_label_rows += 1;
                self.first_multi_label.get_or_insert(line_no);
            }
        }
        // The features are sorted by id once the row is finished.
        self.max_feature = self.max_feature.max(features.last().map(|f| f.0));
    }
}

/// A parsed block with the lines it covered: ingest's unit of work (a text block's lines,
/// or a block of rows in memory, each row counting as a line).
pub struct Parsed {
    pub first_line: u64,
    pub n_lines: u64,
    pub block: ParsedBlock,
}

/// Rows parsed from one block of lines.
///
/// In a parsed block `rows.row_ids` hold the 1-based *source line numbers* of the rows;
/// the assembler replaces them by row positions when it writes chunks.
#[derive(Debug, Clone, Default)]
pub struct ParsedBlock {
    pub rows: CsrChunk,
    /// Rows skipped in lenient mode, and the first few reasons.
    pub skipped: u64,
    pub skip_reasons: Vec<LineError>,
    /// Lines whose CRLF ending was accepted (lenient mode).
    pub crlf_lines: u64,
    /// `qid:` tokens ignored (LIBSVM).
    pub qid_tokens: u64,
    /// Feature tokens with an id ≥ D left out, and the rows that had one
    /// ([`UnknownFeatures::Drop`]).
    pub dropped_features: u64,
    pub rows_with_dropped: u64,
    /// The scan pass's findings (empty unless the ids are assigned and no map is given).
    pub scan: LabelScan,
}

/// Reasons kept per block for the report; the count is always exact.
const KEPT_REASONS: usize = 5;

/// Reusable per-thread buffers for one row.
#[derive(Default)]
struct RowScratch {
    labels: Vec<u32>,
    /// Label values of a row whose ids are assigned (LIBSVM, `--first-label`).
    label_values: Vec<i64>,
    qid_tokens: u64,
    /// Feature tokens of the row dropped for an id ≥ D ([`UnknownFeatures::Drop`]).
    dropped_features: u64,
    features: Vec<(u32, f64)>,
    indices: Vec<u32>,
    values: Vec<f32>,
}

/// Shortens a token for an error message.
fn show(token: &[u8]) -> String {
    const MAX: usize = 40;
    let text = String::from_utf8_lossy(&token[..token.len().min(MAX)]).into_owned();
    if token.len() > MAX {
        format!("{text}...")
    } else {
        text
    }
}

/// Parses an unsigned decimal integer of at most `u64::MAX` (leading zeros allowed).
pub fn parse_u64(bytes: &[u8]) -> Option<u64> {
    // Zeros in front add no value, however many (a zero itself keeps its last digit).
    let significant = bytes.iter().position(|&b| b != b'0');
    let bytes = &bytes[significant.unwrap_or(bytes.len().saturating_sub(1))..];
    if bytes.is_empty() || bytes.len() > 20 {
        return None;
    }
    let mut v: u64 = 0;
    for &b in bytes {
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(d))?;
    }
    Some(v)
}

/// Parses a class label: a signed decimal integer (`-1`, `+1`, `7`), or a decimal number
/// with no fractional part (`1.0`) as some LIBSVM files write them, of magnitude ≤ 2⁵³.
pub fn parse_class_value(bytes: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(bytes).ok()?;
    if let Ok(v) = text.strip_prefix('+').unwrap_or(text).parse::<i64>() {
        return Some(v);
    }
    let v = text.parse::<f64>().ok()?;
    let exact = v.is_finite() && v.fract() == 0.0 && v.abs() <= 9_007_199_254_740_992.0;
    exact.then_some(v as i64)
}

fn parse_f64(bytes: &[u8]) -> Option<f64> {
    std::str::from_utf8(bytes).ok()?.parse::<f64>().ok()
}

fn is_space(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

/// Splits on runs of spaces and tabs.
fn tokens(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    line.split(|&b| is_space(b)).filter(|t| !t.is_empty())
}

/// The fields of `line` when it is a header (`N D L`: 3, or a BoW feature file's `N D`: 2)
/// rather than a row of the XML-repository syntax: two or three tokens, each only digits.
/// No valid row looks so (a row's tokens after the label field are `feature:value` pairs),
/// so the first line of a file tells whether it has one (`predict --input` reads both).
pub fn header_fields(line: &[u8]) -> Option<usize> {
    let found: Vec<&[u8]> = tokens(line).collect();
    let digits = found.iter().all(|t| t.iter().all(u8::is_ascii_digit));
    ((2..=3).contains(&found.len()) && digits).then_some(found.len())
}

/// Parses a header of `fields` whitespace-separated non-negative integers (`N D L`, `N D`).
pub fn parse_header(line: &[u8], names: &[&str]) -> Result<Vec<u64>, String> {
    let expected = names.join(" ");
    if line.last() == Some(&b'\r') {
        return Err(format!(
            "found a CRLF line ending, expected '\\n' line ends (header '{expected}')"
        ));
    }
    let found: Vec<&[u8]> = tokens(line).collect();
    if found.len() != names.len() {
        return Err(format!(
            "found header '{}', expected {} integers '{expected}'",
            show(line),
            names.len()
        ));
    }
    found
        .iter()
        .zip(names)
        .map(|(t, name)| {
            parse_u64(t).ok_or_else(|| match t.iter().all(u8::is_ascii_digit) {
                true => format!(
                    "found {name} = {} in the header, expected at most {} (header \
                     '{expected}')",
                    show(t),
                    u64::MAX
                ),
                false => format!(
                    "found '{}' for {name} in the header, expected a non-negative integer \
                     (header '{expected}')",
                    show(t)
                ),
            })
        })
        .collect()
}

/// The message for a decimal id above `max_written`, the largest a dataset may use as
/// written in its file ([`MAX_IDS`] − 1, plus `--index-base`).
pub fn id_too_large(what: &str, token: &[u8], max_written: u64) -> String {
    format!(
        "found {what} id {}, expected at most {max_written}: it is larger than the largest id \
         fsgp reads (D and L are at most 2^31 - 1; docs/formats.md, \"Limits\")",
        show(token)
    )
}

impl RowRules {
    /// The largest id accepted as written in the file: [`MAX_IDS`] − 1 after `index_base`.
    fn max_written_id(&self) -> u64 {
        u64::from(MAX_IDS) - 1 + u64::from(self.index_base)
    }

    fn id(&self, token: &[u8], what: &str, limit: u32, header: char) -> Result<u32, String> {
        if token.is_empty() || !token.iter().all(u8::is_ascii_digit) {
            return Err(format!(
                "found {what} id '{}', expected a non-negative integer",
                show(token)
            ));
        }
        let max = self.max_written_id();
        // Digits only: any value that does not fit (however many digits) is too large.
        let raw = parse_u64(token)
            .filter(|&v| v <= max)
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| id_too_large(what, token, max))?;
        if raw < self.index_base {
            return Err(format!(
                "found {what} id {raw}, expected ids >= 1 (--index-base 1)"
            ));
        }
        let id = raw - self.index_base;
        if id >= limit {
            return Err(self.id_beyond(what, u64::from(raw), limit, header));
        }
        Ok(id)
    }

    /// "found {what} id RAW, expected < MAX (D = … from …)": `raw` as written (with the
    /// index base), at or past `limit`.
    fn id_beyond(&self, what: &str, raw: u64, limit: u32, header: char) -> String {
        let max = u64::from(limit) + u64::from(self.index_base);
        let from = match header {
            'D' => self.features_from,
            _ => "in the header",
        };
        format!("found {what} id {raw}, expected < {max} ({header} = {limit} {from})")
    }

    /// "found non-finite value TEXT for {what} ID, expected a finite number".
    pub(crate) fn non_finite(what: &str, text: &str, id: u32) -> String {
        format!("found non-finite value '{text}' for {what} {id}, expected a finite number")
    }

    fn label_list(&self, token: &[u8], s: &mut RowScratch) -> Result<(), String> {
        for part in token.split(|&b| b == b',') {
            if part.is_empty() {
                return Err(format!(
                    "found label list '{}' with an empty entry, expected comma-separated ids",
                    show(token)
                ));
            }
            let id = self.id(part, "label", self.n_labels, 'L')?;
            if !self.labels.first_label {
                s.labels.push(id);
            } else if s.label_values.is_empty() {
                // The other entries are still checked above; only the first is kept.
                s.label_values.push(i64::from(id));
            }
        }
        Ok(())
    }

    /// A LIBSVM label field: comma-separated class values.
    fn class_values(&self, token: &[u8], s: &mut RowScratch) -> Result<(), String> {
        for part in token.split(|&b| b == b',') {
            let value = parse_class_value(part).ok_or_else(|| {
                format!(
                    "found label '{}' in '{}', expected an integer class label (-1, 1, 0, 7, \
                     or comma-separated ones)",
                    show(part),
                    show(token)
                )
            })?;
            if !self.labels.first_label || s.label_values.is_empty() {
                s.label_values.push(value);
            }
        }
        Ok(())
    }

    /// Splits `id:value`, checking both parts.
    fn id_value(
        &self,
        token: &[u8],
        what: &str,
        limit: u32,
        header: char,
    ) -> Result<(u32, f64), String> {
        let colon = memchr::memchr(b':', token)
            .ok_or_else(|| format!("found token '{}', expected '{what}:value'", show(token)))?;
        let id = self.id(&token[..colon], what, limit, header)?;
        let text = &token[colon + 1..];
        let value = parse_f64(text).ok_or_else(|| {
            format!(
                "found value '{}' in token '{}', expected a decimal number",
                show(text),
                show(token)
            )
        })?;
        if !value.is_finite() {
            return Err(Self::non_finite(what, &show(text), id));
        }
        Ok((id, value))
    }

    /// Parses one line (without its line end) into `s.labels` / `s.features`.
    fn parse_line(
        &self,
        line: &[u8],
        syntax: LineSyntax,
        s: &mut RowScratch,
    ) -> Result<(), String> {
        let mut toks = tokens(line).peekable();
        if syntax == LineSyntax::LabelValues {
            for tok in toks {
                let (id, _) = self.id_value(tok, "label", self.n_labels, 'L')?;
                if !self.labels.first_label {
                    s.labels.push(id);
                } else if s.label_values.is_empty() {
                    s.label_values.push(i64::from(id));
                }
            }
            return Ok(());
        }
        if let Some(first) = toks.peek() {
            let labels = memchr::memchr(b':', first).is_none();
            if labels && syntax == LineSyntax::LabelsFeatures {
                self.label_list(first, s)?;
                toks.next();
            } else if labels && syntax == LineSyntax::Libsvm && !first.starts_with(b"#") {
                self.class_values(first, s)?;
                toks.next();
            }
        }
        for tok in toks {
            if syntax == LineSyntax::Libsvm {
                if tok.starts_with(b"#") {
                    break; // SVMlight: the rest of the line is a comment
                }
                if tok.starts_with(b"qid:") {
                    s.qid_tokens += 1;
                    continue;
                }
            }
            // Dropping: the id is checked against the largest any dataset has, then
            // against D here, so a malformed token is still an error.
            let limit = match self.unknown_features {
                UnknownFeatures::Refuse => self.n_features,
                UnknownFeatures::Drop => MAX_IDS,
            };
            let (id, value) = self.id_value(tok, "feature", limit, 'D')?;
            if id >= self.n_features {
                s.dropped_features += 1;
                continue;
            }
            s.features.push((id, value));
        }
        Ok(())
    }

    /// Checks an assigned-id row's label values and maps them to label ids (with a class
    /// map); without one (the scan pass) the values stay in `s.label_values`.
    fn assign_labels(&self, s: &mut RowScratch) -> Result<(), String> {
        s.label_values.sort_unstable();
        if let Some(w) = s.label_values.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!(
                "found label {} twice in the row, expected unique labels",
                w[0]
            ));
        }
        let n = s.label_values.len();
        if self.labels.exactly_one && self.labels.unlabeled_ok && n > 1 {
            return Err(format!(
                "found {n} labels, expected at most one (the run's dataset is binary or \
                 multi-class)"
            ));
        }
        if self.labels.exactly_one && !self.labels.unlabeled_ok && n != 1 {
            return Err(format!(
                "found {n} labels, expected exactly one (a binary or multi-class dataset; \
                 pass --label-kind multilabel if rows may have none or several)"
            ));
        }
        let Some(map) = &self.labels.classes else {
            return Ok(());
        };
        for &v in &s.label_values {
            if map.negative == Some(v) {
                continue;
            }
            let id = match map.id_of(v) {
                Some(id) => id,
                // `--class-map train`: a class no training row has; the sink counts the row
                // and stores it without a label id.
                None if map.is_unseen(v) => UNSEEN_CLASS,
                None if self.labels.unknown_left_out => continue,
                None => return Err(unknown_class(v, map)),
            };
            s.labels.push(id);
        }
        Ok(())
    }

    /// Sorts and checks the row's ids, transforms the values, and fills `s.indices` / `s.values`.
    /// Returns the squared norm of the stored f32 values.
    fn finish_row(&self, s: &mut RowScratch) -> Result<f32, String> {
        if !s.labels.is_sorted() {
            s.labels.sort_unstable();
        }
        if let Some(w) = s.labels.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!(
                "found label {} twice in the row, expected unique labels",
                w[0] + self.index_base
            ));
        }
        if !s.features.is_sorted_by_key(|f| f.0) {
            s.features.sort_by_key(|f| f.0);
        }
        if let Some(w) = s.features.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(format!(
                "found feature {} twice in the row, expected unique feature ids",
                w[0].0 + self.index_base
            ));
        }
        // The L2 transform divides by the norm of the values as read: an infinite one
        // would turn the row into zeros, scored as an empty row.
        self.check_squared_norm(s.features.iter().copied(), f64::MAX, "")?;
        self.transform
            .apply(&s.features, &mut s.indices, &mut s.values)
            .map_err(|(id, v)| {
                format!(
                    "found value {v} for feature {}, expected a value that fits in f32{}",
                    id + self.index_base,
                    self.after_transform()
                )
            })?;
        // The row's squared norm is stored in f32 beside it and enters every kernel value.
        let stored = s.indices.iter().zip(&s.values);
        let stored = stored.map(|(&id, &v)| (id, f64::from(v)));
        let sq_norm =
            self.check_squared_norm(stored, f64::from(f32::MAX), self.after_transform())?;
        Ok(sq_norm as f32)
    }

    /// `" after the dataset's transform"` when the transform changes the values the
    /// messages name (the L2 one only rescales the row).
    fn after_transform(&self) -> &'static str {
        match self.transform {
            Transform::None | Transform::L2 => "",
            _ => " after the dataset's transform",
        }
    }

    /// The sum of the squares of `values` (in their order), or the message naming the
    /// feature whose square takes it beyond `limit` (or makes it non-finite).
    fn check_squared_norm(
        &self,
        values: impl Iterator<Item = (u32, f64)>,
        limit: f64,
        after_transform: &str,
    ) -> Result<f64, String> {
        let mut sum = 0.0f64;
        for (id, v) in values {
            sum += v * v;
            // The values are finite, so the sum is never NaN: an overflow is +∞ > limit.
            if sum > limit {
                return Err(format!(
                    "found value {v:e} for feature {}{after_transform}, whose square takes the \
                     row's squared norm beyond {limit:e}, expected values whose squares sum \
                     to at most {limit:e}",
                    id + self.index_base
                ));
            }
        }
        Ok(sum)
    }
}

/// The message for a label value the class map does not hold.
fn unknown_class(value: i64, map: &ClassMap) -> String {
    let mut known: Vec<String> = map.values.iter().take(10).map(|v| v.to_string()).collect();
    if map.values.len() > 10 {
        known.push("...".into());
    }
    if let Some(n) = map.negative {
        known.insert(0, n.to_string());
    }
    format!(
        "found label {value}, expected one of the dataset's classes ({})",
        known.join(", ")
    )
}

/// Iterates the lines of a block: (line number, line without '\n').
fn lines(block: &[u8], first_line: u64) -> impl Iterator<Item = (u64, &[u8])> {
    let body = block.strip_suffix(b"\n").unwrap_or(block);
    let mut n = first_line;
    // An empty block has no lines; otherwise split yields exactly one item per line.
    (!block.is_empty())
        .then(|| body.split(|&b| b == b'\n'))
        .into_iter()
        .flatten()
        .map(move |line| {
            n += 1;
            (n - 1, line)
        })
}

/// Message for a CRLF line end; `--lenient` is offered when the command has it.
fn crlf_msg(rules: &RowRules) -> String {
    let lenient = match rules.offers_lenient {
        true => ", or pass --lenient to accept them",
        false => "",
    };
    format!(
        "found a CRLF line ending (\"\\r\\n\"), expected \"\\n\" (strip the '\\r' \
         characters{lenient})"
    )
}

/// Which of a block's inputs a problem was found in (0: the main file, 1: a BoW label file).
pub type BlockError = (usize, LineError);

struct BlockParser<'r> {
    rules: &'r RowRules,
    out: ParsedBlock,
    scratch: RowScratch,
}

impl<'r> BlockParser<'r> {
    fn new(rules: &'r RowRules) -> Self {
        BlockParser {
            rules,
            out: ParsedBlock::default(),
            scratch: RowScratch::default(),
        }
    }

    /// Removes a '\r' line end, or explains why it cannot.
    fn line_end<'a>(&mut self, line: &'a [u8]) -> Result<&'a [u8], String> {
        match line.strip_suffix(b"\r") {
            Some(stripped) if self.rules.lenient => {
                self.out.crlf_lines += 1;
                Ok(stripped)
            }
            Some(_) => Err(crlf_msg(self.rules)),
            None => Ok(line),
        }
    }

    /// Handles a bad row: an error in strict mode, a counted skip in lenient mode.
    fn reject(&mut self, source: usize, line_no: u64, msg: String) -> Result<(), BlockError> {
        if !self.rules.lenient {
            return Err((source, LineError::new(line_no, msg)));
        }
        self.out.skipped += 1;
        if self.out.skip_reasons.len() < KEPT_REASONS {
            self.out.skip_reasons.push(LineError::new(line_no, msg));
        }
        Ok(())
    }

    fn push(&mut self, line_no: u64, syntax: LineSyntax) -> Result<(), String> {
        let assigned = self.rules.labels.assigned(syntax);
        if assigned {
            self.rules.assign_labels(&mut self.scratch)?;
        }
        let sq_norm = self.rules.finish_row(&mut self.scratch)?;
        let s = &self.scratch;
        self.out.qid_tokens += s.qid_tokens;
        self.out.dropped_features += s.dropped_features;
        self.out.rows_with_dropped += u64::from(s.dropped_features > 0);
        if assigned && self.rules.labels.classes.is_none() {
            self.out.scan.record(line_no, &s.label_values, &s.features);
        }
        self.out.rows.push_row(RowRef {
            row_id: line_no,
            labels: &s.labels,
            indices: &s.indices,
            values: &s.values,
            sq_norm,
        });
        Ok(())
    }

    fn clear(&mut self) {
        self.scratch.labels.clear();
        self.scratch.label_values.clear();
        self.scratch.features.clear();
        self.scratch.qid_tokens = 0;
        self.scratch.dropped_features = 0;
    }
}

/// Message for a file whose last line lacks '\n'; `--lenient` is offered when the command
/// has it.
fn unterminated_msg(rules: &RowRules) -> String {
    let lenient = match rules.offers_lenient {
        true => "; pass --lenient to accept it",
        false => "",
    };
    format!(
        "found the last line without a '\\n' line end, expected every line to end with '\\n' \
         (the file may be truncated{lenient})"
    )
}

/// Parses a block of lines of one syntax.
///
/// `terminated` is false for a file's final block whose last line lacks '\n'.
pub fn parse_block(
    block: &[u8],
    first_line: u64,
    terminated: bool,
    syntax: LineSyntax,
    rules: &RowRules,
) -> Result<ParsedBlock, BlockError> {
    let mut p = BlockParser::new(rules);
    let mut last_line = first_line;
    for (line_no, raw) in lines(block, first_line) {
        last_line = line_no;
        p.clear();
        let parsed = p
            .line_end(raw)
            .and_then(|line| rules.parse_line(line, syntax, &mut p.scratch))
            .and_then(|()| p.push(line_no, syntax));
        if let Err(msg) = parsed {
            p.reject(0, line_no, msg)?;
        }
    }
    if !terminated && !block.is_empty() && !rules.lenient {
        return Err((0, LineError::new(last_line, unterminated_msg(rules))));
    }
    Ok(p.out)
}

/// Rows given as (feature id, value) pairs instead of text: a matrix already in memory
/// (the Python bindings' NumPy and SciPy rows). Each row goes through what a parsed line's
/// features go through, so a row gets the bits its text would get: ids checked against D
/// (an error, or dropped and counted, as `rules.unknown_features` says), values checked
/// finite, then [`RowRules::finish_row`]'s sort, duplicate check and transform. The rows
/// carry no labels.
pub struct PairRows {
    rules: RowRules,
    scratch: RowScratch,
    out: ParsedBlock,
}

impl PairRows {
    /// Rows under `rules`, whose index base is not used: the caller's ids are 0-based, and
    /// every message names them as given.
    pub fn new(rules: &RowRules) -> Self {
        PairRows {
            rules: RowRules {
                index_base: 0,
                ..rules.clone()
            },
            scratch: RowScratch::default(),
            out: ParsedBlock::default(),
        }
    }

    /// Appends the row of `pairs` (0-based feature ids, in any order) as row `row_id`. An
    /// error says what a parsed line's would, with the ids as given.
    pub fn push(
        &mut self,
        row_id: u64,
        pairs: impl IntoIterator<Item = (u64, f64)>,
    ) -> Result<(), String> {
        self.push_row(row_id, None, pairs).map_err(|e| e.msg)
    }

    /// Appends a row of `pairs` whose labels are the class values `labels`, as a LIBSVM
    /// line's label field gives them: mapped to label ids by the rules' class map, or, in
    /// the scan pass (no map), collected into the block's [`LabelScan`].
    pub fn push_labeled(
        &mut self,
        row_id: u64,
        labels: &[i64],
        pairs: impl IntoIterator<Item = (u64, f64)>,
    ) -> Result<(), PairError> {
        self.push_row(row_id, Some(labels), pairs)
    }

    /// What [`PairRows::push`] and [`PairRows::push_labeled`] share: the checks and steps
    /// of a parsed line (`BlockParser::push`), on pairs instead of tokens.
    fn push_row(
        &mut self,
        row_id: u64,
        labels: Option<&[i64]>,
        pairs: impl IntoIterator<Item = (u64, f64)>,
    ) -> Result<(), PairError> {
        let (rules, s) = (&self.rules, &mut self.scratch);
        s.features.clear();
        s.labels.clear();
        s.label_values.clear();
        s.dropped_features = 0;
        for (id, value) in pairs {
            let Some(id) = u32::try_from(id).ok().filter(|&i| i < rules.n_features) else {
                match rules.unknown_features {
                    UnknownFeatures::Refuse => {
                        let msg = rules.id_beyond("feature", id, rules.n_features, 'D');
                        return Err(PairError::at(Some(id), msg));
                    }
                    UnknownFeatures::Drop => s.dropped_features += 1,
                }
                continue;
            };
            if !value.is_finite() {
                let msg = RowRules::non_finite("feature", &value.to_string(), id);
                return Err(PairError::at(Some(u64::from(id)), msg));
            }
            s.features.push((id, value));
        }
        if let Some(values) = labels {
            s.label_values.extend_from_slice(values);
            rules
                .assign_labels(s)
                .map_err(|msg| PairError::at(None, msg))?;
        }
        let sq_norm = rules
            .finish_row(s)
            .map_err(|msg| PairError::at(None, msg))?;
        self.out.dropped_features += s.dropped_features;
        self.out.rows_with_dropped += u64::from(s.dropped_features > 0);
        if labels.is_some() && rules.labels.classes.is_none() {
            self.out.scan.record(row_id, &s.label_values, &s.features);
        }
        self.out.rows.push_row(RowRef {
            row_id,
            labels: &s.labels,
            indices: &s.indices,
            values: &s.values,
            sq_norm,
        });
        Ok(())
    }

    /// The rows pushed since the last call, as one chunk, with their dropped-feature
    /// counts; the next rows start a new chunk.
    pub fn take(&mut self) -> ParsedBlock {
        std::mem::take(&mut self.out)
    }
}

/// Why [`PairRows`] refused a row: what a parsed line's error would say, and the feature
/// at fault when one is (an id ≥ D, a value that is not finite).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairError {
    pub feature: Option<u64>,
    pub msg: String,
}

impl PairError {
    fn at(feature: Option<u64>, msg: String) -> Self {
        PairError { feature, msg }
    }
}

/// Parses matching blocks of a BoW feature file (source 0) and label file (source 1):
/// line i of one is the same row as line i of the other.
pub fn parse_bow_block(
    features: &[u8],
    labels: &[u8],
    first_line: u64,
    terminated: (bool, bool),
    rules: &RowRules,
) -> Result<ParsedBlock, BlockError> {
    let mut p = BlockParser::new(rules);
    let mut label_lines = lines(labels, first_line);
    let mut last_line = first_line;
    for (line_no, raw) in lines(features, first_line) {
        last_line = line_no;
        let Some((_, label_raw)) = label_lines.next() else {
            return Err((
                1,
                LineError::new(
                    line_no,
                    "found the end of the label file, expected a label row for every feature row",
                ),
            ));
        };
        p.clear();
        let label_part = p
            .line_end(label_raw)
            .and_then(|l| rules.parse_line(l, LineSyntax::LabelValues, &mut p.scratch));
        if let Err(msg) = label_part {
            p.reject(1, line_no, msg)?;
            continue;
        }
        let parsed = p
            .line_end(raw)
            .and_then(|line| rules.parse_line(line, LineSyntax::Features, &mut p.scratch))
            .and_then(|()| p.push(line_no, LineSyntax::Features));
        if let Err(msg) = parsed {
            p.reject(0, line_no, msg)?;
        }
    }
    if !rules.lenient {
        for (source, ok) in [(0, terminated.0), (1, terminated.1)] {
            if !ok {
                return Err((source, LineError::new(last_line, unterminated_msg(rules))));
            }
        }
    }
    Ok(p.out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> RowRules {
        RowRules::new(10, 5, 0)
    }

    fn parse(text: &str) -> Result<ParsedBlock, BlockError> {
        parse_block(
            text.as_bytes(),
            2,
            text.ends_with('\n'),
            LineSyntax::LabelsFeatures,
            &rules(),
        )
    }

    fn err(text: &str) -> String {
        let (_, e) = parse(text).expect_err("should fail");
        e.to_string()
    }

    #[test]
    fn parses_rows_with_and_without_labels_or_features() {
        let b = parse("1,3 2:0.5 7:1.5\n3:2\n4\n\n").unwrap();
        let r = &b.rows;
        assert_eq!(r.len(), 4);
        assert_eq!(r.row_ids, vec![2, 3, 4, 5]);
        assert_eq!(r.row(0).labels, &[1, 3]);
        assert_eq!(r.row(0).indices, &[2, 7]);
        assert_eq!(r.row(0).values, &[0.5, 1.5]);
        assert_eq!(r.row(0).sq_norm, 2.5);
        assert_eq!(r.row(1).labels, &[] as &[u32]);
        assert_eq!(r.row(1).indices, &[3]);
        assert_eq!(r.row(2).labels, &[4]);
        assert!(r.row(2).indices.is_empty());
        assert!(r.row(3).labels.is_empty() && r.row(3).indices.is_empty());
    }

    #[test]
    fn sorts_unsorted_ids_and_normalises() {
        let mut rl = rules();
        rl.transform = crate::transform::Transform::L2;
        let b = parse_block(b"3,0 9:4 1:3\n", 2, true, LineSyntax::LabelsFeatures, &rl).unwrap();
        let row = b.rows.row(0);
        assert_eq!(row.labels, &[0, 3]);
        assert_eq!(row.indices, &[1, 9]);
        assert_eq!(row.values, &[0.6, 0.8]);
        assert!((row.sq_norm - 1.0).abs() < 1e-7);
    }

    /// A row whose squared norm overflows is refused naming the feature whose square
    /// made it: as read (f64; the L2 transform divides by its root) and as stored (f32).
    #[test]
    fn rows_whose_squared_norm_overflows_are_refused_naming_the_feature() {
        let mut l2 = rules();
        l2.transform = crate::transform::Transform::L2;
        let refused = |rl: &RowRules, line: &str| {
            let (_, e) = parse_block(line.as_bytes(), 2, true, LineSyntax::LabelsFeatures, rl)
                .expect_err(line);
            e.to_string()
        };
        // 1e200 fits f64 but its square does not: under L2 the row became zeros.
        let e = refused(&l2, "1 3:0.5 4:1e200\n");
        assert!(
            e.starts_with(
                "line 2: found value 1e200 for feature 4, whose square takes the \
                           row's squared norm beyond 1.7976931348623157e308"
            ),
            "{e}"
        );
        // Values that fit f32 (2⁶³) whose squares together (2¹²⁸) do not.
        let e = refused(
            &rules(),
            "1 1:2^63 2:2^63 3:2^63 4:2^63\n"
                .replace("2^63", "9223372036854775808")
                .as_str(),
        );
        assert!(
            e.starts_with(
                "line 2: found value 9.223372036854776e18 for feature 4, whose \
                           square takes the row's squared norm beyond 3.4028234663852886e38"
            ),
            "{e}"
        );
        // Just below both bounds is a row.
        let b = parse_block(b"1 1:1e19\n", 2, true, LineSyntax::LabelsFeatures, &rules());
        assert!(b.unwrap().rows.row(0).sq_norm.is_finite());
        let b = parse_block(b"1 1:1e150\n", 2, true, LineSyntax::LabelsFeatures, &l2);
        assert_eq!(b.unwrap().rows.row(0).values, &[1.0]);
        // Rows given as pairs are checked by the same rule.
        let mut pairs = PairRows::new(&l2);
        let e = pairs.push(0, [(4, 1e200)]).unwrap_err();
        assert!(
            e.starts_with("found value 1e200 for feature 4, whose square"),
            "{e}"
        );
    }

    #[test]
    fn one_based_ids() {
        let mut rl = rules();
        rl.index_base = 1;
        let b = parse_block(b"5 10:1\n", 2, true, LineSyntax::LabelsFeatures, &rl).unwrap();
        assert_eq!(b.rows.row(0).labels, &[4]);
        assert_eq!(b.rows.row(0).indices, &[9]);
        let (_, e) = parse_block(b"0 1:1\n", 2, true, LineSyntax::LabelsFeatures, &rl).unwrap_err();
        assert!(e.msg.contains("expected ids >= 1"), "{e}");
    }

    #[test]
    fn errors_name_line_found_and_expected() {
        assert_eq!(
            err("1 2:0.5\n1 2:x\n"),
            "line 3: found value 'x' in token '2:x', expected a decimal number"
        );
        assert!(err("1 10:1\n").starts_with("line 2: found feature id 10, expected < 10 (D = 10"));
        assert!(err("5 1:1\n").starts_with("line 2: found label id 5, expected < 5 (L = 5"));
        assert!(err("1 1:nan\n").contains("non-finite value 'nan'"));
        assert!(err("1 1:inf\n").contains("non-finite value 'inf'"));
        assert!(err("1 1:1 1:2\n").contains("feature 1 twice"));
        assert!(err("1,1 1:1\n").contains("label 1 twice"));
        assert!(err("1,,2 1:1\n").contains("empty entry"));
        assert!(err("1 abc\n").contains("expected 'feature:value'"));
        assert!(err("1 1:1\r\n").contains("CRLF"));
        assert!(err("1 1:1").starts_with("line 2: found the last line without a '\\n'"));
        assert!(err("1 -1:1\n").contains("found feature id '-1'"));
        assert!(err("1 99999999999:1\n").starts_with(
            "line 2: found feature id 99999999999, expected at most 2147483646: it is larger"
        ));
    }

    #[test]
    fn ids_above_the_limit_are_too_large_not_malformed() {
        for (base, largest) in [(0, "2147483646"), (1, "2147483647")] {
            let rl = RowRules::new(MAX_IDS, MAX_IDS, base);
            let ok = format!("{largest} {largest}:1\n");
            let b = parse_block(ok.as_bytes(), 1, true, LineSyntax::LabelsFeatures, &rl).unwrap();
            assert_eq!(b.rows.row(0).indices, &[MAX_IDS - 1]);
            assert_eq!(b.rows.row(0).labels, &[MAX_IDS - 1]);
            for id in [
                u64::from(MAX_IDS) + u64::from(base),
                4_000_000_000,
                u64::MAX,
            ] {
                for (line, what) in [
                    (format!("{id}:1\n"), "feature"),
                    (format!("{id}\n"), "label"),
                ] {
                    let (_, e) =
                        parse_block(line.as_bytes(), 7, true, LineSyntax::LabelsFeatures, &rl)
                            .unwrap_err();
                    assert_eq!(e.line, 7);
                    assert!(
                        e.msg.starts_with(&format!(
                            "found {what} id {id}, expected at most {largest}"
                        )),
                        "{e}"
                    );
                }
            }
            // Leading zeros are no part of the size.
            let zeros = format!("{}{largest}:1\n", "0".repeat(30));
            let b = parse_block(zeros.as_bytes(), 1, true, LineSyntax::Features, &rl).unwrap();
            assert_eq!(b.rows.row(0).indices, &[MAX_IDS - 1]);
            // More digits than any integer type holds: still "too large", not "not an integer".
            let (_, e) = parse_block(
                b"+1 123456789012345678901234567890:1\n",
                1,
                true,
                LineSyntax::Libsvm,
                &rl,
            )
            .unwrap_err();
            assert!(e.msg.contains("expected at most"), "{e}");
        }
    }

    #[test]
    fn lenient_skips_bad_rows_and_accepts_crlf() {
        let mut rl = rules();
        rl.lenient = true;
        let b = parse_block(
            b"1 1:1\r\n1 1:x\n2 2:2",
            2,
            false,
            LineSyntax::LabelsFeatures,
            &rl,
        )
        .unwrap();
        assert_eq!(b.rows.row_ids, vec![2, 4]);
        assert_eq!(b.skipped, 1);
        assert_eq!(b.crlf_lines, 1);
        assert_eq!(b.skip_reasons[0].line, 3);
    }

    #[test]
    fn bow_rows_pair_feature_and_label_lines() {
        let b =
            parse_bow_block(b"1:1 3:2\n\n", b"0:1 4:1\n2:1\n", 2, (true, true), &rules()).unwrap();
        assert_eq!(b.rows.len(), 2);
        assert_eq!(b.rows.row(0).labels, &[0, 4]);
        assert_eq!(b.rows.row(0).indices, &[1, 3]);
        assert_eq!(b.rows.row(1).labels, &[2]);
        let (src, e) = parse_bow_block(b"1:1\n", b"7:1\n", 2, (true, true), &rules()).unwrap_err();
        assert_eq!(src, 1);
        assert!(e.msg.contains("label id 7"));
    }

    #[test]
    fn libsvm_rows_scan_then_map_through_the_class_map() {
        let mut rl = RowRules::new(u32::MAX, u32::MAX, 1);
        let text = b"+1 qid:3 3:1 1:2\n-1,4 2:0.5 # note 9:9\n 1:1\n";
        let scan = parse_block(text, 1, true, LineSyntax::Libsvm, &rl).unwrap();
        assert_eq!(scan.qid_tokens, 1);
        let s = &scan.scan;
        assert_eq!(s.values.iter().copied().collect::<Vec<_>>(), [-1, 1, 4]);
        assert_eq!((s.rows, s.unlabeled_rows, s.multi_label_rows), (3, 1, 1));
        assert_eq!((s.first_unlabeled, s.first_multi_label), (Some(3), Some(2)));
        assert_eq!(s.max_feature, Some(2), "the comment's 9:9 is not read");
        rl.labels.classes = Some(Arc::new(ClassMap::new(vec![1, 4], Some(-1)).unwrap()));
        let mapped = parse_block(text, 1, true, LineSyntax::Libsvm, &rl).unwrap();
        assert_eq!(mapped.rows.row(0).labels, &[0]);
        assert_eq!(mapped.rows.row(0).indices, &[0, 2]);
        assert_eq!(
            mapped.rows.row(1).labels,
            &[1],
            "-1 is the negative class: no id"
        );
        assert!(mapped.scan.values.is_empty());
        rl.labels.exactly_one = true;
        let (_, e) = parse_block(text, 1, true, LineSyntax::Libsvm, &rl).unwrap_err();
        assert_eq!(e.line, 2);
        assert!(
            e.msg.contains("found 2 labels, expected exactly one"),
            "{e}"
        );
        let (_, e) = parse_block(b"7 1:1\n", 1, true, LineSyntax::Libsvm, &rl).unwrap_err();
        assert!(
            e.msg
                .contains("found label 7, expected one of the dataset's classes (-1, 1, 4)"),
            "{e}"
        );
    }

    /// New rows of a multi-label model: a label the class map does not hold is left out,
    /// the row's others kept; without the rule the row is refused, naming the label.
    #[test]
    fn unknown_labels_are_left_out_of_new_multilabel_rows() {
        let mut rl = RowRules::new(3, u32::MAX, 1);
        rl.labels = LabelRules {
            first_label: false,
            classes: Some(Arc::new(ClassMap::new(vec![3, 7], None).unwrap())),
            exactly_one: false,
            unlabeled_ok: true,
            unknown_left_out: true,
        };
        let text = b"7,9,3 1:1\n9 2:1\n";
        let b = parse_block(text, 1, true, LineSyntax::Libsvm, &rl).unwrap();
        assert_eq!(b.rows.row(0).labels, &[0, 1]);
        assert!(b.rows.row(1).labels.is_empty());
        rl.labels.unknown_left_out = false;
        let (_, e) = parse_block(text, 1, true, LineSyntax::Libsvm, &rl).unwrap_err();
        assert!(e.msg.contains("found label 9, expected one of"), "{e}");
    }

    /// `predict --input`: features beyond D dropped and counted (the row kept, as if the
    /// file lacked them; a malformed token still an error), and a binary or multi-class
    /// row without a label accepted (several still refused).
    #[test]
    fn unknown_features_are_dropped_and_labels_may_be_absent() {
        let mut rl = RowRules::new(3, u32::MAX, 1);
        rl.unknown_features = UnknownFeatures::Drop;
        rl.labels = LabelRules {
            first_label: false,
            classes: Some(Arc::new(ClassMap::new(vec![3, 7], None).unwrap())),
            exactly_one: true,
            unlabeled_ok: true,
            unknown_left_out: false,
        };
        let text = b"7 1:1 9:2 3:0.5 4:1\n 2:1\n";
        let b = parse_block(text, 1, true, LineSyntax::Libsvm, &rl).unwrap();
        assert_eq!(b.rows.row(0).indices, &[0, 2]);
        assert_eq!(b.rows.row(0).labels, &[1]);
        assert!(b.rows.row(1).labels.is_empty());
        assert_eq!((b.dropped_features, b.rows_with_dropped), (2, 1));
        let (_, e) = parse_block(b"3 9:x\n", 1, true, LineSyntax::Libsvm, &rl).unwrap_err();
        assert!(e.msg.contains("found value 'x'"), "{e}");
        let (_, e) = parse_block(b"3,7 1:1\n", 1, true, LineSyntax::Libsvm, &rl).unwrap_err();
        assert!(
            e.msg.contains("found 2 labels, expected at most one"),
            "{e}"
        );
        rl.unknown_features = UnknownFeatures::Refuse;
        let (_, e) = parse_block(text, 1, true, LineSyntax::Libsvm, &rl).unwrap_err();
        assert!(
            e.msg.starts_with("found feature id 9, expected < 4 (D = 3"),
            "{e}"
        );
    }

    /// Rows from memory get the bits their text gets, under every kind of transform, with
    /// unknown features refused or dropped as in text and non-finite values refused.
    #[test]
    fn pair_rows_equal_the_parsed_text_of_the_same_rows() {
        use crate::transform::FeatureScaling;
        let scaling = Arc::new(FeatureScaling {
            ids: vec![0, 1, 2, 3],
            shift: vec![0.5, -1.25, 0.0, 2.0],
            scale: vec![1.0 / 3.0, 2.0, 1.0, 0.1],
        });
        let rows: Vec<Vec<(u64, f64)>> = vec![
            vec![(2, 0.1), (0, 1.0 / 3.0), (3, -7.25)],
            vec![],
            vec![(1, 1e-300), (3, 12345.678)],
        ];
        let text: String = rows
            .iter()
            .map(|r| {
                let tokens: Vec<String> =
                    r.iter().map(|(i, v)| format!("{}:{v:?}", i + 1)).collect();
                tokens.join(" ") + "\n"
            })
            .collect();
        for transform in [
            Transform::None,
            Transform::L2,
            Transform::Scale(scaling.clone()),
            Transform::Standardize(scaling.clone()),
            Transform::Tfidf(scaling.clone()),
        ] {
            let mut rl = RowRules::new(4, u32::MAX, 1);
            rl.transform = transform;
            let parsed = parse_block(text.as_bytes(), 1, true, LineSyntax::Libsvm, &rl).unwrap();
            let mut pairs = PairRows::new(&rl);
            for (i, r) in rows.iter().enumerate() {
                pairs.push(i as u64 + 1, r.iter().copied()).unwrap();
            }
            let from_memory = pairs.take().rows;
            assert_eq!(from_memory.row_ids, parsed.rows.row_ids);
            assert_eq!(from_memory.feature_offsets, parsed.rows.feature_offsets);
            assert_eq!(from_memory.indices, parsed.rows.indices);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&from_memory.values), bits(&parsed.rows.values));
            assert_eq!(bits(&from_memory.sq_norms), bits(&parsed.rows.sq_norms));
        }
        let mut rl = RowRules::new(4, u32::MAX, 1);
        let mut pairs = PairRows::new(&rl);
        let e = pairs.push(0, [(0, 1.0), (9, 2.0)]).unwrap_err();
        assert!(
            e.starts_with("found feature id 9, expected < 4 (D = 4"),
            "{e}"
        );
        let e = pairs.push(0, [(u64::MAX, 1.0)]).unwrap_err();
        assert!(
            e.starts_with(&format!("found feature id {}", u64::MAX)),
            "{e}"
        );
        let e = pairs.push(0, [(1, f64::NAN)]).unwrap_err();
        assert!(e.contains("non-finite value 'NaN' for feature 1"), "{e}");
        let e = pairs.push(0, [(1, 1.0), (1, 2.0)]).unwrap_err();
        assert!(e.contains("found feature 1 twice"), "{e}");
        rl.unknown_features = UnknownFeatures::Drop;
        let mut pairs = PairRows::new(&rl);
        pairs
            .push(0, [(0, 1.0), (9, 2.0), (u64::MAX, 3.0)])
            .unwrap();
        pairs.push(1, [(1, 1.0)]).unwrap();
        let out = pairs.take();
        assert_eq!(out.rows.row(0).indices, &[0]);
        assert_eq!((out.dropped_features, out.rows_with_dropped), (2, 1));
    }

    #[test]
    fn headers_are_two_or_three_integers() {
        assert_eq!(header_fields(b"3 5 4"), Some(3));
        assert_eq!(header_fields(b"3\t5"), Some(2));
        for row in [&b"3"[..], b"1,2 3:1", b"3 5 4 1", b"3 5:1", b"", b"3 -5 4"] {
            assert_eq!(header_fields(row), None, "{}", String::from_utf8_lossy(row));
        }
    }

    #[test]
    fn class_values_are_integers() {
        assert_eq!(parse_class_value(b"+1"), Some(1));
        assert_eq!(parse_class_value(b"-12"), Some(-12));
        assert_eq!(parse_class_value(b"3.0"), Some(3));
        assert_eq!(parse_class_value(b"1e2"), Some(100));
        for bad in [&b"1.5"[..], b"x", b"", b"inf", b"nan", b"1e300"] {
            assert_eq!(
                parse_class_value(bad),
                None,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn first_label_keeps_the_first_listed_id() {
        let mut rl = rules();
        rl.labels.first_label = true;
        let b = parse_block(
            b"4,0,2 1:1\n3 2:1\n",
            2,
            true,
            LineSyntax::LabelsFeatures,
            &rl,
        )
        .unwrap();
        assert_eq!(b.scan.values.iter().copied().collect::<Vec<_>>(), [3, 4]);
        // The other entries are still checked against L.
        assert!(parse_block(b"4,9 1:1\n", 2, true, LineSyntax::LabelsFeatures, &rl).is_err());
    }

    #[test]
    fn headers() {
        assert_eq!(
            parse_header(b"3 4 5", &["N", "D", "L"]).unwrap(),
            vec![3, 4, 5]
        );
        assert!(parse_header(b"3 4", &["N", "D", "L"])
            .unwrap_err()
            .contains("expected 3 integers"));
        assert!(parse_header(b"3 x 5", &["N", "D", "L"])
            .unwrap_err()
            .contains("for D"));
        assert!(parse_header(b"3 4 5\r", &["N", "D", "L"])
            .unwrap_err()
            .contains("CRLF"));
        assert!(
            parse_header(b"3 4 99999999999999999999999", &["N", "D", "L"])
                .unwrap_err()
                .starts_with("found L = 99999999999999999999999 in the header, expected at most")
        );
    }
}
