//! One training step (bound + analytic gradients + Adam) with inducing inputs in input space
//! (`--inducing-inputs free`: Z [M×D], the identity basis), on sparse rows, against the
//! densified step the trainer took before (`docs/model.md`, "Sparse rows in input space"):
//!
//! - sparse: the rows in CSR, K_X̃ = I_D a marker; the kernel costs 2·nnz·M (H = X_b Zᵀ and
//!   its gradient) plus 4M²D (G = Z Zᵀ and the K_Z term of ∂Z, ∂Z ← (∂G + ∂Gᵀ) Z), Adam M·D;
//! - dense: the same step with the rows densified [B×D] and K_X̃ = I_D multiplied as a dense
//!   D×D matrix (the old path: 2MD² + 4BMD more), run at D ≤ 10 000 only (I_D is D² f64).
//!
//! Linear and SE kernels, M = 500, B = 500, P = 30, K = 983 (all negatives, 19 positives a
//! row), 50 non-zeros a row, D = 1 000, 10 000, 50 000. Both paths run through C_p
//! (D > ¾M). faer's f64 GEMM rate is measured in the same run; the kernel's GEMM work
//! (4M²D) is reported against it.
//!
//! A second table sweeps the rows' non-zeros (10 to 1 000) at D = 10 000, sparse path only.
//!
//! A third table is the linear kernel with inducing features at the axes (`--inducing-inputs
//! axes`, `model/qu/axes.rs`: Z = I_D, M = D, exact), whose q(u) work is 2·nnz·B·P for the
//! rows plus D·P elementwise for the KL and Adam: at D = 1 000 to 500 000 and the same rows,
//! against the free-Z linear step of the first table, and against the rows' non-zeros at
//! D = 10 000; with the predictive marginals at the same rows (prediction's q(u) work).
//!
//! Run: `cargo bench --bench sparse_step` (FSGP_BENCH_STEPS: steps timed per row, default 3,
//! the best reported; FSGP_BENCH_ONLY: only the rows whose name contains it, e.g. `SE`).

mod common;
use common::threads;
use faer::Mat;
use fsgp::model::bound::objective::{bound_and_grads, BoundOptions, PhaseTimes};
use fsgp::model::bound::terms::TermSet;
use fsgp::model::kernel::feature_ard::FeatureRows;
use fsgp::model::kernel::{BasisInputs, GramRef, KernelKind, KernelParams, Rows};
use fsgp::model::likelihood::logistic::BernoulliLogistic;
use fsgp::model::optim::{AdamConfig, AdamState};
use fsgp::model::params::{Params, QParams};
use fsgp::model::predictive::Predictor;
use fsgp::model::scratch::Scratch;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::Instant;

const M: usize = 500;
const B: usize = 500;
const P: usize = 30;
const K: usize = 983;
const NNZ_PER_ROW: usize = 50;

/// Non-zeros a row of the sweep at fixed D ([`SWEEP_D`]).
const NNZ_SWEEP: [usize; 4] = [10, 50, 250, 1000];
const SWEEP_D: usize = 10_000;

/// B random rows over `d` features with about `nnz` distinct ones each.
fn sparse_rows(d: usize, nnz: usize, u: &mut impl FnMut(f64) -> f64) -> FeatureRows {
    let mut frng = ChaCha8Rng::seed_from_u64(3);
    let mut rows = FeatureRows::new();
    for _ in 0..B {
        let mut ids: Vec<u32> = (0..nnz).map(|_| frng.random_range(0..d as u32)).collect();
        ids.sort_unstable();
        ids.dedup();
        let values: Vec<f64> = ids.iter().map(|_| u(0.5)).collect();
        rows.push_row(&ids, values);
    }
    rows
}

/// Parameters of inducing features at the axes: A [0×D], μ and ρ [D×P].
fn axes_params(d: usize, u: &mut impl FnMut(f64) -> f64) -> Params {
    Params {
        a: Mat::zeros(0, d),
        q: QParams::Sites {
            mu: Mat::from_fn(d, P, |_, _| u(0.1)),
            rho: Mat::from_fn(d, P, |_, _| u(1.0)),
        },
        ..params(KernelKind::Linear, 0, u)
    }
}

