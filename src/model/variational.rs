//! q(u_p) = N(K_Z μ_p, (K_Z⁻¹ + Σ_p⁻¹)⁻¹): marginals of h_p at the minibatch rows, the KL
//! terms, and their gradients (`docs/model.md`, sections "q(u) and marginals", "Gradients"
//! and "Algorithm as implemented").
//!
//! Only C_p = K_Z + Σ_p = L_p L_pᵀ is ever factorised: K_Z itself may be singular (R < M,
//! linear kernel). Σ_p = diag(softplus(ρ_p) + 10⁻⁶). Every product with C_p⁻¹ goes through
//! L_p⁻¹ (triangular solves and triangular products), about 2M³ + 3M²B flops per latent GP
//! for the forward and backward passes together.
//!
//! The P latent GPs are independent given K_Z and K_bZ: they are processed by rayon in
//! fixed chunks of [`GP_CHUNK`] GPs, each chunk sequential inside (faer `Par::Seq`), and the
//! chunks' results are summed in chunk order. The chunking does not depend on the number of
//! threads, so neither do the results, bit for bit.
//!
//! Shapes: K_Z [M×M], K_bZ [B×M], k_ii [B], μ and ρ [M×P], marginal means and variances
//! [B×P].

use anyhow::{bail, Result};
use faer::dyn_stack::{MemBuffer, MemStack};
use faer::linalg::cholesky::llt::factor::{cholesky_in_place, cholesky_in_place_scratch};
use faer::linalg::matmul::matmul;
use faer::linalg::matmul::triangular::{matmul as tri_matmul, BlockStructure};
use faer::linalg::triangular_inverse::invert_lower_triangular;
use faer::linalg::triangular_solve::solve_lower_triangular_in_place;
use faer::reborrow::{Reborrow, ReborrowMut};
use faer::{Accum, Mat, MatRef, Par};
use rayon::prelude::*;
use std::sync::Mutex;

use super::subspace::{self, Subspace};

/// Smallest variance parameter σ_pm.
pub const MIN_SIGMA: f64 = 1e-6;

/// Latent GPs per parallel task. Fixed (not derived from the thread count) so that the
/// order of every floating-point reduction, hence every result, is the same for any number
/// of threads. Three GPs give ten tasks at P = 30: enough to balance two to eight cores,
/// and large enough that the chunk's concatenated product (see [`backward`]) is an
/// efficient GEMM.
pub const GP_CHUNK: usize = 3;

/// Recycled M×M and M×B work matrices. The per-GP factors and the chunks' products are
/// 10⁸ bytes and more per step; freshly allocated, they would be new zero pages every step
/// (the pipeline fixes glibc's mmap threshold at 1 MiB), and their page faults a
/// noticeable part of the step. Buffers come back through [`VariationalForward::recycle`]
/// and at the end of each backward chunk.
static POOL: Mutex<Vec<Mat<f64>>> = Mutex::new(Vec::new());

/// Most buffers kept in [`POOL`] (enough for P = 64 latent GPs and their chunks).
const POOL_CAP: usize = 256;

/// An m×n matrix with unspecified contents (callers overwrite every entry they read).
pub(crate) fn take_mat(m: usize, n: usize) -> Mat<f64> {
    let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
    match pool.iter().rposition(|x| x.nrows() == m && x.ncols() == n) {
        Some(i) => pool.swap_remove(i),
        None => {
            drop(pool);
            Mat::zeros(m, n)
        }
    }
}

/// Returns a buffer to the pool (dropped when the pool is full).
pub(crate) fn give_mat(x: Mat<f64>) {
    if x.nrows() * x.ncols() == 0 {
        return;
    }
    let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
    if pool.len() < POOL_CAP {
        pool.push(x);
    }
}

/// σ = softplus(ρ) + 10⁻⁶ (stable for large |ρ|).
pub fn sigma_of(rho: f64) -> f64 {
    let softplus = if rho > 30.0 { rho } else { rho.exp().ln_1p() };
    softplus + MIN_SIGMA
}

/// dσ/dρ = logistic(ρ).
pub(crate) fn dsigma_drho(rho: f64) -> f64 {
    1.0 / (1.0 + (-rho).exp())
}

/// Per-latent-GP factors kept for the backward pass.
/// On the subspace path (`subspace.rs`) the same fields hold L_p⁻¹ and V_p = L_p⁻¹ G of
/// J_p = I + Fᵀ Σ_p⁻¹ F = L_p L_pᵀ, [R×R] and [R×B].
#[derive(Debug, Clone)]
pub(crate) struct PerGp {
    /// L_p⁻¹ [M×M] in the lower triangle (nothing meaningful above the diagonal).
    pub l_inv: Mat<f64>,
    /// V_p = L_p⁻¹ K_bZᵀ [M×B].
    pub v: Mat<f64>,
    /// Σ_p actually used (σ plus any jitter) [M].
    pub sigma: Vec<f64>,
}

/// Forward results.
#[derive(Debug, Clone)]
pub struct VariationalForward {
    /// m = K_bZ μ [B×P].
    pub mean: Mat<f64>,
    /// s_ip = k_ii − k_iᵀ C_p⁻¹ k_i = k_ii − ‖V_p e_i‖² [B×P].
    pub var: Mat<f64>,
    /// Σ_p KL_p.
    pub kl: f64,
    /// Largest diagonal jitter that had to be added to some C_p (0 when none).
    pub jitter: f64,
    per_gp: Vec<PerGp>,
    /// Whether the per-GP factors are the subspace path's (J_p rather than C_p).
    subspace: bool,
}

