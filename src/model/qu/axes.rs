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
//! D·P part is the KL's alone, one pass per GP that also writes its gradient; whatever
//! involves the rows runs over the U features the minibatch touches ([`AxesRows`]), so
//! prediction, which needs no KL, costs O(nnz·P) whatever D. The parameters are the paper
//! form's μ and ρ, [D×P]; A is [0×D] (nothing to train: [`on_axes`]).
//!
//! The P GPs are independent; columns are processed by rayon in fixed chunks and summed in
//! GP order, so results do not depend on the number of threads.

use anyhow::{ensure, Result};
use faer::{Mat, MatRef};
use rayon::prelude::*;

use crate::linalg::{clear_upper_simd_state, column_slice, with_column_major};
use crate::model::kernel::input_space::FeatureRows;
use crate::model::kernel::Rows;
use crate::model::params::{Grads, Params, QParams};
use crate::model::qu::gp_factor::sigma_and_slope;
use crate::model::qu::sites::{chunk_count, chunk_range};
use crate::model::scratch::Scratch;

/// Whether these parameters put the inducing features at the axes: A has no rows (no
/// inducing inputs; every other form has M ≥ 1) while q(u) has one row per feature.
pub fn on_axes(params: &Params) -> bool {
    params.a.nrows() == 0 && params.q.mu().nrows() > 0
}

/// The minibatch's rows as the axes form reads them: sparse, whatever shape they came in,
/// and once more over the features they touch, so that a step's per-GP work on the rows
/// follows the batch's non-zeros and not D.
#[derive(Debug, Clone)]
pub struct AxesRows {
    /// The rows with their feature ids [B×D].
    rows: FeatureRows,
    /// The distinct features the rows touch, increasing [U].
    touched: Vec<usize>,
    /// The same rows with each feature id replaced by its position in `touched` [B×U].
    local: FeatureRows,
}

