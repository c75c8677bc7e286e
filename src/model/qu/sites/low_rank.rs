//! q(u) through the R-dimensional subspace: the linear kernel's per-GP algebra in R×R
//! matrices instead of M×M ones (`docs/model.md`, section "The subspace path").
//!
//! With the linear kernel every inducing covariance lives in the span of the basis:
//! K_Z = σ_f² A K_X̃ Aᵀ = F Fᵀ and K_bZ = σ_f² Kxx_b Aᵀ = Gᵀ Fᵀ, where L_X̃ L_X̃ᵀ = K_X̃ and
//!
//! - F = σ_f A L_X̃ [M×R],
//! - G = σ_f L_X̃⁻¹ Kxx_bᵀ [R×B] (column i is g_i, so k_i = F g_i).
//!
//! With J_p = I_R + Fᵀ Σ_p⁻¹ F [R×R] (Woodbury), Fᵀ C_p⁻¹ F = I − J_p⁻¹ and
//! log|C_p| = log|Σ_p| + log|J_p|, so
//!
//! - s_ip = c_i + g_iᵀ J_p⁻¹ g_i with c_i = k_ii − ‖g_i‖² (x_i's part outside the span);
//! - KL_p = ½ [μ_pᵀ K_Z μ_p − R + tr J_p⁻¹ + log|J_p|].
//!
//! Per latent GP that costs 3MR² + 2R³ + 3R²B flops for the forward and backward passes
//! together, against 2M³ + 3M²B through C_p = K_Z + Σ_p: at R = M/2 and B = M, 2.9× fewer.
//! J_p ⪰ I is always well conditioned for the Cholesky, unlike K_Z + Σ_p with a singular K_Z.
//! [`worthwhile`] decides when the path is used.

use anyhow::Result;
use faer::linalg::matmul::matmul;
use faer::linalg::matmul::triangular::{matmul as tri_matmul, BlockStructure};
use faer::linalg::triangular_solve::{
    solve_lower_triangular_in_place, solve_upper_triangular_in_place,
};
use faer::{Accum, Mat, MatRef, Par};

use crate::linalg::{
    cholesky_lower, inner_by_columns, inverse_and_solve, lower_product, mirror_lower,
};
use crate::model::kernel::{BasisInputs, KernelParams};
use crate::model::qu::gp_factor::{
    dsigma_drho, factorise, lower_inverse, sigma_column, solve_v, GpForward, PerGp,
};
use crate::model::qu::sites::kl::kl_low_rank;
use crate::model::scratch::Scratch;

/// Whether the subspace path is cheaper than the inducing-point path for M inducing points
/// and basis rank R: with B = M its per-GP cost 3MR² + 2R³ + 3R²B is below 2M³ + 3M²B up to
/// R ≈ 0.82 M (0.72 M as B → 0, 0.93 M for B ≫ M). The rule uses R ≤ ¾M, so it never picks
/// the dearer path, and depends on M and R alone, so that a minibatch's bound and the
/// full-data KL (B = 0) always take the same path.
pub fn worthwhile(m: usize, r: usize) -> bool {
    4 * r <= 3 * m
}

/// The subspace factors of one minibatch (linear kernel).
#[derive(Debug, Clone)]
pub struct LowRankFactors {
    /// F = σ_f A L_X̃ [M×R]: K_Z = F Fᵀ.
    pub f: Mat<f64>,
    /// G = σ_f L_X̃⁻¹ Kxx_bᵀ [R×B]: K_bZ = Gᵀ Fᵀ.
    pub g: Mat<f64>,
    /// c_i = k_ii − ‖g_i‖² [B], the kernel variance of x_i outside the basis span.
    pub resid: Vec<f64>,
    /// L_X̃ [R×R], lower Cholesky factor of K_X̃.
    l_kt: Mat<f64>,
    /// σ_f.
    sf: f64,
}

impl LowRankFactors {
    /// The factors for inducing coordinates `a` [M×R] and the minibatch `x`, with k_ii
    /// `k_diag` [B] from the kernel's forward pass. None when K_X̃ is not positive definite
    /// (a rank-deficient basis): the caller then takes the inducing-point path.
    pub fn new(
        kp: &KernelParams,
        a: MatRef<'_, f64>,
        x: &BasisInputs<'_>,
        k_diag: &[f64],
    ) -> Option<LowRankFactors> {
        let (m, r, b) = (a.nrows(), a.ncols(), x.kxx_b.nrows());
        // The identity basis comes here only at D ≤ ¾M ([`worthwhile`]): I_D is small.
        let l_kt = cholesky_lower(x.k_tilde.to_dense())?;
        let sf = (0.5 * kp.log_sf2).exp();
        let mut f = Mat::<f64>::zeros(m, r);
        tri_matmul(
            f.as_mut(),
            BlockStructure::Rectangular,
            Accum::Replace,
            a,
            BlockStructure::Rectangular,
            l_kt.as_ref(),
            BlockStructure::TriangularLower,
            sf,
            Par::rayon(0),
        );
        let mut g = x.kxx_b.to_dense().transpose().to_owned();
        solve_lower_triangular_in_place(l_kt.as_ref(), g.as_mut(), Par::rayon(0));
        g *= faer::Scale(sf);
        let resid = (0..b)
            .map(|i| k_diag[i] - g.col(i).iter().map(|v| v * v).sum::<f64>())
            .collect();
        Some(LowRankFactors {
            f,
            g,
            resid,
            l_kt,
            sf,
        })
    }

