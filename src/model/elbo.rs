//! The stochastic evidence lower bound of MLGPF on one minibatch (seed 000 eq. 23) and its
//! exact analytic gradient with respect to every parameter block (`docs/model.md`).
//!
//! F = Σ_{(i,k,y,w) ∈ terms} w · E_q[log σ(y f_ik)] − Σ_p KL_p, with
//! f̄_ik = Σ_p Φ_kp m_ip + b_k and v_ik = Σ_p Φ_kp² s_ip.
//!
//! The caller chooses the terms: every label of every row (exact bound on the rows), or the
//! positives plus a uniform sample of negatives reweighted by |N_i|/|L_i|; the N/|B| scaling
//! is part of each term's weight.

use std::sync::Mutex;
use std::time::Instant;

use anyhow::{ensure, Result};
use faer::linalg::matmul::matmul;
use faer::{Accum, Mat, MatMut, MatRef, Par};
use rand::seq::index::sample;
use rand::Rng;
use rayon::prelude::*;

use super::kernel::{BasisInputs, KernelForward, KernelKind, KernelParams};
use super::likelihood::BernoulliLogistic;
use super::subspace::{self, Subspace};
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

/// The likelihood terms of a bound.
#[derive(Debug, Clone, Copy)]
pub enum TermSet<'a> {
    /// Explicit terms (sampled negatives, or any subset).
    List(&'a [Term]),
    /// Every label of every row, weight `scale` (N/|B|; 1 for the exact bound): y = +1 for
    /// the row's `positives`, −1 for all other labels. Evaluated densely with GEMMs; equal
    /// to `List(&terms_all(positives, K, scale))` up to summation order.
    AllLabels {
        positives: &'a [Vec<u32>],
        scale: f64,
    },
}

/// What [`evaluate_set`] computes besides the bound.
#[derive(Debug, Clone, Copy)]
pub struct EvalOptions {
    /// Gradients with respect to A, log σ_f² and log ℓ. When false (A and the kernel
    /// hyperparameters frozen), the backward pass through K_Z and K_bZ, O(M³) per latent
    /// GP, is skipped and those gradients are returned as zeros.
    pub kernel_grads: bool,
    /// Which factorisation the per-GP work goes through (`docs/model.md`).
    pub factorisation: Factorisation,
}

impl Default for EvalOptions {
    fn default() -> Self {
        EvalOptions {
            kernel_grads: true,
            factorisation: Factorisation::Auto,
        }
    }
}

/// The per-GP algebra of q(u): through C_p = K_Z + Σ_p [M×M] (any kernel), or through
/// J_p = I + Fᵀ Σ_p⁻¹ F [R×R] (linear kernel only, `subspace.rs`). Both give the same bound
/// and gradients up to rounding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Factorisation {
    /// The subspace path for the linear kernel when it is cheaper
    /// ([`subspace::worthwhile`]: R ≤ ¾M) and K_X̃ is positive definite; else C_p.
    #[default]
    Auto,
    /// Always C_p = K_Z + Σ_p.
    Inducing,
    /// Always J_p (an error for the squared-exponential kernel or a singular K_X̃).
    Subspace,
}

/// The subspace factors when `choice` selects that path for this kernel and shape.
fn subspace_for(
    kind: KernelKind,
    params: &Params,
    x: &BasisInputs<'_>,
    kf: &KernelForward,
    choice: Factorisation,
) -> Result<Option<Subspace>> {
    let (m, r) = (params.a.nrows(), params.a.ncols());
    let wanted = match choice {
        Factorisation::Auto => kind == KernelKind::Linear && subspace::worthwhile(m, r),
        Factorisation::Inducing => false,
        Factorisation::Subspace => {
            ensure!(
                kind == KernelKind::Linear,
                "the subspace factorisation needs the linear kernel"
            );
            true
        }
    };
    if !wanted {
        return Ok(None);
    }
    let sub = Subspace::new(&params.kernel, params.a.as_ref(), x, &kf.k_diag);
    ensure!(
        sub.is_some() || choice == Factorisation::Auto,
        "the subspace factorisation needs a positive definite K_X̃"
    );
    Ok(sub)
}

