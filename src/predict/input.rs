//! `pipeline predict --input FILE|-`: rows that were never ingested, scored under a
//! training run (`docs/predict-input.md`).
//!
//! The rows go through what the run's dataset went through at ingest: the same syntax
//! (XML-repository text, with or without its header, or LIBSVM), index base, class map and
//! fitted feature transform (`transform.parquet`, read through its checksum), and its D.
//! Then they are ranked by the [`Ranking`] `predict --split` ranks a chunk with, so a row
//! gets the bits it would get in an ingested split.
//!
//! Memory does not grow with the input: `--block-rows` lines are read, parsed into one CSR
//! chunk, scored and written, then the next. The output is a Parquet file of the
//! predictions schema (`--output`, written beside its name and renamed when whole) or rows
//! streamed to standard output (`--format jsonl|tsv`, labels by their original names).
//! Nothing is registered in the catalog and the workspace is only read: the file is the
//! user's, outside the workspace, and the rows are not a split of any dataset.

use std::fs::File;
use std::io::{BufWriter, Stdout, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, ensure, Context, Result};
use serde::Serialize;

use super::{resolved_top_k, with_ranking, Model, PredictOptions, Ranking};
use crate::choice::{choice_enum, Choice};
use crate::error::InputError;
use crate::stage::thread_pool;
use crate::store::catalog::{DatasetRow, LabelKind};
use crate::store::chunks::CsrChunk;
use crate::store::classes::ClassMap;
use crate::store::predictions::{OptionalColumns, PredictionBlock, PredictionWriter};
use crate::store::scaling::{read_registered_scaling, SCALING_FILE};
use crate::store::workspace::Workspace;
use crate::text::header::{check_row_count, check_row_total, to_u32};
use crate::text::parse::{
    header_fields, parse_block, parse_header, LabelRules, LineSyntax, RowRules, UnknownFeatures,
    MAX_IDS,
};
use crate::text::source::{LineSource, TextBlock};
use crate::trained::{load_run_checkpoint, SvdFiles, Task};
use crate::transform::{FeatureScaling, Transform, TransformChoice};

/// `--input -`: standard input.
pub const STDIN_ARG: &str = "-";

choice_enum! {
    /// How `predict --input` prints the predictions on standard output (no `--output`).
    #[derive(Default)]
    pub enum StreamFormat("format") {
        /// One JSON object per row.
        #[default]
        Jsonl = "jsonl" => "one JSON object per row: row, labels (original names), scores, \
                            and probabilities / true_class_probability when present",
        /// A header line, then one tab-separated line per row.
        Tsv = "tsv" => "a header line, then one tab-separated line per row, lists \
                        comma-separated",
    }
}

/// What `pipeline predict --input` reads and writes, besides the run, checkpoint, top-k,
/// block size, probabilities and threads of [`PredictOptions`] (its split is not used).
#[derive(Debug, Clone, PartialEq)]
pub struct InputOptions {
    /// The rows: a file (plain, gzip or zstd), or [`STDIN_ARG`].
    pub rows: PathBuf,
    /// A Parquet file of predictions to write; None: stream rows to standard output.
    pub output: Option<PathBuf>,
    /// The lines on standard output without `output`.
    pub format: StreamFormat,
    /// What a feature id ≥ the dataset's D is.
    pub unknown_features: UnknownFeatures,
}

/// What `predict --input` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputOutcome {
    /// Rows scored.
    pub rows: u64,
    /// Feature tokens dropped (`--unknown-features drop`), and the rows that had one.
    pub dropped_features: u64,
    pub rows_with_dropped: u64,
}