    /// Chain rule from ∂/∂F [M×R] and ∂/∂G [R×B] to (∂/∂A [M×R], ∂/∂log σ_f²):
    /// ∂A = σ_f ∂F L_X̃ᵀ, and F and G are both proportional to σ_f = exp(½ log σ_f²), so
    /// ∂log σ_f² = ½ (⟨∂F, F⟩ + ⟨∂G, G⟩). G does not depend on A.
    pub fn chain(&self, g_f: MatRef<'_, f64>, g_g: MatRef<'_, f64>) -> (Mat<f64>, f64) {
        let mut g_a = Mat::<f64>::zeros(g_f.nrows(), g_f.ncols());
        tri_matmul(
            g_a.as_mut(),
            BlockStructure::Rectangular,
            Accum::Replace,
            g_f,
            BlockStructure::Rectangular,
            self.l_kt.transpose(),
            BlockStructure::TriangularUpper,
            self.sf,
            Par::rayon(0),
        );
        let g_log_sf2 =
            0.5 * (inner_by_columns(g_f, self.f.as_ref()) + inner_by_columns(g_g, self.g.as_ref()));
        (g_a, g_log_sf2)
    }

    /// ∂/∂Kxx_b [B×R] from ∂/∂G [R×B]: G = σ_f L_X̃⁻¹ Kxx_bᵀ, so ∂Kxx_bᵀ = σ_f L_X̃⁻ᵀ ∂G
    /// (for input transforms such as ARD, `kernel/ard.rs`).
    pub fn kxx_grad(&self, g_g: MatRef<'_, f64>) -> Mat<f64> {
        let mut t = g_g.to_owned();
        solve_upper_triangular_in_place(self.l_kt.transpose(), t.as_mut(), Par::rayon(0));
        t *= faer::Scale(self.sf);
        t.transpose().to_owned()
    }
}

/// Forward for latent GP p: J_p = I + Fᵀ Σ_p⁻¹ F = L Lᵀ, V = L⁻¹ G, s_ip = c_i + ‖V e_i‖²,
/// and (given `quad_mu` = μ_pᵀ K_Z μ_p) KL_p = ½ [μᵀK_Zμ − R + ‖L⁻¹‖²_F + 2 Σ log L_rr].
/// Keeps L⁻¹ [R×R] and V [R×B] for the backward pass if `keep` (which needs `quad_mu`).
pub(crate) fn forward_one(
    sub: &LowRankFactors,
    rho: MatRef<'_, f64>,
    p: usize,
    quad_mu: Option<f64>,
    keep: bool,
    scratch: &Scratch,
) -> Result<GpForward> {
    let (m, r) = (sub.f.nrows(), sub.f.ncols());
    let sigma = sigma_column(rho, p);
    // F_s = Σ^{-1/2} F, so that Fᵀ Σ⁻¹ F = F_sᵀ F_s.
    let mut fs = scratch.take_mat(m, r);
    for j in 0..r {
        let (src, dst) = (sub.f.col(j), fs.col_mut(j));
        for ((d, s), sg) in dst.iter_mut().zip(src.iter()).zip(&sigma) {
            *d = s / sg.sqrt();
        }
    }
    let mut h = scratch.take_mat(r, r);
    tri_matmul(
        h.as_mut(),
        BlockStructure::TriangularLower,
        Accum::Replace,
        fs.transpose(),
        BlockStructure::Rectangular,
        fs.as_ref(),
        BlockStructure::Rectangular,
        1.0,
        Par::Seq,
    );
    scratch.give_mat(fs);
    mirror_lower(h.as_mut());
    // J = H + I; `factorise` retries with jitter on the diagonal, which J ⪰ I never needs
    // unless the parameters are not finite.
    let mut unit = vec![1.0; r];
    let factor = factorise(h.as_ref(), &mut unit, scratch);
    scratch.give_mat(h);
    let (l, jitter) = factor?;
    let l_inv = quad_mu.map(|_| lower_inverse(l.as_ref(), scratch));
    let v = solve_v(
        l.as_ref(),
        l_inv.as_ref().map(|x| x.as_ref()),
        sub.g.as_ref(),
        scratch,
    );
    let var = (0..v.ncols())
        .map(|i| sub.resid[i] + v.col(i).iter().map(|x| x * x).sum::<f64>())
        .collect();
    let kl = match (quad_mu, &l_inv) {
        (Some(q), Some(l_inv)) => kl_low_rank(l.as_ref(), l_inv.as_ref(), q),
        _ => 0.0,
    };
    scratch.give_mat(l);
    Ok(GpForward::new(
        keep, l_inv, v, sigma, var, kl, jitter, scratch,
    ))
}