/// Wall-clock seconds spent in each phase of one evaluation.
#[derive(Debug, Clone, Copy, Default)]
pub struct PhaseTimes {
    /// K_Z, K_bZ, k_ii.
    pub kernel_fwd: f64,
    /// Cholesky factors, marginals m and s, KL.
    pub variational_fwd: f64,
    /// Utilities f̄ and v, quadrature, and the gradients with respect to m, s, Φ and b.
    pub likelihood: f64,
    /// Gradients with respect to μ, ρ, K_Z, K_bZ and k_ii.
    pub variational_bwd: f64,
    /// Chain rule to A, log σ_f², log ℓ.
    pub kernel_bwd: f64,
}

impl PhaseTimes {
    pub fn total(&self) -> f64 {
        self.kernel_fwd
            + self.variational_fwd
            + self.likelihood
            + self.variational_bwd
            + self.kernel_bwd
    }
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
    pub times: PhaseTimes,
}

/// The likelihood part's results: Σ w E and the gradients with respect to m, s, Φ, b.
struct LikelihoodGrads {
    expected: f64,
    /// ∂/∂m [B×P].
    mean: Mat<f64>,
    /// ∂/∂s [B×P].
    var: Mat<f64>,
    /// ∂/∂Φ [K×P].
    phi: Mat<f64>,
    /// ∂/∂b [K].
    bias: Vec<f64>,
}

fn check_shapes(params: &Params, x: &BasisInputs<'_>, terms: &TermSet<'_>) -> Result<()> {
    let (p_count, k_count) = (params.mu.ncols(), params.phi.nrows());
    ensure!(
        params.phi.ncols() == p_count && params.bias.len() == k_count,
        "Φ, b and μ disagree in shape"
    );
    let b = x.kxx_b.nrows();
    match terms {
        TermSet::List(list) => {
            for t in list.iter() {
                let (i, k) = (t.row as usize, t.label as usize);
                ensure!(
                    i < b && k < k_count,
                    "term ({i}, {k}) outside the {b}×{k_count} minibatch"
                );
            }
        }
        TermSet::AllLabels { positives, .. } => {
            ensure!(
                positives.len() == b,
                "{} rows of labels for a minibatch of {b} rows",
                positives.len()
            );
            for pos in positives.iter() {
                for &k in pos {
                    ensure!(
                        (k as usize) < k_count,
                        "label {k} outside the {k_count} labels"
                    );
                }
            }
        }
    }
    Ok(())
}

/// Evaluates F and ∂F on a minibatch: `x` holds its Kxx rows and squared norms.
pub fn evaluate(
    kind: KernelKind,
    params: &Params,
    x: &BasisInputs<'_>,
    terms: &[Term],
    lik: &BernoulliLogistic,
) -> Result<Evaluation> {
    evaluate_set(
        kind,
        params,
        x,
        &TermSet::List(terms),
        lik,
        &EvalOptions::default(),
    )
}

/// Evaluates F and ∂F on a minibatch for any [`TermSet`] (`docs/model.md`, "Algorithm as
/// implemented"). Runs in the current rayon pool; the result does not depend on its size.
pub fn evaluate_set(
    kind: KernelKind,
    params: &Params,
    x: &BasisInputs<'_>,
    terms: &TermSet<'_>,
    lik: &BernoulliLogistic,
    opts: &EvalOptions,
) -> Result<Evaluation> {
    check_shapes(params, x, terms)?;
    let mut times = PhaseTimes::default();
    let clock = Instant::now();
    let kf = kind.forward(&params.kernel, params.a.as_ref(), x);
    let sub = subspace_for(kind, params, x, &kf, opts.factorisation)?;
    times.kernel_fwd = lap(&clock, 0.0);
    let vf = variational::forward(
        kf.k_z.as_ref(),
        kf.k_bz.as_ref(),
        &kf.k_diag,
        params.mu.as_ref(),
        params.rho.as_ref(),
        sub.as_ref(),
    )?;
    times.variational_fwd = lap(&clock, times.total());
    let lg = likelihood_part(params, vf.mean.as_ref(), vf.var.as_ref(), terms, lik);
    times.likelihood = lap(&clock, times.total());
    let vg = variational::backward(
        &vf,
        kf.k_z.as_ref(),
        kf.k_bz.as_ref(),
        params.mu.as_ref(),
        params.rho.as_ref(),
        lg.mean.as_ref(),
        lg.var.as_ref(),
        opts.kernel_grads,
        sub.as_ref(),
    );
    let (kl, jitter) = (vf.kl, vf.jitter);
    vf.recycle();
    times.variational_bwd = lap(&clock, times.total());
    let (g_a, g_kernel) = if opts.kernel_grads {
        let kg = kind.backward(
            &params.kernel,
            x,
            &kf,
            vg.k_z.as_ref(),
            vg.k_bz.as_ref(),
            &vg.k_diag,
        );
        let (mut g_a, mut g_log_sf2) = (kg.a, kg.log_sf2);
        if let Some(sub) = &sub {
            let (a, log_sf2) = sub.chain(vg.f.as_ref(), vg.g.as_ref());
            g_a += a;
            g_log_sf2 += log_sf2;
        }
        (
            g_a,
            KernelParams {
                log_sf2: g_log_sf2,
                log_ell: kg.log_ell,
            },
        )
    } else {
        (
            Mat::zeros(params.a.nrows(), params.a.ncols()),
            KernelParams {
                log_sf2: 0.0,
                log_ell: 0.0,
            },
        )
    };
    times.kernel_bwd = lap(&clock, times.total());
    Ok(Evaluation {
        value: lg.expected - kl,
        kl,
        jitter,
        grads: Params {
            a: g_a,
            mu: vg.mu,
            rho: vg.rho,
            phi: lg.phi,
            bias: lg.bias,
            kernel: g_kernel,
        },
        times,
    })
}

