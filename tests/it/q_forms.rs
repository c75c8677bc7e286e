//! The full-Cholesky q(u) forms (`docs/model.md`, "Full-Cholesky q(u)"): analytic gradients
//! against central finite differences for every block, both forms, both kernels and both
//! term sets; the KL against the textbook Gaussian KL; whitened and unwhitened parameters of
//! the same q(u) give the same bound, and so does the paper's q(u) written as a Cholesky
//! factor; bitwise independence from the thread count; prediction against the training
//! marginals; a singular K_Z rescued by jitter.

use crate::common;
use common::model::*;
use faer::linalg::solvers::DenseSolveCore;
use faer::{Mat, Side};
use fsgp::model::bound::objective::{
    bound_and_grads, expected_loglik, kl_total, BoundAndGrads, BoundOptions,
};
use fsgp::model::bound::terms::{terms_all, terms_sampled, Term, TermSet};
use fsgp::model::kernel::{KernelKind, KernelParams};
use fsgp::model::likelihood::logistic::BernoulliLogistic;
use fsgp::model::params::{flat_entry, flat_len, Block, Params, QForm, QParams};
use fsgp::model::predictive::{mean_utilities, Predictor};
use fsgp::model::qu::cholesky::{factor_of, pack_factors};
use fsgp::model::qu::conditional::{Conditional, Factorisation};
use fsgp::model::qu::gp_factor::sigma_of;
use fsgp::model::scratch::Scratch;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const K: usize = 6;
const KINDS: [KernelKind; 2] = [KernelKind::Linear, KernelKind::SquaredExponential];
const FORMS: [QForm; 2] = [QForm::Cholesky, QForm::Whitened];

/// K_Z of `params` under `kind` with the problem's basis Gram.
fn k_z_of(pr: &Problem, kind: KernelKind, params: &Params) -> Mat<f64> {
    kind.k_z(&params.kernel, params.a.as_ref(), pr.kt.as_ref())
}

/// M = 4 inducing points, R = 5 (the linear K_Z is non-singular), B = 4 rows, P GPs.
fn problem(seed: u64, form: QForm, m: usize, b: usize, p: usize) -> Problem {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let r = m + 1;
    let u = |rng: &mut ChaCha8Rng, s: f64| (rng.random::<f64>() - 0.5) * s;
    let (kxx, norms) = random_rows(&mut |s| u(&mut rng, s), b, r, 1.0);
    let kt = random_gram(&mut |s| u(&mut rng, s), r);
    let factors = random_factors(&mut rng, m, p);
    let params = Params {
        logit_epsilon: None,
        a: Mat::from_fn(m, r, |_, _| u(&mut rng, 1.0)),
        q: QParams::Full {
            mu: Mat::from_fn(m, p, |_, _| u(&mut rng, 1.0)),
            chol: pack_factors(&factors, form == QForm::Whitened),
        },
        phi: Mat::from_fn(K, p, |_, _| u(&mut rng, 1.5)),
        bias: (0..K).map(|_| u(&mut rng, 1.0)).collect(),
        kernel: KernelParams::new(u(&mut rng, 0.5), u(&mut rng, 0.5)),
        amortiser: None,
    };
    let positives = (0..b)
        .map(|i| (0..K as u32).filter(|k| (k + i as u32) % 3 == 0).collect())
        .collect();
    Problem {
        kxx,
        norms,
        kt,
        positives,
        params,
    }
}

fn evaluate(kind: KernelKind, pr: &Problem, params: &Params, terms: &TermSet<'_>) -> BoundAndGrads {
    let lik = BernoulliLogistic::new(20).unwrap();
    bound_and_grads(
        kind,
        params,
        &pr.x(),
        terms,
        &lik,
        &BoundOptions::default(),
        &Scratch::new(),
    )
    .unwrap()
}

