//! The augment-and-reduce likelihoods with amortised local parameters and class
//! subsampling (`docs/likelihood.md`, "Augment and reduce", "Class subsampling"):
//! per-row and whole-bound gradients against central finite differences, every parameter
//! block including the amortisation network's weights; the AR-softmax bound (eq. 17 of
//! Ruiz et al.) against an independent numerical expectation, below the softmax, and exact
//! at the optimal α for fixed utilities; class subsampling unbiased and, with S ≥ K − 1,
//! bitwise the full bound; bitwise independence from the thread count; shape errors.

use crate::common;
use common::model::*;
use faer::Mat;
use fsgp::model::bound::class_phase::ROW_BLOCK;
use fsgp::model::bound::objective::{expected_loglik, kl_total};
use fsgp::model::bound::terms::TermSet;
use fsgp::model::kernel::KernelKind;
use fsgp::model::likelihood::logistic::BernoulliLogistic;
use fsgp::model::likelihood::multiclass::amortiser::Amortiser;
use fsgp::model::likelihood::multiclass::ar_logit::ArLogit;
use fsgp::model::likelihood::multiclass::ar_softmax::ArSoftmax;
use fsgp::model::likelihood::multiclass::one_vs_each::OneVsEach;
use fsgp::model::likelihood::multiclass::{row_gradient_local, ClassLikelihood};
use fsgp::model::params::{Block, Params, QForm};
use fsgp::model::qu::cholesky::pack_factors;
use fsgp::model::scratch::Scratch;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The amortised likelihoods, with all negatives and with `samples` of them.
fn amortised(samples: Option<usize>) -> Vec<Box<dyn ClassLikelihood>> {
    vec![
        Box::new(ArSoftmax::new(4, samples).unwrap()),
        Box::new(ArLogit::new(20, 4, samples).unwrap()),
    ]
}

#[test]
fn row_gradients_match_central_differences_including_the_local_parameters() {
    let mut rng = ChaCha8Rng::seed_from_u64(43);
    for samples in [None, Some(2)] {
        for lik in amortised(samples) {
            for identity in [false, true] {
                let (k, p) = if identity { (5, 5) } else { (5, 3) };
                for case in 0..3u64 {
                    let mean: Vec<f64> = (0..p).map(|_| rng.random::<f64>() * 2.0 - 1.0).collect();
                    let var: Vec<f64> = (0..p).map(|_| 0.1 + rng.random::<f64>()).collect();
                    let phi = random_phi(&mut rng, k, p, identity);
                    let bias: Vec<f64> = (0..k).map(|_| rng.random::<f64>() - 0.5).collect();
                    let local: Vec<f64> = lik
                        .local_init(k)
                        .iter()
                        .map(|o| o + rng.random::<f64>() - 0.5)
                        .collect();
                    let class = (case as usize * 3 + 1) % k;
                    let args = [mean, var, phi, bias, local];
                    let f = |a: &[Vec<f64>; 5]| {
                        let row = (&a[0][..], &a[1][..], &a[2][..], &a[3][..]);
                        row_gradient_local(lik.as_ref(), class, (9, case), row, &a[4])
                    };
                    let (g, g_local) = f(&args);
                    let analytic = [g.mean, g.var, g.phi, g.bias, g_local];
                    let label = format!(
                        "{} S={samples:?} identity={identity} case {case}",
                        lik.name()
                    );
                    let h = 1e-5;
                    for (block, name) in ["m", "s", "Φ", "b", "o"].iter().enumerate() {
                        for j in 0..args[block].len() {
                            let at = |step: f64| {
                                let mut moved = args.clone();
                                moved[block][j] += step;
                                f(&moved).0.value
                            };
                            let fd = (at(h) - at(-h)) / (2.0 * h);
                            let rel = rel_error(analytic[block][j], fd, 1e-6);
                            assert!(
                                rel <= 1e-6,
                                "{label} ∂{name}[{j}]: analytic {} vs fd {fd} (rel {rel:.2e})",
                                analytic[block][j]
                            );
                        }
                    }
                }
            }
        }
    }
}

