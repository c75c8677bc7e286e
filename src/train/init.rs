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
    /// Z = I_D, the coordinate axes of D features (`model/qu/axes.rs`): A is [0×D], μ and
    /// ρ have one row per feature (M = D).
    Axes(usize),
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
    /// V, each utility's prior variance at the start ([`prior_split`]); 1 by default.
    pub prior_variance: f64,
    /// Whether Φ is replaced by the identity (one GP per label): V then goes to the kernel.
    pub phi_is_identity: bool,
    pub seed: u64,
}

/// σ_f² = σ_lin² = ½ of SE + linear: the two parts equal and their variances summing to one
/// (the normalised start of the journal version of Panos, Dellaportas & Titsias).
pub const SE_PLUS_LINEAR_LOG_VAR: f64 = -std::f64::consts::LN_2;

/// How a utility's starting prior variance V (`--prior-variance`; σ_f² E‖Φ_k‖² for a row
/// with k(x, x) = 1) is split between Φ and the kernel, for P latent GPs: Φ ~ N(0, V/P) with
/// the kernel's variances as they start until Φ's entries reach the journal's standard
/// Gaussian start, N(0, 1), at V = P; beyond it the kernel's variances grow by V/P. V = 1,
/// the default, is Φ ~ N(0, 1/P) and the kernel unchanged. With one GP per label (Φ = I,
/// not trained) the kernel takes all of V. Returns (Φ's entry variance, the kernel's
/// variance factor).
pub fn prior_split(variance: f64, factors: usize, phi_is_identity: bool) -> (f64, f64) {
    let p = factors as f64;
    if phi_is_identity {
        (1.0 / p, variance)
    } else if variance <= p {
        (variance / p, 1.0)
    } else {
        (1.0, variance / p)
    }
}