impl VariationalForward {
    /// Hands the per-GP factors back for reuse by later steps (see [`POOL`]).
    pub fn recycle(self) {
        for gp in self.per_gp {
            give_mat(gp.l_inv);
            give_mat(gp.v);
        }
    }
}

/// Gradients of F = ⟨G_m, m⟩ + ⟨G_s, s⟩ − Σ_p KL_p. The kernel blocks (`k_z`, `k_bz`,
/// `k_diag`) are empty when [`backward`] is asked not to compute them.
#[derive(Debug, Clone)]
pub struct VariationalGrads {
    pub mu: Mat<f64>,
    pub rho: Mat<f64>,
    pub k_z: Mat<f64>,
    pub k_bz: Mat<f64>,
    pub k_diag: Vec<f64>,
    /// On the subspace path, ∂/∂F [M×R] and ∂/∂G [R×B] of the [`Subspace`] factors (the
    /// μ terms still go through `k_z` and `k_bz`); empty otherwise.
    pub f: Mat<f64>,
    pub g: Mat<f64>,
}

impl VariationalGrads {
    /// ∂μ and ∂ρ only: the kernel blocks empty (A and the hyperparameters frozen).
    fn without_kernel(mu: Mat<f64>, rho: Mat<f64>) -> Self {
        VariationalGrads {
            mu,
            rho,
            k_z: Mat::new(),
            k_bz: Mat::new(),
            k_diag: Vec::new(),
            f: Mat::new(),
            g: Mat::new(),
        }
    }
}

/// Lower Cholesky factor L [M×M] (zeros above the diagonal) of K_Z + diag(σ), retried with
/// growing jitter on the diagonal when it fails; σ gets the jitter that was used. Sequential
/// (it runs inside a per-GP task).
pub fn factorise(k_z: MatRef<'_, f64>, sigma: &mut [f64]) -> Result<(Mat<f64>, f64)> {
    let m = k_z.nrows();
    let mean_diag = (0..m).map(|i| k_z[(i, i)] + sigma[i]).sum::<f64>() / m.max(1) as f64;
    let mut buf = MemBuffer::new(cholesky_in_place_scratch::<f64>(
        m,
        Par::Seq,
        Default::default(),
    ));
    let mut jitter = 0.0;
    for attempt in 0..8 {
        let mut c = take_mat(m, m);
        c.copy_from(k_z);
        for i in 0..m {
            c[(i, i)] += sigma[i] + jitter;
        }
        let ok = cholesky_in_place(
            c.as_mut(),
            Default::default(),
            Par::Seq,
            MemStack::new(&mut buf),
            Default::default(),
        )
        .is_ok();
        if ok {
            for j in 1..m {
                for i in 0..j {
                    c[(i, j)] = 0.0;
                }
            }
            for s in sigma.iter_mut() {
                *s += jitter;
            }
            return Ok((c, jitter));
        }
        give_mat(c);
        jitter = mean_diag.max(1e-300) * 1e-10 * 10f64.powi(attempt);
    }
    bail!("Cholesky of K_Z + Σ failed even with jitter {jitter:.3e} on the diagonal")
}

/// σ_p [M] for column p of ρ.
pub(crate) fn sigma_column(rho: MatRef<'_, f64>, p: usize) -> Vec<f64> {
    (0..rho.nrows()).map(|i| sigma_of(rho[(i, p)])).collect()
}

/// V = L⁻¹ K_bZᵀ [M×B] (M²B flops), from K_bZᵀ [M×B]: by a triangular solve with L, or,
/// when L⁻¹ is at hand, by a triangular × dense product, which faer runs about 1.3× faster
/// than the solve at M = B = 500.
pub(crate) fn solve_v(
    l: MatRef<'_, f64>,
    l_inv: Option<MatRef<'_, f64>>,
    k_bz_t: MatRef<'_, f64>,
) -> Mat<f64> {
    let mut v = take_mat(k_bz_t.nrows(), k_bz_t.ncols());
    match l_inv {
        Some(l_inv) => tri_matmul(
            v.as_mut(),
            BlockStructure::Rectangular,
            Accum::Replace,
            l_inv,
            BlockStructure::TriangularLower,
            k_bz_t,
            BlockStructure::Rectangular,
            1.0,
            Par::Seq,
        ),
        None => {
            v.copy_from(k_bz_t);
            solve_lower_triangular_in_place(l, v.as_mut(), Par::Seq);
        }
    }
    v
}

/// s_i = k_ii − ‖V e_i‖² for every column i of V [M×B].
fn variances(v: MatRef<'_, f64>, k_diag: &[f64]) -> Vec<f64> {
    (0..v.ncols())
        .map(|i| {
            let col = v.col(i);
            k_diag[i] - (0..v.nrows()).map(|j| col[j] * col[j]).sum::<f64>()
        })
        .collect()
}

/// L⁻¹ [M×M] in the lower triangle (M³/3 flops); the entries above the diagonal are
/// unspecified and never read (every use names the triangular structure).
pub(crate) fn lower_inverse(l: MatRef<'_, f64>) -> Mat<f64> {
    let m = l.nrows();
    let mut inv = take_mat(m, m);
    invert_lower_triangular(inv.as_mut(), l, Par::Seq);
    inv
}

