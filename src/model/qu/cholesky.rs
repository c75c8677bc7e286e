//! The full-Cholesky q(u) forms over all latent GPs (`docs/model.md`, "Full-Cholesky q(u)"):
//! the journal version of Panos, Dellaportas & Titsias, *Fully Scalable Gaussian Processes
//! using Subspace Inducing Inputs*, and SVGP (Hensman, Matthews & Ghahramani, *Scalable
//! Variational Gaussian Process Classification*, §4).
//!
//! - unwhitened ([`QForm::Cholesky`](crate::model::params::QForm)): q(u_p) = N(μ_p, L_p L_pᵀ);
//! - whitened ([`QForm::Whitened`](crate::model::params::QForm)): u_p = L_Z v_p with
//!   K_Z = L_Z L_Zᵀ, q(v_p) = N(m_p, L_p L_pᵀ), m_p held in μ.
//!
//! Both run as the whitened form: the unwhitened one maps its parameters to
//! m_p = L_Z⁻¹ μ_p and L_v,p = L_Z⁻¹ L_p (lower triangular) and chains the gradients back.
//! With A = L_Z⁻¹ K_Zb [M×B], shared by all GPs and computed once per step, and
//! T_p = L_v,pᵀ A [M×B]:
//! mean = Aᵀ m [B×P], s_ip = k_ii − ‖a_i‖² + ‖T_p e_i‖²,
//! KL_p = ½ [‖L_v,p‖²_F + ‖m_p‖² − M − 2 Σ_j log|L_v,p,jj|].
//!
//! The per-GP work is triangular × dense products of GEMM shape (3M²B flops per GP, plus
//! 4M³/3 unwhitened); the GPs run in the fixed chunks of `qu/sites/mod.rs` ([`GP_CHUNK`]),
//! sequential inside, the chunks' sums reduced in chunk order, so the results do not depend
//! on the number of threads.

use anyhow::Result;
use faer::linalg::matmul::matmul;
use faer::linalg::matmul::triangular::{matmul as tri_matmul, BlockStructure};
use faer::reborrow::{Reborrow, ReborrowMut};
use faer::{Accum, Mat, MatMut, MatRef, Par};
use rayon::prelude::*;

use crate::linalg::{mirror_lower, zero_upper};
use crate::model::params::{packed_index, packed_len, CholFactors};
use crate::model::qu::gp_factor::{factorise, lower_inverse};
use crate::model::qu::sites::{chunk_count, chunk_range, VariationalGrads, GP_CHUNK};
use crate::model::scratch::Scratch;

/// Columns per task of the shared triangular products (fixed, so that the bits do not
/// depend on the thread count; wide enough for faer's GEMM kernels).
const COL_BLOCK: usize = 128;

/// The per-step quantities all GPs share.
#[derive(Debug)]
struct Shared {
    /// L_Z [M×M], lower Cholesky factor of K_Z + jitter·I (zeros above the diagonal).
    l_z: Mat<f64>,
    /// L_Z⁻¹ [M×M] in the lower triangle (zeros above).
    l_z_inv: Mat<f64>,
    /// A = L_Z⁻¹ K_Zb [M×B].
    a: Mat<f64>,
    /// The diagonal jitter added to K_Z (0 when none).
    jitter: f64,
    /// d jitter / d tr(K_Z): the retry's jitter is a fixed multiple of tr(K_Z)/M.
    jitter_rate: f64,
}

impl Shared {
    /// L_Z (jitter retry as for C_p), L_Z⁻¹ and A = L_Z⁻¹ K_Zb: M³/3 + M³/3 + M²B flops.
    fn new(k_z: MatRef<'_, f64>, k_bz: MatRef<'_, f64>, scratch: &Scratch) -> Result<Self> {
        let m = k_z.nrows();
        let (l_z, jitter) = factor_k_z(k_z, scratch)?;
        let mut l_z_inv = lower_inverse(l_z.as_ref(), scratch);
        zero_upper(l_z_inv.as_mut());
        let mut a = scratch.take_mat(m, k_bz.nrows());
        lower_times(a.as_mut(), l_z_inv.as_ref(), false, k_bz.transpose());
        let trace: f64 = (0..m).map(|i| k_z[(i, i)]).sum();
        let jitter_rate = if jitter > 0.0 && trace > 1e-300 * m as f64 {
            jitter / trace
        } else {
            0.0
        };
        Ok(Shared {
            l_z,
            l_z_inv,
            a,
            jitter,
            jitter_rate,
        })
    }

