//! The paper's q(u) with the linear kernel's inducing features at the D coordinate axes
//! (`--inducing-inputs axes`; `docs/model.md`, "Inducing features at the axes").
//!
//! With k(x, x') = σ² xᵀx' and Z = I_D (u = w, the weights of h(x) = wᵀx), K_Z = σ² I_D,
//! K_bZ = σ² X_b and k_ii = σ²‖x_i‖²: the conditional h | u is exact, and the paper's form
//! q(u_p) = N(K_Z μ_p, (K_Z⁻¹ + Σ_p⁻¹)⁻¹) with diagonal Σ_p has a diagonal covariance
//! S_p = σ² Σ_p / (σ² + Σ_p). Everything is then elementwise or sparse:
//!
//! - m_ip = σ² x_iᵀ μ_p,
//! - s_ip = k_ii − k_iᵀ C_p⁻¹ k_i = Σ_j x_ij² S_pj (no cancellation),
//! - KL_p = ½ Σ_j [σ² μ_pj² − 1 + t_pj − ln t_pj], t = Σ / (σ² + Σ),
//!
//! so a step costs O(nnz·P + D·P) where the M×M algebra of `qu/sites/` costs O(M³·P). The
//! parameters are the paper form's μ and ρ, [D×P]; A is [0×D] (nothing to train:
//! [`on_axes`]).
//!
//! The P GPs are independent; columns are processed by rayon in fixed chunks and summed in
//! GP order, so results do not depend on the number of threads.

use anyhow::{ensure, Result};
use faer::{Mat, MatRef};
use rayon::prelude::*;

use crate::linalg::{clear_upper_simd_state, column_slice, with_column_major};
use crate::model::kernel::input_space::FeatureRows;
use crate::model::kernel::Rows;
use crate::model::params::Params;
use crate::model::qu::gp_factor::sigma_and_slope;
use crate::model::qu::sites::{chunk_count, chunk_range};

/// Whether these parameters put the inducing features at the axes: A has no rows (no
/// inducing inputs; every other form has M ≥ 1) while q(u) has one row per feature.
pub fn on_axes(params: &Params) -> bool {
    params.a.nrows() == 0 && params.q.mu().nrows() > 0
}

/// The minibatch's rows as the axes form reads them: sparse, whatever shape they came in.
#[derive(Debug, Clone)]
pub struct AxesRows {
    rows: FeatureRows,
}