/// Seconds since `clock` minus what earlier phases already took.
fn lap(clock: &Instant, before: f64) -> f64 {
    clock.elapsed().as_secs_f64() - before
}

/// Σ_terms w E only (no KL, no gradients): one batch's share of the exact bound. Costs the
/// kernels, a Cholesky and a triangular solve per GP, and the quadrature.
pub fn expected_loglik(
    kind: KernelKind,
    params: &Params,
    x: &BasisInputs<'_>,
    terms: &TermSet<'_>,
    lik: &BernoulliLogistic,
) -> Result<f64> {
    check_shapes(params, x, terms)?;
    let kf = kind.forward(&params.kernel, params.a.as_ref(), x);
    let sub = subspace_for(kind, params, x, &kf, Factorisation::Auto)?;
    let (mean, var, _) = variational::marginals(
        kf.k_z.as_ref(),
        kf.k_bz.as_ref(),
        &kf.k_diag,
        params.mu.as_ref(),
        params.rho.as_ref(),
        sub.as_ref(),
    )?;
    Ok(likelihood_part(params, mean.as_ref(), var.as_ref(), terms, lik).expected)
}

/// Σ_p KL_p, which depends on the data only through K_X̃ [R×R]: computed once for a
/// full-data bound, on the path [`evaluate_set`] takes by default.
pub fn kl_total(kind: KernelKind, params: &Params, k_tilde: MatRef<'_, f64>) -> Result<f64> {
    let no_rows = Mat::<f64>::zeros(0, k_tilde.nrows());
    let x = BasisInputs {
        kxx_b: no_rows.as_ref(),
        sq_norms: &[],
        k_tilde,
    };
    let kf = kind.forward(&params.kernel, params.a.as_ref(), &x);
    let sub = subspace_for(kind, params, &x, &kf, Factorisation::Auto)?;
    variational::kl_total(
        kf.k_z.as_ref(),
        params.mu.as_ref(),
        params.rho.as_ref(),
        sub.as_ref(),
    )
}

fn likelihood_part(
    params: &Params,
    mean: MatRef<'_, f64>,
    var: MatRef<'_, f64>,
    terms: &TermSet<'_>,
    lik: &BernoulliLogistic,
) -> LikelihoodGrads {
    match terms {
        TermSet::List(list) => likelihood_list(params, mean, var, list, lik),
        TermSet::AllLabels { positives, scale } => {
            likelihood_dense(params, mean, var, positives, *scale, lik)
        }
    }
}

/// Terms per parallel task of the list path.
const TERM_BLOCK: usize = 4096;