/// Scores every row of `input.rows` under training run `opts.run` (its `--checkpoint`, or
/// the one `predict --split` would take) and writes them as `input` says. A malformed row
/// stops it with `FILE:LINE: found …, expected …` and leaves no output file.
pub fn run(ws: &Workspace, opts: &PredictOptions, input: &InputOptions) -> Result<InputOutcome> {
    opts.validate()?;
    let (config, ckpt_row, ckpt) = load_run_checkpoint(ws, opts.run, opts.checkpoint)?;
    let dataset = config.dataset_row(ws)?;
    let top_k = resolved_top_k(config.task, dataset.n_labels, opts.top_k);
    ensure!(
        top_k <= dataset.n_labels as usize,
        "--top-k {top_k} exceeds the {} labels",
        dataset.n_labels
    );
    let transform = dataset_transform(ws, &dataset)?;
    let mut rows = NewRows::open(&input.rows, &dataset, transform, input.unknown_features)?;
    let columns = OptionalColumns::with(opts.probabilities, config.task == Task::Multiclass);
    let mut sink = match &input.output {
        Some(path) => {
            let metadata = vec![
                ("fsgp.dataset".to_string(), dataset.name.clone()),
                ("fsgp.input".to_string(), input.rows.display().to_string()),
                ("fsgp.train_run".to_string(), opts.run.to_string()),
                (
                    "fsgp.checkpoint_step".to_string(),
                    ckpt_row.step.to_string(),
                ),
                ("fsgp.top_k".to_string(), top_k.to_string()),
            ];
            Sink::Parquet(Box::new(PartFile::create(path, &metadata, columns)?))
        }
        None => Sink::Stream(RowPrinter::new(input.format, &dataset, columns)),
    };
    let basis = SvdFiles::of_run(ws, config.svd_run)?.basis;
    let model = Model {
        config: &config,
        n_features: dataset.n_features,
        params: &ckpt.params,
        basis: &basis,
    };
    let scoring = || {
        format!(
            "scoring the rows of {} with train run {} (checkpoint step {})",
            input.rows.display(),
            opts.run,
            ckpt_row.step
        )
    };
    let pool = thread_pool(opts.threads.unwrap_or(config.threads))?;
    let started = Instant::now();
    let sizes = (top_k, opts.block_rows, opts.probabilities);
    let outcome = pool.install(|| {
        with_ranking(&model, sizes, &scoring, |ranking| {
            score_all(&mut rows, ranking, &mut sink, opts.block_rows)
        })
    })?;
    sink.finish()?;
    report(&outcome, top_k, &input.rows, &dataset, started);
    Ok(outcome)
}

/// Reads, scores and writes the rows block by block: at most `block_rows` lines are held.
fn score_all(
    rows: &mut NewRows,
    ranking: &Ranking<'_>,
    sink: &mut Sink,
    block_rows: usize,
) -> Result<InputOutcome> {
    let mut outcome = InputOutcome {
        rows: 0,
        dropped_features: 0,
        rows_with_dropped: 0,
    };
    while let Some(chunk) = rows.next_chunk(block_rows, &mut outcome)? {
        for block in ranking.rank(&chunk)? {
            sink.write(&block)?;
            outcome.rows += block.len() as u64;
        }
    }
    rows.finish()?;
    Ok(outcome)
}

/// The summary on standard error (standard output may hold the predictions).
fn report(
    outcome: &InputOutcome,
    top_k: usize,
    input: &Path,
    dataset: &DatasetRow,
    started: Instant,
) {
    let secs = started.elapsed().as_secs_f64();
    let name = match input.as_os_str() == STDIN_ARG {
        true => "standard input".to_string(),
        false => input.display().to_string(),
    };
    eprintln!(
        "predicted top-{top_k} of {} rows of {name} in {secs:.1} s ({:.0} rows/s)",
        outcome.rows,
        outcome.rows as f64 / secs.max(1e-9)
    );
    if outcome.dropped_features > 0 {
        eprintln!(
            "dropped {} features with ids beyond the dataset's D = {} in {} rows \
             (--unknown-features drop)",
            outcome.dropped_features, dataset.n_features, outcome.rows_with_dropped
        );
    }
}