/// KL_p = ½ [μᵀK_Zμ − tr(C⁻¹K_Z) + log|C| − log|Σ|], with tr(C⁻¹K_Z) = M − tr(C⁻¹Σ) and
/// (C⁻¹)_mm = ‖L⁻¹ e_m‖², so only L and L⁻¹ are needed. `quad_mu` is μ_pᵀ K_Z μ_p.
fn kl_one(l: MatRef<'_, f64>, l_inv: MatRef<'_, f64>, sigma: &[f64], quad_mu: f64) -> f64 {
    let m = l.nrows();
    let tr_cinv_sigma: f64 = (0..m)
        .map(|c| {
            let col = l_inv.col(c);
            sigma[c] * (c..m).map(|j| col[j] * col[j]).sum::<f64>()
        })
        .sum();
    let logdet_c = 2.0 * (0..m).map(|i| l[(i, i)].ln()).sum::<f64>();
    let logdet_sigma: f64 = sigma.iter().map(|s| s.ln()).sum();
    0.5 * (quad_mu - (m as f64 - tr_cinv_sigma) + logdet_c - logdet_sigma)
}

/// μ_pᵀ K_Z μ_p for every p, from K_Z μ [M×P].
fn quad_mu(k_z: MatRef<'_, f64>, mu: MatRef<'_, f64>) -> Vec<f64> {
    let k_mu = k_z * mu;
    (0..mu.ncols())
        .map(|p| (0..mu.nrows()).map(|i| mu[(i, p)] * k_mu[(i, p)]).sum())
        .collect()
}

/// The GP indices of chunk `c` of P GPs.
fn chunk_range(c: usize, p_count: usize) -> std::ops::Range<usize> {
    c * GP_CHUNK..((c + 1) * GP_CHUNK).min(p_count)
}

fn chunk_count(p_count: usize) -> usize {
    p_count.div_ceil(GP_CHUNK)
}

/// What one GP's forward task returns.
pub(crate) struct GpForward {
    pub state: Option<PerGp>,
    pub var: Vec<f64>,
    pub kl: f64,
    pub jitter: f64,
}

impl GpForward {
    /// Keeps the factors L⁻¹ and V for the backward pass if `keep` (and L⁻¹ was formed);
    /// otherwise hands them back to the pool.
    pub(crate) fn new(
        keep: bool,
        l_inv: Option<Mat<f64>>,
        v: Mat<f64>,
        sigma: Vec<f64>,
        var: Vec<f64>,
        kl: f64,
        jitter: f64,
    ) -> Self {
        let state = match (keep, l_inv) {
            (true, Some(l_inv)) => Some(PerGp { l_inv, v, sigma }),
            (_, l_inv) => {
                give_mat(v);
                if let Some(x) = l_inv {
                    give_mat(x);
                }
                None
            }
        };
        GpForward {
            state,
            var,
            kl,
            jitter,
        }
    }
}

/// Forward for latent GP p: Cholesky, V, the variances and (if `with_kl`) KL_p. The
/// factors are kept only if `keep` (for the backward pass).
#[allow(clippy::too_many_arguments)]
fn forward_one(
    k_z: MatRef<'_, f64>,
    k_bz_t: MatRef<'_, f64>,
    k_diag: &[f64],
    rho: MatRef<'_, f64>,
    p: usize,
    quad_mu: Option<f64>,
    keep: bool,
) -> Result<GpForward> {
    let mut sigma = sigma_column(rho, p);
    let (l, jitter) = factorise(k_z, &mut sigma)?;
    // L⁻¹ is needed for the KL (and kept for the backward pass); without it, V comes from a
    // solve.
    let l_inv = quad_mu.map(|_| lower_inverse(l.as_ref()));
    let v = solve_v(l.as_ref(), l_inv.as_ref().map(|x| x.as_ref()), k_bz_t);
    let var = variances(v.as_ref(), k_diag);
    let kl = match (quad_mu, &l_inv) {
        (Some(q), Some(l_inv)) => kl_one(l.as_ref(), l_inv.as_ref(), &sigma, q),
        _ => 0.0,
    };
    give_mat(l);
    Ok(GpForward::new(keep, l_inv, v, sigma, var, kl, jitter))
}

/// Runs `forward_one` (or the subspace path's, given `sub`) over all GPs in parallel
/// chunks; results in GP order.
#[allow(clippy::too_many_arguments)]
fn forward_all(
    k_z: MatRef<'_, f64>,
    k_bz: MatRef<'_, f64>,
    k_diag: &[f64],
    rho: MatRef<'_, f64>,
    quad: Option<&[f64]>,
    keep: bool,
    sub: Option<&Subspace>,
) -> Result<Vec<GpForward>> {
    let p_count = rho.ncols();
    let k_bz_t = match sub {
        Some(_) => Mat::new(),
        None => k_bz.transpose().to_owned(),
    };
    let chunks: Vec<Result<Vec<GpForward>>> = (0..chunk_count(p_count))
        .into_par_iter()
        .map(|c| {
            chunk_range(c, p_count)
                .map(|p| match sub {
                    Some(sub) => subspace::forward_one(sub, rho, p, quad.map(|q| q[p]), keep),
                    None => forward_one(
                        k_z,
                        k_bz_t.as_ref(),
                        k_diag,
                        rho,
                        p,
                        quad.map(|q| q[p]),
                        keep,
                    ),
                })
                .collect()
        })
        .collect();
    let mut out = Vec::with_capacity(p_count);
    for c in chunks {
        out.extend(c?);
    }
    Ok(out)
}