    fn recycle(self, scratch: &Scratch) {
        scratch.give_mat(self.l_z);
        scratch.give_mat(self.l_z_inv);
        scratch.give_mat(self.a);
    }
}

/// Smallest squared pivot of L_Z, relative to the mean of diag K_Z, accepted without jitter.
const MIN_PIVOT: f64 = 1e-6;

/// L_Z, the lower Cholesky factor of K_Z + εI (zeros above the diagonal), and ε. ε = 0 when
/// K_Z factorises with every squared pivot L_jj² ≥ 10⁻⁶ tr(K_Z)/M. Otherwise (a singular
/// K_Z, e.g. the linear kernel with R < M, may still factorise, with pivots at rounding
/// level and an L_Z⁻¹ of order 10⁸) ε = 10⁻⁶ tr(K_Z)/M, plus the retry's jitter if that
/// fails too. Either way ε is a fixed multiple of tr K_Z, which the gradient uses.
fn factor_k_z(k_z: MatRef<'_, f64>, scratch: &Scratch) -> Result<(Mat<f64>, f64)> {
    let m = k_z.nrows();
    let (l_z, jitter) = factorise(k_z, &mut vec![0.0; m], scratch).map_err(k_z_failed)?;
    let floor = MIN_PIVOT * (0..m).map(|i| k_z[(i, i)]).sum::<f64>() / m.max(1) as f64;
    if (0..m).all(|j| l_z[(j, j)] * l_z[(j, j)] >= floor) {
        return Ok((l_z, jitter));
    }
    scratch.give_mat(l_z);
    let (l_z, retry) = factorise(k_z, &mut vec![floor; m], scratch).map_err(k_z_failed)?;
    Ok((l_z, floor + retry))
}

/// The error of a K_Z that did not factorise: the shared retry loop speaks of K_Z + Σ (the
/// site form's matrix), but the full-Cholesky forms factorise K_Z alone.
fn k_z_failed(_: anyhow::Error) -> anyhow::Error {
    anyhow::anyhow!(
        "Cholesky of K_Z failed even with jitter on its diagonal (the kernel \
         hyperparameters or inducing inputs are not finite, or K_Z is far from positive \
         definite)"
    )
}

/// L_Z [M×M] of K_Z as the full-Cholesky forms factorise it (with its jitter, see
/// [`factor_k_z`]): the unwhitened form's initial L_p, for which q(u) is the prior.
pub fn prior_factor(k_z: MatRef<'_, f64>) -> Result<Mat<f64>> {
    Ok(factor_k_z(k_z, &Scratch::new())?.0)
}

/// dst = op(L) · rhs [M×n], op(L) = L (lower triangular) or Lᵀ (`transpose`), in fixed
/// blocks of [`COL_BLOCK`] columns run in parallel, each sequentially.
fn lower_times(dst: MatMut<'_, f64>, l: MatRef<'_, f64>, transpose: bool, rhs: MatRef<'_, f64>) {
    let (op, structure) = if transpose {
        (l.transpose(), BlockStructure::TriangularUpper)
    } else {
        (l, BlockStructure::TriangularLower)
    };
    dst.par_col_chunks_mut(COL_BLOCK)
        .zip(rhs.par_col_chunks(COL_BLOCK))
        .for_each(|(d, r)| {
            tri_matmul(
                d,
                BlockStructure::Rectangular,
                Accum::Replace,
                op,
                structure,
                r,
                BlockStructure::Rectangular,
                1.0,
                Par::Seq,
            )
        });
}

/// L [M×M] (zeros above the diagonal) from column `p` of the packed factors.
fn unpack(packed: MatRef<'_, f64>, p: usize, m: usize, scratch: &Scratch) -> Mat<f64> {
    let mut l = scratch.take_mat(m, m);
    let col = packed.col(p);
    for j in 0..m {
        for i in 0..j {
            l[(i, j)] = 0.0;
        }
        let base = packed_index(m, j, j);
        for i in j..m {
            l[(i, j)] = col[base + i - j];
        }
    }
    l
}

