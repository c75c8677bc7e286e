//! New rows of a trained model's dataset: text that was never ingested (a file, standard
//! input, or a request's lines), read with the rules its dataset was read with at ingest —
//! the same syntax (XML-repository text with or without its header, or LIBSVM), index
//! base, D, class map and fitted feature transform — so a row becomes the CSR row ingest
//! would have made of it. `predict --input` and `serve` read rows through it.

use std::path::Path;

use anyhow::{anyhow, Context, Result};

use super::header::{check_row_count, check_row_total, to_u32};
use super::parse::{
    header_fields, parse_block, parse_header, LabelRules, LineSyntax, RowRules, UnknownFeatures,
    MAX_IDS,
};
use super::source::{LineSource, TextBlock};
use crate::error::InputError;
use crate::store::catalog::LabelKind;
use crate::store::chunks::CsrChunk;
use crate::store::model_file::DatasetFacts;
use crate::transform::Transform;

/// `--input -`: standard input.
pub const STDIN_ARG: &str = "-";

/// Features dropped by `--unknown-features drop` (ids ≥ D), and the rows that had one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dropped {
    pub features: u64,
    pub rows: u64,
}

/// The line syntax of `facts`'s dataset.
pub fn line_syntax(facts: &DatasetFacts) -> LineSyntax {
    match facts.format.as_str() {
        "libsvm" => LineSyntax::Libsvm,
        _ => LineSyntax::LabelsFeatures,
    }
}

/// The input's rows, read a block of lines at a time with the parser's rules of the run's
/// facts.
pub struct NewRows {
    source: LineSource,
    syntax: LineSyntax,
    rules: RowRules,
    /// The line of the first row: 2 after a header, else 1 (row i is on line i + first).
    first_line: u64,
    /// The header's N, which the rows must match, when the file has a header.
    declared: Option<u64>,
    /// Data lines read so far.
    lines: u64,
    /// The first line, read to look for a header, when it is a row: it starts the first
    /// block (its bytes without '\n', and whether it had one).
    first_row: Option<(Vec<u8>, bool)>,
}

impl NewRows {
    /// Opens `path` ([`STDIN_ARG`]: standard input) and reads its header if it has one.
    pub fn open(
        path: &Path,
        facts: &DatasetFacts,
        transform: Transform,
        unknown: UnknownFeatures,
    ) -> Result<Self> {
        let source = match path.as_os_str() == STDIN_ARG {
            true => LineSource::stdin()?,
            false => LineSource::open_once(path)?,
        };
        let mut rows = NewRows {
            source,
            syntax: line_syntax(facts),
            rules: row_rules(facts, transform, unknown)?,
            first_line: 1,
            declared: None,
            lines: 0,
            first_row: None,
        };
        rows.read_first_line(facts)?;
        Ok(rows)
    }

    /// Reads line 1: a header (XML-repository datasets only; LIBSVM files have none) is
    /// checked against the dataset, anything else is kept as the first row.
    fn read_first_line(&mut self, facts: &DatasetFacts) -> Result<()> {
        let mut line = Vec::new();
        let Some(terminated) = self.source.read_line(&mut line)? else {
            return Ok(()); // an empty input: no rows
        };
        let names: &[&str] = match (self.syntax, header_fields(&line)) {
            (LineSyntax::LabelsFeatures, Some(2)) => &["N", "D"],
            (LineSyntax::LabelsFeatures, Some(_)) => &["N", "D", "L"],
            _ => {
                self.first_row = Some((line, terminated));
                return Ok(());
            }
        };
        let path = self.source.path().to_path_buf();
        let fail = |msg: String| anyhow!(InputError::new(&path, 1, msg));
        let values = parse_header(&line, names).map_err(fail)?;
        let d = to_u32(values[1], "D", &path)?;
        let want_d = facts.n_features;
        if self.rules.unknown_features == UnknownFeatures::Refuse && u64::from(d) != want_d {
            return Err(fail(format!(
                "found D = {d} in the header, expected D = {want_d}, the run's dataset's \
                 (--unknown-features drop reads a file of more features, dropping those \
                 beyond {want_d})"
            )));
        }
        if let Some(&l) = values.get(2) {
            self.header_labels(to_u32(l, "L", &path)?, facts)
                .map_err(fail)?;
        }
        self.declared = Some(values[0]);
        self.first_line = 2;
        Ok(())
    }