/// The run's dataset's feature transform as ingest fitted it: `none` and `l2` need nothing,
/// `scale` and `standardize` their statistics from the dataset's registered
/// `transform.parquet`, read through its checksum.
fn dataset_transform(ws: &Workspace, dataset: &DatasetRow) -> Result<Transform> {
    let choice = TransformChoice::parse_name(&dataset.normalization).map_err(|e| {
        anyhow!(
            "dataset '{}': its transform '{}' is not one this build knows ({e})",
            dataset.name,
            dataset.normalization
        )
    })?;
    let scaling = || -> Result<FeatureScaling> {
        let rel = format!("{}/{SCALING_FILE}", dataset.path);
        let stored = ws.catalog.stored_artifact_at(&rel)?.with_context(|| {
            format!(
                "dataset '{}' (transform {choice}) has no registered {rel}; ingest it again",
                dataset.name
            )
        })?;
        let s = read_registered_scaling(&ws.registered(&stored))?;
        Ok(FeatureScaling {
            ids: s.ids,
            shift: s.shift,
            scale: s.scale,
        })
    };
    Transform::from_recorded(choice, scaling).with_context(|| format!("dataset '{}'", dataset.name))
}

/// The input's rows, read a block of lines at a time with the parser's rules of the run's
/// dataset.
struct NewRows {
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
    fn open(
        path: &Path,
        dataset: &DatasetRow,
        transform: Transform,
        unknown: UnknownFeatures,
    ) -> Result<Self> {
        let source = match path.as_os_str() == STDIN_ARG {
            true => LineSource::stdin()?,
            false => LineSource::open_once(path)?,
        };
        let mut rows = NewRows {
            source,
            syntax: match dataset.format.as_str() {
                "libsvm" => LineSyntax::Libsvm,
                _ => LineSyntax::LabelsFeatures,
            },
            rules: dataset_rules(dataset, transform, unknown)?,
            first_line: 1,
            declared: None,
            lines: 0,
            first_row: None,
        };
        rows.read_first_line(dataset)?;
        Ok(rows)
    }

    /// Reads line 1: a header (XML-repository datasets only; LIBSVM files have none) is
    /// checked against the dataset, anything else is kept as the first row.
    fn read_first_line(&mut self, dataset: &DatasetRow) -> Result<()> {
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
        let want_d = dataset.n_features;
        if self.rules.unknown_features == UnknownFeatures::Refuse && u64::from(d) != want_d {
            return Err(fail(format!(
                "found D = {d} in the header, expected D = {want_d}, the run's dataset's \
                 (--unknown-features drop reads a file of more features, dropping those \
                 beyond {want_d})"
            )));
        }
        if let Some(&l) = values.get(2) {
            self.header_labels(to_u32(l, "L", &path)?, dataset)
                .map_err(fail)?;
        }
        self.declared = Some(values[0]);
        self.first_line = 2;
        Ok(())
    }

    /// A header's L: the dataset's L, whose label ids the rows hold; with `--first-label`
    /// the file's own label ids are mapped through the class map, so L is the file's.
    fn header_labels(&mut self, l: u32, dataset: &DatasetRow) -> Result<(), String> {
        if self.rules.labels.first_label {
            self.rules.n_labels = l;
            return Ok(());
        }
        match u64::from(l) == dataset.n_labels {
            true => Ok(()),
            false => Err(format!(
                "found L = {l} in the header, expected L = {}, the run's dataset's",
                dataset.n_labels
            )),
        }
    }

