//! The probability that one of K independent Gaussian utilities is the largest,
//! S_c = q(f_c > f_k ∀k ≠ c) for f_k ~ N(f̄_k, v_k), by Gauss–Hermite quadrature in f_c:
//!
//! S_c = ∫ N(f_c; f̄_c, v_c) Π_{k≠c} Φ((f_c − f̄_k)/√v_k) df_c,
//!
//! with the exact derivatives of the quadrature sum (`docs/likelihood.md`, "Robust-max").
//! Robust-max's expectation is affine in S_c, and the predictive class probabilities of
//! robust-max and of the Hernández-Lobato likelihood are the S_c of every class.

use anyhow::Result;

use crate::linalg::clear_upper_simd_state;
use crate::model::likelihood::probit::normal_cdf;
use crate::model::quadrature::GaussHermite;

/// Variances below this are raised to it (their gradient is then 0): the integrand has
/// steps of width √v, which no quadrature resolves, and 1/√v must stay finite.
pub const VAR_MIN: f64 = 1e-12;

/// [`ArgmaxRule::probabilities`] skips the quadrature of a class c whose S_c is provably
/// below this (it is set to 0, or to the bound).
pub const PRUNE_BELOW: f64 = 1e-12;

/// φ(z), the standard normal density.
fn normal_pdf(z: f64) -> f64 {
    (-0.5 * z * z).exp() / (2.0 * std::f64::consts::PI).sqrt()
}

/// A Gauss–Hermite rule for S_c.
#[derive(Debug, Clone)]
pub struct ArgmaxRule {
    /// √2 t_j, ascending.
    nodes: Vec<f64>,
    /// w_j / √π (Σ = 1).
    weights: Vec<f64>,
}

impl ArgmaxRule {
    /// A `points`-point rule; errors for 0 points.
    pub fn new(points: usize) -> Result<Self> {
        let rule = GaussHermite::new(points)?;
        let inv_sqrt_pi = 1.0 / std::f64::consts::PI.sqrt();
        Ok(ArgmaxRule {
            nodes: rule
                .nodes
                .iter()
                .map(|t| std::f64::consts::SQRT_2 * t)
                .collect(),
            weights: rule.weights.iter().map(|w| w * inv_sqrt_pi).collect(),
        })
    }

    /// S_c for independent f_k ~ N(mean_k, var_k) by the quadrature, and with `grads` =
    /// (∂S/∂mean, ∂S/∂var) [K] its exact derivatives (written). `tmp` holds 4K doubles. At
    /// node j, f_c = mean_c + √var_c x_j and z_k = (f_c − mean_k)/√var_k; with
    /// ψ_k = u_j φ(z_k) Π_{l∉{c,k}} Φ(z_l) / √var_k (prefix and suffix products, no
    /// division), node j adds −ψ_k to ∂S/∂mean_k, −ψ_k z_k/(2√var_k) to ∂S/∂var_k
    /// (∂z_k/∂var_k = −z_k/(2 var_k)), Σ_k ψ_k to ∂S/∂mean_c and Σ_k ψ_k x_j/(2√var_c) to
    /// ∂S/∂var_c.
    pub fn probability(
        &self,
        c: usize,
        mean: &[f64],
        var: &[f64],
        mut grads: Option<(&mut [f64], &mut [f64])>,
        tmp: &mut [f64],
    ) -> f64 {
        // Q·K calls of libm's erfc follow: see `clear_upper_simd_state`.
        clear_upper_simd_state();
        let k_count = mean.len();
        let (sd, rest) = tmp.split_at_mut(k_count);
        let (cdf, rest) = rest.split_at_mut(k_count);
        let (z, excl) = rest.split_at_mut(k_count);
        for (s, v) in sd.iter_mut().zip(var) {
            *s = v.max(VAR_MIN).sqrt();
        }
        if let Some((dm, dv)) = grads.as_mut() {
            dm.fill(0.0);
            dv.fill(0.0);
        }
        let mut total = 0.0;
        for (&x, &u) in self.nodes.iter().zip(&self.weights) {
            let f_c = mean[c] + sd[c] * x;
            for k in 0..k_count {
                z[k] = (f_c - mean[k]) / sd[k];
                cdf[k] = if k == c { 1.0 } else { normal_cdf(z[k]) };
            }
            let mut prefix = 1.0;
            for k in 0..k_count {
                excl[k] = prefix;
                prefix *= cdf[k];
            }
            total += u * prefix;
            let Some((dm, dv)) = grads.as_mut() else {
                continue;
            };
            let mut suffix = 1.0;
            for k in (0..k_count).rev() {
                excl[k] *= suffix;
                suffix *= cdf[k];
            }
            let mut d_fc = 0.0;
            for k in (0..k_count).filter(|&k| k != c) {
                let psi = u * normal_pdf(z[k]) * excl[k] / sd[k];
                d_fc += psi;
                dm[k] -= psi;
                dv[k] -= psi * z[k] / (2.0 * sd[k]);
            }
            dm[c] += d_fc;
            dv[c] += d_fc * x / (2.0 * sd[c]);
        }
        if let Some((_, dv)) = grads {
            for (d, v) in dv.iter_mut().zip(var) {
                if *v < VAR_MIN {
                    *d = 0.0;
                }
            }
        }
        total
    }

    /// S_c of every class c into `probs` [K], normalised to sum to 1 (they do up to
    /// quadrature error); `tmp` holds 4K doubles. A class whose S_c is certainly below
    /// [`PRUNE_BELOW`] is given S_c = 0 without its quadrature: S_c ≤ q(f_c > f_j) =
    /// Φ((f̄_c − f̄_j)/√(v_c + v_j)) for any j ≠ c, taken with j the class of largest f̄ (the
    /// second largest for that class itself); with `keep_bound` it is given that bound
    /// instead (floored at the smallest normal f64), so no class has probability 0 (a
    /// likelihood without robust-max's ε floor needs that for a finite NLP). O(Q·K) per
    /// class left, O(Q·K²) at worst.
    pub fn probabilities(
        &self,
        (mean, var): (&[f64], &[f64]),
        keep_bound: bool,
        probs: &mut [f64],
        tmp: &mut [f64],
    ) {
        let k_count = mean.len();
        let by_mean = |a: &usize, b: &usize| mean[*a].total_cmp(&mean[*b]);
        let top = (0..k_count).max_by(by_mean).unwrap_or(0);
        let second = (0..k_count)
            .filter(|&k| k != top)
            .max_by(by_mean)
            .unwrap_or(top);
        for (c, out) in probs.iter_mut().enumerate() {
            let rival = if c == top { second } else { top };
            let z = (mean[c] - mean[rival]) / (var[c] + var[rival]).max(VAR_MIN).sqrt();
            let bound = normal_cdf(z);
            *out = if bound < PRUNE_BELOW {
                match keep_bound {
                    true => bound.max(f64::MIN_POSITIVE),
                    false => 0.0,
                }
            } else {
                self.probability(c, mean, var, None, tmp)
            };
        }
        let total: f64 = probs.iter().sum();
        for p in probs.iter_mut() {
            *p /= total;
        }
    }
}
