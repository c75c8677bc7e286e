//! Initial parameters of a fresh run (`docs/model.md`, "Initialisation").

use anyhow::{ensure, Result};
use faer::Mat;
use ndarray::ArrayView2;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};

use super::batches::{stream_seed, streams};
use crate::model::kernel::{GramRef, KernelKind, KernelParams};
use crate::model::params::{Params, QForm, QParams};
use crate::model::qu::cholesky::{pack_factors, prior_factor};

/// softplus⁻¹(1) = ln(e − 1): ρ such that σ = softplus(ρ) ≈ 1.
pub const RHO_INIT: f64 = 0.541_324_854_612_918_1;

/// b_k = logit of label k's frequency in the N training rows, clamped to
/// [1/(2N), 1 − 1/(2N)] so labels never (or always) seen get a finite bias.
pub fn bias_from_counts(counts: &[u64], n_rows: u64) -> Vec<f64> {
    let n = n_rows.max(1) as f64;
    let (lo, hi) = (0.5 / n, 1.0 - 0.5 / n);
    counts
        .iter()
        .map(|&c| {
            let f = (c as f64 / n).clamp(lo, hi);
            (f / (1.0 - f)).ln()
        })
        .collect()
}

/// Median of ‖x_i − x_j‖ over pairs among up to `max_rows` rows sampled from K_XX̃, with
/// ‖x_i − x_j‖² = n_i + n_j − 2 (K_XX̃)_i·(K_XX̃)_j: the same projection the SE kernel uses.
pub fn median_distance(
    kxx: ArrayView2<'_, f32>,
    sq_norms: &[f32],
    max_rows: usize,
    seed: u64,
) -> f64 {
    let n = kxx.nrows();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let rows: Vec<usize> = if n <= max_rows {
        (0..n).collect()
    } else {
        rand::seq::index::sample(&mut rng, n, max_rows).into_vec()
    };
    let mut d = Vec::with_capacity(rows.len() * rows.len().saturating_sub(1) / 2);
    for (a, &i) in rows.iter().enumerate() {
        for &j in &rows[a + 1..] {
            let dot: f64 = kxx
                .row(i)
                .iter()
                .zip(kxx.row(j))
                .map(|(&x, &y)| x as f64 * y as f64)
                .sum();
            let d2 = sq_norms[i] as f64 + sq_norms[j] as f64 - 2.0 * dot;
            d.push(d2.max(0.0).sqrt());
        }
    }
    if d.is_empty() {
        return 1.0;
    }
    let mid = d.len() / 2;
    let (_, m, _) = d.select_nth_unstable_by(mid, f64::total_cmp);
    if *m > 0.0 {
        *m
    } else {
        1.0
    }
}

/// Where the inducing inputs start.
pub enum InducingInit<'a> {
    /// Rows of `a_init.npy` [≥M × R]; the first M are A (subspace inducing inputs).
    Subspace(ArrayView2<'a, f32>),
    /// Z [M×D] in input space, from [`z_from_subspace`] or training rows.
    InputSpace(Mat<f64>),
}

/// Z₀ = A₀ X̃ [M×D]: the first M k-means centroids of `a_init.npy` [≥M×R] mapped to input
/// space through the basis X̃ [R×D] (the centroids of the rows' projections onto the
/// span of X̃). A `free` run starts where a `subspace` run starts: K_Z, K_bZ and k_ii are
/// the same (`docs/model.md`, "Free inducing inputs").
pub fn z_from_subspace(
    a_init: ArrayView2<'_, f32>,
    inducing: usize,
    basis: ArrayView2<'_, f32>,
) -> Result<Mat<f64>> {
    check_inducing(inducing, a_init.nrows())?;
    ensure!(
        a_init.ncols() == basis.nrows(),
        "a_init.npy has {} columns but basis.npy {} rows",
        a_init.ncols(),
        basis.nrows()
    );
    let a = Mat::from_fn(inducing, a_init.ncols(), |i, j| a_init[(i, j)] as f64);
    let x = Mat::from_fn(basis.nrows(), basis.ncols(), |i, j| basis[(i, j)] as f64);
    let mut z = Mat::<f64>::zeros(inducing, basis.ncols());
    // Sequential: the initial Z is then the same bits for any thread count.
    faer::linalg::matmul::matmul(
        z.as_mut(),
        faer::Accum::Replace,
        a.as_ref(),
        x.as_ref(),
        1.0,
        faer::Par::Seq,
    );
    Ok(z)
}

/// `inducing` distinct training rows out of `n_rows`, drawn from the run seed (their own
/// stream, so no other random choice moves), in increasing order: `fixed-rows`' Z.
pub fn pick_rows(n_rows: u64, inducing: usize, seed: u64) -> Result<Vec<u64>> {
    ensure!(
        inducing as u64 <= n_rows,
        "--inducing {inducing} with --inducing-inputs fixed-rows, but the training split \
         has only {n_rows} rows"
    );
    let mut rng = ChaCha8Rng::seed_from_u64(stream_seed(seed, streams::INIT, &[2]));
    let n = usize::try_from(n_rows)?;
    let mut rows: Vec<u64> = rand::seq::index::sample(&mut rng, n, inducing)
        .into_iter()
        .map(|r| r as u64)
        .collect();
    rows.sort_unstable();
    Ok(rows)
}

fn check_inducing(inducing: usize, rows: usize) -> Result<()> {
    ensure!(
        inducing >= 1 && inducing <= rows,
        "--inducing {inducing} but the svd run initialised {rows} inducing inputs; rerun \
         `pipeline svd --inducing {inducing}`"
    );
    Ok(())
}

