//! What is fixed for the duration of a training run: its configuration, the svd factors
//! (memory-mapped), the training chunks, K_X̃, the likelihood; and the worker pool.

use std::sync::Arc;

use anyhow::{ensure, Context, Result};
use faer::Mat;

use super::batches::Source;
use super::batches::{self, check_spans, spans_from_rows, stream_seed, streams, Order, Planner};
use super::init;
use crate::model::kernel::KernelKind;
use crate::model::likelihood::BernoulliLogistic;
use crate::model::optim::AdamState;
use crate::model::params::Params;
use crate::projection::basis_gram;
use crate::stage::StageRun;
use crate::store::catalog::{DatasetRow, StageKind};
use crate::store::checkpoint::{Checkpoint, TrainState};
use crate::store::chunks::label_counts;
use crate::store::integrity::Registered;
use crate::store::npy::NpyMap;
use crate::store::workspace::Workspace;
use crate::trained::{ArdChoice, SvdFiles, TrainConfig};

/// A rayon pool of `threads` workers, with faer's own parallel kernels set to the same
/// count (results are reproducible for a fixed count).
pub fn thread_pool(threads: usize) -> Result<rayon::ThreadPool> {
    faer::set_global_parallelism(if threads > 1 {
        faer::Par::rayon(threads)
    } else {
        faer::Par::Seq
    });
    crate::stage::thread_pool(threads)
}

/// Everything fixed for the duration of a run.
pub struct Setup {
    pub config: TrainConfig,
    pub kind: KernelKind,
    pub lik: BernoulliLogistic,
    pub source: Arc<Source>,
    spans: Vec<batches::ChunkSpan>,
    /// K_X̃ = X̃X̃ᵀ [R×R].
    pub k_tilde: Mat<f64>,
    pub n_labels: usize,
    pub n_rows: u64,
    a_init: Registered,
}

/// Training chunk files of a dataset with their row counts, in chunk order.
fn train_spans(ws: &Workspace, d: &DatasetRow) -> Result<Vec<batches::ChunkSpan>> {
    let files = ws.split_chunks(d, "train")?;
    let rows = files.iter().map(|f| f.1).sum();
    let spans = spans_from_rows(files);
    check_spans(&spans, rows)?;
    Ok(spans)
}

impl Setup {
    pub fn open(ws: &Workspace, config: TrainConfig) -> Result<Self> {
        let dataset = config.dataset_row(ws)?;
        let files = SvdFiles::of_run(ws, config.svd_run)?;
        let source = Source::new(
            ws.map_large(&files.kxx)?,
            NpyMap::open_registered(&files.sq_norms)?,
        )?;
        let spans = train_spans(ws, &dataset)?;
        let train_rows = dataset.split("train").map_or(0, |s| s.n_rows);
        ensure!(
            source.n_rows as u64 == train_rows,
            "kxx.npy of svd run {} holds {} rows, the train split {train_rows}",
            config.svd_run,
            source.n_rows,
        );
        let k_tilde = basis_gram(&NpyMap::open_registered(&files.basis)?)?;
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

    pub fn planner(&self, order: Order) -> Planner {
        Planner {
            chunks: self.spans.clone(),
            batch: self.config.batch,
            order,
        }
    }

    pub fn shuffled(&self) -> Planner {
        self.planner(Order::Shuffled {
            seed: self.config.seed,
            window: self.config.shuffle_chunks,
        })
    }

    /// Steps the run makes in all, counted from step 0: every minibatch of `epochs` epochs,
    /// or `max_steps` if that is fewer.
    pub fn total_steps(&self, planner: &Planner) -> u64 {
        let epoch_steps: u64 = (0..self.config.epochs)
            .map(|e| planner.batches_in_epoch(e))
            .sum();
        self.config
            .max_steps
            .map_or(epoch_steps, |s| s.min(epoch_steps))
    }

    /// Counts of every label over the training rows (one pass over the label columns).
    pub fn label_counts(&self) -> Result<Vec<u64>> {
        let files: Vec<Registered> = self.spans.iter().map(|s| s.file.clone()).collect();
        label_counts(&files, self.n_labels)
    }

    fn initial_params(&self) -> Result<Params> {
        let a_init = NpyMap::open_registered(&self.a_init)?;
        let lengthscale = match self.kind {
            KernelKind::Linear => 1.0,
            KernelKind::SquaredExponential | KernelKind::SePlusLinear => init::median_distance(
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
        let params = init::initial_params(&init::InitInputs {
            kind: self.kind,
            a_init: a_init.view2::<f32>()?,
            inducing: self.config.inducing,
            factors: self.config.factors,
            label_counts: &self.label_counts()?,
            n_rows: self.n_rows,
            lengthscale,
            ard: self.config.ard == ArdChoice::Subspace,
            seed: self.config.seed,
        })?;
        init::with_q_form(
            params,
            self.config.q_form.form(),
            self.kind,
            self.k_tilde.as_ref(),
        )
    }

    /// Step 0 of a run: the initial parameters and a fresh optimiser.
    pub fn initial_checkpoint(&self) -> Result<Checkpoint> {
        let params = self.initial_params()?;
        Ok(Checkpoint {
            adam: AdamState::new(&params),
            params,
            state: TrainState {
                step: 0,
                epoch: 0,
                batch_in_epoch: 0,
                epoch_elbo_sum: 0.0,
            },
            config: self.config.to_json(),
        })
    }

    /// The run's published directory, `train/<dataset>-<kernel>.run<id>`.
    pub fn out_rel(&self, run: &StageRun<'_>) -> String {
        run.output_rel(
            StageKind::Train.output_dir(),
            &format!("{}-{}", self.config.dataset, self.config.kernel.name()),
        )
    }
}
