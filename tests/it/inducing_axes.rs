//! Inducing features at the coordinate axes (`--inducing-inputs axes`, `qu/axes.rs`;
//! `docs/model.md`, "Inducing features at the axes"): the linear kernel with Z = I_D.
//!
//! - The axes form (A [0×D], nothing of D×D formed) gives the bound and the gradients of
//!   the paper's form evaluated through C_p with Z = I_D held densely, to 1e-10 relative,
//!   on sparse and dense rows, every negative or sampled ones.
//! - Its analytic gradient against central finite differences, every block.
//! - Prediction (means and variances, and the means alone) equals the dense Z = I_D model's.

use crate::common;
use common::model::{central_differences, flat_entries, mat_rel, rel_error};
use faer::Mat;
use fsgp::model::bound::objective::{bound_and_grads, kl_total, BoundAndGrads, BoundOptions};
use fsgp::model::bound::terms::{terms_all, terms_sampled, TermSet};
use fsgp::model::kernel::feature_ard::FeatureRows;
use fsgp::model::kernel::{BasisInputs, GramRef, KernelKind, KernelParams, Rows};
use fsgp::model::likelihood::logistic::BernoulliLogistic;
use fsgp::model::params::{Block, Params, QParams};
use fsgp::model::predictive::{MeanUtilities, Predictor};
use fsgp::model::qu::axes::on_axes;
use fsgp::model::qu::conditional::Factorisation;
use fsgp::model::scratch::Scratch;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const K: usize = 6;

/// Sparse rows X [B×D] (about a third of the entries zero, and every fourth feature in
/// every row), labels, and axes parameters: μ and ρ [D×P], A [0×D].
struct Problem {
    x: Mat<f64>,
    rows: FeatureRows,
    norms: Vec<f64>,
    params: Params,
    positives: Vec<Vec<u32>>,
}

fn problem(seed: u64, (d, b, p): (usize, usize, usize)) -> Problem {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut u = |s: f64| (rng.random::<f64>() - 0.5) * s;
    // Every fourth feature (j = 3, 7, …) is zero in every row: features the minibatch does
    // not touch, whose gradients are the KL's alone.
    let x = Mat::from_fn(b, d, |i, j| {
        if (i + 2 * j) % 3 == 0 || j % 4 == 3 {
            0.0
        } else {
            u(1.2)
        }
    });
    let rows = FeatureRows::from_dense(x.as_ref());
    let norms = (0..b)
        .map(|i| (0..d).map(|j| x[(i, j)].powi(2)).sum())
        .collect();
    let params = Params {
        logit_epsilon: None,
        a: Mat::zeros(0, d),
        q: QParams::Sites {
            mu: Mat::from_fn(d, p, |_, _| u(1.0)),
            rho: Mat::from_fn(d, p, |_, _| u(2.0)),
        },
        phi: Mat::from_fn(K, p, |_, _| u(1.5)),
        bias: (0..K).map(|_| u(1.0)).collect(),
        kernel: KernelParams::new(u(0.8), 0.0),
        amortiser: None,
    };
    let positives = (0..b)
        .map(|i| (0..K as u32).filter(|k| (i as u32 + k) % 3 == 0).collect())
        .collect();
    Problem {
        x,
        rows,
        norms,
        params,
        positives,
    }
}

impl Problem {
    fn sparse(&self) -> BasisInputs<'_> {
        BasisInputs {
            kxx_b: Rows::Sparse {
                rows: &self.rows,
                width: self.x.ncols(),
            },
            sq_norms: &self.norms,
            k_tilde: GramRef::Identity(self.x.ncols()),
        }
    }

    fn dense(&self) -> BasisInputs<'_> {
        BasisInputs {
            kxx_b: self.x.as_ref().into(),
            sq_norms: &self.norms,
            k_tilde: GramRef::Identity(self.x.ncols()),
        }
    }

    /// The same model with Z = I_D as ordinary inducing inputs (A = I_D [D×D]).
    fn as_inducing(&self) -> Params {
        let d = self.x.ncols();
        let mut params = self.params.clone();
        params.a = Mat::identity(d, d);
        params
    }
}

fn evaluate(params: &Params, x: &BasisInputs<'_>, terms: &TermSet<'_>) -> BoundAndGrads {
    evaluate_with(params, x, terms, &Scratch::new())
}