/// Shapes and inputs of the initialisation.
pub struct InitInputs<'a> {
    pub kind: KernelKind,
    pub inducing_init: InducingInit<'a>,
    pub inducing: usize,
    pub factors: usize,
    pub label_counts: &'a [u64],
    pub n_rows: u64,
    /// ℓ's initial value (SE and SE + linear).
    pub lengthscale: f64,
    /// Subspace ARD: one weight per basis direction, all starting at ω = 1.
    pub ard: bool,
    /// ARD over the features: this many weights (D, or 0 without), all starting at w = 1.
    pub feature_weights: usize,
    pub seed: u64,
}

/// σ_f² = σ_lin² = ½ of SE + linear: the two parts equal and their variances summing to one
/// (the normalised start of the journal version of Panos, Dellaportas & Titsias).
pub const SE_PLUS_LINEAR_LOG_VAR: f64 = -std::f64::consts::LN_2;

/// A = first M rows of a_init (or the given Z), μ = 0, ρ = softplus⁻¹(1), Φ ~ N(0, 1/P),
/// b = logit of the label frequencies, σ_f² = 1, ℓ = the median distance (SE); for SE +
/// linear σ_f² = σ_lin² = ½; ARD weights ω = 1 (the kernel without ARD), one per column of A.
pub fn initial_params(x: &InitInputs<'_>) -> Result<Params> {
    let a = match &x.inducing_init {
        InducingInit::Subspace(a_init) => {
            check_inducing(x.inducing, a_init.nrows())?;
            Mat::from_fn(x.inducing, a_init.ncols(), |i, j| a_init[(i, j)] as f64)
        }
        InducingInit::InputSpace(z) => {
            ensure!(
                z.nrows() == x.inducing,
                "internal: Z has {} rows for M = {}",
                z.nrows(),
                x.inducing
            );
            z.clone()
        }
    };
    ensure!(x.factors >= 1, "--factors must be at least 1");
    let mut rng = ChaCha8Rng::seed_from_u64(stream_seed(x.seed, streams::INIT, &[]));
    let normal = Normal::new(0.0, (1.0 / x.factors as f64).sqrt())?;
    let k = x.label_counts.len();
    let phi = Mat::from_fn(k, x.factors, |_, _| normal.sample(&mut rng));
    // Keep the stream position independent of later additions.
    let _: u64 = rng.random();
    let mut kernel = initial_kernel(x.kind, x.lengthscale, if x.ard { a.ncols() } else { 0 });
    kernel.log_features = vec![0.0; x.feature_weights];
    Ok(Params {
        logit_epsilon: None,
        a,
        q: QParams::Sites {
            mu: Mat::zeros(x.inducing, x.factors),
            rho: Mat::from_fn(x.inducing, x.factors, |_, _| RHO_INIT),
        },
        phi,
        bias: bias_from_counts(x.label_counts, x.n_rows),
        kernel,
        amortiser: None,
    })
}

/// The kernel's initial hyperparameters, with `ard_weights` ARD weights at ω = 1.
fn initial_kernel(kind: KernelKind, lengthscale: f64, ard_weights: usize) -> KernelParams {
    let mut k = match kind {
        KernelKind::Linear => KernelParams::new(0.0, 0.0),
        KernelKind::SquaredExponential => KernelParams::new(0.0, lengthscale.ln()),
        KernelKind::SePlusLinear => KernelParams {
            log_lin2: Some(SE_PLUS_LINEAR_LOG_VAR),
            ..KernelParams::new(SE_PLUS_LINEAR_LOG_VAR, lengthscale.ln())
        },
    };
    k.log_ard = vec![0.0; ard_weights];
    k
}

/// The initial q(u) of `form`, replacing the paper form's μ and ρ of `params`: the prior
/// in every form. Whitened: μ = m = 0 and L_p = I. Unwhitened: μ = 0 and L_p = L_Z, the
/// Cholesky factor of K_Z (with the jitter the model's factorisation adds, `k_tilde` [R×R]
/// being the basis Gram), so that S_p = K_Z. The paper's form is returned unchanged.
pub fn with_q_form(
    mut params: Params,
    form: QForm,
    kind: KernelKind,
    k_tilde: GramRef<'_>,
) -> Result<Params> {
    let (m, p) = (params.q.mu().nrows(), params.q.mu().ncols());
    let factor = match form {
        QForm::SiteDiagonal => return Ok(params),
        QForm::Whitened => Mat::<f64>::identity(m, m),
        QForm::Cholesky => prior_factor(
            kind.k_z(&params.kernel, params.a.as_ref(), k_tilde)
                .as_ref(),
        )?,
    };
    let factors = vec![factor; p];
    params.q = QParams::Full {
        mu: Mat::zeros(m, p),
        chol: pack_factors(&factors, form == QForm::Whitened),
    };
    Ok(params)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::qu::gp_factor::sigma_of;

    #[test]
    fn rho_init_gives_unit_sigma() {
        assert!((sigma_of(RHO_INIT) - 1.0 - 1e-6).abs() < 1e-15);
    }

    #[test]
    fn bias_is_the_clamped_logit() {
        let b = bias_from_counts(&[0, 5, 10], 10);
        assert!((b[1] - 0.0).abs() < 1e-15);
        assert!((b[0] - (0.05f64 / 0.95).ln()).abs() < 1e-12);
        assert!((b[2] - (0.95f64 / 0.05).ln()).abs() < 1e-12);
    }

    #[test]
    fn median_distance_of_orthonormal_rows() {
        // Three unit rows along the axes: every pairwise distance is √2.
        let kxx = ndarray::Array2::from_shape_fn((3, 3), |(i, j)| (i == j) as u8 as f32);
        let d = median_distance(kxx.view(), &[1.0, 1.0, 1.0], 10, 0);
        assert!((d - 2f64.sqrt()).abs() < 1e-12);
    }
}
