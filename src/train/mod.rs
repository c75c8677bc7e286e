//! `pipeline train` and `pipeline elbo`: stochastic variational inference for MLGPF on the
//! factors of `pipeline svd`, minibatches streamed through a bounded prefetch queue,
//! Parquet checkpoints registered as they are written (so a killed run resumes), and the
//! exact full-data bound of a checkpoint.
//!
//! Data flow: `kxx.npy` + `sq_norms.npy` (memory maps) + the train split's label columns →
//! [`batches::Prefetcher`] → `model::objective` → Adam → `store::checkpoint`.

pub mod batches;
pub mod init;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use faer::Mat;
use indicatif::{ProgressBar, ProgressStyle};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::evaluate::metrics::{LabellessRows, Metrics, MetricsAccumulator, PropensityParams};
use crate::model::kernel::{BasisInputs, KernelKind};
use crate::model::likelihood::BernoulliLogistic;
use crate::model::objective::{evaluate_set, expected_loglik, kl_total, EvalOptions};
use crate::model::optim::{AdamConfig, AdamState};
use crate::model::params::{Block, Params};
use crate::model::scratch::Scratch;
use crate::model::terms::{terms_sampled, TermSet};
use crate::predict::Ranker;
use crate::store::catalog::{CheckpointRow, DatasetRow, MetricRow};
use crate::store::checkpoint::{read_checkpoint, write_checkpoint, Checkpoint, TrainState};
use crate::store::chunks::{checksum_file, label_counts, read_chunk};
use crate::store::npy::NpyMap;
use crate::workspace::{StageRun, Workspace};
use batches::{
    check_spans, spans_from_rows, stream_seed, streams, Order, Planner, Prefetcher, Source, Span,
};

/// Which kernel, on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KernelArg {
    Linear,
    Se,
}

impl KernelArg {
    pub fn kind(self) -> KernelKind {
        match self {
            KernelArg::Linear => KernelKind::Linear,
            KernelArg::Se => KernelKind::SquaredExponential,
        }
    }

    fn name(self) -> &'static str {
        match self {
            KernelArg::Linear => "linear",
            KernelArg::Se => "se",
        }
    }
}

/// `--negatives all|COUNT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Negatives {
    All,
    Sample(usize),
}

fn parse_negatives(s: &str) -> Result<Negatives, String> {
    if s == "all" {
        return Ok(Negatives::All);
    }
    match s.parse::<usize>() {
        Ok(n) if n > 0 => Ok(Negatives::Sample(n)),
        _ => Err(format!("expected 'all' or a positive count, found {s:?}")),
    }
}

/// Arguments of `pipeline train`.
#[derive(clap::Args, Debug, Clone)]
pub struct TrainArgs {
    /// Dataset (as named at ingest); required unless --resume.
    #[arg(long, required_unless_present = "resume")]
    pub dataset: Option<String>,
    /// SVD run whose factors to use (default: the newest one of the dataset).
    #[arg(long)]
    pub svd: Option<i64>,
    #[arg(long, value_enum, default_value_t = KernelArg::Linear)]
    pub kernel: KernelArg,
    /// M: inducing inputs (at most the rows of the svd run's a_init.npy; default all).
    #[arg(long)]
    pub inducing: Option<usize>,
    /// P: latent GPs.
    #[arg(long, default_value_t = 30)]
    pub factors: usize,
    /// B: rows per minibatch.
    #[arg(long, default_value_t = 500)]
    pub batch: usize,
    #[arg(long, default_value_t = 10)]
    pub epochs: u64,
    /// Stop after S optimiser steps in all, counted from step 0 (or at the end of --epochs if
    /// sooner); an epoch cut short is recorded like the others, over the steps it ran.
    #[arg(long, value_name = "S")]
    pub max_steps: Option<u64>,
    /// Adam's learning rate η.
    #[arg(long, default_value_t = 0.01)]
    pub lr: f64,
    #[arg(long, default_value_t = 0.9)]
    pub beta1: f64,
    #[arg(long, default_value_t = 0.999)]
    pub beta2: f64,
    /// Negative labels per row: all, or a uniform sample of COUNT reweighted to stay unbiased.
    #[arg(long, default_value = "all", value_parser = parse_negatives)]
    pub negatives: Negatives,
    /// Gauss–Hermite points of the likelihood expectations.
    #[arg(long, default_value_t = crate::model::likelihood::DEFAULT_POINTS)]
    pub quadrature: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Worker threads (default: all cores). Results are bitwise reproducible for a fixed
    /// thread count.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Continue an interrupted or failed run from its last checkpoint; every other option
    /// is taken from that run.
    #[arg(long)]
    pub resume: Option<i64>,
    /// Start a new run even when an interrupted run with exactly this configuration exists
    /// (by default that run is resumed).
    #[arg(long, conflicts_with = "resume")]
    pub fresh: bool,
    /// Write a checkpoint every this many steps (and always at the end).
    #[arg(long, default_value_t = 500)]
    pub checkpoint_every: u64,
    /// Keep the inducing inputs A at their initial value (the paper's "sf-" variants).
    #[arg(long)]
    pub freeze_a: bool,
    /// Keep the kernel hyperparameters σ_f and ℓ at their initial values.
    #[arg(long)]
    pub freeze_hyper: bool,
    /// Minibatches the prefetch queue holds.
    #[arg(long, default_value_t = 4)]
    pub prefetch: usize,
    /// Chunks whose rows are shuffled together.
    #[arg(long, default_value_t = 2)]
    pub shuffle_chunks: usize,
    /// Skip the exact full-data bound at the end (a full pass over all rows and labels).
    #[arg(long)]
    pub no_final_elbo: bool,
    /// Every this many epochs (and after the last), rank the rows of --eval-split and
    /// record P@k, nDCG@k, PSP@k, PSnDCG@k (k ≤ 5) per epoch; 0 = never. It reads the
    /// parameters only, so the trained numbers do not depend on it.
    #[arg(long, default_value_t = 0)]
    pub eval_every: u64,
    /// The held-out split --eval-every ranks.
    #[arg(long, default_value = "test")]
    pub eval_split: String,
}

