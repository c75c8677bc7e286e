//! The stochastic evidence lower bound of MLGPF on one minibatch (seed 000 eq. 23) and its
//! exact analytic gradient with respect to every parameter block (`docs/model.md`).
//!
//! F = Σ_{(i,k,y,w) ∈ terms} w · E_q[log σ(y f_ik)] − Σ_p KL_p, with
//! f̄_ik = Σ_p Φ_kp m_ip + b_k and v_ik = Σ_p Φ_kp² s_ip.
//!
//! The caller chooses the terms: every label of every row (exact bound on the rows), or the
//! positives plus a uniform sample of negatives reweighted by |N_i|/|L_i|; the N/|B| scaling
//! is part of each term's weight.

use anyhow::{ensure, Result};
use faer::Mat;
use rand::seq::index::sample;
use rand::Rng;

use super::kernel::{BasisInputs, KernelKind, KernelParams};
use super::likelihood::BernoulliLogistic;
use super::variational;

/// All trainable parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// A [M×R]: inducing inputs Z = A X̃.
    pub a: Mat<f64>,
    /// μ [M×P].
    pub mu: Mat<f64>,
    /// ρ [M×P]: Σ_p = diag(softplus(ρ_p) + 10⁻⁶).
    pub rho: Mat<f64>,
    /// Φ [K×P].
    pub phi: Mat<f64>,
    /// b [K].
    pub bias: Vec<f64>,
    pub kernel: KernelParams,
}

/// Gradients, same shapes as [`Params`].
pub type Grads = Params;

/// One likelihood term: row i (position in the minibatch), label k, y = ±1, weight.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Term {
    pub row: u32,
    pub label: u32,
    pub y: f64,
    pub weight: f64,
}

/// Terms for every label of every row: the bound with all negatives.
/// `scale` is N/|B| (1 for the whole training set).
pub fn terms_all(positives: &[Vec<u32>], n_labels: usize, scale: f64) -> Vec<Term> {
    let mut out = Vec::with_capacity(positives.len() * n_labels);
    for (i, pos) in positives.iter().enumerate() {
        let mut is_pos = vec![false; n_labels];
        for &k in pos {
            is_pos[k as usize] = true;
        }
        for (k, &p) in is_pos.iter().enumerate() {
            out.push(Term {
                row: i as u32,
                label: k as u32,
                y: if p { 1.0 } else { -1.0 },
                weight: scale,
            });
        }
    }
    out
}

/// Positives exactly plus `count` negatives per row sampled uniformly without replacement,
/// each weighted |N_i| / |L_i| so the expectation over samples is the all-negatives bound.
pub fn terms_sampled(
    positives: &[Vec<u32>],
    n_labels: usize,
    count: usize,
    scale: f64,
    rng: &mut impl Rng,
) -> Vec<Term> {
    let mut out = Vec::new();
    for (i, pos) in positives.iter().enumerate() {
        let mut sorted = pos.clone();
        sorted.sort_unstable();
        for &k in &sorted {
            out.push(Term {
                row: i as u32,
                label: k,
                y: 1.0,
                weight: scale,
            });
        }
        let n_neg = n_labels - sorted.len();
        let take = count.min(n_neg);
        if take == 0 {
            continue;
        }
        let weight = scale * n_neg as f64 / take as f64;
        // Sample ranks among the negatives, then map rank → label id skipping positives.
        let mut ranks: Vec<usize> = sample(rng, n_neg, take).into_vec();
        ranks.sort_unstable();
        let (mut p, mut skipped) = (0usize, 0usize);
        for r in ranks {
            // The label with negative-rank r is r + (number of positives ≤ it).
            while p < sorted.len() && (sorted[p] as usize) <= r + skipped {
                p += 1;
                skipped += 1;
            }
            out.push(Term {
                row: i as u32,
                label: (r + skipped) as u32,
                y: -1.0,
                weight,
            });
        }
    }
    out
}

/// Value of the bound and its gradient.
#[derive(Debug, Clone)]
pub struct Evaluation {
    pub value: f64,
    /// Σ_p KL_p (part of `value`, reported separately).
    pub kl: f64,
    /// Diagonal jitter the Cholesky factorisations needed (0 when none).
    pub jitter: f64,
    pub grads: Grads,
}

