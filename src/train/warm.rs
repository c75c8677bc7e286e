//! `--warm-start ridge`: μ and Φ from one Newton step of the model's own objective, in
//! closed form, before SVI (`docs/model.md`, "Warm start").
//!
//! At the start every utility is its bias: f_nk = b_k = logit p_k (p_k the label's clamped
//! frequency), and with the sites q(u) the posterior mean of f at a row x is
//! f̄_k(x) = K_xZ w Φ_kᵀ + b_k, linear in the M features K_xZ. So, label by label, take
//! one Newton step of the logistic log likelihood Σ_n log σ(±f_nk) from w_k = 0 under the
//! prior the GP puts on w_k (u = K_Z w ~ N(0, K_Z), so w_k has precision K_Z):
//!
//!   (c_k G + K_Z) w_k = r_k,   G = Σ_n h_n h_nᵀ [M×M],   r_k = Σ_n h_n (y_nk − p_k) [M],
//!
//! with h_n = K_{x_n Z} and c_k = 1/4, Böhning's bound on the logistic curvature (the exact
//! p_k (1 − p_k) lets rare labels, divided by it, take over the ranking: `docs/model.md`,
//! "Warm start"). Every label shares G and K_Z, so one
//! Cholesky K_Z + εI = LLᵀ and one eigendecomposition L⁻¹ G L⁻ᵀ = QΛQᵀ solve all of them:
//! w_k = L⁻ᵀ Q diag(1 / (c λ_i + 1)) Qᵀ L⁻¹ r_k. Then W = [w_1 … w_L] [M×L] is cut to
//! the factor model's rank P: with W Wᵀ = U Σ² Uᵀ (top P), μ = U Σ^½ and Φ = Wᵀ U Σ^-½,
//! so μ Φᵀ = U Uᵀ W, the best rank-P W. A direction W lacks (σ_p ≈ 0) keeps its random Φ
//! column and μ = 0, so no factor starts at the saddle μ_p = Φ_p = 0.

use anyhow::{ensure, Context, Result};
use faer::{Mat, Side};

use crate::linalg::{cholesky_lower, lower_inverse_into, product_add_into, zero_upper};

/// What one pass over the training rows gathers: G = Σ h hᵀ, s = Σ h, T = Σ h yᵀ.
pub struct RowSums {
    /// G [M×M].
    pub gram: Mat<f64>,
    /// s [M].
    pub sum: Vec<f64>,
    /// T [M×L]: column k sums h over the rows with label k.
    pub label_sums: Mat<f64>,
    pub rows: u64,
}

impl RowSums {
    pub fn new(m: usize, labels: usize) -> Self {
        RowSums {
            gram: Mat::zeros(m, m),
            sum: vec![0.0; m],
            label_sums: Mat::zeros(m, labels),
            rows: 0,
        }
    }

    /// Adds a block of rows: `h` [B×M] (their K_bZ) and each row's positive labels.
    pub fn add(&mut self, h: &Mat<f64>, positives: &[Vec<u32>]) {
        let m = h.ncols();
        product_add_into(self.gram.as_mut(), h.transpose(), h.as_ref());
        for (i, labels) in positives.iter().enumerate() {
            for j in 0..m {
                let v = h[(i, j)];
                self.sum[j] += v;
                for &k in labels {
                    self.label_sums[(j, k as usize)] += v;
                }
            }
        }
        self.rows += positives.len() as u64;
    }
}

/// The curvature every label's step uses: the bound 1/4 on the logistic's (Böhning).
const CURVATURE: f64 = 0.25;

/// Relative jitter on K_Z's diagonal: the linear kernel's K_Z has rank ≤ R < M.
const JITTER: f64 = 1e-6;

/// w_k for every label k: the Newton step of the module's doc from the sums, `k_z`
/// [M×M] and the labels' clamped frequencies `p` [L].
pub fn newton_weights(sums: &RowSums, k_z: &Mat<f64>, p: &[f64]) -> Result<Mat<f64>> {
    let m = k_z.nrows();
    let scale = (0..m).map(|i| k_z[(i, i)]).sum::<f64>() / m.max(1) as f64;
    let mut prior = k_z.clone();
    for i in 0..m {
        prior[(i, i)] += JITTER * scale.max(f64::MIN_POSITIVE);
    }
    let l = cholesky_lower(prior).context("warm start: K_Z + εI is not positive definite")?;
    let mut l_inv = Mat::<f64>::zeros(m, m);
    lower_inverse_into(l_inv.as_mut(), l.as_ref());
    zero_upper(l_inv.as_mut());
    // G̃ = L⁻¹ G L⁻ᵀ, symmetrised against rounding.
    let g = &l_inv * &sums.gram * l_inv.transpose();
    let g = Mat::from_fn(m, m, |i, j| 0.5 * (g[(i, j)] + g[(j, i)]));
    let eig = g
        .self_adjoint_eigen(Side::Lower)
        .ok()
        .context("warm start: the eigendecomposition of L⁻¹GL⁻ᵀ did not converge")?;
    let (q, lambda) = (eig.U(), eig.S());
    // R = T − s pᵀ, then Qᵀ L⁻¹ R, row i divided by c λ_i + 1.
    let residual = Mat::from_fn(m, p.len(), |j, k| {
        sums.label_sums[(j, k)] - sums.sum[j] * p[k]
    });
    let mut rotated = q.transpose() * (&l_inv * &residual);
    for i in 0..m {
        let shrink = CURVATURE * lambda[i].max(0.0) + 1.0;
        for k in 0..p.len() {
            rotated[(i, k)] /= shrink;
        }
    }
    Ok(l_inv.transpose() * (q * rotated))
}