impl AxesRows {
    /// The rows of `x` [B×D] (sparse kept, dense rows' non-zeros taken). Their feature ids
    /// are below D, as for every sparse row (`FeatureRows::push_checked`).
    pub fn new(x: &Rows<'_>) -> Self {
        let (rows, width) = match x {
            Rows::Sparse { rows, width } => ((*rows).clone(), *width),
            Rows::Dense(m) => (FeatureRows::from_dense(*m), m.ncols()),
        };
        // A position for every feature, marked then numbered in increasing order: O(D + nnz)
        // where sorting the ids would be O(nnz log nnz), and a training step already spends
        // O(D) a GP on the KL.
        const UNSEEN: u32 = u32::MAX;
        let mut position = vec![UNSEEN; width];
        for i in 0..rows.len() {
            for (j, _) in rows.row(i) {
                position[j] = 0;
            }
        }
        let mut touched = Vec::new();
        for (j, slot) in position.iter_mut().enumerate() {
            if *slot != UNSEEN {
                *slot = touched.len() as u32;
                touched.push(j);
            }
        }
        let mut local = FeatureRows::new();
        let mut ids = Vec::new();
        for i in 0..rows.len() {
            ids.clear();
            ids.extend(rows.row(i).map(|(j, _)| position[j]));
            local.push_row(&ids, rows.row(i).map(|(_, v)| v));
        }
        AxesRows {
            rows,
            touched,
            local,
        }
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

/// Σ and dΣ/dρ at the entries `ids` of one column of ρ.
fn sites_at(rho: &[f64], ids: &[usize]) -> (Vec<f64>, Vec<f64>) {
    ids.iter().map(|&j| sigma_and_slope(rho[j])).unzip()
}

/// S = σ² Σ / (σ² + Σ), the weight's variance under q.
fn covariance(sigma: f64, sf2: f64) -> f64 {
    sf2 * sigma / (sf2 + sigma)
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
    /// Per GP: Σ_p and dΣ_p/dρ_p at the batch's features [U].
    touched_sites: Vec<TouchedSites>,
    /// The KL's gradients, which reach every feature; the backward pass takes them and adds
    /// the data terms at the batch's features (None once taken).
    kl_grads: Option<AxesGrads>,
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

/// The sites of one column at the batch's features: Σ and dΣ/dρ [U].
type TouchedSites = (Vec<f64>, Vec<f64>);

/// One weight's share of 2·KL_p: σ² μ² − 1 + t − ln t with t = Σ / (σ² + Σ).
fn twice_kl_entry(mu: f64, sigma: f64, sf2: f64) -> f64 {
    let t = sigma / (sf2 + sigma);
    sf2 * mu * mu - 1.0 + t - t.ln()
}

/// One column's pass over every feature: KL_p, and the KL's part of the gradients written
/// into `g_mu` = −∂KL_p/∂μ_p and `g_rho` = −∂KL_p/∂ρ_p [D]; returns (KL_p,
/// −∂KL_p/∂log σ², the sites at `touched`, gathered on the way so that no site is computed
/// twice). With c = σ² + Σ and t = Σ / c: KL_p = ½ Σ_j [σ² μ_j² − 1 + t_j − ln t_j],
/// −∂KL/∂μ_j = −σ² μ_j, −∂KL/∂Σ_j = σ⁴/(2 Σ_j c_j²) (times logistic(ρ_j) for ρ) and
/// −∂KL/∂log σ² = −½ Σ_j [σ⁴/c_j² + σ² μ_j²]. The step's dearest arithmetic: one exp, one
/// log1p and one log per weight, each weight read once and each gradient entry written once.
fn kl_column_and_grads(
    (mu, rho): (&[f64], &[f64]),
    sf2: f64,
    touched: &[usize],
    (g_mu, g_rho): (&mut [f64], &mut [f64]),
) -> (f64, f64, TouchedSites) {
    let (mut kl, mut kl_sf2) = (0.0, 0.0);
    let mut sites: TouchedSites = (
        Vec::with_capacity(touched.len()),
        Vec::with_capacity(touched.len()),
    );
    let mut next = touched.iter().copied().peekable();
    for (j, (&m, &r)) in mu.iter().zip(rho).enumerate() {
        let (sigma, slope) = sigma_and_slope(r);
        if next.next_if_eq(&j).is_some() {
            sites.0.push(sigma);
            sites.1.push(slope);
        }
        kl += twice_kl_entry(m, sigma, sf2);
        let c = sf2 + sigma;
        let w = sf2 * sf2 / (c * c);
        kl_sf2 += w + sf2 * m * m;
        g_mu[j] = -sf2 * m;
        g_rho[j] = w * (0.5 / sigma) * slope;
    }
    (0.5 * kl, -0.5 * kl_sf2, sites)
}

/// KL_p of one column alone.
fn kl_column(mu: &[f64], rho: &[f64], sf2: f64) -> f64 {
    let sum: f64 = mu
        .iter()
        .zip(rho)
        .map(|(&m, &r)| twice_kl_entry(m, sigma_and_slope(r).0, sf2))
        .sum();
    0.5 * sum
}

/// m_p = σ² X_b μ_p and s_p = (X_b∘X_b) S_p [B] of one column, from the sites at the
/// batch's features: nnz work, whatever D.
fn marginals_column(x: &AxesRows, mu: &[f64], sigma: &[f64], sf2: f64) -> (Vec<f64>, Vec<f64>) {
    let cov: Vec<f64> = sigma.iter().map(|&s| covariance(s, sf2)).collect();
    let mean = rows_dot(&x.rows, mu, false)
        .into_iter()
        .map(|v| sf2 * v)
        .collect();
    (mean, rows_dot(&x.local, &cov, true))
}

/// One column's forward results: m_p, s_p [B], KL_p, −∂KL_p/∂log σ² and the sites at the
/// batch's features.
type ColumnForward = (Vec<f64>, Vec<f64>, f64, f64, TouchedSites);

/// Marginals at the rows, Σ_p KL_p, its gradients and the sites the backward pass reuses
/// (a training step). The gradient matrices [D×P] are taken from `scratch`, where the
/// trainer hands them back after its update ([`recycle_grads`]): at D·P in the tens of
/// millions, fresh ones would cost a page fault for every 512 weights, every step.
pub fn forward(params: &Params, x: &AxesRows, scratch: &Scratch) -> Result<AxesForward> {
    let mu = params.q.mu();
    let d = mu.nrows();
    check(params, d)?;
    let rho = params.q.rho().expect("checked");
    let sf2 = sf2(params);
    let (b, p_count) = (x.len(), mu.ncols());
    let columns = |p: usize| (column_slice(mu.as_ref(), p), column_slice(rho.as_ref(), p));
    // Every entry is written by the KL pass before anything reads it.
    let mut g_mu = scratch.take_mat(d, p_count);
    let mut g_rho = scratch.take_mat(d, p_count);
    // Each column is one task's sequential loop, so the bits do not depend on the threads;
    // each task first clears the AVX upper state (see `per_gp`).
    let cols: Vec<ColumnForward> = g_mu
        .par_col_iter_mut()
        .zip(g_rho.par_col_iter_mut())
        .enumerate()
        .map(|(p, (gm, gr))| {
            clear_upper_simd_state();
            let gm = gm.try_as_col_major_mut().expect("a column").as_slice_mut();
            let gr = gr.try_as_col_major_mut().expect("a column").as_slice_mut();
            let (kl_p, kl_sf2, sites) = kl_column_and_grads(columns(p), sf2, &x.touched, (gm, gr));
            let (mean, var) = marginals_column(x, columns(p).0, &sites.0, sf2);
            (mean, var, kl_p, kl_sf2, sites)
        })
        .collect();
    let kl_grads = AxesGrads {
        mu: g_mu,
        rho: g_rho,
        log_sf2: cols.iter().map(|c| c.3).sum(),
    };
    Ok(AxesForward {
        mean: Mat::from_fn(b, p_count, |i, p| cols[p].0[i]),
        var: Mat::from_fn(b, p_count, |i, p| cols[p].1[i]),
        kl: cols.iter().map(|c| c.2).sum(),
        touched_sites: cols.into_iter().map(|c| c.4).collect(),
        kl_grads: Some(kl_grads),
    })
}

/// The marginals (m, s) [B×P] at the rows alone (prediction): only the batch's features are
/// read, so the cost follows the rows' non-zeros, not D.
pub fn marginals(params: &Params, x: &AxesRows) -> Result<(Mat<f64>, Mat<f64>)> {
    let mu = params.q.mu();
    check(params, mu.nrows())?;
    let rho = params.q.rho().expect("checked");
    let sf2 = sf2(params);
    let cols = per_gp(mu.ncols(), |p| {
        let (sigma, _) = sites_at(column_slice(rho.as_ref(), p), &x.touched);
        marginals_column(x, column_slice(mu.as_ref(), p), &sigma, sf2)
    });
    let (b, p_count) = (x.len(), cols.len());
    Ok((
        Mat::from_fn(b, p_count, |i, p| cols[p].0[i]),
        Mat::from_fn(b, p_count, |i, p| cols[p].1[i]),
    ))
}

/// Hands the gradient matrices of q(u) [D×P] back to `scratch` for the next step's
/// [`forward`], when `grads` are the axes form's (other forms' are left to drop).
pub fn recycle_grads(grads: Grads, scratch: &Scratch) {
    if !on_axes(&grads) {
        return;
    }
    if let QParams::Sites { mu, rho } = grads.q {
        scratch.give_mat(mu);
        scratch.give_mat(rho);
    }
}

/// Σ_p KL_p alone.
pub fn kl_total(params: &Params) -> Result<f64> {
    let mu = params.q.mu();
    check(params, mu.nrows())?;
    let rho = params.q.rho().expect("checked");
    let sf2 = sf2(params);
    let per = per_gp(mu.ncols(), |p| {
        kl_column(
            column_slice(mu.as_ref(), p),
            column_slice(rho.as_ref(), p),
            sf2,
        )
    });
    Ok(per.into_iter().sum())
}

/// `n` zeros written one by one, not `vec![0.0; n]`. The latter is `calloc`: on memory the
/// allocator takes fresh from the system it writes nothing, so the first `+=` of the
/// scatter below reads a page before writing it; the kernel maps its shared zero page for
/// the read and must then replace it for the write, flushing the other threads' TLBs by
/// interrupt (measured at D-long buffers: a fifth of a step at D = 203 882, P = 41).
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
/// The KL's terms reach every feature and come from the forward pass (taken from `fwd`:
/// a forward pass serves one backward pass); the data terms are summed over the batch's
/// features (U per GP) and added there.
pub fn backward(
    params: &Params,
    x: &AxesRows,
    fwd: &mut AxesForward,
    g_mean: MatRef<'_, f64>,
    g_var: MatRef<'_, f64>,
) -> Result<AxesGrads> {
    let mu = params.q.mu();
    let d = mu.nrows();
    check(params, d)?;
    let u = x.touched.len();
    ensure!(
        fwd.touched_sites.len() == mu.ncols() && fwd.touched_sites.iter().all(|s| s.0.len() == u),
        "internal: the axes' backward pass needs a forward pass with the KL of these rows"
    );
    let Some(mut grads) = fwd.kl_grads.take() else {
        anyhow::bail!("internal: the axes' forward pass has no KL gradients (taken already?)");
    };
    let sf2 = sf2(params);
    let data = per_gp(mu.ncols(), |p| {
        let (sigma, _) = &fwd.touched_sites[p];
        // Xᵀ g_m and (X∘X)ᵀ g_s over the batch's features, in row order.
        let mut xt_gm = written_zeros(u);
        let mut xt_gs = written_zeros(u);
        // ∂m/∂log σ² = m (the forward pass's means); ∂s/∂log σ² from the sites.
        let mut data_sf2 = 0.0;
        for i in 0..x.local.len() {
            let (gm, gs) = (g_mean[(i, p)], g_var[(i, p)]);
            let mut ds_i = 0.0;
            for (k, v) in x.local.row(i) {
                xt_gm[k] += v * gm;
                xt_gs[k] += v * v * gs;
                // ∂S/∂log σ² = S Σ / (σ² + Σ) = σ² Σ² / (σ² + Σ)².
                let t = sigma[k] / (sf2 + sigma[k]);
                ds_i += v * v * sf2 * t * t;
            }
            data_sf2 += gm * fwd.mean[(i, p)] + gs * ds_i;
        }
        (xt_gm, xt_gs, data_sf2)
    });
    for (p, (xt_gm, xt_gs, data_sf2)) in data.into_iter().enumerate() {
        let (sigma, slope) = &fwd.touched_sites[p];
        let g_mu = grads.mu.col_as_slice_mut(p);
        for (k, &j) in x.touched.iter().enumerate() {
            g_mu[j] += sf2 * xt_gm[k];
        }
        let g_rho = grads.rho.col_as_slice_mut(p);
        for (k, &j) in x.touched.iter().enumerate() {
            let c = sf2 + sigma[k];
            g_rho[j] += sf2 * sf2 / (c * c) * xt_gs[k] * slope[k];
        }
        grads.log_sf2 += data_sf2;
    }
    Ok(grads)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The rows' entries as (feature, value) pairs, row by row.
    fn entries(rows: &FeatureRows) -> Vec<Vec<(usize, f64)>> {
        (0..rows.len()).map(|i| rows.row(i).collect()).collect()
    }

    #[test]
    fn rows_are_renumbered_over_the_features_they_touch_in_increasing_order() {
        let mut rows = FeatureRows::new();
        rows.push_row(&[3, 7], [1.0, 2.0]);
        rows.push_row(&[], []);
        rows.push_row(&[1, 7, 9], [0.5, -1.5, 4.0]);
        let x = AxesRows::new(&Rows::Sparse {
            rows: &rows,
            width: 12,
        });
        assert_eq!(x.touched, vec![1, 3, 7, 9]);
        assert_eq!(
            entries(&x.local),
            vec![
                vec![(1, 1.0), (2, 2.0)],
                vec![],
                vec![(0, 0.5), (2, -1.5), (3, 4.0)],
            ]
        );
        assert_eq!(entries(&x.rows), entries(&rows));
    }

    #[test]
    fn dense_rows_touch_their_non_zero_columns() {
        let m = Mat::from_fn(2, 5, |i, j| {
            if (i + j) % 3 == 0 {
                1.0 + j as f64
            } else {
                0.0
            }
        });
        let x = AxesRows::new(&Rows::Dense(m.as_ref()));
        // Row 0: columns 0 and 3; row 1: columns 2.
        assert_eq!(x.touched, vec![0, 2, 3]);
        assert_eq!(
            entries(&x.local),
            vec![vec![(0, 1.0), (2, 4.0)], vec![(1, 3.0)]]
        );
    }
}