fn params(kind: KernelKind, d: usize, u: &mut impl FnMut(f64) -> f64) -> Params {
    Params {
        logit_epsilon: None,
        a: Mat::from_fn(M, d, |_, _| u(0.2)),
        q: QParams::Sites {
            mu: Mat::from_fn(M, P, |_, _| u(0.1)),
            rho: Mat::from_fn(M, P, |_, _| u(1.0)),
        },
        phi: Mat::from_fn(K, P, |_, _| u(0.4)),
        bias: (0..K).map(|_| -3.0).collect(),
        kernel: KernelParams::new(0.0, (kind == KernelKind::SquaredExponential) as u8 as f64),
        amortiser: None,
    }
}

/// The best of `steps` steps: (seconds, its phases, Adam's seconds).
fn time_steps(
    kind: KernelKind,
    x: &BasisInputs<'_>,
    mut params: Params,
    steps: usize,
) -> (f64, PhaseTimes, f64) {
    let mut lrng = ChaCha8Rng::seed_from_u64(2);
    let positives: Vec<Vec<u32>> = (0..B)
        .map(|_| {
            let mut v: Vec<u32> = (0..19).map(|_| lrng.random_range(0..K as u32)).collect();
            v.sort_unstable();
            v.dedup();
            v
        })
        .collect();
    let terms = TermSet::AllLabels {
        positives: &positives,
        scale: 12920.0 / B as f64,
    };
    let lik = BernoulliLogistic::new(20).unwrap();
    let (mut adam, cfg, scratch) = (
        AdamState::new(&params),
        AdamConfig::default(),
        Scratch::new(),
    );
    let opts = BoundOptions::default();
    let mut best = (f64::INFINITY, PhaseTimes::default(), 0.0);
    for _ in 0..steps {
        let t = Instant::now();
        let ev = bound_and_grads(kind, &params, x, &terms, &lik, &opts, &scratch).unwrap();
        let t_adam = Instant::now();
        adam.step(&cfg, &mut params, &ev.grads, &|_| false);
        let adam_s = t_adam.elapsed().as_secs_f64();
        let times = ev.times;
        // As the trainer does: the next step reuses the gradient matrices.
        ev.recycle(&scratch);
        let secs = t.elapsed().as_secs_f64();
        if secs < best.0 {
            best = (secs, times, adam_s);
        }
    }
    best
}