/// The lower triangle of `x` [M×M], packed as in [`CholFactors`].
pub(crate) fn pack(x: MatRef<'_, f64>) -> Vec<f64> {
    let m = x.nrows();
    let mut out = Vec::with_capacity(packed_len(m));
    for j in 0..m {
        out.extend((j..m).map(|i| x[(i, j)]));
    }
    out
}

/// Packs lower-triangular factors `l` [M×M] into [`CholFactors`] (for initialisation and
/// tests).
pub fn pack_factors(l: &[Mat<f64>], whitened: bool) -> CholFactors {
    let m = l.first().map_or(0, |x| x.nrows());
    let mut packed = Mat::<f64>::zeros(packed_len(m), l.len());
    for (p, lp) in l.iter().enumerate() {
        for (k, v) in pack(lp.as_ref()).into_iter().enumerate() {
            packed[(k, p)] = v;
        }
    }
    CholFactors { whitened, packed }
}

/// The lower-triangular factor L_p [M×M] of GP `p` (tests and prediction).
pub fn factor_of(c: &CholFactors, p: usize, m: usize) -> Mat<f64> {
    unpack(c.packed.as_ref(), p, m, &Scratch::new())
}

/// One GP's factors kept for the backward pass.
#[derive(Debug)]
struct GpState {
    /// L_v,p [M×M] (zeros above the diagonal): L_p whitened, L_Z⁻¹ L_p unwhitened.
    l_v: Mat<f64>,
    /// T_p = L_v,pᵀ A [M×B].
    t: Mat<f64>,
}

/// What one GP's forward task returns.
struct GpOut {
    var: Vec<f64>,
    kl: f64,
    state: GpState,
}

/// L_v,p: L_p, or L_Z⁻¹ L_p (a lower × lower product, M³/3 flops) unwhitened.
fn whitened_factor(sh: &Shared, c: &CholFactors, p: usize, scratch: &Scratch) -> Mat<f64> {
    let m = sh.l_z.nrows();
    let l_p = unpack(c.packed.as_ref(), p, m, scratch);
    if c.whitened {
        return l_p;
    }
    let mut l_v = scratch.take_mat(m, m);
    tri_matmul(
        l_v.as_mut(),
        BlockStructure::TriangularLower,
        Accum::Replace,
        sh.l_z_inv.as_ref(),
        BlockStructure::TriangularLower,
        l_p.as_ref(),
        BlockStructure::TriangularLower,
        1.0,
        Par::Seq,
    );
    zero_upper(l_v.as_mut());
    scratch.give_mat(l_p);
    l_v
}

/// Forward for GP p: L_v, T = L_vᵀ A (M²B), s_ip = k_ii − ‖a_i‖² + ‖T e_i‖² and KL_p given
/// ‖m_p‖² (`m_sq`).
fn forward_one(
    sh: &Shared,
    c: &CholFactors,
    p: usize,
    base_var: &[f64],
    m_sq: f64,
    scratch: &Scratch,
) -> GpOut {
    let m = sh.l_z.nrows();
    let l_v = whitened_factor(sh, c, p, scratch);
    let mut t = scratch.take_mat(m, sh.a.ncols());
    tri_matmul(
        t.as_mut(),
        BlockStructure::Rectangular,
        Accum::Replace,
        l_v.transpose(),
        BlockStructure::TriangularUpper,
        sh.a.as_ref(),
        BlockStructure::Rectangular,
        1.0,
        Par::Seq,
    );
    let var = (0..t.ncols())
        .map(|i| base_var[i] + t.col(i).iter().map(|x| x * x).sum::<f64>())
        .collect();
    let mut frob = 0.0;
    let mut logdet = 0.0;
    for j in 0..m {
        frob += (j..m).map(|i| l_v[(i, j)] * l_v[(i, j)]).sum::<f64>();
        logdet += l_v[(j, j)].abs().ln();
    }
    let kl = 0.5 * (frob + m_sq - m as f64 - 2.0 * logdet);
    GpOut {
        var,
        kl,
        state: GpState { l_v, t },
    }
}