/// How a training loop runs, beyond the configuration that fixes its numbers.
struct LoopOptions {
    final_elbo: bool,
    prefetch: usize,
    held_out: Option<HeldOut>,
}

impl LoopOptions {
    fn new(ws: &Workspace, setup: &Setup, args: &TrainArgs) -> Result<Self> {
        let held_out = if args.eval_every > 0 {
            Some(HeldOut::open(ws, setup, args)?)
        } else {
            None
        };
        Ok(LoopOptions {
            final_elbo: !args.no_final_elbo,
            prefetch: args.prefetch,
            held_out,
        })
    }
}

/// The held-out split `--eval-every` ranks, with the inverse propensities of the labels.
struct HeldOut {
    every: u64,
    split: String,
    files: Vec<PathBuf>,
    basis: PathBuf,
    n_features: u64,
    inv_prop: Arc<[f64]>,
}

/// Metrics at k = 1..HELD_OUT_K during training.
const HELD_OUT_K: usize = 5;

impl HeldOut {
    fn open(ws: &Workspace, setup: &Setup, args: &TrainArgs) -> Result<Self> {
        let dataset = ws
            .catalog
            .dataset(&setup.config.dataset)?
            .with_context(|| format!("dataset '{}' is gone", setup.config.dataset))?;
        let files = ws
            .split_chunks(&dataset, &args.eval_split)?
            .into_iter()
            .map(|c| c.0)
            .collect();
        let counts = setup.label_counts()?;
        let inv_prop = PropensityParams::GENERIC.inverse_propensity(&counts, setup.n_rows);
        Ok(HeldOut {
            every: args.eval_every,
            split: args.eval_split.clone(),
            files,
            basis: svd_basis_path(ws, setup.config.svd_run)?,
            n_features: dataset.n_features,
            inv_prop: inv_prop.into(),
        })
    }

    /// Ranks every held-out row under `params` and returns the metrics.
    fn evaluate(&self, setup: &Setup, params: &Params) -> Result<Metrics> {
        let ranker = Ranker::open(
            &self.basis,
            setup.k_tilde.clone(),
            self.n_features,
            setup.kind,
            params,
            false,
        )?;
        let mut acc =
            MetricsAccumulator::new(HELD_OUT_K, self.inv_prop.clone(), LabellessRows::default())?;
        for path in &self.files {
            let chunk = read_chunk(path)?;
            for (start, block) in ranker.rank_chunk(&chunk, HELD_OUT_K, 1024) {
                for i in 0..block.len() {
                    let r = start + i;
                    let truth = &chunk.labels
                        [chunk.label_offsets[r] as usize..chunk.label_offsets[r + 1] as usize];
                    acc.add_row(block.labels(i), truth)?;
                }
            }
        }
        Ok(acc.finish())
    }
}

/// Everything that determines a run's numbers: stored in the catalog and in every
/// checkpoint. Nothing run-specific (ids, times, paths), so reruns write identical bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    pub dataset: String,
    pub dataset_checksum: String,
    pub svd_run: i64,
    pub kernel: KernelArg,
    pub inducing: usize,
    pub factors: usize,
    pub batch: usize,
    pub epochs: u64,
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub negatives: Negatives,
    pub quadrature: usize,
    pub seed: u64,
    pub threads: usize,
    pub freeze_a: bool,
    pub freeze_hyper: bool,
    pub shuffle_chunks: usize,
    pub checkpoint_every: u64,
    /// `--max-steps`: the run stops after this many optimiser steps, counted from step 0
    /// (None: at the end of `epochs`). Absent from the JSON when None, so configurations
    /// (and checkpoints) from before the option read and compare as they did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u64>,
}

impl TrainConfig {
    fn adam(&self) -> AdamConfig {
        AdamConfig {
            lr: self.lr,
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
        }
    }

    fn frozen(&self, block: Block) -> bool {
        (self.freeze_a && block == Block::A)
            || (self.freeze_hyper && (block == Block::LogSf2 || block == Block::LogEll))
            // ℓ means nothing to the linear kernel; keep it fixed rather than drifting.
            || (self.kernel == KernelArg::Linear && block == Block::LogEll)
    }

    fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("config serialises")
    }
}

