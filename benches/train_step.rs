//! One training step (bound + analytic gradients + Adam) of the model layer, and faer's
//! dense f64 GEMM rate measured in the same run:
//! - Delicious configuration: B=500, M=500, P=30, R=250, K=983, all negatives, on the
//!   default path (the subspace factorisation, R ≤ ¾M) and, for comparison, through C_p;
//! - AmazonCat-like: B=500, M=500, P=30, R=2000, K=13330, all negatives, and with 1000
//!   sampled negatives per row;
//! - the Delicious configuration with the other kernels and subspace ARD: SE and SE + linear
//!   (through C_p), linear with subspace ARD (still the subspace path), SE + linear with
//!   subspace ARD.
//! - the full-Cholesky q(u) forms at the Delicious configuration (`--q-form whitened` with
//!   the linear and the SE kernel, `--q-form cholesky` with the SE kernel: unwhitened, it
//!   needs a non-singular K_Z, which the linear kernel at R < M does not give).
//! - ARD over the features at the Delicious configuration (`--ard features`: D = 500
//!   weights, sparse rows of 18 features, the linear kernel through C_p, as the trainer
//!   runs it).
//! - free inducing inputs at Delicious's D = 500 (`--inducing-inputs free`: the identity
//!   basis, so R = D = 500 and K_XX̃ is the batch's B×D rows): linear and SE with the O(M)
//!   form, and each full-Cholesky form.
//!
//! - the natural-gradient step of `--natural-step` (`model::natgrad`) on a whitened q(u),
//!   alone: at the Delicious shape (M = 500, P = 30) and MNIST's (M = 200, P = 1), 4M³/3
//!   flops per GP (FSGP_BENCH_ONLY=natural runs only these).
//!
//! Data and parameters are random of the right shapes (linear kernel unless a row says
//! otherwise, everything trainable); the cost of a step does not depend on the values. The
//! step runs like the trainer's: faer's global parallelism on the rayon pool, all cores.
//!
//! Run: `cargo bench --bench train_step` (FSGP_BENCH_STEPS: steps timed per configuration,
//! default 3; the best is reported, with the phase times of that step; FSGP_BENCH_JSON=FILE:
//! each row also appended to FILE as a JSON line; FSGP_BENCH_ONLY:
//! run only the rows whose `(form, kernel, ard, R, negatives, factorisation, features)`
//! debug text contains it, e.g. `Whitened`, `SePlusLinear` or `Some((500`).

mod common;
use common::threads;
use faer::Mat;
use fsgp::model::bound::objective::{
    bound_and_grads, bound_and_grads_feature_ard, BoundAndGrads, BoundOptions, PhaseTimes,
};
use fsgp::model::bound::terms::{terms_sampled, TermSet};
use fsgp::model::kernel::feature_ard::{FeatureInputs, FeatureRows};
use fsgp::model::kernel::{BasisInputs, KernelKind, KernelParams};
use fsgp::model::likelihood::logistic::BernoulliLogistic;
use fsgp::model::natgrad::natural_step;
use fsgp::model::optim::{AdamConfig, AdamState};
use fsgp::model::params::{Params, QForm, QParams};
use fsgp::model::qu::cholesky::pack_factors;
use fsgp::model::qu::conditional::Factorisation;
use fsgp::model::qu::sites::low_rank;
use fsgp::model::scratch::Scratch;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::Instant;

/// One benchmark configuration.
struct Config {
    name: &'static str,
    b: usize,
    m: usize,
    p: usize,
    r: usize,
    k: usize,
    /// Sampled negatives per row; None = all negatives (dense path).
    negatives: Option<usize>,
    factorisation: Factorisation,
    kind: KernelKind,
    /// Subspace ARD (R weights).
    ard: bool,
    form: QForm,
    /// ARD over the features: (D, non-zeros per row); None without.
    features: Option<(usize, usize)>,
}

impl Config {
    /// Whether the step takes the subspace path (the paper's form, linear kernel).
    fn low_rank(&self) -> bool {
        if self.form != QForm::SiteDiagonal || self.kind != KernelKind::Linear {
            return false;
        }
        match self.factorisation {
            Factorisation::Auto => {
                self.kind == KernelKind::Linear && low_rank::worthwhile(self.m, self.r)
            }
            Factorisation::Inducing => false,
            Factorisation::LowRank => true,
        }
    }