/// The forward pass of a full-Cholesky form: marginals, Σ_p KL_p and the factors the
/// backward pass needs.
#[derive(Debug)]
pub struct CholForward {
    /// m = Aᵀ m_v [B×P].
    pub mean: Mat<f64>,
    /// s [B×P].
    pub var: Mat<f64>,
    /// Σ_p KL_p.
    pub kl: f64,
    /// The diagonal jitter K_Z needed (0 when none).
    pub jitter: f64,
    shared: Shared,
    /// The whitened means m_v [M×P] (μ whitened, L_Z⁻¹ μ unwhitened).
    white_mean: Mat<f64>,
    per_gp: Vec<GpState>,
}

impl CholForward {
    /// Hands the work buffers back to `scratch`.
    pub fn recycle(self, scratch: &Scratch) {
        self.shared.recycle(scratch);
        for gp in self.per_gp {
            scratch.give_mat(gp.l_v);
            scratch.give_mat(gp.t);
        }
    }
}

/// m_v = μ (whitened) or L_Z⁻¹ μ [M×P].
fn white_mean(sh: &Shared, c: &CholFactors, mu: MatRef<'_, f64>) -> Mat<f64> {
    if c.whitened {
        return mu.to_owned();
    }
    let mut out = Mat::<f64>::zeros(mu.nrows(), mu.ncols());
    lower_times(out.as_mut(), sh.l_z_inv.as_ref(), false, mu);
    out
}

/// Marginals and KL at the rows of K_bZ [B×M] (k_ii [B]); the factors are kept for
/// [`backward`]. `k_bz` may have no rows (the KL alone).
pub fn forward(
    k_z: MatRef<'_, f64>,
    k_bz: MatRef<'_, f64>,
    k_diag: &[f64],
    mu: MatRef<'_, f64>,
    c: &CholFactors,
    scratch: &Scratch,
) -> Result<CholForward> {
    let sh = Shared::new(k_z, k_bz, scratch)?;
    let (m, p_count, b) = (k_z.nrows(), mu.ncols(), k_bz.nrows());
    let white = white_mean(&sh, c, mu);
    let mut mean = Mat::<f64>::zeros(b, p_count);
    matmul(
        mean.as_mut(),
        Accum::Replace,
        sh.a.transpose(),
        white.as_ref(),
        1.0,
        Par::rayon(0),
    );
    // k_ii − ‖a_i‖², shared by every GP.
    let base_var: Vec<f64> = (0..b)
        .map(|i| k_diag[i] - sh.a.col(i).iter().map(|x| x * x).sum::<f64>())
        .collect();
    let m_sq: Vec<f64> = (0..p_count)
        .map(|p| (0..m).map(|j| white[(j, p)] * white[(j, p)]).sum())
        .collect();
    let chunks: Vec<Vec<GpOut>> = (0..chunk_count(p_count))
        .into_par_iter()
        .map(|ch| {
            chunk_range(ch, p_count)
                .map(|p| forward_one(&sh, c, p, &base_var, m_sq[p], scratch))
                .collect()
        })
        .collect();
    let mut var = Mat::<f64>::zeros(b, p_count);
    let (mut kl, mut per_gp) = (0.0, Vec::with_capacity(p_count));
    for (p, g) in chunks.into_iter().flatten().enumerate() {
        for (i, s) in g.var.iter().enumerate() {
            var[(i, p)] = *s;
        }
        kl += g.kl;
        per_gp.push(g.state);
    }
    Ok(CholForward {
        mean,
        var,
        kl,
        jitter: sh.jitter,
        shared: sh,
        white_mean: white,
        per_gp,
    })
}

/// Σ_p KL_p alone (the forward pass at no rows).
pub fn kl_total(
    k_z: MatRef<'_, f64>,
    mu: MatRef<'_, f64>,
    c: &CholFactors,
    scratch: &Scratch,
) -> Result<f64> {
    let none = Mat::<f64>::zeros(0, k_z.nrows());
    let fwd = forward(k_z, none.as_ref(), &[], mu, c, scratch)?;
    let kl = fwd.kl;
    fwd.recycle(scratch);
    Ok(kl)
}