/// The row's utilities under q, computed directly: f̄ = Φ m + b [K] and
/// Cov(f_a, f_b) = Σ_q Φ_aq Φ_bq s_q (Φ [K×P] row-major).
fn utility_moments<'a>(
    mean: &'a [f64],
    var: &'a [f64],
    phi: &'a [f64],
    bias: &'a [f64],
) -> (Vec<f64>, impl Fn(usize, usize) -> f64 + 'a) {
    let p = mean.len();
    let fbar = (0..bias.len())
        .map(|kk| bias[kk] + (0..p).map(|q| phi[kk * p + q] * mean[q]).sum::<f64>())
        .collect();
    let cov = move |a: usize, b: usize| {
        (0..p)
            .map(|q| phi[a * p + q] * phi[b * p + q] * var[q])
            .sum::<f64>()
    };
    (fbar, cov)
}

/// A minibatch of `b` rows with classes ([`class_problem`], K_XX̃ entries in ±0.75) and an
/// amortisation network for `lik`: the paper's q(u) (M = 5 > R = 3) or the whitened
/// Cholesky q(u) (M = 4, R = 5, factors from [`positive_factors`]); Φ = I (K = P = 4) or a
/// general Φ (K = 5, P = 3).
fn problem(
    seed: u64,
    form: QForm,
    identity: bool,
    b: usize,
    lik: &dyn ClassLikelihood,
) -> (Problem, Vec<u32>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (k, p) = if identity { (4, 4) } else { (5, 3) };
    let mut u = |s: f64| (rng.random::<f64>() - 0.5) * s;
    let (mut pr, classes) = class_problem(&mut u, (form, identity), (k, p), b, 1.5);
    let (m, r) = (pr.params.a.nrows(), pr.params.a.ncols());
    if form == QForm::Whitened {
        pr.params
            .set_full(pack_factors(&positive_factors(&mut u, m, p, 0.6), true));
    }
    // A network whose last layer is not small, so that every weight matters.
    let mut net = Amortiser::init(r, 4, &lik.local_init(k), seed);
    net.w3 = Mat::from_fn(4, net.outputs(), |_, _| u(1.5));
    pr.params.amortiser = Some(net);
    (pr, classes)
}

#[test]
fn bound_gradient_matches_central_differences_through_the_network() {
    for samples in [None, Some(2)] {
        for lik in amortised(samples) {
            for form in [QForm::SiteDiagonal, QForm::Whitened] {
                for identity in [false, true] {
                    for kind in [KernelKind::Linear, KernelKind::SquaredExponential] {
                        let (pr, class) = problem(23, form, identity, 6, lik.as_ref());
                        let eval = class_bound(kind, &pr, &pr.params, &class, lik.as_ref());
                        let fds = five_point_differences(&pr.params, 1e-3, |q| {
                            class_bound(kind, &pr, q, &class, lik.as_ref()).value
                        });
                        let label = format!(
                            "{} S={samples:?} {form:?} identity={identity} {kind:?}",
                            lik.name()
                        );
                        let linear = kind == KernelKind::Linear;
                        // Relative 1e-6, and absolute 1e-11 for the entries below 1e-5 (the
                        // first layer's weights reach 1e-6): the five-point stencil's
                        // rounding with h = 10⁻³ on a bound of this size is about 10⁻¹².
                        let ((worst, block), seen) = assert_gradient_matches(
                            &eval.grads,
                            &fds,
                            linear,
                            (1e-5, 1e-6),
                            &label,
                        );
                        assert_eq!(seen.last(), Some(&Block::Amortiser), "{label}");
                        eprintln!("{label}: worst relative error {worst:.2e} ({block})");
                    }
                }
            }
        }
    }
}

