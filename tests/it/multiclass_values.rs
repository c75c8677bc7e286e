//! The multi-class likelihoods' values against independent computations
//! (`docs/likelihood.md`, "Multi-class"): one-vs-each against brute-force grid integrals
//! (2-D over the latent values of a factor model, 1-D per pair for independent utilities);
//! robust-max's S against Monte Carlo and a fine grid for K = 3; the Monte Carlo softmax
//! against a grid integral (unbiased over seeds, and a high-sample estimate close to it);
//! one-vs-each ≤ softmax on random cases (equal at K = 2); the predictive probabilities
//! against grid integrals and Monte Carlo, and robust-max's pruned prediction against the
//! unpruned one; Hernández-Lobato's bound against grid integrals, below the multinomial
//! probit it bounds (equal at K = 2), and its predictive against the argmax grid.

use fsgp::model::likelihood::logistic::log_sigmoid;
use fsgp::model::likelihood::multiclass::hernandez_lobato::HernandezLobato;
use fsgp::model::likelihood::multiclass::one_vs_each::OneVsEach;
use fsgp::model::likelihood::multiclass::robust_max::RobustMax;
use fsgp::model::likelihood::multiclass::softmax_mc::SoftmaxMc;
use fsgp::model::likelihood::multiclass::{row_gradient, row_probabilities, ClassLikelihood};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

