//! Free inducing inputs as the identity basis (`docs/model.md`, "Free inducing inputs: the
//! identity basis"): Z [M×D] trained against dense rows X_b [B×D] with K_X̃ = I_D.
//!
//! - A subspace model with a full-rank orthonormal basis X̃ [D×D] and A = Z X̃ᵀ is the same
//!   model as the identity basis with Z: same bound to 1e-9 relative, and ∂Z = ∂A X̃, for
//!   both kernels and both factorisation paths.
//! - The identity basis's analytic gradient, ∂Z included, against central finite
//!   differences, for both kernels and both factorisation paths.
//! - The sparse path (rows in CSR, K_X̃ = I_D never materialised) gives the dense path's
//!   bound and gradients to 1e-10 relative, and its gradient matches finite differences.

use crate::common;
use common::model::{central_differences, flat_entries, mat_rel, random_site_params, rel_error};
use faer::Mat;
use fsgp::model::bound::objective::{bound_and_grads, BoundAndGrads, BoundOptions};
use fsgp::model::bound::terms::{terms_all, terms_sampled, Term, TermSet};
use fsgp::model::kernel::feature_ard::FeatureRows;
use fsgp::model::kernel::{BasisInputs, GramRef, KernelKind, Rows};
use fsgp::model::likelihood::logistic::BernoulliLogistic;
use fsgp::model::params::{Block, Params};
use fsgp::model::predictive::{MeanUtilities, Predictor};
use fsgp::model::qu::cholesky::pack_factors;
use fsgp::model::qu::conditional::Factorisation;
use fsgp::model::scratch::Scratch;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const K: usize = 6;

/// Every (kernel, factorisation) pair: linear through C_p and through the subspace J_p
/// (which, with K_X̃ = I_D, factorises I_D), squared exponential through C_p.
const SETUPS: [(KernelKind, Factorisation); 3] = [
    (KernelKind::Linear, Factorisation::Inducing),
    (KernelKind::Linear, Factorisation::LowRank),
    (KernelKind::SquaredExponential, Factorisation::Inducing),
];

/// Dense rows X [B×D] with some zero features (as densified sparse rows are), their exact
/// squared norms, and parameters with Z [M×D]. D ≤ ¾M so the subspace path applies.
struct Problem {
    x: Mat<f64>,
    norms: Vec<f64>,
    params: Params,
    positives: Vec<Vec<u32>>,
}

fn problem(seed: u64, (m, d, b, p): (usize, usize, usize, usize)) -> Problem {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut u = |s: f64| (rng.random::<f64>() - 0.5) * s;
    let x = Mat::from_fn(b, d, |i, j| if (i + 2 * j) % 3 == 0 { 0.0 } else { u(1.2) });
    let norms = (0..b)
        .map(|i| (0..d).map(|j| x[(i, j)].powi(2)).sum())
        .collect();
    let params = random_site_params(&mut u, (m, d, p, K));
    let positives = (0..b)
        .map(|i| (0..K as u32).filter(|k| (i as u32 + k) % 3 == 0).collect())
        .collect();
    Problem {
        x,
        norms,
        params,
        positives,
    }
}

/// An orthonormal basis X̃ [D×D] (rows), by modified Gram–Schmidt on a random matrix.
fn orthonormal_basis(d: usize, seed: u64) -> Mat<f64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut q = Mat::from_fn(d, d, |_, _| rng.random::<f64>() - 0.5);
    for i in 0..d {
        for k in 0..i {
            let dot: f64 = (0..d).map(|j| q[(i, j)] * q[(k, j)]).sum();
            for j in 0..d {
                q[(i, j)] -= dot * q[(k, j)];
            }
        }
        let norm = (0..d).map(|j| q[(i, j)].powi(2)).sum::<f64>().sqrt();
        for j in 0..d {
            q[(i, j)] /= norm;
        }
    }
    q
}

fn evaluate(
    (kind, fact): (KernelKind, Factorisation),
    params: &Params,
    x: &BasisInputs<'_>,
    terms: &TermSet<'_>,
) -> BoundAndGrads {
    let lik = BernoulliLogistic::new(20).unwrap();
    let opts = BoundOptions {
        factorisation: fact,
        ..BoundOptions::default()
    };
    bound_and_grads(kind, params, x, terms, &lik, &opts, &Scratch::new()).unwrap()
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / a.abs().max(b.abs()).max(1e-12)
}

