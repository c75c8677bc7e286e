//! `pipeline predict`: top-k labels of every row of a split under a training checkpoint.
//!
//! Data flow per chunk of the split: Parquet CSR rows → projection onto the training basis
//! (X* X̃ᵀ, sparse × dense, the same f32 kernel as `pipeline svd`) → mean utilities
//! f̄ = K_*Z μ Φᵀ + b in blocks of rows → partial selection of the k best labels →
//! one row group of the predictions file. Memory: one chunk plus a block of B×K scores,
//! whatever the number of rows. The scoring itself is [`crate::scoring::Ranker`].
//!
//! Over MPI ranks ([`run_on`], [`ranks`]) each rank scores its share of the chunks and
//! rank 0 writes every block, in the chunks' order: the same file as one process.
//!
//! `pipeline predict --input` ([`input`]) scores rows that were never ingested, read as the
//! run's dataset was read and ranked by the same [`Ranking`] as a split's chunks.

pub mod input;
mod ranks;

use std::path::Path;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use serde_json::json;

use crate::comm::{Comm, Single};
use crate::error::InvalidOptions;
use crate::model::likelihood::multiclass::ClassLikelihood;
use crate::model::params::Params;
use crate::model::predictive::ProbabilityRule;
use crate::scoring::{model_inputs, Ranker};
use crate::stage::{memoised_on, thread_pool, Outcome, Staged};
use crate::store::catalog::{ArtifactKind, ArtifactRow, DatasetRow, RunRow, Split, StageKind};
use crate::store::chunks::{read_registered_chunk, CsrChunk};
use crate::store::integrity::Registered;
use crate::store::npy::NpyMap;
use crate::store::predictions::{
    uncompressed_bytes, OptionalColumns, PredictionBlock, PredictionWriter,
};
use crate::store::space::ensure_free;
use crate::store::workspace::Workspace;
use crate::trained::{load_run_checkpoint, SvdFiles, Task, TrainConfig};

/// What `pipeline predict` computes.
#[derive(Debug, Clone, PartialEq)]
pub struct PredictOptions {
    /// Training run.
    pub run: i64,
    /// Checkpoint step (None: the run's last).
    pub checkpoint: Option<u64>,
    pub split: Split,
    /// Labels kept per row (None: [`default_top_k`] of the run's task and label count).
    pub top_k: Option<usize>,
    /// Rows scored together (memory: rows × labels f64 scores).
    pub block_rows: usize,
    /// Also write the predictive probabilities p(y = 1) of the kept labels, by the rule of
    /// the run's likelihood and task (`TrainConfig::probability_rule`).
    pub probabilities: bool,
    /// Worker threads (None: the training run's count).
    pub threads: Option<usize>,
}

impl PredictOptions {
    /// The command line's defaults for training run `run`.
    pub fn new(run: i64) -> Self {
        PredictOptions {
            run,
            checkpoint: None,
            split: Split::Test,
            top_k: None,
            block_rows: 1024,
            probabilities: false,
            threads: None,
        }
    }

    /// Checks the values no type rules out; `run` and `pipeline run`'s spec check call it.
    pub fn validate(&self) -> Result<(), InvalidOptions> {
        let mut c = InvalidOptions::new("");
        c.check(self.top_k.is_none_or(|k| k >= 1), "top-k", || {
            "must be at least 1".into()
        });
        c.check(self.block_rows >= 1, "block-rows", || {
            "must be at least 1".into()
        });
        c.into_result()
    }
}

/// Labels a multi-label prediction keeps per row when `--top-k` is not given (and a
/// multi-class one with more than [`EVERY_CLASS_UP_TO`] classes).
pub const DEFAULT_TOP_K: usize = 5;

/// A multi-class run with at most this many classes lists every class of every row when
/// `--top-k` is not given. Its NLP needs no listing (the file holds each row's probability
/// of its true class whatever k), so the bound is one of size: a listed class costs 8 bytes
/// per row (its id and probability; 12 with `--probabilities`) in the file and in the
/// whole-file read of `evaluate`, so N rows of K ≤ 20 classes cost at most 4× the default
/// top-5 (about 260 against 80 bytes a row with probabilities, 260 MB per million rows).
pub const EVERY_CLASS_UP_TO: u64 = 4 * DEFAULT_TOP_K as u64;