/// E[h(g)] for independent g_p ~ N(mean_p, var_p), p < P ≤ 3, by the trapezoid rule in the
/// standardised variables on [−9, 9]^P with the given step. The integrands here are
/// analytic in a strip, so the rule converges geometrically; the tails beyond 9 sd weigh
/// below 1e-18.
fn grid_expectation(mean: &[f64], var: &[f64], step: f64, h: impl Fn(&[f64]) -> f64) -> f64 {
    let p_count = mean.len();
    let n = (18.0 / step).round() as usize + 1;
    let xs: Vec<f64> = (0..n).map(|j| -9.0 + j as f64 * step).collect();
    let ws: Vec<f64> = xs
        .iter()
        .map(|x| step * (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt())
        .collect();
    let mut total = 0.0;
    let mut g = vec![0.0; p_count];
    for flat in 0..n.pow(p_count as u32) {
        let (mut rest, mut w) = (flat, 1.0);
        for p in 0..p_count {
            let j = rest % n;
            rest /= n;
            g[p] = mean[p] + var[p].sqrt() * xs[j];
            w *= ws[j];
        }
        total += w * h(&g);
    }
    total
}

/// f = Φ g + b (Φ row-major [K×P]).
fn utilities(phi: &[f64], bias: &[f64], g: &[f64]) -> Vec<f64> {
    let p_count = g.len();
    bias.iter()
        .enumerate()
        .map(|(k, b)| {
            b + (0..p_count)
                .map(|p| phi[k * p_count + p] * g[p])
                .sum::<f64>()
        })
        .collect()
}

fn log_softmax(f: &[f64], c: usize) -> f64 {
    let max = f.iter().cloned().fold(f64::MIN, f64::max);
    f[c] - max - f.iter().map(|x| (x - max).exp()).sum::<f64>().ln()
}

/// One random row: m, s [P] (s in [0.2, 1]), Φ [K×P] (entries in ±`phi_scale`, or I), b [K].
struct Row {
    mean: Vec<f64>,
    var: Vec<f64>,
    phi: Vec<f64>,
    bias: Vec<f64>,
}

fn random_row(rng: &mut ChaCha8Rng, k: usize, p: usize, identity: bool, phi_scale: f64) -> Row {
    Row {
        mean: (0..p).map(|_| rng.random::<f64>() * 2.0 - 1.0).collect(),
        var: (0..p).map(|_| 0.2 + 0.8 * rng.random::<f64>()).collect(),
        phi: (0..k * p)
            .map(|j| match identity {
                true => f64::from(u8::from(j / p == j % p)),
                false => (rng.random::<f64>() - 0.5) * 2.0 * phi_scale,
            })
            .collect(),
        bias: (0..k).map(|_| rng.random::<f64>() - 0.5).collect(),
    }
}

impl Row {
    fn value(&self, lik: &dyn ClassLikelihood, c: usize, seed: u64) -> f64 {
        row_gradient(
            lik,
            c,
            (seed, 0),
            &self.mean,
            &self.var,
            &self.phi,
            &self.bias,
        )
        .value
    }

    fn utilities(&self, g: &[f64]) -> Vec<f64> {
        utilities(&self.phi, &self.bias, g)
    }
}

#[test]
fn one_vs_each_equals_brute_force_integrals() {
    let ove = OneVsEach::new(32, 4).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(61);
    let mut worst = 0.0f64;
    // The factor model: a 2-D grid over the latent values g, whatever the pair covariances.
    for _ in 0..3 {
        let row = random_row(&mut rng, 4, 2, false, 0.5);
        for c in 0..4 {
            let reference = grid_expectation(&row.mean, &row.var, 0.05, |g| {
                let f = row.utilities(g);
                (0..4)
                    .filter(|&k| k != c)
                    .map(|k| log_sigmoid(f[c] - f[k]))
                    .sum()
            });
            let got = row.value(&ove, c, 0);
            worst = worst.max((got - reference).abs());
            assert!(
                (got - reference).abs() < 1e-8,
                "factor c={c}: {got} vs {reference}"
            );
        }
    }
    // Independent utilities (Φ = I): per pair a 1-D integral over d = f_c − f_k.
    for _ in 0..3 {
        let row = random_row(&mut rng, 3, 3, true, 1.0);
        for c in 0..3 {
            let reference: f64 = (0..3)
                .filter(|&k| k != c)
                .map(|k| {
                    let mean = (row.mean[c] + row.bias[c]) - (row.mean[k] + row.bias[k]);
                    let var = row.var[c] + row.var[k];
                    grid_expectation(&[mean], &[var], 0.002, |d| log_sigmoid(d[0]))
                })
                .sum();
            let got = row.value(&ove, c, 0);
            worst = worst.max((got - reference).abs());
            assert!(
                (got - reference).abs() < 1e-8,
                "identity c={c}: {got} vs {reference}"
            );
        }
    }
    eprintln!("one-vs-each against grid integrals: worst |difference| {worst:.2e}");
}

/// S = q(f_c > f_k ∀k ≠ c) for independent utilities by a fine trapezoid over f_c of
/// N(f_c; mean_c, var_c) Π_{k≠c} Φ((f_c − mean_k)/√var_k).
fn argmax_grid(c: usize, mean: &[f64], var: &[f64]) -> f64 {
    let cdf = |z: f64| 0.5 * libm::erfc(-z / std::f64::consts::SQRT_2);
    grid_expectation(&[mean[c]], &[var[c]], 0.001, |fc| {
        (0..mean.len())
            .filter(|&k| k != c)
            .map(|k| cdf((fc[0] - mean[k]) / var[k].sqrt()))
            .product()
    })
}

#[test]
fn robust_max_probability_matches_monte_carlo_and_a_fine_grid() {
    // Q = 20 (the default) and Q = 64: the quadrature error against the grid, bounded.
    let rules = [(20, 2e-5), (64, 1e-9)];
    let mut rng = ChaCha8Rng::seed_from_u64(71);
    let samples = 1_000_000;
    let (mut worst_grid, mut worst_sd) = ([0.0f64; 2], 0.0f64);
    for case in 0..4 {
        let mean: Vec<f64> = (0..3).map(|_| rng.random::<f64>() * 2.0 - 1.0).collect();
        let var: Vec<f64> = (0..3).map(|_| 0.2 + 1.3 * rng.random::<f64>()).collect();
        let mut wins = [0usize; 3];
        for _ in 0..samples {
            let f: Vec<f64> = (0..3)
                .map(|k| {
                    let e: f64 = StandardNormal.sample(&mut rng);
                    mean[k] + var[k].sqrt() * e
                })
                .collect();
            let best = (0..3).max_by(|&a, &b| f[a].total_cmp(&f[b])).unwrap();
            wins[best] += 1;
        }
        for (r, &(points, tol)) in rules.iter().enumerate() {
            let rm = RobustMax::new(1e-3, points).unwrap();
            let mut total = 0.0;
            for (c, &won) in wins.iter().enumerate() {
                let s = rm.argmax_probability(c, &mean, &var, None, &mut [0.0; 12]);
                total += s;
                let grid = argmax_grid(c, &mean, &var);
                let mc = won as f64 / samples as f64;
                let sd = (mc * (1.0 - mc) / samples as f64).sqrt();
                worst_grid[r] = worst_grid[r].max((s - grid).abs());
                worst_sd = worst_sd.max((s - mc).abs() / sd);
                assert!(
                    (s - grid).abs() < tol,
                    "Q {points} case {case} c={c}: {s} vs {grid}"
                );
                assert!(
                    (s - mc).abs() < 4.0 * sd,
                    "case {case} c={c}: {s} vs MC {mc} ± {sd}"
                );
                // E = log(1 − ε) S + log(ε/2) (1 − S) with Φ = I, s = var, f̄ = mean.
                let phi: Vec<f64> = (0..9)
                    .map(|j| f64::from(u8::from(j / 3 == j % 3)))
                    .collect();
                let e = row_gradient(&rm, c, (0, 0), &mean, &var, &phi, &[0.0; 3]).value;
                let want = (1.0 - 1e-3f64).ln() * s + (1e-3f64 / 2.0).ln() * (1.0 - s);
                assert!((e - want).abs() <= 1e-14 * want.abs(), "{e} vs {want}");
            }
            assert!((total - 1.0).abs() < tol, "Q {points}: Σ_c S_c = {total}");
        }
    }
    eprintln!(
        "robust-max S: worst |S − grid| {:.2e} (Q = 20), {:.2e} (Q = 64); worst |S − MC| {worst_sd:.2} sd",
        worst_grid[0], worst_grid[1]
    );
}

/// The softmax expectation E[log softmax(f)_c] by the grid, its Monte Carlo estimate's mean
/// and spread over `seeds` seeds with `pairs` pairs each.
fn softmax_cases(identity: bool) -> Vec<(Row, usize)> {
    let mut rng = ChaCha8Rng::seed_from_u64(if identity { 81 } else { 82 });
    let (k, p) = if identity { (3, 3) } else { (4, 2) };
    (0..2)
        .map(|i| (random_row(&mut rng, k, p, identity, 1.0), i % k))
        .collect()
}

#[test]
fn softmax_estimate_is_unbiased_and_converges_to_the_integral() {
    for identity in [false, true] {
        for (row, c) in softmax_cases(identity) {
            let step = if identity { 0.1 } else { 0.03 };
            let reference = grid_expectation(&row.mean, &row.var, step, |g| {
                log_softmax(&row.utilities(g), c)
            });
            let small = SoftmaxMc::new(8).unwrap();
            let seeds = 400;
            let values: Vec<f64> = (0..seeds).map(|s| row.value(&small, c, s)).collect();
            let mean = values.iter().sum::<f64>() / seeds as f64;
            let sd = (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (seeds - 1) as f64)
                .sqrt();
            let se = sd / (seeds as f64).sqrt();
            assert!(sd > 0.0, "the estimate must vary with the seed");
            assert!(
                (mean - reference).abs() < 4.0 * se,
                "identity={identity}: mean {mean} ± {se} vs {reference}"
            );
            // 2500× the pairs: the estimate's sd shrinks by 50.
            let large = SoftmaxMc::new(8 * 2500).unwrap();
            let high = row.value(&large, c, 12345);
            let tol = 4.0 * sd / 50.0;
            assert!(
                (high - reference).abs() < tol,
                "identity={identity}: {high} vs {reference} (tol {tol:.1e})"
            );
            eprintln!(
                "softmax identity={identity}: grid {reference:.6}, 400 seeds × 8 pairs \
                 {mean:.6} ± {se:.1e}, 20000 pairs {high:.6} (|diff| {:.1e}, tol {tol:.1e})",
                (high - reference).abs()
            );
        }
    }
}

#[test]
fn one_vs_each_is_a_lower_bound_on_the_softmax() {
    let ove = OneVsEach::new(32, 4).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(91);
    let mut smallest_gap = f64::MAX;
    for case in 0..30 {
        let identity = case % 3 == 0;
        let k = if identity { 2 + case % 2 } else { 2 + case % 5 };
        let p = if identity { k } else { 2 };
        let row = random_row(&mut rng, k, p, identity, 0.7);
        let c = case % k;
        let step = if p == 3 { 0.15 } else { 0.05 };
        let softmax = grid_expectation(&row.mean, &row.var, step, |g| {
            log_softmax(&row.utilities(g), c)
        });
        let bound = row.value(&ove, c, 0);
        if k == 2 {
            // log softmax_c = log σ(f_c − f_k): the bound is the softmax itself.
            assert!(
                (bound - softmax).abs() < 1e-8,
                "K = 2: {bound} vs {softmax}"
            );
        } else {
            assert!(bound < softmax - 1e-6, "case {case}: {bound} vs {softmax}");
            smallest_gap = smallest_gap.min(softmax - bound);
        }
    }
    eprintln!("one-vs-each below the softmax by at least {smallest_gap:.3e} (K ≥ 3)");
}

#[test]
fn predictive_probabilities_match_independent_computations() {
    let mut rng = ChaCha8Rng::seed_from_u64(101);
    // Softmax (and one-vs-each, which predicts with it) against E[softmax(f)] by the grid.
    for identity in [false, true] {
        let (k, p) = if identity { (3, 3) } else { (4, 2) };
        let row = random_row(&mut rng, k, p, identity, 1.0);
        let pairs = 20_000;
        let softmax = SoftmaxMc::new(pairs).unwrap();
        let ove = OneVsEach::new(20, pairs).unwrap();
        let got = row_probabilities(&softmax, (3, 7), &row.mean, &row.var, &row.phi, &row.bias);
        let via_ove = row_probabilities(&ove, (3, 7), &row.mean, &row.var, &row.phi, &row.bias);
        assert_eq!(got, via_ove);
        let step = if identity { 0.1 } else { 0.03 };
        for (c, &p_c) in got.iter().enumerate() {
            let reference = grid_expectation(&row.mean, &row.var, step, |g| {
                log_softmax(&row.utilities(g), c).exp()
            });
            // A probability's sd per sample is ≤ ½; antithetic pairs only reduce it.
            let tol = 4.0 * 0.5 / (2.0 * pairs as f64).sqrt();
            assert!(
                (p_c - reference).abs() < tol,
                "identity={identity} c={c}: {p_c} vs {reference}"
            );
        }
    }
    // Robust-max: (1 − ε) S_c + ε/(K − 1) (1 − S_c) with S_c from the grid.
    let rm = RobustMax::new(0.05, 20).unwrap();
    let row = random_row(&mut rng, 3, 3, true, 1.0);
    let probs = row_probabilities(&rm, (0, 0), &row.mean, &row.var, &row.phi, &row.bias);
    let f_bar: Vec<f64> = (0..3).map(|k| row.mean[k] + row.bias[k]).collect();
    for (c, &p_c) in probs.iter().enumerate() {
        let s = argmax_grid(c, &f_bar, &row.var);
        let want = 0.95 * s + 0.025 * (1.0 - s);
        assert!((p_c - want).abs() < 1e-6, "c={c}: {p_c} vs {want}");
    }
    assert!((probs.iter().sum::<f64>() - 1.0).abs() < 1e-14);
}

#[test]
fn robust_max_prediction_prunes_only_negligible_classes() {
    let mut rng = ChaCha8Rng::seed_from_u64(111);
    let rm = RobustMax::new(1e-3, 20).unwrap();
    let k = 60;
    // Spread means: most classes are far below the best one and get pruned.
    let row = random_row(&mut rng, k, k, true, 1.0);
    let mean: Vec<f64> = (0..k).map(|c| row.mean[c] * 12.0).collect();
    let var = row.var.clone();
    let probs = row_probabilities(&rm, (0, 0), &mean, &var, &row.phi, &vec![0.0; k]);
    let full: Vec<f64> = (0..k)
        .map(|c| rm.argmax_probability(c, &mean, &var, None, &mut vec![0.0; 4 * k]))
        .collect();
    let total: f64 = full.iter().sum();
    let pruned = full.iter().filter(|&&s| s < 1e-12).count();
    assert!(pruned > k / 2, "only {pruned} of {k} classes negligible");
    for (c, (&p_c, &s_c)) in probs.iter().zip(&full).enumerate() {
        let s = s_c / total;
        let want = (1.0 - 1e-3) * s + 1e-3 / (k - 1) as f64 * (1.0 - s);
        assert!((p_c - want).abs() < 1e-11, "c={c}: {p_c} vs {want}");
    }
}

/// log p(c | f) of the multinomial probit with utility noise N(0, ½ I), the model the
/// Hernández-Lobato bound is on: log q(f_c + n_c > f_k + n_k ∀k ≠ c) by a trapezoid over n_c
/// (step 0.05 sd: the integrand is smooth, the rule converges geometrically).
fn log_multinomial_probit(f: &[f64], c: usize) -> f64 {
    let cdf = |z: f64| 0.5 * libm::erfc(-z / std::f64::consts::SQRT_2);
    let sd = 0.5f64.sqrt();
    grid_expectation(&[f[c]], &[0.5], 0.05, |u| {
        (0..f.len())
            .filter(|&k| k != c)
            .map(|k| cdf((u[0] - f[k]) / sd))
            .product()
    })
    .ln()
}

#[test]
fn hernandez_lobato_equals_grid_integrals_and_bounds_the_multinomial_probit() {
    let hl = HernandezLobato::new(32).unwrap();
    let log_cdf = |z: f64| (0.5 * libm::erfc(-z / std::f64::consts::SQRT_2)).ln();
    let mut rng = ChaCha8Rng::seed_from_u64(121);
    let (mut worst, mut smallest_gap) = (0.0f64, f64::MAX);
    for case in 0..6 {
        // Even cases: a factor model with P = 2 and K = 2, 4, 3; odd: Φ = I with K = 3.
        let identity = case % 2 == 1;
        let (k, p) = if identity { (3, 3) } else { (2 + case % 3, 2) };
        let row = random_row(&mut rng, k, p, identity, 0.7);
        let c = case % k;
        let got = row.value(&hl, c, 0);
        // Σ_{k≠c} E[log Φ(f_c − f_k)] over the latent values, whatever the pair covariances.
        let step = if p == 3 { 0.15 } else { 0.05 };
        let reference = grid_expectation(&row.mean, &row.var, step, |g| {
            let f = row.utilities(g);
            (0..k)
                .filter(|&j| j != c)
                .map(|j| log_cdf(f[c] - f[j]))
                .sum()
        });
        worst = worst.max((got - reference).abs());
        assert!(
            (got - reference).abs() < 1e-7,
            "case {case}: {got} vs {reference}"
        );
        if identity {
            continue;
        }
        // The model's E_q[log p(c | f)]: a nested grid, so a coarser outer step.
        let probit = grid_expectation(&row.mean, &row.var, 0.1, |g| {
            log_multinomial_probit(&row.utilities(g), c)
        });
        if k == 2 {
            // p(c | f) = Φ(f_c − f_k) exactly: the bound is the model itself.
            assert!((got - probit).abs() < 1e-7, "K = 2: {got} vs {probit}");
        } else {
            assert!(got < probit - 1e-6, "case {case}: {got} vs {probit}");
            smallest_gap = smallest_gap.min(probit - got);
        }
    }
    eprintln!(
        "hernandez-lobato against grid integrals: worst |difference| {worst:.2e}; below the \
         multinomial probit by at least {smallest_gap:.3e} (K ≥ 3)"
    );
    // Predictive with Φ = I: the argmax probabilities of f + n, variances s_k + ½.
    let row = random_row(&mut rng, 3, 3, true, 1.0);
    let probs = row_probabilities(&hl, (0, 0), &row.mean, &row.var, &row.phi, &row.bias);
    let f_bar: Vec<f64> = (0..3).map(|k| row.mean[k] + row.bias[k]).collect();
    let noisy: Vec<f64> = row.var.iter().map(|v| v + 0.5).collect();
    for (c, &p_c) in probs.iter().enumerate() {
        let want = argmax_grid(c, &f_bar, &noisy);
        assert!((p_c - want).abs() < 1e-6, "c={c}: {p_c} vs {want}");
    }
    assert!((probs.iter().sum::<f64>() - 1.0).abs() < 1e-14);
}

#[test]
fn hernandez_lobato_prediction_prunes_to_a_positive_bound() {
    let mut rng = ChaCha8Rng::seed_from_u64(131);
    let hl = HernandezLobato::new(20).unwrap();
    let k = 60;
    let row = random_row(&mut rng, k, k, true, 1.0);
    let mean: Vec<f64> = (0..k).map(|c| row.mean[c] * 12.0).collect();
    let probs = row_probabilities(&hl, (0, 0), &mean, &row.var, &row.phi, &vec![0.0; k]);
    let noisy: Vec<f64> = row.var.iter().map(|v| v + 0.5).collect();
    let rm = RobustMax::new(1e-3, 20).unwrap();
    let full: Vec<f64> = (0..k)
        .map(|c| rm.argmax_probability(c, &mean, &noisy, None, &mut vec![0.0; 4 * k]))
        .collect();
    let total: f64 = full.iter().sum();
    let pruned = full.iter().filter(|&&s| s < 1e-12).count();
    assert!(pruned > k / 2, "only {pruned} of {k} classes negligible");
    for (c, (&p_c, &s_c)) in probs.iter().zip(&full).enumerate() {
        assert!(p_c > 0.0, "c={c}: probability 0");
        assert!(
            (p_c - s_c / total).abs() < 1e-11,
            "c={c}: {p_c} vs {}",
            s_c / total
        );
    }
}