/// One chunk's share of the backward pass.
struct ChunkGrads {
    /// ∂F/∂L_p packed, per GP of the chunk.
    packed: Vec<Vec<f64>>,
    /// 2 Σ_{p∈chunk} L_v,p T_p D_p [M×B] (empty without kernel gradients).
    a_bar: Mat<f64>,
    /// −Σ_{p∈chunk} lower(Y_p L_v,pᵀ) [M×M], lower triangle (unwhitened with kernel
    /// gradients; else empty).
    l_z_bar: Mat<f64>,
}

/// L̄_v = lower(2 A U ᵀ) − L_v + diag(1/L_v,jj) into `l_bar`, with U = T D [M×B] in `u`.
fn whitened_factor_grad(
    sh: &Shared,
    gp: &GpState,
    d: &[f64],
    mut u: MatMut<'_, f64>,
    mut l_bar: MatMut<'_, f64>,
) {
    let m = gp.l_v.nrows();
    for (i, &di) in d.iter().enumerate() {
        let (dst, src) = (u.rb_mut().col_mut(i), gp.t.col(i));
        for (o, x) in dst.iter_mut().zip(src.iter()) {
            *o = x * di;
        }
    }
    tri_matmul(
        l_bar.rb_mut(),
        BlockStructure::TriangularLower,
        Accum::Replace,
        sh.a.as_ref(),
        BlockStructure::Rectangular,
        u.rb().transpose(),
        BlockStructure::Rectangular,
        2.0,
        Par::Seq,
    );
    for j in 0..m {
        for i in j..m {
            l_bar[(i, j)] -= gp.l_v[(i, j)];
        }
        l_bar[(j, j)] += 1.0 / gp.l_v[(j, j)];
        for i in 0..j {
            l_bar[(i, j)] = 0.0;
        }
    }
}

/// Backward for one chunk of GPs (sequential inside). Per GP, with D = diag(G_s[:, p]):
/// L̄_v (see [`whitened_factor_grad`]), Ā += 2 L_v T D; unwhitened, Y = L_Z⁻ᵀ L̄_v,
/// ∂L_p = lower(Y) and L̄_Z −= lower(Y L_vᵀ).
fn backward_chunk(
    sh: &Shared,
    gps: &[GpState],
    first: usize,
    g_var: MatRef<'_, f64>,
    unwhitened: bool,
    kernel_grads: bool,
    scratch: &Scratch,
) -> ChunkGrads {
    let (m, b) = (sh.a.nrows(), sh.a.ncols());
    let mut u = scratch.take_mat(m, b);
    let mut l_bar = scratch.take_mat(m, m);
    let mut y = if unwhitened {
        scratch.take_mat(m, m)
    } else {
        Mat::new()
    };
    let mut a_bar = if kernel_grads {
        scratch.take_mat(m, b)
    } else {
        Mat::new()
    };
    let mut l_z_bar = if kernel_grads && unwhitened {
        scratch.take_mat(m, m)
    } else {
        Mat::new()
    };
    let mut packed = Vec::with_capacity(gps.len());
    for (q, gp) in gps.iter().enumerate() {
        let accum = if q == 0 { Accum::Replace } else { Accum::Add };
        let d: Vec<f64> = g_var.col(first + q).iter().copied().collect();
        whitened_factor_grad(sh, gp, &d, u.as_mut(), l_bar.as_mut());
        if kernel_grads {
            tri_matmul(
                a_bar.as_mut(),
                BlockStructure::Rectangular,
                accum,
                gp.l_v.as_ref(),
                BlockStructure::TriangularLower,
                u.as_ref(),
                BlockStructure::Rectangular,
                2.0,
                Par::Seq,
            );
        }
        if !unwhitened {
            packed.push(pack(l_bar.as_ref()));
            continue;
        }
        tri_matmul(
            y.as_mut(),
            BlockStructure::Rectangular,
            Accum::Replace,
            sh.l_z_inv.transpose(),
            BlockStructure::TriangularUpper,
            l_bar.as_ref(),
            BlockStructure::TriangularLower,
            1.0,
            Par::Seq,
        );
        packed.push(pack(y.as_ref()));
        if kernel_grads {
            tri_matmul(
                l_z_bar.as_mut(),
                BlockStructure::TriangularLower,
                accum,
                y.as_ref(),
                BlockStructure::Rectangular,
                gp.l_v.transpose(),
                BlockStructure::TriangularUpper,
                -1.0,
                Par::Seq,
            );
        }
    }
    scratch.give_mat(u);
    scratch.give_mat(l_bar);
    scratch.give_mat(y);
    ChunkGrads {
        packed,
        a_bar,
        l_z_bar,
    }
}