fn evaluate_with(
    params: &Params,
    x: &BasisInputs<'_>,
    terms: &TermSet<'_>,
    scratch: &Scratch,
) -> BoundAndGrads {
    let lik = BernoulliLogistic::new(20).unwrap();
    let opts = BoundOptions {
        factorisation: Factorisation::Inducing,
        ..BoundOptions::default()
    };
    bound_and_grads(KernelKind::Linear, params, x, terms, &lik, &opts, scratch).unwrap()
}

#[test]
fn axes_give_the_bound_and_gradients_of_z_at_the_identity() {
    let (d, b, p) = (7, 9, 3);
    for seed in 0..3u64 {
        for sampled in [false, true] {
            let pr = problem(300 + seed, (d, b, p));
            assert!(on_axes(&pr.params));
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let terms = match sampled {
                true => terms_sampled(&pr.positives, K, 2, 3.0, &mut rng),
                false => terms_all(&pr.positives, K, 2.5),
            };
            let terms = TermSet::List(&terms);
            let reference = pr.as_inducing();
            assert!(!on_axes(&reference));
            let by_z = evaluate(&reference, &pr.sparse(), &terms);
            for (shape, x) in [("sparse", pr.sparse()), ("dense", pr.dense())] {
                let by_axes = evaluate(&pr.params, &x, &terms);
                let label = format!("seed {seed} sampled={sampled} {shape} rows");
                let diff = rel_error(by_axes.value, by_z.value, 1e-12);
                assert!(
                    diff <= 1e-10,
                    "{label}: bound {} (axes) vs {} (Z = I), relative {diff:e}",
                    by_axes.value,
                    by_z.value
                );
                assert!(
                    rel_error(by_axes.kl, by_z.kl, 1e-12) <= 1e-10,
                    "{label}: KL"
                );
                for (name, x, y) in [
                    ("μ", by_axes.grads.q.mu(), by_z.grads.q.mu()),
                    (
                        "ρ",
                        by_axes.grads.q.rho().unwrap(),
                        by_z.grads.q.rho().unwrap(),
                    ),
                    ("Φ", &by_axes.grads.phi, &by_z.grads.phi),
                ] {
                    let e = mat_rel(x, y);
                    assert!(e <= 1e-10, "{label} ∂{name}: {e:e}");
                }
                for (k, (x, y)) in by_axes.grads.bias.iter().zip(&by_z.grads.bias).enumerate() {
                    assert!(rel_error(*x, *y, 1e-12) <= 1e-10, "{label} ∂b[{k}]");
                }
                let (x, y) = (by_axes.grads.kernel.log_sf2, by_z.grads.kernel.log_sf2);
                assert!(
                    rel_error(x, y, 1e-12) <= 1e-10,
                    "{label} ∂log σ²: {x} vs {y}"
                );
                assert_eq!(
                    by_axes.grads.a.nrows(),
                    0,
                    "{label}: A has nothing to train"
                );
                eprintln!("{label}: bound relative difference {diff:.1e}");
            }
        }
    }
}

/// The gradient matrices a step takes from the scratch arena hold whatever an earlier step
/// left (the trainer hands them back): the result must not depend on it. Here they hold
/// NaN; a stale entry would show in the bits.
#[test]
fn gradients_in_recycled_buffers_are_those_of_fresh_ones() {
    let (d, b, p) = (9, 5, 3);
    let pr = problem(330, (d, b, p));
    let terms = terms_all(&pr.positives, K, 2.0);
    let terms = TermSet::List(&terms);
    let fresh = evaluate(&pr.params, &pr.sparse(), &terms);
    let scratch = Scratch::new();
    for _ in 0..2 {
        scratch.give_mat(Mat::from_fn(d, p, |_, _| f64::NAN));
    }
    let mut previous = None;
    for step in 0..3 {
        let again = evaluate_with(&pr.params, &pr.sparse(), &terms, &scratch);
        assert_eq!(again.value.to_bits(), fresh.value.to_bits(), "step {step}");
        for (name, x, y) in [
            ("μ", again.grads.q.mu(), fresh.grads.q.mu()),
            (
                "ρ",
                again.grads.q.rho().unwrap(),
                fresh.grads.q.rho().unwrap(),
            ),
        ] {
            for (j, k) in (0..d).flat_map(|j| (0..p).map(move |k| (j, k))) {
                assert_eq!(
                    x[(j, k)].to_bits(),
                    y[(j, k)].to_bits(),
                    "step {step}: ∂{name}[{j}, {k}]"
                );
            }
        }
        assert_eq!(
            again.grads.kernel.log_sf2.to_bits(),
            fresh.grads.kernel.log_sf2.to_bits()
        );
        // Hand them back as the trainer does, after the previous step's.
        if let Some(ev) = previous.replace(again) {
            BoundAndGrads::recycle(ev, &scratch);
        }
    }
}