/// One chunk's share of the subspace backward pass.
pub(crate) struct ChunkGrads {
    /// Σ_{p∈chunk} 2 Σ_p⁻¹ F Ḡ_J,p [M×R] (empty without kernel gradients).
    pub f: Mat<f64>,
    /// Σ_{p∈chunk} 2 W_p D_p [R×B] (empty without kernel gradients).
    pub g: Mat<f64>,
    /// ∂F/∂ρ for the chunk's GPs, each [M].
    pub rho: Vec<Vec<f64>>,
}

/// Backward for one chunk of GPs (sequential inside). For GP p with D = diag(G_s[:, p]),
/// the part of F that depends on J is φ(J) = tr(J⁻¹ G D Gᵀ) − ½ tr J⁻¹ − ½ log|J|, so
///
/// Ḡ_J = ∂φ/∂J = −W D Wᵀ + ½ J⁻² − ½ J⁻¹ with W = J⁻¹ G = L⁻ᵀ V [R×B]
///       = Y diag(d) Yᵀ − ½ J⁻¹ with Y = [J⁻¹ W] [R×(R+B)] and d = [½·1; −D];
///
/// J = I + Fᵀ Σ⁻¹ F then gives ∂F += 2 Σ⁻¹ F Ḡ_J and ∂σ_m = −σ_m⁻² (F Ḡ_J)_m · F_m, and
/// s_i = c_i + g_iᵀ J⁻¹ g_i gives ∂G += 2 W D (the −2 g_i Σ_p G_s,ip of c_i is added by the
/// caller, once).
pub(crate) fn backward_chunk(
    sub: &LowRankFactors,
    gps: &[PerGp],
    first: usize,
    rho: MatRef<'_, f64>,
    g_var: MatRef<'_, f64>,
    kernel_grads: bool,
    scratch: &Scratch,
) -> ChunkGrads {
    let (m, r) = (sub.f.nrows(), sub.f.ncols());
    let b = g_var.nrows();
    let width = r + b;
    let (mut g_f, mut g_g) = if kernel_grads {
        (Mat::<f64>::zeros(m, r), Mat::<f64>::zeros(r, b))
    } else {
        (Mat::new(), Mat::new())
    };
    let mut rho_out = Vec::with_capacity(gps.len());
    let mut y = scratch.take_mat(r, width);
    let mut yd = scratch.take_mat(r, width);
    let mut g_j = scratch.take_mat(r, r);
    let mut f_gj = scratch.take_mat(m, r);
    for (q, gp) in gps.iter().enumerate() {
        let p = first + q;
        let d = g_var.col(p);
        {
            // J⁻¹ and W = J⁻¹ G = L⁻ᵀ V [R×B].
            let (j_inv, w) = y.as_mut().split_at_col_mut(r);
            inverse_and_solve(gp.l_inv.as_ref(), gp.v.as_ref(), j_inv, w);
        }
        // Y diag(d), d = [½·1; −D].
        for j in 0..width {
            let f = if j < r { 0.5 } else { -d[j - r] };
            for (o, x) in yd.col_mut(j).iter_mut().zip(y.col(j).iter()) {
                *o = f * x;
            }
        }
        // Ḡ_J = Y diag(d) Yᵀ − ½ J⁻¹ (lower triangle, then mirrored).
        lower_product(g_j.as_mut(), y.as_ref(), yd.as_ref());
        for c in 0..r {
            for i in c..r {
                g_j[(i, c)] -= 0.5 * y[(i, c)];
            }
        }
        mirror_lower(g_j.as_mut());
        // F Ḡ_J [M×R].
        matmul(
            f_gj.as_mut(),
            Accum::Replace,
            sub.f.as_ref(),
            g_j.as_ref(),
            1.0,
            Par::Seq,
        );
        let sigma = &gp.sigma;
        let mut g_rho = vec![0.0; m];
        for c in 0..r {
            let (fc, pc) = (sub.f.col(c), f_gj.col(c));
            for (i, g) in g_rho.iter_mut().enumerate() {
                *g += pc[i] * fc[i];
            }
        }
        for (i, g) in g_rho.iter_mut().enumerate() {
            *g *= -dsigma_drho(rho[(i, p)]) / (sigma[i] * sigma[i]);
        }
        rho_out.push(g_rho);
        if kernel_grads {
            for c in 0..r {
                let (dst, pc) = (g_f.col_mut(c), f_gj.col(c));
                for ((o, x), s) in dst.iter_mut().zip(pc.iter()).zip(sigma) {
                    *o += 2.0 * x / s;
                }
            }
            for i in 0..b {
                let di = 2.0 * d[i];
                let (dst, wc) = (g_g.col_mut(i), y.col(r + i));
                for (o, x) in dst.iter_mut().zip(wc.iter()) {
                    *o += di * x;
                }
            }
        }
    }
    for x in [y, yd, g_j, f_gj] {
        scratch.give_mat(x);
    }
    ChunkGrads {
        f: g_f,
        g: g_g,
        rho: rho_out,
    }
}
