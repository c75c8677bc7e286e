//! What is fixed for the duration of a training run: its configuration, the svd factors
//! (memory-mapped), the training chunks, K_X̃, the likelihood; and the worker pool.

use std::sync::Arc;

use anyhow::{ensure, Context, Result};
use faer::Mat;

use super::batches::{
    self, check_spans, spans_from_rows, stream_seed, streams, Order, Planner, MAX_EPOCHS,
};
use super::batches::{Prefetcher, RowView, Source, Span};
use super::budget;
use super::init;
use super::warm;
use crate::memtrace::available_memory_bytes;
use crate::model::kernel::feature_ard::weighted_gram;
use crate::model::kernel::{BasisInputs, Gram, KernelKind};
use crate::model::likelihood::logistic::sigmoid;
use crate::model::likelihood::multiclass::amortiser::Amortiser;
use crate::model::likelihood::multiclass::ClassLikelihood;
use crate::model::likelihood::Likelihood;
use crate::model::optim::AdamState;
use crate::model::params::{Params, QParams};
use crate::model::qu::conditional::Conditional;
use crate::model::qu::sites::{low_rank, GP_CHUNK};
use crate::projection::basis_gram;
use crate::stage::StageRun;
use crate::store::catalog::{DatasetRow, Split, StageKind};
use crate::store::checkpoint::{Checkpoint, TrainState};
use crate::store::chunks::{label_counts, read_registered_chunk};
use crate::store::integrity::Registered;
use crate::store::npy::NpyMap;
use crate::store::space::human_bytes as memory;
use crate::store::workspace::Workspace;
use crate::trained::{
    ArdChoice, InducingInputs, LatentChoice, QForm, SvdFiles, Task, TrainConfig, WarmStart,
};

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
    /// The likelihood of `config.likelihood` with `config.quadrature` points (of a
    /// multi-class run: unused, its terms carry `class_lik`).
    pub lik: Box<dyn Likelihood>,
    /// The class likelihood of a multi-class run (None for the other tasks).
    pub class_lik: Option<Box<dyn ClassLikelihood>>,
    pub source: Arc<Source>,
    spans: Vec<batches::ChunkSpan>,
    /// K_X̃ = X̃X̃ᵀ [R×R], or the identity's marker I_D (never materialised).
    pub k_tilde: Gram,
    pub n_labels: usize,
    pub n_rows: u64,
    a_init: Registered,
    /// X̃ [R×D] (`free` maps A's initialisation to input space through it).
    basis: Registered,
    /// X̃ [R×D] in f64 with `--ard features`, which weighs its columns every step (None
    /// otherwise).
    pub feature_basis: Option<Mat<f64>>,
    /// Every label's count over the training rows, once read ([`Setup::label_counts`]):
    /// the initial biases, the held-out propensities and `--frequent-negatives` all use
    /// them, and reading them reads every training chunk whole (its checksum).
    label_counts: std::sync::OnceLock<Vec<u64>>,
}

/// Non-zero features of a training row on average, rounded up (what a sparse minibatch
/// holds per row).
fn mean_row_nnz(dataset: &DatasetRow) -> u64 {
    dataset
        .split(Split::Train)
        .map_or(0, |s| s.nnz.div_ceil(s.n_rows.max(1)))
}

/// Training chunk files of a dataset with their row counts, in chunk order.
fn train_spans(ws: &Workspace, d: &DatasetRow) -> Result<Vec<batches::ChunkSpan>> {
    let files = ws.split_chunks(d, Split::Train)?;
    let rows = files.iter().map(|f| f.1).sum();
    let spans = spans_from_rows(files);
    check_spans(&spans, rows)?;
    Ok(spans)
}

/// The ids of the `f` largest `counts` (ties to the smaller id; all of them when f ≥ L),
/// sorted by id.
pub fn most_frequent(counts: &[u64], f: usize) -> Vec<u32> {
    let mut by_count: Vec<u32> = (0..counts.len() as u32).collect();
    by_count.sort_by_key(|&k| (std::cmp::Reverse(counts[k as usize]), k));
    by_count.truncate(f);
    by_count.sort_unstable();
    by_count
}