#[test]
fn axes_gradient_matches_central_differences() {
    for sampled in [false, true] {
        let pr = problem(320 + sampled as u64, (5, 6, 2));
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let terms = match sampled {
            true => terms_sampled(&pr.positives, K, 2, 3.0, &mut rng),
            false => terms_all(&pr.positives, K, 3.0),
        };
        let value = |q: &Params| evaluate(q, &pr.sparse(), &TermSet::List(&terms)).value;
        let grads = evaluate(&pr.params, &pr.sparse(), &TermSet::List(&terms)).grads;
        let fds = central_differences(&pr.params, 2e-5, value);
        let mut seen = Vec::new();
        for (idx, ((block, analytic), fd)) in flat_entries(&grads).into_iter().zip(fds).enumerate()
        {
            if !seen.contains(&block) {
                seen.push(block);
            }
            if block == Block::LogEll {
                assert_eq!(analytic, 0.0);
                continue;
            }
            let err = rel_error(analytic, fd, 1e-4);
            assert!(
                err <= 1e-6,
                "sampled={sampled} {block}[{idx}]: analytic {analytic} vs fd {fd}"
            );
        }
        assert_eq!(
            seen,
            [
                Block::Mu,
                Block::Rho,
                Block::Phi,
                Block::Bias,
                Block::LogSf2,
                Block::LogEll
            ]
        );
    }
}

#[test]
fn axes_kl_alone_equals_the_bound_s_kl() {
    let pr = problem(340, (6, 4, 3));
    let terms = terms_all(&pr.positives, K, 1.0);
    let with_rows = evaluate(&pr.params, &pr.sparse(), &TermSet::List(&terms)).kl;
    let alone = kl_total(
        KernelKind::Linear,
        &pr.params,
        GramRef::Identity(6),
        &Scratch::new(),
    )
    .unwrap();
    assert!(
        rel_error(with_rows, alone, 1e-12) <= 1e-13,
        "{with_rows} vs {alone}"
    );
}

#[test]
fn axes_predictions_equal_the_dense_identity_ones() {
    let (d, b, p) = (6, 9, 3);
    let pr = problem(360, (d, b, p));
    let reference = pr.as_inducing();
    let identity = Mat::<f64>::identity(d, d);
    let by_z = Predictor::new(KernelKind::Linear, &reference, &identity).unwrap();
    let (mean_z, var_z) = by_z.mean_and_variance(&pr.dense());
    let by_axes = Predictor::new(KernelKind::Linear, &pr.params, GramRef::Identity(d)).unwrap();
    let means_only = MeanUtilities::new(KernelKind::Linear, &pr.params, GramRef::Identity(d))
        .unwrap()
        .at(&pr.sparse());
    for (shape, x) in [("sparse", pr.sparse()), ("dense", pr.dense())] {
        let (mean_a, var_a) = by_axes.mean_and_variance(&x);
        for (name, x, y) in [("mean", &mean_a, &mean_z), ("variance", &var_a, &var_z)] {
            let diff = mat_rel(x, y);
            assert!(diff <= 1e-10, "{shape} {name}: {diff:e}");
        }
    }
    assert!(mat_rel(&means_only, &mean_z) <= 1e-10);
}

#[test]
fn axes_refuse_other_kernels() {
    let pr = problem(380, (4, 3, 2));
    let terms = terms_all(&pr.positives, K, 1.0);
    let lik = BernoulliLogistic::new(20).unwrap();
    for kind in [KernelKind::SquaredExponential, KernelKind::SePlusLinear] {
        let mut params = pr.params.clone();
        if kind == KernelKind::SePlusLinear {
            params.kernel.log_lin2 = Some(0.0);
        }
        let err = bound_and_grads(
            kind,
            &params,
            &pr.sparse(),
            &TermSet::List(&terms),
            &lik,
            &BoundOptions::default(),
            &Scratch::new(),
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("linear kernel"), "{err:#}");
    }
}
