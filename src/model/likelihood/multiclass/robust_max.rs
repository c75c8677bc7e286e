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
//! bound on it. ε is fixed, or learnt as θ = logit ε (`RowInput::lik_param`, with
//! ∂E/∂θ = (1 − ε) − S).

use anyhow::{ensure, Result};

use crate::model::likelihood::multiclass::argmax::ArgmaxRule;
pub use crate::model::likelihood::multiclass::argmax::{PRUNE_BELOW, VAR_MIN};
use crate::model::likelihood::multiclass::{ClassLikelihood, RowGrads, RowInput};

/// GPflow's default ε.
pub const DEFAULT_EPSILON: f64 = 1e-3;

/// The robust-max likelihood with a fixed ε and a Gauss–Hermite rule for S.
#[derive(Debug, Clone)]
pub struct RobustMax {
    epsilon: f64,
    argmax: ArgmaxRule,
}

impl RobustMax {
    /// ε in (0, 1) and a `points`-point Gauss–Hermite rule.
    pub fn new(epsilon: f64, points: usize) -> Result<Self> {
        ensure!(
            epsilon > 0.0 && epsilon < 1.0,
            "robust-max ε must lie in (0, 1), got {epsilon}"
        );
        Ok(RobustMax {
            epsilon,
            argmax: ArgmaxRule::new(points)?,
        })
    }

    pub fn epsilon(&self) -> f64 {
        self.epsilon
    }

    /// The row's ε: its learnt θ = logit ε mapped back, ε = 1/(1 + e^{−θ}), or the fixed ε.
    fn epsilon_of(&self, row: &RowInput<'_>) -> f64 {
        row.lik_param
            .map_or(self.epsilon, |theta| 1.0 / (1.0 + (-theta).exp()))
    }

    /// S = q(f_c > f_k ∀k ≠ c) for independent f_k ~ N(mean_k, var_k), with its exact
    /// derivatives (∂S/∂mean, ∂S/∂var) [K] into `grads`: [`ArgmaxRule::probability`].
    /// `tmp` holds 4K doubles.
    pub fn argmax_probability(
        &self,
        c: usize,
        mean: &[f64],
        var: &[f64],
        grads: Option<(&mut [f64], &mut [f64])>,
        tmp: &mut [f64],
    ) -> f64 {
        self.argmax.probability(c, mean, var, grads, tmp)
    }
}

/// (log(1 − ε), log(ε/(K − 1))): E = L₀ + S (L₁ − L₀).
fn logs(epsilon: f64, k_count: usize) -> (f64, f64) {
    ((-epsilon).ln_1p(), (epsilon / (k_count - 1) as f64).ln())
}

/// v_k = Σ_p Φ_kp² s_p [K] into `out`.
pub(crate) fn marginal_variances(row: &RowInput<'_>, out: &mut [f64]) {
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
        let epsilon = self.epsilon_of(row);
        let (l1, l0) = logs(epsilon, k_count);
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
        if row.lik_param.is_some() {
            // E = L₀ + S (L₁ − L₀) with dε/dθ = ε(1 − ε): ∂E/∂θ = (1 − ε) − S.
            *grads.lik_param += (1.0 - epsilon) - s;
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
        self.argmax
            .probabilities((row.utility, var), false, probs, tmp);
        let epsilon = self.epsilon_of(row);
        let other = epsilon / (k_count - 1) as f64;
        for p in probs.iter_mut() {
            let s = *p;
            *p = (1.0 - epsilon) * s + other * (1.0 - s);
        }
    }
}