#[test]
fn subspace_at_full_rank_equals_the_identity_basis_with_the_equivalent_z() {
    let (m, d, b, p) = (8, 5, 7, 3);
    for (s, setup) in SETUPS.into_iter().enumerate() {
        let pr = problem(40 + s as u64, (m, d, b, p));
        let basis = orthonormal_basis(d, 90 + s as u64);
        let terms = terms_all(&pr.positives, K, 2.5);
        let terms = TermSet::List(&terms);
        // Identity basis: X_b itself, K_X̃ = I_D, Z = params.a.
        let identity = Mat::<f64>::identity(d, d);
        let free = BasisInputs {
            kxx_b: pr.x.as_ref().into(),
            sq_norms: &pr.norms,
            k_tilde: identity.as_ref().into(),
        };
        let by_z = evaluate(setup, &pr.params, &free, &terms);
        // The same model through the basis: Kxx_b = X_b X̃ᵀ, K_X̃ = X̃X̃ᵀ, A = Z X̃ᵀ.
        let kxx = &pr.x * basis.transpose();
        let k_tilde = &basis * basis.transpose();
        let mut subspace_params = pr.params.clone();
        subspace_params.a = &pr.params.a * basis.transpose();
        let through_basis = BasisInputs {
            kxx_b: kxx.as_ref().into(),
            sq_norms: &pr.norms,
            k_tilde: k_tilde.as_ref().into(),
        };
        let by_a = evaluate(setup, &subspace_params, &through_basis, &terms);
        let bound_diff = rel(by_z.value, by_a.value);
        assert!(
            bound_diff <= 1e-9,
            "{setup:?}: bound {} (identity) vs {} (basis), relative {bound_diff:e}",
            by_z.value,
            by_a.value
        );
        // Z = A X̃, so ∂F/∂Z = ∂F/∂A X̃; every other block is the same.
        let dz_from_a = &by_a.grads.a * &basis;
        let grad_diff = mat_rel(&by_z.grads.a, &dz_from_a);
        assert!(
            grad_diff <= 1e-9,
            "{setup:?}: ∂Z vs ∂A X̃ differ by {grad_diff:e}"
        );
        for (name, x, y) in [
            ("μ", by_z.grads.q.mu(), by_a.grads.q.mu()),
            (
                "ρ",
                by_z.grads.q.rho().unwrap(),
                by_a.grads.q.rho().unwrap(),
            ),
            ("Φ", &by_z.grads.phi, &by_a.grads.phi),
        ] {
            assert!(
                mat_rel(x, y) <= 1e-9,
                "{setup:?} ∂{name}: {:e}",
                mat_rel(x, y)
            );
        }
        assert!(rel(by_z.grads.kernel.log_sf2, by_a.grads.kernel.log_sf2) <= 1e-9);
        assert!(rel(by_z.grads.kernel.log_ell, by_a.grads.kernel.log_ell) <= 1e-9);
        eprintln!(
            "{setup:?}: bound {:.17e} vs {:.17e}, relative difference {bound_diff:.1e}, ∂Z {grad_diff:.1e}",
            by_z.value, by_a.value
        );
    }
}

fn value(setup: (KernelKind, Factorisation), pr: &Problem, params: &Params, terms: &[Term]) -> f64 {
    let identity = Mat::<f64>::identity(pr.x.ncols(), pr.x.ncols());
    let x = BasisInputs {
        kxx_b: pr.x.as_ref().into(),
        sq_norms: &pr.norms,
        k_tilde: identity.as_ref().into(),
    };
    evaluate(setup, params, &x, &TermSet::List(terms)).value
}

