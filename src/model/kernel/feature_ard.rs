//! Automatic relevance determination over the D input features (`--ard features`,
//! `docs/model.md`, section "ARD over the D features"): the journal version of Panos,
//! Dellaportas & Titsias, *Fully Scalable Gaussian Processes using Subspace Inducing
//! Inputs*, gives the linear and SE kernels one weight per input dimension.
//!
//! With W = diag(w), w_d = exp(log w_d), every input goes through x ↦ W^{1/2} x, the
//! inducing inputs through z ↦ W^{1/2} z with Z = A X̃ as without ARD. Through the basis the
//! kernel then sees, with A unchanged,
//! - Kxx'_b = X_b W X̃ᵀ [B×R] (the minibatch's sparse rows times the weighted basis),
//! - K'_X̃ = X̃ W X̃ᵀ [R×R],
//! - n'_i = Σ_d w_d x_id² [B],
//!
//! so ⟨W^{1/2}x_i, W^{1/2}z_m⟩ = (Kxx'_b Aᵀ)_im and ⟨W^{1/2}z_m, W^{1/2}z_l⟩ =
//! (A K'_X̃ Aᵀ)_ml: the model is the one without ARD evaluated at these inputs. This file
//! computes them ([`FeatureWarp::new`]) and maps the kernel's ∂F/∂Kxx'_b, ∂F/∂K'_X̃ and
//! ∂F/∂n' (`KernelKind::input_grads`) to ∂F/∂log w ([`FeatureWarp::backward`]).
//! Cost per step: nnz·R (Kxx') + 2DR² (K'_X̃) forward, nnz·R + 2DR² + DR backward.

use anyhow::{ensure, Result};
use faer::{Mat, MatRef};

pub use crate::model::kernel::input_space::FeatureRows;
use crate::model::kernel::{BasisInputs, InputGrads};

/// The data feature ARD reads: the minibatch's sparse rows and the basis X̃ [R×D] (f64).
#[derive(Debug, Clone, Copy)]
pub struct FeatureInputs<'a> {
    pub rows: &'a FeatureRows,
    pub basis: MatRef<'a, f64>,
}

impl FeatureInputs<'_> {
    /// An error unless the rows' features and `log_w` fit the basis's D columns.
    pub fn check(&self, log_w: &[f64]) -> Result<()> {
        let d = self.basis.ncols();
        ensure!(
            log_w.len() == d,
            "{} feature ARD weights for a basis over {d} features",
            log_w.len()
        );
        ensure!(
            self.rows.width() <= d,
            "a row holds feature {} outside the basis's {d} features",
            self.rows.width() - 1
        );
        Ok(())
    }
}

/// w_d = exp(log w_d).
fn weights(log_w: &[f64]) -> Vec<f64> {
    log_w.iter().map(|l| l.exp()).collect()
}

/// X̃ W [R×D]: column d of the basis times w_d (exactly the basis when w = 1).
fn scaled_basis(w: &[f64], basis: MatRef<'_, f64>) -> Mat<f64> {
    Mat::from_fn(basis.nrows(), basis.ncols(), |r, d| basis[(r, d)] * w[d])
}

/// K'_X̃ = X̃ W X̃ᵀ [R×R] for weights `log_w` [D] and the basis `basis` [R×D] (2DR²).
pub fn weighted_gram(log_w: &[f64], basis: MatRef<'_, f64>) -> Mat<f64> {
    scaled_basis(&weights(log_w), basis) * basis.transpose()
}

/// One minibatch's inputs after x ↦ W^{1/2} x, with what [`FeatureWarp::backward`] needs.
#[derive(Debug, Clone)]
pub struct FeatureWarp {
    /// w [D].
    w: Vec<f64>,
    /// Kxx'_b [B×R].
    pub kxx_b: Mat<f64>,
    /// n' [B].
    pub sq_norms: Vec<f64>,
    /// K'_X̃ [R×R].
    pub k_tilde: Mat<f64>,
}

impl FeatureWarp {
    /// The weighted inputs of the rows of `x` under weights `log_w` [D].
    pub fn new(log_w: &[f64], x: &FeatureInputs<'_>) -> Self {
        let w = weights(log_w);
        let basis_w = scaled_basis(&w, x.basis);
        FeatureWarp {
            kxx_b: x.rows.project(basis_w.as_ref()),
            sq_norms: x.rows.weighted_sq_norms(Some(&w)),
            k_tilde: &basis_w * x.basis.transpose(),
            w,
        }
    }

