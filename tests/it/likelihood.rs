//! The Bernoulli-logistic expected log-likelihood by Gauss–Hermite quadrature
//! (src/model/likelihood.rs, docs/likelihood.md).

use std::f64::consts::PI;
use std::hint::black_box;
use std::time::Instant;

use fsgp::model::likelihood::logistic::*;
use fsgp::model::likelihood::*;
use fsgp::model::quadrature::GaussHermite;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

// ---------------------------------------------------------------------------------------------
// The rule

/// Γ(k + ½) = (k − ½)(k − 3/2)…(½) √π.
fn gamma_half(k: usize) -> f64 {
    (0..k).fold(PI.sqrt(), |g, i| g * (i as f64 + 0.5))
}

#[test]
fn rule_rejects_zero_points_and_unrepresentable_orders() {
    assert!(GaussHermite::new(0).is_err());
    assert!(BernoulliLogistic::new(0).is_err());
    // Beyond q = 370 the outermost weights (~e^{−t²}, t ≈ √(2q)) underflow.
    assert!(GaussHermite::new(350).is_ok());
    assert!(GaussHermite::new(400).is_err());
    assert!(GaussHermite::new(1000).is_err());
}

#[test]
fn rule_weights_sum_to_sqrt_pi_and_nodes_are_symmetric() {
    for q in [1, 2, 3, 4, 5, 7, 10, 20, 32, 33, 60, 64, 99, 100, 150] {
        let r = GaussHermite::new(q).unwrap();
        assert_eq!(r.nodes.len(), q);
        assert_eq!(r.weights.len(), q);
        let total: f64 = r.weights.iter().sum();
        assert!(
            (total - PI.sqrt()).abs() <= 4.0 * f64::EPSILON * PI.sqrt(),
            "q={q}: Σw = {total:e}"
        );
        assert!(
            r.nodes.windows(2).all(|p| p[0] < p[1]),
            "q={q}: not ascending"
        );
        for j in 0..q {
            assert_eq!(r.nodes[j], -r.nodes[q - 1 - j], "q={q}, j={j}");
            assert_eq!(r.weights[j], r.weights[q - 1 - j], "q={q}, j={j}");
            assert!(r.weights[j] > 0.0);
        }
    }
}

#[test]
fn rule_is_exact_for_polynomials_up_to_degree_2q_minus_1() {
    for q in [1, 2, 5, 20, 60, 100] {
        let r = GaussHermite::new(q).unwrap();
        let mut worst: f64 = 0.0;
        for d in 0..2 * q {
            let approx: f64 = r
                .nodes
                .iter()
                .zip(&r.weights)
                .map(|(t, w)| w * t.powi(d as i32))
                .sum();
            if d % 2 == 1 {
                // Odd moments vanish; compare against the scale of the terms.
                let scale: f64 = r
                    .nodes
                    .iter()
                    .zip(&r.weights)
                    .map(|(t, w)| (w * t.powi(d as i32)).abs())
                    .sum();
                assert!(approx.abs() <= 1e-14 * scale, "q={q}, d={d}: {approx:e}");
            } else {
                let exact = gamma_half(d / 2);
                let rel = (approx - exact).abs() / exact;
                worst = worst.max(rel);
            }
        }
        eprintln!(
            "q={q:3}: max relative error of the even moments t^0..t^{}: {worst:.2e}",
            2 * q - 2
        );
        assert!(worst <= 1e-13, "q={q}: {worst:e}");
    }
}

