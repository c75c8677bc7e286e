//! `pipeline predict --input FILE|-`: rows that were never ingested, scored under a
//! training run of the workspace (`--run`) or a model file (`--model`, no workspace)
//! (`docs/predict-input.md`).
//!
//! The rows go through what the run's dataset went through at ingest
//! ([`crate::text::new_rows`]): the same syntax (XML-repository text, with or without its
//! header, or LIBSVM), index base, class map and fitted feature transform, and its D. Then
//! they are ranked by the [`Ranking`] `predict --split` ranks a chunk with, so a row gets
//! the bits it would get in an ingested split, whether the model is a run or its export.
//!
//! Memory does not grow with the input: `--block-rows` lines are read, parsed into one CSR
//! chunk, scored and written, then the next. The output is a Parquet file of the
//! predictions schema (`--output`, written beside its name and moved into place when whole,
//! an existing file kept unless `--force`: `store::user_file`) or rows streamed to
//! standard output (`--format jsonl|tsv`, labels by their original names). Nothing is
//! registered in the catalog and the workspace is only read: the file is the user's,
//! outside the workspace, and the rows are not a split of any dataset.

use std::io::{BufWriter, Stdout, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};

use super::PredictOptions;
use crate::choice::choice_enum;
use crate::portable::{recorded_transform, PortableModel};
use crate::scoring::ranking::{checked_top_k, with_ranking, Model, Ranking};
use crate::stage::thread_pool;
use crate::store::classes::ClassMap;
use crate::store::model_file::DatasetFacts;
use crate::store::npy::NpyMap;
use crate::store::predictions::{JsonRow, OptionalColumns, PredictionBlock, PredictionWriter};
use crate::store::scaling::read_dataset_scaling;
use crate::store::user_file::{check_file_output, refuse_same_file, UserFile};
use crate::store::workspace::Workspace;
pub use crate::text::new_rows::STDIN_ARG;
use crate::text::new_rows::{Dropped, NewRows};
use crate::trained::{load_run_checkpoint, SvdFiles, Task};
use crate::transform::Transform;

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
    /// Replace an existing `output` (refused otherwise, before any row is read).
    pub force: bool,
    /// The lines on standard output without `output`.
    pub format: StreamFormat,
    /// What a feature id ≥ the dataset's D is.
    pub unknown_features: crate::text::parse::UnknownFeatures,
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
    check_output(input, None)?;
    if let Some(output) = &input.output {
        ws.refuse_output_inside("--output", output)?;
    }
    let (config, ckpt_row, ckpt) = load_run_checkpoint(ws, opts.run, opts.checkpoint)?;
    let dataset = config.dataset_row(ws)?;
    let facts = DatasetFacts::of(&dataset);
    let scaling = match facts.has_statistics() {
        true => Some(read_dataset_scaling(ws, &dataset)?),
        false => None,
    };
    let basis = NpyMap::open_registered(&SvdFiles::of_run(ws, config.svd_run)?.basis)?;
    let loaded = Loaded {
        model: Model {
            config: &config,
            n_features: facts.n_features,
            params: &ckpt.params,
            basis: &basis,
        },
        facts: &facts,
        transform: recorded_transform(&facts, scaling.as_ref())
            .with_context(|| format!("dataset '{}'", dataset.name))?,
        train_run: opts.run,
        checkpoint_step: ckpt_row.step,
    };
    score_input(&loaded, opts, input)
}

/// [`run`] under the model file `model` instead of a run: no workspace is read.
/// `opts.run`, `opts.checkpoint` and `opts.split` are not used (the file holds one
/// checkpoint of one run, named in its provenance).
pub fn run_model(
    model: &Path,
    opts: &PredictOptions,
    input: &InputOptions,
) -> Result<InputOutcome> {
    opts.validate()?;
    check_output(input, Some(model))?;
    let file = PortableModel::open(model)?;
    score_input(&Loaded::of_file(&file), opts, input)
}

/// What [`score_pairs`] returns: the prediction blocks in row order (row ids are the rows'
/// 0-based positions) and the features dropped.
#[derive(Debug, Clone, PartialEq)]
pub struct ScoredRows {
    pub blocks: Vec<PredictionBlock>,
    pub dropped: Dropped,
}

