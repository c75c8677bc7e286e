//! The step loop: minibatches from the prefetch queue → the bound and its gradient →
//! Adam, with per-epoch figures, held-out ranking, early stopping's validation scores and
//! checkpoints on the way, and the exact bound at the end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::batches::{stream_seed, streams, Batch, Planner, Prefetcher, Share, Span};
use super::checkpoints::{prune_checkpoints, save_checkpoint};
use super::classes::{class_ids, noise_seed};
use super::early;
use super::exact::exact_bound;
use super::held_out::HeldOut;
use super::ranks;
use super::setup::{steps_before, thread_pool, Setup};
use crate::comm::Comm;
use crate::failpoint;
use crate::metrics::metric_rows;
use crate::metrics::names::Figure;
use crate::model::bound::objective::{
    bound_and_grads, bound_and_grads_feature_ard, BoundAndGrads, BoundOptions,
};
use crate::model::bound::terms::{terms_sampled, terms_stratified_rest, Term, TermSet};
use crate::model::kernel::feature_ard::FeatureInputs;
use crate::model::kernel::BasisInputs;
use crate::model::likelihood::multiclass::Classes;
use crate::model::natgrad::natural_step;
use crate::model::optim::AdamState;
use crate::model::params::{Block, Params, QParams};
use crate::model::scratch::Scratch;
use crate::progress::{CutReason, EpochCut, EpochFigures, Progress, Scores, Validation};
use crate::stage::StageRun;
use crate::stop::StoppedOnRequest;
use crate::store::catalog::{MetricRow, Split};
use crate::store::checkpoint::{Checkpoint, CheckpointRef, TrainState};
use crate::store::workspace::Workspace;
use crate::trained::{
    BestEvaluation, EarlyStopping, KernelChoice, LatentChoice, Negatives, Retention, StopMetric,
    StopReason, Stopped, Task, TrainConfig,
};

/// How a training loop runs, beyond the configuration that fixes its numbers.
pub struct LoopOptions {
    pub final_elbo: bool,
    pub prefetch: usize,
    pub held_out: Option<HeldOut>,
    /// The validation split early stopping scores (the writing process of a run with
    /// `--early-stopping`; None elsewhere).
    pub validation: Option<HeldOut>,
    /// Which checkpoints stay on disk.
    pub keep: Retention,
}

/// The processes a training loop runs on and which of them writes: one process (the
/// writer), or the ranks of an MPI job, of which rank 0 holds the stage run and writes the
/// checkpoints and the catalog rows, and the others write nothing.
pub struct Job<'a> {
    pub comm: &'a dyn Comm,
    /// The run, on the process that writes (None on the other ranks).
    pub run: Option<&'a StageRun<'a>>,
}

/// What a finished (or found finished) training run reports.
#[derive(Debug, Clone)]
pub struct TrainSummary {
    pub final_step: u64,
    /// The exact full-data bound at the end, when it was computed now.
    pub exact_elbo: Option<f64>,
    /// How the run ended (the writing process; None on the other ranks).
    pub stopped: Option<Stopped>,
}

/// What early stopping's evaluation after a step decided.
#[derive(Debug, Clone, Copy, Default)]
struct Verdict {
    /// The score is the best so far: the step's checkpoint is written and marked best.
    improved: bool,
    /// `--patience` evaluations in a row have not improved: the run ends at this step.
    stop: bool,
}

/// Whether a parameter block stays at its initial value for the whole run.
fn frozen(cfg: &TrainConfig, block: Block) -> bool {
    (cfg.freeze_a && block == Block::A)
        || (cfg.freeze_hyper && block.is_kernel_hyper())
        // ℓ means nothing to the linear kernel; keep it fixed rather than drifting.
        || (cfg.kernel == KernelChoice::Linear && block == Block::LogEll)
        // Independent GPs: Φ = I is the model, not a starting point.
        || (cfg.latent == LatentChoice::Independent && block == Block::Phi)
}

