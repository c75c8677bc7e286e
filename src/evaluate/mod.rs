//! `pipeline evaluate`: metrics of a predictions file against the true labels of its split
//! (`docs/metrics.md`): ranking metrics for a multi-label task (and the calibration of the
//! listed labels' probabilities when the file has them), accuracy, NLP, Brier, ECE and AUC
//! for a binary one, accuracy, top-k accuracy, coverage, NLP, Brier and ECE for a multi-class
//! one. The task is the training run's (`--task auto`) unless given.
//!
//! Data flow: the split's chunks (label columns only) and the predictions file are both in
//! row order, so they are merge-joined on `row_id` a block at a time; the training split's
//! label counts give the inverse propensities. Memory: one chunk's labels plus one block of
//! predictions, whatever the number of rows. The results go to the catalog (one metric row
//! per measure and k) and to a `metrics.json` artifact.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use serde_json::json;

use crate::error::InvalidOptions;
use crate::metrics::binary::{BinaryAccumulator, BinaryMetrics};
use crate::metrics::calibration::{checked_probability, CalibrationAccumulator, CALIBRATION_BINS};
use crate::metrics::evaluation::Evaluation;
use crate::metrics::multiclass::{MulticlassAccumulator, MulticlassMetrics};
use crate::metrics::task::Task;
use crate::metrics::{
    inverse_propensity, LabellessRows, Metrics, MetricsAccumulator, PropensityParams,
};
use crate::stage::{memoised, Outcome, Staged};
use crate::store::catalog::{ArtifactKind, ArtifactRow, DatasetRow, RunRow, Split, StageKind};
use crate::store::chunks::{checksum_file, label_counts, read_registered_chunk_labels};
use crate::store::integrity::Registered;
use crate::store::predictions::{PredictionBlock, PredictionReader};
use crate::store::workspace::Workspace;

/// What `pipeline evaluate` computes.
#[derive(Debug, Clone, PartialEq)]
pub struct EvaluateOptions {
    /// A predictions file (workspace-relative or absolute), as written by `pipeline predict`.
    pub predictions: String,
    /// Metrics at k = 1..K.
    pub k: usize,
    /// Propensity model parameters A and B.
    pub propensity: PropensityParams,
    /// Test rows without labels: counted (every metric 0 on them) or left out.
    pub labelless: LabellessRows,
    /// Which metrics: the training run's task, or the one given.
    pub task: TaskChoice,
}

/// `--task`: `auto` takes the task the predictions' training run recorded (its `task`
/// parameter; multilabel when absent, or when the file names no run of the workspace).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TaskChoice {
    #[default]
    Auto,
    Given(Task),
}

impl TaskChoice {
    /// The flag's values: `auto`, then every task's name.
    pub fn names() -> Vec<&'static str> {
        std::iter::once("auto")
            .chain(Task::NAMES.iter().copied())
            .collect()
    }

    /// `auto`, or a task's name.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "auto" => Ok(TaskChoice::Auto),
            task => Ok(TaskChoice::Given(task.parse().map_err(anyhow::Error::msg)?)),
        }
    }

    /// The task, with `auto` resolved from training run `train_run` when it is in the
    /// workspace.
    pub fn resolve(self, ws: &Workspace, train_run: Option<i64>) -> Result<Task> {
        match (self, train_run) {
            (TaskChoice::Given(task), _) => Ok(task),
            (TaskChoice::Auto, Some(run)) => task_of_train_run(ws, run),
            (TaskChoice::Auto, None) => Ok(Task::Multilabel),
        }
    }
}

/// The task training run `run` recorded (`task` in its parameters; multilabel when absent,
/// or when the workspace has no such run).
pub fn task_of_train_run(ws: &Workspace, run: i64) -> Result<Task> {
    let Some(row) = ws.catalog.run(run)? else {
        return Ok(Task::Multilabel);
    };
    match row.params.get("task") {
        None | Some(serde_json::Value::Null) => Ok(Task::Multilabel),
        Some(v) => v
            .as_str()
            .with_context(|| format!("run {run}: parameter task is {v}, not a task name"))?
            .parse()
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("run {run}: parameter task")),
    }
}

impl EvaluateOptions {
    /// The command line's defaults for `predictions`.
    pub fn new(predictions: String) -> Self {
        EvaluateOptions {
            predictions,
            k: 5,
            propensity: PropensityParams::GENERIC,
            labelless: LabellessRows::CountAsZero,
            task: TaskChoice::Auto,
        }
    }

