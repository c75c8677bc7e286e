//! The robust-max likelihood (Hernández-Lobato, Hernández-Lobato & Dupont, *Robust
//! Multi-Class Gaussian Process Classification*; GPflow's `RobustMax`):
//!
//! p(c | f) = 1 − ε if c = argmax_k f_k, else ε/(K − 1),
//!
//! so E_q[log p(c | f)] = log(1 − ε) S + log(ε/(K − 1)) (1 − S), with S = q(f_c > f_k ∀k ≠ c).
//! For independent utilities f_k ~ N(f̄_k, v_k),
//! S = ∫ N(f_c; f̄_c, v_c) Π_{k≠c} Φ((f_c − f̄_k)/√v_k) df_c, by Gauss–Hermite in f_c, with the
//! exact derivatives of the quadrature sum (`docs/likelihood.md`, "Multi-class").
//!
//! Latent modes: with independent latents (Φ = I, or any Φ with at most one non-zero per
//! column) the utilities are independent and S is exact up to quadrature. Under the factor
//! model the utilities are correlated; robust-max then uses their marginal variances
//! v_k = Σ_p Φ_kp² s_p and ignores the cross-covariances (what a multi-output GP likelihood
//! sees when only the marginals are propagated), which is an approximation of E_q, not a
//! bound on it. ε is fixed.

use anyhow::{ensure, Result};

use super::multiclass::{ClassLikelihood, RowGrads, RowInput};
use super::probit::normal_cdf;
use super::quadrature::GaussHermite;
use crate::linalg::clear_upper_simd_state;

/// GPflow's default ε.
pub const DEFAULT_EPSILON: f64 = 1e-3;

/// Variances below this are raised to it (their gradient is then 0): the integrand has
/// steps of width √v, which no quadrature resolves, and 1/√v must stay finite.
pub const VAR_MIN: f64 = 1e-12;

/// The predictive probabilities skip the quadrature of a class c whose S_c is provably below
/// this (it is set to 0; the probability of c is then ε/(K − 1) up to the normalisation).
pub const PRUNE_BELOW: f64 = 1e-12;

/// The robust-max likelihood with a fixed ε and a Gauss–Hermite rule for S.
#[derive(Debug, Clone)]
pub struct RobustMax {
    epsilon: f64,
    /// √2 t_j, ascending.
    nodes: Vec<f64>,
    /// w_j / √π (Σ = 1).
    weights: Vec<f64>,
}

/// φ(z), the standard normal density.
fn normal_pdf(z: f64) -> f64 {
    (-0.5 * z * z).exp() / (2.0 * std::f64::consts::PI).sqrt()
}

impl RobustMax {
    /// ε in (0, 1) and a `points`-point Gauss–Hermite rule.
    pub fn new(epsilon: f64, points: usize) -> Result<Self> {
        ensure!(
            epsilon > 0.0 && epsilon < 1.0,
            "robust-max ε must lie in (0, 1), got {epsilon}"
        );
        let rule = GaussHermite::new(points)?;
        let inv_sqrt_pi = 1.0 / std::f64::consts::PI.sqrt();
        Ok(RobustMax {
            epsilon,
            nodes: rule
                .nodes
                .iter()
                .map(|t| std::f64::consts::SQRT_2 * t)
                .collect(),
            weights: rule.weights.iter().map(|w| w * inv_sqrt_pi).collect(),
        })
    }

    pub fn epsilon(&self) -> f64 {
        self.epsilon
    }

    /// (log(1 − ε), log(ε/(K − 1))): E = L₀ + S (L₁ − L₀).
    fn logs(&self, k_count: usize) -> (f64, f64) {
        (
            (-self.epsilon).ln_1p(),
            (self.epsilon / (k_count - 1) as f64).ln(),
        )
    }

