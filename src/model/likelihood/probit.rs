//! The Bernoulli likelihood with the probit link, p(y | f) = Φ(y f) for y = ±1 (Φ the
//! standard normal distribution function), as used for binary GP classification by Hensman,
//! Matthews & Ghahramani, *Scalable Variational Gaussian Process Classification*. Its
//! Gaussian expectation
//!
//! E(y, m, v) = E_{f ~ N(m, v)}[ log Φ(y f) ]
//!
//! is computed by the same Gauss–Hermite rule as the logistic likelihood
//! ([`crate::model::likelihood::logistic::BernoulliLogistic`]), with ∂E/∂m and ∂E/∂v the exact derivatives
//! of the returned quadrature sum (and the Price form −½ E[r(z)(z + r(z))] of ∂E/∂v at
//! v ≤ [`VAR_FLOOR`]). `docs/likelihood.md`, "The probit likelihood", has the formulas, the
//! numerically stable log Φ(z) and inverse Mills ratio r(z) = φ(z)/Φ(z) for very negative z,
//! and the measured quadrature error.
//!
//! Pure math: no files, no allocation per call.

use anyhow::Result;

use crate::linalg::clear_upper_simd_state;
use crate::model::likelihood::{Expectation, Likelihood, VAR_FLOOR};
use crate::model::quadrature::{GaussHermite, SymmetricRule};

/// Below z = −MILLS_SWITCH, log Φ(z) and r(z) come from the continued fraction of the
/// Mills ratio (erfc's value there is still accurate, but Φ(z) underflows at z ≈ −38.5 and
/// z + r(z) cancels); above, from `libm::erfc`.
const MILLS_SWITCH: f64 = 6.0;

/// Terms of the Mills-ratio continued fraction. At x = 6 the fraction truncated after 20
/// terms is off by 2e-17 relative and the error falls fast with x (`docs/likelihood.md`).
const MILLS_TERMS: u32 = 28;

/// ½ log(2π).
const HALF_LOG_2PI: f64 = 0.918_938_533_204_672_8;

/// 1/√(2π).
const INV_SQRT_2PI: f64 = 0.398_942_280_401_432_7;

/// The continued fraction t₁ of the Mills ratio tail for x ≥ [`MILLS_SWITCH`]:
/// Φ(−x)/φ(x) = 1/(x + 1/t₁) with t₁ = x + 2/(x + 3/(x + …)) (Laplace's continued
/// fraction, evaluated backwards from [`MILLS_TERMS`] terms).
#[inline]
fn mills_tail(x: f64) -> f64 {
    let mut t = x;
    for k in (2..=MILLS_TERMS).rev() {
        t = x + f64::from(k) / t;
    }
    t
}

/// (log Φ(z), r(z) = φ(z)/Φ(z), z + r(z)), each to about 1e-14 relative for every finite z
/// (the rounding of erfc's argument z/√2, amplified by 2x², bounds it for 3 < |z| < 8); the
/// third is formed without the cancellation of z + r for very negative z. z = ±∞ gives the
/// limits; NaN gives NaN.
#[inline]
pub fn probit_terms(z: f64) -> (f64, f64, f64) {
    if z < -MILLS_SWITCH {
        let x = -z;
        let t1 = mills_tail(x);
        // R = Φ(−x)/φ(x) = 1/(x + 1/t₁), so r(z) = 1/R = x + 1/t₁ and z + r(z) = 1/t₁.
        let inv_t1 = 1.0 / t1;
        let r = x + inv_t1;
        let log_cdf = -0.5 * z * z - HALF_LOG_2PI - r.ln();
        (log_cdf, r, inv_t1)
    } else {
        let pdf = INV_SQRT_2PI * (-0.5 * z * z).exp();
        let (cdf, log_cdf) = if z > 0.0 {
            // Φ(z) = 1 − ½ erfc(z/√2): log1p keeps log Φ accurate as it tends to 0.
            let upper = 0.5 * libm::erfc(z * std::f64::consts::FRAC_1_SQRT_2);
            (1.0 - upper, (-upper).ln_1p())
        } else {
            let cdf = 0.5 * libm::erfc(-z * std::f64::consts::FRAC_1_SQRT_2);
            (cdf, cdf.ln())
        };
        let r = pdf / cdf;
        (log_cdf, r, z + r)
    }
}