    fn opts(&self) -> BoundOptions {
        BoundOptions {
            factorisation: self.factorisation,
            ..BoundOptions::default()
        }
    }
}

/// Floating-point operations of one step as implemented (`docs/model.md`, "Algorithm as
/// implemented"), counting multiply and add separately; the quadrature's transcendental
/// work is not counted. `terms` = number of likelihood terms for the list path.
fn step_flops(c: &Config, terms: Option<usize>) -> f64 {
    let (b, m, p, r, k) = (c.b as f64, c.m as f64, c.p as f64, c.r as f64, c.k as f64);
    // Kernels: A K_X̃, G, H forward; (Ḡ+Ḡᵀ) A K_X̃ and Ḡ_bZᵀ Kxx back.
    // The same GEMMs for every kernel (the SE part's exponentials are not counted).
    let mut kernels =
        2.0 * m * r * r + 2.0 * m * m * r + 2.0 * b * m * r + 2.0 * m * m * r + 2.0 * b * m * r;
    if c.ard {
        // ARD's map: A K_X̃, (Kxx T) K_X̃ forward, (∂A' T) K_X̃, ∂Kxx' K_X̃ back, and the
        // kernel's ∂Kxx' = (∂F/∂H) A'; on the subspace path also ∂Kxx' from ∂G (R²B).
        kernels += 4.0 * m * r * r + 4.0 * b * r * r + 2.0 * b * m * r;
        if c.low_rank() {
            kernels += r * r * b;
        }
    }
    if let Some((d, per_row)) = c.features {
        // Feature ARD (`docs/model.md`, "ARD over the D features"): K'_X̃ and (∂F/∂K'_X̃) X̃
        // (2DR² each), Kxx' and the non-zeros' gradient terms (2·nnz·R each), the kernel's
        // ∂Kxx' = (∂F/∂H) A (2BMR) and ∂K'_X̃ = Aᵀ (∂F/∂G) A (2M²R + 2MR²).
        let (d, nnz) = (d as f64, (per_row * c.b) as f64);
        kernels += 4.0 * d * r * r + 4.0 * nnz * r + 2.0 * b * m * r;
        kernels += 2.0 * m * m * r + 2.0 * m * r * r;
    }
    let per_gp = if c.form != QForm::SiteDiagonal {
        // Full-Cholesky forms (`qu/cholesky.rs`), per GP: T = L_vᵀ A, lower(2 A Uᵀ) and
        // Ā += 2 L_v U, M²B each; unwhitened also L_v = L_Z⁻¹ L_p (M³/3), Y = L_Z⁻ᵀ L̄_v
        // (2M³/3) and lower(Y L_vᵀ) (M³/3). Once per step: Cholesky of K_Z and L_Z⁻¹ (M³/3
        // each), A = L_Z⁻¹ K_Zb and X = L_Z⁻ᵀ Ā (M²B each), X Aᵀ (2M²B), the Cholesky's
        // reverse mode (Lᵀ L̄ M³/3, L⁻ᵀ Φ 2M³/3, (L⁻ᵀΦ) L⁻¹ 2M³).
        kernels += (11.0 / 3.0) * m.powi(3) + 4.0 * m * m * b;
        let unwhitened = if c.form == QForm::Cholesky {
            4.0 / 3.0 * m.powi(3)
        } else {
            0.0
        };
        3.0 * m * m * b + unwhitened
    } else if c.low_rank() {
        // Subspace path: F_sᵀF_s MR², Cholesky, L⁻¹, J⁻¹ R³/3 each, V and W R²B each, the
        // lower triangle of Y diag(d) Yᵀ with Y [R×(R+B)]: R²(R+B), F Ḡ_J 2MR². Once per
        // step: L_X̃ R³/3, F = σ A L_X̃ MR², G R²B, ∂A = σ ∂F L_X̃ᵀ MR².
        kernels += r.powi(3) / 3.0 + 2.0 * m * r * r + r * r * b;
        3.0 * m * r * r + 2.0 * r.powi(3) + 3.0 * r * r * b
    } else {
        // Per GP: Cholesky M³/3, L⁻¹ M³/3, C⁻¹ = L⁻ᵀL⁻¹ M³/3, V and W M²B each, and the
        // lower triangle of Y diag(d) Yᵀ with Y [M×(M+B)]: M²(M+B).
        2.0 * m.powi(3) + 3.0 * m * m * b
    };
    // m, K_Z μ, ∂μ (two), G_m μᵀ, μμᵀ.
    let small = 2.0 * p * (3.0 * b * m + 3.0 * m * m);
    let likelihood = match terms {
        None => 12.0 * b * k * p,
        Some(t) => 10.0 * t as f64 * p,
    };
    p * per_gp + kernels + small + likelihood
}