/// Result of a training run (or of finding it already done).
#[derive(Debug, Clone)]
pub struct TrainOutcome {
    pub run_id: i64,
    pub computed: bool,
    pub final_step: u64,
    pub exact_elbo: Option<f64>,
}

/// The svd run's files the trainer reads.
struct SvdFiles {
    kxx: PathBuf,
    sq_norms: PathBuf,
    basis: PathBuf,
    a_init: PathBuf,
}

fn svd_files(ws: &Workspace, svd_run: i64) -> Result<SvdFiles> {
    let arts = ws.catalog.run_artifacts(svd_run)?;
    let find = |kind: &str| -> Result<PathBuf> {
        arts.iter()
            .find(|a| a.kind == kind)
            .map(|a| ws.resolve(&a.path))
            .with_context(|| format!("svd run {svd_run} has no {kind} artifact"))
    };
    Ok(SvdFiles {
        kxx: find("kxx")?,
        sq_norms: find("sq_norms")?,
        basis: find("basis")?,
        a_init: find("a_init")?,
    })
}

/// The newest successful svd run of `d` (its current ingest).
fn newest_svd_run(ws: &Workspace, d: &DatasetRow) -> Result<i64> {
    ws.catalog
        .runs(usize::MAX >> 1)?
        .into_iter()
        .find(|r| {
            r.stage == "svd"
                && r.status == "ok"
                && r.params["dataset"] == d.name.as_str()
                && r.params["dataset_checksum"] == d.checksum.as_str()
        })
        .map(|r| r.id)
        .with_context(|| {
            format!(
                "dataset '{}' has no svd run; run `pipeline svd --dataset {}` first",
                d.name, d.name
            )
        })
}

/// Training chunk files of a dataset with their row counts, in chunk order.
fn train_spans(ws: &Workspace, d: &DatasetRow) -> Result<Vec<batches::ChunkSpan>> {
    let files = ws.split_chunks(d, "train")?;
    let rows = files.iter().map(|f| f.1).sum();
    let spans = spans_from_rows(files);
    check_spans(&spans, rows)?;
    Ok(spans)
}

/// The basis (`basis.npy`, R×D) of an svd run.
pub fn svd_basis_path(ws: &Workspace, svd_run: i64) -> Result<PathBuf> {
    Ok(svd_files(ws, svd_run)?.basis)
}

