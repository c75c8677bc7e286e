//! The row-wise interface of multi-class likelihoods: one true class c per row, and a
//! likelihood p(c | f_i) that needs the row's K utilities jointly (`docs/likelihood.md`,
//! "Multi-class").
//!
//! Under q, row i's utilities f_i = Φ g_i + b [K] are jointly Gaussian: the P latent GPs
//! have independent marginals q(g_ip) = N(m_ip, s_ip), so
//! f_i ~ N(f̄_i, Φ diag(s_i) Φᵀ) with f̄_i = Φ m_i + b. A [`ClassLikelihood`] returns
//! E_i = E_q[log p(c | f_i)] (or the likelihood's lower bound on it) with its gradient, split
//! by the path through which the row's Gaussian depends on the parameters:
//! - the mean f̄_i: the likelihood returns ∂E_i/∂f̄_i [K]; the caller turns it into ∂/∂m_i,
//!   ∂/∂b and the mean part of ∂/∂Φ (for a minibatch with GEMMs, `bound/class_phase.rs`);
//! - the covariance Φ diag(s_i) Φᵀ: the likelihood adds its gradients with respect to s_i
//!   [P] and Φ [K×P] itself, since each likelihood sees the covariance differently (pair
//!   variances, marginal variances, or samples).
//!
//! With independent latent GPs (Φ = I, P = K) the utilities are independent; every
//! likelihood here takes Φ as it comes, so both latent modes go through the same code.

pub mod amortiser;
pub mod ar_logit;
pub mod ar_softmax;
pub mod argmax;
pub mod class_sampling;
pub mod hernandez_lobato;
pub mod one_vs_each;
pub mod robust_max;
pub mod softmax_mc;

use std::fmt;

/// One row's Gaussian over its utilities, as the likelihoods see it.
#[derive(Debug, Clone, Copy)]
pub struct RowInput<'a> {
    /// The true class c (< K); ignored by [`ClassLikelihood::probabilities`].
    pub class: usize,
    /// The Monte Carlo stream of this row (its position in the global minibatch, or its row
    /// id at prediction); with `seed` it fixes the noise of sampling likelihoods.
    pub stream: u64,
    /// The seed of this step's (or prediction's) Monte Carlo noise.
    pub seed: u64,
    /// m_i [P].
    pub mean: &'a [f64],
    /// s_i [P], ≥ 0.
    pub var: &'a [f64],
    /// f̄_i = Φ m_i + b [K].
    pub utility: &'a [f64],
    /// Φ [K×P], row-major (row k at `phi[k * P..(k + 1) * P]`).
    pub phi: &'a [f64],
    /// The row's amortisation-network outputs o_i [O] (`likelihood/multiclass/amortiser.rs`), empty for a
    /// likelihood without local parameters ([`ClassLikelihood::local_init`]).
    pub local: &'a [f64],
    /// The likelihood's learnt parameter θ when it has one (robust-max's logit ε,
    /// `Params::logit_epsilon`); None: the likelihood's own fixed value.
    pub lik_param: Option<f64>,
}

impl RowInput<'_> {
    /// K.
    pub fn classes(&self) -> usize {
        self.utility.len()
    }

    /// P.
    pub fn latents(&self) -> usize {
        self.mean.len()
    }

    /// Row k of Φ [P].
    pub fn phi_row(&self, k: usize) -> &[f64] {
        let p = self.latents();
        &self.phi[k * p..(k + 1) * p]
    }

    /// Var(f_c − f_k) = Σ_p (Φ_cp − Φ_kp)² s_p, the variance of a pair's utility difference
    /// (exact under the factor model; s_c + s_k with Φ = I).
    pub fn pair_variance(&self, c: usize, k: usize) -> f64 {
        let (phi_c, phi_k) = (self.phi_row(c), self.phi_row(k));
        let mut v = 0.0;
        for p in 0..self.latents() {
            let d = phi_c[p] - phi_k[p];
            v += d * d * self.var[p];
        }
        v
    }
}

