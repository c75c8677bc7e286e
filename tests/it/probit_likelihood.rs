//! The Bernoulli-probit expected log-likelihood (src/model/probit.rs, docs/likelihood.md,
//! "The probit likelihood"): E against an independent Simpson integral over f, including
//! extreme means and tiny and huge variances; ∂E/∂m and ∂E/∂v against central differences
//! of the quadrature sum; the whole bound's gradient against central differences for the
//! paper's q(u) and the whitened full-Cholesky q(u); the lanes against the scalar form.

use crate::common;
use common::model::*;
use fsgp::model::bound::objective::{bound_and_grads, BoundOptions};
use fsgp::model::bound::terms::{terms_all, TermSet};
use fsgp::model::kernel::{KernelKind, KernelParams};
use fsgp::model::likelihood::probit::{log_normal_cdf, normal_cdf, BernoulliProbit};
use fsgp::model::likelihood::Likelihood;
use fsgp::model::params::Params;
use fsgp::model::qu::cholesky::pack_factors;
use fsgp::model::qu::conditional::Factorisation;
use fsgp::model::scratch::Scratch;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// E_{f~N(m,v)}[log Φ(y f)] by composite Simpson over f ∈ m ± 14√v with `n` intervals
/// (the Gaussian beyond 14 sd weighs e^{−98}), an integral that shares nothing with the
/// Gauss–Hermite rule.
fn simpson(y: f64, m: f64, v: f64, n: usize) -> f64 {
    let s = v.sqrt();
    let (lo, hi) = (m - 14.0 * s, m + 14.0 * s);
    let h = (hi - lo) / n as f64;
    let g = |f: f64| {
        let t = (f - m) / s;
        (-0.5 * t * t).exp() / (s * (2.0 * std::f64::consts::PI).sqrt()) * log_normal_cdf(y * f)
    };
    let mut sum = g(lo) + g(hi);
    for i in 1..n {
        let w = if i % 2 == 1 { 4.0 } else { 2.0 };
        sum += w * g(lo + i as f64 * h);
    }
    sum * h / 3.0
}

#[test]
fn expectation_matches_an_independent_simpson_integral() {
    // A rule fine enough that its own error is below the tolerance (Q = 20's error is
    // measured and documented in the next test).
    // At v = 1e3 the kink of log Φ(f) near f = 0 (where it turns from −f²/2 to 0) is
    // narrow beside the spread √v ≈ 32, and a Gauss–Hermite rule only converges slowly
    // there: that case is checked to the error it has (docs/likelihood.md).
    let lik = BernoulliProbit::new(120).unwrap();
    // Measured worst errors (relative to max(|E|, 1e-3)): 7.5e-13 up to v = 1, 1.0e-8 at
    // v = 10, 3.2e-4 at v = 100, 1.6e-4 at v = 1e3.
    let tol = |v: f64| match v {
        v if v <= 1.0 => 1e-11,
        v if v <= 10.0 => 1e-7,
        _ => 1e-3,
    };
    let mut worst: f64 = 0.0;
    for y in [1.0, -1.0] {
        for m in [-40.0, -8.0, -1.5, 0.0, 0.7, 3.0, 40.0] {
            for v in [1e-12, 1e-4, 0.3, 1.0, 10.0, 100.0, 1e3] {
                let reference = simpson(y, m, v, 40_000);
                let got = lik.expect_value(y, m, v);
                let err = (got - reference).abs() / reference.abs().max(1e-3);
                if v <= 1.0 {
                    worst = worst.max(err);
                }
                assert!(
                    err <= tol(v),
                    "y={y} m={m} v={v}: GH {got:e} vs Simpson {reference:e} (rel {err:.2e})"
                );
            }
        }
    }
    eprintln!("Q = 120 against Simpson, v ≤ 1: worst relative error {worst:.2e}");
}