/// Gradients of F = ⟨G_m, m⟩ + ⟨G_s, s⟩ − Σ_p KL_p with respect to μ, the packed L and
/// (with `kernel_grads`) K_Z, K_bZ and k_ii; ρ, ∂F and ∂G stay empty.
pub fn backward(
    fwd: &CholForward,
    mu: MatRef<'_, f64>,
    c: &CholFactors,
    g_mean: MatRef<'_, f64>,
    g_var: MatRef<'_, f64>,
    kernel_grads: bool,
    scratch: &Scratch,
) -> VariationalGrads {
    let sh = &fwd.shared;
    let (m, p_count) = (mu.nrows(), mu.ncols());
    let unwhitened = !c.whitened;
    // ∂F/∂m_v = A G_m − m_v.
    let mut g_white = Mat::<f64>::zeros(m, p_count);
    matmul(
        g_white.as_mut(),
        Accum::Replace,
        sh.a.as_ref(),
        g_mean,
        1.0,
        Par::rayon(0),
    );
    g_white -= &fwd.white_mean;
    let chunks: Vec<ChunkGrads> = (0..chunk_count(p_count))
        .into_par_iter()
        .map(|ch| {
            let r = chunk_range(ch, p_count);
            backward_chunk(
                sh,
                &fwd.per_gp[r.clone()],
                r.start,
                g_var,
                unwhitened,
                kernel_grads,
                scratch,
            )
        })
        .collect();
    let mut g_chol = Mat::<f64>::zeros(packed_len(m), p_count);
    for (ch, cg) in chunks.iter().enumerate() {
        for (q, col) in cg.packed.iter().enumerate() {
            for (k, v) in col.iter().enumerate() {
                g_chol[(k, ch * GP_CHUNK + q)] = *v;
            }
        }
    }
    // ∂F/∂μ = L_Z⁻ᵀ ∂F/∂m_v unwhitened.
    let g_mu = if unwhitened {
        let mut out = Mat::<f64>::zeros(m, p_count);
        lower_times(out.as_mut(), sh.l_z_inv.as_ref(), true, g_white.as_ref());
        out
    } else {
        g_white
    };
    let mut grads = VariationalGrads::without_kernel(g_mu, Mat::new());
    grads.chol = g_chol;
    if kernel_grads {
        kernel_part(fwd, &chunks, &mut grads, g_mean, g_var, unwhitened);
    }
    for ch in chunks {
        scratch.give_mat(ch.a_bar);
        scratch.give_mat(ch.l_z_bar);
    }
    grads
}