fn run(c: &Config, steps: usize, gemm: f64) {
    let (b, m, p, r, k) = (c.b, c.m, c.p, c.r, c.k);
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut u = |s: f64| (rng.random::<f64>() - 0.5) * s;
    let kxx = Mat::from_fn(b, r, |_, _| u(0.2));
    let norms: Vec<f64> = (0..b).map(|_| 1.0).collect();
    let kt = Mat::<f64>::identity(r, r);
    let mut params = Params {
        logit_epsilon: None,
        a: Mat::from_fn(m, r, |_, _| u(0.2)),
        q: QParams::Sites {
            mu: Mat::from_fn(m, p, |_, _| u(0.1)),
            rho: Mat::from_fn(m, p, |_, _| u(1.0)),
        },
        phi: Mat::from_fn(k, p, |_, _| u(0.4)),
        bias: (0..k).map(|_| -3.0).collect(),
        kernel: KernelParams {
            log_lin2: (c.kind == KernelKind::SePlusLinear).then_some(-0.7),
            log_ard: if c.ard {
                (0..r).map(|_| u(0.5)).collect()
            } else {
                Vec::new()
            },
            ..KernelParams::new(0.0, 0.0)
        },
        amortiser: None,
    };
    if c.form != QForm::SiteDiagonal {
        // A well-conditioned lower-triangular factor per GP (the value does not change the
        // cost); the unwhitened form is benchmarked with the SE kernel, whose K_Z is
        // non-singular.
        let factors: Vec<Mat<f64>> = (0..p)
            .map(|_| {
                Mat::from_fn(m, m, |i, j| {
                    if i == j {
                        1.0
                    } else if i > j {
                        u(0.01)
                    } else {
                        0.0
                    }
                })
            })
            .collect();
        params.set_full(pack_factors(&factors, c.form == QForm::Whitened));
    }
    let mut lrng = ChaCha8Rng::seed_from_u64(2);
    let positives: Vec<Vec<u32>> = (0..b)
        .map(|_| {
            let mut v: Vec<u32> = (0..19).map(|_| lrng.random_range(0..k as u32)).collect();
            v.sort_unstable();
            v.dedup();
            v
        })
        .collect();
    let scale = 12920.0 / b as f64;
    let lik = BernoulliLogistic::new(20).unwrap();
    let x = BasisInputs {
        kxx_b: kxx.as_ref().into(),
        sq_norms: &norms,
        k_tilde: kt.as_ref().into(),
    };
    let (rows, basis) = feature_inputs(c, &mut u);
    if let Some((d, _)) = c.features {
        params.kernel.log_features = (0..d).map(|_| u(0.5)).collect();
    }
    let fx = c.features.map(|_| FeatureInputs {
        rows: &rows,
        basis: basis.as_ref(),
    });
    let mut adam = AdamState::new(&params);
    let cfg = AdamConfig::default();
    // One arena for all steps, as the trainer keeps one.
    let scratch = Scratch::new();
    let mut best = (f64::INFINITY, PhaseTimes::default(), 0.0, 0usize);
    for step in 0..steps {
        let t = Instant::now();
        // Sampling the negatives is part of the step, as in the trainer.
        let list = c.negatives.map(|n| {
            let mut srng = ChaCha8Rng::seed_from_u64(100 + step as u64);
            terms_sampled(&positives, k, n, scale, &mut srng)
        });
        let terms = match &list {
            None => TermSet::AllLabels {
                positives: &positives,
                scale,
            },
            Some(l) => TermSet::List(l),
        };
        let ev = evaluate(c, &params, &x, fx.as_ref(), &terms, &lik, &scratch);
        let t_adam = Instant::now();
        adam.step(&cfg, &mut params, &ev.grads, &|_| false);
        let adam_s = t_adam.elapsed().as_secs_f64();
        let secs = t.elapsed().as_secs_f64();
        if secs < best.0 {
            best = (secs, ev.times, adam_s, list.as_ref().map_or(0, |l| l.len()));
        }
    }
    let (secs, ph, adam_s, n_terms) = best;
    let inputs = (&x, fx.as_ref());
    let identical = same_bits_in_one_thread(c, &params, inputs, &positives, scale, &lik, &scratch);
    let flops = step_flops(c, c.negatives.map(|_| n_terms));
    let negs = match c.negatives {
        None => "all negatives".to_string(),
        Some(n) => format!("{n} sampled negatives/row"),
    };
    let path = match (c.form, c.kind) {
        (QForm::SiteDiagonal, _) if c.low_rank() => "subspace J_p".to_string(),
        (QForm::SiteDiagonal, _) => "C_p = K_Z + Σ_p".to_string(),
        (form, _) => format!("--q-form {}", form.name()),
    };
    let kernel = match (c.kind, c.ard) {
        (KernelKind::Linear, false) if c.features.is_some() => "linear + feature ARD",
        (KernelKind::Linear, false) => "linear",
        (KernelKind::Linear, true) => "linear + subspace ARD",
        (KernelKind::SquaredExponential, false) => "SE",
        (KernelKind::SquaredExponential, true) => "SE + subspace ARD",
        (KernelKind::SePlusLinear, false) => "SE+linear",
        (KernelKind::SePlusLinear, true) => "SE+linear + subspace ARD",
    };
    println!(
        "| {} {kernel} (B={b}, M={m}, P={p}, R={r}, K={k}, {negs}; {path}) | {secs:.3} | {:.1} | {:.1} | {gemm:.1} | {:.0} % | {:.3} / {:.3} / {:.3} / {:.3} / {:.3} / {adam_s:.3} |",
        c.name,
        flops / 1e9,
        flops / secs / 1e9,
        100.0 * flops / secs / 1e9 / gemm,
        ph.kernel_fwd,
        ph.variational_fwd,
        ph.likelihood,
        ph.variational_bwd,
        ph.kernel_bwd,
    );
    println!(
        "  (same bits with 1 thread as with {}: {})",
        threads(),
        if identical { "yes" } else { "NO" }
    );
    json_line(&serde_json::json!({
        "configuration": format!("{} {kernel} (B={b}, M={m}, P={p}, R={r}, K={k}, {negs}; {path})", c.name),
        "name": c.name,
        "seconds_per_step": secs,
        "step_gflop": flops / 1e9,
        "gemm_gflops": gemm,
        "phases": {
            "kernel_fwd": ph.kernel_fwd,
            "variational_fwd": ph.variational_fwd,
            "likelihood": ph.likelihood,
            "variational_bwd": ph.variational_bwd,
            "kernel_bwd": ph.kernel_bwd,
            "adam": adam_s,
        },
        "same_bits_one_thread": identical,
        "threads": threads(),
    }));
}