    /// A header's L: the dataset's L, whose label ids the rows hold; with `--first-label`
    /// the file's own label ids are mapped through the class map, so L is the file's.
    fn header_labels(&mut self, l: u32, facts: &DatasetFacts) -> Result<(), String> {
        if self.rules.labels.first_label {
            self.rules.n_labels = l;
            return Ok(());
        }
        match u64::from(l) == facts.n_labels {
            true => Ok(()),
            false => Err(format!(
                "found L = {l} in the header, expected L = {}, the run's dataset's",
                facts.n_labels
            )),
        }
    }

    /// The next at most `max_rows` rows as a chunk whose row ids are the rows' 0-based
    /// positions in the input; None at its end. Dropped features are counted in `dropped`.
    pub fn next_chunk(
        &mut self,
        max_rows: usize,
        dropped: &mut Dropped,
    ) -> Result<Option<CsrChunk>> {
        let block = self.next_lines(max_rows as u64)?;
        if block.n_lines == 0 {
            return Ok(None);
        }
        let path = self.source.path();
        if let Some(declared) = self.declared {
            check_row_count(path, declared, &mut self.lines, block.n_lines)?;
        }
        let parsed = parse_block(
            &block.bytes,
            block.first_line,
            block.terminated,
            self.syntax,
            &self.rules,
        )
        .map_err(|(_, e)| anyhow!(e.in_file(path)))?;
        dropped.features += parsed.dropped_features;
        dropped.rows += parsed.rows_with_dropped;
        let mut chunk = parsed.rows;
        // The parser numbers rows by line; the predictions by position among the rows.
        for id in &mut chunk.row_ids {
            *id -= self.first_line;
        }
        Ok(Some(chunk))
    }

    /// The next at most `n` lines (≥ 1), the first row read ahead included.
    fn next_lines(&mut self, n: u64) -> Result<TextBlock> {
        let Some((mut bytes, terminated)) = self.first_row.take() else {
            return self.source.read_lines(n);
        };
        let mut block = TextBlock {
            first_line: 1,
            n_lines: 1,
            bytes: Vec::new(),
            terminated,
        };
        if terminated {
            bytes.push(b'\n');
            let rest = self.source.read_lines(n.max(1) - 1)?;
            bytes.extend_from_slice(&rest.bytes);
            block.n_lines += rest.n_lines;
            block.terminated = rest.terminated;
        }
        block.bytes = bytes;
        Ok(block)
    }

    /// At the end: a header's N must be the rows read.
    pub fn finish(&self) -> Result<()> {
        match self.declared {
            Some(declared) => check_row_total(self.source.path(), declared, self.lines),
            None => Ok(()),
        }
    }
}

/// The parser's rules for new rows of `dataset`: its D, index base, label ids (the class
/// map when ingest assigned them) and fitted transform, always strict (a malformed row is
/// an error, never skipped: a skipped row would leave the rows' positions unaccounted for),
/// a row without a label accepted (new rows need not carry one).
pub fn row_rules(
    facts: &DatasetFacts,
    transform: Transform,
    unknown: UnknownFeatures,
) -> Result<RowRules> {
    let first_label = facts.first_label;
    let kind = facts.label_kind;
    let assigned = first_label || facts.format == "libsvm";
    let classes = match (assigned, &facts.class_map) {
        (false, _) => None,
        (true, Some(map)) => Some(std::sync::Arc::new(map.clone())),
        (true, None) => anyhow::bail!(
            "dataset '{}' assigned its label ids at ingest but records no class map",
            facts.name
        ),
    };
    let n_features = u32::try_from(facts.n_features)
        .ok()
        .filter(|&d| d <= MAX_IDS)
        .with_context(|| format!("dataset '{}': D = {}", facts.name, facts.n_features))?;
    // Label ids as written: the dataset's own (its L), or with a class map values that
    // the map checks (for `--first-label`, a header's L narrows it).
    let n_labels = match assigned {
        false => u32::try_from(facts.n_labels).unwrap_or(MAX_IDS),
        true => MAX_IDS,
    };
    Ok(RowRules {
        transform,
        offers_lenient: false,
        features_from: "in the run's dataset; --unknown-features drop leaves such features out",
        labels: LabelRules {
            first_label,
            classes,
            exactly_one: kind != LabelKind::Multilabel && !first_label,
            unlabeled_ok: true,
            // A multi-class row's class gives its true class's probability; a multi-label
            // row's labels are not used.
            unknown_left_out: kind == LabelKind::Multilabel,
        },
        unknown_features: unknown,
        ..RowRules::new(n_features, n_labels, facts.index_base)
    })
}