/// The list path: per term, f̄ = Φ_k·m_i + b_k and v = (Φ_k∘Φ_k)·s_i, the quadrature in
/// parallel blocks of terms, then the gradients accumulated sequentially in term order (so
/// the result is independent of the thread count).
fn likelihood_list(
    params: &Params,
    m: MatRef<'_, f64>,
    s: MatRef<'_, f64>,
    terms: &[Term],
    lik: &BernoulliLogistic,
) -> LikelihoodGrads {
    let (b, p_count, k_count) = (m.nrows(), m.ncols(), params.phi.nrows());
    let phi = params.phi.as_ref();
    // Row-major copies so each term reads contiguous P-vectors.
    let phi_rows: Vec<f64> = (0..k_count)
        .flat_map(|k| (0..p_count).map(move |p| phi[(k, p)]))
        .collect();
    let m_rows: Vec<f64> = (0..b)
        .flat_map(|i| (0..p_count).map(move |p| m[(i, p)]))
        .collect();
    let s_rows: Vec<f64> = (0..b)
        .flat_map(|i| (0..p_count).map(move |p| s[(i, p)]))
        .collect();
    // (value, ∂E/∂f̄, ∂E/∂v) per term.
    let per_term: Vec<(Vec<f64>, Vec<f64>, Vec<f64>)> = terms
        .par_chunks(TERM_BLOCK)
        .map(|block| {
            let n = block.len();
            let (mut y, mut fm, mut fv, mut val) =
                (vec![0.0; n], vec![0.0; n], vec![0.0; n], vec![0.0; n]);
            for (j, t) in block.iter().enumerate() {
                let (i, k) = (t.row as usize, t.label as usize);
                let f = &phi_rows[k * p_count..(k + 1) * p_count];
                let mi = &m_rows[i * p_count..(i + 1) * p_count];
                let si = &s_rows[i * p_count..(i + 1) * p_count];
                let mut mean = params.bias[k];
                let mut var = 0.0;
                for p in 0..p_count {
                    mean += f[p] * mi[p];
                    var += f[p] * f[p] * si[p];
                }
                y[j] = t.y;
                fm[j] = mean;
                fv[j] = var.max(0.0);
            }
            lik.expect_lanes(&y, &mut fm, &mut fv, &mut val);
            (val, fm, fv)
        })
        .collect();
    let mut g_mean_rows = vec![0.0; b * p_count];
    let mut g_var_rows = vec![0.0; b * p_count];
    let mut g_phi_rows = vec![0.0; k_count * p_count];
    let mut g_bias = vec![0.0; k_count];
    let mut expected = 0.0;
    for (block, (val, dm, dv)) in terms.chunks(TERM_BLOCK).zip(&per_term) {
        for (j, t) in block.iter().enumerate() {
            let (i, k) = (t.row as usize, t.label as usize);
            expected += t.weight * val[j];
            let (alpha, beta) = (t.weight * dm[j], t.weight * dv[j]);
            g_bias[k] += alpha;
            let f = &phi_rows[k * p_count..(k + 1) * p_count];
            let mi = &m_rows[i * p_count..(i + 1) * p_count];
            let si = &s_rows[i * p_count..(i + 1) * p_count];
            let gm = &mut g_mean_rows[i * p_count..(i + 1) * p_count];
            for p in 0..p_count {
                gm[p] += alpha * f[p];
            }
            let gv = &mut g_var_rows[i * p_count..(i + 1) * p_count];
            for p in 0..p_count {
                gv[p] += beta * f[p] * f[p];
            }
            let gf = &mut g_phi_rows[k * p_count..(k + 1) * p_count];
            for p in 0..p_count {
                gf[p] += alpha * mi[p] + 2.0 * beta * f[p] * si[p];
            }
        }
    }
    LikelihoodGrads {
        expected,
        mean: Mat::from_fn(b, p_count, |i, p| g_mean_rows[i * p_count + p]),
        var: Mat::from_fn(b, p_count, |i, p| g_var_rows[i * p_count + p]),
        phi: Mat::from_fn(k_count, p_count, |k, p| g_phi_rows[k * p_count + p]),
        bias: g_bias,
    }
}

/// The [K×B] buffers of the dense path, kept between calls: at AmazonCat sizes they are
/// 2 × 53 MB, and fresh allocations that large are new zero pages (the pipeline fixes
/// glibc's mmap threshold at 1 MiB), whose page faults cost tens of milliseconds a step.
static DENSE_SCRATCH: Mutex<(Vec<f64>, Vec<f64>)> = Mutex::new((Vec::new(), Vec::new()));

/// Two buffers of length n with unspecified contents (every entry is overwritten).
fn take_scratch(n: usize) -> (Vec<f64>, Vec<f64>) {
    let (mut a, mut b) =
        std::mem::take(&mut *DENSE_SCRATCH.lock().unwrap_or_else(|e| e.into_inner()));
    for v in [&mut a, &mut b] {
        if v.len() != n {
            v.clear();
            v.resize(n, 0.0);
        }
    }
    (a, b)
}

