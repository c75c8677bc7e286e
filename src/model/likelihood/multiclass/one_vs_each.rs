//! The one-vs-each bound on the softmax likelihood (Titsias, *One-vs-Each Approximation to
//! Softmax for Scalable Estimation of Probabilities*; used for GP classification with many
//! classes by Villacampa-Calvo & Hernández-Lobato / Ruiz et al.):
//!
//! log p(c | f) = log softmax(f)_c ≥ Σ_{k≠c} log σ(f_c − f_k),
//!
//! so E_q[log p(c | f_i)] ≥ Σ_{k≠c} E(+1, f̄_c − f̄_k, σ²_k), each term the 1-D logistic
//! expectation of `likelihood/logistic.rs` with the variance of the difference
//! σ²_k = Var(f_c − f_k) = Σ_p (Φ_cp − Φ_kp)² s_ip (exact under the factor model; s_ic + s_ik
//! with independent latents, Φ = I). Gradients, with α_k = ∂E/∂mean and β_k = ∂E/∂var of
//! term k and d_k = Φ_c − Φ_k [P] (`docs/likelihood.md`, "Multi-class"):
//! ∂/∂f̄_c = Σ_k α_k, ∂/∂f̄_k = −α_k; ∂/∂s_p = Σ_k β_k d_kp²;
//! ∂/∂Φ_kp (covariance path) = −2 β_k d_kp s_p, ∂/∂Φ_cp = 2 Σ_k β_k d_kp s_p.

use anyhow::Result;

use crate::model::likelihood::logistic::BernoulliLogistic;
use crate::model::likelihood::multiclass::class_sampling::ClassSampler;
use crate::model::likelihood::multiclass::softmax_mc::SoftmaxMc;
use crate::model::likelihood::multiclass::{ClassLikelihood, RowGrads, RowInput};
use crate::model::likelihood::Likelihood;

/// The one-vs-each bound, its K − 1 logistic expectations by Gauss–Hermite; the predictive
/// probabilities are those of the softmax it bounds (Monte Carlo, [`SoftmaxMc`]).
#[derive(Debug, Clone)]
pub struct OneVsEach {
    pairs: BernoulliLogistic,
    predictive: SoftmaxMc,
    /// `--class-samples`: S of the K − 1 pairs per row, their sum scaled by (K − 1)/S
    /// (`likelihood/multiclass/class_sampling.rs`); None: every pair.
    sampler: Option<ClassSampler>,
}

impl OneVsEach {
    /// `points` Gauss–Hermite points per logistic expectation; `predictive_pairs`
    /// antithetic sample pairs for the predictive probabilities. Errors for 0 of either.
    pub fn new(points: usize, predictive_pairs: usize) -> Result<Self> {
        Ok(OneVsEach {
            pairs: BernoulliLogistic::new(points)?,
            predictive: SoftmaxMc::new(predictive_pairs)?,
            sampler: None,
        })
    }

    /// The same bound over `class_samples` sampled negatives per row (None: all). Errors
    /// for 0.
    pub fn with_class_samples(self, class_samples: Option<usize>) -> Result<Self> {
        Ok(OneVsEach {
            sampler: class_samples.map(ClassSampler::new).transpose()?,
            ..self
        })
    }
}

impl ClassLikelihood for OneVsEach {
    fn name(&self) -> &'static str {
        "one-vs-each"
    }

    /// O(K·P) per row: 3KP flops for the K − 1 difference variances, 6KP for their
    /// gradients, and K − 1 logistic expectations in [`crate::model::likelihood::logistic::LANES`]-wide
    /// blocks.
    fn row(&self, row: &RowInput<'_>, grads: &mut RowGrads<'_>, work: &mut Vec<f64>) -> f64 {
        let (k_count, c) = (row.classes(), row.class);
        match &self.sampler {
            None => pairwise_row(&self.pairs, row, grads, work),
            Some(sampler) => {
                let mut negatives = Vec::new();
                let w = sampler.negatives(k_count, c, (row.seed, row.stream), &mut negatives);
                // The pairs not drawn have no gradient this step.
                grads.utility.fill(0.0);
                pairs_sum(&self.pairs, row, grads, work, negatives.into_iter(), w)
            }
        }
    }

    fn probabilities(&self, row: &RowInput<'_>, probs: &mut [f64], work: &mut Vec<f64>) {
        self.predictive.probabilities(row, probs, work)
    }
}

/// Σ_{k≠c} E(+1, f̄_c − f̄_k, Var(f_c − f_k)) of one row for any Bernoulli link `pairs` (the
/// logistic for one-vs-each, the probit for the Hernández-Lobato likelihood), with the
/// gradients of the module's documentation: ∂E/∂f̄ written to `grads.utility`, the
/// covariance path added to `grads.var` and `grads.phi`. `work` is resized to 4(K − 1).
pub(crate) fn pairwise_row<L: Likelihood>(
    pairs: &L,
    row: &RowInput<'_>,
    grads: &mut RowGrads<'_>,
    work: &mut Vec<f64>,
) -> f64 {
    let c = row.class;
    let others = (0..row.classes()).filter(move |&k| k != c);
    pairs_sum(pairs, row, grads, work, others, 1.0)
}

/// w · Σ_{k ∈ negatives} E(+1, f̄_c − f̄_k, σ²_k) with its gradients (see the module docs),
/// for [`pairwise_row`] (every negative, w = 1: the arithmetic of the full bound, since
/// w · x = x exactly) and for `--class-samples` (S sampled negatives, w = (K − 1)/S).
fn pairs_sum<L: Likelihood>(
    pairs: &L,
    row: &RowInput<'_>,
    grads: &mut RowGrads<'_>,
    work: &mut Vec<f64>,
    negatives: impl Iterator<Item = usize> + Clone,
    w: f64,
) -> f64 {
    let c = row.class;
    let n = negatives.clone().count();
    work.clear();
    work.resize(4 * n, 0.0);
    let (y, rest) = work.split_at_mut(n);
    let (mean, rest) = rest.split_at_mut(n);
    let (var, value) = rest.split_at_mut(n);
    y.fill(1.0);
    for (j, k) in negatives.clone().enumerate() {
        mean[j] = row.utility[c] - row.utility[k];
        var[j] = row.pair_variance(c, k);
    }
    // In place: mean ← α = ∂E/∂mean, var ← β = ∂E/∂var.
    pairs.expect_lanes(y, mean, var, value);
    let (mut total, mut a_c) = (0.0, 0.0);
    for (j, k) in negatives.enumerate() {
        total += w * value[j];
        a_c += w * mean[j];
        grads.utility[k] = -(w * mean[j]);
        grads.add_pair_variance(row, c, k, w * var[j]);
    }
    grads.utility[c] = a_c;
    total
}