impl AxesRows {
    /// The rows of `x` [B×D] (sparse kept, dense rows' non-zeros taken). Their feature ids
    /// are below D, as for every sparse row (`FeatureRows::push_checked`).
    pub fn new(x: &Rows<'_>) -> Self {
        let rows = match x {
            Rows::Sparse { rows, .. } => (*rows).clone(),
            Rows::Dense(m) => FeatureRows::from_dense(*m),
        };
        AxesRows { rows }
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

/// σ² of the linear kernel.
fn sf2(params: &Params) -> f64 {
    params.kernel.log_sf2.exp()
}

/// Σ_pj and dΣ/dρ of column p (the step's dearest arithmetic: D·P transcendentals).
fn sites_and_slopes(rho: &[f64]) -> (Vec<f64>, Vec<f64>) {
    rho.iter().map(|&r| sigma_and_slope(r)).unzip()
}

/// S_pj = σ² Σ_pj / (σ² + Σ_pj).
fn covariances(sigma: &[f64], sf2: f64) -> Vec<f64> {
    sigma.iter().map(|&s| sf2 * s / (sf2 + s)).collect()
}

/// KL_p of one column: ½ Σ_j [σ² μ_j² − 1 + t_j − ln t_j], t = Σ / (σ² + Σ).
fn kl_column(mu: &[f64], sigma: &[f64], sf2: f64) -> f64 {
    let sum: f64 = mu
        .iter()
        .zip(sigma)
        .map(|(&m, &s)| {
            let t = s / (sf2 + s);
            sf2 * m * m - 1.0 + t - t.ln()
        })
        .sum();
    0.5 * sum
}

/// Runs `f` over the columns of P GPs in the sites form's fixed chunks (`qu/sites`, so the
/// bits do not depend on the thread count); results in GP order. Each task first clears
/// the AVX upper state a faer GEMM on its thread may have left (`linalg`): the columns'
/// exp and log calls would otherwise run many times slower.
fn per_gp<T: Send>(p_count: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let chunks: Vec<Vec<T>> = (0..chunk_count(p_count))
        .into_par_iter()
        .map(|c| {
            clear_upper_simd_state();
            chunk_range(c, p_count).map(&f).collect()
        })
        .collect();
    chunks.into_iter().flatten().collect()
}

/// Marginals and KL of every GP, and what the backward pass reuses.
#[derive(Debug, Clone)]
pub struct AxesForward {
    /// m [B×P].
    pub mean: Mat<f64>,
    /// s [B×P].
    pub var: Mat<f64>,
    /// Σ_p KL_p.
    pub kl: f64,
    /// Per GP: Σ_p and dΣ_p/dρ_p [D] (empty without the KL: prediction keeps nothing).
    sites: Vec<(Vec<f64>, Vec<f64>)>,
}

/// Σ_nnz x_ij w_j for every row [B].
fn rows_dot(rows: &FeatureRows, w: &[f64], square: bool) -> Vec<f64> {
    (0..rows.len())
        .map(|i| {
            rows.row(i)
                .map(|(j, v)| if square { v * v * w[j] } else { v * w[j] })
                .sum()
        })
        .collect()
}

/// An error unless μ and ρ are the sites form's, with `d` rows.
pub(crate) fn check(params: &Params, d: usize) -> Result<()> {
    let (mu, rho) = (params.q.mu(), params.q.rho());
    ensure!(
        rho.is_some_and(|r| r.nrows() == d && r.ncols() == mu.ncols()) && mu.nrows() == d,
        "internal: inducing features at {d} axes need the paper's q(u) form with μ and ρ of \
         {d} rows"
    );
    Ok(())
}

/// Marginals at the rows and, with `kl` (a training step), Σ_p KL_p and the sites the
/// backward pass reuses (0 and nothing without).
pub fn forward(params: &Params, x: &AxesRows, kl: bool) -> Result<AxesForward> {
    let mu = params.q.mu();
    let d = mu.nrows();
    check(params, d)?;
    let rho = params.q.rho().expect("checked");
    let sf2 = sf2(params);
    let mut cols = per_gp(mu.ncols(), |p| {
        let (mu_p, rho_p) = (column_slice(mu.as_ref(), p), column_slice(rho.as_ref(), p));
        let (sigma, slope) = sites_and_slopes(rho_p);
        let cov = covariances(&sigma, sf2);
        let mean: Vec<f64> = rows_dot(&x.rows, mu_p, false)
            .into_iter()
            .map(|v| sf2 * v)
            .collect();
        let var = rows_dot(&x.rows, &cov, true);
        let kl_p = if kl {
            kl_column(mu_p, &sigma, sf2)
        } else {
            0.0
        };
        let kept = if kl {
            (sigma, slope)
        } else {
            Default::default()
        };
        (mean, var, kl_p, kept)
    });
    let b = x.len();
    Ok(AxesForward {
        mean: Mat::from_fn(b, cols.len(), |i, p| cols[p].0[i]),
        var: Mat::from_fn(b, cols.len(), |i, p| cols[p].1[i]),
        kl: cols.iter().map(|c| c.2).sum(),
        sites: cols.iter_mut().map(|c| std::mem::take(&mut c.3)).collect(),
    })
}

/// Σ_p KL_p alone.
pub fn kl_total(params: &Params) -> Result<f64> {
    let mu = params.q.mu();
    check(params, mu.nrows())?;
    let rho = params.q.rho().expect("checked");
    let sf2 = sf2(params);
    let per = per_gp(mu.ncols(), |p| {
        let (sigma, _) = sites_and_slopes(column_slice(rho.as_ref(), p));
        kl_column(column_slice(mu.as_ref(), p), &sigma, sf2)
    });
    Ok(per.into_iter().sum())
}

/// `n` zeros written one by one, not `vec![0.0; n]`. The latter is `calloc`: on memory the
/// allocator takes fresh from the system it writes nothing, so the first `+=` of the
/// scatter below reads a page before writing it; the kernel maps its shared zero page for
/// the read and must then replace it for the write, flushing the other threads' TLBs by
/// interrupt. At D = 203 882 and P = 41 those faults were a fifth of an axes step's time.
fn written_zeros(n: usize) -> Vec<f64> {
    let mut v = Vec::with_capacity(n);
    v.resize(n, 0.0);
    v
}

/// Gradients of F = ⟨G_m, m⟩ + ⟨G_s, s⟩ − Σ_p KL_p.
#[derive(Debug, Clone)]
pub struct AxesGrads {
    /// ∂F/∂μ [D×P].
    pub mu: Mat<f64>,
    /// ∂F/∂ρ [D×P].
    pub rho: Mat<f64>,
    /// ∂F/∂log σ².
    pub log_sf2: f64,
}

/// With c = σ² + Σ (`docs/model.md`, "Inducing features at the axes"):
/// - ∂F/∂μ_p = σ² X_bᵀ g_m,p − σ² μ_p;
/// - ∂F/∂Σ_pj = σ⁴/c² · [(X_b∘X_b)ᵀ g_s,p]_j + σ⁴/(2 Σ c²); ∂ρ = ∂Σ · logistic(ρ);
/// - ∂F/∂log σ² = ⟨G_m, m⟩ + Σ_ip g_s,ip Σ_j x_ij² S_pj Σ_pj / c_pj − ½ Σ_pj [σ⁴/c² + σ² μ²].
///
/// The data terms are scattered into the features the batch touches; the KL's reach every
/// feature (D·P).
pub fn backward(
    params: &Params,
    x: &AxesRows,
    fwd: &AxesForward,
    g_mean: MatRef<'_, f64>,
    g_var: MatRef<'_, f64>,
) -> Result<AxesGrads> {
    let mu = params.q.mu();
    let d = mu.nrows();
    check(params, d)?;
    ensure!(
        fwd.sites.len() == mu.ncols() && fwd.sites.iter().all(|s| s.0.len() == d),
        "internal: the axes' backward pass needs a forward pass with the KL"
    );
    let sf2 = sf2(params);
    let cols = per_gp(mu.ncols(), |p| {
        let mu_p = column_slice(mu.as_ref(), p);
        let (sigma, slope) = &fwd.sites[p];
        // Xᵀ g_m and (X∘X)ᵀ g_s over the batch's features, in row order.
        let mut xt_gm = written_zeros(d);
        let mut xt_gs = written_zeros(d);
        // ∂m/∂log σ² = m (the forward pass's means); ∂s/∂log σ² from the sites.
        let mut data_sf2 = 0.0;
        for i in 0..x.rows.len() {
            let (gm, gs) = (g_mean[(i, p)], g_var[(i, p)]);
            let mut ds_i = 0.0;
            for (j, v) in x.rows.row(i) {
                xt_gm[j] += v * gm;
                xt_gs[j] += v * v * gs;
                // ∂S/∂log σ² = S Σ / (σ² + Σ) = σ² Σ² / (σ² + Σ)².
                let t = sigma[j] / (sf2 + sigma[j]);
                ds_i += v * v * sf2 * t * t;
            }
            data_sf2 += gm * fwd.mean[(i, p)] + gs * ds_i;
        }
        let mut kl_sf2 = 0.0;
        let mut g_rho = xt_gs;
        for j in 0..d {
            let c = sf2 + sigma[j];
            let w = sf2 * sf2 / (c * c);
            g_rho[j] = w * (g_rho[j] + 0.5 / sigma[j]) * slope[j];
            kl_sf2 += w + sf2 * mu_p[j] * mu_p[j];
        }
        let mut g_mu = xt_gm;
        for (g, &m) in g_mu.iter_mut().zip(mu_p) {
            *g = sf2 * (*g - m);
        }
        (g_mu, g_rho, data_sf2 - 0.5 * kl_sf2)
    });
    let p_count = cols.len();
    Ok(AxesGrads {
        mu: Mat::from_fn(d, p_count, |j, p| cols[p].0[j]),
        rho: Mat::from_fn(d, p_count, |j, p| cols[p].1[j]),
        log_sf2: cols.iter().map(|c| c.2).sum(),
    })
}

/// The weights w = σ² μ [D×P] of the marginal means m = X_b w (prediction's ranking).
pub fn mean_weights(params: &Params) -> Mat<f64> {
    let sf2 = sf2(params);
    let mu = params.q.mu();
    Mat::from_fn(mu.nrows(), mu.ncols(), |j, p| sf2 * mu[(j, p)])
}

/// m = X_b w [B×P] for weights w [D×P] of [`mean_weights`].
pub fn mean_given(x: &AxesRows, weights: MatRef<'_, f64>) -> Mat<f64> {
    with_column_major(weights, |weights| {
        let cols = per_gp(weights.ncols(), |p| {
            rows_dot(&x.rows, column_slice(weights, p), false)
        });
        Mat::from_fn(x.len(), cols.len(), |i, p| cols[p][i])
    })
}