fn put_scratch(a: Vec<f64>, b: Vec<f64>) {
    *DENSE_SCRATCH.lock().unwrap_or_else(|e| e.into_inner()) = (a, b);
}

/// The dense all-labels path, every step a GEMM or an elementwise pass over [K×B] buffers
/// (the transposes of f̄, v, α, β, so each minibatch row is a contiguous column):
/// f̄ᵀ = Φ mᵀ + b1ᵀ, vᵀ = (Φ∘Φ) sᵀ; the quadrature in place, per row in parallel, turns
/// them into αᵀ = scale ∂E/∂f̄ and βᵀ = scale ∂E/∂v; then G_m = α Φ, G_s = β (Φ∘Φ),
/// ∂Φ = αᵀ m + 2 Φ ∘ (βᵀ s), ∂b = Σ_i α_i.
fn likelihood_dense(
    params: &Params,
    m: MatRef<'_, f64>,
    s: MatRef<'_, f64>,
    positives: &[Vec<u32>],
    scale: f64,
    lik: &BernoulliLogistic,
) -> LikelihoodGrads {
    let (b, p_count, k_count) = (m.nrows(), m.ncols(), params.phi.nrows());
    let phi = params.phi.as_ref();
    let phi2 = Mat::from_fn(k_count, p_count, |k, p| phi[(k, p)] * phi[(k, p)]);
    let (mut alpha, mut beta) = take_scratch(k_count * b);
    {
        let f_t = MatMut::from_column_major_slice_mut(&mut alpha, k_count, b);
        product_into(f_t, phi, m.transpose());
        let v_t = MatMut::from_column_major_slice_mut(&mut beta, k_count, b);
        product_into(v_t, phi2.as_ref(), s.transpose());
    }
    let row_values: Vec<f64> = alpha
        .par_chunks_mut(k_count)
        .zip(beta.par_chunks_mut(k_count))
        .zip(positives.par_iter())
        .map(|((f_row, v_row), pos)| {
            let mut y = vec![-1.0; k_count];
            for &k in pos {
                y[k as usize] = 1.0;
            }
            for (f, bias) in f_row.iter_mut().zip(&params.bias) {
                *f += bias;
            }
            for v in v_row.iter_mut() {
                *v = v.max(0.0);
            }
            let mut val = vec![0.0; k_count];
            lik.expect_lanes(&y, f_row, v_row, &mut val);
            for (a, bt) in f_row.iter_mut().zip(v_row.iter_mut()) {
                *a *= scale;
                *bt *= scale;
            }
            val.iter().sum::<f64>()
        })
        .collect();
    let expected = scale * row_values.iter().sum::<f64>();
    let alpha_t = MatRef::from_column_major_slice(&alpha, k_count, b);
    let beta_t = MatRef::from_column_major_slice(&beta, k_count, b);
    let g_mean = product(alpha_t.transpose(), phi);
    let g_var = product(beta_t.transpose(), phi2.as_ref());
    let mut g_phi = product(alpha_t, m);
    let bt_s = product(beta_t, s);
    for p in 0..p_count {
        for k in 0..k_count {
            g_phi[(k, p)] += 2.0 * phi[(k, p)] * bt_s[(k, p)];
        }
    }
    // ∂b_k = Σ_i α_ik, summed over rows in order.
    let mut g_bias = vec![0.0; k_count];
    for row in alpha.chunks(k_count) {
        for (g, a) in g_bias.iter_mut().zip(row) {
            *g += a;
        }
    }
    put_scratch(alpha, beta);
    LikelihoodGrads {
        expected,
        mean: g_mean,
        var: g_var,
        phi: g_phi,
        bias: g_bias,
    }
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

/// lhs · rhs as a new matrix (see [`product_into`]).
fn product(lhs: MatRef<'_, f64>, rhs: MatRef<'_, f64>) -> Mat<f64> {
    let mut out = Mat::<f64>::zeros(lhs.nrows(), rhs.ncols());
    product_into(out.as_mut(), lhs, rhs);
    out
}

/// dst = lhs · rhs on the current rayon pool; `results_are_bitwise_identical_for_one_and_two_threads`
/// (tests/elbo_gradients.rs) checks that the pool size does not change the bits.
fn product_into(dst: MatMut<'_, f64>, lhs: MatRef<'_, f64>, rhs: MatRef<'_, f64>) {
    matmul(dst, Accum::Replace, lhs, rhs, 1.0, Par::rayon(0));
}