/// `--release-hyper-after E0`: the kernel hyperparameters are frozen in epochs 0..E0 and
/// trained from the first step of epoch E0 on, with Adam's bias corrections counted from
/// that step (`docs/model.md`, "Optimiser").
#[derive(Debug, Clone, Copy)]
struct Release {
    epoch: u64,
    /// Optimiser steps before epoch E0 (the global step count at release).
    step: u64,
}

impl Release {
    fn of(cfg: &TrainConfig, planner: &Planner) -> Result<Option<Release>> {
        cfg.release_hyper_after
            .map(|epoch| {
                Ok(Release {
                    epoch,
                    step: steps_before(planner, epoch, u64::MAX)?,
                })
            })
            .transpose()
    }
}

/// Whether `block` is trained by a step in `epoch`, and since which step: None while it
/// stays at its value, Some(t₀) when trained since global step t₀ (0: from the start).
fn trained_since(
    cfg: &TrainConfig,
    release: Option<Release>,
    block: Block,
    epoch: u64,
) -> Option<u64> {
    if frozen(cfg, block) {
        return None;
    }
    match release {
        Some(r) if block.is_kernel_hyper() => (epoch >= r.epoch).then_some(r.step),
        _ => Some(0),
    }
}

fn metric(figure: Figure, value: f64, step: Option<i64>) -> MetricRow {
    MetricRow {
        name: figure.name().into(),
        value,
        step,
        split: None,
    }
}

/// Whether every entry of every block is finite.
fn params_finite(p: &Params) -> bool {
    let mat_ok =
        |m: &faer::Mat<f64>| (0..m.ncols()).all(|j| m.col(j).iter().all(|v| v.is_finite()));
    let q_ok = match &p.q {
        QParams::Sites { mu, rho } => mat_ok(mu) && mat_ok(rho),
        QParams::Full { mu, chol } => mat_ok(mu) && mat_ok(&chol.packed),
    };
    [&p.a, &p.phi].into_iter().all(mat_ok)
        && q_ok
        && p.bias.iter().all(|v| v.is_finite())
        && p.kernel.is_finite()
}

/// One training run's loop state: the parameters, the optimiser and where it stands.
struct Trainer<'a> {
    ws: &'a Workspace,
    job: Job<'a>,
    out_rel: &'a str,
    setup: &'a Setup,
    opts: &'a LoopOptions,
    pool: rayon::ThreadPool,
    /// The run's progress: its steps, epochs and scores (emitted by the writing process).
    progress: Progress,
    planner: Arc<Planner>,
    /// The steps of the budget (`--epochs` or `--steps`), whatever `--max-steps` cuts.
    budget: u64,
    /// When the kernel hyperparameters are released (`--release-hyper-after`).
    release: Option<Release>,
    params: Params,
    adam: AdamState,
    /// Buffers recycled across steps (and by the exact bound at the end).
    scratch: Scratch,
    state: TrainState,
    /// The step of the last checkpoint written.
    last_saved: u64,
    epoch_started: Instant,
    epoch_wait: Duration,
    max_jitter_logged: f64,
    /// Time inside the gradient all-reduce (MPI ranks only).
    reduce_time: Duration,
    /// The labels every row's bound holds exactly with `--frequent-negatives` (sorted ids;
    /// empty without it).
    frequent: Vec<u32>,
}

