//! The softmax likelihood p(c | f) = e^{f_c} / Σ_k e^{f_k} by Monte Carlo with the
//! reparametrisation trick, sampling the P latent values rather than the K utilities:
//! g_i = m_i + √s_i ∘ ε with ε ~ N(0, I_P), f_i = Φ g_i + b, which is exactly the row's joint
//! q(f_i) = N(Φ m_i + b, Φ diag(s_i) Φᵀ) under both latent modes.
//!
//! Each of the S draws ε_j is used with its antithetic partner −ε_j (2S evaluations; the
//! estimate stays unbiased and its odd-order error terms cancel):
//! Ê_i = (1/2S) Σ_r log softmax(f̄_i + Φ (√s_i ∘ e_r))_c with e_r = ±ε_j. The noise is drawn
//! from ChaCha8 seeded by the step's seed, stream = the row, so Ê_i is a deterministic,
//! smooth function of the parameters and its gradient, the exact gradient of the estimate,
//! can be checked by finite differences. With δ_r = e_c − softmax(f_r) [K] and
//! h_r = √s_i ∘ e_r [P] (`docs/likelihood.md`, "Multi-class"):
//! ∂Ê/∂f̄ = (1/2S) Σ_r δ_r; ∂Ê/∂s_p = (1/2S) Σ_r (Φᵀ δ_r)_p h_rp / (2 s_p);
//! ∂Ê/∂Φ (covariance path) = (1/2S) Σ_r δ_r h_rᵀ. Per row these are three GEMMs,
//! [2S×P]·[P×K], [2S×K]·[K×P] and [P×2S]·[2S×K]: 6·2S·K·P flops.

use anyhow::{ensure, Result};
use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

use crate::linalg::clear_upper_simd_state;
use crate::model::likelihood::multiclass::{ClassLikelihood, RowGrads, RowInput};

/// The default number of antithetic pairs.
pub const DEFAULT_PAIRS: usize = 16;

/// The softmax likelihood by Monte Carlo with `pairs` antithetic pairs of draws per row.
#[derive(Debug, Clone)]
pub struct SoftmaxMc {
    pairs: usize,
}

impl SoftmaxMc {
    /// Errors for 0 pairs.
    pub fn new(pairs: usize) -> Result<Self> {
        ensure!(pairs > 0, "the softmax needs at least one Monte Carlo pair");
        Ok(SoftmaxMc { pairs })
    }

    pub fn pairs(&self) -> usize {
        self.pairs
    }

    /// The 2S sampled noise vectors h_r = √s ∘ (±ε_j) into `h` [2S×P] column-major, rows 2j
    /// and 2j + 1 for the pair j; the P draws of ε_j in order p = 0..P.
    fn noise_into(&self, row: &RowInput<'_>, h: &mut [f64]) {
        let n = 2 * self.pairs;
        let mut rng = ChaCha8Rng::seed_from_u64(row.seed);
        rng.set_stream(row.stream);
        let sd: Vec<f64> = row.var.iter().map(|s| s.max(0.0).sqrt()).collect();
        for j in 0..self.pairs {
            for (p, s) in sd.iter().enumerate() {
                let e: f64 = StandardNormal.sample(&mut rng);
                h[p * n + 2 * j] = s * e;
                h[p * n + 2 * j + 1] = -(s * e);
            }
        }
    }

    /// The sampled utilities f_r = f̄ + Φ h_r into `f` [2S×K] column-major.
    fn utilities_into(row: &RowInput<'_>, h: MatRef<'_, f64>, f: &mut [f64]) {
        let (n, k_count) = (h.nrows(), row.classes());
        // Φ row-major [K×P] is Φᵀ column-major [P×K].
        let phi_t = MatRef::from_column_major_slice(row.phi, row.latents(), k_count);
        let view = MatMut::from_column_major_slice_mut(f, n, k_count);
        matmul(view, Accum::Replace, h, phi_t, 1.0, Par::Seq);
        // The softmax's exponentials follow: see `clear_upper_simd_state`.
        clear_upper_simd_state();
        for (k, col) in f.chunks_mut(n).enumerate() {
            for x in col.iter_mut() {
                *x += row.utility[k];
            }
        }
    }
}