/// Where a likelihood writes a row's gradient.
pub struct RowGrads<'a> {
    /// ∂E_i/∂f̄_i [K], written (every entry).
    pub utility: &'a mut [f64],
    /// ∂E_i/∂s_i [P], added to (the caller zeroes it per row).
    pub var: &'a mut [f64],
    /// The covariance path's ∂E_i/∂Φ [K×P] row-major, added to (accumulated over rows).
    pub phi: &'a mut [f64],
    /// ∂E_i/∂o_i [O], written (empty without local parameters).
    pub local: &'a mut [f64],
    /// ∂E_i/∂θ of the learnt parameter, added to (untouched when `lik_param` is None).
    pub lik_param: &'a mut f64,
}

impl RowGrads<'_> {
    /// Adds the covariance path of a pair term whose ∂E/∂Var(f_c − f_k) is `beta`:
    /// ∂/∂s_p += β d_p², ∂/∂Φ_kp −= 2β d_p s_p, ∂/∂Φ_cp += 2β d_p s_p with d = Φ_c − Φ_k.
    pub fn add_pair_variance(&mut self, row: &RowInput<'_>, c: usize, k: usize, beta: f64) {
        let p_count = row.latents();
        let (phi_c, phi_k) = (row.phi_row(c), row.phi_row(k));
        for p in 0..p_count {
            let d = phi_c[p] - phi_k[p];
            let cov = 2.0 * beta * d * row.var[p];
            self.var[p] += beta * d * d;
            self.phi[k * p_count + p] -= cov;
            self.phi[c * p_count + p] += cov;
        }
    }
}

/// A likelihood p(c | f) of one class c among K given the row's K utilities, seen through
/// its expectation under the row's joint Gaussian (`docs/likelihood.md`, "Multi-class").
/// Implementations must be deterministic functions of their inputs (sampling ones draw
/// from `seed` and `stream`), so that the bound is a deterministic function of the
/// parameters and can be checked by finite differences.
pub trait ClassLikelihood: Sync + fmt::Debug {
    /// A short name for messages ("one-vs-each", "robust-max", "softmax").
    fn name(&self) -> &'static str;

    /// E_i, with ∂E_i/∂f̄_i written to `grads.utility` and the covariance path's gradients
    /// added to `grads.var` and `grads.phi`. `work` is scratch space the likelihood may
    /// resize as it likes (kept between the rows of a block to avoid allocations).
    fn row(&self, row: &RowInput<'_>, grads: &mut RowGrads<'_>, work: &mut Vec<f64>) -> f64;

    /// The predictive class probabilities p(c | x) for every c [K] (summing to 1) under the
    /// row's Gaussian; `row.class` is ignored.
    fn probabilities(&self, row: &RowInput<'_>, probs: &mut [f64], work: &mut Vec<f64>);

    /// The starting biases c₃ [O] of the amortisation network's outputs for a model of
    /// `classes` classes, one per output the likelihood reads from [`RowInput::local`];
    /// empty (the default) for a likelihood without amortised local parameters.
    fn local_init(&self, classes: usize) -> Vec<f64> {
        let _ = classes;
        Vec::new()
    }
}

/// The multi-class term set of a minibatch: row i's true class `class[i]`, the weight
/// `scale` (N/|B|; 1 for the exact bound) of every row, the likelihood, and the seed of the
/// step's Monte Carlo noise (used only by sampling likelihoods). The bound's data part is
/// scale · Σ_i E_i.
#[derive(Debug, Clone, Copy)]
pub struct Classes<'a> {
    /// c_i [B], each < K.
    pub class: &'a [u32],
    pub scale: f64,
    pub lik: &'a dyn ClassLikelihood,
    pub seed: u64,
    /// Position of row 0 of `class` in the global minibatch: row i's noise stream is
    /// `first_stream + i`. 0 in one process (and for the exact bound); over MPI ranks a
    /// rank's share starts at its first row's position (`train::batches::Batch::first`), so
    /// every row draws the noise it draws in one process.
    pub first_stream: u64,
}