/// Computes the marginals and the KL terms, keeping the per-GP factors for [`backward`].
/// Given `sub` (the linear kernel's subspace factors of the same K_Z and K_bZ), the per-GP
/// work runs in R×R matrices (`subspace.rs`); the results agree to rounding.
pub fn forward(
    k_z: MatRef<'_, f64>,
    k_bz: MatRef<'_, f64>,
    k_diag: &[f64],
    mu: MatRef<'_, f64>,
    rho: MatRef<'_, f64>,
    sub: Option<&Subspace>,
) -> Result<VariationalForward> {
    let (p_count, b) = (mu.ncols(), k_bz.nrows());
    let mean = k_bz * mu;
    let quad = quad_mu(k_z, mu);
    let gps = forward_all(k_z, k_bz, k_diag, rho, Some(&quad), true, sub)?;
    let mut var = Mat::<f64>::zeros(b, p_count);
    let mut kl = 0.0;
    let mut jitter = 0.0f64;
    let mut per_gp = Vec::with_capacity(p_count);
    for (p, g) in gps.into_iter().enumerate() {
        for (i, s) in g.var.iter().enumerate() {
            var[(i, p)] = *s;
        }
        kl += g.kl;
        jitter = jitter.max(g.jitter);
        per_gp.push(g.state.expect("kept"));
    }
    Ok(VariationalForward {
        mean,
        var,
        kl,
        jitter,
        per_gp,
        subspace: sub.is_some(),
    })
}

/// Marginal means and variances only ([B×P] each) and the jitter: no KL, nothing kept
/// (M³/3 + M²B flops per GP; MR² + R³/3 + R²B given `sub`). For bounds evaluated without
/// gradients.
pub fn marginals(
    k_z: MatRef<'_, f64>,
    k_bz: MatRef<'_, f64>,
    k_diag: &[f64],
    mu: MatRef<'_, f64>,
    rho: MatRef<'_, f64>,
    sub: Option<&Subspace>,
) -> Result<(Mat<f64>, Mat<f64>, f64)> {
    let (p_count, b) = (mu.ncols(), k_bz.nrows());
    let mean = k_bz * mu;
    let gps = forward_all(k_z, k_bz, k_diag, rho, None, false, sub)?;
    let mut var = Mat::<f64>::zeros(b, p_count);
    let mut jitter = 0.0f64;
    for (p, g) in gps.iter().enumerate() {
        for (i, s) in g.var.iter().enumerate() {
            var[(i, p)] = *s;
        }
        jitter = jitter.max(g.jitter);
    }
    Ok((mean, var, jitter))
}

/// Σ_p KL_p alone (needs only K_Z; 2M³/3 flops per GP, or the subspace factors of a
/// minibatch of no rows), in the same chunk order as [`forward`], so the two agree bit for
/// bit when they take the same path.
pub fn kl_total(
    k_z: MatRef<'_, f64>,
    mu: MatRef<'_, f64>,
    rho: MatRef<'_, f64>,
    sub: Option<&Subspace>,
) -> Result<f64> {
    let m = k_z.nrows();
    let empty_t = Mat::<f64>::zeros(m, 0);
    let quad = quad_mu(k_z, mu);
    let gps = forward_all(k_z, empty_t.transpose(), &[], rho, Some(&quad), false, sub)?;
    Ok(gps.iter().map(|g| g.kl).sum())
}

/// From L⁻¹ [n×n] (lower triangle) and V = L⁻¹ X [n×B]: `inv` ← (L Lᵀ)⁻¹ = L⁻ᵀ L⁻¹ (its
/// lower triangle by a triangular product, half the flops of the full one, then mirrored)
/// and `w` ← L⁻ᵀ V = (L Lᵀ)⁻¹ X. Shared by both paths: C_p (n = M) and J_p (n = R).
pub(crate) fn inverse_and_solve(
    l_inv: MatRef<'_, f64>,
    v: MatRef<'_, f64>,
    mut inv: faer::MatMut<'_, f64>,
    w: faer::MatMut<'_, f64>,
) {
    tri_matmul(
        inv.rb_mut(),
        BlockStructure::TriangularLower,
        Accum::Replace,
        l_inv.transpose(),
        BlockStructure::TriangularUpper,
        l_inv,
        BlockStructure::TriangularLower,
        1.0,
        Par::Seq,
    );
    for j in 1..inv.ncols() {
        for i in 0..j {
            inv[(i, j)] = inv[(j, i)];
        }
    }
    tri_matmul(
        w,
        BlockStructure::Rectangular,
        Accum::Replace,
        l_inv.transpose(),
        BlockStructure::TriangularUpper,
        v,
        BlockStructure::Rectangular,
        1.0,
        Par::Seq,
    );
}

/// The lower triangle of Y (Y diag(d))ᵀ = Y diag(d) Yᵀ into `out`, given `yd` = Y diag(d)
/// (half the flops of the full product; the upper triangle is left as it was).
pub(crate) fn lower_product(out: faer::MatMut<'_, f64>, y: MatRef<'_, f64>, yd: MatRef<'_, f64>) {
    tri_matmul(
        out,
        BlockStructure::TriangularLower,
        Accum::Replace,
        y,
        BlockStructure::Rectangular,
        yd.transpose(),
        BlockStructure::Rectangular,
        1.0,
        Par::Seq,
    );
}

/// One chunk's contribution to the backward pass.
struct ChunkGrads {
    /// Lower triangle of Σ_{p∈chunk} [−½ C_p⁻¹ + Y_p diag(d_p) Y_pᵀ] [M×M] (empty without
    /// kernel gradients).
    k_z: Mat<f64>,
    /// −2 Σ_{p∈chunk} W_p D_p [M×B], the transpose of the chunk's part of ∂F/∂K_bZ
    /// (empty without kernel gradients).
    k_bz_t: Mat<f64>,
    /// ∂F/∂ρ for the chunk's GPs, each [M].
    rho: Vec<Vec<f64>>,
}