    /// S = q(f_c > f_k ∀k ≠ c) for independent f_k ~ N(mean_k, var_k) by the quadrature,
    /// and with `grads` = (∂S/∂mean, ∂S/∂var) [K] its exact derivatives (written). `tmp`
    /// holds 4K doubles. At node j, f_c = mean_c + √var_c x_j and z_k = (f_c − mean_k)/√var_k;
    /// with ψ_k = u_j φ(z_k) Π_{l∉{c,k}} Φ(z_l) / √var_k (prefix and suffix products, no
    /// division), node j adds −ψ_k to ∂S/∂mean_k, −ψ_k z_k/(2√var_k) to ∂S/∂var_k
    /// (∂z_k/∂var_k = −z_k/(2 var_k)), Σ_k ψ_k to ∂S/∂mean_c and Σ_k ψ_k x_j/(2√var_c) to
    /// ∂S/∂var_c.
    pub fn argmax_probability(
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
}

/// v_k = Σ_p Φ_kp² s_p [K] into `out`.
fn marginal_variances(row: &RowInput<'_>, out: &mut [f64]) {
    for (k, v) in out.iter_mut().enumerate() {
        *v = row
            .phi_row(k)
            .iter()
            .zip(row.var)
            .map(|(f, s)| f * f * s)
            .sum();
    }
}

impl ClassLikelihood for RobustMax {
    fn name(&self) -> &'static str {
        "robust-max"
    }

    /// O(Q·K) per row (Q normal distribution functions per class) plus 4KP flops for the
    /// marginal variances and their gradients.
    fn row(&self, row: &RowInput<'_>, grads: &mut RowGrads<'_>, work: &mut Vec<f64>) -> f64 {
        let (k_count, p_count) = (row.classes(), row.latents());
        work.clear();
        work.resize(6 * k_count, 0.0);
        let (var, rest) = work.split_at_mut(k_count);
        let (d_var, tmp) = rest.split_at_mut(k_count);
        marginal_variances(row, var);
        let s = self.argmax_probability(
            row.class,
            row.utility,
            var,
            Some((&mut *grads.utility, &mut *d_var)),
            tmp,
        );
        let (l1, l0) = self.logs(k_count);
        let gain = l1 - l0;
        for a in grads.utility.iter_mut() {
            *a *= gain;
        }
        for (k, &dv) in d_var.iter().enumerate() {
            let beta = gain * dv;
            let phi_k = row.phi_row(k);
            let g_phi_k = &mut grads.phi[k * p_count..(k + 1) * p_count];
            for (p, &f) in phi_k.iter().enumerate() {
                grads.var[p] += beta * f * f;
                g_phi_k[p] += 2.0 * beta * f * row.var[p];
            }
        }
        l0 + s * gain
    }

    /// p(c | x) = (1 − ε) S_c + ε/(K − 1) (1 − S_c), with the quadratures S_c normalised
    /// to sum to 1 (they do up to quadrature error). A class whose S_c is certainly below
    /// [`PRUNE_BELOW`] is given S_c = 0 without its quadrature: S_c ≤ q(f_c > f_j) =
    /// Φ((f̄_c − f̄_j)/√(v_c + v_j)) for any j ≠ c, taken with j the class of largest f̄
    /// (the second largest for that class itself). O(Q·K) per class left, O(Q·K²) per row at
    /// worst.
    fn probabilities(&self, row: &RowInput<'_>, probs: &mut [f64], work: &mut Vec<f64>) {
        let k_count = row.classes();
        work.clear();
        work.resize(5 * k_count, 0.0);
        let (var, tmp) = work.split_at_mut(k_count);
        marginal_variances(row, var);
        let f = row.utility;
        let by_mean = |a: &usize, b: &usize| f[*a].total_cmp(&f[*b]);
        let top = (0..k_count).max_by(by_mean).unwrap_or(0);
        let second = (0..k_count)
            .filter(|&k| k != top)
            .max_by(by_mean)
            .unwrap_or(top);
        for (c, out) in probs.iter_mut().enumerate() {
            let rival = if c == top { second } else { top };
            let z = (f[c] - f[rival]) / (var[c] + var[rival]).max(VAR_MIN).sqrt();
            *out = if normal_cdf(z) < PRUNE_BELOW {
                0.0
            } else {
                self.argmax_probability(c, f, var, None, tmp)
            };
        }
        let total: f64 = probs.iter().sum();
        let other = self.epsilon / (k_count - 1) as f64;
        for p in probs.iter_mut() {
            let s = *p / total;
            *p = (1.0 - self.epsilon) * s + other * (1.0 - s);
        }
    }
}