    /// Checks the values no type rules out; `run` and `pipeline run`'s spec check call it.
    pub fn validate(&self) -> Result<(), InvalidOptions> {
        let mut c = InvalidOptions::new("");
        c.check((1..=254).contains(&self.k), "k", || {
            "must be between 1 and 254".into()
        });
        c.into_result()
    }
}

/// Computes (or finds) the metrics of a predictions file.
pub fn run(ws: &Workspace, opts: &EvaluateOptions) -> Result<Outcome<Evaluation>> {
    opts.validate()?;
    let path = resolve_predictions(ws, &opts.predictions);
    let (reader, checksum, owner) = open_predictions(ws, &path)?;
    let meta = |key: &str| {
        reader
            .metadata
            .get(key)
            .cloned()
            .with_context(|| format!("{}: no `{key}` in the file's metadata", path.display()))
    };
    let dataset_name = meta("fsgp.dataset")?;
    let split: Split = meta("fsgp.split")?
        .parse()
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("{}: `fsgp.split`", path.display()))?;
    let step: Option<i64> = meta("fsgp.checkpoint_step")
        .ok()
        .and_then(|s| s.parse().ok());
    let train_run: Option<i64> = meta("fsgp.train_run").ok().and_then(|s| s.parse().ok());
    let dataset = ws.catalog.dataset(&dataset_name)?.with_context(|| {
        format!(
            "{}: dataset '{dataset_name}' is not in the workspace",
            path.display()
        )
    })?;
    let task = opts.task.resolve(ws, train_run)?;
    let named = match (opts.task, train_run) {
        (TaskChoice::Auto, Some(run)) => format!("task {task} (training run {run}'s)"),
        _ => format!("--task {task}"),
    };
    check_task(task, &named, &reader, &dataset, &owner)?;
    let mut params = json!({
        "predictions_checksum": checksum,
        "dataset": dataset.name,
        "dataset_checksum": dataset.checksum,
        "split": split,
        "k": opts.k,
        "propensity_a": opts.propensity.a,
        "propensity_b": opts.propensity.b,
        "labelless": format!("{:?}", opts.labelless),
    });
    // Keys only where they change what is computed, so that the parameters (and the
    // memoised runs they find) of probability-less multi-label evaluations stay the same.
    if task != Task::Multilabel {
        params["task"] = json!(task.name());
    }
    // Binary and multi-class evaluations always measure calibration (`check_task`).
    if reader.columns.probabilities || task != Task::Multilabel {
        params["calibration_bins"] = json!(CALIBRATION_BINS);
    }
    let cached = |done: &RunRow| {
        let metrics = load_metrics(ws, done.id)?;
        crate::progress::note(format!(
            "metrics of {} are already computed (run {}); nothing to do",
            opts.predictions, done.id
        ));
        Ok(metrics)
    };
    let job = Job {
        opts,
        task,
        dataset: &dataset,
        split,
        path: &path,
        train_chunks: chunk_paths(ws, &dataset, Split::Train)?,
        truth_chunks: chunk_paths(ws, &dataset, split)?,
    };
    memoised(
        ws,
        StageKind::Evaluate,
        &params,
        None,
        cached,
        |scratch| job.compute(reader, scratch),
        |published, (metrics, written): (Evaluation, crate::store::chunks::WrittenFile)| {
            let artifact = ArtifactRow {
                kind: ArtifactKind::Metrics,
                path: format!("{}/metrics.json", published.rel),
                bytes: written.bytes,
                rows: None,
                checksum: written.checksum,
                split: Some(split),
            };
            ws.catalog
                .record_metrics(published.run_id, &metrics.metric_rows(step, Some(split)))?;
            ws.catalog
                .commit_artifacts(published.run_id, Some(dataset.id), &[artifact])?;
            Ok(metrics)
        },
    )
}

/// The predictions file, its checksum, and who wrote it (`predict run 5`, or the path of
/// a file the workspace did not register). A registered file is checked against the
/// catalog as it is read; any other (`--predictions FILE`) is taken as it is.
fn open_predictions(ws: &Workspace, path: &Path) -> Result<(PredictionReader, String, String)> {
    Ok(match ws.registered_at(path)? {
        Some(file) => (
            PredictionReader::open_registered(&file)?,
            file.checksum.clone(),
            format!("{} ({})", path.display(), file.owner),
        ),
        None => (
            PredictionReader::open(path)?,
            checksum_file(path)?.checksum,
            path.display().to_string(),
        ),
    })
}