/// Checks the analytic gradient of every entry of `pr.params` against central differences
/// (h = 2·10⁻⁵, relative error below 10⁻⁶; log ℓ of the linear kernel must be exactly 0)
/// at a K_Z that needs no jitter; returns the blocks checked.
fn check_every_entry(
    kind: KernelKind,
    pr: &Problem,
    terms: &TermSet<'_>,
    label: &str,
) -> std::collections::HashSet<Block> {
    let eval = evaluate(kind, pr, &pr.params, terms);
    assert_eq!(eval.jitter, 0.0, "{label}");
    let fds = central_differences(&pr.params, 2e-5, |q| evaluate(kind, pr, q, terms).value);
    let mut seen = std::collections::HashSet::new();
    for (idx, ((block, analytic), fd)) in flat_entries(&eval.grads).into_iter().zip(fds).enumerate()
    {
        if kind == KernelKind::Linear && block == Block::LogEll {
            assert_eq!(analytic, 0.0, "{label}");
            continue;
        }
        seen.insert(block);
        let rel = rel_error(analytic, fd, 1e-6);
        assert!(
            rel < 1e-6,
            "{label} {kind:?} {block} [{idx}]: analytic {analytic} vs fd {fd} (rel {rel:.2e})"
        );
    }
    seen
}

#[test]
fn analytic_gradient_matches_central_differences_for_every_block() {
    for form in FORMS {
        for kind in KINDS {
            for sampled in [false, true] {
                let pr = problem(if sampled { 21 } else { 22 }, form, 4, 4, 2);
                assert_eq!(pr.params.q_form(), form);
                let mut rng = ChaCha8Rng::seed_from_u64(5);
                let list: Vec<Term> = if sampled {
                    terms_sampled(&pr.positives, K, 2, 3.0, &mut rng)
                } else {
                    terms_all(&pr.positives, K, 3.0)
                };
                let dense = TermSet::AllLabels {
                    positives: &pr.positives,
                    scale: 3.0,
                };
                let terms = if sampled { TermSet::List(&list) } else { dense };
                let seen =
                    check_every_entry(kind, &pr, &terms, &format!("{form:?} sampled={sampled}"));
                let expected = if kind == KernelKind::Linear { 6 } else { 7 };
                assert_eq!(seen.len(), expected, "{seen:?}");
                assert!(!seen.contains(&Block::Rho));
            }
        }
    }
}

/// log|S| and S⁻¹ of a positive definite matrix, by faer's dense Cholesky.
fn logdet_and_inverse(s: &Mat<f64>) -> (f64, Mat<f64>) {
    let llt = s.llt(Side::Lower).unwrap();
    let l = llt.L();
    let logdet = 2.0 * (0..s.nrows()).map(|i| l[(i, i)].ln()).sum::<f64>();
    (logdet, llt.inverse())
}

/// KL(N(mean, S) ‖ N(0, K)) = ½ [tr(K⁻¹S) + meanᵀK⁻¹mean − M + log|K| − log|S|].
fn textbook_kl(mean: &Mat<f64>, s: &Mat<f64>, k: &Mat<f64>) -> f64 {
    let m = k.nrows();
    let (logdet_k, k_inv) = logdet_and_inverse(k);
    let (logdet_s, _) = logdet_and_inverse(s);
    let tr: f64 = (0..m)
        .map(|i| (0..m).map(|j| k_inv[(i, j)] * s[(j, i)]).sum::<f64>())
        .sum();
    let quad = (mean.transpose() * &k_inv * mean)[(0, 0)];
    0.5 * (tr + quad - m as f64 + logdet_k - logdet_s)
}

/// (mean, covariance) of q(u_p) for either full-Cholesky form, densely: unwhitened
/// N(μ_p, L_p L_pᵀ); whitened N(L_Z m_p, L_Z L_p L_pᵀ L_Zᵀ).
fn q_of_u(pr: &Problem, kind: KernelKind, params: &Params, p: usize) -> (Mat<f64>, Mat<f64>) {
    let m = params.q.mu().nrows();
    let c = params.q.chol().unwrap();
    let l = factor_of(c, p, m);
    let mean = Mat::from_fn(m, 1, |i, _| params.q.mu()[(i, p)]);
    if !c.whitened {
        return (mean, &l * l.transpose());
    }
    let k_z = k_z_of(pr, kind, params);
    let l_z = k_z.llt(Side::Lower).unwrap().L().to_owned();
    let lzl = &l_z * &l;
    (&l_z * &mean, &lzl * lzl.transpose())
}