/// Overwrites the sample rows of `f` [n×K] column-major with softmax(f_r) and returns
/// Σ_r log softmax(f_r)_c (c = `class`, or 0 ignored when None).
fn softmax_rows(f: &mut [f64], n: usize, class: Option<usize>) -> f64 {
    let k_count = f.len() / n;
    let mut total = 0.0;
    for r in 0..n {
        let max = (0..k_count).map(|k| f[k * n + r]).fold(f64::MIN, f64::max);
        // log softmax_c = (f_c − max) − log Σ_k e^{f_k − max}, formed before e^{f_c − max}
        // can underflow.
        let shifted_c = class.map(|c| f[c * n + r] - max);
        let mut sum = 0.0;
        for k in 0..k_count {
            let e = (f[k * n + r] - max).exp();
            f[k * n + r] = e;
            sum += e;
        }
        if let Some(shifted) = shifted_c {
            total += shifted - sum.ln();
        }
        for k in 0..k_count {
            f[k * n + r] /= sum;
        }
    }
    total
}

impl ClassLikelihood for SoftmaxMc {
    fn name(&self) -> &'static str {
        "softmax"
    }

    fn row(&self, row: &RowInput<'_>, grads: &mut RowGrads<'_>, work: &mut Vec<f64>) -> f64 {
        let (k_count, p_count, c) = (row.classes(), row.latents(), row.class);
        let n = 2 * self.pairs;
        let inv_n = 1.0 / n as f64;
        work.clear();
        work.resize(n * (2 * p_count + k_count), 0.0);
        let (h, rest) = work.split_at_mut(n * p_count);
        let (f, w) = rest.split_at_mut(n * k_count);
        self.noise_into(row, h);
        let h = MatRef::from_column_major_slice(h, n, p_count);
        Self::utilities_into(row, h, f);
        let total = softmax_rows(f, n, Some(c));
        // δ_r = e_c − softmax(f_r), in place.
        for (k, col) in f.chunks_mut(n).enumerate() {
            let hit = if k == c { 1.0 } else { 0.0 };
            let mut a = 0.0;
            for x in col.iter_mut() {
                *x = hit - *x;
                a += *x;
            }
            grads.utility[k] = a * inv_n;
        }
        let delta = MatRef::from_column_major_slice(f, n, k_count);
        // W = Δ Φ [n×P] (Φᵀ δ_r per sample), then ∂/∂s_p = Σ_r W_rp h_rp / (2 s_p) / n.
        let phi_t = MatRef::from_column_major_slice(row.phi, p_count, k_count);
        let mut w_view = MatMut::from_column_major_slice_mut(w, n, p_count);
        matmul(
            w_view.as_mut(),
            Accum::Replace,
            delta,
            phi_t.transpose(),
            1.0,
            Par::Seq,
        );
        for p in 0..p_count {
            let s = row.var[p];
            if s > 0.0 {
                let dot: f64 = (0..n).map(|r| w_view[(r, p)] * h[(r, p)]).sum();
                grads.var[p] += dot * inv_n / (2.0 * s);
            }
        }
        // (∂Φ)ᵀ [P×K] += hᵀ Δ / n: the row-major [K×P] gradient is its column-major transpose.
        let g_phi_t = MatMut::from_column_major_slice_mut(grads.phi, p_count, k_count);
        matmul(g_phi_t, Accum::Add, h.transpose(), delta, inv_n, Par::Seq);
        total * inv_n
    }

    /// E_q[softmax(f)] by the same estimator: the mean of softmax(f_r) over the 2S samples.
    fn probabilities(&self, row: &RowInput<'_>, probs: &mut [f64], work: &mut Vec<f64>) {
        let (k_count, p_count) = (row.classes(), row.latents());
        let n = 2 * self.pairs;
        work.clear();
        work.resize(n * (p_count + k_count), 0.0);
        let (h, f) = work.split_at_mut(n * p_count);
        self.noise_into(row, h);
        Self::utilities_into(row, MatRef::from_column_major_slice(h, n, p_count), f);
        softmax_rows(f, n, None);
        for (k, out) in probs.iter_mut().enumerate() {
            *out = f[k * n..(k + 1) * n].iter().sum::<f64>() / n as f64;
        }
    }
}