/// log Φ(z), stable for every z (log Φ(−40) = −804.608…, log Φ(40) = 0).
#[inline]
pub fn log_normal_cdf(z: f64) -> f64 {
    probit_terms(z).0
}

/// The inverse Mills ratio r(z) = φ(z)/Φ(z) = d log Φ(z)/dz, stable for every z
/// (r(z) ≈ −z for z → −∞, → 0 for z → ∞).
#[inline]
pub fn inverse_mills(z: f64) -> f64 {
    probit_terms(z).1
}

/// Φ(z), the standard normal distribution function, to full relative accuracy.
#[inline]
pub fn normal_cdf(z: f64) -> f64 {
    0.5 * libm::erfc(-z * std::f64::consts::FRAC_1_SQRT_2)
}

/// E_{f~N(m,v)}[log Φ(y f)] by Gauss–Hermite quadrature, stored as the symmetric pairs
/// ±x_k (x_k = √2 t_k > 0) with weights u_k = w_k/√π plus the centre weight u_0 of odd Q:
/// E ≈ u_0 log Φ(c) + Σ_k u_k [log Φ(c + b x_k) + log Φ(c − b x_k)], c = y m, b = y √v.
#[derive(Debug, Clone)]
pub struct BernoulliProbit {
    points: usize,
    /// √2 t_k for the positive nodes, ascending.
    half_nodes: Vec<f64>,
    /// w_k / √π for the positive nodes.
    half_weights: Vec<f64>,
    /// w / √π of the node at 0 (odd Q), else 0.
    centre_weight: f64,
}

impl BernoulliProbit {
    /// The expectation with a `points`-point Gauss–Hermite rule; errors for 0 points.
    pub fn new(points: usize) -> Result<Self> {
        let rule = GaussHermite::new(points)?;
        let SymmetricRule {
            half_nodes,
            half_weights,
            centre_weight,
        } = rule.symmetric();
        Ok(BernoulliProbit {
            points,
            half_nodes,
            half_weights,
            centre_weight,
        })
    }

    /// The number of quadrature points Q.
    pub fn points(&self) -> usize {
        self.points
    }

    /// E(y, m, v) and its partial derivatives; y must be ±1, v ≥ 0.
    ///
    /// ∂E/∂m = y Σ_j u_j r(z_j) (z_j = y f_j, f_j = m + √v x_j). For v > [`VAR_FLOOR`],
    /// ∂E/∂v = y Σ_j u_j r(z_j) x_j / (2√v), the derivative of the returned sum through the
    /// node positions; at or below it the Price form ½ E[∂²/∂f² log Φ(y f)] =
    /// −½ Σ_j u_j r(z_j)(z_j + r(z_j)), which the other tends to as v → 0 without its 0/0.
    /// A NaN input gives a NaN result.
    pub fn expect(&self, y: f64, mean: f64, var: f64) -> Expectation {
        debug_assert!(y == 1.0 || y == -1.0, "label must be ±1, got {y}");
        debug_assert!(
            var >= 0.0 || var.is_nan(),
            "variance must be ≥ 0, got {var}"
        );
        if var.is_nan() || mean.is_nan() {
            let nan = f64::NAN;
            return Expectation {
                value: nan,
                d_mean: nan,
                d_var: nan,
            };
        }
        let c = y * mean;
        let s = var.max(0.0).sqrt();
        let b = y * s;
        let (mut value, mut sum_r, mut curvature) = (0.0, 0.0, 0.0);
        if self.centre_weight != 0.0 {
            let (log_cdf, r, z_plus_r) = probit_terms(c);
            value += self.centre_weight * log_cdf;
            sum_r += self.centre_weight * r;
            curvature += self.centre_weight * r * z_plus_r;
        }
        let mut moment = 0.0;
        for (&x, &u) in self.half_nodes.iter().zip(&self.half_weights) {
            let (lp, rp, zrp) = probit_terms(c + b * x);
            let (lm, rm, zrm) = probit_terms(c - b * x);
            value += u * (lp + lm);
            sum_r += u * (rp + rm);
            moment += u * x * (rp - rm);
            curvature += u * (rp * zrp + rm * zrm);
        }
        let d_var = if var > VAR_FLOOR {
            y * moment / (2.0 * s)
        } else {
            -0.5 * curvature
        };
        Expectation {
            value,
            d_mean: y * sum_r,
            d_var,
        }
    }