#[test]
fn kl_equals_the_textbook_gaussian_kl() {
    for form in FORMS {
        for kind in KINDS {
            let pr = problem(3, form, 5, 3, 4);
            let k_z = k_z_of(&pr, kind, &pr.params);
            let expected: f64 = (0..4)
                .map(|p| {
                    let (mean, s) = q_of_u(&pr, kind, &pr.params, p);
                    textbook_kl(&mean, &s, &k_z)
                })
                .sum();
            let kl = kl_total(kind, &pr.params, pr.kt.as_ref(), &Scratch::new()).unwrap();
            let eval = evaluate(kind, &pr, &pr.params, &TermSet::List(&[]));
            assert!(
                (kl - expected).abs() <= 1e-10 * expected.abs(),
                "{form:?} {kind:?}: {kl} vs {expected}"
            );
            assert_eq!(kl.to_bits(), eval.kl.to_bits(), "{form:?} {kind:?}");
        }
    }
}

/// Lower Cholesky factor of a positive definite matrix.
fn chol(s: &Mat<f64>) -> Mat<f64> {
    s.llt(Side::Lower).unwrap().L().to_owned()
}

/// Two parameterisations of one q(u) give the same bound (relative 10⁻¹⁰) and KL (relative
/// `kl_tol`).
fn assert_same_bound(a: &BoundAndGrads, b: &BoundAndGrads, kl_tol: f64, label: &str) {
    let rel = (a.value - b.value).abs() / a.value.abs();
    assert!(
        rel < 1e-10,
        "{label}: {} vs {} ({rel:.2e})",
        a.value,
        b.value
    );
    assert!(
        (a.kl - b.kl).abs() < kl_tol * a.kl.abs(),
        "{label}: KL {} vs {}",
        a.kl,
        b.kl
    );
}

#[test]
fn whitened_and_unwhitened_parameters_of_one_q_give_the_same_bound() {
    for kind in KINDS {
        let pr = problem(7, QForm::Cholesky, 5, 6, 4);
        let (m, p_count) = (pr.params.q.mu().nrows(), pr.params.q.mu().ncols());
        let l_z = chol(&k_z_of(&pr, kind, &pr.params));
        let mut l_z_inv = Mat::<f64>::identity(m, m);
        faer::linalg::triangular_solve::solve_lower_triangular_in_place(
            l_z.as_ref(),
            l_z_inv.as_mut(),
            faer::Par::Seq,
        );
        // m = L_Z⁻¹ μ, L_v = L_Z⁻¹ L_p.
        let c = pr.params.q.chol().unwrap();
        let white_factors: Vec<Mat<f64>> = (0..p_count)
            .map(|p| &l_z_inv * factor_of(c, p, m))
            .collect();
        let mut white = pr.params.clone();
        *white.q.mu_mut() = &l_z_inv * pr.params.q.mu();
        white.set_full(pack_factors(&white_factors, true));
        let terms = TermSet::AllLabels {
            positives: &pr.positives,
            scale: 2.0,
        };
        let a = evaluate(kind, &pr, &pr.params, &terms);
        let b = evaluate(kind, &pr, &white, &terms);
        assert_same_bound(&a, &b, 1e-10, &format!("{kind:?}"));
    }
}