/// Backward for one chunk of GPs (sequential inside). For GP p with D = diag(G_s[:, p]):
/// - C⁻¹ = L⁻ᵀ L⁻¹ (triangular product), W = C⁻¹ K_bZᵀ = L⁻ᵀ V (triangular product);
/// - ∂F/∂σ_m = −(C⁻¹)_mm + ½ Σ_j (C⁻¹)_mj² σ_j + Σ_i D_ii W_mi² + 1/(2σ_m);
/// - with kernel gradients: −½ C⁻¹ K_Z C⁻¹ + W D Wᵀ = −½ C⁻¹ + Y diag(d) Yᵀ with
///   Y = [C⁻¹ W] [M×(M+B)] and d = [½σ; D], using C⁻¹K_Z C⁻¹ = C⁻¹ − C⁻¹ΣC⁻¹. The chunk's
///   Y's are concatenated into one product whose lower triangle alone is formed.
fn backward_chunk(
    gps: &[PerGp],
    first: usize,
    rho: MatRef<'_, f64>,
    g_var: MatRef<'_, f64>,
    kernel_grads: bool,
) -> ChunkGrads {
    let (m, b, n) = (rho.nrows(), g_var.nrows(), gps.len());
    let width = m + b;
    // Y_cat = [Y_1 … Y_n] [M × n(M+B)]; without kernel gradients one Y at a time suffices.
    let mut y_cat = take_mat(m, if kernel_grads { n } else { 1 } * width);
    let mut rho_out = Vec::with_capacity(n);
    for (q, gp) in gps.iter().enumerate() {
        let base = if kernel_grads { q * width } else { 0 };
        let mut y = y_cat.as_mut().submatrix_mut(0, base, m, width);
        let (mut c_inv, mut w) = y.rb_mut().split_at_col_mut(m);
        // C⁻¹ = L⁻ᵀ L⁻¹ and W = C⁻¹ K_bZᵀ = L⁻ᵀ V.
        inverse_and_solve(gp.l_inv.as_ref(), gp.v.as_ref(), c_inv.rb_mut(), w.rb_mut());
        let d: Vec<f64> = g_var.col(first + q).iter().copied().collect();
        rho_out.push(rho_gradient(
            c_inv.rb(),
            w.rb(),
            &d,
            &gp.sigma,
            rho,
            first + q,
        ));
    }
    if !kernel_grads {
        give_mat(y_cat);
        return ChunkGrads {
            k_z: Mat::new(),
            k_bz_t: Mat::new(),
            rho: rho_out,
        };
    }
    // Y_cat diag(d_cat), d_p = [½σ_p; D_p]; −½ Σ C_p⁻¹; −2 Σ W_p D_p.
    let mut yd_cat = take_mat(m, n * width);
    yd_cat.copy_from(&y_cat);
    let mut half_cinv_sum = Mat::<f64>::zeros(m, m);
    let mut g_kbz_t = Mat::<f64>::zeros(m, b);
    for (q, gp) in gps.iter().enumerate() {
        let base = q * width;
        let d = g_var.col(first + q);
        for j in 0..width {
            let f = if j < m { 0.5 * gp.sigma[j] } else { d[j - m] };
            for x in yd_cat.col_mut(base + j).iter_mut() {
                *x *= f;
            }
        }
        half_cinv_sum += y_cat.as_ref().submatrix(0, base, m, m) * faer::Scale(0.5);
        g_kbz_t -= yd_cat.as_ref().submatrix(0, base + m, m, b) * faer::Scale(2.0);
    }
    let mut g_kz = Mat::<f64>::zeros(m, m);
    lower_product(g_kz.as_mut(), y_cat.as_ref(), yd_cat.as_ref());
    for j in 0..m {
        for i in j..m {
            g_kz[(i, j)] -= half_cinv_sum[(i, j)];
        }
    }
    give_mat(y_cat);
    give_mat(yd_cat);
    ChunkGrads {
        k_z: g_kz,
        k_bz_t: g_kbz_t,
        rho: rho_out,
    }
}

/// ∂F/∂ρ_p [M] (see [`backward_chunk`]): the diagonal of −½C⁻¹K_ZC⁻¹ − ½C⁻¹ + W D Wᵀ
/// plus 1/(2σ), times dσ/dρ.
fn rho_gradient(
    c_inv: MatRef<'_, f64>,
    w: MatRef<'_, f64>,
    d: &[f64],
    sigma: &[f64],
    rho: MatRef<'_, f64>,
    p: usize,
) -> Vec<f64> {
    let (m, b) = (c_inv.nrows(), w.ncols());
    // ½ (C⁻¹ΣC⁻¹)_mm = ½ Σ_j (C⁻¹)_jm² σ_j, column by column (C⁻¹ is symmetric).
    let mut out: Vec<f64> = (0..m)
        .map(|c| {
            let col = c_inv.col(c);
            let cs: f64 = (0..m).map(|j| col[j] * col[j] * sigma[j]).sum();
            -col[c] + 0.5 * cs + 0.5 / sigma[c]
        })
        .collect();
    for (i, &di) in d.iter().enumerate().take(b) {
        let col = w.col(i);
        for (j, o) in out.iter_mut().enumerate() {
            *o += di * col[j] * col[j];
        }
    }
    for (j, o) in out.iter_mut().enumerate() {
        *o *= dsigma_drho(rho[(j, p)]);
    }
    out
}