/// The optimisation loop from `ckpt` to the end of the budget (`--epochs`, or `--steps`),
/// to step `max_steps` if that comes first, or to the step where early stopping runs out of
/// patience. A run cut short inside an epoch ends that epoch as the last epoch of a run
/// ends: its figures (over the steps it ran), the held-out evaluation, a checkpoint at the
/// final step (whose state is the position inside that epoch), and the exact bound.
pub fn train_loop(
    ws: &Workspace,
    job: Job<'_>,
    out_rel: &str,
    setup: &Setup,
    ckpt: Checkpoint,
    opts: &LoopOptions,
) -> Result<TrainSummary> {
    let cfg = &setup.config;
    // Every step allocates the same buffers again: keep them in the heap.
    crate::alloc::for_recurring_steps();
    let planner = Arc::new(setup.shuffled());
    let total = setup.total_steps(&planner)?;
    let budget = setup.budget_steps(&planner)?;
    // A run that stopped early and was killed before it was marked finished takes no
    // further step.
    let stopped_early = early::exhausted(cfg, ckpt.state.early);
    let share = Share {
        rank: job.comm.rank(),
        ranks: job.comm.size(),
    };
    let progress = match job.run {
        Some(run) => Progress::start(
            "train",
            format!("run {}", run.id),
            Some(total),
            "steps",
            ckpt.state.step,
        ),
        None => Progress::silent(),
    };
    let mut t = Trainer {
        ws,
        job,
        out_rel,
        setup,
        opts,
        pool: thread_pool(cfg.threads)?,
        progress,
        release: Release::of(cfg, &planner)?,
        planner,
        budget,
        last_saved: ckpt.state.step,
        params: ckpt.params,
        adam: ckpt.adam,
        scratch: Scratch::new(),
        state: ckpt.state,
        epoch_started: Instant::now(),
        epoch_wait: Duration::ZERO,
        max_jitter_logged: 0.0,
        reduce_time: Duration::ZERO,
        frequent: setup.frequent_labels()?,
    };
    let started = Instant::now();
    // Every rank starts from the same state (the same checkpoint, or the same seeded
    // initialisation).
    t.check_ranks()?;
    let mut queue = Prefetcher::spawn_share(
        setup.source.clone(),
        t.planner.clone(),
        Span {
            epoch: t.state.epoch,
            skip: t.state.batch_in_epoch,
            end_epoch: cfg.epochs,
            max_batches: match stopped_early {
                true => 0,
                false => total.saturating_sub(t.state.step),
            },
        },
        share,
        opts.prefetch,
    );
    while let Some(batch) = queue.next_batch() {
        let wait_before = queue.waited();
        let batch = batch?;
        t.step(&batch)?;
        t.epoch_wait += queue.waited() - wait_before;
        // Early stopping scores the parameters of this step before its epoch closes and its
        // checkpoint is written, so that checkpoint holds the score.
        let verdict = t.early_stopping()?;
        // The step that reaches `total` ends the run, as does one after which early
        // stopping runs out of patience; one inside an epoch closes that epoch early, over
        // the steps it ran.
        let run_ends = t.state.step == total || verdict.stop;
        if batch.last_in_epoch || run_ends {
            t.end_epoch(batch.last_in_epoch, run_ends)?;
        }
        let saving = t.state.step % cfg.checkpoint_every == 0 || verdict.improved;
        if saving || t.state.step % ranks::CHECK_EVERY == 0 {
            t.check_ranks()?;
        }
        if saving {
            t.save(verdict.improved)?;
        }
        let rank = t.job.comm.rank();
        failpoint::kill_at(&format!("train-rank{rank}-step"), t.state.step);
        failpoint::interrupt_at("train-ctrl-c", t.state.step, 1);
        failpoint::interrupt_at("train-ctrl-c-twice", t.state.step, 2);
        if verdict.stop {
            break;
        }
        if !run_ends {
            t.stop_if_asked()?;
        }
    }
    drop(queue);
    if t.last_saved != t.state.step || t.state.step == 0 {
        t.check_ranks()?;
        t.save(false)?;
    }
    t.finish(started.elapsed().as_secs_f64())
}