#[test]
fn the_default_rule_is_accurate_at_the_variances_training_sees() {
    // Q = 20 against the Q = 120 sum: the quadrature error of the trainer's default rule.
    let (q20, q120) = (
        BernoulliProbit::new(20).unwrap(),
        BernoulliProbit::new(120).unwrap(),
    );
    let mut worst = [0.0f64; 3];
    for (slot, v) in [0.1, 1.0, 10.0].into_iter().enumerate() {
        for m in [-6.0, -2.0, 0.0, 2.0, 6.0] {
            let (a, b) = (q20.expect_value(1.0, m, v), q120.expect_value(1.0, m, v));
            worst[slot] = worst[slot].max((a - b).abs() / b.abs().max(1e-3));
        }
    }
    eprintln!(
        "Q = 20 vs Q = 120, worst relative error: v = 0.1 {:.1e}, v = 1 {:.1e}, v = 10 {:.1e}",
        worst[0], worst[1], worst[2]
    );
    assert!(
        worst[0] < 1e-10 && worst[1] < 1e-6 && worst[2] < 1e-3,
        "{worst:?}"
    );
}

#[test]
fn the_expectation_at_zero_variance_is_log_phi_and_huge_means_do_not_overflow() {
    let lik = BernoulliProbit::new(20).unwrap();
    for m in [-40.0, -3.0, 0.0, 2.5, 40.0] {
        let e = lik.expect(1.0, m, 0.0);
        assert!((e.value - log_normal_cdf(m)).abs() <= 1e-13 * e.value.abs().max(1e-300));
        assert!(e.d_var.is_finite() && e.d_mean.is_finite());
    }
    // m = −40 (log Φ = −804.6), huge variances: finite everywhere, ∂E/∂m ≈ r(−40) ≈ 40.
    let e = lik.expect(1.0, -40.0, 1e4);
    assert!(
        e.value.is_finite() && e.d_mean > 0.0 && e.d_var < 0.0,
        "{e:?}"
    );
    let e = lik.expect(-1.0, -40.0, 1e-12);
    assert!(e.value.abs() < 1e-300 && e.d_mean.abs() < 1e-300, "{e:?}");
    // Φ itself is the distribution function.
    assert!((normal_cdf(0.0) - 0.5).abs() < 1e-16);
    assert!((normal_cdf(1.0) - 0.841_344_746_068_542_9).abs() < 1e-15);
}

#[test]
fn derivatives_are_those_of_the_quadrature_sum() {
    let lik = BernoulliProbit::new(20).unwrap();
    let mut worst: f64 = 0.0;
    for y in [1.0, -1.0] {
        for m in [-40.0, -7.0, -2.0, -0.3, 0.0, 1.1, 5.0, 40.0] {
            for v in [1e-6, 0.01, 0.5, 2.0, 30.0, 1e3] {
                let e = lik.expect(y, m, v);
                let hm = 1e-5 * m.abs().max(1.0);
                let fd_m =
                    (lik.expect_value(y, m + hm, v) - lik.expect_value(y, m - hm, v)) / (2.0 * hm);
                let hv = 1e-4 * v;
                let fd_v =
                    (lik.expect_value(y, m, v + hv) - lik.expect_value(y, m, v - hv)) / (2.0 * hv);
                // Relative, with a floor at the rounding of E over the step.
                let floor_m = 1e-9 * e.value.abs().max(1.0) / hm;
                let floor_v = 1e-9 * e.value.abs().max(1.0) / hv;
                let (rm, rv) = (
                    rel_error(e.d_mean, fd_m, floor_m),
                    rel_error(e.d_var, fd_v, floor_v),
                );
                worst = worst.max(rm).max(rv);
                assert!(
                    rm <= 1e-6,
                    "∂E/∂m y={y} m={m} v={v}: {} vs {fd_m} ({rm:.1e})",
                    e.d_mean
                );
                assert!(
                    rv <= 1e-6,
                    "∂E/∂v y={y} m={m} v={v}: {} vs {fd_v} ({rv:.1e})",
                    e.d_var
                );
            }
        }
    }
    eprintln!("probit derivatives vs central differences: worst {worst:.2e}");
}

#[test]
fn the_price_form_at_tiny_variance_is_the_limit_of_the_node_derivative() {
    // Just above VAR_FLOOR the node form, just below the Price form: one continuous ∂E/∂v.
    let lik = BernoulliProbit::new(20).unwrap();
    for m in [-30.0, -5.0, -0.5, 0.0, 2.0, 9.0] {
        let below = lik.expect(1.0, m, 0.9e-10).d_var;
        let above = lik.expect(1.0, m, 1e-8).d_var;
        // ½ d²/dm² log Φ(m) = −½ r(m)(m + r(m)).
        assert!(
            (below - above).abs() <= 1e-4 * below.abs().max(1e-12),
            "m={m}: {below} vs {above}"
        );
        assert!(below < 0.0 || m > 8.0, "log Φ is concave: m={m} {below}");
    }
}