#[test]
fn the_papers_q_written_as_a_cholesky_factor_gives_the_papers_bound() {
    for kind in KINDS {
        let pr = problem(8, QForm::Cholesky, 5, 6, 4);
        let (m, p_count) = (pr.params.q.mu().nrows(), pr.params.q.mu().ncols());
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let mut sites = pr.params.clone();
        sites.set_sites(Mat::from_fn(m, p_count, |_, _| {
            rng.random::<f64>() * 2.0 - 1.0
        }));
        let rho = sites.q.rho().unwrap().clone();
        // q(u_p) = N(K_Z μ_p, (K_Z⁻¹ + Σ_p⁻¹)⁻¹).
        let k_z = k_z_of(&pr, kind, &sites);
        let (_, k_inv) = logdet_and_inverse(&k_z);
        let factors: Vec<Mat<f64>> = (0..p_count)
            .map(|p| {
                let prec = Mat::from_fn(m, m, |i, j| {
                    k_inv[(i, j)]
                        + if i == j {
                            1.0 / sigma_of(rho[(i, p)])
                        } else {
                            0.0
                        }
                });
                chol(&logdet_and_inverse(&prec).1)
            })
            .collect();
        let mut full = sites.clone();
        *full.q.mu_mut() = &k_z * sites.q.mu();
        full.set_full(pack_factors(&factors, false));
        for sampled in [false, true] {
            let mut rng = ChaCha8Rng::seed_from_u64(4);
            let list = terms_sampled(&pr.positives, K, 2, 3.0, &mut rng);
            let terms = if sampled {
                TermSet::List(&list)
            } else {
                TermSet::AllLabels {
                    positives: &pr.positives,
                    scale: 3.0,
                }
            };
            let a = evaluate(kind, &pr, &sites, &terms);
            let b = evaluate(kind, &pr, &full, &terms);
            assert_same_bound(&a, &b, 1e-9, &format!("{kind:?} sampled={sampled}"));
        }
    }
}

#[test]
fn results_are_bitwise_identical_for_one_and_two_threads() {
    for form in FORMS {
        // P = 7: three chunks of GPs, the last one short.
        let pr = problem(31, form, 12, 20, 7);
        let terms = TermSet::AllLabels {
            positives: &pr.positives,
            scale: 2.0,
        };
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| evaluate(KernelKind::SquaredExponential, &pr, &pr.params, &terms))
        };
        let (a, b) = (run(1), run(2));
        assert_eq!(a.value.to_bits(), b.value.to_bits(), "{form:?}");
        let bits = |e: &BoundAndGrads| {
            let mut g = e.grads.clone();
            (0..flat_len(&g))
                .map(|i| flat_entry(&mut g, i).1.to_bits())
                .collect::<Vec<_>>()
        };
        assert_eq!(bits(&a), bits(&b), "{form:?}");
    }
}

#[test]
fn prediction_equals_the_training_marginals() {
    for form in FORMS {
        for kind in KINDS {
            let pr = problem(41, form, 6, 9, 4);
            let params = &pr.params;
            let cond = Conditional::new(kind, params, &pr.x(), Factorisation::Auto).unwrap();
            let marg = cond.marginals(params, &Scratch::new()).unwrap();
            let predictor = Predictor::new(kind, params, pr.kt.as_ref()).unwrap();
            let (mean, var) = predictor.mean_and_variance(&pr.x());
            let plain = mean_utilities(kind, params, &pr.x()).unwrap();
            for i in 0..pr.kxx.nrows() {
                for k in 0..K {
                    let mut f = params.bias[k];
                    let mut v = 0.0;
                    for p in 0..params.q.mu().ncols() {
                        f += params.phi[(k, p)] * marg.mean[(i, p)];
                        v += params.phi[(k, p)].powi(2) * marg.var[(i, p)].max(0.0);
                    }
                    let tol = |x: f64| 1e-10 * (1.0 + x.abs());
                    assert!((mean[(i, k)] - f).abs() <= tol(f), "{form:?} {kind:?}");
                    assert!((plain[(i, k)] - f).abs() <= tol(f), "{form:?} {kind:?}");
                    assert!((var[(i, k)] - v).abs() <= tol(v), "{form:?} {kind:?}");
                }
            }
            // The forward-only bound plus the KL is the evaluated bound.
            let terms = TermSet::AllLabels {
                positives: &pr.positives,
                scale: 1.0,
            };
            let lik = BernoulliLogistic::new(20).unwrap();
            let e = expected_loglik(kind, params, &pr.x(), &terms, &lik, &Scratch::new()).unwrap();
            let kl = kl_total(kind, params, pr.kt.as_ref(), &Scratch::new()).unwrap();
            let full = evaluate(kind, &pr, params, &terms);
            assert!(((e - kl) - full.value).abs() <= 1e-10 * full.value.abs());
        }
    }
}

