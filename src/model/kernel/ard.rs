//! Automatic relevance determination over the R basis directions ("subspace ARD",
//! `docs/model.md`, section "Subspace ARD"): a kernel-input transform, so it works with
//! every kernel of `kernel/mod.rs`.
//!
//! With weights ω_r = exp(log ω_r) and t_r = √ω_r − 1, T = diag(t), the inputs go through
//! the linear map φ(x) = x + X̃ᵀ T X̃ x of R^D. When the basis is orthonormal (K_X̃ = I, as
//! `pipeline svd` writes it up to rounding) φ multiplies x's coordinate along basis
//! direction r by √ω_r and leaves the part of x outside the span alone, so every kernel
//! k(φ(x), φ(z)) weighs direction r by ω_r; for any K_X̃, φ is still linear, so
//! k(φ(·), φ(·)) stays a valid kernel. The inducing inputs stay Z = A X̃ in input space.
//!
//! Through the basis, with Q = I + K_X̃ T [R×R] (so X̃ φ(x) = Q X̃ x and φ(z) = a Q X̃ for
//! z = a X̃):
//! - A' = A Q = A + (A K_X̃) T [M×R] (the inducing coordinates after φ);
//! - Kxx'_b = Kxx_b Qᵀ = Kxx_b + (Kxx_b T) K_X̃ [B×R] (rows u_i = Q c_i, c_i = X̃ x_i);
//! - n'_i = ‖φ(x_i)‖² = n_i + Σ_r t_r c_ir (c_ir + u_ir) [B];
//! - K_X̃ unchanged,
//!
//! and the kernel runs on (A', Kxx'_b, n', K_X̃) as if there were no ARD: for row i and
//! inducing input m, ⟨φ(x_i), φ(z_m)⟩ = a_m Q Q c_i = A'_m · u_i (H' = Kxx'_b A'ᵀ) and
//! ⟨φ(z_m), φ(z_l)⟩ = a_m Q K_X̃ Qᵀ a_lᵀ (G' = A' K_X̃ A'ᵀ). At ω = 1 (T = 0) the
//! transformed inputs equal the inputs bit for bit. Cost per step: 4(M + B)R² flops forward and backward together.

use faer::{Mat, MatRef};

use crate::model::kernel::{BasisInputs, GramRef};

/// t_r = √ω_r − 1 and √ω_r of the weights ω_r = exp(log ω_r).
fn shifts(log_ard: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let sqrt_w: Vec<f64> = log_ard.iter().map(|l| (0.5 * l).exp()).collect();
    (sqrt_w.iter().map(|s| s - 1.0).collect(), sqrt_w)
}

/// `base + prod · diag(t)`, column by column (`base`, `prod` [N×R]).
fn add_scaled_columns(mut base: Mat<f64>, prod: &Mat<f64>, t: &[f64]) -> Mat<f64> {
    for (r, &tr) in t.iter().enumerate() {
        for (b, p) in base.col_mut(r).iter_mut().zip(prod.col(r).iter()) {
            *b += p * tr;
        }
    }
    base
}

/// The inducing coordinates after φ, A' = A + (A K_X̃) T [M×R] (all K_Z needs).
pub fn warp_inducing<'g>(
    log_ard: &[f64],
    a: MatRef<'_, f64>,
    k_tilde: impl Into<GramRef<'g>>,
) -> Mat<f64> {
    let (t, _) = shifts(log_ard);
    add_scaled_columns(a.to_owned(), &k_tilde.into().right_mul(a), &t)
}

/// One minibatch's inputs after φ, with what [`Warp::backward`] needs.
#[derive(Debug, Clone)]
pub struct Warp {
    t: Vec<f64>,
    sqrt_w: Vec<f64>,
    /// A K_X̃ [M×R].
    a_kt: Mat<f64>,
    /// A' [M×R].
    pub a: Mat<f64>,
    /// Kxx'_b [B×R].
    pub kxx_b: Mat<f64>,
    /// n' [B].
    pub sq_norms: Vec<f64>,
}

impl Warp {
    /// φ applied to the inducing coordinates `a` [M×R] and the minibatch `x`; `log_ard` [R].
    pub fn new(log_ard: &[f64], a: MatRef<'_, f64>, x: &BasisInputs<'_>) -> Warp {
        let (t, sqrt_w) = shifts(log_ard);
        let a_kt = x.k_tilde.right_mul(a);
        let a_w = add_scaled_columns(a.to_owned(), &a_kt, &t);
        // Sparse rows (the identity basis) are densified: the map mixes every column.
        let kxx = x.kxx_b.to_dense();
        let kxx_t = add_scaled_columns(Mat::zeros(kxx.nrows(), t.len()), &kxx, &t);
        let kxx_w = &kxx + x.k_tilde.right_mul(kxx_t.as_ref());
        let sq_norms = (0..kxx.nrows())
            .map(|i| {
                let extra: f64 = (0..t.len())
                    .map(|r| {
                        let c = kxx[(i, r)];
                        t[r] * c * (c + kxx_w[(i, r)])
                    })
                    .sum();
                x.sq_norms[i] + extra
            })
            .collect();
        Warp {
            t,
            sqrt_w,
            a_kt,
            a: a_w,
            kxx_b: kxx_w,
            sq_norms,
        }
    }