/// Refuses a task the predictions or the dataset cannot be measured for.
fn check_task(
    task: Task,
    named: &str,
    reader: &PredictionReader,
    dataset: &DatasetRow,
    owner: &str,
) -> Result<()> {
    // A multi-class run's file (the one with the true class's probability) has its class
    // probabilities in `scores`.
    let has_probabilities = match task {
        Task::Multiclass => reader.columns.probabilities || reader.columns.true_class,
        _ => reader.columns.probabilities,
    };
    if task != Task::Multilabel && !has_probabilities {
        bail!(
            "predictions {owner} have no probabilities, which {named} needs: predict \
             again with `pipeline predict --probabilities` (`probabilities = true` in a \
             spec's [predict])"
        );
    }
    if task == Task::Binary {
        ensure!(
            dataset.n_labels == 1,
            "{named} needs a dataset with one label (L = 1, label 0 the positive class); \
             dataset '{}' has L = {}",
            dataset.name,
            dataset.n_labels
        );
    }
    Ok(())
}

fn chunk_paths(ws: &Workspace, dataset: &DatasetRow, split: Split) -> Result<Vec<Registered>> {
    Ok(ws
        .split_chunks(dataset, split)?
        .into_iter()
        .map(|c| c.0)
        .collect())
}

/// Everything one evaluate run reads.
struct Job<'a> {
    opts: &'a EvaluateOptions,
    task: Task,
    dataset: &'a DatasetRow,
    split: Split,
    path: &'a Path,
    train_chunks: Vec<Registered>,
    truth_chunks: Vec<Registered>,
}

impl Job<'_> {
    /// Merge-joins the predictions with the split's labels, writes `metrics.json`.
    fn compute(
        &self,
        reader: PredictionReader,
        scratch: &Path,
    ) -> Result<Staged<(Evaluation, crate::store::chunks::WrittenFile)>> {
        let metrics = match self.task {
            Task::Multilabel => Evaluation::Ranking(self.measure_ranking(reader)?),
            Task::Binary => Evaluation::Binary(self.measure_binary(reader)?),
            Task::Multiclass => Evaluation::Multiclass(self.measure_multiclass(reader)?),
        };
        let staged = scratch.join("evaluation");
        std::fs::create_dir_all(&staged)?;
        let json_path = staged.join("metrics.json");
        std::fs::write(&json_path, metrics.to_json())
            .with_context(|| format!("writing {}", json_path.display()))?;
        let written = checksum_file(&json_path)?;
        Ok(Staged {
            dir: "evaluation",
            name: format!("{}-{}", self.dataset.name, self.split),
            value: (metrics, written),
        })
    }

    /// Calls `each(block, i, true labels)` for every predicted row, in order, and checks
    /// that the predictions cover the split.
    fn for_each_row(
        &self,
        reader: PredictionReader,
        mut each: impl FnMut(&PredictionBlock, usize, &[u32]) -> Result<()>,
    ) -> Result<()> {
        let path = self.path;
        let mut truth = TruthRows::new(self.truth_chunks.clone());
        let mut rows = 0u64;
        for block in reader {
            let block = block?;
            for i in 0..block.len() {
                let labels = truth
                    .labels_of(block.row_ids[i])
                    .with_context(|| format!("{}: row {}", path.display(), block.row_ids[i]))?;
                each(&block, i, &labels)
                    .with_context(|| format!("{}: row {}", path.display(), block.row_ids[i]))?;
                rows += 1;
            }
        }
        let split_rows = self.dataset.split(self.split).map_or(0, |s| s.n_rows);
        ensure!(
            rows == split_rows,
            "{}: {rows} predicted rows, but split '{}' holds {split_rows}",
            path.display(),
            self.split
        );
        Ok(())
    }

    /// Ranking metrics, and with probabilities their calibration over the (row, label)
    /// pairs of each row's first k predictions.
    fn measure_ranking(&self, reader: PredictionReader) -> Result<Metrics> {
        let (dataset, opts) = (self.dataset, self.opts);
        let n_train: u64 = dataset.split(Split::Train).map_or(0, |s| s.n_rows);
        let counts = label_counts(&self.train_chunks, dataset.n_labels as usize)?;
        let inv_prop = inverse_propensity(&counts, n_train, opts.propensity.a, opts.propensity.b);
        let mut acc = MetricsAccumulator::new(opts.k, inv_prop, opts.labelless)?;
        let mut pairs = reader
            .columns
            .probabilities
            .then(CalibrationAccumulator::new);
        self.for_each_row(reader, |block, i, labels| {
            if let (Some(pairs), Some(probs)) = (pairs.as_mut(), block.probabilities(i)) {
                for (l, &p) in block.labels(i).iter().zip(probs).take(opts.k) {
                    pairs.add(checked_probability(p)?, labels.contains(l))?;
                }
            }
            acc.add_row(block.labels(i), labels)
        })?;
        let mut metrics = acc.finish();
        metrics.calibration = pairs.map(|p| p.finish());
        Ok(metrics)
    }

    /// Binary metrics: each row lists label 0 with p = P(y = 1); its truth is {0} or {}.
    fn measure_binary(&self, reader: PredictionReader) -> Result<BinaryMetrics> {
        let mut acc = BinaryAccumulator::new();
        self.for_each_row(reader, |block, i, labels| {
            let at = block
                .labels(i)
                .iter()
                .position(|&l| l == 0)
                .with_context(|| {
                    format!(
                        "label 0 (the positive class) is not among the predicted labels {:?}",
                        block.labels(i)
                    )
                })?;
            let p = block.probabilities(i).context("no probabilities")?[at];
            let positive = match labels {
                [] => false,
                [0] => true,
                other => {
                    bail!("true labels {other:?}: a binary dataset's rows have label 0 or none")
                }
            };
            acc.add_row(p, positive)
        })?;
        Ok(acc.finish())
    }

    fn measure_multiclass(&self, reader: PredictionReader) -> Result<MulticlassMetrics> {
        let mut acc = MulticlassAccumulator::new(self.dataset.n_labels as usize, self.opts.k)?;
        // `ingest --class-map train`: the split's rows of classes no training row has are
        // stored without a class; they are scored as wrong and their classes join K*.
        let unseen = self
            .dataset
            .class_map
            .as_ref()
            .and_then(|m| m.unseen_in(self.split));
        if let Some(u) = unseen {
            acc.add_unseen_classes(u.values.len() as u64);
        }
        self.for_each_row(reader, |block, i, labels| {
            let probs = block.class_probabilities(i).context("no probabilities")?;
            match (labels, unseen, block.true_class_probability(i)) {
                ([], Some(_), _) => acc.add_unseen_row(probs),
                // Predictions written before the column existed: the listed probability.
                (_, _, None) => acc.add_row(block.labels(i), probs, labels),
                (_, _, Some(p_true)) => acc.add_row_knowing(block.labels(i), probs, labels, p_true),
            }
        })?;
        Ok(acc.finish())
    }
}