#[test]
fn a_singular_k_z_is_rescued_by_jitter_and_the_subspace_path_is_refused() {
    // The linear kernel with R < M: K_Z has rank R.
    let mut pr = problem(51, QForm::Whitened, 6, 5, 2);
    pr.params.a = Mat::from_fn(6, 3, |i, j| ((i * 3 + j) as f64 * 0.7).sin());
    pr.kxx = Mat::from_fn(5, 3, |i, j| ((i + 2 * j) as f64 * 0.3).cos());
    pr.kt = Mat::<f64>::identity(3, 3);
    let terms = TermSet::AllLabels {
        positives: &pr.positives,
        scale: 1.0,
    };
    let e = evaluate(KernelKind::Linear, &pr, &pr.params, &terms);
    assert!(e.jitter > 0.0);
    assert!(e.value.is_finite() && e.kl.is_finite());
    let lik = BernoulliLogistic::new(20).unwrap();
    let opts = BoundOptions {
        factorisation: Factorisation::LowRank,
        ..BoundOptions::default()
    };
    let err = bound_and_grads(
        KernelKind::Linear,
        &pr.params,
        &pr.x(),
        &terms,
        &lik,
        &opts,
        &Scratch::new(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("--q-form whitened"), "{err}");
}

#[test]
fn skipping_kernel_gradients_leaves_the_other_blocks_unchanged() {
    for form in FORMS {
        let pr = problem(61, form, 6, 7, 4);
        let terms = TermSet::AllLabels {
            positives: &pr.positives,
            scale: 2.0,
        };
        let lik = BernoulliLogistic::new(20).unwrap();
        let run = |kernel_grads: bool| {
            let opts = BoundOptions {
                kernel_grads,
                ..BoundOptions::default()
            };
            bound_and_grads(
                KernelKind::SquaredExponential,
                &pr.params,
                &pr.x(),
                &terms,
                &lik,
                &opts,
                &Scratch::new(),
            )
            .unwrap()
        };
        let (full, partial) = (run(true), run(false));
        assert_eq!(full.value.to_bits(), partial.value.to_bits(), "{form:?}");
        assert_eq!(full.grads.q, partial.grads.q, "{form:?}");
        assert_eq!(full.grads.phi, partial.grads.phi, "{form:?}");
        assert!(partial
            .grads
            .a
            .col_iter()
            .all(|c| c.iter().all(|&v| v == 0.0)));
        assert!(full.grads.a.col_iter().any(|c| c.iter().any(|&v| v != 0.0)));
    }
}

/// The largest relative difference between the analytic gradient and central differences
/// over every entry of `pr.params` (log ℓ skipped for the linear kernel).
fn worst_gradient_error(
    kind: KernelKind,
    pr: &Problem,
    terms: &TermSet<'_>,
    h: f64,
) -> (f64, Block) {
    let grads = evaluate(kind, pr, &pr.params, terms).grads;
    let fds = central_differences(&pr.params, h, |q| evaluate(kind, pr, q, terms).value);
    let mut worst = (0.0f64, Block::A);
    for ((block, analytic), fd) in flat_entries(&grads).into_iter().zip(fds) {
        if kind == KernelKind::Linear && block == Block::LogEll {
            continue;
        }
        let rel = rel_error(analytic, fd, 1e-6);
        if rel > worst.0 {
            worst = (rel, block);
        }
    }
    worst
}

#[test]
fn gradients_with_a_jittered_singular_k_z_match_central_differences() {
    // Linear kernel, R = 3 < M = 6: K_Z has rank 3, so L_Z is the factor of K_Z + εI with
    // ε = 10⁻⁶ tr(K_Z)/M, a multiple of tr K_Z whose derivative the gradient includes. The
    // bound is then curved on a scale of √ε in the directions of A that leave the span, and
    // its evaluation carries rounding of about 10⁻⁸ relative (K_Z + εI has condition ~10⁶),
    // so central differences cannot reach 10⁻⁶ here. What they show: their error falls as h²
    // while truncation dominates (so they converge to the analytic gradient, not to a value
    // beside it), and is below 10⁻³ at the best h. When a factorisation of K_Z with pivots
    // at rounding level was accepted (no jitter), the error was 1.5 (relative).
    let mut pr = problem(71, QForm::Whitened, 6, 5, 2);
    let mut rng = ChaCha8Rng::seed_from_u64(72);
    pr.params.a = Mat::from_fn(6, 3, |_, _| rng.random::<f64>() - 0.5);
    pr.kxx = Mat::from_fn(5, 3, |_, _| rng.random::<f64>() - 0.5);
    pr.kt = Mat::<f64>::identity(3, 3);
    let terms = TermSet::AllLabels {
        positives: &pr.positives,
        scale: 1.0,
    };
    assert!(evaluate(KernelKind::Linear, &pr, &pr.params, &terms).jitter > 0.0);
    let err = |h: f64| worst_gradient_error(KernelKind::Linear, &pr, &terms, h);
    let (coarse, fine) = (err(1e-3).0, err(1e-4).0);
    assert!(
        fine < coarse / 50.0,
        "not converging as h²: {coarse:.2e} at h = 1e-3, {fine:.2e} at h = 1e-4"
    );
    let (rel, block) = err(1e-5);
    assert!(rel < 1e-3, "{block}: relative error {rel:.2e}");
}

#[test]
fn full_cholesky_gradients_match_central_differences_with_se_plus_linear_and_subspace_ard() {
    // The forms were written beside the SE + linear kernel and subspace ARD (`kernel/ard.rs`): here
    // every block of each form under each kernel with ARD weights ω [R] (R = M + 1, so the
    // linear K_Z is non-singular and the unwhitened form applies), sampled terms.
    let setups = [
        (KernelKind::SePlusLinear, false),
        (KernelKind::SePlusLinear, true),
        (KernelKind::SquaredExponential, true),
        (KernelKind::Linear, true),
    ];
    for form in FORMS {
        for (kind, ard) in setups {
            let mut pr = problem(81, form, 4, 4, 2);
            let r = pr.params.a.ncols();
            if kind == KernelKind::SePlusLinear {
                pr.params.kernel.log_lin2 = Some(-0.4);
            }
            if ard {
                pr.params.kernel.log_ard = (0..r).map(|j| 0.3 * (j as f64 * 1.7).sin()).collect();
            }
            let mut rng = ChaCha8Rng::seed_from_u64(6);
            let list = terms_sampled(&pr.positives, K, 2, 3.0, &mut rng);
            let label = format!("{form:?} ard={ard}");
            let seen = check_every_entry(kind, &pr, &TermSet::List(&list), &label);
            let mut expected = vec![
                Block::A,
                Block::Mu,
                Block::CholFactor,
                Block::Phi,
                Block::Bias,
            ];
            expected.push(Block::LogSf2);
            if kind != KernelKind::Linear {
                expected.push(Block::LogEll);
            }
            if kind == KernelKind::SePlusLinear {
                expected.push(Block::LogLin2);
            }
            if ard {
                expected.push(Block::LogArd);
            }
            assert_eq!(seen, expected.into_iter().collect(), "{label} {kind:?}");
        }
    }
}

#[test]
fn a_k_z_that_cannot_be_factorised_is_an_error_of_the_means_not_nan() {
    for form in FORMS {
        let mut pr = problem(91, form, 5, 4, 3);
        pr.params.kernel.log_sf2 = f64::NAN;
        let err = mean_utilities(KernelKind::SquaredExponential, &pr.params, &pr.x())
            .expect_err("NaN means instead of an error");
        let msg = err.to_string();
        assert!(
            msg.contains("Cholesky of K_Z failed") && !msg.contains('Σ'),
            "{form:?}: {msg}"
        );
    }
    // The site form's means need no factorisation: K_bZ μ, NaN with the kernel.
    let mut pr = problem(91, QForm::Whitened, 5, 4, 3);
    pr.params.set_sites(Mat::zeros(5, 3));
    pr.params.kernel.log_sf2 = f64::NAN;
    let m = mean_utilities(KernelKind::SquaredExponential, &pr.params, &pr.x()).unwrap();
    assert!(m[(0, 0)].is_nan());
}
