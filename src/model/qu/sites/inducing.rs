//! The paper's q(u) through C_p = K_Z + Σ_p [M×M], for any kernel: one latent GP's forward
//! pass and one chunk of GPs' backward pass (`docs/model.md`, "q(u) and marginals",
//! "Gradients" and "Algorithm as implemented"). `qu/sites/mod.rs` runs them over all GPs.
//!
//! Only C_p = L_p L_pᵀ is ever factorised: K_Z itself may be singular (R < M, linear
//! kernel). Every product with C_p⁻¹ goes through L_p⁻¹ (triangular solves and triangular
//! products), about 2M³ + 3M²B flops per latent GP for the forward and backward passes
//! together. Everything here is sequential: it runs inside a per-GP task.

use anyhow::Result;
use faer::reborrow::{Reborrow, ReborrowMut};
use faer::{Mat, MatRef};

use crate::linalg::{inverse_and_solve, lower_product};
use crate::model::qu::gp_factor::{
    dsigma_drho, factorise, lower_inverse, sigma_column, solve_v, GpForward, PerGp,
};
use crate::model::qu::sites::kl::kl_inducing;
use crate::model::scratch::Scratch;

/// s_i = k_ii − ‖V e_i‖² for every column i of V [M×B].
pub(crate) fn variances(v: MatRef<'_, f64>, k_diag: &[f64]) -> Vec<f64> {
    (0..v.ncols())
        .map(|i| {
            let col = v.col(i);
            k_diag[i] - (0..v.nrows()).map(|j| col[j] * col[j]).sum::<f64>()
        })
        .collect()
}

/// Forward for latent GP p: Cholesky, V, the variances and (given `quad_mu` = μ_pᵀ K_Z μ_p)
/// KL_p. The factors are kept only if `keep` (for the backward pass).
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward_one(
    k_z: MatRef<'_, f64>,
    k_bz_t: MatRef<'_, f64>,
    k_diag: &[f64],
    rho: MatRef<'_, f64>,
    p: usize,
    quad_mu: Option<f64>,
    keep: bool,
    scratch: &Scratch,
) -> Result<GpForward> {
    let mut sigma = sigma_column(rho, p);
    let (l, jitter) = factorise(k_z, &mut sigma, scratch)?;
    // L⁻¹ is needed for the KL (and kept for the backward pass); without it, V comes from a
    // solve.
    let l_inv = quad_mu.map(|_| lower_inverse(l.as_ref(), scratch));
    let v = solve_v(
        l.as_ref(),
        l_inv.as_ref().map(|x| x.as_ref()),
        k_bz_t,
        scratch,
    );
    let var = variances(v.as_ref(), k_diag);
    let kl = match (quad_mu, &l_inv) {
        (Some(q), Some(l_inv)) => kl_inducing(l.as_ref(), l_inv.as_ref(), &sigma, q),
        _ => 0.0,
    };
    scratch.give_mat(l);
    Ok(GpForward::new(
        keep, l_inv, v, sigma, var, kl, jitter, scratch,
    ))
}

/// The Cholesky factor L_p of C_p = K_Z + Σ_p (with jitter retry) and the jitter, for
/// evaluating the marginals at many sets of rows ([`variances_given_factor`]).
pub(crate) fn factor(
    k_z: MatRef<'_, f64>,
    rho: MatRef<'_, f64>,
    p: usize,
    scratch: &Scratch,
) -> Result<(Mat<f64>, f64)> {
    let mut sigma = sigma_column(rho, p);
    factorise(k_z, &mut sigma, scratch)
}

/// s_ip = k_ii − ‖L_p⁻¹ k_i‖² for every row given L_p from [`factor`]: V by a triangular
/// solve with all rows as right-hand sides (the no-KL branch of [`forward_one`]).
pub(crate) fn variances_given_factor(
    l: MatRef<'_, f64>,
    k_bz_t: MatRef<'_, f64>,
    k_diag: &[f64],
    scratch: &Scratch,
) -> Vec<f64> {
    let v = solve_v(l, None, k_bz_t, scratch);
    let var = variances(v.as_ref(), k_diag);
    scratch.give_mat(v);
    var
}

/// One chunk's contribution to the backward pass.
pub(crate) struct ChunkGrads {
    /// Lower triangle of Σ_{p∈chunk} [−½ C_p⁻¹ + Y_p diag(d_p) Y_pᵀ] [M×M] (empty without
    /// kernel gradients).
    pub k_z: Mat<f64>,
    /// −2 Σ_{p∈chunk} W_p D_p [M×B], the transpose of the chunk's part of ∂F/∂K_bZ
    /// (empty without kernel gradients).
    pub k_bz_t: Mat<f64>,
    /// ∂F/∂ρ for the chunk's GPs, each [M].
    pub rho: Vec<Vec<f64>>,
}

/// Backward for one chunk of GPs (sequential inside). For GP p with D = diag(G_s[:, p]):
/// - C⁻¹ = L⁻ᵀ L⁻¹ (triangular product), W = C⁻¹ K_bZᵀ = L⁻ᵀ V (triangular product);
/// - ∂F/∂σ_m = −(C⁻¹)_mm + ½ Σ_j (C⁻¹)_mj² σ_j + Σ_i D_ii W_mi² + 1/(2σ_m);
/// - with kernel gradients: −½ C⁻¹ K_Z C⁻¹ + W D Wᵀ = −½ C⁻¹ + Y diag(d) Yᵀ with
///   Y = [C⁻¹ W] [M×(M+B)] and d = [½σ; D], using C⁻¹K_Z C⁻¹ = C⁻¹ − C⁻¹ΣC⁻¹. The chunk's
///   Y's are concatenated into one product whose lower triangle alone is formed.
pub(crate) fn backward_chunk(
    gps: &[PerGp],
    first: usize,
    rho: MatRef<'_, f64>,
    g_var: MatRef<'_, f64>,
    kernel_grads: bool,
    scratch: &Scratch,
) -> ChunkGrads {
    let (m, b, n) = (rho.nrows(), g_var.nrows(), gps.len());
    let width = m + b;
    // Y_cat = [Y_1 … Y_n] [M × n(M+B)]; without kernel gradients one Y at a time suffices.
    let mut y_cat = scratch.take_mat(m, if kernel_grads { n } else { 1 } * width);
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
        scratch.give_mat(y_cat);
        return ChunkGrads {
            k_z: Mat::new(),
            k_bz_t: Mat::new(),
            rho: rho_out,
        };
    }
    // Y_cat diag(d_cat), d_p = [½σ_p; D_p]; −½ Σ C_p⁻¹; −2 Σ W_p D_p.
    let mut yd_cat = scratch.take_mat(m, n * width);
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
    scratch.give_mat(y_cat);
    scratch.give_mat(yd_cat);
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