    /// The transformed inputs, with the unchanged K_X̃ `k_tilde`.
    pub fn inputs<'a>(&'a self, k_tilde: GramRef<'a>) -> BasisInputs<'a> {
        BasisInputs {
            kxx_b: self.kxx_b.as_ref().into(),
            sq_norms: &self.sq_norms,
            k_tilde,
        }
    }

    /// Chain rule from ∂F/∂A' [M×R], ∂F/∂Kxx'_b [B×R] and ∂F/∂n' [B] to (∂F/∂A [M×R],
    /// ∂F/∂log ω [R]); `x` are the untransformed inputs:
    /// ∂A = ∂A' + (∂A' T) K_X̃,
    /// ∂t_r = Σ_m (A K_X̃)_mr ∂A'_mr + Σ_i c_ir (∂Kxx' K_X̃)_ir + 2 Σ_i ∂n'_i c_ir u_ir,
    /// ∂log ω_r = ½ √ω_r ∂t_r.
    pub fn backward(
        &self,
        x: &BasisInputs<'_>,
        g_a: MatRef<'_, f64>,
        g_kxx: MatRef<'_, f64>,
        g_n: &[f64],
    ) -> (Mat<f64>, Vec<f64>) {
        let r_count = self.t.len();
        let g_at = add_scaled_columns(Mat::zeros(g_a.nrows(), r_count), &g_a.to_owned(), &self.t);
        let g_a_orig = g_a.to_owned() + x.k_tilde.right_mul(g_at.as_ref());
        let g_kxx_kt = x.k_tilde.right_mul(g_kxx);
        let kxx = x.kxx_b.to_dense();
        let log_ard = (0..r_count)
            .map(|r| {
                let from_a: f64 = self
                    .a_kt
                    .col(r)
                    .iter()
                    .zip(g_a.col(r).iter())
                    .map(|(p, g)| p * g)
                    .sum();
                let from_kxx: f64 = (0..kxx.nrows())
                    .map(|i| {
                        let c = kxx[(i, r)];
                        c * g_kxx_kt[(i, r)] + 2.0 * g_n[i] * c * self.kxx_b[(i, r)]
                    })
                    .sum();
                0.5 * self.sqrt_w[r] * (from_a + from_kxx)
            })
            .collect();
        (g_a_orig, log_ard)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linalg::inner;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    struct Problem {
        xt: Mat<f64>,
        xb: Mat<f64>,
        a: Mat<f64>,
        log_ard: Vec<f64>,
    }

    /// An explicit basis X̃ [R×D] (not orthonormal) and rows X_b [B×D].
    fn problem(seed: u64) -> Problem {
        let (m, r, b, d) = (4, 3, 5, 6);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut u = |s: f64| (rng.random::<f64>() - 0.5) * s;
        Problem {
            xt: Mat::from_fn(r, d, |_, _| u(1.0)),
            xb: Mat::from_fn(b, d, |_, _| u(1.0)),
            a: Mat::from_fn(m, r, |_, _| u(1.0)),
            log_ard: (0..r).map(|_| u(1.5)).collect(),
        }
    }

    fn basis_view(pr: &Problem) -> (Mat<f64>, Mat<f64>, Vec<f64>) {
        let kxx = &pr.xb * pr.xt.transpose();
        let kt = &pr.xt * pr.xt.transpose();
        let norms = (0..pr.xb.nrows())
            .map(|i| pr.xb.row(i).iter().map(|v| v * v).sum())
            .collect();
        (kxx, kt, norms)
    }

    /// The transformed inputs equal the inner products of explicitly mapped vectors
    /// φ(x) = x + X̃ᵀ T X̃ x and φ(z) for z = a X̃: the kernel sees k(φ(x), φ(z)).
    #[test]
    fn warp_equals_the_explicit_linear_map() {
        let pr = problem(1);
        let (kxx, kt, norms) = basis_view(&pr);
        let x = BasisInputs {
            kxx_b: kxx.as_ref().into(),
            sq_norms: &norms,
            k_tilde: kt.as_ref().into(),
        };
        let w = Warp::new(&pr.log_ard, pr.a.as_ref(), &x);
        let d = pr.xt.ncols();
        let t = Mat::from_fn(3, 3, |r, s| {
            if r == s {
                (0.5 * pr.log_ard[r]).exp() - 1.0
            } else {
                0.0
            }
        });
        let phi = Mat::<f64>::identity(d, d) + pr.xt.transpose() * &t * &pr.xt;
        let xb_w = &pr.xb * phi.transpose();
        let z_w = &pr.a * &pr.xt * phi.transpose();
        // ⟨φ(x_i), φ(z_m)⟩ = (Kxx' A'ᵀ)_im with A' = A Q in the coordinates of X̃.
        let h_explicit = &xb_w * z_w.transpose();
        let h = &w.kxx_b * w.a.transpose();
        assert!((&h - &h_explicit).norm_max() < 1e-12);
        let g_explicit = &z_w * z_w.transpose();
        let g = &w.a * &kt * w.a.transpose();
        assert!((&g - &g_explicit).norm_max() < 1e-12);
        for i in 0..xb_w.nrows() {
            let n: f64 = xb_w.row(i).iter().map(|v| v * v).sum();
            assert!((w.sq_norms[i] - n).abs() < 1e-12);
        }
        assert_eq!(warp_inducing(&pr.log_ard, pr.a.as_ref(), kt.as_ref()), w.a);
    }

    /// With an orthonormal basis the norm follows n' = n + Σ_r (ω_r − 1) c_ir².
    #[test]
    fn orthonormal_basis_rescales_coordinates() {
        let pr = problem(2);
        let kxx = Mat::from_fn(5, 3, |i, r| (i as f64 + 1.0) * 0.3 - r as f64 * 0.2);
        let kt = Mat::<f64>::identity(3, 3);
        let norms: Vec<f64> = (0..5).map(|i| 2.0 + i as f64).collect();
        let x = BasisInputs {
            kxx_b: kxx.as_ref().into(),
            sq_norms: &norms,
            k_tilde: kt.as_ref().into(),
        };
        let w = Warp::new(&pr.log_ard, pr.a.as_ref(), &x);
        for i in 0..5 {
            let expect: f64 = norms[i]
                + (0..3)
                    .map(|r| (pr.log_ard[r].exp() - 1.0) * kxx[(i, r)].powi(2))
                    .sum::<f64>();
            assert!((w.sq_norms[i] - expect).abs() < 1e-12);
            for r in 0..3 {
                let s = (0.5 * pr.log_ard[r]).exp();
                assert!((w.kxx_b[(i, r)] - s * kxx[(i, r)]).abs() < 1e-14);
            }
        }
    }

    #[test]
    fn unit_weights_change_nothing_bitwise() {
        let pr = problem(3);
        let (kxx, kt, norms) = basis_view(&pr);
        let x = BasisInputs {
            kxx_b: kxx.as_ref().into(),
            sq_norms: &norms,
            k_tilde: kt.as_ref().into(),
        };
        let w = Warp::new(&[0.0; 3], pr.a.as_ref(), &x);
        assert_eq!(w.a, pr.a);
        assert_eq!(w.kxx_b, kxx);
        assert_eq!(
            w.sq_norms.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            norms.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }

    /// F = ⟨P, A'⟩ + ⟨Q, Kxx'⟩ + ⟨q, n'⟩ for fixed random P, Q, q.
    #[test]
    fn backward_matches_central_differences() {
        let pr = problem(4);
        let (kxx, kt, norms) = basis_view(&pr);
        let mut rng = ChaCha8Rng::seed_from_u64(8);
        let mut u = || rng.random::<f64>() - 0.5;
        let pa = Mat::from_fn(4, 3, |_, _| u());
        let pk = Mat::from_fn(5, 3, |_, _| u());
        let pn: Vec<f64> = (0..5).map(|_| u()).collect();
        let x = BasisInputs {
            kxx_b: kxx.as_ref().into(),
            sq_norms: &norms,
            k_tilde: kt.as_ref().into(),
        };
        let f = |log_ard: &[f64], a: &Mat<f64>| {
            let w = Warp::new(log_ard, a.as_ref(), &x);
            inner(pa.as_ref(), w.a.as_ref())
                + inner(pk.as_ref(), w.kxx_b.as_ref())
                + pn.iter().zip(&w.sq_norms).map(|(p, n)| p * n).sum::<f64>()
        };
        let w = Warp::new(&pr.log_ard, pr.a.as_ref(), &x);
        let (g_a, g_w) = w.backward(&x, pa.as_ref(), pk.as_ref(), &pn);
        let h = 1e-6;
        let rel = |a: f64, b: f64| (a - b).abs() / a.abs().max(b.abs()).max(1e-8);
        for r in 0..3 {
            let (mut up, mut dn) = (pr.log_ard.clone(), pr.log_ard.clone());
            up[r] += h;
            dn[r] -= h;
            let fd = (f(&up, &pr.a) - f(&dn, &pr.a)) / (2.0 * h);
            assert!(rel(g_w[r], fd) < 1e-6, "log ω[{r}]: {} vs {fd}", g_w[r]);
        }
        for i in 0..4 {
            for r in 0..3 {
                let (mut up, mut dn) = (pr.a.clone(), pr.a.clone());
                up[(i, r)] += h;
                dn[(i, r)] -= h;
                let fd = (f(&pr.log_ard, &up) - f(&pr.log_ard, &dn)) / (2.0 * h);
                assert!(rel(g_a[(i, r)], fd) < 1e-6, "A[{i},{r}]");
            }
        }
    }
}