/// Appends `value` as one line to the file `FSGP_BENCH_JSON` names, when it names one: the
/// figures scripts read (scripts/profile-table.py), beside the table printed for people.
fn json_line(value: &serde_json::Value) {
    let Ok(path) = std::env::var("FSGP_BENCH_JSON") else {
        return;
    };
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("FSGP_BENCH_JSON={path}: {e}"));
    writeln!(file, "{value}").unwrap_or_else(|e| panic!("FSGP_BENCH_JSON={path}: {e}"));
}

/// Random sparse rows [B×D] with `per_row` distinct features each and a random basis
/// [R×D] for a feature-ARD row (empty otherwise).
fn feature_inputs(c: &Config, u: &mut impl FnMut(f64) -> f64) -> (FeatureRows, Mat<f64>) {
    let mut rows = FeatureRows::new();
    let Some((d, per_row)) = c.features else {
        return (rows, Mat::new());
    };
    let mut frng = ChaCha8Rng::seed_from_u64(3);
    for _ in 0..c.b {
        let mut ids: Vec<u32> = (0..per_row)
            .map(|_| frng.random_range(0..d as u32))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        let values: Vec<f64> = ids.iter().map(|_| u(0.5)).collect();
        rows.push_row(&ids, values);
    }
    (rows, Mat::from_fn(c.r, d, |_, _| u(0.1)))
}