    /// The inputs as the kernel sees them.
    pub fn inputs(&self) -> BasisInputs<'_> {
        BasisInputs {
            kxx_b: self.kxx_b.as_ref().into(),
            sq_norms: &self.sq_norms,
            k_tilde: self.k_tilde.as_ref().into(),
        }
    }

    /// ∂F/∂log w [D] from the kernel's input gradients `g` (with ∂K'_X̃), `x` the
    /// unweighted rows and basis:
    /// ∂F/∂w_d = Σ_{i: x_id ≠ 0} x_id [(∂Kxx'_b)_i· x̃_d + (∂n')_i x_id] + x̃_dᵀ ∂K'_X̃ x̃_d,
    /// x̃_d = column d of X̃, and ∂F/∂log w_d = w_d ∂F/∂w_d.
    pub fn backward(&self, x: &FeatureInputs<'_>, g: &InputGrads) -> Vec<f64> {
        let d_count = x.basis.ncols();
        // x̃_dᵀ Ḡ x̃_d for every d: the columns of Ḡ X̃ [R×D] against those of X̃.
        let g_basis = &g.k_tilde * x.basis;
        let mut grad: Vec<f64> = (0..d_count)
            .map(|d| {
                x.basis
                    .col(d)
                    .iter()
                    .zip(g_basis.col(d).iter())
                    .map(|(b, q)| b * q)
                    .sum()
            })
            .collect();
        // [R×B]: row i's gradient as a contiguous column.
        let g_kxx_t = g.kxx_b.transpose().to_owned();
        for i in 0..x.rows.len() {
            let g_row = g_kxx_t.col(i);
            for (d, v) in x.rows.row(i) {
                let along: f64 = g_row
                    .iter()
                    .zip(x.basis.col(d).iter())
                    .map(|(a, b)| a * b)
                    .sum();
                grad[d] += v * (along + g.sq_norms[i] * v);
            }
        }
        grad.iter().zip(&self.w).map(|(g, w)| g * w).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linalg::inner;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Sparse rows over D = 7 features (about half the entries zero) and a basis [3×7].
    fn problem(seed: u64) -> (FeatureRows, Mat<f64>, Vec<f64>) {
        let (b, d, r) = (5, 7, 3);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut rows = FeatureRows::new();
        for _ in 0..b {
            let ids: Vec<u32> = (0..d as u32)
                .filter(|_| rng.random::<f64>() < 0.5)
                .collect();
            let vals: Vec<f64> = ids.iter().map(|_| rng.random::<f64>() - 0.5).collect();
            rows.push_row(&ids, vals);
        }
        let basis = Mat::from_fn(r, d, |_, _| rng.random::<f64>() - 0.5);
        let log_w = (0..d).map(|_| rng.random::<f64>() * 2.0 - 1.0).collect();
        (rows, basis, log_w)
    }

    fn dense(rows: &FeatureRows, d: usize) -> Mat<f64> {
        let mut x = Mat::<f64>::zeros(rows.len(), d);
        for i in 0..rows.len() {
            for (j, v) in rows.row(i) {
                x[(i, j)] = v;
            }
        }
        x
    }

    /// The weighted inputs equal inner products of explicitly scaled dense vectors.
    #[test]
    fn warp_equals_explicitly_scaled_inputs() {
        let (rows, basis, log_w) = problem(1);
        let x = FeatureInputs {
            rows: &rows,
            basis: basis.as_ref(),
        };
        let warp = FeatureWarp::new(&log_w, &x);
        let sqrt_w = Mat::from_fn(
            7,
            7,
            |i, j| if i == j { (0.5 * log_w[i]).exp() } else { 0.0 },
        );
        let xs = dense(&rows, 7) * &sqrt_w;
        let bs = &basis * &sqrt_w;
        assert!((&xs * bs.transpose() - &warp.kxx_b).norm_max() < 1e-14);
        assert!((&bs * bs.transpose() - &warp.k_tilde).norm_max() < 1e-14);
        for i in 0..5 {
            let n: f64 = xs.row(i).iter().map(|v| v * v).sum();
            assert!((warp.sq_norms[i] - n).abs() < 1e-14);
        }
    }

    /// At w = 1 the inputs are the unweighted projection, Gram and norms bit for bit.
    #[test]
    fn unit_weights_give_the_plain_inputs_bitwise() {
        let (rows, basis, _) = problem(2);
        let x = FeatureInputs {
            rows: &rows,
            basis: basis.as_ref(),
        };
        let warp = FeatureWarp::new(&[0.0; 7], &x);
        assert_eq!(warp.kxx_b, rows.project(basis.as_ref()));
        assert_eq!(warp.k_tilde, &basis * basis.transpose());
        let plain = rows.weighted_sq_norms(None);
        assert_eq!(
            warp.sq_norms
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>(),
            plain.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }

    /// F = ⟨P, Kxx'⟩ + ⟨Q, K'_X̃⟩ + ⟨q, n'⟩ for fixed random P, Q (not symmetric), q.
    #[test]
    fn backward_matches_central_differences() {
        let (rows, basis, log_w) = problem(3);
        let x = FeatureInputs {
            rows: &rows,
            basis: basis.as_ref(),
        };
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let mut u = || rng.random::<f64>() - 0.5;
        let g = InputGrads {
            kxx_b: Mat::from_fn(5, 3, |_, _| u()),
            k_tilde: Mat::from_fn(3, 3, |_, _| u()),
            sq_norms: (0..5).map(|_| u()).collect(),
        };
        let f = |lw: &[f64]| {
            let w = FeatureWarp::new(lw, &x);
            inner(g.kxx_b.as_ref(), w.kxx_b.as_ref())
                + inner(g.k_tilde.as_ref(), w.k_tilde.as_ref())
                + g.sq_norms
                    .iter()
                    .zip(&w.sq_norms)
                    .map(|(a, b)| a * b)
                    .sum::<f64>()
        };
        let grad = FeatureWarp::new(&log_w, &x).backward(&x, &g);
        let h = 1e-6;
        for d in 0..7 {
            let (mut up, mut dn) = (log_w.clone(), log_w.clone());
            up[d] += h;
            dn[d] -= h;
            let fd = (f(&up) - f(&dn)) / (2.0 * h);
            let rel = (grad[d] - fd).abs() / grad[d].abs().max(fd.abs()).max(1e-8);
            assert!(rel < 1e-6, "log w[{d}]: {} vs {fd}", grad[d]);
        }
    }
}