    /// The next at most `max_rows` rows as a chunk whose row ids are the rows' 0-based
    /// positions in the input; None at its end. Dropped features are counted in `outcome`.
    fn next_chunk(
        &mut self,
        max_rows: usize,
        outcome: &mut InputOutcome,
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
        outcome.dropped_features += parsed.dropped_features;
        outcome.rows_with_dropped += parsed.rows_with_dropped;
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
    fn finish(&self) -> Result<()> {
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
fn dataset_rules(
    dataset: &DatasetRow,
    transform: Transform,
    unknown: UnknownFeatures,
) -> Result<RowRules> {
    let first_label = dataset.params.get("first_label").and_then(|v| v.as_bool()) == Some(true);
    let kind = dataset.label_kind();
    let assigned = first_label || dataset.format == "libsvm";
    let classes = match (assigned, &dataset.class_map) {
        (false, _) => None,
        (true, Some(map)) => Some(std::sync::Arc::new(map.clone())),
        (true, None) => anyhow::bail!(
            "dataset '{}' assigned its label ids at ingest but records no class map",
            dataset.name
        ),
    };
    let n_features = u32::try_from(dataset.n_features)
        .ok()
        .filter(|&d| d <= MAX_IDS)
        .with_context(|| format!("dataset '{}': D = {}", dataset.name, dataset.n_features))?;
    // Label ids as written: the dataset's own (its L), or with a class map values that
    // the map checks (for `--first-label`, a header's L narrows it).
    let n_labels = match assigned {
        false => u32::try_from(dataset.n_labels).unwrap_or(MAX_IDS),
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
        },
        unknown_features: unknown,
        ..RowRules::new(n_features, n_labels, dataset.index_base)
    })
}

/// Where the predictions go.
enum Sink {
    /// `--output FILE` (boxed: the Parquet writer's buffers make it large).
    Parquet(Box<PartFile>),
    /// Standard output.
    Stream(RowPrinter),
}

impl Sink {
    fn write(&mut self, block: &PredictionBlock) -> Result<()> {
        match self {
            Sink::Parquet(part) => part.writer()?.write(block),
            Sink::Stream(printer) => printer.print(block),
        }
    }

    fn finish(self) -> Result<()> {
        match self {
            Sink::Parquet(part) => part.publish(),
            Sink::Stream(printer) => printer.finish(),
        }
    }
}

/// A predictions file written under a temporary name beside its final one, renamed into
/// place only when whole: a failure part-way (a malformed row, a full disk) removes it, so
/// no half-written file is ever left under the name asked for.
struct PartFile {
    writer: Option<PredictionWriter>,
    part: PathBuf,
    path: PathBuf,
}

impl PartFile {
    /// `path`'s temporary sibling `.NAME.part-PID`, opened for the predictions schema.
    fn create(
        path: &Path,
        metadata: &[(String, String)],
        columns: OptionalColumns,
    ) -> Result<Self> {
        let name = path
            .file_name()
            .with_context(|| format!("--output {}: expected a file name", path.display()))?;
        let part = path.with_file_name(format!(
            ".{}.part-{}",
            name.to_string_lossy(),
            std::process::id()
        ));
        let writer = PredictionWriter::create(&part, metadata, columns)
            .with_context(|| format!("--output {}", path.display()))?;
        Ok(PartFile {
            writer: Some(writer),
            part,
            path: path.to_path_buf(),
        })
    }

    fn writer(&mut self) -> Result<&mut PredictionWriter> {
        self.writer
            .as_mut()
            .context("internal: the output is already published")
    }

    /// Closes and fsyncs the file, renames it to its name and fsyncs the directory.
    fn publish(mut self) -> Result<()> {
        let writer = self.writer.take().context("internal: published twice")?;
        writer.finish()?;
        std::fs::rename(&self.part, &self.path).with_context(|| {
            format!(
                "renaming {} to {}",
                self.part.display(),
                self.path.display()
            )
        })?;
        let dir = self.path.parent().filter(|d| !d.as_os_str().is_empty());
        File::open(dir.unwrap_or(Path::new(".")))
            .and_then(|d| d.sync_all())
            .with_context(|| format!("syncing the directory of {}", self.path.display()))?;
        // Published: nothing left to remove.
        self.part = PathBuf::new();
        Ok(())
    }
}

impl Drop for PartFile {
    fn drop(&mut self) {
        // Not published: the writer is closed first, then its file removed.
        drop(self.writer.take());
        if !self.part.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.part);
        }
    }
}

/// Label id → the name printed: the original label (the class map's value) when ingest
/// assigned the ids, else the id itself.
fn label_name(classes: Option<&ClassMap>, id: u32) -> i64 {
    classes
        .and_then(|map| map.value_of(id))
        .unwrap_or(i64::from(id))
}