#[test]
fn rule_matches_tabulated_nodes_and_weights() {
    // Abramowitz & Stegun, table 25.10 (positive nodes, their weights).
    let tables: [(usize, &[(f64, f64)]); 4] = [
        (2, &[(0.707_106_781_186_547_5, 0.886_226_925_452_758)]),
        (
            3,
            &[
                (0.0, 1.181_635_900_603_677),
                (1.224_744_871_391_589, 0.295_408_975_150_919_3),
            ],
        ),
        (
            4,
            &[
                (0.524_647_623_275_290_3, 0.804_914_090_005_512_8),
                (1.650_680_123_885_785, 0.081_312_835_447_245_18),
            ],
        ),
        (
            5,
            &[
                (0.0, 0.945_308_720_482_941_9),
                (0.958_572_464_613_818_5, 0.393_619_323_152_241_2),
                (2.020_182_870_456_086, 0.019_953_242_059_045_91),
            ],
        ),
    ];
    for (q, entries) in tables {
        let r = GaussHermite::new(q).unwrap();
        for &(t, w) in entries {
            let j = r
                .nodes
                .iter()
                .position(|&x| (x - t).abs() < 1e-6)
                .unwrap_or_else(|| panic!("q={q}: node {t} missing from {:?}", r.nodes));
            assert!(
                (r.nodes[j] - t).abs() <= 2e-15 * t.abs().max(1.0),
                "q={q}: {} vs {t}",
                r.nodes[j]
            );
            assert!(
                (r.weights[j] - w).abs() <= 2e-15 * w,
                "q={q}: {} vs {w}",
                r.weights[j]
            );
        }
    }
    // Closed forms for q = 2 and 3.
    let r = GaussHermite::new(2).unwrap();
    assert!((r.nodes[1] - 0.5f64.sqrt()).abs() <= 1e-16);
    let r = GaussHermite::new(3).unwrap();
    assert!((r.nodes[2] - 1.5f64.sqrt()).abs() <= 2e-16);
    assert!((r.weights[1] - 2.0 * PI.sqrt() / 3.0).abs() <= 2e-16);
}

#[test]
fn rule_weights_small_ones_are_relatively_accurate() {
    // The outermost weight of the q-point rule has the closed form
    // w = 2^{q−1} q! √π / (q² H_{q−1}(t)²); evaluate H_{q−1} via the scaled recurrence in
    // log space and compare in relative terms (it is ~1e-23 at q = 40).
    for q in [10, 20, 40] {
        let r = GaussHermite::new(q).unwrap();
        let t = r.nodes[q - 1];
        // h_k = H_k(t) / sqrt(2^k k!) with h_{k+1} = (√2 t h_k − √k h_{k−1}) / √(k+1).
        let (mut prev, mut cur) = (0.0f64, 1.0f64);
        for k in 0..q - 1 {
            let next =
                ((2.0f64).sqrt() * t * cur - (k as f64).sqrt() * prev) / ((k + 1) as f64).sqrt();
            prev = cur;
            cur = next;
        }
        // H_{q−1}² = h² 2^{q−1} (q−1)!  ⇒  w = q! √π / (q² (q−1)! h²) = √π / (q h²).
        let w = PI.sqrt() / (q as f64 * cur * cur);
        let rel = (r.weights[q - 1] - w).abs() / w;
        assert!(rel <= 1e-13, "q={q}: {} vs {w} ({rel:e})", r.weights[q - 1]);
    }
}

// ---------------------------------------------------------------------------------------------
// log σ and σ

#[test]
fn sigmoid_functions_are_stable_and_accurate() {
    assert_eq!(log_sigmoid(800.0), 0.0);
    assert_eq!(log_sigmoid(-800.0), -800.0);
    assert_eq!(sigmoid(800.0), 1.0);
    assert_eq!(sigmoid(-800.0), 0.0);
    assert_eq!(sigmoid(0.0), 0.5);
    assert!((log_sigmoid(0.0) + 2f64.ln()).abs() < 1e-16);
    assert!(log_sigmoid(f64::NAN).is_nan() && sigmoid(f64::NAN).is_nan());
    assert_eq!(log_sigmoid(f64::INFINITY), 0.0);
    assert_eq!(log_sigmoid(f64::NEG_INFINITY), f64::NEG_INFINITY);
    // Tails: log σ(t) ≈ −e^{−t} for large t; σ(−t) ≈ e^{−t}.
    for t in [40.0f64, 100.0, 700.0] {
        let e = (-t).exp();
        assert!((log_sigmoid(t) + e).abs() <= 1e-15 * e, "t={t}");
        assert!((sigmoid(-t) - e).abs() <= 1e-15 * e, "t={t}");
        assert!((log_sigmoid(-t) - (-t - e)).abs() <= 1e-15 * t, "t={t}");
    }
    // Against the naive formulas where those are fine.
    let mut t: f64 = -30.0;
    while t <= 30.0 {
        // The naive log loses relative accuracy once 1 + e^{−t} rounds (t ≳ 1); there, sum
        // the series log(1 + x) = Σ (−1)^{k+1} x^k / k with x = e^{−t} ≤ e^{−1}.
        let naive_log = if t <= 1.0 {
            -(1.0 + (-t).exp()).ln()
        } else {
            let x = (-t).exp();
            -(1..60).rev().fold(0.0, |acc, k| {
                acc + (if k % 2 == 1 { 1.0 } else { -1.0 }) * x.powi(k) / k as f64
            })
        };
        let naive_sig = 1.0 / (1.0 + (-t).exp());
        assert!(
            (log_sigmoid(t) - naive_log).abs() <= 4.0 * f64::EPSILON * naive_log.abs().max(1e-300),
            "t={t}: {} vs {naive_log}",
            log_sigmoid(t)
        );
        assert!(
            (sigmoid(t) - naive_sig).abs() <= 4.0 * f64::EPSILON * naive_sig,
            "t={t}: {} vs {naive_sig}",
            sigmoid(t)
        );
        assert!((sigmoid(t) + sigmoid(-t) - 1.0).abs() <= 2.0 * f64::EPSILON);
        t += 0.37;
    }
}