/// `--top-k` when it is not given, for a run of `task` on `n_labels` labels (L, or K
/// classes): 1 for a binary run (its one label), every class of a multi-class run with
/// K ≤ [`EVERY_CLASS_UP_TO`], and [`DEFAULT_TOP_K`] otherwise.
pub fn default_top_k(task: Task, n_labels: u64) -> usize {
    match task {
        Task::Binary => 1,
        Task::Multiclass if n_labels <= EVERY_CLASS_UP_TO => n_labels as usize,
        Task::Multiclass | Task::Multilabel => DEFAULT_TOP_K,
    }
}

/// The top-k a prediction with a run of `task` on `n_labels` labels keeps: the one label
/// of a binary run whatever was asked (L = 1), otherwise `--top-k` when given, else
/// [`default_top_k`].
fn resolved_top_k(task: Task, n_labels: u64, given: Option<usize>) -> usize {
    match (task, given) {
        (Task::Binary, _) | (_, None) => default_top_k(task, n_labels),
        (_, Some(k)) => k,
    }
}

/// A predictions file.
#[derive(Debug, Clone)]
pub struct PredictedFile {
    /// Workspace-relative path.
    pub path: String,
    pub rows: u64,
}

/// Runs `pipeline predict` (memoised on the checkpoint, split and options).
pub fn run(ws: &Workspace, opts: &PredictOptions) -> Result<Outcome<PredictedFile>> {
    Ok(run_on(ws, &Single, opts)?.of_one_process())
}

/// [`run`] over the ranks of `comm`: each rank scores its share of the chunks (chunk i is
/// rank i mod K's), rank 0 writes the one predictions file and the catalog and is the one
/// that returns it (`None` on the others).
pub fn run_on(
    ws: &Workspace,
    comm: &dyn Comm,
    opts: &PredictOptions,
) -> Result<Outcome<Option<PredictedFile>>> {
    opts.validate()?;
    let (config, ckpt_row, ckpt) = load_run_checkpoint(ws, opts.run, opts.checkpoint)?;
    let dataset = config.dataset_row(ws)?;
    let top_k = resolved_top_k(config.task, dataset.n_labels, opts.top_k);
    let files: Vec<Registered> = ws
        .split_chunks(&dataset, opts.split)?
        .into_iter()
        .map(|c| c.0)
        .collect();
    ensure!(
        top_k <= dataset.n_labels as usize,
        "--top-k {top_k} exceeds the {} labels",
        dataset.n_labels
    );
    let mut params = json!({
        "train_run": opts.run,
        "checkpoint_step": ckpt_row.step,
        "checkpoint_checksum": ckpt_row.checksum,
        "split": opts.split,
        "top_k": top_k,
        "probabilities": opts.probabilities,
    });
    let columns = OptionalColumns::with(opts.probabilities, config.task == Task::Multiclass);
    if config.task == Task::Multiclass {
        // Classes are ranked by their predictive probabilities whether or not these are
        // written, so the rule is recorded either way.
        params["predictive"] = json!(format!("classes-{}", config.likelihood.name()));
        // Files written before the true class's probability was recorded lack its column:
        // a new key, so that such a run is not found for this one.
        params["true_class_probability"] = json!(true);
    } else if opts.probabilities
        && config.probability_rule()? != ProbabilityRule::LogisticProbitApproximation
    {
        // Recorded when it is not the rule predict has always used (whose runs' params,
        // and so their lookups, stay as they were).
        params["predictive"] = json!(config.probability_rule()?.name());
    }
    let cached = |done: &RunRow| {
        let art = ws
            .catalog
            .run_artifact(done.id, ArtifactKind::Predictions)?
            .context("completed predict run without predictions")?;
        eprintln!(
            "predictions of run {} step {} on '{}' are already done (run {}); nothing to do",
            opts.run, ckpt_row.step, opts.split, done.id
        );
        Ok(PredictedFile {
            path: art.path,
            rows: art.rows.unwrap_or(0),
        })
    };
    let basis = SvdFiles::of_run(ws, config.svd_run)?.basis;
    let pool = thread_pool(opts.threads.unwrap_or(config.threads))?;
    let job = Job {
        opts,
        top_k,
        columns,
        config: &config,
        dataset: &dataset,
        checkpoint_step: ckpt_row.step,
        params: &ckpt.params,
        basis: &basis,
        files: &files,
        comm,
    };
    memoised_on(
        ws,
        comm,
        StageKind::Predict,
        &params,
        Some(&pool),
        cached,
        |scratch| job.write(scratch),
        |published, (written, rows): (crate::store::chunks::WrittenFile, u64)| {
            let path = format!("{}/predictions.parquet", published.rel);
            let artifact = ArtifactRow {
                kind: ArtifactKind::Predictions,
                path: path.clone(),
                bytes: written.bytes,
                rows: Some(rows),
                checksum: written.checksum,
                split: Some(opts.split),
            };
            ws.catalog
                .commit_artifacts(published.run_id, Some(dataset.id), &[artifact])?;
            Ok(PredictedFile { path, rows })
        },
    )
}