fn resolve_predictions(ws: &Workspace, p: &str) -> PathBuf {
    let as_given = Path::new(p);
    if as_given.is_absolute() || as_given.exists() {
        as_given.to_path_buf()
    } else {
        ws.resolve(p)
    }
}

/// The metrics of a completed evaluate run, from the JSON file it registered.
fn load_metrics(ws: &Workspace, run_id: i64) -> Result<Evaluation> {
    let file = ws
        .run_file(run_id, ArtifactKind::Metrics)?
        .with_context(|| format!("evaluate run {run_id} registered no metrics"))?;
    Evaluation::from_json(&file.read()?).with_context(|| format!("parsing {}", file.name()))
}

/// The true labels of a split's rows, read chunk by chunk as the row ids advance.
struct TruthRows {
    chunks: VecDeque<Registered>,
    /// (row id, labels) of the current chunk not yet consumed.
    pending: VecDeque<(u64, Vec<u32>)>,
}

impl TruthRows {
    fn new(chunks: Vec<Registered>) -> Self {
        TruthRows {
            chunks: chunks.into(),
            pending: VecDeque::new(),
        }
    }

    /// The labels of `row_id`; rows must be asked for in increasing order (rows skipped on
    /// the way are an error: the predictions must cover the split).
    fn labels_of(&mut self, row_id: u64) -> Result<Vec<u32>> {
        loop {
            if let Some((id, _)) = self.pending.front() {
                let id = *id;
                ensure!(
                    id == row_id,
                    "expected row {id} of the split next, found row {row_id} (predictions \
                     must hold every row of the split, in order)"
                );
                return Ok(self.pending.pop_front().expect("non-empty").1);
            }
            let Some(next) = self.chunks.pop_front() else {
                bail!("row {row_id} is beyond the split's last row");
            };
            let c = read_registered_chunk_labels(&next)?;
            for (i, &id) in c.row_ids.iter().enumerate() {
                let labels = c.labels[c.offsets[i] as usize..c.offsets[i + 1] as usize].to_vec();
                self.pending.push_back((id, labels));
            }
        }
    }
}