/// Σ = Φ diag(s) Φᵀ [K×K] and E[exp(f_k − f_c)] for f ~ N(f̄, Σ), by the trapezoid rule over
/// ±12 sd of the difference's density: an expectation computed without the likelihood's
/// closed form.
fn expected_exp_difference(mean: f64, var: f64) -> f64 {
    let sd = var.sqrt();
    let n = 24_000;
    let (lo, hi) = (mean - 12.0 * sd, mean + 12.0 * sd);
    let h = (hi - lo) / n as f64;
    let mut total = 0.0;
    for i in 0..=n {
        let x = lo + i as f64 * h;
        let density =
            (-(x - mean).powi(2) / (2.0 * var)).exp() / (2.0 * std::f64::consts::PI * var).sqrt();
        let w = if i == 0 || i == n { 0.5 } else { 1.0 };
        total += w * density * x.exp();
    }
    total * h
}

#[test]
fn ar_softmax_bound_is_eq17_by_an_independent_expectation_and_below_the_softmax() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let lik = ArSoftmax::new(4, None).unwrap();
    let (k, p) = (4, 3);
    for case in 0..4u64 {
        let mean: Vec<f64> = (0..p).map(|_| rng.random::<f64>() * 2.0 - 1.0).collect();
        let var: Vec<f64> = (0..p).map(|_| 0.05 + 0.5 * rng.random::<f64>()).collect();
        let phi = random_phi(&mut rng, k, p, false);
        let bias: Vec<f64> = (0..k).map(|_| rng.random::<f64>() - 0.5).collect();
        let class = case as usize % k;
        let o = rng.random::<f64>() * 3.0;
        let (g, _) = row_gradient_local(&lik, class, (1, case), (&mean, &var, &phi, &bias), &[o]);
        // Independently: the joint Gaussian's moments, then eq. (17).
        let (fbar, cov) = utility_moments(&mean, &var, &phi, &bias);
        let alpha = 1.0 + o.exp().ln_1p();
        let sum: f64 = (0..k)
            .filter(|&kk| kk != class)
            .map(|kk| {
                let d_var = cov(class, class) + cov(kk, kk) - 2.0 * cov(class, kk);
                expected_exp_difference(fbar[kk] - fbar[class], d_var)
            })
            .sum();
        let direct = 1.0 - alpha.ln() - (1.0 + sum) / alpha;
        assert!(
            (g.value - direct).abs() <= 1e-9 * direct.abs().max(1.0),
            "case {case}: {} vs {direct}",
            g.value
        );
        // Below E_q[log softmax_c(f)], estimated with 200 000 draws of g ~ N(m, diag(s)).
        let mut draws = ChaCha8Rng::seed_from_u64(100 + case);
        let n = 200_000;
        let (mut acc, mut acc2) = (0.0, 0.0);
        for _ in 0..n {
            let gq: Vec<f64> = (0..p)
                .map(|q| {
                    let z: f64 =
                        rand_distr::Distribution::sample(&rand_distr::StandardNormal, &mut draws);
                    mean[q] + var[q].sqrt() * z
                })
                .collect();
            let f: Vec<f64> = (0..k)
                .map(|kk| bias[kk] + (0..p).map(|q| phi[kk * p + q] * gq[q]).sum::<f64>())
                .collect();
            let top = f.iter().cloned().fold(f64::MIN, f64::max);
            let lse = top + f.iter().map(|x| (x - top).exp()).sum::<f64>().ln();
            let v = f[class] - lse;
            acc += v;
            acc2 += v * v;
        }
        let mc = acc / n as f64;
        let se = ((acc2 / n as f64 - mc * mc) / n as f64).sqrt();
        assert!(
            g.value <= mc + 4.0 * se,
            "case {case}: bound {} above softmax {mc} ± {se}",
            g.value
        );
    }
}