// ---------------------------------------------------------------------------------------------
// The expectation against an independent integral

/// E_{f~N(m,v)}[log σ(y f)] by the composite trapezoid rule in ξ = (f − m)/√v on
/// [−40, 40] with step h. The integrand is analytic in the strip |Im ξ| < π/√v (log σ has its
/// branch points at ±iπ), so the rule converges geometrically, like e^{−2π²/(h√v)}.
fn reference(y: f64, m: f64, v: f64, h: f64) -> f64 {
    let s = v.sqrt();
    let n = (80.0 / h).round() as i64;
    let norm = 1.0 / (2.0 * PI).sqrt();
    let mut sum = 0.0;
    for i in 0..=n {
        let xi = -40.0 + i as f64 * h;
        let end = if i == 0 || i == n { 0.5 } else { 1.0 };
        sum += end * (-0.5 * xi * xi).exp() * log_sigmoid(y * (m + s * xi));
    }
    sum * h * norm
}

const GRID_VARS: [f64; 7] = [1e-6, 1e-2, 0.5, 1.0, 4.0, 25.0, 100.0];

fn convergence_grid() -> Vec<(f64, f64, f64)> {
    let mut grid = Vec::new();
    for y in [1.0, -1.0] {
        for m in [-20.0, -5.0, -1.0, 0.0, 0.3, 2.0, 8.0] {
            for v in GRID_VARS {
                grid.push((y, m, v));
            }
        }
    }
    grid
}