/// Gradients of F = ⟨g_mean, m⟩ + ⟨g_var, s⟩ − Σ_p KL_p. Without `kernel_grads` the
/// gradients with respect to K_Z, K_bZ and k_ii are left empty and their O(M³) and
/// O(M²B) products skipped. `sub` must be the subspace factors `fwd` was computed with
/// (None if it took the inducing-point path).
#[allow(clippy::too_many_arguments)]
pub fn backward(
    fwd: &VariationalForward,
    k_z: MatRef<'_, f64>,
    k_bz: MatRef<'_, f64>,
    mu: MatRef<'_, f64>,
    rho: MatRef<'_, f64>,
    g_mean: MatRef<'_, f64>,
    g_var: MatRef<'_, f64>,
    kernel_grads: bool,
    sub: Option<&Subspace>,
) -> VariationalGrads {
    assert_eq!(
        fwd.subspace,
        sub.is_some(),
        "backward must take the forward pass's path"
    );
    let (m, p_count) = (k_z.nrows(), mu.ncols());
    // ∂F/∂μ = K_bZᵀ G_m − K_Z μ.
    let mut g_mu = Mat::<f64>::zeros(m, p_count);
    matmul(
        g_mu.as_mut(),
        Accum::Replace,
        k_bz.transpose(),
        g_mean,
        1.0,
        Par::rayon(0),
    );
    matmul(g_mu.as_mut(), Accum::Add, k_z, mu, -1.0, Par::rayon(0));
    if let Some(sub) = sub {
        return backward_subspace(fwd, sub, mu, rho, g_mean, g_var, kernel_grads, g_mu);
    }
    let chunks: Vec<ChunkGrads> = (0..chunk_count(p_count))
        .into_par_iter()
        .map(|c| {
            let r = chunk_range(c, p_count);
            backward_chunk(&fwd.per_gp[r.clone()], r.start, rho, g_var, kernel_grads)
        })
        .collect();
    let g_rho = gather_rho(chunks.iter().map(|ch| &ch.rho), m, p_count);
    if !kernel_grads {
        return VariationalGrads::without_kernel(g_mu, g_rho);
    }
    // ∂F/∂K_bZ = G_m μᵀ − 2 Σ_p D_p W_pᵀ; ∂F/∂K_Z = −½ μμᵀ + Σ_p (…), summed in chunk order.
    let (mut g_kbz, mut g_kz) = mu_kernel_grads(mu, g_mean);
    for ch in &chunks {
        g_kbz += ch.k_bz_t.transpose();
        for j in 0..m {
            for i in j..m {
                g_kz[(i, j)] += ch.k_z[(i, j)];
            }
        }
    }
    // The chunks formed lower triangles: mirror them.
    for j in 0..m {
        for i in j + 1..m {
            g_kz[(j, i)] = g_kz[(i, j)];
        }
    }
    VariationalGrads {
        mu: g_mu,
        rho: g_rho,
        k_z: g_kz,
        k_bz: g_kbz,
        k_diag: k_diag_grad(g_var),
        f: Mat::new(),
        g: Mat::new(),
    }
}

/// ∂F/∂ρ [M×P] from the chunks' per-GP columns, in chunk order.
fn gather_rho<'a>(
    chunks: impl Iterator<Item = &'a Vec<Vec<f64>>>,
    m: usize,
    p_count: usize,
) -> Mat<f64> {
    let mut g_rho = Mat::<f64>::zeros(m, p_count);
    for (c, cols) in chunks.enumerate() {
        for (q, col) in cols.iter().enumerate() {
            for (j, v) in col.iter().enumerate() {
                g_rho[(j, c * GP_CHUNK + q)] = *v;
            }
        }
    }
    g_rho
}

/// The μ terms' share of the kernel gradients: ∂F/∂K_bZ ∋ G_m μᵀ [B×M] (through m = K_bZ μ)
/// and ∂F/∂K_Z ∋ −½ μμᵀ [M×M] (through −½ μᵀ K_Z μ in the KL).
fn mu_kernel_grads(mu: MatRef<'_, f64>, g_mean: MatRef<'_, f64>) -> (Mat<f64>, Mat<f64>) {
    let (m, b) = (mu.nrows(), g_mean.nrows());
    let mut g_kbz = Mat::<f64>::zeros(b, m);
    matmul(
        g_kbz.as_mut(),
        Accum::Replace,
        g_mean,
        mu.transpose(),
        1.0,
        Par::rayon(0),
    );
    let mut g_kz = Mat::<f64>::zeros(m, m);
    matmul(
        g_kz.as_mut(),
        Accum::Replace,
        mu,
        mu.transpose(),
        -0.5,
        Par::rayon(0),
    );
    (g_kbz, g_kz)
}

/// ∂F/∂k_ii = Σ_p G_s,ip [B] (s_ip = k_ii − …).
fn k_diag_grad(g_var: MatRef<'_, f64>) -> Vec<f64> {
    (0..g_var.nrows())
        .map(|i| (0..g_var.ncols()).map(|p| g_var[(i, p)]).sum())
        .collect()
}