/// A training run's configuration and one of its checkpoints (the last by default),
/// verified against the catalog's checksum.
pub fn load_run_checkpoint(
    ws: &Workspace,
    run: i64,
    step: Option<u64>,
) -> Result<(TrainConfig, CheckpointRow, Checkpoint)> {
    let row = ws
        .catalog
        .run(run)?
        .with_context(|| format!("no run {run} in the catalog"))?;
    ensure!(
        row.stage == "train",
        "run {run} is a {} run, not train",
        row.stage
    );
    let config: TrainConfig = serde_json::from_value(row.params.clone())
        .with_context(|| format!("run {run}: unreadable configuration"))?;
    let ckpts = ws.catalog.checkpoints(run)?;
    let ckpt_row = match step {
        Some(step) => ckpts.iter().find(|c| c.step == step).with_context(|| {
            format!(
                "run {run} has no checkpoint at step {step} (it has: {})",
                ckpts
                    .iter()
                    .map(|c| c.step.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?,
        None => ckpts
            .last()
            .with_context(|| format!("run {run} has no checkpoint yet"))?,
    }
    .clone();
    let ckpt = load_checkpoint(ws, &ckpt_row)?;
    Ok((config, ckpt_row, ckpt))
}

/// Everything fixed for the duration of a run.
struct Setup {
    config: TrainConfig,
    kind: KernelKind,
    lik: BernoulliLogistic,
    source: Arc<Source>,
    spans: Vec<batches::ChunkSpan>,
    /// K_X̃ = X̃X̃ᵀ [R×R].
    k_tilde: Mat<f64>,
    n_labels: usize,
    n_rows: u64,
    a_init: PathBuf,
}

impl Setup {
    fn open(ws: &Workspace, config: TrainConfig) -> Result<Self> {
        let dataset = ws
            .catalog
            .dataset(&config.dataset)?
            .with_context(|| format!("no dataset '{}' in the workspace", config.dataset))?;
        ensure!(
            dataset.checksum == config.dataset_checksum,
            "dataset '{}' was re-ingested since this run started (checksum {} ≠ {})",
            dataset.name,
            dataset.checksum,
            config.dataset_checksum
        );
        let files = svd_files(ws, config.svd_run)?;
        let source = Source::open(&files.kxx, &files.sq_norms)?;
        let spans = train_spans(ws, &dataset)?;
        ensure!(
            source.n_rows as u64 == dataset.split("train").map_or(0, |s| s.n_rows),
            "kxx.npy of svd run {} holds {} rows, the train split {}",
            config.svd_run,
            source.n_rows,
            dataset.split("train").map_or(0, |s| s.n_rows)
        );
        ensure!(config.batch >= 1, "--batch must be at least 1");
        let k_tilde = basis_gram(&files.basis)?;
        Ok(Setup {
            kind: config.kernel.kind(),
            lik: BernoulliLogistic::new(config.quadrature)?,
            n_labels: dataset.n_labels as usize,
            n_rows: source.n_rows as u64,
            source: Arc::new(source),
            spans,
            k_tilde,
            a_init: files.a_init,
            config,
        })
    }

    fn planner(&self, order: Order) -> Planner {
        Planner {
            chunks: self.spans.clone(),
            batch: self.config.batch,
            order,
        }
    }

    fn shuffled(&self) -> Planner {
        self.planner(Order::Shuffled {
            seed: self.config.seed,
            window: self.config.shuffle_chunks,
        })
    }

    /// Counts of every label over the training rows (one pass over the label columns).
    fn label_counts(&self) -> Result<Vec<u64>> {
        let paths: Vec<PathBuf> = self.spans.iter().map(|s| s.path.clone()).collect();
        label_counts(&paths, self.n_labels)
    }

    fn initial_params(&self) -> Result<Params> {
        let a_init = NpyMap::open(&self.a_init)?;
        let lengthscale = match self.kind {
            KernelKind::Linear => 1.0,
            KernelKind::SquaredExponential => init::median_distance(
                self.source.kxx.view2::<f32>()?,
                self.source
                    .sq_norms
                    .view1::<f32>()?
                    .as_slice()
                    .context("sq_norms layout")?,
                1000,
                stream_seed(self.config.seed, streams::INIT, &[1]),
            ),
        };
        init::initial_params(&init::InitInputs {
            kind: self.kind,
            a_init: a_init.view2::<f32>()?,
            inducing: self.config.inducing,
            factors: self.config.factors,
            label_counts: &self.label_counts()?,
            n_rows: self.n_rows,
            lengthscale,
            seed: self.config.seed,
        })
    }
}

/// K_X̃ = X̃X̃ᵀ [R×R] from `basis.npy` [R×D], accumulated over blocks of columns so the
/// f64 copy never exceeds a few tens of MiB whatever D is.
pub fn basis_gram(path: &Path) -> Result<Mat<f64>> {
    let map = NpyMap::open(path)?;
    let basis = map.view2::<f32>()?;
    let (r, d) = basis.dim();
    let block = (4 << 20) / r.max(1);
    let mut gram = Mat::<f64>::zeros(r, r);
    let mut start = 0;
    while start < d {
        let end = (start + block.max(1)).min(d);
        let x = Mat::<f64>::from_fn(r, end - start, |i, j| basis[(i, start + j)] as f64);
        gram += &x * x.transpose();
        start = end;
    }
    Ok(gram)
}

fn progress_bar(total: u64, done: u64) -> ProgressBar {
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template(
            "train {bar:30} {pos}/{len} steps {per_sec} {elapsed_precise} {msg}",
        )
        .expect("valid template"),
    );
    pb.set_position(done);
    pb
}

/// Prints a line above the progress bar (or plainly when it is hidden).
fn log(pb: &ProgressBar, msg: &str) {
    pb.suspend(|| eprintln!("{msg}"));
}

/// Writes a checkpoint into the run's directory (temp file, fsync, rename) and registers it.
fn save_checkpoint(
    ws: &Workspace,
    run: &StageRun<'_>,
    out_rel: &str,
    ckpt: &Checkpoint,
) -> Result<()> {
    let name = format!("ckpt-{:09}.parquet", ckpt.state.step);
    let tmp = run.tmp_dir().join(&name);
    let written = write_checkpoint(&tmp, ckpt)?;
    failpoint("checkpoint-written", ckpt.state.step);
    let dir = ws.resolve(out_rel);
    fs::rename(&tmp, dir.join(&name))
        .with_context(|| format!("moving checkpoint into {}", dir.display()))?;
    fs::File::open(&dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing {}", dir.display()))?;
    failpoint("checkpoint-renamed", ckpt.state.step);
    ws.catalog.commit_checkpoint(&CheckpointRow {
        run_id: run.id,
        step: ckpt.state.step,
        epoch: ckpt.state.epoch,
        path: format!("{out_rel}/{name}"),
        bytes: written.bytes,
        checksum: written.checksum,
    })
}

/// Crash injection for the kill/resume tests: `FSGP_FAILPOINT=NAME:STEP` aborts the process
/// (as a crash would) when the named point is reached at that step.
fn failpoint(name: &str, step: u64) {
    if let Ok(spec) = std::env::var("FSGP_FAILPOINT") {
        if spec == format!("{name}:{step}") {
            eprintln!("failpoint {spec}: aborting");
            std::process::abort();
        }
    }
}

/// Reads a registered checkpoint, verifying its checksum against the catalog.
fn load_checkpoint(ws: &Workspace, row: &CheckpointRow) -> Result<Checkpoint> {
    let path = ws.resolve(&row.path);
    let found = checksum_file(&path)?;
    ensure!(
        found.checksum == row.checksum,
        "{}: checksum {} differs from the catalog's {} (file changed or damaged)",
        path.display(),
        found.checksum,
        row.checksum
    );
    read_checkpoint(&path)
}

fn all_finite(value: f64, grads: &Params) -> bool {
    value.is_finite() && params_finite(grads)
}

/// Whether every entry of every block is finite.
fn params_finite(p: &Params) -> bool {
    let mat_ok =
        |m: &faer::Mat<f64>| (0..m.ncols()).all(|j| m.col(j).iter().all(|v| v.is_finite()));
    [&p.a, &p.mu, &p.rho, &p.phi].into_iter().all(mat_ok)
        && p.bias.iter().all(|v| v.is_finite())
        && p.kernel.log_sf2.is_finite()
        && p.kernel.log_ell.is_finite()
}

/// Runs `pipeline train`.
pub fn run(workspace: &Path, args: &TrainArgs) -> Result<TrainOutcome> {
    let ws = Workspace::open(workspace)?;
    if let Some(id) = args.resume {
        return resume(&ws, id, args);
    }
    let name = args.dataset.as_deref().context("--dataset is required")?;
    let dataset = ws.catalog.dataset(name)?.with_context(|| {
        format!(
            "no dataset '{name}' in {}; run `pipeline ingest` first",
            workspace.display()
        )
    })?;
    let svd_run = match args.svd {
        Some(id) => id,
        None => newest_svd_run(&ws, &dataset)?,
    };
    let a_rows = NpyMap::open(&svd_files(&ws, svd_run)?.a_init)?
        .view2::<f32>()?
        .nrows();
    let config = TrainConfig {
        dataset: dataset.name.clone(),
        dataset_checksum: dataset.checksum.clone(),
        svd_run,
        kernel: args.kernel,
        inducing: args.inducing.unwrap_or(a_rows),
        factors: args.factors,
        batch: args.batch,
        epochs: args.epochs,
        lr: args.lr,
        beta1: args.beta1,
        beta2: args.beta2,
        eps: AdamConfig::default().eps,
        negatives: args.negatives,
        quadrature: args.quadrature,
        seed: args.seed,
        threads: args
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get())),
        freeze_a: args.freeze_a,
        freeze_hyper: args.freeze_hyper,
        shuffle_chunks: args.shuffle_chunks,
        checkpoint_every: args.checkpoint_every,
        max_steps: args.max_steps,
    };
    ensure!(
        config.checkpoint_every >= 1,
        "--checkpoint-every must be ≥ 1"
    );
    ensure!(config.max_steps != Some(0), "--max-steps must be ≥ 1");
    if let Some(done) = ws.catalog.find_ok_run("train", &config.to_json())? {
        eprintln!(
            "training of '{}' with these parameters is already done (run {}); nothing to do",
            config.dataset, done.id
        );
        let last = ws
            .catalog
            .checkpoints(done.id)?
            .last()
            .map_or(0, |c| c.step);
        return Ok(TrainOutcome {
            run_id: done.id,
            computed: false,
            final_step: last,
            exact_elbo: None,
        });
    }
    if !args.fresh {
        let interrupted =
            ws.catalog
                .find_run_with_status("train", &config.to_json(), "interrupted")?;
        if let Some(prev) = interrupted {
            eprintln!(
                "run {} with these parameters was interrupted; resuming it (--fresh starts over)",
                prev.id
            );
            return resume(&ws, prev.id, args);
        }
    }
    let setup = Setup::open(&ws, config)?;
    let run = ws.start_run("train", &setup.config.to_json())?;
    let out_rel = run.output_rel(
        "train",
        &format!("{}-{}", setup.config.dataset, setup.config.kernel.name()),
    );
    let result = (|| {
        fs::create_dir_all(ws.resolve(&out_rel))?;
        let params = setup.initial_params()?;
        let start = Checkpoint {
            adam: AdamState::new(&params),
            params,
            state: TrainState {
                step: 0,
                epoch: 0,
                batch_in_epoch: 0,
                epoch_elbo_sum: 0.0,
            },
            config: setup.config.to_json(),
        };
        let opts = LoopOptions::new(&ws, &setup, args)?;
        train_loop(&ws, &run, &out_rel, &setup, start, &opts)
    })();
    finish(run, result)
}

fn finish(run: StageRun<'_>, result: Result<TrainOutcome>) -> Result<TrainOutcome> {
    match result {
        Ok(outcome) => {
            run.finish_ok()?;
            Ok(outcome)
        }
        Err(e) => {
            run.failed(&e);
            Err(e)
        }
    }
}

fn resume(ws: &Workspace, id: i64, args: &TrainArgs) -> Result<TrainOutcome> {
    let row = ws
        .catalog
        .run(id)?
        .with_context(|| format!("no run {id} in the catalog"))?;
    ensure!(
        row.stage == "train",
        "run {id} is a {} run, not train",
        row.stage
    );
    let config: TrainConfig = serde_json::from_value(row.params.clone())
        .with_context(|| format!("run {id}: unreadable configuration"))?;
    let setup = Setup::open(ws, config)?;
    let run = ws.resume_run(id)?;
    let out_rel = run.output_rel(
        "train",
        &format!("{}-{}", setup.config.dataset, setup.config.kernel.name()),
    );
    let result = (|| {
        fs::create_dir_all(ws.resolve(&out_rel))?;
        let start = match ws.catalog.checkpoints(id)?.last() {
            Some(row) => {
                let c = load_checkpoint(ws, row)?;
                ensure!(
                    c.config == setup.config.to_json(),
                    "{}: configuration differs from run {id}'s",
                    row.path
                );
                eprintln!(
                    "resuming run {id} from step {} (epoch {})",
                    c.state.step, c.state.epoch
                );
                c
            }
            None => {
                eprintln!("run {id} wrote no checkpoint; starting it from the beginning");
                let params = setup.initial_params()?;
                Checkpoint {
                    adam: AdamState::new(&params),
                    params,
                    state: TrainState {
                        step: 0,
                        epoch: 0,
                        batch_in_epoch: 0,
                        epoch_elbo_sum: 0.0,
                    },
                    config: setup.config.to_json(),
                }
            }
        };
        let opts = LoopOptions::new(ws, &setup, args)?;
        train_loop(ws, &run, &out_rel, &setup, start, &opts)
    })();
    finish(run, result)
}

fn thread_pool(threads: usize) -> Result<rayon::ThreadPool> {
    // faer's own parallel kernels run on the same pool size; results are reproducible
    // for a fixed count.
    faer::set_global_parallelism(if threads > 1 {
        faer::Par::rayon(threads)
    } else {
        faer::Par::Seq
    });
    Ok(rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?)
}

/// The optimisation loop from `ckpt` to the configured number of epochs, or to step
/// `max_steps` if that comes first. A run cut short inside an epoch ends that epoch as the
/// last epoch of a run ends: its figures (over the steps it ran), the held-out evaluation,
/// a checkpoint at the final step (whose state is the position inside that epoch), and the
/// exact bound.
fn train_loop(
    ws: &Workspace,
    run: &StageRun<'_>,
    out_rel: &str,
    setup: &Setup,
    ckpt: Checkpoint,
    opts: &LoopOptions,
) -> Result<TrainOutcome> {
    let cfg = &setup.config;
    let pool = thread_pool(cfg.threads)?;
    let Checkpoint {
        mut params,
        mut adam,
        mut state,
        ..
    } = ckpt;
    let planner = Arc::new(setup.shuffled());
    let epoch_steps: u64 = (0..cfg.epochs).map(|e| planner.batches_in_epoch(e)).sum();
    let total = cfg.max_steps.map_or(epoch_steps, |s| s.min(epoch_steps));
    let pb = progress_bar(total, state.step);
    let mut queue = Prefetcher::spawn(
        setup.source.clone(),
        planner.clone(),
        Span {
            epoch: state.epoch,
            skip: state.batch_in_epoch,
            end_epoch: cfg.epochs,
            max_batches: total.saturating_sub(state.step),
        },
        opts.prefetch,
    );
    let adam_cfg = cfg.adam();
    let scratch = Scratch::new();
    let scale = setup.n_rows as f64;
    let mut last_saved = state.step;
    let started = Instant::now();
    let mut epoch_started = Instant::now();
    let mut epoch_wait = Duration::ZERO;
    let mut max_jitter_logged = 0.0f64;
    while let Some(batch) = queue.next_batch() {
        let wait_before = queue.waited();
        let batch = batch?;
        ensure!(
            batch.epoch == state.epoch && batch.index == state.batch_in_epoch,
            "internal: minibatch {}/{} arrived, expected {}/{}",
            batch.epoch,
            batch.index,
            state.epoch,
            state.batch_in_epoch
        );
        let b = batch.rows.len() as f64;
        let sampled = match cfg.negatives {
            Negatives::All => None,
            Negatives::Sample(count) => {
                let mut rng = ChaCha8Rng::seed_from_u64(stream_seed(
                    cfg.seed,
                    streams::NEGATIVES,
                    &[state.step],
                ));
                Some(terms_sampled(
                    &batch.positives,
                    setup.n_labels,
                    count,
                    scale / b,
                    &mut rng,
                ))
            }
        };
        let terms = match &sampled {
            None => TermSet::AllLabels {
                positives: &batch.positives,
                scale: scale / b,
            },
            Some(list) => TermSet::List(list),
        };
        // Without trainable A or kernel hyperparameters their gradients are not needed
        // (the linear kernel's log ℓ is always frozen; its log σ_f² follows freeze_hyper).
        let eval_opts = EvalOptions {
            kernel_grads: !(cfg.freeze_a && cfg.freeze_hyper),
            ..EvalOptions::default()
        };
        let x = BasisInputs {
            kxx_b: batch.kxx.as_ref(),
            sq_norms: &batch.sq_norms,
            k_tilde: setup.k_tilde.as_ref(),
        };
        let ev = pool
            .install(|| {
                evaluate_set(
                    setup.kind, &params, &x, &terms, &setup.lik, &eval_opts, &scratch,
                )
            })
            .with_context(|| {
                format!(
                    "step {} (epoch {}): training stopped; the last good checkpoint is step \
                     {last_saved} (if the parameters diverged, resume with a smaller --lr)",
                    state.step + 1,
                    state.epoch + 1
                )
            })?;
        if !all_finite(ev.value, &ev.grads) {
            bail!(
                "step {} (epoch {}): the bound or its gradient is not finite (NaN or inf); \
                 training stopped; the last good checkpoint is step {last_saved} (resume \
                 with a smaller --lr or inspect it with `pipeline elbo`)",
                state.step + 1,
                state.epoch + 1
            );
        }
        if ev.jitter > max_jitter_logged {
            max_jitter_logged = ev.jitter;
            log(
                &pb,
                &format!(
                    "step {}: Cholesky of K_Z + Σ failed; retried with {:.3e} added to the \
                     diagonal",
                    state.step + 1,
                    ev.jitter
                ),
            );
        }
        adam.step(&adam_cfg, &mut params, &ev.grads, &|blk| cfg.frozen(blk));
        if !params_finite(&params) {
            bail!(
                "step {} (epoch {}): the Adam update made a parameter infinite or NaN; \
                 training stopped; the last good checkpoint is step {last_saved} (resume with a \
                 smaller --lr)",
                state.step + 1,
                state.epoch + 1
            );
        }
        state.step += 1;
        state.batch_in_epoch += 1;
        state.epoch_elbo_sum += ev.value;
        epoch_wait += queue.waited() - wait_before;
        pb.set_position(state.step);
        pb.set_message(format!(
            "epoch {}/{} ELBO≈{:.4e}",
            state.epoch + 1,
            cfg.epochs,
            ev.value
        ));
        // The step that reaches `total` ends the run; one inside an epoch (--max-steps)
        // closes that epoch early, over the steps it ran.
        let run_ends = state.step == total;
        if batch.last_in_epoch || run_ends {
            let secs = epoch_started.elapsed().as_secs_f64();
            let mean = state.epoch_elbo_sum / state.batch_in_epoch as f64;
            let epoch_no = (state.epoch + 1) as i64;
            let wait_fraction = epoch_wait.as_secs_f64() / secs.max(1e-9);
            ws.catalog.record_metrics(
                run.id,
                &[
                    metric("epoch_elbo", mean, Some(epoch_no)),
                    metric("epoch_seconds", secs, Some(epoch_no)),
                    metric("epoch_queue_wait", wait_fraction, Some(epoch_no)),
                ],
            )?;
            let cut = if batch.last_in_epoch {
                String::new()
            } else {
                format!(
                    " (stopped by --max-steps after {} of {} minibatches)",
                    state.batch_in_epoch,
                    planner.batches_in_epoch(state.epoch)
                )
            };
            log(
                &pb,
                &format!(
                    "epoch {epoch_no}/{}: mean minibatch ELBO {mean:.6e}, {secs:.1} s, \
                     queue wait {:.1} %{cut}",
                    cfg.epochs,
                    100.0 * wait_fraction
                ),
            );
            if let Some(h) = &opts.held_out {
                if epoch_no as u64 % h.every == 0 || run_ends {
                    let t = Instant::now();
                    let m = pool.install(|| h.evaluate(setup, &params))?;
                    ws.catalog.record_metrics(
                        run.id,
                        &crate::evaluate::metric_rows(&m, Some(epoch_no), &h.split),
                    )?;
                    log(
                        &pb,
                        &format!(
                            "epoch {epoch_no}: '{}' P@1 {:.2} P@3 {:.2} P@5 {:.2} PSP@5 {:.2} \
                             ({:.1} s)",
                            h.split,
                            100.0 * m.p_at[0],
                            100.0 * m.p_at[2],
                            100.0 * m.p_at[4],
                            100.0 * m.psp_at[4],
                            t.elapsed().as_secs_f64()
                        ),
                    );
                }
            }
            if batch.last_in_epoch {
                // A cut-short epoch keeps its position, so the final checkpoint's state
                // equals that of a longer run at the same step.
                state.epoch += 1;
                state.batch_in_epoch = 0;
                state.epoch_elbo_sum = 0.0;
            }
            epoch_started = Instant::now();
            epoch_wait = Duration::ZERO;
        }
        if state.step % cfg.checkpoint_every == 0 {
            save(ws, run, out_rel, &params, &adam, state, cfg)?;
            last_saved = state.step;
        }
    }
    drop(queue);
    if last_saved != state.step || state.step == 0 {
        save(ws, run, out_rel, &params, &adam, state, cfg)?;
    }
    pb.finish_and_clear();
    let secs = started.elapsed().as_secs_f64();
    let mut figures = vec![metric("train_seconds", secs, Some(state.step as i64))];
    let exact = if opts.final_elbo {
        let t = Instant::now();
        let value = pool.install(|| exact_bound(setup, &params, 4, &scratch))?;
        eprintln!(
            "exact bound on all {} training rows and {} labels: {value:.6e} ({:.1} s)",
            setup.n_rows,
            setup.n_labels,
            t.elapsed().as_secs_f64()
        );
        figures.push(MetricRow {
            name: "elbo_exact".into(),
            value,
            step: Some(state.step as i64),
            split: Some("train".into()),
        });
        Some(value)
    } else {
        None
    };
    ws.catalog.record_metrics(run.id, &figures)?;
    eprintln!(
        "trained run {}: {} steps in {secs:.1} s; checkpoints in {}",
        run.id,
        state.step,
        ws.resolve(out_rel).display()
    );
    Ok(TrainOutcome {
        run_id: run.id,
        computed: true,
        final_step: state.step,
        exact_elbo: exact,
    })
}

fn metric(name: &str, value: f64, step: Option<i64>) -> MetricRow {
    MetricRow {
        name: name.into(),
        value,
        step,
        split: None,
    }
}

#[allow(clippy::too_many_arguments)]
fn save(
    ws: &Workspace,
    run: &StageRun<'_>,
    out_rel: &str,
    params: &Params,
    adam: &AdamState,
    state: TrainState,
    cfg: &TrainConfig,
) -> Result<()> {
    save_checkpoint(
        ws,
        run,
        out_rel,
        &Checkpoint {
            params: params.clone(),
            adam: adam.clone(),
            state,
            config: cfg.to_json(),
        },
    )
}

/// The exact bound on the whole training split: every row, every label (weight 1), minus
/// Σ_p KL_p. Streams the rows in file order through the prefetch queue; each batch costs
/// only the forward pass, and the KL is computed once.
fn exact_bound(setup: &Setup, params: &Params, prefetch: usize, scratch: &Scratch) -> Result<f64> {
    let planner = Arc::new(setup.planner(Order::Sequential));
    let mut queue = Prefetcher::spawn(
        setup.source.clone(),
        planner,
        Span {
            epoch: 0,
            skip: 0,
            end_epoch: 1,
            max_batches: u64::MAX,
        },
        prefetch,
    );
    let mut expected = 0.0;
    while let Some(batch) = queue.next_batch() {
        let batch = batch?;
        let x = BasisInputs {
            kxx_b: batch.kxx.as_ref(),
            sq_norms: &batch.sq_norms,
            k_tilde: setup.k_tilde.as_ref(),
        };
        let terms = TermSet::AllLabels {
            positives: &batch.positives,
            scale: 1.0,
        };
        expected += expected_loglik(setup.kind, params, &x, &terms, &setup.lik, scratch)?;
    }
    let kl = kl_total(setup.kind, params, setup.k_tilde.as_ref(), scratch)?;
    Ok(expected - kl)
}

/// Arguments of `pipeline elbo`.
#[derive(clap::Args, Debug, Clone)]
pub struct ElboArgs {
    /// Training run.
    #[arg(long)]
    pub run: i64,
    /// Checkpoint step (default: the run's last checkpoint).
    #[arg(long)]
    pub checkpoint: Option<u64>,
    /// Split whose bound is computed (only the training split has K_XX̃ factors).
    #[arg(long, default_value = "train")]
    pub split: String,
    #[arg(long)]
    pub threads: Option<usize>,
}

/// Runs `pipeline elbo`: the exact full-data bound of a checkpoint, recorded as a metric of
/// the training run.
pub fn elbo(workspace: &Path, args: &ElboArgs) -> Result<f64> {
    let ws = Workspace::open(workspace)?;
    ensure!(
        args.split == "train",
        "--split {}: only the training split has K_XX̃ factors (the bound is defined on the \
         data the model was fitted to)",
        args.split
    );
    let (config, ckpt_row, ckpt) = load_run_checkpoint(&ws, args.run, args.checkpoint)?;
    let setup = Setup::open(&ws, config)?;
    let threads = args.threads.unwrap_or(setup.config.threads);
    let pool = thread_pool(threads)?;
    let t = Instant::now();
    let value = pool.install(|| exact_bound(&setup, &ckpt.params, 4, &Scratch::new()))?;
    ws.catalog.record_metrics(
        args.run,
        &[MetricRow {
            name: "elbo_exact".into(),
            value,
            step: Some(ckpt_row.step as i64),
            split: Some("train".into()),
        }],
    )?;
    println!(
        "run {} step {}: exact bound {value:.10e} on {} rows × {} labels ({:.1} s)",
        args.run,
        ckpt_row.step,
        setup.n_rows,
        setup.n_labels,
        t.elapsed().as_secs_f64()
    );
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(max_steps: Option<u64>) -> TrainConfig {
        TrainConfig {
            dataset: "toy".into(),
            dataset_checksum: "0123".into(),
            svd_run: 2,
            kernel: KernelArg::Linear,
            inducing: 16,
            factors: 3,
            batch: 64,
            epochs: 6,
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            negatives: Negatives::Sample(5),
            quadrature: 20,
            seed: 11,
            threads: 2,
            freeze_a: false,
            freeze_hyper: false,
            shuffle_chunks: 2,
            checkpoint_every: 7,
            max_steps,
        }
    }

    #[test]
    fn configurations_without_max_steps_read_and_compare_as_before() {
        // Without a limit the field is left out, so the JSON is what it was before
        // --max-steps existed (catalog lookups compare it as text).
        let json = config(None).to_json();
        assert!(json.get("max_steps").is_none(), "{json}");
        // Configurations written before the option existed read as "no limit".
        let old: TrainConfig = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(old, config(None));
        assert_eq!(old.to_json().to_string(), json.to_string());
        // A limit is stored and read back.
        let limited = config(Some(21)).to_json();
        assert_eq!(limited["max_steps"], 21);
        let back: TrainConfig = serde_json::from_value(limited).unwrap();
        assert_eq!(back.max_steps, Some(21));
    }
}
