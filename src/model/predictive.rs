//! The predictive distribution of the utilities at new rows (seed 000 A.3):
//! q(f_k(x*)) = N(f̄_k, v_k) with f̄_k = Σ_p Φ_kp m_p(x*) + b_k, m_p(x*) = k(x*, Z) μ_p.
//! Ranking uses the mean f̄ (a monotone map of the predictive probability for a fixed v).

use faer::Mat;

use super::elbo::Params;
use super::kernel::{BasisInputs, KernelKind};

/// Mean utilities f̄ = (K_*Z μ) Φᵀ + 1 bᵀ [B×K] for the rows of `x` (their K_XX̃ rows
/// projected with the training basis).
pub fn mean_utilities(kind: KernelKind, params: &Params, x: &BasisInputs<'_>) -> Mat<f64> {
    let kf = kind.forward(&params.kernel, params.a.as_ref(), x);
    let m = &kf.k_bz * &params.mu;
    let mut f = &m * params.phi.transpose();
    for k in 0..f.ncols() {
        let b = params.bias[k];
        for v in f.col_mut(k).iter_mut() {
            *v += b;
        }
    }
    f
}