/// One row as a JSON line (`--format jsonl`).
#[derive(Serialize)]
struct JsonRow<'a> {
    row: u64,
    labels: Vec<i64>,
    scores: &'a [f32],
    #[serde(skip_serializing_if = "Option::is_none")]
    probabilities: Option<&'a [f32]>,
    /// Multi-class runs only; null for a row without a (known) class.
    #[serde(skip_serializing_if = "Option::is_none")]
    true_class_probability: Option<Option<f32>>,
}

/// Prints blocks of predictions on standard output, one line per row.
struct RowPrinter {
    out: BufWriter<Stdout>,
    format: StreamFormat,
    classes: Option<ClassMap>,
    columns: OptionalColumns,
    /// The TSV header is printed before the first row.
    started: bool,
}

impl RowPrinter {
    fn new(format: StreamFormat, dataset: &DatasetRow, columns: OptionalColumns) -> Self {
        RowPrinter {
            out: BufWriter::new(std::io::stdout()),
            format,
            classes: dataset.class_map.clone(),
            columns,
            started: false,
        }
    }

    /// Prints the block's rows and flushes them, so a reader sees each block as it is
    /// scored. (A closed pipe ends the process by SIGPIPE, as `main` restores it.)
    fn print(&mut self, block: &PredictionBlock) -> Result<()> {
        self.print_rows(block)
            .and_then(|()| self.out.flush())
            .context("writing the predictions to standard output")
    }

    fn print_rows(&mut self, block: &PredictionBlock) -> std::io::Result<()> {
        if !self.started && self.format == StreamFormat::Tsv {
            let header = self.tsv_header();
            writeln!(self.out, "{header}")?;
        }
        self.started = true;
        for i in 0..block.len() {
            let labels: Vec<i64> = block
                .labels(i)
                .iter()
                .map(|&id| label_name(self.classes.as_ref(), id))
                .collect();
            match self.format {
                StreamFormat::Jsonl => self.json_line(block, i, labels)?,
                StreamFormat::Tsv => self.tsv_line(block, i, &labels)?,
            }
        }
        Ok(())
    }

    fn json_line(
        &mut self,
        block: &PredictionBlock,
        i: usize,
        labels: Vec<i64>,
    ) -> std::io::Result<()> {
        let row = JsonRow {
            row: block.row_ids[i],
            labels,
            scores: block.scores(i),
            probabilities: block.probabilities(i),
            true_class_probability: block.true_class_probability(i),
        };
        serde_json::to_writer(&mut self.out, &row)?;
        self.out.write_all(b"\n")
    }

    /// The TSV columns: `row`, `labels`, `scores`, then the optional ones present.
    fn tsv_header(&self) -> String {
        let mut names = vec!["row", "labels", "scores"];
        if self.columns.probabilities {
            names.push("probabilities");
        }
        if self.columns.true_class {
            names.push("true_class_probability");
        }
        names.join("\t")
    }

    fn tsv_line(
        &mut self,
        block: &PredictionBlock,
        i: usize,
        labels: &[i64],
    ) -> std::io::Result<()> {
        let mut fields = vec![
            block.row_ids[i].to_string(),
            joined(labels),
            joined(block.scores(i)),
        ];
        if let Some(p) = block.probabilities(i) {
            fields.push(joined(p));
        }
        if let Some(t) = block.true_class_probability(i) {
            // Empty for a row without a (known) class.
            fields.push(t.map_or(String::new(), |p| p.to_string()));
        }
        writeln!(self.out, "{}", fields.join("\t"))
    }

    /// The TSV header of an input without rows, and a flush.
    fn finish(mut self) -> Result<()> {
        let header = self.tsv_header();
        let done = match (self.started, self.format) {
            (false, StreamFormat::Tsv) => writeln!(self.out, "{header}"),
            _ => Ok(()),
        };
        done.and_then(|()| self.out.flush())
            .context("writing the predictions to standard output")
    }
}

/// `values` comma-separated, each as Rust prints it (the shortest text that reads back
/// as the same value).
fn joined<T: ToString>(values: &[T]) -> String {
    values
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}