/// f̄_i = Φ m_i + b [K] for one row (Φ row-major [K×P]).
fn utilities(mean: &[f64], phi: &[f64], bias: &[f64]) -> Vec<f64> {
    let p_count = mean.len();
    assert_eq!(phi.len(), bias.len() * p_count, "Φ is not K×P");
    (0..bias.len())
        .map(|k| {
            let row = &phi[k * p_count..(k + 1) * p_count];
            bias[k] + row.iter().zip(mean).map(|(f, m)| f * m).sum::<f64>()
        })
        .collect()
}

/// One row's E_i and its full gradient (the caller's composition of [`RowGrads`] done for a
/// single row): ∂/∂m_i [P], ∂/∂s_i [P], ∂/∂Φ [K×P] row-major, ∂/∂b [K].
#[derive(Debug, Clone, PartialEq)]
pub struct RowGradient {
    pub value: f64,
    pub mean: Vec<f64>,
    pub var: Vec<f64>,
    pub phi: Vec<f64>,
    pub bias: Vec<f64>,
}

/// E_i and its gradient with respect to m_i, s_i, Φ (row-major [K×P]) and b for one row of
/// class `class`: f̄_i = Φ m_i + b, then the likelihood's row method, then the mean path's
/// chain rule ∂m_i = Φᵀ a, ∂b = a, ∂Φ += a m_iᵀ with a = ∂E_i/∂f̄_i. For tests and single
/// rows; a minibatch goes through `bound/class_phase.rs`.
pub fn row_gradient(
    lik: &dyn ClassLikelihood,
    class: usize,
    (seed, stream): (u64, u64),
    mean: &[f64],
    var: &[f64],
    phi: &[f64],
    bias: &[f64],
) -> RowGradient {
    row_gradient_local(lik, class, (seed, stream), (mean, var, phi, bias), &[]).0
}

/// [`row_gradient`] for a likelihood with local parameters: the row's network outputs
/// `local` [O] in, ∂E_i/∂o_i [O] out beside the rest.
pub fn row_gradient_local(
    lik: &dyn ClassLikelihood,
    class: usize,
    (seed, stream): (u64, u64),
    (mean, var, phi, bias): (&[f64], &[f64], &[f64], &[f64]),
    local: &[f64],
) -> (RowGradient, Vec<f64>) {
    let (k_count, p_count) = (bias.len(), mean.len());
    let utility = utilities(mean, phi, bias);
    let input = RowInput {
        class,
        stream,
        seed,
        mean,
        var,
        utility: &utility,
        phi,
        local,
        lik_param: None,
    };
    let mut g_local = vec![0.0; local.len()];
    let mut out = RowGradient {
        value: 0.0,
        mean: vec![0.0; p_count],
        var: vec![0.0; p_count],
        phi: vec![0.0; k_count * p_count],
        bias: vec![0.0; k_count],
    };
    let mut lik_param = 0.0;
    let mut grads = RowGrads {
        utility: &mut out.bias,
        var: &mut out.var,
        phi: &mut out.phi,
        local: &mut g_local,
        lik_param: &mut lik_param,
    };
    out.value = lik.row(&input, &mut grads, &mut Vec::new());
    for k in 0..k_count {
        let a = out.bias[k];
        for p in 0..p_count {
            out.mean[p] += a * phi[k * p_count + p];
            out.phi[k * p_count + p] += a * mean[p];
        }
    }
    (out, g_local)
}

/// Predictive probabilities [K] of one row from its marginals m_i, s_i [P] (see
/// [`row_gradient`]; a block of rows goes through `class_phase::class_probabilities`).
pub fn row_probabilities(
    lik: &dyn ClassLikelihood,
    (seed, stream): (u64, u64),
    mean: &[f64],
    var: &[f64],
    phi: &[f64],
    bias: &[f64],
) -> Vec<f64> {
    let utility = utilities(mean, phi, bias);
    let input = RowInput {
        class: 0,
        stream,
        seed,
        mean,
        var,
        utility: &utility,
        phi,
        local: &[],
        lik_param: None,
    };
    let mut probs = vec![0.0; bias.len()];
    lik.probabilities(&input, &mut probs, &mut Vec::new());
    probs
}
