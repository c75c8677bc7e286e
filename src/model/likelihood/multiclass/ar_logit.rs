//! The augment-and-reduce logit bound (Ruiz, Titsias, Dieng & Blei, *Augment and Reduce:
//! Stochastic Inference for Large Categorical Distributions*, with logistic auxiliary
//! noise), under the row's Gaussian (`docs/likelihood.md`, "Augment and reduce"):
//!
//! E_q[log p(c | f_i)] ≥ E_{q(ε)}[log σ(ε) + log σ(−ε)] + H(q) + w Σ_{k≠c} E_{q(ε)} E_q[log σ(ε + f_c − f_k)],
//!
//! with q(ε) = Logistic(μ_i, β_i), its location μ_i = o_i0 and scale β_i = softplus(o_i1)
//! the row's two amortisation-network outputs (`likelihood/multiclass/amortiser.rs`), H(q) = log β + 2 its
//! entropy (exact), and w = (K − 1)/S with class subsampling (else 1). The expectations
//! over ε use a fixed symmetric rule of J = 2S_ε points by reparametrisation,
//! ε_j = μ + β t_j with weights ω_j ([`epsilon_rule`]), so the bound is a deterministic,
//! smooth function of the parameters. Each
//! E_q[log σ(ε_j + f_c − f_k)] is the 1-D logistic expectation of `likelihood/logistic.rs` at mean
//! m_k + ε_j and variance σ²_k, as one-vs-each computes them. With q(ε) a point mass at 0
//! the pair terms are one-vs-each's.
//!
//! Gradients, with A_jk = ∂E/∂mean and B_jk = ∂E/∂var of pair (j, k), and d_k = Φ_c − Φ_k:
//! ∂/∂m_k = w Σ_j ω_j A_jk, ∂/∂σ²_k = w Σ_j ω_j B_jk (then one-vs-each's chain to f̄, s and
//! Φ); ∂/∂ε_j = ω_j (−tanh(ε_j/2) + w Σ_k A_jk); ∂/∂μ = Σ_j ∂/∂ε_j,
//! ∂/∂β = Σ_j t_j ∂/∂ε_j + 1/β, ∂/∂o_1 = σ(o_1) ∂/∂β.

use anyhow::{ensure, Result};

use crate::model::likelihood::logistic::{sigmoid, softplus, BernoulliLogistic};
use crate::model::likelihood::multiclass::class_sampling::ClassSampler;
use crate::model::likelihood::multiclass::softmax_mc::SoftmaxMc;
use crate::model::likelihood::multiclass::{ClassLikelihood, RowGrads, RowInput};

/// The AR-logit bound with amortised q(ε), optionally over S sampled negatives; the
/// predictive probabilities are the Monte Carlo softmax's ([`SoftmaxMc`]).
#[derive(Debug, Clone)]
pub struct ArLogit {
    pairs: BernoulliLogistic,
    /// t_j = logit(u_j) [J], the rule's nodes in the standard logistic.
    nodes: Vec<f64>,
    /// ω_j [J], the rule's weights (Σ_j ω_j = 1).
    weights: Vec<f64>,
    sampler: Option<ClassSampler>,
    predictive: SoftmaxMc,
}

/// The ε rule of `j_count` points (`docs/likelihood.md`, "AR-logit"): nodes t_j = logit(u_j)
/// and weights ω_j for E_{Logistic(0,1)}[g(t)] = ∫₀¹ g(logit u) du. The substitution
/// u = θ²(3 − 2θ) (du = 6θ(1 − θ) dθ) flattens the integrand's logarithmic end-point
/// singularities (g grows linearly in |t| in the tails); then the midpoint rule in θ,
/// θ_j = (j + ½)/J, with the weights normalised to sum to 1 so that constants are exact. The
/// rule is symmetric (t_{J−1−j} = −t_j, ω_{J−1−j} = ω_j): antithetic pairs.
fn epsilon_rule(j_count: usize) -> (Vec<f64>, Vec<f64>) {
    let theta = |j: usize| (j as f64 + 0.5) / j_count as f64;
    let nodes = (0..j_count)
        .map(|j| {
            let th = theta(j);
            // logit(θ²(3 − 2θ)) = log(θ²(3 − 2θ) / ((1 − θ)²(1 + 2θ))), symmetric in θ ↔ 1 − θ.
            let (a, b) = (
                th * th * (3.0 - 2.0 * th),
                (1.0 - th) * (1.0 - th) * (1.0 + 2.0 * th),
            );
            (a / b).ln()
        })
        .collect();
    let raw: Vec<f64> = (0..j_count).map(|j| theta(j) * (1.0 - theta(j))).collect();
    let sum: f64 = raw.iter().sum();
    (nodes, raw.iter().map(|r| r / sum).collect())
}

/// log σ(ε) + log σ(−ε) = −|ε| − 2 log(1 + e^{−|ε|}), the standard logistic's log density.
fn log_logistic_density(eps: f64) -> f64 {
    -eps.abs() - 2.0 * (-eps.abs()).exp().ln_1p()
}

