//! `pipeline evaluate`: ranking metrics of a predictions file against the true labels of
//! its split (`docs/metrics.md`).
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
use crate::metrics::{
    inverse_propensity, metric_rows, LabellessRows, Metrics, MetricsAccumulator, PropensityParams,
};
use crate::stage::{memoised, Outcome, Staged};
use crate::store::catalog::{ArtifactKind, ArtifactRow, DatasetRow, RunRow, StageKind};
use crate::store::chunks::{checksum_file, label_counts, read_registered_chunk_labels};
use crate::store::integrity::Registered;
use crate::store::predictions::PredictionReader;
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
}

impl EvaluateOptions {
    /// The command line's defaults for `predictions`.
    pub fn new(predictions: String) -> Self {
        EvaluateOptions {
            predictions,
            k: 5,
            propensity: PropensityParams::GENERIC,
            labelless: LabellessRows::CountAsZero,
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
pub fn run(ws: &Workspace, opts: &EvaluateOptions) -> Result<Outcome<Metrics>> {
    opts.validate()?;
    let path = resolve_predictions(ws, &opts.predictions);
    // A file the workspace registered is checked against the catalog as it is read; any
    // other predictions file (`--predictions FILE`) is taken as it is.
    let (reader, checksum) = match ws.registered_at(&path)? {
        Some(file) => (PredictionReader::open_registered(&file)?, file.checksum),
        None => (
            PredictionReader::open(&path)?,
            checksum_file(&path)?.checksum,
        ),
    };
    let meta = |key: &str| {
        reader
            .metadata
            .get(key)
            .cloned()
            .with_context(|| format!("{}: no `{key}` in the file's metadata", path.display()))
    };
    let (dataset_name, split) = (meta("fsgp.dataset")?, meta("fsgp.split")?);
    let step: Option<i64> = meta("fsgp.checkpoint_step")
        .ok()
        .and_then(|s| s.parse().ok());
    let dataset = ws.catalog.dataset(&dataset_name)?.with_context(|| {
        format!(
            "{}: dataset '{dataset_name}' is not in the workspace",
            path.display()
        )
    })?;
    let params = json!({
        "predictions_checksum": checksum,
        "dataset": dataset.name,
        "dataset_checksum": dataset.checksum,
        "split": split,
        "k": opts.k,
        "propensity_a": opts.propensity.a,
        "propensity_b": opts.propensity.b,
        "labelless": format!("{:?}", opts.labelless),
    });
    let cached = |done: &RunRow| {
        let metrics = load_metrics(ws, done.id)?;
        eprintln!(
            "metrics of {} are already computed (run {}); nothing to do",
            opts.predictions, done.id
        );
        Ok(metrics)
    };
    let job = Job {
        opts,
        dataset: &dataset,
        split: &split,
        path: &path,
        train_chunks: chunk_paths(ws, &dataset, "train")?,
        truth_chunks: chunk_paths(ws, &dataset, &split)?,
    };
    memoised(
        ws,
        StageKind::Evaluate,
        &params,
        None,
        cached,
        |scratch| job.compute(reader, scratch),
        |published, (metrics, written): (Metrics, crate::store::chunks::WrittenFile)| {
            let artifact = ArtifactRow {
                kind: ArtifactKind::Metrics,
                path: format!("{}/metrics.json", published.rel),
                bytes: written.bytes,
                rows: None,
                checksum: written.checksum,
                split: Some(split.clone()),
            };
            ws.catalog
                .record_metrics(published.run_id, &metric_rows(&metrics, step, &split))?;
            ws.catalog
                .commit_artifacts(published.run_id, Some(dataset.id), &[artifact])?;
            Ok(metrics)
        },
    )
}

fn chunk_paths(ws: &Workspace, dataset: &DatasetRow, split: &str) -> Result<Vec<Registered>> {
    Ok(ws
        .split_chunks(dataset, split)?
        .into_iter()
        .map(|c| c.0)
        .collect())
}

/// Everything one evaluate run reads.
struct Job<'a> {
    opts: &'a EvaluateOptions,
    dataset: &'a DatasetRow,
    split: &'a str,
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
    ) -> Result<Staged<(Metrics, crate::store::chunks::WrittenFile)>> {
        let metrics = self.measure(reader)?;
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

    fn measure(&self, reader: PredictionReader) -> Result<Metrics> {
        let (dataset, opts, path) = (self.dataset, self.opts, self.path);
        let n_train: u64 = dataset.split("train").map_or(0, |s| s.n_rows);
        let counts = label_counts(&self.train_chunks, dataset.n_labels as usize)?;
        let inv_prop = inverse_propensity(&counts, n_train, opts.propensity.a, opts.propensity.b);
        let mut acc = MetricsAccumulator::new(opts.k, inv_prop, opts.labelless)?;
        let mut truth = TruthRows::new(self.truth_chunks.clone());
        let mut rows = 0u64;
        for block in reader {
            let block = block?;
            for i in 0..block.len() {
                let labels = truth
                    .labels_of(block.row_ids[i])
                    .with_context(|| format!("{}: row {}", path.display(), block.row_ids[i]))?;
                acc.add_row(block.labels(i), &labels)?;
                rows += 1;
            }
        }
        let split_rows = dataset.split(self.split).map_or(0, |s| s.n_rows);
        ensure!(
            rows == split_rows,
            "{}: {rows} predicted rows, but split '{}' holds {split_rows}",
            path.display(),
            self.split
        );
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
fn load_metrics(ws: &Workspace, run_id: i64) -> Result<Metrics> {
    let file = ws
        .run_file(run_id, ArtifactKind::Metrics)?
        .with_context(|| format!("evaluate run {run_id} registered no metrics"))?;
    serde_json::from_slice(&file.read()?).with_context(|| format!("parsing {}", file.name()))
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