    /// Only E(y, m, v): the same sum as [`Self::expect`]'s `value`, bit for bit.
    pub fn expect_value(&self, y: f64, mean: f64, var: f64) -> f64 {
        self.expect(y, mean, var).value
    }
}

impl Likelihood for BernoulliProbit {
    /// One term at a time (log Φ goes through erfc, which does not vectorise like the
    /// logistic's polynomials); the results do not depend on how the terms are split.
    fn expect_lanes(&self, y: &[f64], mean: &mut [f64], var: &mut [f64], value: &mut [f64]) {
        let n = y.len();
        assert!(
            mean.len() == n && var.len() == n && value.len() == n,
            "expect_lanes: slices of different lengths"
        );
        // A rayon worker may come here from a faer GEMM: see `clear_upper_simd_state`.
        clear_upper_simd_state();
        for j in 0..n {
            let e = self.expect(y[j], mean[j], var[j]);
            value[j] = e.value;
            mean[j] = e.d_mean;
            var[j] = e.d_var;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// log Φ(z) and r(z) at 40 digits (mpmath 1.3, `log(ncdf(z))`, `npdf(z)/ncdf(z)`).
    const REFERENCE: [(f64, f64, f64); 12] = [
        (-40.0, -804.608_442_013_753_8, 40.024_968_847_207_26),
        (-38.0, -726.557_216_018_820_1, 38.026_279_466_575_87),
        (-20.0, -203.917_155_371_097_26, 20.049_753_068_527_85),
        (-8.5, -39.197_396_428_217_67, 8.614_595_320_165_173),
        (-8.0, -35.013_437_159_914_55, 8.121_368_112_236_113),
        (-5.0, -15.064_998_393_988_726, 5.186_503_967_125_842),
        (-1.0, -1.841_021_645_009_263_5, 1.525_135_276_160_981),
        (0.0, -std::f64::consts::LN_2, 0.797_884_560_802_865_4),
        (0.5, -0.368_946_415_288_656_4, 0.509_160_433_837_033_5),
        (3.0, -0.001_350_809_964_748_193_8, 0.004_437_839_042_125_664),
        (8.0, -6.220_960_574_271_786e-16, 5.052_271_083_536_895e-15),
        (10.0, -7.619_853_024_160_526e-24, 7.694_598_626_706_419e-23),
    ];

    #[test]
    fn log_cdf_and_mills_ratio_match_reference_values() {
        for (z, log_cdf, r) in REFERENCE {
            let (l, m, zr) = probit_terms(z);
            // erfc's argument −z/√2 is rounded, and d log erfc(x)/dx ≈ −2x: a few ulps
            // times |z|² of relative error are inherent to Φ(z) from erfc for moderate z.
            assert!(
                (l - log_cdf).abs() <= 1e-14 * log_cdf.abs(),
                "log Φ({z}) = {l}"
            );
            assert!((m - r).abs() <= 1e-14 * r, "r({z}) = {m}");
            // z + r(z) agrees with the reference where it does not cancel badly.
            assert!(
                (zr - (z + r)).abs() <= 64.0 * f64::EPSILON * r,
                "z + r({z})"
            );
        }
        assert_eq!(log_normal_cdf(40.0), 0.0);
        assert_eq!(inverse_mills(40.0), 0.0);
    }

    #[test]
    fn the_two_branches_meet_at_the_switch() {
        for z in [-MILLS_SWITCH - 1e-9, -MILLS_SWITCH + 1e-9] {
            let (l, r, zr) = probit_terms(z);
            let pdf = INV_SQRT_2PI * (-0.5 * z * z).exp();
            let cdf = normal_cdf(z);
            assert!((l - cdf.ln()).abs() <= 4e-16 * l.abs());
            assert!((r - pdf / cdf).abs() <= 4e-16 * r);
            assert!((zr - (z + pdf / cdf)).abs() <= 1e-14);
        }
    }

    #[test]
    fn nan_in_nan_out_and_the_pairs_are_stored() {
        let lik = BernoulliProbit::new(21).unwrap();
        assert_eq!(lik.half_nodes.len(), 10);
        assert!(lik.centre_weight > 0.0);
        let total = lik.centre_weight + 2.0 * lik.half_weights.iter().sum::<f64>();
        assert!((total - 1.0).abs() < 1e-14);
        assert!(lik.expect(1.0, f64::NAN, 1.0).value.is_nan());
        assert!(lik.expect(1.0, 0.0, f64::NAN).d_var.is_nan());
    }
}