#[test]
fn lanes_equal_the_scalar_expectation_bit_for_bit() {
    let lik = BernoulliProbit::new(20).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let n = 37;
    let y: Vec<f64> = (0..n)
        .map(|i| if i % 3 == 0 { 1.0 } else { -1.0 })
        .collect();
    let m0: Vec<f64> = (0..n).map(|_| (rng.random::<f64>() - 0.5) * 20.0).collect();
    let v0: Vec<f64> = (0..n).map(|_| rng.random::<f64>() * 4.0).collect();
    let (mut m, mut v, mut e) = (m0.clone(), v0.clone(), vec![0.0; n]);
    lik.expect_lanes(&y, &mut m, &mut v, &mut e);
    for j in 0..n {
        let s = lik.expect(y[j], m0[j], v0[j]);
        assert_eq!((e[j], m[j], v[j]), (s.value, s.d_mean, s.d_var), "term {j}");
    }
}

/// One latent GP and one label (a binary problem): M = 4 inducing inputs in R = 5
/// columns, B = 6 rows, half of them positive.
fn binary_problem(seed: u64, whitened: bool) -> Problem {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (m, r, b) = (4, 5, 6);
    let mut u = |s: f64| (rng.random::<f64>() - 0.5) * s;
    let (kxx, norms) = random_rows(&mut u, b, r, 1.0);
    let kt = random_gram(&mut u, r);
    let mut params = random_site_params(&mut u, (m, r, 1, 1));
    if whitened {
        params.logit_epsilon = None;
        params.set_full(pack_factors(&positive_factors(&mut u, m, 1, 0.8), true));
    }
    params.kernel = KernelParams::new(u(0.5), u(0.5));
    let positives = (0..b)
        .map(|i| if i % 2 == 0 { vec![0] } else { vec![] })
        .collect();
    Problem {
        kxx,
        norms,
        kt,
        positives,
        params,
    }
}

#[test]
fn the_bound_with_the_probit_likelihood_has_the_gradient_of_central_differences() {
    let lik = BernoulliProbit::new(20).unwrap();
    let cases = [
        (
            "sites, linear, subspace J_p",
            false,
            KernelKind::Linear,
            Factorisation::LowRank,
        ),
        (
            "sites, SE",
            false,
            KernelKind::SquaredExponential,
            Factorisation::Inducing,
        ),
        (
            "whitened, SE",
            true,
            KernelKind::SquaredExponential,
            Factorisation::Inducing,
        ),
        (
            "whitened, linear",
            true,
            KernelKind::Linear,
            Factorisation::Inducing,
        ),
    ];
    for (label, whitened, kind, factorisation) in cases {
        let pr = binary_problem(21, whitened);
        let terms = terms_all(&pr.positives, 1, 2.5);
        let opts = BoundOptions {
            factorisation,
            ..BoundOptions::default()
        };
        let eval = |params: &Params| {
            bound_and_grads(
                kind,
                params,
                &pr.x(),
                &TermSet::List(&terms),
                &lik,
                &opts,
                &Scratch::new(),
            )
            .unwrap()
        };
        let grads = eval(&pr.params).grads;
        let fds = central_differences(&pr.params, 2e-5, |q| eval(q).value);
        let linear = kind == KernelKind::Linear;
        let (worst, _) = assert_gradient_matches(&grads, &fds, linear, (1e-4, 1e-6), label);
        eprintln!(
            "{label}: worst relative error {:.2e} ({})",
            worst.0, worst.1
        );
        // The dense all-labels path gives the same bound as the list of every term.
        let dense = bound_and_grads(
            kind,
            &pr.params,
            &pr.x(),
            &TermSet::AllLabels {
                positives: &pr.positives,
                scale: 2.5,
            },
            &lik,
            &opts,
            &Scratch::new(),
        )
        .unwrap();
        let listed = eval(&pr.params);
        assert!(
            (dense.value - listed.value).abs() <= 1e-12 * listed.value.abs(),
            "{label}"
        );
    }
}