/// A = first M rows of a_init (or the given Z), μ = 0, ρ = softplus⁻¹(1), Φ ~ N(0, 1/P),
/// b = logit of the label frequencies, σ_f² = 1, ℓ = the median distance (SE); for SE +
/// linear σ_f² = σ_lin² = ½; ARD weights ω = 1 (the kernel without ARD), one per column of A.
/// A `prior_variance` other than 1 scales Φ's and the kernel's start as [`prior_split`] says.
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
        InducingInit::Axes(d) => {
            ensure!(
                *d == x.inducing,
                "internal: {d} axes for M = {}",
                x.inducing
            );
            Mat::zeros(0, *d)
        }
    };
    ensure!(x.factors >= 1, "--factors must be at least 1");
    let mut rng = ChaCha8Rng::seed_from_u64(stream_seed(x.seed, streams::INIT, &[]));
    let (phi_variance, kernel_factor) = prior_split(x.prior_variance, x.factors, x.phi_is_identity);
    let normal = Normal::new(0.0, phi_variance.sqrt())?;
    let k = x.label_counts.len();
    let phi = Mat::from_fn(k, x.factors, |_, _| normal.sample(&mut rng));
    // Keep the stream position independent of later additions.
    let _: u64 = rng.random();
    let mut kernel = initial_kernel(x.kind, x.lengthscale, if x.ard { a.ncols() } else { 0 });
    if kernel_factor != 1.0 {
        // Every variance of the kernel grows by the factor: k(x, x) scales by it.
        kernel.log_sf2 += kernel_factor.ln();
        if let Some(lin) = kernel.log_lin2.as_mut() {
            *lin += kernel_factor.ln();
        }
    }
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

    /// The initial parameters of `kind` with P = `factors` GPs over 4 000 labels, starting
    /// prior variance `variance`.
    fn started(kind: KernelKind, factors: usize, variance: f64, identity: bool) -> Params {
        let a_init = ndarray::Array2::<f32>::from_shape_fn((3, 2), |(i, j)| (i + j) as f32);
        let counts = vec![1u64; 4000];
        initial_params(&InitInputs {
            kind,
            inducing_init: InducingInit::Subspace(a_init.view()),
            inducing: 3,
            factors,
            label_counts: &counts,
            n_rows: 10,
            lengthscale: 2.0,
            ard: false,
            feature_weights: 0,
            prior_variance: variance,
            phi_is_identity: identity,
            seed: 7,
        })
        .unwrap()
    }

    /// The mean over labels of σ_f² ‖Φ_k‖² (k(x, x) = σ_f² for the linear kernel on a unit
    /// row): the utilities' starting prior variance.
    fn mean_utility_variance(p: &Params) -> f64 {
        let k = p.phi.nrows();
        let norms: f64 = (0..k)
            .map(|r| {
                (0..p.phi.ncols())
                    .map(|c| p.phi[(r, c)].powi(2))
                    .sum::<f64>()
            })
            .sum();
        p.kernel.log_sf2.exp() * norms / k as f64
    }

    #[test]
    fn the_prior_variance_is_the_utilities_starting_variance() {
        // 4 000 labels × P entries: the mean of ‖Φ_k‖² is within a few percent of its
        // expectation.
        for (p, v) in [
            (30, 1.0),
            (30, 5.0),
            (30, 30.0),
            (30, 300.0),
            (106, 300.0),
            (4, 0.01),
        ] {
            let got = mean_utility_variance(&started(KernelKind::Linear, p, v, false));
            assert!((got / v - 1.0).abs() < 0.05, "P = {p}, V = {v}: {got}");
        }
        // Up to V = P the kernel keeps its start; above, Φ stays at N(0, 1).
        assert_eq!(
            started(KernelKind::Linear, 30, 30.0, false).kernel.log_sf2,
            0.0
        );
        let above = started(KernelKind::Linear, 30, 300.0, false);
        assert!((above.kernel.log_sf2 - 10f64.ln()).abs() < 1e-12);
        // SE + linear: both halves grow alike, their sum stays the kernel's k(x, x).
        let sum = started(KernelKind::SePlusLinear, 30, 300.0, false).kernel;
        let halves = [sum.log_sf2, sum.log_lin2.unwrap()];
        assert!(
            halves.iter().all(|h| (h - (5f64).ln()).abs() < 1e-12),
            "{halves:?}"
        );
        // One GP per label: Φ is replaced by I, so the kernel takes all of V.
        let independent = started(KernelKind::Linear, 30, 300.0, true);
        assert!((independent.kernel.log_sf2 - 300f64.ln()).abs() < 1e-12);
    }

    #[test]
    fn the_default_prior_variance_starts_as_before() {
        // V = 1 draws Φ from N(0, 1/P) with the same numbers as the start without the
        // option, and leaves the kernel at log σ_f² = 0: runs keep their bits.
        let started = started(KernelKind::Linear, 30, 1.0, false);
        let mut rng = ChaCha8Rng::seed_from_u64(stream_seed(7, streams::INIT, &[]));
        let normal = Normal::new(0.0, (1.0f64 / 30.0).sqrt()).unwrap();
        let first: Vec<f64> = (0..5).map(|_| normal.sample(&mut rng)).collect();
        // Φ is filled column by column: the first draws are column 0's.
        let got: Vec<f64> = (0..5).map(|r| started.phi[(r, 0)]).collect();
        assert_eq!(got, first);
        assert_eq!(started.kernel.log_sf2.to_bits(), 0.0f64.to_bits());
    }

    #[test]
    fn median_distance_of_orthonormal_rows() {
        // Three unit rows along the axes: every pairwise distance is √2.
        let kxx = ndarray::Array2::from_shape_fn((3, 3), |(i, j)| (i == j) as u8 as f32);
        let d = median_distance(kxx.view(), &[1.0, 1.0, 1.0], 10, 0);
        assert!((d - 2f64.sqrt()).abs() < 1e-12);
    }
}
