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
use crate::model::predictive::ProbabilityRule;
use crate::scoring::ranking::{checked_top_k, with_ranking, Model};
pub use crate::scoring::ranking::{default_top_k, DEFAULT_TOP_K, EVERY_CLASS_UP_TO};
use crate::stage::{memoised_on, thread_pool, Outcome, Staged};
use crate::store::catalog::{ArtifactKind, ArtifactRow, DatasetRow, RunRow, Split, StageKind};
use crate::store::checkpoint::read_registered_model;
use crate::store::chunks::read_registered_chunk;
use crate::store::integrity::Registered;
use crate::store::npy::NpyMap;
use crate::store::predictions::{
    uncompressed_bytes, OptionalColumns, PredictionBlock, PredictionWriter,
};
use crate::store::space::ensure_free;
use crate::store::workspace::Workspace;
use crate::trained::{run_checkpoint, SvdFiles, Task, TrainConfig};

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
    /// Rows scored together at most (memory: rows × labels f64 scores; fewer with many
    /// labels, `scoring::BLOCK_SCORES`).
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

/// A predictions file.
#[derive(Debug, Clone)]
pub struct PredictedFile {
    /// Workspace-relative path.
    pub path: String,
    pub rows: u64,
    /// Seconds the rows' scoring took (after the model was loaded), when this call scored
    /// them; None when an earlier run's file was reused.
    pub scoring_seconds: Option<f64>,
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
    // The checkpoint's row alone until it is needed: a cached prediction, a split the
    // dataset lacks or a top-k it refuses cost no read of a model of hundreds of MB.
    let (config, ckpt_row) = run_checkpoint(ws, opts.run, opts.checkpoint)?;
    let checkpoint = ws.checkpoint_file(&ckpt_row)?;
    let dataset = config.dataset_row(ws)?;
    let top_k = checked_top_k(config.task, dataset.n_labels, opts.top_k)?;
    let files: Vec<Registered> = ws
        .split_chunks(&dataset, opts.split)?
        .into_iter()
        .map(|c| c.0)
        .collect();
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
        crate::progress::note(format!(
            "predictions of run {} step {} on '{}' are already done (run {}); nothing to do",
            opts.run, ckpt_row.step, opts.split, done.id
        ));
        Ok(PredictedFile {
            path: art.path,
            rows: art.rows.unwrap_or(0),
            scoring_seconds: None,
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
        checkpoint: &checkpoint,
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
        |published, (written, rows, secs): (crate::store::chunks::WrittenFile, u64, f64)| {
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
            Ok(PredictedFile {
                path,
                rows,
                scoring_seconds: Some(secs),
            })
        },
    )
}

/// Everything one predict run reads.
struct Job<'a> {
    opts: &'a PredictOptions,
    /// `--top-k` as resolved for the run ([`checked_top_k`]).
    top_k: usize,
    /// The optional columns written: probabilities when asked for, the true class's
    /// probability for a multi-class run.
    columns: OptionalColumns,
    config: &'a TrainConfig,
    dataset: &'a DatasetRow,
    checkpoint_step: u64,
    /// The checkpoint whose model ranks the rows, read when they are ranked.
    checkpoint: &'a Registered,
    /// X̃ [R×D].
    basis: &'a Registered,
    files: &'a [Registered],
    comm: &'a dyn Comm,
}

impl Job<'_> {
    /// Ranks every row of the split into `scratch/predictions/predictions.parquet` (over
    /// ranks: this rank's share, the file written by rank 0 alone): the file written, its
    /// rows, and the seconds the scoring took.
    fn write(
        &self,
        scratch: &Path,
    ) -> Result<Staged<(crate::store::chunks::WrittenFile, u64, f64)>> {
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
        let loaded = read_registered_model(self.checkpoint)?;
        let basis = NpyMap::open_registered(self.basis)?;
        let model = Model {
            config: self.config,
            n_features: dataset.n_features,
            params: &loaded.params,
            basis: &basis,
        };
        let started = Instant::now();
        let mut rows = 0u64;
        let sizes = (self.top_k, opts.block_rows, opts.probabilities);
        // Ranking scores block after block of the same sizes: the allocator keeps them on
        // the heap and reuses them, as the training loop's steps are (`crate::alloc`).
        crate::alloc::for_recurring_steps();
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
                    started.elapsed().as_secs_f64(),
                ),
            });
        };
        ensure!(
            rows == split_rows,
            "predicted {rows} rows, the split holds {split_rows}"
        );
        let written = writer.finish()?;
        let secs = started.elapsed().as_secs_f64();
        crate::progress::note(format!(
            "predicted top-{} of {rows} '{}' rows in {secs:.1} s ({:.0} rows/s)",
            self.top_k,
            opts.split,
            rows as f64 / secs.max(1e-9)
        ));
        Ok(Staged {
            dir: "predictions",
            name: format!("{}-{}", dataset.name, opts.split),
            value: (written, rows, secs),
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