#[test]
fn the_optimal_alpha_makes_the_bound_the_softmax_at_fixed_utilities() {
    let lik = ArSoftmax::new(4, None).unwrap();
    let (k, p) = (4, 4);
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let phi = random_phi(&mut rng, k, p, true);
    let mean: Vec<f64> = (0..p).map(|_| 2.0 * rng.random::<f64>() - 1.0).collect();
    let bias = vec![0.0; k];
    let var = vec![0.0; p];
    for class in 0..k {
        let f = &mean;
        let best = 1.0
            + (0..k)
                .filter(|&kk| kk != class)
                .map(|kk| (f[kk] - f[class]).exp())
                .sum::<f64>();
        // α = 1 + softplus(o) = best ⇔ o = log(e^{best − 1} − 1).
        let o = (best - 1.0).exp_m1().ln();
        assert!((ArSoftmax::alpha(o) - best).abs() < 1e-12);
        let (g, g_o) = row_gradient_local(&lik, class, (0, 0), (&mean, &var, &phi, &bias), &[o]);
        let top = f.iter().cloned().fold(f64::MIN, f64::max);
        let log_softmax = f[class] - top - f.iter().map(|x| (x - top).exp()).sum::<f64>().ln();
        assert!(
            (g.value - log_softmax).abs() < 1e-12,
            "class {class}: {} vs {log_softmax}",
            g.value
        );
        assert!(
            g_o[0].abs() < 1e-12,
            "class {class}: ∂E/∂o = {} at the optimum",
            g_o[0]
        );
        for other in [o - 0.5, o + 0.5] {
            let (worse, _) =
                row_gradient_local(&lik, class, (0, 0), (&mean, &var, &phi, &bias), &[other]);
            assert!(
                worse.value < g.value,
                "class {class}: o = {other} gives {}",
                worse.value
            );
        }
    }
}

/// A likelihood with `--class-samples` S (None: all).
type Sampled = Box<dyn Fn(Option<usize>) -> Box<dyn ClassLikelihood>>;

#[test]
fn class_subsampling_is_unbiased_and_every_negative_is_the_full_bound() {
    let mut rng = ChaCha8Rng::seed_from_u64(61);
    let (k, p) = (7, 3);
    let mean: Vec<f64> = (0..p).map(|_| rng.random::<f64>() * 2.0 - 1.0).collect();
    let var: Vec<f64> = (0..p).map(|_| 0.1 + rng.random::<f64>()).collect();
    let phi = random_phi(&mut rng, k, p, false);
    let bias: Vec<f64> = (0..k).map(|_| rng.random::<f64>() - 0.5).collect();
    let row = (&mean[..], &var[..], &phi[..], &bias[..]);
    let pairs: [(Box<dyn ClassLikelihood>, Sampled); 3] = [
        (
            Box::new(OneVsEach::new(20, 4).unwrap()),
            Box::new(|s| {
                Box::new(
                    OneVsEach::new(20, 4)
                        .unwrap()
                        .with_class_samples(s)
                        .unwrap(),
                )
            }),
        ),
        (
            Box::new(ArSoftmax::new(4, None).unwrap()),
            Box::new(|s| Box::new(ArSoftmax::new(4, s).unwrap())),
        ),
        (
            Box::new(ArLogit::new(20, 4, None).unwrap()),
            Box::new(|s| Box::new(ArLogit::new(20, 4, s).unwrap())),
        ),
    ];
    for (full, sampled) in pairs {
        let local = full.local_init(k);
        let exact = row_gradient_local(full.as_ref(), 2, (5, 0), row, &local);
        // S ≥ K − 1: every negative, bit for bit.
        for s in [k - 1, k + 3] {
            let all = row_gradient_local(sampled(Some(s)).as_ref(), 2, (5, 0), row, &local);
            assert_eq!(all, exact, "{} S = {s}", full.name());
        }
        // S = 2 of 6: the mean over 20 000 rows' draws is the full bound (4 standard errors).
        let lik = sampled(Some(2));
        let n = 20_000;
        let values: Vec<f64> = (0..n)
            .map(|stream| {
                row_gradient_local(lik.as_ref(), 2, (5, stream), row, &local)
                    .0
                    .value
            })
            .collect();
        let avg = values.iter().sum::<f64>() / n as f64;
        let sd = (values.iter().map(|v| (v - avg).powi(2)).sum::<f64>() / n as f64).sqrt();
        assert!(sd > 0.0, "{}: the draws vary", full.name());
        assert!(
            (avg - exact.0.value).abs() < 4.0 * sd / (n as f64).sqrt(),
            "{}: mean {avg} vs full {} (sd {sd})",
            full.name(),
            exact.0.value
        );
    }
}