/// Scores rows held in memory, each a list of (0-based feature id, value) pairs, under the
/// model file `file`, as `predict --model FILE --input` scores the same rows written as
/// text: the same checks and transform ([`crate::text::parse::PairRows`]), the same
/// ranking, block by block of `opts.block_rows` rows (`opts.run`, `opts.checkpoint` and
/// `opts.split` are not used). A bad row is an error naming its 0-based position.
pub fn score_pairs<'a, R>(
    file: &PortableModel,
    rows: R,
    opts: &PredictOptions,
    unknown: crate::text::parse::UnknownFeatures,
) -> Result<ScoredRows>
where
    R: IntoIterator<Item = &'a [(u64, f64)]>,
    R::IntoIter: Send,
{
    opts.validate()?;
    let loaded = Loaded::of_file(file);
    let (config, facts) = (loaded.model.config, loaded.facts);
    let top_k = checked_top_k(config.task, facts.n_labels, opts.top_k)?;
    let rules = crate::text::new_rows::row_rules(facts, loaded.transform.clone(), unknown)?;
    let mut pairs = crate::text::parse::PairRows::new(&rules);
    let pool = thread_pool(opts.threads.unwrap_or(config.threads))?;
    let scoring = || {
        format!(
            "scoring rows from memory with train run {} (checkpoint step {})",
            loaded.train_run, loaded.checkpoint_step
        )
    };
    let sizes = (top_k, opts.block_rows, opts.probabilities);
    let mut rows = rows.into_iter().enumerate().peekable();
    pool.install(|| {
        // Ranking scores block after block of the same sizes: the allocator keeps them on
        // the heap and reuses them, as the training loop's steps are (`crate::alloc`).
        crate::alloc::for_recurring_steps();
        with_ranking(&loaded.model, sizes, &scoring, |ranking| {
            let mut out = ScoredRows {
                blocks: Vec::new(),
                dropped: Dropped::default(),
            };
            while rows.peek().is_some() {
                for (i, row) in rows.by_ref().take(opts.block_rows.max(1)) {
                    pairs
                        .push(i as u64, row.iter().copied())
                        .map_err(|e| anyhow::anyhow!("row {i}: {e}"))?;
                }
                let parsed = pairs.take();
                out.dropped.features += parsed.dropped_features;
                out.dropped.rows += parsed.rows_with_dropped;
                out.blocks.extend(ranking.rank(&parsed.rows)?);
            }
            Ok(out)
        })
    })
}

/// `--output` is checked before anything is read or scored: what may be written there
/// (`store::user_file`: an existing file only with `--force`, never anything else), and
/// that it is none of the files read (`model`: `--model`'s file).
fn check_output(input: &InputOptions, model: Option<&Path>) -> Result<()> {
    let Some(output) = &input.output else {
        return Ok(());
    };
    check_file_output(output, input.force)?;
    let mut inputs = vec![("--input", input.rows.as_path())];
    inputs.extend(model.map(|m| ("--model", m)));
    refuse_same_file(&[("--output", output)], &inputs)
}

/// A trained model as `predict --input` scores with it, from a run or a model file.
struct Loaded<'a> {
    model: Model<'a>,
    facts: &'a DatasetFacts,
    transform: Transform,
    /// Provenance, written in the output's metadata and messages.
    train_run: i64,
    checkpoint_step: u64,
}

impl<'a> Loaded<'a> {
    /// The model a model file holds, with its provenance.
    fn of_file(file: &'a PortableModel) -> Self {
        Loaded {
            model: file.scoring_model(),
            facts: file.dataset(),
            transform: file.transform.clone(),
            train_run: file.provenance().train_run,
            checkpoint_step: file.provenance().checkpoint_step,
        }
    }
}

/// Reads, scores and writes every row of `input` under `loaded`.
fn score_input(
    loaded: &Loaded<'_>,
    opts: &PredictOptions,
    input: &InputOptions,
) -> Result<InputOutcome> {
    let (config, facts) = (loaded.model.config, loaded.facts);
    let top_k = checked_top_k(config.task, facts.n_labels, opts.top_k)?;
    let mut rows = NewRows::open(
        &input.rows,
        facts,
        loaded.transform.clone(),
        input.unknown_features,
    )?;
    let columns = OptionalColumns::with(opts.probabilities, config.task == Task::Multiclass);
    let mut sink = match &input.output {
        Some(path) => {
            let metadata = vec![
                ("fsgp.dataset".to_string(), facts.name.clone()),
                ("fsgp.input".to_string(), input.rows.display().to_string()),
                ("fsgp.train_run".to_string(), loaded.train_run.to_string()),
                (
                    "fsgp.checkpoint_step".to_string(),
                    loaded.checkpoint_step.to_string(),
                ),
                ("fsgp.top_k".to_string(), top_k.to_string()),
            ];
            Sink::Parquet(Box::new(PartFile::create(
                path,
                input.force,
                &metadata,
                columns,
            )?))
        }
        None => Sink::Stream(RowPrinter::new(input.format, facts, columns)),
    };
    let scoring = || {
        format!(
            "scoring the rows of {} with train run {} (checkpoint step {})",
            input.rows.display(),
            loaded.train_run,
            loaded.checkpoint_step
        )
    };
    let pool = thread_pool(opts.threads.unwrap_or(config.threads))?;
    let started = Instant::now();
    let sizes = (top_k, opts.block_rows, opts.probabilities);
    let outcome = pool.install(|| {
        // Ranking scores block after block of the same sizes: the allocator keeps them on
        // the heap and reuses them, as the training loop's steps are (`crate::alloc`).
        crate::alloc::for_recurring_steps();
        with_ranking(&loaded.model, sizes, &scoring, |ranking| {
            score_all(&mut rows, ranking, &mut sink, opts.block_rows)
        })
    })?;
    sink.finish()?;
    report(&outcome, top_k, &input.rows, facts, started);
    Ok(outcome)
}