/// ∂F/∂K_Z, ∂F/∂K_bZ and ∂F/∂k_ii from the chunks' Ā and L̄_Z parts: Ā = m_v G_mᵀ
/// − 2 A diag(Σ_p G_s,:p) + Σ chunks; X = L_Z⁻ᵀ Ā gives ∂F/∂K_bZ = Xᵀ and
/// L̄_Z −= lower(X Aᵀ); unwhitened L̄_Z −= lower(∂μ m_vᵀ); then the Cholesky's reverse mode.
fn kernel_part(
    fwd: &CholForward,
    chunks: &[ChunkGrads],
    grads: &mut VariationalGrads,
    g_mean: MatRef<'_, f64>,
    g_var: MatRef<'_, f64>,
    unwhitened: bool,
) {
    let sh = &fwd.shared;
    let (m, b) = (sh.a.nrows(), sh.a.ncols());
    let k_diag: Vec<f64> = (0..b)
        .map(|i| (0..g_var.ncols()).map(|p| g_var[(i, p)]).sum())
        .collect();
    let mut a_bar = Mat::<f64>::zeros(m, b);
    matmul(
        a_bar.as_mut(),
        Accum::Replace,
        fwd.white_mean.as_ref(),
        g_mean.transpose(),
        1.0,
        Par::rayon(0),
    );
    for (i, &gs) in k_diag.iter().enumerate() {
        let (dst, src) = (a_bar.col_mut(i), sh.a.col(i));
        for (o, x) in dst.iter_mut().zip(src.iter()) {
            *o -= 2.0 * gs * x;
        }
    }
    let mut l_z_bar = Mat::<f64>::zeros(m, m);
    for ch in chunks {
        a_bar += &ch.a_bar;
        if unwhitened {
            for j in 0..m {
                for i in j..m {
                    l_z_bar[(i, j)] += ch.l_z_bar[(i, j)];
                }
            }
        }
    }
    let mut x = Mat::<f64>::zeros(m, b);
    lower_times(x.as_mut(), sh.l_z_inv.as_ref(), true, a_bar.as_ref());
    // X Aᵀ (+ ∂μ m_vᵀ unwhitened), of which L̄_Z takes minus the lower triangle.
    let mut outer = Mat::<f64>::zeros(m, m);
    matmul(
        outer.as_mut(),
        Accum::Replace,
        x.as_ref(),
        sh.a.transpose(),
        1.0,
        Par::rayon(0),
    );
    if unwhitened {
        matmul(
            outer.as_mut(),
            Accum::Add,
            grads.mu.as_ref(),
            fwd.white_mean.transpose(),
            1.0,
            Par::rayon(0),
        );
    }
    for j in 0..m {
        for i in j..m {
            l_z_bar[(i, j)] -= outer[(i, j)];
        }
    }
    grads.k_z = cholesky_backward(sh, l_z_bar);
    grads.k_bz = x.transpose().to_owned();
    grads.k_diag = k_diag;
}

/// The reverse mode of K + jitter·I = L Lᵀ: from L̄ (lower triangle) to the symmetric
/// ∂F/∂K = sym(L⁻ᵀ Φ(Lᵀ L̄) L⁻¹), Φ = the lower triangle with the diagonal halved, plus
/// the jitter's share tr(∂F/∂K)·(d jitter/d tr K)·I.
fn cholesky_backward(sh: &Shared, l_bar: Mat<f64>) -> Mat<f64> {
    let m = l_bar.nrows();
    let mut phi = Mat::<f64>::zeros(m, m);
    tri_matmul(
        phi.as_mut(),
        BlockStructure::TriangularLower,
        Accum::Replace,
        sh.l_z.transpose(),
        BlockStructure::TriangularUpper,
        l_bar.as_ref(),
        BlockStructure::TriangularLower,
        1.0,
        Par::Seq,
    );
    for j in 0..m {
        phi[(j, j)] *= 0.5;
        for i in 0..j {
            phi[(i, j)] = 0.0;
        }
    }
    // Q = L⁻ᵀ Φ, then K̄ = Q L⁻¹.
    let mut q = Mat::<f64>::zeros(m, m);
    tri_matmul(
        q.as_mut(),
        BlockStructure::Rectangular,
        Accum::Replace,
        sh.l_z_inv.transpose(),
        BlockStructure::TriangularUpper,
        phi.as_ref(),
        BlockStructure::TriangularLower,
        1.0,
        Par::Seq,
    );
    let mut k_bar = Mat::<f64>::zeros(m, m);
    matmul(
        k_bar.as_mut(),
        Accum::Replace,
        q.as_ref(),
        sh.l_z_inv.as_ref(),
        1.0,
        Par::rayon(0),
    );
    for j in 0..m {
        for i in j..m {
            k_bar[(i, j)] = 0.5 * (k_bar[(i, j)] + k_bar[(j, i)]);
        }
    }
    mirror_lower(k_bar.as_mut());
    if sh.jitter_rate > 0.0 {
        let tr: f64 = (0..m).map(|i| k_bar[(i, i)]).sum();
        for i in 0..m {
            k_bar[(i, i)] += tr * sh.jitter_rate;
        }
    }
    k_bar
}