fn main() {
    let steps: usize = std::env::var("FSGP_BENCH_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let only = std::env::var("FSGP_BENCH_ONLY").ok();
    faer::set_global_parallelism(faer::Par::rayon(0));
    let gemm = common::gemm_gflops(1000);
    println!(
        "free inducing inputs, one step (bound + gradients + Adam), best of {steps}, {} cores; \
         M = {M}, B = {B}, P = {P}, K = {K}, ~{NNZ_PER_ROW} non-zeros a row; faer f64 GEMM \
         {gemm:.1} GFLOP/s",
        threads()
    );
    let mut free_linear = Vec::new();
    println!("| kernel | D | sparse s/step | kernel fwd + bwd (s) | Adam (s) | kernel GEMM GFLOP/s (4M²D) | dense s/step | dense kernel fwd + bwd (s) | dense / sparse |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (kind, name) in [
        (KernelKind::Linear, "linear"),
        (KernelKind::SquaredExponential, "SE"),
    ] {
        if only.as_deref().is_some_and(|o| !name.contains(o)) {
            continue;
        }
        for d in [1_000, 10_000, 50_000] {
            let mut rng = ChaCha8Rng::seed_from_u64(1);
            let mut u = |s: f64| (rng.random::<f64>() - 0.5) * s;
            let rows = sparse_rows(d, NNZ_PER_ROW, &mut u);
            let norms = rows.weighted_sq_norms(None);
            let start = params(kind, d, &mut u);
            let sparse = BasisInputs {
                kxx_b: Rows::Sparse {
                    rows: &rows,
                    width: d,
                },
                sq_norms: &norms,
                k_tilde: GramRef::Identity(d),
            };
            let (secs, ph, adam_s) = time_steps(kind, &sparse, start.clone(), steps);
            if kind == KernelKind::Linear {
                free_linear.push((d, secs));
            }
            let kernel_s = ph.kernel_fwd + ph.kernel_bwd;
            let gemm_work = 4.0 * (M * M * d) as f64;
            let dense = (d <= 10_000).then(|| {
                let dense_rows = sparse.kxx_b.to_dense();
                let identity = Mat::<f64>::identity(d, d);
                let x = BasisInputs {
                    kxx_b: dense_rows.as_ref().into(),
                    sq_norms: &norms,
                    k_tilde: identity.as_ref().into(),
                };
                let (s, ph, _) = time_steps(kind, &x, start.clone(), steps);
                (s, ph.kernel_fwd + ph.kernel_bwd)
            });
            let (dense_s, dense_kernel, ratio) = match dense {
                Some((s, k)) => (
                    format!("{s:.3}"),
                    format!("{k:.3}"),
                    format!("{:.1}×", s / secs),
                ),
                None => ("—".into(), "—".into(), "—".into()),
            };
            println!(
                "| {name} | {d} | {secs:.3} | {kernel_s:.3} | {adam_s:.3} | {:.1} | {dense_s} | {dense_kernel} | {ratio} |",
                gemm_work / kernel_s / 1e9
            );
        }
    }
    println!();
    println!(
        "at D = {SWEEP_D}, sparse path only: the step against the rows' non-zeros (the \
         kernel's sparse products cost 2·B·nnz·M)"
    );
    println!("| kernel | non-zeros a row | sparse s/step | kernel fwd + bwd (s) | Adam (s) |");
    println!("|---|---|---|---|---|");
    for (kind, name) in [
        (KernelKind::Linear, "linear"),
        (KernelKind::SquaredExponential, "SE"),
    ] {
        if only.as_deref().is_some_and(|o| !name.contains(o)) {
            continue;
        }
        for nnz in NNZ_SWEEP {
            let mut rng = ChaCha8Rng::seed_from_u64(1);
            let mut u = |s: f64| (rng.random::<f64>() - 0.5) * s;
            let rows = sparse_rows(SWEEP_D, nnz, &mut u);
            let norms = rows.weighted_sq_norms(None);
            let start = params(kind, SWEEP_D, &mut u);
            let x = BasisInputs {
                kxx_b: Rows::Sparse {
                    rows: &rows,
                    width: SWEEP_D,
                },
                sq_norms: &norms,
                k_tilde: GramRef::Identity(SWEEP_D),
            };
            let (secs, ph, adam_s) = time_steps(kind, &x, start, steps);
            println!(
                "| {name} | {nnz} | {secs:.3} | {:.3} | {adam_s:.3} |",
                ph.kernel_fwd + ph.kernel_bwd
            );
        }
    }
    if only.as_deref().is_none_or(|o| "axes".contains(o)) {
        axes_tables(steps, &free_linear);
    }
}

/// The best of `steps` timings of the predictive marginals (m and s of every GP, what a
/// probability needs) at the rows of `x`, q(u) prepared once as prediction does.
fn time_marginals(x: &BasisInputs<'_>, params: &Params, steps: usize) -> f64 {
    let predictor = Predictor::new(KernelKind::Linear, params, x.k_tilde).unwrap();
    (0..steps)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(predictor.marginals(x));
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// The axes' tables: against D (with the free-Z linear step of the same D, when the first
/// table ran it) and against the rows' non-zeros.
fn axes_tables(steps: usize, free_linear: &[(usize, f64)]) {
    println!();
    println!(
        "linear kernel, inducing features at the axes (M = D, exact): one step, the same rows"
    );
    println!("| D | non-zeros a row | s/step | q(u) fwd + bwd (s) | likelihood (s) | Adam (s) | predictive marginals (s) | free Z (M = {M}) s/step | free Z / axes |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let shapes = [1_000, 10_000, 50_000, 200_000, 500_000]
        .map(|d| (d, NNZ_PER_ROW))
        .into_iter()
        .chain(NNZ_SWEEP.map(|nnz| (SWEEP_D, nnz)));
    for (d, nnz) in shapes {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut u = |s: f64| (rng.random::<f64>() - 0.5) * s;
        let rows = sparse_rows(d, nnz, &mut u);
        let norms = rows.weighted_sq_norms(None);
        let start = axes_params(d, &mut u);
        let x = BasisInputs {
            kxx_b: Rows::Sparse {
                rows: &rows,
                width: d,
            },
            sq_norms: &norms,
            k_tilde: GramRef::Identity(d),
        };
        let marginals_s = time_marginals(&x, &start, steps);
        let (secs, ph, adam_s) = time_steps(KernelKind::Linear, &x, start, steps);
        let free = free_linear
            .iter()
            .find(|&&(fd, _)| fd == d && nnz == NNZ_PER_ROW)
            .map_or(("—".to_string(), "—".to_string()), |&(_, f)| {
                (format!("{f:.3}"), format!("{:.1}×", f / secs))
            });
        println!(
            "| {d} | {nnz} | {secs:.4} | {:.4} | {:.4} | {adam_s:.4} | {marginals_s:.4} | {} | {} |",
            ph.variational_fwd + ph.variational_bwd,
            ph.likelihood,
            free.0,
            free.1
        );
    }
}
