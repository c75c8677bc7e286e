//! The augment-and-reduce bound on the softmax (Ruiz, Titsias, Dieng & Blei, *Augment and
//! Reduce: Stochastic Inference for Large Categorical Distributions*), in closed form under
//! the row's Gaussian (`docs/likelihood.md`, "Augment and reduce"):
//!
//! E_q[log p(c | f_i)] ≥ 1 − log α_i − (1/α_i) (1 + Σ_{k≠c} exp(−m_k + σ²_k / 2)),
//!
//! from log x ≤ x/α − 1 + log α for α > 0 applied to x = Σ_k exp(f_k − f_c), and E_q of
//! exp(−(f_c − f_k)) for the Gaussian difference with mean m_k = f̄_c − f̄_k and variance
//! σ²_k = Σ_p (Φ_cp − Φ_kp)² s_ip (as one-vs-each computes it). The local parameter
//! α_i = 1 + softplus(o_i) ≥ 1 is the row's output o_i of the amortisation network
//! (`likelihood/multiclass/amortiser.rs`). For fixed f the best α is 1 + Σ_{k≠c} exp(f_k − f_c), where the bound is
//! the softmax's log-likelihood itself.
//!
//! Gradients, with e_k = exp(−m_k + σ²_k/2), T = 1 + w Σ_k e_k (w = (K − 1)/S with class
//! subsampling, else 1) and d_k = Φ_c − Φ_k [P]: a_k = ∂E/∂m_k = w e_k/α,
//! b_k = ∂E/∂σ²_k = −w e_k/(2α), then the chain of one-vs-each (∂/∂f̄_c = Σ a_k,
//! ∂/∂f̄_k = −a_k, ∂/∂s_p = Σ b_k d_kp², ∂/∂Φ_kp = −2 b_k d_kp s_p, ∂/∂Φ_cp = 2 Σ b_k d_kp s_p);
//! ∂E/∂α = −1/α + T/α², ∂α/∂o = σ(o).

use anyhow::Result;

use crate::model::likelihood::logistic::{sigmoid, softplus};
use crate::model::likelihood::multiclass::class_sampling::ClassSampler;
use crate::model::likelihood::multiclass::softmax_mc::SoftmaxMc;
use crate::model::likelihood::multiclass::{ClassLikelihood, RowGrads, RowInput};

/// The augment-and-reduce softmax bound with amortised α, optionally over S sampled
/// negatives; the predictive probabilities are those of the softmax it bounds (Monte Carlo,
/// [`SoftmaxMc`]).
#[derive(Debug, Clone)]
pub struct ArSoftmax {
    sampler: Option<ClassSampler>,
    predictive: SoftmaxMc,
}

impl ArSoftmax {
    /// `predictive_pairs` antithetic sample pairs for the predictive probabilities (errors
    /// for 0); `class_samples` negatives per row (None: all).
    pub fn new(predictive_pairs: usize, class_samples: Option<usize>) -> Result<Self> {
        Ok(ArSoftmax {
            sampler: class_samples.map(ClassSampler::new).transpose()?,
            predictive: SoftmaxMc::new(predictive_pairs)?,
        })
    }

    /// α = 1 + softplus(o).
    pub fn alpha(o: f64) -> f64 {
        1.0 + softplus(o)
    }
}

impl ClassLikelihood for ArSoftmax {
    fn name(&self) -> &'static str {
        "ar-softmax"
    }

    /// O(S·P) per row (S = K − 1 without subsampling): 3SP flops for the difference
    /// variances, 6SP for their gradients, S exponentials.
    fn row(&self, row: &RowInput<'_>, grads: &mut RowGrads<'_>, work: &mut Vec<f64>) -> f64 {
        let (k_count, c) = (row.classes(), row.class);
        let mut negatives = Vec::new();
        let weight = match &self.sampler {
            Some(s) => s.negatives(k_count, c, (row.seed, row.stream), &mut negatives),
            None => {
                negatives.extend((0..k_count).filter(|&k| k != c));
                1.0
            }
        };
        work.clear();
        let mut sum = 0.0;
        for &k in &negatives {
            let v = row.pair_variance(c, k);
            let e = (row.utility[k] - row.utility[c] + 0.5 * v).exp();
            work.push(e);
            sum += e;
        }
        let o = row.local[0];
        let alpha = ArSoftmax::alpha(o);
        let total = 1.0 + weight * sum;
        grads.local[0] = (-1.0 / alpha + total / (alpha * alpha)) * sigmoid(o);
        grads.utility.fill(0.0);
        let mut a_c = 0.0;
        for (&k, &e) in negatives.iter().zip(work.iter()) {
            let a = weight * e / alpha;
            a_c += a;
            grads.utility[k] = -a;
            grads.add_pair_variance(row, c, k, -0.5 * a);
        }
        grads.utility[c] = a_c;
        1.0 - alpha.ln() - total / alpha
    }

    fn probabilities(&self, row: &RowInput<'_>, probs: &mut [f64], work: &mut Vec<f64>) {
        self.predictive.probabilities(row, probs, work)
    }

    /// One output, o, started where α = K: the best α when all utilities are equal.
    fn local_init(&self, classes: usize) -> Vec<f64> {
        // softplus⁻¹(K − 1) = log(e^{K−1} − 1).
        let target = (classes.max(2) - 1) as f64;
        vec![target + (-(-target).exp()).ln_1p()]
    }
}
