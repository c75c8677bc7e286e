//! KL(q(u_p) ‖ p(u_p)) of the paper's q(u) from the per-GP Cholesky factors, on either
//! factorisation path (`docs/model.md`, "q(u) and marginals" and "The subspace path").
//! The sums are the forward pass's; [`quad_mu`] is shared by all GPs.

use faer::MatRef;

/// μ_pᵀ K_Z μ_p for every p, from K_Z μ [M×P].
pub(crate) fn quad_mu(k_z: MatRef<'_, f64>, mu: MatRef<'_, f64>) -> Vec<f64> {
    let k_mu = k_z * mu;
    (0..mu.ncols())
        .map(|p| (0..mu.nrows()).map(|i| mu[(i, p)] * k_mu[(i, p)]).sum())
        .collect()
}

/// Through C_p = K_Z + Σ_p = L Lᵀ: KL_p = ½ [μᵀK_Zμ − tr(C⁻¹K_Z) + log|C| − log|Σ|], with
/// tr(C⁻¹K_Z) = M − tr(C⁻¹Σ) and (C⁻¹)_mm = ‖L⁻¹ e_m‖², so only L and L⁻¹ are needed.
/// `quad_mu` is μ_pᵀ K_Z μ_p.
pub(crate) fn kl_inducing(
    l: MatRef<'_, f64>,
    l_inv: MatRef<'_, f64>,
    sigma: &[f64],
    quad_mu: f64,
) -> f64 {
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

/// Through J_p = I + Fᵀ Σ_p⁻¹ F = L Lᵀ [R×R]: KL_p = ½ [μᵀK_Zμ − R + tr J⁻¹ + log|J|]
/// (log|Σ_p| cancels), with tr J⁻¹ = ‖L⁻¹‖²_F.
pub(crate) fn kl_low_rank(l: MatRef<'_, f64>, l_inv: MatRef<'_, f64>, quad_mu: f64) -> f64 {
    let r = l.nrows();
    let tr_j_inv: f64 = (0..r)
        .map(|c| (c..r).map(|i| l_inv[(i, c)] * l_inv[(i, c)]).sum::<f64>())
        .sum();
    let logdet_j = 2.0 * (0..r).map(|i| l[(i, i)].ln()).sum::<f64>();
    0.5 * (quad_mu - r as f64 + tr_j_inv + logdet_j)
}