#[test]
fn identity_basis_gradient_matches_central_differences() {
    for (s, setup) in SETUPS.into_iter().enumerate() {
        for sampled in [false, true] {
            let pr = problem(60 + 2 * s as u64 + sampled as u64, (6, 4, 5, 2));
            let mut rng = ChaCha8Rng::seed_from_u64(3);
            let terms = if sampled {
                terms_sampled(&pr.positives, K, 2, 3.0, &mut rng)
            } else {
                terms_all(&pr.positives, K, 3.0)
            };
            let identity = Mat::<f64>::identity(4, 4);
            let x = BasisInputs {
                kxx_b: pr.x.as_ref().into(),
                sq_norms: &pr.norms,
                k_tilde: identity.as_ref().into(),
            };
            let grads = evaluate(setup, &pr.params, &x, &TermSet::List(&terms)).grads;
            let h = 2e-5;
            let fds = central_differences(&pr.params, h, |q| value(setup, &pr, q, &terms));
            let (mut worst, mut worst_z) = (0.0f64, 0.0f64);
            for (idx, ((name, analytic), fd)) in
                flat_entries(&grads).into_iter().zip(fds).enumerate()
            {
                if setup.0 == KernelKind::Linear && name == Block::LogEll {
                    assert_eq!(analytic, 0.0);
                    continue;
                }
                // Entries below 1e-3 are compared to 1e-9 absolute: the differences' own
                // rounding is that large here (μ[32] of the linear kernel, 2.5e-4: its
                // difference moved by 3.5e-10 from h = 2e-5 to 1e-5, as much as it
                // differed from the analytic entry once the terms' summation order
                // changed).
                let err = rel_error(analytic, fd, 1e-3);
                assert!(
                    err <= 1e-6,
                    "{setup:?} sampled={sampled} {name}[{idx}]: analytic {analytic} vs fd {fd}"
                );
                worst = worst.max(err);
                if name == Block::A {
                    worst_z = worst_z.max(err);
                }
            }
            eprintln!(
                "{setup:?} sampled={sampled}: worst relative error {worst:.1e} (∂Z {worst_z:.1e})"
            );
        }
    }
}

/// The rows of `x` in CSR, zeros left out (as ingest stores them).
fn sparse_of(x: &Mat<f64>) -> FeatureRows {
    FeatureRows::from_dense(x.as_ref())
}

/// The identity basis as training and prediction feed it: the rows sparse, K_X̃ = I_D a
/// marker (`kernel/input_space.rs`).
fn sparse_inputs<'a>(pr: &'a Problem, rows: &'a FeatureRows) -> BasisInputs<'a> {
    BasisInputs {
        kxx_b: Rows::Sparse {
            rows,
            width: pr.x.ncols(),
        },
        sq_norms: &pr.norms,
        k_tilde: GramRef::Identity(pr.x.ncols()),
    }
}

/// Sparse rows with the identity marker give the bound and every gradient block of the
/// densified rows with a dense I_D, to 1e-10 relative: both factorisation paths, SE, and
/// subspace ARD (one weight per feature) on top.
#[test]
fn sparse_rows_give_the_dense_identity_bound_and_gradients() {
    let (m, d, b, p) = (8, 6, 9, 3);
    for (s, setup) in SETUPS.into_iter().enumerate() {
        for ard in [false, true] {
            let mut pr = problem(140 + s as u64, (m, d, b, p));
            if ard {
                pr.params.kernel.log_ard = (0..d).map(|j| 0.3 * j as f64 - 0.7).collect();
            }
            let terms = terms_all(&pr.positives, K, 2.5);
            let terms = TermSet::List(&terms);
            let identity = Mat::<f64>::identity(d, d);
            let dense = BasisInputs {
                kxx_b: pr.x.as_ref().into(),
                sq_norms: &pr.norms,
                k_tilde: identity.as_ref().into(),
            };
            let rows = sparse_of(&pr.x);
            let by_dense = evaluate(setup, &pr.params, &dense, &terms);
            let by_sparse = evaluate(setup, &pr.params, &sparse_inputs(&pr, &rows), &terms);
            let bound_diff = rel(by_sparse.value, by_dense.value);
            assert!(
                bound_diff <= 1e-10,
                "{setup:?} ard={ard}: bound {} (sparse) vs {} (dense), {bound_diff:e}",
                by_sparse.value,
                by_dense.value
            );
            let (mut worst, scale) = (0.0f64, 1e-8);
            for ((block, x), (_, y)) in flat_entries(&by_sparse.grads)
                .into_iter()
                .zip(flat_entries(&by_dense.grads))
            {
                let err = rel_error(x, y, scale);
                assert!(err <= 1e-10, "{setup:?} ard={ard} ∂{block}: {x} vs {y}");
                worst = worst.max(err);
            }
            eprintln!(
                "{setup:?} ard={ard}: bound relative difference {bound_diff:.1e}, worst gradient entry {worst:.1e}"
            );
        }
    }
}