impl ArLogit {
    /// `points` Gauss–Hermite points per pair expectation, `noise_pairs` antithetic pairs
    /// of the ε rule (J = 2·noise_pairs) and of the predictive softmax, `class_samples`
    /// negatives per row (None: all). Errors for 0 of any.
    pub fn new(points: usize, noise_pairs: usize, class_samples: Option<usize>) -> Result<Self> {
        ensure!(
            noise_pairs > 0,
            "AR-logit needs at least one pair of ε points"
        );
        let (nodes, weights) = epsilon_rule(2 * noise_pairs);
        Ok(ArLogit {
            pairs: BernoulliLogistic::new(points)?,
            nodes,
            weights,
            sampler: class_samples.map(ClassSampler::new).transpose()?,
            predictive: SoftmaxMc::new(noise_pairs)?,
        })
    }

    /// q(ε)'s location and scale from the network outputs o [2]: (o₀, softplus(o₁)).
    pub fn noise(local: &[f64]) -> (f64, f64) {
        (local[0], softplus(local[1]))
    }

    /// The row's negatives and their weight w.
    fn negatives(&self, row: &RowInput<'_>, out: &mut Vec<usize>) -> f64 {
        let (k_count, c) = (row.classes(), row.class);
        match &self.sampler {
            Some(s) => s.negatives(k_count, c, (row.seed, row.stream), out),
            None => {
                out.clear();
                out.extend((0..k_count).filter(|&k| k != c));
                1.0
            }
        }
    }
}

impl ClassLikelihood for ArLogit {
    fn name(&self) -> &'static str {
        "ar-logit"
    }

    /// O(S·P + S·J·Q) per row: the difference variances and their gradients as one-vs-each,
    /// and S·J logistic expectations of Q points.
    fn row(&self, row: &RowInput<'_>, grads: &mut RowGrads<'_>, work: &mut Vec<f64>) -> f64 {
        let c = row.class;
        let mut negatives = Vec::new();
        let w = self.negatives(row, &mut negatives);
        let (n, j_count) = (negatives.len(), self.nodes.len());
        let (mu, beta) = ArLogit::noise(row.local);
        let eps: Vec<f64> = self.nodes.iter().map(|t| mu + beta * t).collect();
        work.clear();
        work.resize(4 * n * j_count, 0.0);
        let (y, rest) = work.split_at_mut(n * j_count);
        let (mean, rest) = rest.split_at_mut(n * j_count);
        let (var, value) = rest.split_at_mut(n * j_count);
        y.fill(1.0);
        // Pair (k at position a, ε_j) at index a·J + j.
        for (a, &k) in negatives.iter().enumerate() {
            let v = row.pair_variance(c, k);
            let m = row.utility[c] - row.utility[k];
            for (j, e) in eps.iter().enumerate() {
                mean[a * j_count + j] = m + e;
                var[a * j_count + j] = v;
            }
        }
        // In place: mean ← A = ∂E/∂mean, var ← B = ∂E/∂var.
        self.pairs.expect_lanes(y, mean, var, value);
        let mut total = beta.ln() + 2.0;
        let mut g_eps: Vec<f64> = eps
            .iter()
            .zip(&self.weights)
            .map(|(&e, &omega)| {
                total += omega * log_logistic_density(e);
                -omega * (0.5 * e).tanh()
            })
            .collect();
        grads.utility.fill(0.0);
        let mut a_c = 0.0;
        for (a, &k) in negatives.iter().enumerate() {
            let (mut g_m, mut g_v) = (0.0, 0.0);
            let pairs = a * j_count..(a + 1) * j_count;
            let columns = value[pairs.clone()]
                .iter()
                .zip(&mean[pairs.clone()])
                .zip(&var[pairs]);
            let weighted = g_eps.iter_mut().zip(&self.weights);
            for ((g_e, omega), ((v, d_mean), d_var)) in weighted.zip(columns) {
                let ww = w * omega;
                total += ww * v;
                g_m += ww * d_mean;
                g_v += ww * d_var;
                *g_e += ww * d_mean;
            }
            a_c += g_m;
            grads.utility[k] = -g_m;
            grads.add_pair_variance(row, c, k, g_v);
        }
        grads.utility[c] = a_c;
        let g_mu: f64 = g_eps.iter().sum();
        let g_beta: f64 = g_eps
            .iter()
            .zip(&self.nodes)
            .map(|(g, t)| g * t)
            .sum::<f64>()
            + 1.0 / beta;
        grads.local[0] = g_mu;
        grads.local[1] = g_beta * sigmoid(row.local[1]);
        total
    }

    fn probabilities(&self, row: &RowInput<'_>, probs: &mut [f64], work: &mut Vec<f64>) {
        self.predictive.probabilities(row, probs, work)
    }

    /// Two outputs, μ and the pre-softplus scale, started at q(ε) = Logistic(0, 1): the
    /// prior p(ε), where the ε-only terms log p − log q vanish in expectation.
    fn local_init(&self, _classes: usize) -> Vec<f64> {
        // softplus⁻¹(1) = log(e − 1).
        vec![0.0, (std::f64::consts::E - 1.0).ln()]
    }
}