#[test]
fn results_are_bitwise_identical_for_one_and_two_threads_and_the_forward_bound_agrees() {
    for lik in amortised(Some(3)) {
        let (pr, class) = problem(
            5,
            QForm::SiteDiagonal,
            false,
            2 * ROW_BLOCK + 9,
            lik.as_ref(),
        );
        let kind = KernelKind::SquaredExponential;
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| eval_bits(&class_bound(kind, &pr, &pr.params, &class, lik.as_ref())))
        };
        assert!(run(1) == run(2), "{}: the bound differs", lik.name());
        let unused = BernoulliLogistic::new(2).unwrap();
        let ev = class_bound(kind, &pr, &pr.params, &class, lik.as_ref());
        let expected = expected_loglik(
            kind,
            &pr.params,
            &pr.x(),
            &TermSet::Classes(bound_classes(&class, lik.as_ref())),
            &unused,
            &Scratch::new(),
        )
        .unwrap();
        let kl = kl_total(kind, &pr.params, pr.kt.as_ref(), &Scratch::new()).unwrap();
        assert!(
            (expected - kl - ev.value).abs() <= 1e-12 * ev.value.abs(),
            "{}: {} vs {}",
            lik.name(),
            expected - kl,
            ev.value
        );
    }
}

#[test]
fn the_network_must_match_the_likelihood() {
    let lik = ArSoftmax::new(4, None).unwrap();
    let (pr, class) = problem(3, QForm::SiteDiagonal, false, 4, &lik);
    let eval = |params: &Params, lik: &dyn ClassLikelihood| {
        try_class_bound(KernelKind::Linear, &pr, params, &class, lik)
            .map(|e| e.value)
            .map_err(|e| e.to_string())
    };
    assert!(eval(&pr.params, &lik).is_ok());
    let mut none = pr.params.clone();
    none.amortiser = None;
    let e = eval(&none, &lik).unwrap_err();
    assert!(e.contains("needs an amortisation network"), "{e}");
    let e = eval(&pr.params, &OneVsEach::new(20, 4).unwrap()).unwrap_err();
    assert!(e.contains("does not use"), "{e}");
    let mut wide = pr.params.clone();
    wide.amortiser = Some(Amortiser::init(7, 4, &[0.0], 1));
    let e = eval(&wide, &lik).unwrap_err();
    assert!(
        e.contains("maps 7 inputs to 1 outputs") && e.contains("rows of 3 columns"),
        "{e}"
    );
}

/// log σ(x), stable.
fn log_sigmoid(x: f64) -> f64 {
    -((-x).max(0.0) + (-x.abs()).exp().ln_1p())
}

#[test]
fn ar_logit_with_q_epsilon_near_a_point_mass_at_zero_is_one_vs_each_plus_a_constant() {
    let mut rng = ChaCha8Rng::seed_from_u64(19);
    let (k, p) = (5, 3);
    let ove = OneVsEach::new(20, 4).unwrap();
    let lik = ArLogit::new(20, 4, None).unwrap();
    for case in 0..3u64 {
        let mean: Vec<f64> = (0..p).map(|_| rng.random::<f64>() * 2.0 - 1.0).collect();
        let var: Vec<f64> = (0..p).map(|_| 0.1 + rng.random::<f64>()).collect();
        let phi = random_phi(&mut rng, k, p, false);
        let bias: Vec<f64> = (0..k).map(|_| rng.random::<f64>() - 0.5).collect();
        let row = (&mean[..], &var[..], &phi[..], &bias[..]);
        let class = case as usize % k;
        let pairs = row_gradient_local(&ove, class, (0, case), row, &[]).0.value;
        // β = softplus(−30) ≈ 9.4e-14: every ε_j within 1e-12 of 0.
        let local = [0.0, -30.0];
        let (_, beta) = ArLogit::noise(&local);
        let ar = row_gradient_local(&lik, class, (0, case), row, &local)
            .0
            .value;
        // The ε-only terms at ε = 0: log σ(0) + log σ(−0) = −2 log 2, and H(q) = log β + 2.
        let constant = -2.0 * std::f64::consts::LN_2 + beta.ln() + 2.0;
        assert!(
            (ar - constant - pairs).abs() < 1e-9,
            "case {case}: AR-logit {ar} − constant {constant} vs OVE {pairs}"
        );
    }
}