/// The sparse path's analytic gradient, ∂Z included, against central finite differences.
#[test]
fn sparse_path_gradient_matches_central_differences() {
    for (s, setup) in SETUPS.into_iter().enumerate() {
        let pr = problem(160 + s as u64, (6, 4, 5, 2));
        let rows = sparse_of(&pr.x);
        let terms = terms_all(&pr.positives, K, 3.0);
        let value = |q: &Params| {
            evaluate(setup, q, &sparse_inputs(&pr, &rows), &TermSet::List(&terms)).value
        };
        let grads = evaluate(
            setup,
            &pr.params,
            &sparse_inputs(&pr, &rows),
            &TermSet::List(&terms),
        )
        .grads;
        let fds = central_differences(&pr.params, 2e-5, value);
        let mut worst_z = 0.0f64;
        for (idx, ((name, analytic), fd)) in flat_entries(&grads).into_iter().zip(fds).enumerate() {
            if setup.0 == KernelKind::Linear && name == Block::LogEll {
                assert_eq!(analytic, 0.0);
                continue;
            }
            let err = rel_error(analytic, fd, 1e-4);
            assert!(
                err <= 1e-6,
                "{setup:?} {name}[{idx}]: analytic {analytic} vs fd {fd}"
            );
            if name == Block::A {
                worst_z = worst_z.max(err);
            }
        }
        eprintln!("{setup:?} sparse: worst ∂Z relative error {worst_z:.1e}");
    }
}

/// Prediction on sparse rows with the identity marker (what `predict` and `serve` score
/// with) gives the means and variances of the densified rows with a dense I_D to 1e-10,
/// for the O(M) form and a full-Cholesky form, through the predictor and the means alone.
#[test]
fn sparse_predictions_equal_the_dense_identity_ones() {
    let (m, d, b, p) = (8, 6, 9, 3);
    for (s, (kind, _)) in SETUPS.into_iter().enumerate() {
        for whitened in [false, true] {
            let mut pr = problem(180 + s as u64, (m, d, b, p));
            if whitened {
                let factor = Mat::from_fn(m, m, |i, j| match i.cmp(&j) {
                    std::cmp::Ordering::Equal => 1.0,
                    std::cmp::Ordering::Greater => 0.05 * ((i + j) % 3) as f64,
                    std::cmp::Ordering::Less => 0.0,
                });
                pr.params.set_full(pack_factors(&vec![factor; p], true));
            }
            let rows = sparse_of(&pr.x);
            let identity = Mat::<f64>::identity(d, d);
            let dense = BasisInputs {
                kxx_b: pr.x.as_ref().into(),
                sq_norms: &pr.norms,
                k_tilde: identity.as_ref().into(),
            };
            let sparse = sparse_inputs(&pr, &rows);
            let by_dense = Predictor::new(kind, &pr.params, &identity).unwrap();
            let by_sparse = Predictor::new(kind, &pr.params, GramRef::Identity(d)).unwrap();
            let (mean_d, var_d) = by_dense.mean_and_variance(&dense);
            let (mean_s, var_s) = by_sparse.mean_and_variance(&sparse);
            let means_only = MeanUtilities::new(kind, &pr.params, GramRef::Identity(d))
                .unwrap()
                .at(&sparse);
            for (name, x, y) in [
                ("mean", &mean_s, &mean_d),
                ("variance", &var_s, &var_d),
                ("means alone", &means_only, &mean_d),
            ] {
                let diff = mat_rel(x, y);
                assert!(
                    diff <= 1e-10,
                    "{kind:?} whitened={whitened} {name}: {diff:e}"
                );
            }
        }
    }
}