/// [`backward`] on the subspace path (`subspace.rs`): per-GP work in R×R matrices, the
/// kernel gradients split into the μ terms (through K_Z and K_bZ) and ∂F, ∂G.
#[allow(clippy::too_many_arguments)]
fn backward_subspace(
    fwd: &VariationalForward,
    sub: &Subspace,
    mu: MatRef<'_, f64>,
    rho: MatRef<'_, f64>,
    g_mean: MatRef<'_, f64>,
    g_var: MatRef<'_, f64>,
    kernel_grads: bool,
    g_mu: Mat<f64>,
) -> VariationalGrads {
    let (m, p_count) = (mu.nrows(), mu.ncols());
    let chunks: Vec<subspace::ChunkGrads> = (0..chunk_count(p_count))
        .into_par_iter()
        .map(|c| {
            let r = chunk_range(c, p_count);
            subspace::backward_chunk(
                sub,
                &fwd.per_gp[r.clone()],
                r.start,
                rho,
                g_var,
                kernel_grads,
            )
        })
        .collect();
    let g_rho = gather_rho(chunks.iter().map(|ch| &ch.rho), m, p_count);
    if !kernel_grads {
        return VariationalGrads::without_kernel(g_mu, g_rho);
    }
    let (g_kbz, g_kz) = mu_kernel_grads(mu, g_mean);
    let k_diag = k_diag_grad(g_var);
    let mut g_f = Mat::<f64>::zeros(sub.f.nrows(), sub.f.ncols());
    let mut g_g = Mat::<f64>::zeros(sub.g.nrows(), sub.g.ncols());
    for ch in &chunks {
        g_f += &ch.f;
        g_g += &ch.g;
    }
    // c_i = k_ii − ‖g_i‖²: ∂G ∋ −2 g_i Σ_p G_s,ip.
    for (i, &gs) in k_diag.iter().enumerate() {
        let (dst, src) = (g_g.col_mut(i), sub.g.col(i));
        for (o, x) in dst.iter_mut().zip(src.iter()) {
            *o -= 2.0 * gs * x;
        }
    }
    VariationalGrads {
        mu: g_mu,
        rho: g_rho,
        k_z: g_kz,
        k_bz: g_kbz,
        k_diag,
        f: g_f,
        g: g_g,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kernel::{BasisInputs, KernelKind, KernelParams};
    use faer::linalg::solvers::DenseSolveCore;
    use faer::Side;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn rand_mat(rng: &mut ChaCha8Rng, r: usize, c: usize, s: f64) -> Mat<f64> {
        Mat::from_fn(r, c, |_, _| (rng.random::<f64>() - 0.5) * s)
    }

    #[test]
    fn kl_equals_the_textbook_gaussian_kl() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let (m, p) = (6, 3);
        let w = rand_mat(&mut rng, m, m, 1.0);
        let k_z = &w * w.transpose() + Mat::<f64>::identity(m, m) * faer::Scale(0.1);
        let mu = rand_mat(&mut rng, m, p, 2.0);
        let rho = rand_mat(&mut rng, m, p, 3.0);
        let fwd = forward(
            k_z.as_ref(),
            Mat::<f64>::zeros(0, m).as_ref(),
            &[],
            mu.as_ref(),
            rho.as_ref(),
            None,
        )
        .unwrap();
        let k_inv = k_z.llt(Side::Lower).unwrap().inverse();
        let logdet = |a: &Mat<f64>| {
            2.0 * (0..m)
                .map(|i| a.llt(Side::Lower).unwrap().L()[(i, i)].ln())
                .sum::<f64>()
        };
        let mut expected = 0.0;
        for q in 0..p {
            // S = (K⁻¹ + Σ⁻¹)⁻¹, mean K μ; KL(N(mean, S) ‖ N(0, K)).
            let sig_inv = Mat::from_fn(m, m, |i, j| {
                if i == j {
                    1.0 / sigma_of(rho[(i, q)])
                } else {
                    0.0
                }
            });
            let s = (&k_inv + &sig_inv).llt(Side::Lower).unwrap().inverse();
            let mean = &k_z * mu.col(q);
            let quad: f64 = (0..m)
                .map(|i| {
                    (0..m)
                        .map(|j| mean[i] * k_inv[(i, j)] * mean[j])
                        .sum::<f64>()
                })
                .sum();
            let tr: f64 = (0..m)
                .map(|i| (0..m).map(|j| k_inv[(i, j)] * s[(j, i)]).sum::<f64>())
                .sum();
            expected += 0.5 * (tr + quad - m as f64 + logdet(&k_z) - logdet(&s));
        }
        assert!(
            (fwd.kl - expected).abs() < 1e-9 * expected.abs().max(1.0),
            "{} vs {expected}",
            fwd.kl
        );
    }

    /// F(A, μ, ρ, log σ_f², log ℓ) = ⟨R_m, m⟩ + ⟨R_s, s⟩ − KL through a real kernel, so
    /// K_Z stays symmetric under every perturbation.
    struct Setup {
        kxx: Mat<f64>,
        norms: Vec<f64>,
        kt: Mat<f64>,
        r_m: Mat<f64>,
        r_s: Mat<f64>,
    }

    fn objective(
        s: &Setup,
        kind: KernelKind,
        kp: &KernelParams,
        a: &Mat<f64>,
        mu: &Mat<f64>,
        rho: &Mat<f64>,
    ) -> f64 {
        let x = BasisInputs {
            kxx_b: s.kxx.as_ref(),
            sq_norms: &s.norms,
            k_tilde: s.kt.as_ref(),
        };
        let kf = kind.forward(kp, a.as_ref(), &x);
        let f = forward(
            kf.k_z.as_ref(),
            kf.k_bz.as_ref(),
            &kf.k_diag,
            mu.as_ref(),
            rho.as_ref(),
            None,
        )
        .unwrap();
        let dot = |x: &Mat<f64>, y: &Mat<f64>| {
            (0..x.nrows())
                .map(|i| (0..x.ncols()).map(|j| x[(i, j)] * y[(i, j)]).sum::<f64>())
                .sum::<f64>()
        };
        dot(&s.r_m, &f.mean) + dot(&s.r_s, &f.var) - f.kl
    }

    #[test]
    fn gradients_match_central_differences_through_both_kernels() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        // R < M: K_Z is singular for the linear kernel, as in real runs.
        let (m, r, b, p) = (6, 4, 5, 2);
        let kxx = rand_mat(&mut rng, b, r, 1.0);
        let norms: Vec<f64> = (0..b)
            .map(|i| (0..r).map(|k| kxx[(i, k)].powi(2)).sum::<f64>() + 0.2)
            .collect();
        let kt = Mat::<f64>::identity(r, r);
        let s = Setup {
            r_m: rand_mat(&mut rng, b, p, 2.0),
            r_s: rand_mat(&mut rng, b, p, 2.0),
            kxx,
            norms,
            kt,
        };
        let a = rand_mat(&mut rng, m, r, 1.0);
        let mu = rand_mat(&mut rng, m, p, 1.0);
        let rho = rand_mat(&mut rng, m, p, 2.0);
        for kind in [KernelKind::Linear, KernelKind::SquaredExponential] {
            let kp = KernelParams {
                log_sf2: 0.2,
                log_ell: 0.1,
            };
            let x = BasisInputs {
                kxx_b: s.kxx.as_ref(),
                sq_norms: &s.norms,
                k_tilde: s.kt.as_ref(),
            };
            let kf = kind.forward(&kp, a.as_ref(), &x);
            let f = forward(
                kf.k_z.as_ref(),
                kf.k_bz.as_ref(),
                &kf.k_diag,
                mu.as_ref(),
                rho.as_ref(),
                None,
            )
            .unwrap();
            assert_eq!(f.jitter, 0.0);
            let g = backward(
                &f,
                kf.k_z.as_ref(),
                kf.k_bz.as_ref(),
                mu.as_ref(),
                rho.as_ref(),
                s.r_m.as_ref(),
                s.r_s.as_ref(),
                true,
                None,
            );
            let kg = kind.backward(&kp, &x, &kf, g.k_z.as_ref(), g.k_bz.as_ref(), &g.k_diag);
            let h = 1e-6;
            let check = |name: &str, analytic: f64, plus: f64, minus: f64| {
                let fd = (plus - minus) / (2.0 * h);
                let rel = (analytic - fd).abs() / analytic.abs().max(fd.abs()).max(1e-6);
                assert!(
                    rel < 1e-6,
                    "{kind:?} {name}: analytic {analytic} vs fd {fd}"
                );
            };
            for i in 0..m {
                for j in 0..p {
                    let (mut up, mut dn) = (mu.clone(), mu.clone());
                    up[(i, j)] += h;
                    dn[(i, j)] -= h;
                    check(
                        "μ",
                        g.mu[(i, j)],
                        objective(&s, kind, &kp, &a, &up, &rho),
                        objective(&s, kind, &kp, &a, &dn, &rho),
                    );
                    let (mut up, mut dn) = (rho.clone(), rho.clone());
                    up[(i, j)] += h;
                    dn[(i, j)] -= h;
                    check(
                        "ρ",
                        g.rho[(i, j)],
                        objective(&s, kind, &kp, &a, &mu, &up),
                        objective(&s, kind, &kp, &a, &mu, &dn),
                    );
                }
                for j in 0..r {
                    let (mut up, mut dn) = (a.clone(), a.clone());
                    up[(i, j)] += h;
                    dn[(i, j)] -= h;
                    check(
                        "A",
                        kg.a[(i, j)],
                        objective(&s, kind, &kp, &up, &mu, &rho),
                        objective(&s, kind, &kp, &dn, &mu, &rho),
                    );
                }
            }
            let shift = |d_sf: f64, d_l: f64| KernelParams {
                log_sf2: kp.log_sf2 + d_sf,
                log_ell: kp.log_ell + d_l,
            };
            check(
                "log σ_f²",
                kg.log_sf2,
                objective(&s, kind, &shift(h, 0.0), &a, &mu, &rho),
                objective(&s, kind, &shift(-h, 0.0), &a, &mu, &rho),
            );
            if kind == KernelKind::SquaredExponential {
                check(
                    "log ℓ",
                    kg.log_ell,
                    objective(&s, kind, &shift(0.0, h), &a, &mu, &rho),
                    objective(&s, kind, &shift(0.0, -h), &a, &mu, &rho),
                );
            }
        }
    }

    #[test]
    fn singular_c_is_rescued_by_jitter() {
        // K_Z of rank 1 and σ at its floor: C is numerically singular in f64 for large K_Z.
        let v = Mat::from_fn(4, 1, |i, _| 1e9 * (i as f64 + 1.0));
        let k_z = &v * v.transpose();
        let rho = Mat::from_fn(4, 1, |_, _| -60.0);
        let f = forward(
            k_z.as_ref(),
            Mat::<f64>::zeros(0, 4).as_ref(),
            &[],
            Mat::<f64>::zeros(4, 1).as_ref(),
            rho.as_ref(),
            None,
        )
        .unwrap();
        assert!(f.jitter > 0.0);
        assert!(f.kl.is_finite());
    }
}