/// Relative singular value below which a direction of W is treated as absent: σ comes from
/// an eigenvalue σ² of W Wᵀ, whose rounding (≈ 1e-16 σ₁²) alone is σ ≈ 1e-8 σ₁.
const ABSENT: f64 = 1e-6;

/// (μ [M×P], Φ [L×P]) with μΦᵀ the best rank-P approximation of `w` [M×L]; a direction
/// W lacks keeps `phi_default`'s column and μ = 0 there.
pub fn factors_of(w: &Mat<f64>, p: usize, phi_default: &Mat<f64>) -> Result<(Mat<f64>, Mat<f64>)> {
    let (m, l) = (w.nrows(), w.ncols());
    ensure!(
        phi_default.nrows() == l && phi_default.ncols() == p,
        "internal: Φ's shape"
    );
    let wwt = w * w.transpose();
    let wwt = Mat::from_fn(m, m, |i, j| 0.5 * (wwt[(i, j)] + wwt[(j, i)]));
    let eig = wwt
        .self_adjoint_eigen(Side::Lower)
        .ok()
        .context("warm start: the eigendecomposition of W Wᵀ did not converge")?;
    // Eigenvalues ascend: the top P are the last P, largest first.
    let top: Vec<usize> = (0..p.min(m)).map(|r| m - 1 - r).collect();
    let largest = eig.S()[m - 1].max(0.0).sqrt();
    let mut mu = Mat::<f64>::zeros(m, p);
    let mut phi = phi_default.clone();
    for (r, &i) in top.iter().enumerate() {
        let sigma = eig.S()[i].max(0.0).sqrt();
        if sigma <= ABSENT * largest {
            continue;
        }
        let u = eig.U().col(i);
        let root = sigma.sqrt();
        for j in 0..m {
            mu[(j, r)] = u[j] * root;
        }
        // Φ_r = Wᵀ u / √σ.
        for k in 0..l {
            let dot: f64 = (0..m).map(|j| w[(j, k)] * u[j]).sum();
            phi[(k, r)] = dot / root;
        }
    }
    Ok((mu, phi))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn random(rows: usize, cols: usize, rng: &mut ChaCha8Rng) -> Mat<f64> {
        Mat::from_fn(rows, cols, |_, _| rng.random::<f64>() - 0.5)
    }

    /// The shared-factorisation solve equals each label's own dense solve of
    /// (c_k G + K_Z + εI) w_k = r_k, with K_Z singular (rank 3 of M = 5) as the linear
    /// kernel's is.
    #[test]
    fn newton_weights_solve_each_labels_system() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let (m, n, l) = (5, 40, 4);
        let a = random(m, 3, &mut rng);
        let k_z = &a * a.transpose();
        let h = random(n, m, &mut rng);
        let positives: Vec<Vec<u32>> = (0..n)
            .map(|i| (0..l as u32).filter(|k| (i as u32 + k) % 3 == 0).collect())
            .collect();
        let mut sums = RowSums::new(m, l);
        sums.add(&h, &positives[..]);
        let p: Vec<f64> = (0..l).map(|k| 0.1 + 0.2 * k as f64).collect();
        let w = newton_weights(&sums, &k_z, &p).unwrap();
        let scale = (0..m).map(|i| k_z[(i, i)]).sum::<f64>() / m as f64;
        for k in 0..l {
            let c = CURVATURE;
            let g = h.transpose() * &h;
            let system = Mat::from_fn(m, m, |i, j| {
                c * g[(i, j)] + k_z[(i, j)] + if i == j { JITTER * scale } else { 0.0 }
            });
            let r = Mat::from_fn(m, 1, |j, _| {
                (0..n)
                    .map(|i| h[(i, j)] * (f64::from(positives[i].contains(&(k as u32))) - p[k]))
                    .sum::<f64>()
            });
            let direct = faer::linalg::solvers::Solve::solve(&system.partial_piv_lu(), &r);
            for j in 0..m {
                let (got, want) = (w[(j, k)], direct[(j, 0)]);
                assert!(
                    (got - want).abs() <= 1e-7 * want.abs().max(1.0),
                    "{k} {j}: {got} {want}"
                );
            }
        }
    }

    /// μΦᵀ is W's best rank-P approximation (its top P singular values, from an SVD),
    /// and a rank-deficient W keeps the default Φ column where it has no direction.
    #[test]
    fn factors_are_the_best_rank_p_approximation() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let (m, l, p) = (6, 9, 3);
        let w = random(m, l, &mut rng);
        let phi0 = random(l, p, &mut rng);
        let (mu, phi) = factors_of(&w, p, &phi0).unwrap();
        let approx = &mu * phi.transpose();
        let svd = w.thin_svd().unwrap();
        let best = Mat::from_fn(m, l, |i, k| {
            (0..p)
                .map(|r| svd.U()[(i, r)] * svd.S()[r] * svd.V()[(k, r)])
                .sum::<f64>()
        });
        for i in 0..m {
            for k in 0..l {
                assert!((approx[(i, k)] - best[(i, k)]).abs() < 1e-10);
            }
        }
        // Rank 1: the second and third columns keep Φ's defaults, μ = 0 there.
        let one = Mat::from_fn(m, l, |i, k| (i + 1) as f64 * (k as f64 - 4.0));
        let (mu, phi) = factors_of(&one, p, &phi0).unwrap();
        for r in 1..p {
            assert!((0..m).all(|i| mu[(i, r)] == 0.0));
            assert!((0..l).all(|k| phi[(k, r)] == phi0[(k, r)]));
        }
        let approx = &mu * phi.transpose();
        assert!((0..m).all(|i| (0..l).all(|k| (approx[(i, k)] - one[(i, k)]).abs() < 1e-9)));
    }
}