/// Reads, scores and writes the rows block by block: at most `block_rows` lines are held.
fn score_all(
    rows: &mut NewRows,
    ranking: &Ranking<'_>,
    sink: &mut Sink,
    block_rows: usize,
) -> Result<InputOutcome> {
    let mut scored = 0u64;
    let mut dropped = Dropped::default();
    while let Some(chunk) = rows.next_chunk(block_rows, &mut dropped)? {
        for block in ranking.rank(&chunk)? {
            sink.write(&block)?;
            scored += block.len() as u64;
        }
    }
    rows.finish()?;
    Ok(InputOutcome {
        rows: scored,
        dropped_features: dropped.features,
        rows_with_dropped: dropped.rows,
    })
}

/// The summary on standard error (standard output may hold the predictions).
fn report(
    outcome: &InputOutcome,
    top_k: usize,
    input: &Path,
    facts: &DatasetFacts,
    started: Instant,
) {
    let secs = started.elapsed().as_secs_f64();
    let name = match input.as_os_str() == STDIN_ARG {
        true => "standard input".to_string(),
        false => input.display().to_string(),
    };
    crate::progress::note(format!(
        "predicted top-{top_k} of {} rows of {name} in {secs:.1} s ({:.0} rows/s)",
        outcome.rows,
        outcome.rows as f64 / secs.max(1e-9)
    ));
    if outcome.dropped_features > 0 {
        crate::progress::note(format!(
            "dropped {} features with ids beyond the dataset's D = {} in {} rows \
             (--unknown-features drop)",
            outcome.dropped_features, facts.n_features, outcome.rows_with_dropped
        ));
    }
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
            Sink::Parquet(part) => part.writer.write(block),
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

/// A predictions file written under a temporary name beside its final one and moved into
/// place only when whole ([`UserFile`]): a failure part-way (a malformed row, a full disk)
/// removes it, so no half-written file is ever left under the name asked for.
struct PartFile {
    writer: PredictionWriter,
    file: UserFile,
}

impl PartFile {
    /// `path`'s temporary sibling, opened for the predictions schema.
    fn create(
        path: &Path,
        replace: bool,
        metadata: &[(String, String)],
        columns: OptionalColumns,
    ) -> Result<Self> {
        let file = UserFile::temporary(path, replace)
            .with_context(|| format!("--output {}", path.display()))?;
        let writer = PredictionWriter::create(file.tmp_path(), metadata, columns)
            .with_context(|| format!("--output {}", path.display()))?;
        Ok(PartFile { writer, file })
    }

    /// Closes and fsyncs the file, then moves it into place.
    fn publish(self) -> Result<()> {
        self.writer.finish()?;
        self.file.publish()
    }
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
    fn new(format: StreamFormat, facts: &DatasetFacts, columns: OptionalColumns) -> Self {
        RowPrinter {
            out: BufWriter::new(std::io::stdout()),
            format,
            classes: facts.class_map.clone(),
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
            let row = JsonRow::of(block, i, self.classes.as_ref());
            match self.format {
                StreamFormat::Jsonl => self.json_line(&row)?,
                StreamFormat::Tsv => self.tsv_line(&row)?,
            }
        }
        Ok(())
    }

    fn json_line(&mut self, row: &JsonRow<'_>) -> std::io::Result<()> {
        serde_json::to_writer(&mut self.out, row)?;
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

    fn tsv_line(&mut self, row: &JsonRow<'_>) -> std::io::Result<()> {
        let mut fields = vec![row.row.to_string(), joined(&row.labels), joined(row.scores)];
        if let Some(p) = row.probabilities {
            fields.push(joined(p));
        }
        if let Some(t) = row.true_class_probability {
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