/// The AR-logit bound of a row by brute force: for each negative k, a 2-D trapezoid over
/// ε ~ Logistic(μ, β) and x = f_c − f_k ~ N(m_k, σ²_k) of log σ(ε + x); the ε-only terms by
/// a 1-D trapezoid of the logistic density (log p(ε) − log q(ε) evaluated pointwise).
fn ar_logit_brute_force(
    fbar: &[f64],
    cov: &dyn Fn(usize, usize) -> f64,
    class: usize,
    (mu, beta): (f64, f64),
) -> f64 {
    let n = 1600;
    let (e_lo, e_hi) = (mu - 40.0 * beta, mu + 40.0 * beta);
    let he = (e_hi - e_lo) / n as f64;
    let q = |e: f64| {
        let z = (e - mu) / beta;
        (-z.abs()).exp() / (beta * (1.0 + (-z.abs()).exp()).powi(2))
    };
    let trap = |i: usize, n: usize| if i == 0 || i == n { 0.5 } else { 1.0 };
    let mut total = 0.0;
    for i in 0..=n {
        let e = e_lo + i as f64 * he;
        let qe = q(e);
        if qe > 0.0 {
            let log_p = log_sigmoid(e) + log_sigmoid(-e);
            total += trap(i, n) * he * qe * (log_p - qe.ln());
        }
    }
    for kk in (0..fbar.len()).filter(|&kk| kk != class) {
        let m = fbar[class] - fbar[kk];
        let v = cov(class, class) + cov(kk, kk) - 2.0 * cov(class, kk);
        let sd = v.sqrt();
        let nx = 600;
        let (x_lo, x_hi) = (m - 10.0 * sd, m + 10.0 * sd);
        let hx = (x_hi - x_lo) / nx as f64;
        for i in 0..=n {
            let e = e_lo + i as f64 * he;
            let qe = q(e);
            let mut inner = 0.0;
            for jx in 0..=nx {
                let x = x_lo + jx as f64 * hx;
                let dens =
                    (-(x - m).powi(2) / (2.0 * v)).exp() / (2.0 * std::f64::consts::PI * v).sqrt();
                inner += trap(jx, nx) * hx * dens * log_sigmoid(e + x);
            }
            total += trap(i, n) * he * qe * inner;
        }
    }
    total
}

#[test]
fn ar_logit_bound_matches_a_brute_force_integral_on_three_classes() {
    let mut rng = ChaCha8Rng::seed_from_u64(29);
    let (k, p) = (3, 2);
    for case in 0..2u64 {
        let mean: Vec<f64> = (0..p).map(|_| rng.random::<f64>() * 2.0 - 1.0).collect();
        let var: Vec<f64> = (0..p).map(|_| 0.1 + 0.6 * rng.random::<f64>()).collect();
        let phi = random_phi(&mut rng, k, p, false);
        let bias: Vec<f64> = (0..k).map(|_| rng.random::<f64>() - 0.5).collect();
        let class = case as usize;
        let local = [rng.random::<f64>() - 0.5, rng.random::<f64>() - 1.0];
        let (fbar, cov) = utility_moments(&mean, &var, &phi, &bias);
        let direct = ar_logit_brute_force(&fbar, &cov, class, ArLogit::noise(&local));
        for (noise_pairs, tol) in [(8, 1e-2), (16, 3e-3), (64, 5e-4), (512, 2e-5)] {
            let lik = ArLogit::new(32, noise_pairs, None).unwrap();
            let ar = row_gradient_local(&lik, class, (0, case), (&mean, &var, &phi, &bias), &local)
                .0
                .value;
            eprintln!(
                "case {case}, J = {}: rule {ar} vs brute force {direct} ({:.1e})",
                2 * noise_pairs,
                (ar - direct).abs()
            );
            assert!(
                (ar - direct).abs() < tol,
                "case {case} J = {}: {ar} vs {direct}",
                2 * noise_pairs
            );
        }
    }
}