impl Setup {
    /// Opens what a run reads; `prefetch` (the queue's length) enters the memory check of
    /// inducing inputs in input space, which refuses before anything is read.
    pub fn open(ws: &Workspace, config: TrainConfig, prefetch: usize) -> Result<Self> {
        let dataset = config.dataset_row(ws)?;
        let in_features = config.inducing_inputs.in_features();
        let feature_ard = config.ard == ArdChoice::Features;
        if feature_ard {
            check_feature_ard(&config)?;
        }
        let row_nnz = mean_row_nnz(&dataset);
        if in_features {
            InputsMemory::of(&config, dataset.n_features, row_nnz, prefetch).check(
                config.inducing_inputs,
                std::env::var(MEMORY_LIMIT_VAR).ok().as_deref(),
            )?;
        }
        let files = SvdFiles::of_run(ws, config.svd_run)?;
        let n_features = usize::try_from(dataset.n_features)?;
        let view = match (in_features, feature_ard) {
            (true, _) => RowView::Features { n_features },
            (false, true) => RowView::SparseFeatures { n_features },
            (false, false) => RowView::Basis,
        };
        let source = Source::new(
            ws.map_large(&files.kxx)?,
            NpyMap::open_registered(&files.sq_norms)?,
            view,
        )?;
        // Before the first allocation that grows with M, P or K (K_X̃, the parameters).
        let sizes = RunSizes {
            n_labels: dataset.n_labels,
            rank: source.rank as u64,
            n_features: dataset.n_features,
            row_nnz,
            prefetch,
        };
        TrainMemory::of(&config, sizes).check(&config, available_memory_bytes()?)?;
        let spans = train_spans(ws, &dataset)?;
        let train_rows = dataset.split(Split::Train).map_or(0, |s| s.n_rows);
        ensure!(
            source.n_rows as u64 == train_rows,
            "kxx.npy of svd run {} holds {} rows, the train split {train_rows}",
            config.svd_run,
            source.n_rows,
        );
        let (k_tilde, feature_basis) = match view {
            RowView::Basis => (
                Gram::Dense(basis_gram(&NpyMap::open_registered(&files.basis)?)?),
                None,
            ),
            RowView::Features { n_features } => (Gram::Identity(n_features), None),
            RowView::SparseFeatures { n_features } => {
                let basis = basis_f64(&NpyMap::open_registered(&files.basis)?, n_features)?;
                // K'_X̃ at w = 1, as the first step computes it (the q(u) initialisation
                // of the full-Cholesky forms factorises the K_Z it gives).
                let gram = weighted_gram(&vec![0.0; n_features], basis.as_ref());
                (Gram::Dense(gram), Some(basis))
            }
        };
        Ok(Setup {
            kind: config.kernel.kind(),
            lik: config.likelihood.build(config.quadrature)?,
            class_lik: match config.task {
                Task::Multiclass => Some(config.class_likelihood()?),
                _ => None,
            },
            n_labels: dataset.n_labels as usize,
            n_rows: source.n_rows as u64,
            source: Arc::new(source),
            spans,
            k_tilde,
            a_init: files.a_init,
            basis: files.basis,
            feature_basis,
            label_counts: std::sync::OnceLock::new(),
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

    /// Steps the run makes in all, counted from step 0: its budget (`--steps`, or every
    /// minibatch of `epochs` epochs), or `max_steps` if that is fewer.
    pub fn total_steps(&self, planner: &Planner) -> Result<u64> {
        let budget = self.budget_steps(planner)?;
        Ok(budget.min(self.config.max_steps.unwrap_or(u64::MAX)))
    }

    /// The steps of the run's budget alone (`--steps`, or every minibatch of `epochs`
    /// epochs), whatever `--max-steps` says.
    pub fn budget_steps(&self, planner: &Planner) -> Result<u64> {
        budget::budget_steps(&self.config, planner).with_context(|| {
            format!(
                "{} epochs: above the limit of {MAX_EPOCHS} epochs; give fewer",
                self.config.epochs
            )
        })
    }

    /// Counts of every label over the training rows: one pass over the training chunks,
    /// the first time.
    pub fn label_counts(&self) -> Result<&[u64]> {
        if let Some(counts) = self.label_counts.get() {
            return Ok(counts);
        }
        let files: Vec<Registered> = self.spans.iter().map(|s| s.file.clone()).collect();
        let counts = label_counts(&files, self.n_labels)?;
        Ok(self.label_counts.get_or_init(|| counts))
    }

    /// The labels of `--frequent-negatives F`: the F most frequent among the training rows'
    /// positives (ties to the smaller id), as sorted ids; empty without the option.
    pub fn frequent_labels(&self) -> Result<Vec<u32>> {
        let Some(f) = self.config.frequent_negatives else {
            return Ok(Vec::new());
        };
        Ok(most_frequent(self.label_counts()?, f))
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
        let inducing_init = match self.config.inducing_inputs {
            InducingInputs::Subspace | InducingInputs::FixedSubspace => {
                init::InducingInit::Subspace(a_init.view2::<f32>()?)
            }
            InducingInputs::Free => init::InducingInit::InputSpace(init::z_from_subspace(
                a_init.view2::<f32>()?,
                self.config.inducing,
                NpyMap::open_registered(&self.basis)?.view2::<f32>()?,
            )?),
            InducingInputs::FixedRows => {
                let rows = init::pick_rows(self.n_rows, self.config.inducing, self.config.seed)?;
                init::InducingInit::InputSpace(self.dense_rows(&rows)?)
            }
            InducingInputs::Axes => init::InducingInit::Axes(self.config.inducing),
        };
        let mut params = init::initial_params(&init::InitInputs {
            kind: self.kind,
            inducing_init,
            inducing: self.config.inducing,
            factors: self.config.factors,
            label_counts: self.label_counts()?,
            n_rows: self.n_rows,
            lengthscale,
            ard: self.config.ard == ArdChoice::BasisDirections,
            feature_weights: self.feature_basis.as_ref().map_or(0, |b| b.ncols()),
            prior_variance: self.config.prior_variance.unwrap_or(1.0),
            phi_is_identity: self.config.latent == LatentChoice::Independent,
            seed: self.config.seed,
        })?;
        if self.config.latent == LatentChoice::Independent {
            // One GP per label: Φ = I [K×K] (P = K), never trained.
            params.phi = Mat::identity(self.n_labels, self.n_labels);
        }
        if let Some(lik) = self.class_lik.as_deref() {
            params.amortiser = self.initial_amortiser(lik);
        }
        // `--learn-epsilon`: θ = logit ε starts at the run's (fixed-default) ε.
        let eps = self.config.epsilon();
        params.logit_epsilon = self.config.learn_epsilon.then(|| (eps / (1.0 - eps)).ln());
        let params =
            init::with_q_form(params, self.config.q_form, self.kind, self.k_tilde.as_ref())?;
        match self.config.warm_start {
            WarmStart::None => Ok(params),
            WarmStart::Ridge => self.ridge_start(params),
        }
    }

    /// `--warm-start ridge` (`train::warm`): one pass over the training rows in file order
    /// for G, s and T at the initial kernel, then μ and Φ from the Newton step.
    fn ridge_start(&self, mut params: Params) -> Result<Params> {
        let started = std::time::Instant::now();
        let planner = Arc::new(self.planner(Order::Sequential));
        let span = Span {
            epoch: 0,
            skip: 0,
            end_epoch: 1,
            max_batches: u64::MAX,
        };
        let mut queue = Prefetcher::spawn(self.source.clone(), planner, span, 2);
        let k_tilde = self.k_tilde.as_ref();
        let z_sq = KernelKind::inducing_sq_norms(params.a.as_ref(), k_tilde);
        let mut sums = warm::RowSums::new(params.a.nrows(), self.n_labels);
        while let Some(batch) = queue.next_batch() {
            let batch = batch?;
            let x = BasisInputs {
                kxx_b: self.source.rows_of(&batch),
                sq_norms: &batch.sq_norms,
                k_tilde,
            };
            let h = Conditional::at_rows(self.kind, &params, &x, Some(&z_sq))
                .kernel
                .k_bz;
            sums.add(&h, &batch.positives);
        }
        // K_Z at the start: the kernel's forward pass without rows.
        let x = BasisInputs::without_rows(k_tilde);
        let k_z = Conditional::through_inducing(self.kind, &params, &x)
            .kernel
            .k_z;
        let p: Vec<f64> = params.bias.iter().map(|&b| sigmoid(b)).collect();
        let w = warm::newton_weights(&sums, &k_z, &p)?;
        let (mu, phi) = warm::factors_of(&w, params.phi.ncols(), &params.phi)?;
        params.phi = phi;
        match &mut params.q {
            QParams::Sites { mu: m, .. } => *m = mu,
            QParams::Full { .. } => anyhow::bail!("internal: --warm-start ridge with a full q(u)"),
        }
        crate::progress::note(format!(
            "warm start (ridge): μ and Φ from one pass over {} rows in {:.1} s",
            sums.rows,
            started.elapsed().as_secs_f64()
        ));
        Ok(params)
    }

    /// The amortisation network of a likelihood with local parameters, drawn from the run's
    /// seed: its input is a row as the minibatches carry it (K_XX̃ row [R], or densified
    /// features [D] with inducing inputs in input space). None for the other likelihoods.
    fn initial_amortiser(&self, lik: &dyn ClassLikelihood) -> Option<Amortiser> {
        let out_bias = lik.local_init(self.n_labels);
        (!out_bias.is_empty()).then(|| {
            Amortiser::init(
                self.source.width(),
                self.config.amortiser_width(),
                &out_bias,
                stream_seed(self.config.seed, streams::INIT, &[2]),
            )
        })
    }

    /// Training rows `rows` (increasing global ids) densified [rows×D], reading only the
    /// chunks that hold them.
    fn dense_rows(&self, rows: &[u64]) -> Result<Mat<f64>> {
        let d = self.source.width();
        let mut dense = Mat::<f64>::zeros(rows.len(), d);
        let mut next = 0;
        for span in &self.spans {
            let end = span.first_row + span.n_rows;
            if next == rows.len() || rows[next] >= end {
                continue;
            }
            let chunk = read_registered_chunk(&span.file)?;
            while next < rows.len() && rows[next] < end {
                let i = (rows[next] - span.first_row) as usize;
                chunk.densify_row(i, d, |j, v| dense[(next, j)] = v as f64)?;
                next += 1;
            }
        }
        ensure!(
            next == rows.len(),
            "internal: rows {:?} are not increasing training rows",
            &rows[next..]
        );
        Ok(dense)
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
                early: None,
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

/// Minibatches of `planner` in epochs `0..epochs`, at most `cap`; refused past
/// [`MAX_EPOCHS`] (which `check_limits` holds new and resumed runs to).
pub fn steps_before(planner: &Planner, epochs: u64, cap: u64) -> Result<u64> {
    planner.steps_in(epochs, cap).with_context(|| {
        format!("{epochs} epochs: above the limit of {MAX_EPOCHS} epochs; give fewer")
    })
}

/// X̃ [R×D] of `basis.npy` in f64, checked to have `n_features` columns and, with the
/// matrices `--ard features` derives from it, to fit the memory limit
/// ([`FeatureArdMemory`]).
fn basis_f64(map: &NpyMap, n_features: usize) -> Result<Mat<f64>> {
    let basis = map.view2::<f32>()?;
    FeatureArdMemory::of(basis.nrows() as u64, basis.ncols() as u64)
        .check(std::env::var(MEMORY_LIMIT_VAR).ok().as_deref())?;
    ensure!(
        basis.ncols() == n_features,
        "{}: basis has {} columns, the dataset {n_features} features",
        map.path().display(),
        basis.ncols()
    );
    Ok(Mat::from_fn(basis.nrows(), n_features, |r, d| {
        f64::from(basis[(r, d)])
    }))
}

/// `--ard features` applies to the svd basis only.
fn check_feature_ard(config: &TrainConfig) -> Result<()> {
    ensure!(
        !config.inducing_inputs.in_features(),
        "--ard features with --inducing-inputs {}: the basis is the identity there, so \
         --ard subspace already learns exactly one weight per input feature; use --ard \
         subspace",
        config.inducing_inputs.name()
    );
    Ok(())
}

/// What `--ard features` holds in memory beyond the model without it, in bytes
/// (`docs/model.md`, "ARD over the D features"): X̃ in f64, the weighted basis X̃W of a
/// step and the backward product ∂F/∂K'_X̃ · X̃, three R×D f64 matrices. The minibatch's
/// sparse rows (nnz values) and the D weights with Adam's moments are small beside them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeatureArdMemory {
    pub bytes: u64,
}

impl FeatureArdMemory {
    pub fn of(rank: u64, n_features: u64) -> Self {
        FeatureArdMemory {
            bytes: 3u64
                .saturating_mul(rank)
                .saturating_mul(n_features)
                .saturating_mul(8),
        }
    }

    /// Refuses above the limit ([`MEMORY_LIMIT_VAR`] if set), stating the need and the ways on.
    pub fn check(&self, limit_var: Option<&str>) -> Result<()> {
        let limit_mib = memory_limit_mib(limit_var)?;
        ensure!(
            self.bytes <= limit_mib.saturating_mul(1 << 20),
            "--ard features needs about {:.1} MiB for three R×D f64 matrices (the basis X̃, \
             its weighted copy X̃W and ∂F/∂K'_X̃·X̃); the limit is {limit_mib} MiB. Use --ard \
             subspace (R weights), an svd run of smaller --rank, or raise the limit with \
             {MEMORY_LIMIT_VAR}=MIB",
            self.bytes as f64 / f64::from(1u32 << 20)
        );
        Ok(())
    }
}

/// Copies of every parameter a run holds at its peak, while a checkpoint is written: the
/// parameters, their gradient (as blocks and flattened for Adam) and Adam's two moments
/// (5), and the checkpoint writer's clone of the parameters and moments, their tensors and
/// the one flat column it encodes (9).
const PARAM_COPIES: u64 = 14;

/// Per-GP work of the q(u) algebra in M×M and M×B f64 matrices, kept for the P GPs
/// across a step. The paper's form: L_p⁻¹ [M×M], V_p and W_p [M×B]. The full-Cholesky
/// forms: L_v,p and the unpacked L_p, the backward's L̄_v,p and Y_p [M×M] with the packed
/// factors' gradient per chunk and as a matrix (about one M×M together), T_p and U_p
/// [M×B]. Checked against peak RSS (`docs/reliability.md`, "Memory estimate").
const SITES_PER_GP: (u64, u64) = (1, 2);
const CHOLESKY_PER_GP: (u64, u64) = (5, 2);

/// What a training step holds in memory, in bytes, estimated from the configuration and
/// the data's sizes before anything is allocated (`docs/reliability.md`, "Memory
/// estimate"). The per-GP q(u) work dominates whenever P·M is large; the memory checks of
/// inducing inputs in input space ([`InputsMemory`]) and of `--ard features`
/// ([`FeatureArdMemory`]) enter as parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrainMemory {
    /// The per-GP work ([`SITES_PER_GP`], [`CHOLESKY_PER_GP`]) for each of the P GPs, and
    /// the buffers of the GP chunks running at once (2 × M × 3(M+B) each).
    pub per_gp: u64,
    /// [`PARAM_COPIES`] × the parameters: A [M×R], μ [M×P], ρ [M×P] or the packed L_p
    /// [M(M+1)/2 × P], Φ [K×P], b [K].
    pub params: u64,
    /// Once per step: the kernel's M×M and B×M matrices (K_Z and its factor, G; H, K_bZ), the
    /// likelihood's two [K×B] buffers, and the queued minibatches' rows in the basis.
    pub shared: u64,
    /// Inducing inputs in input space ([`InputsMemory::total`]); 0 on the subspace path.
    pub inputs: u64,
    /// `--ard features` ([`FeatureArdMemory`]); 0 without.
    pub feature_ard: u64,
}

/// The sizes a training run's memory depends on.
#[derive(Debug, Clone, Copy)]
pub struct RunSizes {
    pub n_labels: u64,
    pub rank: u64,
    pub n_features: u64,
    /// Non-zero features of a training row on average (the sparse minibatches' size).
    pub row_nnz: u64,
    pub prefetch: usize,
}

impl TrainMemory {
    pub fn of(config: &TrainConfig, sizes: RunSizes) -> Self {
        let (m, p, b) = (
            config.inducing as u64,
            config.factors as u64,
            config.batch as u64,
        );
        let k = sizes.n_labels;
        let f64s = |n: u64| n.saturating_mul(8);
        let mul = |a: u64, b: u64| a.saturating_mul(b);
        let chunks_at_once = (config.threads.max(1) as u64).min(p.div_ceil(GP_CHUNK as u64));
        // q(u): its work per GP, and μ and ρ, or μ and the packed L_p, per GP.
        let ((squares, rows), q_per_gp) = match config.q_form {
            QForm::SiteDiagonal => (SITES_PER_GP, mul(2, m)),
            QForm::Cholesky | QForm::Whitened => (
                CHOLESKY_PER_GP,
                m.saturating_add(mul(m, m.saturating_add(1)) / 2),
            ),
        };
        let work = mul(squares, mul(m, m)).saturating_add(mul(rows, mul(m, b)));
        let per_gp = match config.inducing_inputs {
            // No M×M algebra (`model/qu/axes.rs`), M = D: per GP the sites and slopes the
            // forward pass keeps (2·D), the backward pass's two gradient columns (2·D) and
            // the [D×P] blocks they are copied into (2·D).
            InducingInputs::Axes => mul(p, mul(6, m)),
            _ => mul(p, work)
                .saturating_add(mul(chunks_at_once, mul(6, mul(m, m.saturating_add(b))))),
        };
        let in_features = config.inducing_inputs.in_features();
        // In input space Z [M×D] replaces A and is counted with its moments in `inputs`.
        let a = if in_features { 0 } else { mul(m, sizes.rank) };
        let params = mul(
            PARAM_COPIES,
            a.saturating_add(mul(p, q_per_gp))
                .saturating_add(mul(k, p))
                .saturating_add(k),
        );
        let queue = if in_features {
            0
        } else {
            mul(sizes.prefetch as u64 + 2, mul(b, sizes.rank))
        };
        // K_Z and its factor, K_bZ, H; none of them formed on the axes (M = D there).
        let kernel_mats = match config.inducing_inputs {
            InducingInputs::Axes => mul(4, mul(b, p)),
            _ => mul(4, mul(m, m)).saturating_add(mul(3, mul(b, m))),
        };
        let shared = kernel_mats
            .saturating_add(mul(2, mul(k, b)))
            .saturating_add(queue);
        let feature_ard = match config.ard {
            ArdChoice::Features => FeatureArdMemory::of(sizes.rank, sizes.n_features).bytes,
            _ => 0,
        };
        let inputs = match in_features {
            true => {
                InputsMemory::of(config, sizes.n_features, sizes.row_nnz, sizes.prefetch).total()
            }
            false => 0,
        };
        TrainMemory {
            per_gp: f64s(per_gp),
            params: f64s(params),
            shared: f64s(shared),
            inputs,
            feature_ard,
        }
    }

    pub fn total(&self) -> u64 {
        self.per_gp
            .saturating_add(self.params)
            .saturating_add(self.shared)
            .saturating_add(self.inputs)
            .saturating_add(self.feature_ard)
    }

    /// Refuses when the total exceeds `available` bytes (None: no figure, no refusal),
    /// stating both, what the total is made of, and the ways on.
    pub fn check(&self, config: &TrainConfig, available: Option<u64>) -> Result<()> {
        let Some(available) = available else {
            return Ok(());
        };
        let (m, p, b) = (config.inducing, config.factors, config.batch);
        let gps = match config.latent {
            LatentChoice::Independent => format!("P = K = {p} GPs, one per label"),
            LatentChoice::Factor => format!("P = {p} GPs"),
        };
        let ways = match config.latent {
            LatentChoice::Independent => {
                "lower --inducing, or use --latent factor (a few --factors GPs shared by \
                 the labels)"
            }
            LatentChoice::Factor => "lower --inducing or --factors",
        };
        let input_space = match self.inputs.saturating_add(self.feature_ard) {
            0 => String::new(),
            bytes => format!(
                "; inducing inputs in input space or feature ARD {}",
                memory(bytes)
            ),
        };
        ensure!(
            self.total() <= available,
            "training needs about {}: the M×M and M×B matrices of each of the {gps} (M = {m}, \
             B = {b}) {}; the parameters (Φ [K×P] among them) with their gradient, Adam's \
             moments and a checkpoint's copies {}; the kernel's and the likelihood's matrices and the \
             minibatch queue {}{input_space}. This machine has {} available (MemAvailable); \
             {ways}, or a smaller --batch",
            memory(self.total()),
            memory(self.per_gp),
            memory(self.params),
            memory(self.shared),
            memory(available),
        );
        Ok(())
    }
}

/// The memory limit, MiB: [`DEFAULT_MEMORY_LIMIT_MIB`], or `limit_var` (the value of
/// [`MEMORY_LIMIT_VAR`]) when set.
fn memory_limit_mib(limit_var: Option<&str>) -> Result<u64> {
    match limit_var {
        None => Ok(DEFAULT_MEMORY_LIMIT_MIB),
        Some(v) => v.trim().parse::<u64>().map_err(|_| {
            anyhow::anyhow!("{MEMORY_LIMIT_VAR}={v:?}: expected a whole number of MiB")
        }),
    }
}

/// The environment variable that sets the memory limit of inducing inputs in input space.
pub const MEMORY_LIMIT_VAR: &str = "FSGP_INPUTS_MEMORY_MIB";

/// The default limit, MiB: a sixth of the 24 GiB machine this was built on, leaving room
/// for the per-GP work (P·(M² + MB) doubles) and other processes.
pub const DEFAULT_MEMORY_LIMIT_MIB: u64 = 4096;

/// What inducing inputs in input space (`free`, `fixed-rows`) hold in memory beyond the
/// subspace path, in bytes (`docs/model.md`, "Sparse rows in input space", Memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputsMemory {
    /// Z, its gradient and Adam's two moments: 4·M·D f64.
    pub state: u64,
    /// The kernel backward's M×D products ((∂G + ∂Gᵀ) Z and its scaled copy): 2·M·D f64.
    pub kernel: u64,
    /// I_D and its Cholesky factor, materialised only on the linear kernel's subspace path
    /// (paper form, 4D ≤ 3M): 2·D² f64 there, else nothing (K_X̃ = I_D is a marker).
    pub gram: u64,
    /// The queued sparse minibatches plus the one being read and the one in use:
    /// (prefetch + 2)·B·(nnz a row·(8 + 4) + 8) bytes (values f64, ids u32, offsets).
    pub queue: u64,
}

impl InputsMemory {
    /// For D = `n_features` and `row_nnz` non-zeros a row on average.
    pub fn of(config: &TrainConfig, n_features: u64, row_nnz: u64, prefetch: usize) -> Self {
        let (m, d, b) = (config.inducing as u64, n_features, config.batch as u64);
        let f64s = |n: u64| n.saturating_mul(8);
        let subspace_path = config.kernel.kind() == KernelKind::Linear
            && config.q_form == QForm::SiteDiagonal
            && low_rank::worthwhile(config.inducing, usize::try_from(d).unwrap_or(usize::MAX));
        let row_bytes = row_nnz.saturating_mul(12).saturating_add(8);
        // The axes train no Z and form no kernel matrix: only the queue.
        let m = match config.inducing_inputs {
            InducingInputs::Axes => 0,
            _ => m,
        };
        InputsMemory {
            state: f64s(4u64.saturating_mul(m).saturating_mul(d)),
            kernel: f64s(2u64.saturating_mul(m).saturating_mul(d)),
            gram: match subspace_path {
                true => f64s(2u64.saturating_mul(d).saturating_mul(d)),
                false => 0,
            },
            queue: (prefetch as u64 + 2)
                .saturating_mul(b)
                .saturating_mul(row_bytes),
        }
    }

    pub fn total(&self) -> u64 {
        self.state
            .saturating_add(self.kernel)
            .saturating_add(self.gram)
            .saturating_add(self.queue)
    }

    /// Refuses when the total exceeds the limit (`limit_var`: the value of
    /// [`MEMORY_LIMIT_VAR`], MiB, if set), stating what it needs and how to go on.
    pub fn check(&self, choice: InducingInputs, limit_var: Option<&str>) -> Result<()> {
        let limit_mib = memory_limit_mib(limit_var)?;
        let mib = |b: u64| format!("{:.1}", b as f64 / f64::from(1u32 << 20));
        ensure!(
            self.total() <= limit_mib.saturating_mul(1 << 20),
            "--inducing-inputs {} needs about {} MiB for its inputs in input space: \
             Z with its gradient and Adam's moments {} MiB, the kernel's M×D products {} MiB, \
             I_D on the linear kernel's subspace path {} MiB, the sparse minibatch queue {} \
             MiB; the limit is {limit_mib} MiB. \
             Use --inducing-inputs subspace (R columns instead of D), fewer --inducing, \
             a smaller --batch or --prefetch, or raise the limit with {MEMORY_LIMIT_VAR}=MIB",
            choice.name(),
            mib(self.total()),
            mib(self.state),
            mib(self.kernel),
            mib(self.gram),
            mib(self.queue)
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_frequent_labels_break_ties_by_id_and_come_sorted() {
        assert_eq!(most_frequent(&[5, 9, 1, 9, 7], 2), [1, 3]);
        assert_eq!(most_frequent(&[5, 9, 1, 9, 7], 3), [1, 3, 4]);
        assert_eq!(most_frequent(&[3, 3, 3], 2), [0, 1]);
        assert_eq!(most_frequent(&[0, 2], 5), [0, 1]);
    }

    /// A configuration at M = B = 500, P = 30, one thread, with `extra` fields set.
    fn config(extra: serde_json::Value) -> TrainConfig {
        let mut json = serde_json::json!({
            "dataset": "d", "dataset_checksum": "c", "svd_run": 1, "kernel": "linear",
            "inducing": 500, "factors": 30, "batch": 500, "epochs": 1, "lr": 0.01,
            "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "negatives": "all", "quadrature": 20,
            "seed": 0, "threads": 1, "freeze_a": false, "freeze_hyper": false,
            "shuffle_chunks": 2, "checkpoint_every": 10
        });
        for (k, v) in extra.as_object().unwrap() {
            json[k] = v.clone();
        }
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn input_space_memory_is_counted_and_refused_with_the_numbers() {
        let mut config = config(serde_json::json!({"inducing_inputs": "free"}));
        // Delicious: M = B = D = 500, 18 non-zeros a row, prefetch 4: 6·M·D doubles and
        // 6·B sparse rows; D > ¾M, so no I_D.
        let delicious = InputsMemory::of(&config, 500, 18, 4);
        assert_eq!(
            delicious.total(),
            8 * 6 * 500 * 500 + 6 * 500 * (18 * 12 + 8)
        );
        // At D ≤ ¾M the linear kernel's subspace path holds I_D and its factor.
        assert_eq!(
            InputsMemory::of(&config, 300, 18, 4).gram,
            8 * 2 * 300 * 300
        );
        // The 23 146-feature set (M = B = 500): 6·M·D doubles, nothing of D², far below the
        // limit (it asked for 9.4 GiB, 8.2 GiB of it a dense I_D, when rows were densified).
        let wide = InputsMemory::of(&config, 23_146, 50, 4);
        assert_eq!(wide.gram, 0);
        assert!(wide.total() < 600 << 20, "{}", wide.total());
        wide.check(InducingInputs::Free, None).unwrap();
        delicious.check(InducingInputs::Free, None).unwrap();
        // AmazonCat-13K's 203 882 features: refused, stating the bytes and the limit.
        config.inducing = 1000;
        let amazon = InputsMemory::of(&config, 203_882, 76, 4);
        let err = amazon
            .check(InducingInputs::Free, None)
            .unwrap_err()
            .to_string();
        let need = amazon.total().div_ceil(1 << 20);
        let about = format!("needs about {:.1} MiB", amazon.total() as f64 / 1048576.0);
        assert!(err.contains(&about), "{err}");
        assert!(err.contains("the limit is 4096 MiB"), "{err}");
        assert!(err.contains("FSGP_INPUTS_MEMORY_MIB=MIB"), "{err}");
        // The limit moves with the variable, and a bad value is named.
        let just_enough = need.to_string();
        amazon
            .check(InducingInputs::FixedRows, Some(&just_enough))
            .unwrap();
        let below = (need - 1).to_string();
        assert!(amazon
            .check(InducingInputs::FixedRows, Some(&below))
            .is_err());
        let bad = delicious
            .check(InducingInputs::Free, Some("lots"))
            .unwrap_err();
        assert!(
            bad.to_string().contains("FSGP_INPUTS_MEMORY_MIB=\"lots\""),
            "{bad}"
        );
    }

    #[test]
    fn the_training_estimate_counts_every_part_and_refuses_with_both_figures() {
        let config = config(serde_json::json!({
            "factors": 52946, "threads": 2, "latent": "independent"
        }));
        let sizes = RunSizes {
            n_labels: 52946,
            rank: 250,
            n_features: 100_000,
            row_nnz: 50,
            prefetch: 4,
        };
        let est = TrainMemory::of(&config, sizes);
        let (m, p, b, k, r) = (500u64, 52946u64, 500u64, 52946u64, 250u64);
        // L_p⁻¹ [M×M], V_p and W_p [M×B] per GP, and two chunks' buffers.
        assert_eq!(
            est.per_gp,
            8 * (p * (m * m + 2 * m * b) + 2 * 6 * m * (m + b))
        );
        assert_eq!(est.params, 8 * 14 * (m * r + 2 * m * p + k * p + k));
        assert_eq!(
            est.shared,
            8 * (4 * m * m + 3 * b * m + 2 * k * b + 6 * b * r)
        );
        assert_eq!((est.inputs, est.feature_ard), (0, 0));
        // The 52 946-label run the OOM killer stopped at 24 GB: hundreds of GiB.
        assert!(est.total() > 300 << 30, "{}", est.total());
        let err = est.check(&config, Some(24 << 30)).unwrap_err().to_string();
        assert!(err.starts_with("training needs about "), "{err}");
        assert!(err.contains("P = K = 52946 GPs, one per label"), "{err}");
        assert!(err.contains("This machine has 24.0 GiB available"), "{err}");
        est.check(&config, Some(est.total())).unwrap();
        est.check(&config, None).unwrap();
        // The factor model with 30 GPs fits in far less.
        let factor = TrainConfig {
            factors: 30,
            latent: LatentChoice::Factor,
            ..config
        };
        assert!(TrainMemory::of(&factor, sizes).total() < 1 << 30);
    }
}