/// What ranking rows under a checkpoint needs of its training run.
struct Model<'a> {
    config: &'a TrainConfig,
    /// D of the run's dataset.
    n_features: u64,
    /// The checkpoint's parameters.
    params: &'a Params,
    /// X̃ [R×D], the svd run's basis.
    basis: &'a Registered,
}

/// How rows are ranked under one checkpoint: the [`Ranker`] opened with the run's view of
/// the rows and probability rule, and for a multi-class run its likelihood. `predict
/// --split` and `predict --input` both rank through it, so a new row is scored exactly as
/// the same row in a split is.
struct Ranking<'p> {
    ranker: Ranker<'p>,
    /// Multi-class runs: the classes are ranked by their predictive probabilities.
    class_lik: Option<Box<dyn ClassLikelihood>>,
    /// The Monte Carlo seed of the class probabilities (sampling likelihoods).
    seed: u64,
    top_k: usize,
    /// Rows scored together (memory: rows × labels f64 scores).
    block_rows: usize,
    probabilities: bool,
}

impl Ranking<'_> {
    /// The predictions of `chunk`'s rows, one block per `block_rows` rows, in row order.
    /// The chunk's row ids must be consecutive (they seed each row's Monte Carlo noise).
    fn rank(&self, chunk: &CsrChunk) -> Result<Vec<PredictionBlock>> {
        let blocks = match &self.class_lik {
            None => self.ranker.rank_chunk(chunk, self.top_k, self.block_rows),
            Some(lik) => self.ranker.rank_chunk_classes(
                chunk,
                &**lik,
                self.seed,
                (self.top_k, self.block_rows),
                self.probabilities,
            ),
        }?;
        Ok(blocks.into_iter().map(|(_, block)| block).collect())
    }
}

/// Opens the [`Ranking`] of `model` keeping `(top_k, block_rows, probabilities)` and calls
/// `f` with it (the ranker borrows parameters made here: ARD over the features ranks with
/// the weights folded into the basis). `what` names the rows for a failure to open it.
fn with_ranking<T>(
    model: &Model<'_>,
    (top_k, block_rows, probabilities): (usize, usize, bool),
    what: &dyn Fn() -> String,
    f: impl FnOnce(&Ranking<'_>) -> Result<T>,
) -> Result<T> {
    let config = model.config;
    let basis = NpyMap::open_registered(model.basis)?;
    let (inputs, k_tilde, unweighted) = model_inputs(
        &basis,
        model.n_features,
        config.inducing_inputs.in_features(),
        model.params,
    )?;
    let class_lik = match config.task {
        Task::Multiclass => Some(config.class_likelihood()?),
        _ => None,
    };
    let ranker = Ranker::open(
        inputs,
        k_tilde,
        config.kernel.kind(),
        unweighted.as_ref().unwrap_or(model.params),
        probabilities || class_lik.is_some(),
    )
    .with_context(what)?;
    let ranker = match class_lik {
        Some(_) => ranker,
        None => ranker.with_probability_rule(config.probability_rule()?),
    };
    f(&Ranking {
        ranker,
        class_lik,
        seed: config.predictive_seed(),
        top_k,
        block_rows,
        probabilities,
    })
}

/// Everything one predict run reads.
struct Job<'a> {
    opts: &'a PredictOptions,
    /// `--top-k` as resolved for the run ([`resolved_top_k`]).
    top_k: usize,
    /// The optional columns written: probabilities when asked for, the true class's
    /// probability for a multi-class run.
    columns: OptionalColumns,
    config: &'a TrainConfig,
    dataset: &'a DatasetRow,
    checkpoint_step: u64,
    params: &'a Params,
    /// X̃ [R×D].
    basis: &'a Registered,
    files: &'a [Registered],
    comm: &'a dyn Comm,
}