impl Trainer<'_> {
    /// Honours a stop request (`crate::stop`) between steps: writes a checkpoint at this
    /// step unless one is there, then ends the run with [`StoppedOnRequest`], so taking it up again
    /// loses no step and gives an uninterrupted run's bits. One process only: the ranks of
    /// an MPI job would have to agree on the step, and `mpirun` ends its job on a signal by
    /// itself (the run then resumes from its last checkpoint).
    fn stop_if_asked(&mut self) -> Result<()> {
        let stop = self.ws.stop();
        if self.job.comm.size() > 1 || !stop.requested() {
            return Ok(());
        }
        if self.last_saved != self.state.step {
            self.check_ranks()?;
            self.save(false)?;
        }
        let (step, epoch) = (self.state.step, self.state.epoch + 1);
        let at = format!(
            "after step {step} (epoch {epoch}), checkpoint written at step {step}; the same \
             command takes the run up there"
        );
        Err(StoppedOnRequest { at }.into())
    }

    /// "step S (epoch E): training stopped; the last good checkpoint is …" context.
    fn stopped(&self) -> String {
        format!(
            "step {} (epoch {}): training stopped; the last good checkpoint is step {}",
            self.state.step + 1,
            self.state.epoch + 1,
            self.last_saved
        )
    }

    /// The positives plus `count` sampled negatives per row (reweighted), drawn from the
    /// step's own random stream, for the rows of `batch`; with frequent labels, only the
    /// terms of the other labels (the frequent ones are the bound's dense part,
    /// [`TermSet::Stratified`]). A share of a global minibatch
    /// (MPI ranks) draws for the rows before it too and keeps its own rows' terms, so the
    /// ranks' terms together are the one process's.
    fn sampled_terms(&self, batch: &Batch, count: usize, scale: f64) -> Vec<Term> {
        let cfg = &self.setup.config;
        let mut rng = ChaCha8Rng::seed_from_u64(stream_seed(
            cfg.seed,
            streams::NEGATIVES,
            &[self.state.step],
        ));
        let n_labels = self.setup.n_labels;
        let draw = |positives: &[Vec<u32>], rng: &mut ChaCha8Rng| match self.frequent.is_empty() {
            true => terms_sampled(positives, n_labels, count, scale, rng),
            false => terms_stratified_rest(positives, n_labels, &self.frequent, count, scale, rng),
        };
        if batch.first == 0 {
            return draw(&batch.positives, &mut rng);
        }
        let upto: Vec<Vec<u32>> = batch
            .lead_positives
            .iter()
            .chain(&batch.positives)
            .cloned()
            .collect();
        let first = batch.first as u32;
        let mut terms = draw(&upto, &mut rng);
        terms.retain(|t| t.row >= first);
        for t in &mut terms {
            t.row -= first;
        }
        terms
    }

    /// The bound and its gradient on `batch`: every label, or the positives plus sampled
    /// negatives, scaled by N/B with B the global minibatch's rows. Over K MPI ranks,
    /// `batch` is this rank's share and its terms are weighted K·N/B, so that this rank's
    /// evaluation is K·data_r − KL and the ranks' sum divided by K is the bound
    /// (`ranks::all_reduce`).
    fn bound_and_grads(&self, batch: &Batch) -> Result<BoundAndGrads> {
        let cfg = &self.setup.config;
        let scale = self.setup.n_rows as f64;
        let b = batch.global_len as f64;
        let mut weight = scale / b;
        let ranks = self.job.comm.size();
        if ranks > 1 {
            weight *= ranks as f64;
        }
        let sampled = match cfg.negatives {
            Negatives::All => None,
            Negatives::Sample(count) => Some(self.sampled_terms(batch, count, weight)),
        };
        let class_lik = self.setup.class_lik.as_deref();
        let class_ids = match class_lik {
            Some(_) => class_ids(&batch.positives, &batch.rows)?,
            None => Vec::new(),
        };
        let terms = match (&sampled, class_lik) {
            // A row's noise stream is its position in the global minibatch (a rank's share
            // starts at `batch.first`), so the K shares draw the one process's noise.
            (_, Some(lik)) => TermSet::Classes(Classes {
                class: &class_ids,
                scale: weight,
                lik,
                seed: noise_seed(cfg.seed, self.state.step),
                first_stream: batch.first as u64,
            }),
            (None, None) => TermSet::AllLabels {
                positives: &batch.positives,
                scale: weight,
            },
            (Some(list), None) if self.frequent.is_empty() => TermSet::List(list),
            (Some(rest), None) => TermSet::Stratified {
                frequent: &self.frequent,
                positives: &batch.positives,
                scale: weight,
                rest,
            },
        };
        // Without trainable A or kernel hyperparameters their gradients are not needed
        // (the linear kernel's log ℓ is always frozen; its log σ_f² follows freeze_hyper
        // and the release schedule).
        let hyper_frozen = trained_since(cfg, self.release, Block::LogSf2, batch.epoch).is_none();
        let eval_opts = BoundOptions {
            kernel_grads: !(cfg.freeze_a && hyper_frozen),
            ..BoundOptions::default()
        };
        let x = BasisInputs {
            kxx_b: self.setup.source.rows_of(batch),
            sq_norms: &batch.sq_norms,
            k_tilde: self.setup.k_tilde.as_ref(),
        };
        let (setup, params, scratch) = (self.setup, &self.params, &self.scratch);
        let features = match (&setup.feature_basis, &batch.features) {
            (Some(basis), Some(rows)) => Some(FeatureInputs {
                rows,
                basis: basis.as_ref(),
            }),
            _ => None,
        };
        self.pool
            .install(|| match &features {
                None => bound_and_grads(
                    setup.kind,
                    params,
                    &x,
                    &terms,
                    &*setup.lik,
                    &eval_opts,
                    scratch,
                ),
                Some(fx) => bound_and_grads_feature_ard(
                    setup.kind,
                    params,
                    fx,
                    &terms,
                    &*setup.lik,
                    &eval_opts,
                    scratch,
                ),
            })
            .with_context(|| {
                format!(
                    "{} (if the parameters diverged, resume with a smaller --lr)",
                    self.stopped()
                )
            })
    }

    /// One optimiser step on `batch`.
    fn step(&mut self, batch: &Batch) -> Result<()> {
        ensure!(
            batch.epoch == self.state.epoch && batch.index == self.state.batch_in_epoch,
            "internal: minibatch {}/{} arrived, expected {}/{}",
            batch.epoch,
            batch.index,
            self.state.epoch,
            self.state.batch_in_epoch
        );
        let mut ev = self.bound_and_grads(batch)?;
        if self.job.comm.size() > 1 {
            self.reduce_time += ranks::all_reduce(self.job.comm, &mut ev)?;
        }
        if !(ev.value.is_finite() && params_finite(&ev.grads)) {
            bail!(
                "{}: the bound or its gradient is not finite (NaN or inf); resume with a \
                 smaller --lr or inspect it with `pipeline elbo`",
                self.stopped()
            );
        }
        if ev.jitter > self.max_jitter_logged {
            self.max_jitter_logged = ev.jitter;
            self.progress.note(format!(
                "step {}: Cholesky of {} failed; retried with {:.3e} added to the diagonal",
                self.state.step + 1,
                self.setup.config.q_form.factorised(),
                ev.jitter
            ));
        }
        let (cfg, release, epoch) = (&self.setup.config, self.release, batch.epoch);
        let natural = cfg.natural_step_in(epoch);
        // With natural gradients q(u)'s blocks are stepped by `natural_step`, not by Adam
        // (their Adam moments stay zero).
        let by_natural =
            |blk: Block| natural.is_some() && matches!(blk, Block::Mu | Block::CholFactor);
        self.adam
            .step_scheduled(&cfg.adam(epoch), &mut self.params, &ev.grads, &|blk| {
                if by_natural(blk) {
                    return None;
                }
                trained_since(cfg, release, blk, epoch)
            });
        if let Some(gamma) = natural {
            if let Err(e) = natural_step(&mut self.params.q, &ev.grads.q, gamma) {
                return Err(e.context(self.stopped()));
            }
        }
        if !params_finite(&self.params) {
            bail!(
                "{}: the Adam update made a parameter infinite or NaN; resume with a smaller --lr",
                self.stopped()
            );
        }
        let elbo = ev.value;
        ev.recycle(&self.scratch);
        let rank = self.job.comm.rank();
        if failpoint::fires(&format!("train-perturb-rank{rank}"), self.state.step + 1) {
            // One bit of one parameter: the divergence check must see it.
            let x = &mut self.params.bias[0];
            *x = f64::from_bits(x.to_bits() ^ 1);
        }
        self.state.step += 1;
        self.state.batch_in_epoch += 1;
        self.state.epoch_elbo_sum += elbo;
        self.progress.set(self.state.step);
        Ok(())
    }

    /// Fails unless every rank holds this rank's parameters and optimiser state
    /// (`ranks::check_identical`); nothing in one process.
    fn check_ranks(&self) -> Result<()> {
        if self.job.comm.size() == 1 {
            return Ok(());
        }
        ranks::check_identical(self.job.comm, self.state.step, &self.params, &self.adam)
    }

    /// Records an epoch's figures (and the held-out metrics when due); a complete epoch
    /// moves the state to the next one. Only the writing process records and prints them
    /// (the figures are the all-reduced ones, the same on every rank).
    fn end_epoch(&mut self, complete: bool, run_ends: bool) -> Result<()> {
        let Some(run) = self.job.run else {
            self.next_epoch(complete);
            return Ok(());
        };
        let secs = self.epoch_started.elapsed().as_secs_f64();
        let mean = self.state.epoch_elbo_sum / self.state.batch_in_epoch as f64;
        let epoch_no = (self.state.epoch + 1) as i64;
        let wait_fraction = self.epoch_wait.as_secs_f64() / secs.max(1e-9);
        self.ws.catalog.record_metrics(
            run.id,
            &[
                metric(Figure::EpochElbo, mean, Some(epoch_no)),
                metric(Figure::EpochSeconds, secs, Some(epoch_no)),
                metric(Figure::EpochQueueWait, wait_fraction, Some(epoch_no)),
            ],
        )?;
        let cfg = &self.setup.config;
        let cut = (!complete).then(|| EpochCut {
            reason: if early::exhausted(cfg, self.state.early) {
                CutReason::StoppedEarly
            } else if self.state.step == self.budget && cfg.steps.is_some() {
                CutReason::Steps { steps: self.budget }
            } else {
                CutReason::MaxSteps
            },
            batches_done: self.state.batch_in_epoch,
            batches_in_epoch: self.planner.batches_in_epoch(self.state.epoch),
        });
        self.progress.epoch(EpochFigures {
            epoch: epoch_no as u64,
            epochs: cfg.epochs,
            mean_elbo: mean,
            seconds: secs,
            queue_wait: wait_fraction,
            cut,
        });
        if let Some(h) = &self.opts.held_out {
            if epoch_no as u64 % h.every == 0 || run_ends {
                self.evaluate_held_out(run, h, epoch_no)?;
            }
        }
        self.next_epoch(complete);
        Ok(())
    }

    /// A binary or multi-class run's held-out accuracy and mean negative log predictive
    /// probability, recorded as the metrics `accuracy` and `nlp` of the epoch on the split.
    fn evaluate_held_out_classes(
        &self,
        run: &StageRun<'_>,
        h: &HeldOut,
        epoch_no: i64,
    ) -> Result<()> {
        let t = Instant::now();
        let (setup, params) = (self.setup, &self.params);
        let f = self.pool.install(|| match &setup.class_lik {
            Some(lik) => h.multiclass_figures(setup, params, &**lik),
            None => h.binary_figures(setup, params),
        })?;
        let row = |figure: Figure, value: f64| MetricRow {
            split: Some(h.split),
            ..metric(figure, value, Some(epoch_no))
        };
        let rows = [row(Figure::Accuracy, f.accuracy), row(Figure::Nlp, f.nlp)];
        self.ws.catalog.record_metrics(run.id, &rows)?;
        self.progress.validation(Validation {
            split: h.split.to_string(),
            epoch: Some(epoch_no as u64),
            step: None,
            seconds: t.elapsed().as_secs_f64(),
            scores: Scores::Classes {
                accuracy: f.accuracy,
                nlp: f.nlp,
            },
        });
        Ok(())
    }

    /// The state after an epoch's end: a complete epoch moves it to the next one.
    fn next_epoch(&mut self, complete: bool) {
        if complete {
            // A cut-short epoch keeps its position, so the final checkpoint's state
            // equals that of a longer run at the same step.
            self.state.epoch += 1;
            self.state.batch_in_epoch = 0;
            self.state.epoch_elbo_sum = 0.0;
        }
        self.epoch_started = Instant::now();
        self.epoch_wait = Duration::ZERO;
    }

    fn evaluate_held_out(&self, run: &StageRun<'_>, h: &HeldOut, epoch_no: i64) -> Result<()> {
        if self.setup.config.task != Task::Multilabel {
            return self.evaluate_held_out_classes(run, h, epoch_no);
        }
        let t = Instant::now();
        let (setup, params) = (self.setup, &self.params);
        let m = self.pool.install(|| h.ranking_metrics(setup, params))?;
        self.ws
            .catalog
            .record_metrics(run.id, &metric_rows(&m, Some(epoch_no), Some(h.split)))?;
        self.progress.validation(Validation {
            split: h.split.to_string(),
            epoch: Some(epoch_no as u64),
            step: None,
            seconds: t.elapsed().as_secs_f64(),
            scores: Scores::Ranking {
                p_at_1: m.p_at[0],
                p_at_3: m.p_at[2],
                p_at_5: m.p_at[4],
                psp_at_5: m.psp_at[4],
            },
        });
        Ok(())
    }

    /// Writes and registers a checkpoint, as the run's best when `best` (the writing
    /// process only; the others note the step).
    fn save(&mut self, best: bool) -> Result<()> {
        let Some(run) = self.job.run else {
            self.last_saved = self.state.step;
            return Ok(());
        };
        let config = self.setup.config.to_json();
        save_checkpoint(
            self.ws,
            run,
            self.out_rel,
            CheckpointRef {
                params: &self.params,
                adam: &self.adam,
                state: &self.state,
                config: &config,
            },
            best,
        )?;
        self.last_saved = self.state.step;
        prune_checkpoints(self.ws, run, self.out_rel, self.opts.keep)
    }

    /// The run's closing figures: its time and, unless switched off, the exact bound
    /// (computed and recorded by the writing process alone).
    fn finish(self, secs: f64) -> Result<TrainSummary> {
        let step = self.state.step;
        if self.job.comm.size() > 1 {
            crate::progress::note(format!(
                "MPI rank {} of {}: gradient all-reduce {:.3} s of {secs:.3} s",
                self.job.comm.rank(),
                self.job.comm.size(),
                self.reduce_time.as_secs_f64()
            ));
        }
        let Some(run) = self.job.run else {
            return Ok(TrainSummary {
                final_step: step,
                exact_elbo: None,
                stopped: None,
            });
        };
        let stopped = self.how_it_ended();
        let mut figures = vec![metric(Figure::TrainSeconds, secs, Some(step as i64))];
        let exact = if self.opts.final_elbo {
            let t = Instant::now();
            let (setup, params, scratch) = (self.setup, &self.params, &self.scratch);
            let value = self
                .pool
                .install(|| exact_bound(setup, params, 4, scratch))?;
            self.progress.note(format!(
                "exact bound on all {} training rows and {} labels: {value:.6e} ({:.1} s)",
                self.setup.n_rows,
                self.setup.n_labels,
                t.elapsed().as_secs_f64()
            ));
            figures.push(MetricRow {
                split: Some(Split::Train),
                ..metric(Figure::ElboExact, value, Some(step as i64))
            });
            Some(value)
        } else {
            None
        };
        self.ws.catalog.record_metrics(run.id, &figures)?;
        self.progress.note(format!(
            "trained run {}: {step} steps in {secs:.1} s; checkpoints in {}",
            run.id,
            self.ws.resolve(self.out_rel).display()
        ));
        if let Some(best) = &stopped.best {
            self.progress.note(format!(
                "run {}: {}; the checkpoint of step {} scored best ({} {:.6} on 'validation') \
                 and is the one predict reads by default",
                run.id,
                match stopped.reason {
                    StopReason::NoImprovement => format!(
                        "stopped early at step {step}: {} did not improve for {} evaluations",
                        best.metric.name(),
                        self.setup.config.early_stopping.map_or(0, |es| es.patience)
                    ),
                    reason => format!("ended at step {step} ({})", reason.name()),
                },
                best.step,
                best.metric.name(),
                best.value
            ));
        }
        Ok(TrainSummary {
            final_step: step,
            exact_elbo: exact,
            stopped: Some(stopped),
        })
    }

    /// How the run ended at its current step: early stopping out of patience, the budget
    /// run to its end, or `--max-steps` before that; with the best evaluation of an
    /// early-stopping run.
    fn how_it_ended(&self) -> Stopped {
        let cfg = &self.setup.config;
        let reason = if early::exhausted(cfg, self.state.early) {
            StopReason::NoImprovement
        } else if self.state.step >= self.budget {
            StopReason::Budget
        } else {
            StopReason::MaxSteps
        };
        let best = match (cfg.early_stopping, self.state.early) {
            (Some(es), Some(e)) => Some(BestEvaluation {
                metric: es.metric,
                value: e.best_value,
                step: e.best_step,
            }),
            _ => None,
        };
        Stopped {
            reason,
            step: self.state.step,
            best,
        }
    }

    /// Early stopping after the step just taken, when an evaluation is due
    /// (`early::due`): the writing process scores the validation split, records the score
    /// and updates the state the next checkpoint carries; over MPI ranks it tells the
    /// others what it decided. Nothing without `--early-stopping`.
    fn early_stopping(&mut self) -> Result<Verdict> {
        let Some(es) = self.setup.config.early_stopping else {
            return Ok(Verdict::default());
        };
        if !early::due(&es, self.state.step) {
            return Ok(Verdict::default());
        }
        let mut verdict = Verdict::default();
        if let (Some(run), Some(h)) = (self.job.run, &self.opts.validation) {
            verdict = self.score_validation(run, h, &es)?;
        }
        if self.job.comm.size() > 1 {
            let told = self
                .job
                .comm
                .broadcast_u64(u64::from(verdict.improved) | u64::from(verdict.stop) << 1)?;
            verdict = Verdict {
                improved: told & 1 == 1,
                stop: told & 2 == 2,
            };
        }
        Ok(verdict)
    }

    /// Scores the validation split by the run's stopping metric, records the score
    /// (`early_stopping_score` at the optimiser step) and updates early stopping's state.
    fn score_validation(
        &mut self,
        run: &StageRun<'_>,
        h: &HeldOut,
        es: &EarlyStopping,
    ) -> Result<Verdict> {
        let t = Instant::now();
        let (setup, params) = (self.setup, &self.params);
        let value = self.pool.install(|| -> Result<f64> {
            Ok(match es.metric {
                StopMetric::P1 | StopMetric::P3 | StopMetric::P5 => {
                    let k = match es.metric {
                        StopMetric::P1 => 1,
                        StopMetric::P3 => 3,
                        _ => 5,
                    };
                    h.ranking_metrics(setup, params)?.p_at[k - 1]
                }
                StopMetric::Nlp | StopMetric::Accuracy => {
                    let f = match &setup.class_lik {
                        Some(lik) => h.multiclass_figures(setup, params, &**lik)?,
                        None => h.binary_figures(setup, params)?,
                    };
                    match es.metric {
                        StopMetric::Nlp => f.nlp,
                        _ => f.accuracy,
                    }
                }
            })
        })?;
        let step = self.state.step;
        let (state, improved) = early::update(es, self.state.early, value, step);
        self.state.early = Some(state);
        self.ws.catalog.record_metrics(
            run.id,
            &[MetricRow {
                split: Some(Split::Validation),
                ..metric(Figure::EarlyStoppingScore, value, Some(step as i64))
            }],
        )?;
        let stop = state.since_best >= es.patience;
        self.progress.validation(Validation {
            split: h.split.to_string(),
            epoch: None,
            step: Some(step),
            seconds: t.elapsed().as_secs_f64(),
            scores: Scores::EarlyStopping {
                metric: es.metric.name(),
                value,
                best_value: state.best_value,
                best_step: state.best_step,
                since_best: state.since_best,
                patience: es.patience,
                improved,
                stopping: stop,
            },
        });
        Ok(Verdict { improved, stop })
    }
}