/// One evaluation of the bound as the trainer makes it for this configuration.
fn evaluate(
    c: &Config,
    params: &Params,
    x: &BasisInputs<'_>,
    fx: Option<&FeatureInputs<'_>>,
    terms: &TermSet<'_>,
    lik: &BernoulliLogistic,
    scratch: &Scratch,
) -> BoundAndGrads {
    match fx {
        None => bound_and_grads(c.kind, params, x, terms, lik, &c.opts(), scratch).unwrap(),
        Some(fx) => {
            bound_and_grads_feature_ard(c.kind, params, fx, terms, lik, &c.opts(), scratch).unwrap()
        }
    }
}

/// Evaluates the step's bound once in the ambient pool and once in a 1-thread pool and
/// compares value and gradients bit for bit (the model's determinism promise, at full size).
fn same_bits_in_one_thread(
    c: &Config,
    params: &Params,
    (x, fx): (&BasisInputs<'_>, Option<&FeatureInputs<'_>>),
    positives: &[Vec<u32>],
    scale: f64,
    lik: &BernoulliLogistic,
    scratch: &Scratch,
) -> bool {
    let list = c.negatives.map(|n| {
        let mut srng = ChaCha8Rng::seed_from_u64(7);
        terms_sampled(positives, c.k, n, scale, &mut srng)
    });
    let terms = match &list {
        None => TermSet::AllLabels { positives, scale },
        Some(l) => TermSet::List(l),
    };
    let eval = || evaluate(c, params, x, fx, &terms, lik, scratch);
    let many = eval();
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap()
        .install(eval);
    many.value.to_bits() == one.value.to_bits() && many.grads == one.grads
}