/// A full-Cholesky q(u) factorised once for the marginals at many sets of rows
/// (prediction): L_Z⁻¹, the whitened means and the whitened factors L_v,p.
#[derive(Debug, Clone)]
pub struct CholFactorsOnce {
    l_z_inv: Mat<f64>,
    white_mean: Mat<f64>,
    l_v: Vec<Mat<f64>>,
    /// The diagonal jitter K_Z needed (0 when none).
    pub jitter: f64,
}

impl CholFactorsOnce {
    /// Factorises K_Z and forms every L_v,p (P·M³/3 flops unwhitened).
    pub fn new(
        k_z: MatRef<'_, f64>,
        mu: MatRef<'_, f64>,
        c: &CholFactors,
        scratch: &Scratch,
    ) -> Result<Self> {
        let none = Mat::<f64>::zeros(0, k_z.nrows());
        let sh = Shared::new(k_z, none.as_ref(), scratch)?;
        let white = white_mean(&sh, c, mu);
        let p_count = mu.ncols();
        let chunks: Vec<Vec<Mat<f64>>> = (0..chunk_count(p_count))
            .into_par_iter()
            .map(|ch| {
                chunk_range(ch, p_count)
                    .map(|p| whitened_factor(&sh, c, p, scratch))
                    .collect()
            })
            .collect();
        Ok(CholFactorsOnce {
            l_z_inv: sh.l_z_inv,
            white_mean: white,
            l_v: chunks.into_iter().flatten().collect(),
            jitter: sh.jitter,
        })
    }

    /// Marginal means and variances [B×P] (variances not clamped) at the rows of
    /// K_bZ [B×M] and k_ii [B]: A = L_Z⁻¹ K_Zb once, then T_p = L_v,pᵀ A per GP.
    pub fn marginals(
        &self,
        k_bz: MatRef<'_, f64>,
        k_diag: &[f64],
        scratch: &Scratch,
    ) -> (Mat<f64>, Mat<f64>) {
        let (m, b, p_count) = (self.l_z_inv.nrows(), k_bz.nrows(), self.l_v.len());
        let mut a = Mat::<f64>::zeros(m, b);
        lower_times(a.as_mut(), self.l_z_inv.as_ref(), false, k_bz.transpose());
        let mean = a.transpose() * &self.white_mean;
        let base: Vec<f64> = (0..b)
            .map(|i| k_diag[i] - a.col(i).iter().map(|x| x * x).sum::<f64>())
            .collect();
        let cols: Vec<Vec<f64>> = (0..chunk_count(p_count))
            .into_par_iter()
            .map(|ch| {
                chunk_range(ch, p_count)
                    .map(|p| {
                        let mut t = scratch.take_mat(m, b);
                        tri_matmul(
                            t.as_mut(),
                            BlockStructure::Rectangular,
                            Accum::Replace,
                            self.l_v[p].transpose(),
                            BlockStructure::TriangularUpper,
                            a.as_ref(),
                            BlockStructure::Rectangular,
                            1.0,
                            Par::Seq,
                        );
                        let v = (0..b)
                            .map(|i| base[i] + t.col(i).iter().map(|x| x * x).sum::<f64>())
                            .collect();
                        scratch.give_mat(t);
                        v
                    })
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
            .into_iter()
            .flatten()
            .collect();
        let var = Mat::from_fn(b, p_count, |i, p| cols[p][i]);
        (mean, var)
    }
}

/// The weights w [M×P] with marginal means m = K_bZ w: L_Z⁻ᵀ μ whitened, K_Z⁻¹ μ
/// unwhitened (ranking needs no variances).
pub fn mean_weights(
    k_z: MatRef<'_, f64>,
    mu: MatRef<'_, f64>,
    c: &CholFactors,
    scratch: &Scratch,
) -> Result<Mat<f64>> {
    let none = Mat::<f64>::zeros(0, k_z.nrows());
    let sh = Shared::new(k_z, none.as_ref(), scratch)?;
    let white = white_mean(&sh, c, mu);
    let mut w = Mat::<f64>::zeros(mu.nrows(), mu.ncols());
    lower_times(w.as_mut(), sh.l_z_inv.as_ref(), true, white.as_ref());
    sh.recycle(scratch);
    Ok(w)
}