#[test]
fn expectation_converges_to_an_independent_integral() {
    let grid = convergence_grid();
    let refs: Vec<f64> = grid
        .iter()
        .map(|&(y, m, v)| {
            let a = reference(y, m, v, 0.004);
            let b = reference(y, m, v, 0.002);
            assert!(
                (a - b).abs() <= 1e-13 * a.abs().max(1.0),
                "reference not converged at {y},{m},{v}"
            );
            b
        })
        .collect();
    // errors[q][v]: max over y and m of |E_Q − E|.
    let qs = [5, 10, 20, 32, 64, 100];
    let mut errors = vec![[0.0f64; GRID_VARS.len()]; qs.len()];
    eprintln!("max |E_Q − E| over y ∈ {{±1}}, m ∈ {{−20, −5, −1, 0, 0.3, 2, 8}}:");
    eprintln!(
        "  Q   {}",
        GRID_VARS.map(|v| format!("v={v:<7e}")).join(" ")
    );
    for (qi, &q) in qs.iter().enumerate() {
        let lik = BernoulliLogistic::new(q).unwrap();
        for (&(y, m, v), &r) in grid.iter().zip(&refs) {
            let e = lik.expect(y, m, v).value;
            assert_eq!(
                e,
                lik.expect_value(y, m, v),
                "value differs from expect_value"
            );
            let vi = GRID_VARS.iter().position(|&x| x == v).unwrap();
            errors[qi][vi] = errors[qi][vi].max((e - r).abs());
        }
        let row = errors[qi].map(|e| format!("{e:<9.2e}")).join(" ");
        let all = errors[qi].iter().fold(0.0f64, |a, &b| a.max(b));
        let moderate = errors[qi][..5].iter().fold(0.0f64, |a, &b| a.max(b));
        eprintln!("{q:3}   {row}  | all {all:.2e}, v ≤ 4 {moderate:.2e}");
    }
    let at = |q: usize, v: f64| {
        let qi = qs.iter().position(|&x| x == q).unwrap();
        let vi = GRID_VARS.iter().position(|&x| x == v).unwrap();
        errors[qi][vi]
    };
    let max_upto = |q: usize, vmax: f64| {
        GRID_VARS
            .iter()
            .filter(|&&v| v <= vmax)
            .map(|&v| at(q, v))
            .fold(0.0f64, f64::max)
    };
    // Documented bounds (docs/likelihood.md, "Measured accuracy").
    assert!(max_upto(20, 1.0) <= 1e-7, "Q=20, v ≤ 1");
    assert!(max_upto(20, 4.0) <= 5e-6, "Q=20, v ≤ 4");
    assert!(max_upto(20, 100.0) <= 5e-2, "Q=20, v ≤ 100");
    assert!(max_upto(100, 4.0) <= 1e-11, "Q=100, v ≤ 4");
    assert!(max_upto(100, 100.0) <= 1e-3, "Q=100, v ≤ 100");
    // Convergence in Q at every variance.
    for vi in 0..GRID_VARS.len() {
        assert!(
            errors[qs.len() - 1][vi] < errors[1][vi].max(1e-14),
            "no convergence at v={}",
            GRID_VARS[vi]
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Derivatives

/// Fourth-order central difference of `f` at `x` with step `h`.
fn diff4(f: impl Fn(f64) -> f64, x: f64, h: f64) -> f64 {
    (-f(x + 2.0 * h) + 8.0 * f(x + h) - 8.0 * f(x - h) + f(x - 2.0 * h)) / (12.0 * h)
}

/// Richardson extrapolation of two fourth-order differences (h, h/2): sixth order.
fn diff6(f: impl Fn(f64) -> f64, x: f64, h: f64) -> f64 {
    (16.0 * diff4(&f, x, 0.5 * h) - diff4(&f, x, h)) / 15.0
}

#[test]
fn derivatives_match_finite_differences_of_the_quadrature_value() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for q in [DEFAULT_POINTS, 5, 21, 64] {
        let lik = BernoulliLogistic::new(q).unwrap();
        let (mut worst_m, mut worst_v) = (0.0f64, 0.0f64);
        for _ in 0..2000 {
            let y = if rng.random_bool(0.5) { 1.0 } else { -1.0 };
            let m = rng.random_range(-5.0..5.0);
            let v = 10f64.powf(rng.random_range(-4.0..50f64.log10()));
            let e = lik.expect(y, m, v);
            let fd_m = diff4(|x| lik.expect_value(y, x, v), m, 1e-3 * v.sqrt().max(0.1));
            // E_Q is analytic in v, its singularities v = ((±iπ − m)/x_j)² (x_j = √2 t_j)
            // no closer to v ≥ 0 than ~0.17 at Q = 20, so a step a fixed fraction of a small
            // v is safe; rounding in E (|E| up to ~5 while ∂E/∂v ~ 1e-3) is the limit, hence
            // the large steps and sixth order.
            let fd_v = diff6(|x| lik.expect_value(y, m, x), v, 0.3 * v / (1.0 + 4.0 * v));
            let rel_m = (e.d_mean - fd_m).abs() / e.d_mean.abs();
            let rel_v = (e.d_var - fd_v).abs() / e.d_var.abs();
            worst_m = worst_m.max(rel_m);
            worst_v = worst_v.max(rel_v);
            assert!(
                rel_m <= 1e-7,
                "Q={q} y={y} m={m} v={v}: d_mean {} vs fd {fd_m}",
                e.d_mean
            );
            assert!(
                rel_v <= 1e-7,
                "Q={q} y={y} m={m} v={v}: d_var {} vs fd {fd_v}",
                e.d_var
            );
        }
        eprintln!("Q={q}: max relative FD error d_mean {worst_m:.1e}, d_var {worst_v:.1e}");
    }
}

/// −½ Σ_j (w_j/√π) σ(f_j) σ(−f_j): the Price form of ∂E/∂v on the same nodes.
fn price_form(rule: &GaussHermite, m: f64, v: f64) -> f64 {
    let s = (2.0 * v).sqrt();
    -0.5 * rule
        .nodes
        .iter()
        .zip(&rule.weights)
        .map(|(t, w)| w * sigmoid(m + s * t) * sigmoid(-(m + s * t)))
        .sum::<f64>()
        / PI.sqrt()
}

#[test]
fn d_var_is_the_derivative_of_the_computed_value_not_the_price_form() {
    // Where the quadrature is coarse the two forms differ visibly; finite differences of the
    // returned value follow the quadrature-exact form.
    let q = 5;
    let lik = BernoulliLogistic::new(q).unwrap();
    let rule = GaussHermite::new(q).unwrap();
    for (y, m, v) in [(1.0, 0.5, 9.0), (-1.0, -1.0, 4.0), (1.0, 2.0, 25.0)] {
        let d = lik.expect(y, m, v).d_var;
        let p = price_form(&rule, m, v);
        let fd = diff6(|x| lik.expect_value(y, m, x), v, 0.05 * v);
        assert!(
            (d - p).abs() > 1e-4 * d.abs(),
            "forms agree too well at {m}, {v}"
        );
        assert!(
            (d - fd).abs() <= 1e-9 * d.abs(),
            "m={m} v={v}: {d} vs fd {fd}"
        );
        eprintln!("Q=5, y={y}, m={m}, v={v}: exact-quadrature {d:.6e}, Price {p:.6e}, FD {fd:.6e}");
    }
}

#[test]
fn quadrature_exact_and_price_forms_agree_to_quadrature_accuracy() {
    // Price/Bonnet: ∂E/∂v = ½ E[d²/df² log σ(yf)] = −½ E[σ(f)σ(−f)], evaluated here with the
    // same nodes; the library's d_var differentiates the quadrature sum instead. Both
    // approximate the exact derivative, so they agree to quadrature accuracy.
    let q = 32;
    let lik = BernoulliLogistic::new(q).unwrap();
    let rule = GaussHermite::new(q).unwrap();
    for y in [1.0, -1.0] {
        for m in [-5.0, -1.0, 0.0, 0.7, 3.0] {
            for (v, tol) in [(1e-3, 1e-13), (0.1, 1e-13), (1.0, 1e-10), (2.0, 1e-8)] {
                let d = lik.expect(y, m, v).d_var;
                let p = price_form(&rule, m, v);
                assert!((d - p).abs() <= tol, "y={y} m={m} v={v}: {d} vs Price {p}");
            }
        }
    }
}

#[test]
fn variance_to_zero_limit_is_finite_and_continuous() {
    let lik = BernoulliLogistic::new(DEFAULT_POINTS).unwrap();
    for y in [1.0, -1.0] {
        for m in [-40.0, -3.0, -0.5, 0.0, 0.2, 2.5, 40.0] {
            let limit_value = log_sigmoid(y * m);
            let limit_d_mean = y * sigmoid(-y * m);
            let limit_d_var = -0.5 * sigmoid(m) * sigmoid(-m);
            for v in [0.0, 1e-320, 1e-300, 1e-30, 1e-12] {
                let e = lik.expect(y, m, v);
                assert!(
                    e.value.is_finite() && e.d_mean.is_finite() && e.d_var.is_finite(),
                    "y={y} m={m} v={v}: {e:?}"
                );
                assert!((e.value - limit_value).abs() <= 1e-6 * (1.0 + limit_value.abs()));
                assert!((e.d_mean - limit_d_mean).abs() <= 1e-6);
                assert!(
                    (e.d_var - limit_d_var).abs() <= 1e-6 * limit_d_var.abs().max(1e-300),
                    "y={y} m={m} v={v}: {} vs {limit_d_var}",
                    e.d_var
                );
            }
            let e0 = lik.expect(y, m, 0.0);
            assert!((e0.value - limit_value).abs() <= 1e-14 * limit_value.abs().max(1.0));
            assert!((e0.d_var - limit_d_var).abs() <= 1e-14 * limit_d_var.abs());
            // Across the switch from the Price form to the quadrature-exact form at
            // VAR_FLOOR: the two sides agree to rounding.
            let below = lik.expect(y, m, VAR_FLOOR);
            let above = lik.expect(y, m, VAR_FLOOR * (1.0 + 1e-12));
            let jump = (below.d_var - above.d_var).abs() / below.d_var.abs();
            assert!(jump <= 1e-9, "y={y} m={m}: jump {jump:e} at VAR_FLOOR");
        }
    }
}

#[test]
fn nan_inputs_give_nan() {
    let lik = BernoulliLogistic::new(DEFAULT_POINTS).unwrap();
    let e = lik.expect(1.0, 0.0, f64::NAN);
    assert!(e.value.is_nan() && e.d_mean.is_nan() && e.d_var.is_nan());
    assert!(lik.expect_value(1.0, 0.0, f64::NAN).is_nan());
    for v in [0.0, 1.0] {
        let e = lik.expect(1.0, f64::NAN, v);
        assert!(
            e.value.is_nan() && e.d_mean.is_nan() && e.d_var.is_nan(),
            "{e:?}"
        );
    }
    assert!(lik.expect_value(-1.0, f64::NAN, 1.0).is_nan());
}

#[test]
fn symmetry_in_the_label() {
    // log σ(−f) = log σ(f) − f  ⇒  E(−1, m, v) = E(+1, m, v) − m, ∂_m differs by 1, ∂_v equal.
    let lik = BernoulliLogistic::new(DEFAULT_POINTS).unwrap();
    for m in [-7.0, -1.0, 0.0, 0.4, 3.0] {
        for v in [0.0, 1e-4, 0.3, 2.0, 30.0] {
            let p = lik.expect(1.0, m, v);
            let n = lik.expect(-1.0, m, v);
            let scale = 1.0 + m.abs();
            assert!(
                (n.value - (p.value - m)).abs() <= 1e-13 * scale,
                "m={m} v={v}"
            );
            assert!((n.d_mean - (p.d_mean - 1.0)).abs() <= 1e-14, "m={m} v={v}");
            assert!(
                (n.d_var - p.d_var).abs() <= 1e-13 * p.d_var.abs().max(1e-3),
                "m={m} v={v}"
            );
        }
    }
}

proptest! {
    #[test]
    fn expectation_is_nonpositive_concave_and_bounded(
        positive in any::<bool>(),
        m in -50.0f64..50.0,
        v in prop_oneof![Just(0.0), 0.0f64..1e3, (-30.0f64..3.0).prop_map(|e| 10f64.powf(e))],
        q in prop_oneof![Just(DEFAULT_POINTS), 1usize..40],
    ) {
        let lik = BernoulliLogistic::new(q).unwrap();
        let y = if positive { 1.0 } else { -1.0 };
        let e = lik.expect(y, m, v);
        prop_assert!(e.value.is_finite() && e.d_mean.is_finite() && e.d_var.is_finite(), "{:?}", e);
        prop_assert!(e.value <= 0.0, "{:?}", e);
        prop_assert!(e.d_var <= 0.0, "{:?}", e);
        prop_assert!(e.d_mean.abs() <= 1.0, "{:?}", e);
        // The sign of ∂E/∂m is that of y (log σ(yf) increases with yf).
        prop_assert!(y * e.d_mean >= 0.0, "{:?}", e);
        prop_assert_eq!(e.value, lik.expect_value(y, m, v));
    }
}

// ---------------------------------------------------------------------------------------------
// Timing (informational; the test profile is optimised)

#[test]
fn timing_per_call() {
    let lik = BernoulliLogistic::new(DEFAULT_POINTS).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let inputs: Vec<(f64, f64, f64)> = (0..4096)
        .map(|_| {
            let y = if rng.random_bool(0.5) { 1.0 } else { -1.0 };
            (y, rng.random_range(-5.0..5.0), rng.random_range(0.01..4.0))
        })
        .collect();
    let rounds = 50;
    let calls = (rounds * inputs.len()) as f64;
    let mut acc = 0.0;
    // Best of five repetitions (the machine may be shared).
    let (mut full, mut value_only) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..5 {
        let start = Instant::now();
        for _ in 0..rounds {
            for &(y, m, v) in &inputs {
                let e = lik.expect(black_box(y), black_box(m), black_box(v));
                acc += e.value + e.d_mean + e.d_var;
            }
        }
        full = full.min(start.elapsed().as_secs_f64() * 1e9 / calls);
        let start = Instant::now();
        for _ in 0..rounds {
            for &(y, m, v) in &inputs {
                acc += lik.expect_value(black_box(y), black_box(m), black_box(v));
            }
        }
        value_only = value_only.min(start.elapsed().as_secs_f64() * 1e9 / calls);
    }
    let y: Vec<f64> = inputs.iter().map(|c| c.0).collect();
    let (mut m, mut v, mut e) = (vec![0.0; y.len()], vec![0.0; y.len()], vec![0.0; y.len()]);
    let mut lanes = f64::INFINITY;
    for _ in 0..5 {
        let start = Instant::now();
        for _ in 0..rounds {
            for (j, c) in inputs.iter().enumerate() {
                m[j] = c.1;
                v[j] = c.2;
            }
            lik.expect_lanes(&y, &mut m, &mut v, &mut e);
            acc += e[0] + m[1] + v[2];
        }
        lanes = lanes.min(start.elapsed().as_secs_f64() * 1e9 / calls);
    }
    black_box(acc);
    eprintln!(
        "Q={DEFAULT_POINTS}: expect {full:.1} ns/call, expect_value {value_only:.1} ns/call, \
         expect_lanes {lanes:.1} ns/pair (one thread, best of 5)"
    );
    assert!(acc.is_finite());
}

// ---------------------------------------------------------------------------------------------
// The batched (SIMD-friendly) form

/// Relative difference, with an absolute floor for results that are ~0.
fn rel_diff(a: f64, b: f64, floor: f64) -> f64 {
    (a - b).abs() / a.abs().max(b.abs()).max(floor)
}

#[test]
fn expect_lanes_agrees_with_the_scalar_expectation() {
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    let mut cases: Vec<(f64, f64, f64)> = Vec::new();
    for &m in &[
        -800.0, -40.0, -8.0, -1.0, -1e-3, 0.0, 1e-9, 0.5, 3.0, 25.0, 700.0,
    ] {
        for &v in &[
            0.0, 1e-300, 1e-12, 1e-10, 1.1e-10, 1e-6, 0.01, 0.7, 4.0, 60.0, 1e4,
        ] {
            for y in [1.0, -1.0] {
                cases.push((y, m, v));
            }
        }
    }
    for _ in 0..5000 {
        let y = if rng.random::<bool>() { 1.0 } else { -1.0 };
        let m = (rng.random::<f64>() - 0.5) * 30.0;
        let v = (rng.random::<f64>() * 12.0 - 9.0).exp();
        cases.push((y, m, v));
    }
    // 11 · 11 · 2 + 5000 is not a multiple of LANES: the padded tail is exercised too.
    assert_ne!(cases.len() % LANES, 0);
    for q in [20, 7] {
        let lik = BernoulliLogistic::new(q).unwrap();
        let y: Vec<f64> = cases.iter().map(|c| c.0).collect();
        let mut mean: Vec<f64> = cases.iter().map(|c| c.1).collect();
        let mut var: Vec<f64> = cases.iter().map(|c| c.2).collect();
        let mut value = vec![0.0; cases.len()];
        lik.expect_lanes(&y, &mut mean, &mut var, &mut value);
        let mut worst = [0.0f64; 3];
        for (j, &(yy, m, v)) in cases.iter().enumerate() {
            let e = lik.expect(yy, m, v);
            let errs = [
                rel_diff(value[j], e.value, 1e-300),
                rel_diff(mean[j], e.d_mean, 1e-300),
                // Above VAR_FLOOR, ∂E/∂v is a difference of nearly equal sums divided by
                // 2√v; its conditioning is about σ(−|m|)/√v, the size of those sums, which
                // bounds the rounding error of either implementation.
                rel_diff(
                    var[j],
                    e.d_var,
                    (sigmoid(-m.abs()) / v.max(1e-300).sqrt()).max(1e-300),
                ),
            ];
            for (w, e) in worst.iter_mut().zip(errs) {
                *w = w.max(e);
            }
            assert!(
                errs[0] <= 1e-14 && errs[1] <= 1e-14 && errs[2] <= 1e-13,
                "q={q} (y, m, v) = ({yy}, {m}, {v}): lanes ({}, {}, {}) vs scalar {e:?}",
                value[j],
                mean[j],
                var[j]
            );
        }
        eprintln!(
            "q={q}: worst relative differences value {:.1e}, d_mean {:.1e}, d_var {:.1e}",
            worst[0], worst[1], worst[2]
        );
    }
    // NaN in, NaN out, in any lane.
    let lik = BernoulliLogistic::new(20).unwrap();
    let (mut m, mut v, mut e) = (
        vec![0.3, f64::NAN, 1.0],
        vec![f64::NAN, 1.0, 0.5],
        vec![0.0; 3],
    );
    lik.expect_lanes(&[1.0, -1.0, 1.0], &mut m, &mut v, &mut e);
    assert!(e[0].is_nan() && m[0].is_nan() && v[0].is_nan());
    assert!(e[1].is_nan() && m[1].is_nan() && v[1].is_nan());
    assert!(e[2].is_finite());
}