fn main() {
    let steps: usize = std::env::var("FSGP_BENCH_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    // As the trainer: faer's own kernels parallel on the rayon pool.
    faer::set_global_parallelism(faer::Par::rayon(0));
    let gemm = common::gemm_gflops(1000);
    println!(
        "train step (bound + gradients + Adam), best of {steps}, {} cores",
        threads()
    );
    println!("targets: Delicious ≤ 0.25 s, AmazonCat-like ≤ 0.5 s, ≥ 50 % of the GEMM rate");
    println!("| configuration | s/step | step GFLOP | achieved GFLOP/s | faer f64 GEMM GFLOP/s | fraction | phases: kernel fwd / variational fwd / likelihood / variational bwd / kernel bwd / Adam (s) |");
    println!("|---|---|---|---|---|---|---|");
    let configs = [
        Config {
            name: "Delicious",
            b: 500,
            m: 500,
            p: 30,
            r: 250,
            k: 983,
            negatives: None,
            factorisation: Factorisation::Auto,
            kind: KernelKind::Linear,
            ard: false,
            form: QForm::SiteDiagonal,
            features: None,
        },
        Config {
            name: "Delicious",
            b: 500,
            m: 500,
            p: 30,
            r: 250,
            k: 983,
            negatives: None,
            factorisation: Factorisation::Inducing,
            kind: KernelKind::Linear,
            ard: false,
            form: QForm::SiteDiagonal,
            features: None,
        },
        Config {
            name: "AmazonCat-like",
            b: 500,
            m: 500,
            p: 30,
            r: 2000,
            k: 13330,
            negatives: None,
            factorisation: Factorisation::Auto,
            kind: KernelKind::Linear,
            ard: false,
            form: QForm::SiteDiagonal,
            features: None,
        },
        Config {
            name: "AmazonCat-like",
            b: 500,
            m: 500,
            p: 30,
            r: 2000,
            k: 13330,
            negatives: Some(1000),
            factorisation: Factorisation::Auto,
            kind: KernelKind::Linear,
            ard: false,
            form: QForm::SiteDiagonal,
            features: None,
        },
    ];
    let delicious = |kind, ard, form| Config {
        name: "Delicious",
        b: 500,
        m: 500,
        p: 30,
        r: 250,
        k: 983,
        negatives: None,
        factorisation: Factorisation::Auto,
        kind,
        ard,
        form,
        features: None,
    };
    let extra_rows = [
        delicious(KernelKind::SquaredExponential, false, QForm::SiteDiagonal),
        delicious(KernelKind::SePlusLinear, false, QForm::SiteDiagonal),
        delicious(KernelKind::Linear, true, QForm::SiteDiagonal),
        delicious(KernelKind::SePlusLinear, true, QForm::SiteDiagonal),
        delicious(KernelKind::Linear, false, QForm::Whitened),
        delicious(KernelKind::SquaredExponential, false, QForm::Whitened),
        delicious(KernelKind::SquaredExponential, false, QForm::Cholesky),
    ];
    // Free Z: the identity basis (R = D = 500); the step's shapes are those of a subspace
    // of R = 500 directions, so these rows differ from the ones above only in R.
    let free_z = |kind, form| Config {
        name: "Delicious free Z",
        r: 500,
        ..delicious(kind, false, form)
    };
    let free_rows = [
        free_z(KernelKind::Linear, QForm::SiteDiagonal),
        free_z(KernelKind::SquaredExponential, QForm::SiteDiagonal),
        free_z(KernelKind::Linear, QForm::Whitened),
        free_z(KernelKind::SquaredExponential, QForm::Whitened),
        free_z(KernelKind::SquaredExponential, QForm::Cholesky),
    ];
    // ARD over the features at Delicious's D = 500 (18 features per row, the training
    // rows' 17.9 on average): the trainer takes C_p for it.
    let feature_rows = [Config {
        name: "Delicious",
        factorisation: Factorisation::Inducing,
        features: Some((500, 18)),
        ..delicious(KernelKind::Linear, false, QForm::SiteDiagonal)
    }];
    let only: Option<String> = std::env::var("FSGP_BENCH_ONLY").ok();
    let all = configs.iter().chain(&extra_rows).chain(&free_rows);
    for c in all.chain(&feature_rows) {
        let row = format!(
            "{:?}",
            (
                c.form,
                c.kind,
                c.ard,
                c.r,
                c.negatives,
                c.factorisation,
                c.features
            )
        );
        if only.as_ref().is_some_and(|o| !row.contains(o.as_str())) {
            continue;
        }
        run(c, steps, gemm);
    }
    if only.as_ref().is_none_or(|o| o == "natural") {
        natural_rows(steps, gemm);
    }
}

/// The natural-gradient step alone (`model::natgrad::natural_step`) at M×P shapes: L̄ small
/// and random, so W = I − 2γC stays positive definite as it does in training.
fn natural_rows(steps: usize, gemm: f64) {
    println!();
    println!("| natural step (whitened q(u)) | s/step | GFLOP | achieved GFLOP/s | faer f64 GEMM GFLOP/s | fraction |");
    println!("|---|---|---|---|---|---|");
    for (m, p) in [(500usize, 30usize), (200, 1)] {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut u = |s: f64| (rng.random::<f64>() - 0.5) * s;
        let mut lower = |diag: f64, off: f64| -> Vec<Mat<f64>> {
            (0..p)
                .map(|_| {
                    Mat::from_fn(m, m, |i, j| match i.cmp(&j) {
                        std::cmp::Ordering::Equal => diag + u(off),
                        std::cmp::Ordering::Greater => u(off),
                        std::cmp::Ordering::Less => 0.0,
                    })
                })
                .collect()
        };
        let (l, l_bar) = (lower(1.0, 0.01), lower(0.0, 0.01));
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        let mut mean = || Mat::from_fn(m, p, |_, _| rng.random::<f64>() - 0.5);
        let q = QParams::Full {
            mu: mean(),
            chol: pack_factors(&l, true),
        };
        let grads = QParams::Full {
            mu: mean(),
            chol: pack_factors(&l_bar, true),
        };
        let mut best = f64::INFINITY;
        for _ in 0..steps.max(1) {
            let mut stepped = q.clone();
            let t = Instant::now();
            natural_step(&mut stepped, &grads, 0.1).expect("W stays positive definite");
            best = best.min(t.elapsed().as_secs_f64());
        }
        let flops = 4.0 / 3.0 * (m as f64).powi(3) * p as f64;
        println!(
            "| M={m}, P={p} | {best:.4} | {:.2} | {:.1} | {gemm:.1} | {:.0} % |",
            flops / 1e9,
            flops / best / 1e9,
            100.0 * flops / best / 1e9 / gemm
        );
        json_line(&serde_json::json!({
            "configuration": format!("natural step, M={m}, P={p}"),
            "name": "natural",
            "seconds_per_step": best,
            "step_gflop": flops / 1e9,
            "gemm_gflops": gemm,
            "threads": threads(),
        }));
    }
}