impl Job<'_> {
    /// Ranks every row of the split into `scratch/predictions/predictions.parquet` (over
    /// ranks: this rank's share, the file written by rank 0 alone).
    fn write(&self, scratch: &Path) -> Result<Staged<(crate::store::chunks::WrittenFile, u64)>> {
        let (opts, dataset) = (self.opts, self.dataset);
        let split_rows = dataset.split(opts.split).map_or(0, |s| s.n_rows);
        let mut writer = match self.comm.is_root() {
            true => Some(self.create_writer(scratch, split_rows)?),
            false => None,
        };
        // A model whose q(u) cannot be factorised fails here or at its first block of rows.
        let scoring = || {
            format!(
                "scoring '{}' rows with train run {} (checkpoint step {})",
                opts.split, opts.run, self.checkpoint_step
            )
        };
        let model = Model {
            config: self.config,
            n_features: dataset.n_features,
            params: self.params,
            basis: self.basis,
        };
        let started = Instant::now();
        let mut rows = 0u64;
        let sizes = (self.top_k, opts.block_rows, opts.probabilities);
        with_ranking(&model, sizes, &scoring, |ranking| {
            let rank_chunk = |file: &Registered| -> Result<Vec<PredictionBlock>> {
                let chunk = read_registered_chunk(file)?;
                ranking.rank(&chunk).with_context(scoring)
            };
            if self.comm.size() == 1 {
                let writer = writer.as_mut().expect("one process is rank 0");
                for file in self.files {
                    for block in rank_chunk(file)? {
                        writer.write(&block)?;
                        rows += block.len() as u64;
                    }
                }
                return Ok(());
            }
            ranks::rank_over_ranks(
                self.comm,
                self.files.len(),
                &mut |i| rank_chunk(&self.files[i]),
                &mut |block| {
                    rows += block.len() as u64;
                    writer.as_mut().map_or(Ok(()), |w| w.write(block))
                },
            )
        })?;
        let Some(writer) = writer else {
            // Another rank: its share is with rank 0, which writes and publishes.
            return Ok(Staged {
                dir: "predictions",
                name: String::new(),
                value: (
                    crate::store::chunks::WrittenFile {
                        bytes: 0,
                        checksum: String::new(),
                    },
                    rows,
                ),
            });
        };
        ensure!(
            rows == split_rows,
            "predicted {rows} rows, the split holds {split_rows}"
        );
        let written = writer.finish()?;
        let secs = started.elapsed().as_secs_f64();
        eprintln!(
            "predicted top-{} of {rows} '{}' rows in {secs:.1} s ({:.0} rows/s)",
            self.top_k,
            opts.split,
            rows as f64 / secs.max(1e-9)
        );
        Ok(Staged {
            dir: "predictions",
            name: format!("{}-{}", dataset.name, opts.split),
            value: (written, rows),
        })
    }

    /// Rank 0's (or the one process's) predictions file in `scratch/predictions/`, after
    /// checking there is room for `split_rows` rows.
    fn create_writer(&self, scratch: &Path, split_rows: u64) -> Result<PredictionWriter> {
        let (opts, dataset) = (self.opts, self.dataset);
        let out = scratch.join("predictions");
        std::fs::create_dir_all(&out)?;
        // Refused before any row is scored, not after with a half-written file.
        ensure_free(
            &out,
            uncompressed_bytes(split_rows, self.top_k, self.columns),
            "predictions.parquet",
        )?;
        let metadata = vec![
            ("fsgp.dataset".to_string(), dataset.name.clone()),
            ("fsgp.split".to_string(), opts.split.name().to_string()),
            ("fsgp.train_run".to_string(), opts.run.to_string()),
            (
                "fsgp.checkpoint_step".to_string(),
                self.checkpoint_step.to_string(),
            ),
            ("fsgp.top_k".to_string(), self.top_k.to_string()),
        ];
        PredictionWriter::create(&out.join("predictions.parquet"), &metadata, self.columns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default top-k: every class of a multi-class run up to K = 20, then 5, as for a
    /// multi-label run of any L; a binary run's one label whatever is asked; a given
    /// `--top-k` otherwise as given, even below K.
    #[test]
    fn every_class_is_kept_by_default_up_to_twenty_classes() {
        assert_eq!(EVERY_CLASS_UP_TO, 20);
        for (k, want) in [(2, 2), (6, 6), (10, 10), (20, 20), (21, 5), (355, 5)] {
            assert_eq!(default_top_k(Task::Multiclass, k), want, "K = {k}");
            assert_eq!(resolved_top_k(Task::Multiclass, k, None), want, "K = {k}");
        }
        for l in [3, 10, 983] {
            assert_eq!(default_top_k(Task::Multilabel, l), DEFAULT_TOP_K, "L = {l}");
        }
        assert_eq!(resolved_top_k(Task::Multiclass, 10, Some(3)), 3);
        assert_eq!(resolved_top_k(Task::Multilabel, 983, Some(7)), 7);
        for given in [None, Some(1), Some(5)] {
            assert_eq!(resolved_top_k(Task::Binary, 1, given), 1, "{given:?}");
        }
    }
}
