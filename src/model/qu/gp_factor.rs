//! Per-latent-GP pieces of the paper's q(u) that both factorisation paths share: the map
//! ρ → σ, the Cholesky factor with jitter retry, L⁻¹, V = L⁻¹ X, and the factors one GP's
//! forward pass keeps for its backward pass (`docs/model.md`, "Algorithm as implemented").
//! Everything here is sequential: it runs inside a per-GP task.

use anyhow::{bail, Result};
use faer::dyn_stack::{MemBuffer, MemStack};
use faer::linalg::cholesky::llt::factor::{cholesky_in_place, cholesky_in_place_scratch};
use faer::{Mat, MatRef, Par};

use crate::linalg::{lower_inverse_into, lower_solve_into, zero_upper};
use crate::model::scratch::Scratch;

/// Smallest variance parameter σ_pm.
pub const MIN_SIGMA: f64 = 1e-6;

/// Above this ρ, softplus(ρ) = ρ and logistic(ρ) = 1 to double precision.
const SOFTPLUS_IS_LINEAR: f64 = 30.0;

/// σ = softplus(ρ) + 10⁻⁶ (stable for large |ρ|).
pub fn sigma_of(rho: f64) -> f64 {
    let softplus = if rho > SOFTPLUS_IS_LINEAR {
        rho
    } else {
        rho.exp().ln_1p()
    };
    softplus + MIN_SIGMA
}

/// (σ, dσ/dρ) from one exp: [`sigma_of`]'s σ bit for bit, and logistic(ρ) = e^ρ/(1 + e^ρ)
/// ([`dsigma_drho`]'s value to rounding). For loops over many sites, where the
/// transcendentals are the cost (`qu/axes.rs`).
pub(crate) fn sigma_and_slope(rho: f64) -> (f64, f64) {
    if rho > SOFTPLUS_IS_LINEAR {
        (rho + MIN_SIGMA, 1.0)
    } else {
        let e = rho.exp();
        (e.ln_1p() + MIN_SIGMA, e / (1.0 + e))
    }
}

/// dσ/dρ = logistic(ρ).
pub(crate) fn dsigma_drho(rho: f64) -> f64 {
    1.0 / (1.0 + (-rho).exp())
}

/// σ_p [M] for column p of ρ.
pub(crate) fn sigma_column(rho: MatRef<'_, f64>, p: usize) -> Vec<f64> {
    (0..rho.nrows()).map(|i| sigma_of(rho[(i, p)])).collect()
}

/// Per-latent-GP factors kept for the backward pass: L_p⁻¹ and V_p of C_p = K_Z + Σ_p
/// (`qu/sites/inducing.rs`), or of J_p = I + Fᵀ Σ_p⁻¹ F = L_p L_pᵀ on the subspace path
/// (`qu/sites/low_rank.rs`), [R×R] and [R×B].
#[derive(Debug, Clone)]
pub(crate) struct PerGp {
    /// L_p⁻¹ [M×M] in the lower triangle (nothing meaningful above the diagonal).
    pub l_inv: Mat<f64>,
    /// V_p = L_p⁻¹ K_bZᵀ [M×B].
    pub v: Mat<f64>,
    /// Σ_p actually used (σ plus any jitter) [M].
    pub sigma: Vec<f64>,
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
    /// otherwise hands them back to `scratch`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        keep: bool,
        l_inv: Option<Mat<f64>>,
        v: Mat<f64>,
        sigma: Vec<f64>,
        var: Vec<f64>,
        kl: f64,
        jitter: f64,
        scratch: &Scratch,
    ) -> Self {
        let state = match (keep, l_inv) {
            (true, Some(l_inv)) => Some(PerGp { l_inv, v, sigma }),
            (_, l_inv) => {
                scratch.give_mat(v);
                if let Some(x) = l_inv {
                    scratch.give_mat(x);
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

/// Lower Cholesky factor L [M×M] (zeros above the diagonal) of K_Z + diag(σ), retried with
/// growing jitter on the diagonal when it fails; σ gets the jitter that was used. Sequential
/// (it runs inside a per-GP task).
pub fn factorise(
    k_z: MatRef<'_, f64>,
    sigma: &mut [f64],
    scratch: &Scratch,
) -> Result<(Mat<f64>, f64)> {
    let m = k_z.nrows();
    let mean_diag = (0..m).map(|i| k_z[(i, i)] + sigma[i]).sum::<f64>() / m.max(1) as f64;
    let mut buf = MemBuffer::new(cholesky_in_place_scratch::<f64>(
        m,
        Par::Seq,
        Default::default(),
    ));
    let mut jitter = 0.0;
    for attempt in 0..8 {
        let mut c = scratch.take_mat(m, m);
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
            zero_upper(c.as_mut());
            for s in sigma.iter_mut() {
                *s += jitter;
            }
            return Ok((c, jitter));
        }
        scratch.give_mat(c);
        jitter = mean_diag.max(1e-300) * 1e-10 * 10f64.powi(attempt);
    }
    bail!("Cholesky of K_Z + Σ failed even with jitter {jitter:.3e} on the diagonal")
}

/// V = L⁻¹ X [n×B] from X [n×B] (see [`lower_solve_into`]), in a buffer from `scratch`.
pub(crate) fn solve_v(
    l: MatRef<'_, f64>,
    l_inv: Option<MatRef<'_, f64>>,
    x: MatRef<'_, f64>,
    scratch: &Scratch,
) -> Mat<f64> {
    let mut v = scratch.take_mat(x.nrows(), x.ncols());
    lower_solve_into(v.as_mut(), l, l_inv, x);
    v
}

/// L⁻¹ [n×n] in the lower triangle (n³/3 flops) in a buffer from `scratch`; the entries
/// above the diagonal are unspecified and never read.
pub(crate) fn lower_inverse(l: MatRef<'_, f64>, scratch: &Scratch) -> Mat<f64> {
    let m = l.nrows();
    let mut inv = scratch.take_mat(m, m);
    lower_inverse_into(inv.as_mut(), l);
    inv
}