/// Evaluates F and ∂F on a minibatch: `x` holds its Kxx rows and squared norms.
pub fn evaluate(
    kind: KernelKind,
    params: &Params,
    x: &BasisInputs<'_>,
    terms: &[Term],
    lik: &BernoulliLogistic,
) -> Result<Evaluation> {
    let (p_count, k_count, b) = (params.mu.ncols(), params.phi.nrows(), x.kxx_b.nrows());
    ensure!(
        params.phi.ncols() == p_count && params.bias.len() == k_count,
        "Φ, b and μ disagree in shape"
    );
    let kf = kind.forward(&params.kernel, params.a.as_ref(), x);
    let vf = variational::forward(
        kf.k_z.as_ref(),
        kf.k_bz.as_ref(),
        &kf.k_diag,
        params.mu.as_ref(),
        params.rho.as_ref(),
    )?;
    let (m, s) = (&vf.mean, &vf.var);
    let phi = &params.phi;
    let mut g_mean = Mat::<f64>::zeros(b, p_count);
    let mut g_var = Mat::<f64>::zeros(b, p_count);
    let mut g_phi = Mat::<f64>::zeros(k_count, p_count);
    let mut g_bias = vec![0.0; k_count];
    let mut expected = 0.0;
    for t in terms {
        let (i, k) = (t.row as usize, t.label as usize);
        ensure!(
            i < b && k < k_count,
            "term ({i}, {k}) outside the {b}×{k_count} minibatch"
        );
        let mut mean = params.bias[k];
        let mut var = 0.0;
        for p in 0..p_count {
            mean += phi[(k, p)] * m[(i, p)];
            var += phi[(k, p)] * phi[(k, p)] * s[(i, p)];
        }
        let e = lik.expect(t.y, mean, var.max(0.0));
        expected += t.weight * e.value;
        let (alpha, beta) = (t.weight * e.d_mean, t.weight * e.d_var);
        g_bias[k] += alpha;
        for p in 0..p_count {
            g_mean[(i, p)] += alpha * phi[(k, p)];
            g_var[(i, p)] += beta * phi[(k, p)] * phi[(k, p)];
            g_phi[(k, p)] += alpha * m[(i, p)] + 2.0 * beta * phi[(k, p)] * s[(i, p)];
        }
    }
    let vg = variational::backward(
        &vf,
        kf.k_z.as_ref(),
        kf.k_bz.as_ref(),
        params.mu.as_ref(),
        params.rho.as_ref(),
        g_mean.as_ref(),
        g_var.as_ref(),
    );
    let kg = kind.backward(
        &params.kernel,
        x,
        &kf,
        vg.k_z.as_ref(),
        vg.k_bz.as_ref(),
        &vg.k_diag,
    );
    Ok(Evaluation {
        value: expected - vf.kl,
        kl: vf.kl,
        jitter: vf.jitter,
        grads: Params {
            a: kg.a,
            mu: vg.mu,
            rho: vg.rho,
            phi: g_phi,
            bias: g_bias,
            kernel: KernelParams {
                log_sf2: kg.log_sf2,
                log_ell: kg.log_ell,
            },
        },
    })
}

/// Reads a parameter's value by flat index (for finite-difference checks and optimisers):
/// the blocks in order A, μ, ρ, Φ, b, log σ_f², log ℓ.
pub fn flat_len(p: &Params) -> usize {
    let mat = |m: &Mat<f64>| m.nrows() * m.ncols();
    mat(&p.a) + mat(&p.mu) + mat(&p.rho) + mat(&p.phi) + p.bias.len() + 2
}

/// A mutable reference to the flat-indexed entry (see [`flat_len`]) and its block's name.
pub fn flat_entry(p: &mut Params, mut idx: usize) -> (&'static str, &mut f64) {
    for (name, m) in [
        ("A", &mut p.a),
        ("μ", &mut p.mu),
        ("ρ", &mut p.rho),
        ("Φ", &mut p.phi),
    ] {
        let n = m.nrows() * m.ncols();
        if idx < n {
            let rows = m.nrows();
            return (name, &mut m[(idx % rows, idx / rows)]);
        }
        idx -= n;
    }
    if idx < p.bias.len() {
        return ("b", &mut p.bias[idx]);
    }
    match idx - p.bias.len() {
        0 => ("log σ_f²", &mut p.kernel.log_sf2),
        _ => ("log ℓ", &mut p.kernel.log_ell),
    }
}
