//! The Hernández-Lobato likelihood (GP-HL in Dhaka et al.'s baselines; Villacampa-Calvo &
//! Hernández-Lobato, *Scalable Multi-Class Gaussian Process Classification using
//! Expectation Propagation*): the one-vs-each construction with the Gaussian distribution
//! function in place of the sigmoid,
//!
//! E_i = Σ_{k≠c} E_q[log Φ(f_c − f_k)] = Σ_{k≠c} E(+1, f̄_c − f̄_k, σ²_k),
//!
//! each term the 1-D probit expectation of `likelihood/probit.rs` (Gauss–Hermite with exact
//! derivatives) with the pair means and variances σ²_k = Σ_p (Φ_cp − Φ_kp)² s_ip exactly as
//! one-vs-each forms them ([`crate::model::likelihood::multiclass::one_vs_each::pairwise_row`]), so the gradients are
//! one-vs-each's with the probit's α_k, β_k.
//!
//! It is a lower bound on E_q[log p(c | f)] of the multinomial probit model
//! p(c | f) = P(f_c + n_c > f_k + n_k ∀k ≠ c), n ~ N(0, ½ I): given n_c, the K − 1 events
//! n_k < f_c − f_k + n_c are independent with probabilities Φ((f_c − f_k + n_c)/√½), each
//! increasing in n_c, so their expected product is at least the product of their
//! expectations over n_c, which are Φ(f_c − f_k) (Harris's inequality; `docs/likelihood.md`,
//! "Hernández-Lobato"). The predictive class
//! probabilities are that model's: the argmax probabilities of f + n with the marginal
//! variances v_k + ½ ([`ArgmaxRule::probabilities`]; exact for independent latents, the
//! marginal approximation of robust-max under the factor model).

use anyhow::Result;

use crate::model::likelihood::multiclass::argmax::ArgmaxRule;
use crate::model::likelihood::multiclass::one_vs_each::pairwise_row;
use crate::model::likelihood::multiclass::robust_max::marginal_variances;
use crate::model::likelihood::multiclass::{ClassLikelihood, RowGrads, RowInput};
use crate::model::likelihood::probit::BernoulliProbit;

/// The variance of each utility's noise n_k of the multinomial probit model the bound is
/// on: ½, so that a difference n_c − n_k has unit variance and Φ(f_c − f_k) is its pair
/// probability.
pub const NOISE_VAR: f64 = 0.5;

/// The Hernández-Lobato likelihood: K − 1 probit expectations by Gauss–Hermite per row,
/// predictive probabilities by the argmax quadrature.
#[derive(Debug, Clone)]
pub struct HernandezLobato {
    pairs: BernoulliProbit,
    argmax: ArgmaxRule,
}

impl HernandezLobato {
    /// `points` Gauss–Hermite points per probit expectation and per argmax quadrature.
    /// Errors for 0.
    pub fn new(points: usize) -> Result<Self> {
        Ok(HernandezLobato {
            pairs: BernoulliProbit::new(points)?,
            argmax: ArgmaxRule::new(points)?,
        })
    }
}

impl ClassLikelihood for HernandezLobato {
    fn name(&self) -> &'static str {
        "hernandez-lobato"
    }

    /// O(K·P) per row: 3KP flops for the K − 1 difference variances, 6KP for their
    /// gradients, and K − 1 probit expectations (Q log Φ each, through erfc).
    fn row(&self, row: &RowInput<'_>, grads: &mut RowGrads<'_>, work: &mut Vec<f64>) -> f64 {
        // K·Q calls of libm's erfc follow: see `clear_upper_simd_state`.
        crate::linalg::clear_upper_simd_state();
        pairwise_row(&self.pairs, row, grads, work)
    }

    /// p(c | x) = q(f_c + n_c > f_k + n_k ∀k ≠ c) with the marginal variances v_k + ½,
    /// normalised and pruned as robust-max's, a pruned class keeping its upper bound
    /// (< 1e-12) rather than 0: O(Q·K) per class left, O(Q·K²) at worst.
    fn probabilities(&self, row: &RowInput<'_>, probs: &mut [f64], work: &mut Vec<f64>) {
        let k_count = row.classes();
        work.clear();
        work.resize(5 * k_count, 0.0);
        let (var, tmp) = work.split_at_mut(k_count);
        marginal_variances(row, var);
        for v in var.iter_mut() {
            *v += NOISE_VAR;
        }
        // A pruned class keeps its bound (< 1e-12), not 0: without robust-max's ε floor a
        // true class of probability 0 would make the NLP infinite.
        self.argmax
            .probabilities((row.utility, var), true, probs, tmp);
    }
}
