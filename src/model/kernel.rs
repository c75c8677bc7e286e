//! Kernels evaluated through the basis, never touching D-dimensional data (Panos,
//! Dellaportas & Titsias, *Fully Scalable Gaussian Processes using Subspace Inducing Inputs*,
//! §2.2 and A.6; `docs/model.md`, section "Kernels through the basis").
//!
//! With Z = A X̃: G = A K_X̃ Aᵀ = Z Zᵀ [M×M] and H = Kxx_b Aᵀ = X_b Zᵀ [B×M], where
//! Kxx_b = X_b X̃ᵀ [B×R] are rows of `kxx.npy` and K_X̃ = X̃ X̃ᵀ [R×R].
//!
//! - linear: K_Z = σ_f² G, K_bZ = σ_f² H, k_ii = σ_f² ‖x_i‖²;
//! - squared exponential: K = σ_f² exp(−D/2ℓ²) with D_Z = g1ᵀ + 1gᵀ − 2G (g = diag G) and
//!   D_bZ = n1ᵀ + 1gᵀ − 2H (n_i = ‖x_i‖²); k_ii = σ_f².
//!
//! `backward` maps the gradients of any objective with respect to K_Z, K_bZ and k_ii to
//! gradients with respect to A, log σ_f² and log ℓ (chain rule of `docs/model.md`).

use faer::{Mat, MatRef};

use crate::linalg::inner;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelKind {
    Linear,
    SquaredExponential,
}

/// Unconstrained kernel hyperparameters: σ_f² = exp(log_sf2), ℓ = exp(log_ell).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KernelParams {
    pub log_sf2: f64,
    pub log_ell: f64,
}

/// The minibatch's view of the data: Kxx_b [B×R], ‖x_i‖² [B], and K_X̃ [R×R].
#[derive(Debug, Clone, Copy)]
pub struct BasisInputs<'a> {
    pub kxx_b: MatRef<'a, f64>,
    pub sq_norms: &'a [f64],
    pub k_tilde: MatRef<'a, f64>,
}

/// Kernel matrices of one step, with what `backward` needs.
#[derive(Debug, Clone)]
pub struct KernelForward {
    /// K_Z [M×M].
    pub k_z: Mat<f64>,
    /// K_bZ [B×M].
    pub k_bz: Mat<f64>,
    /// k(x_i, x_i) [B].
    pub k_diag: Vec<f64>,
    /// A K_X̃ [M×R], reused by the gradient.
    a_kt: Mat<f64>,
    /// Squared distances D_Z [M×M] and D_bZ [B×M] (SE only; empty for linear).
    d_z: Mat<f64>,
    d_bz: Mat<f64>,
}

/// Gradients with respect to the kernel's trainable inputs.
#[derive(Debug, Clone)]
pub struct KernelGrads {
    /// ∂/∂A [M×R].
    pub a: Mat<f64>,
    pub log_sf2: f64,
    pub log_ell: f64,
}

impl KernelKind {
    /// K_Z [M×M] alone: it depends on the data only through K_X̃ [R×R].
    pub fn k_z(self, p: &KernelParams, a: MatRef<'_, f64>, k_tilde: MatRef<'_, f64>) -> Mat<f64> {
        let none = Mat::<f64>::zeros(0, k_tilde.nrows());
        let x = BasisInputs {
            kxx_b: none.as_ref(),
            sq_norms: &[],
            k_tilde,
        };
        self.forward(p, a, &x).k_z
    }

    /// Evaluates K_Z, K_bZ and k_ii for inducing-input coordinates `a` [M×R].
    pub fn forward(
        self,
        p: &KernelParams,
        a: MatRef<'_, f64>,
        x: &BasisInputs<'_>,
    ) -> KernelForward {
        let sf2 = p.log_sf2.exp();
        let a_kt = a * x.k_tilde;
        let g = &a_kt * a.transpose();
        let h = x.kxx_b * a.transpose();
        match self {
            KernelKind::Linear => KernelForward {
                k_z: &g * faer::Scale(sf2),
                k_bz: &h * faer::Scale(sf2),
                k_diag: x.sq_norms.iter().map(|n| sf2 * n).collect(),
                a_kt,
                d_z: Mat::new(),
                d_bz: Mat::new(),
            },
            KernelKind::SquaredExponential => {
                let inv_2l2 = 0.5 * (-2.0 * p.log_ell).exp();
                let m = g.nrows();
                let diag: Vec<f64> = (0..m).map(|i| g[(i, i)]).collect();
                // Clamped at 0: rounding can make a squared distance slightly negative.
                let d_z = Mat::from_fn(m, m, |i, j| (diag[i] + diag[j] - 2.0 * g[(i, j)]).max(0.0));
                let d_bz = Mat::from_fn(h.nrows(), m, |i, j| {
                    (x.sq_norms[i] + diag[j] - 2.0 * h[(i, j)]).max(0.0)
                });
                KernelForward {
                    k_z: Mat::from_fn(m, m, |i, j| sf2 * (-d_z[(i, j)] * inv_2l2).exp()),
                    k_bz: Mat::from_fn(h.nrows(), m, |i, j| sf2 * (-d_bz[(i, j)] * inv_2l2).exp()),
                    k_diag: vec![sf2; h.nrows()],
                    a_kt,
                    d_z,
                    d_bz,
                }
            }
        }
    }

    /// Chain rule from ∂F/∂K_Z [M×M], ∂F/∂K_bZ [B×M], ∂F/∂k_ii [B] to the parameters.
    pub fn backward(
        self,
        p: &KernelParams,
        x: &BasisInputs<'_>,
        fwd: &KernelForward,
        g_z: MatRef<'_, f64>,
        g_bz: MatRef<'_, f64>,
        g_diag: &[f64],
    ) -> KernelGrads {
        let sf2 = p.log_sf2.exp();
        // Every kernel entry is proportional to σ_f²: ∂F/∂log σ_f² = Σ ∂F/∂K · K.
        let log_sf2 = inner(g_z, fwd.k_z.as_ref())
            + inner(g_bz, fwd.k_bz.as_ref())
            + g_diag
                .iter()
                .zip(&fwd.k_diag)
                .map(|(g, k)| g * k)
                .sum::<f64>();
        match self {
            KernelKind::Linear => {
                // K_Z = σ_f² A K_X̃ Aᵀ, K_bZ = σ_f² Kxx_b Aᵀ.
                let sym = g_z + g_z.transpose();
                let a = (&sym * &fwd.a_kt + g_bz.transpose() * x.kxx_b) * faer::Scale(sf2);
                KernelGrads {
                    a,
                    log_sf2,
                    log_ell: 0.0,
                }
            }
            KernelKind::SquaredExponential => {
                let inv_2l2 = 0.5 * (-2.0 * p.log_ell).exp();
                let m = fwd.k_z.nrows();
                let b = fwd.k_bz.nrows();
                // Gradients with respect to the squared distances.
                let e_z = Mat::from_fn(m, m, |i, j| -g_z[(i, j)] * fwd.k_z[(i, j)] * inv_2l2);
                let e_b = Mat::from_fn(b, m, |i, j| -g_bz[(i, j)] * fwd.k_bz[(i, j)] * inv_2l2);
                // D_Z = g1ᵀ + 1gᵀ − 2G, D_bZ = n1ᵀ + 1gᵀ − 2H with g = diag G.
                let mut d_g = &e_z * faer::Scale(-2.0);
                for j in 0..m {
                    let mut s = 0.0;
                    for i in 0..m {
                        s += e_z[(j, i)] + e_z[(i, j)];
                    }
                    for i in 0..b {
                        s += e_b[(i, j)];
                    }
                    d_g[(j, j)] += s;
                }
                let d_h = &e_b * faer::Scale(-2.0);
                let a = (&d_g + d_g.transpose()) * &fwd.a_kt + d_h.transpose() * x.kxx_b;
                // ∂K/∂log ℓ = K ∘ D / ℓ² (from exp(−D e^{−2 log ℓ}/2)).
                let two_inv_2l2 = 2.0 * inv_2l2;
                let log_ell = two_inv_2l2
                    * (inner(
                        g_z,
                        Mat::from_fn(m, m, |i, j| fwd.k_z[(i, j)] * fwd.d_z[(i, j)]).as_ref(),
                    ) + inner(
                        g_bz,
                        Mat::from_fn(b, m, |i, j| fwd.k_bz[(i, j)] * fwd.d_bz[(i, j)]).as_ref(),
                    ));
                KernelGrads {
                    a,
                    log_sf2,
                    log_ell,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    struct Problem {
        a: Mat<f64>,
        kxx: Mat<f64>,
        norms: Vec<f64>,
        kt: Mat<f64>,
        g_z: Mat<f64>,
        g_bz: Mat<f64>,
        g_diag: Vec<f64>,
    }

    fn problem(seed: u64) -> Problem {
        let (m, r, b) = (5, 4, 6);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut u = |s: f64| (rng.random::<f64>() - 0.5) * s;
        let a = Mat::from_fn(m, r, |_, _| u(1.0));
        let kxx = Mat::from_fn(b, r, |_, _| u(1.0));
        // ‖x_i‖² ≥ ‖projection‖² as for real data.
        let norms: Vec<f64> = (0..b)
            .map(|i| (0..r).map(|k| kxx[(i, k)].powi(2)).sum::<f64>() + 0.3)
            .collect();
        let w = Mat::from_fn(r, r, |_, _| u(0.5));
        let kt = Mat::<f64>::identity(r, r) + &w * w.transpose();
        let g_z = Mat::from_fn(m, m, |_, _| u(2.0));
        let g_bz = Mat::from_fn(b, m, |_, _| u(2.0));
        let g_diag = (0..b).map(|_| u(2.0)).collect();
        Problem {
            a,
            kxx,
            norms,
            kt,
            g_z,
            g_bz,
            g_diag,
        }
    }

    /// F = ⟨G_Z, K_Z⟩ + ⟨G_bZ, K_bZ⟩ + Σ g_i k_ii: its gradient is what `backward` computes.
    fn objective(kind: KernelKind, p: &KernelParams, a: &Mat<f64>, pr: &Problem) -> f64 {
        let x = BasisInputs {
            kxx_b: pr.kxx.as_ref(),
            sq_norms: &pr.norms,
            k_tilde: pr.kt.as_ref(),
        };
        let f = kind.forward(p, a.as_ref(), &x);
        inner(pr.g_z.as_ref(), f.k_z.as_ref())
            + inner(pr.g_bz.as_ref(), f.k_bz.as_ref())
            + pr.g_diag
                .iter()
                .zip(&f.k_diag)
                .map(|(g, k)| g * k)
                .sum::<f64>()
    }

    fn rel(a: f64, b: f64) -> f64 {
        (a - b).abs() / a.abs().max(b.abs()).max(1e-8)
    }

    #[test]
    fn gradients_match_central_differences() {
        for kind in [KernelKind::Linear, KernelKind::SquaredExponential] {
            for seed in 0..3 {
                let pr = problem(seed);
                let p = KernelParams {
                    log_sf2: 0.3,
                    log_ell: -0.2,
                };
                let x = BasisInputs {
                    kxx_b: pr.kxx.as_ref(),
                    sq_norms: &pr.norms,
                    k_tilde: pr.kt.as_ref(),
                };
                let fwd = kind.forward(&p, pr.a.as_ref(), &x);
                let g = kind.backward(&p, &x, &fwd, pr.g_z.as_ref(), pr.g_bz.as_ref(), &pr.g_diag);
                let h = 1e-6;
                for i in 0..pr.a.nrows() {
                    for j in 0..pr.a.ncols() {
                        let (mut ap, mut am) = (pr.a.clone(), pr.a.clone());
                        ap[(i, j)] += h;
                        am[(i, j)] -= h;
                        let fd = (objective(kind, &p, &ap, &pr) - objective(kind, &p, &am, &pr))
                            / (2.0 * h);
                        assert!(
                            rel(g.a[(i, j)], fd) < 1e-6,
                            "{kind:?} A[{i},{j}]: {} vs {fd}",
                            g.a[(i, j)]
                        );
                    }
                }
                let fd_sf = (objective(
                    kind,
                    &KernelParams {
                        log_sf2: p.log_sf2 + h,
                        ..p
                    },
                    &pr.a,
                    &pr,
                ) - objective(
                    kind,
                    &KernelParams {
                        log_sf2: p.log_sf2 - h,
                        ..p
                    },
                    &pr.a,
                    &pr,
                )) / (2.0 * h);
                assert!(
                    rel(g.log_sf2, fd_sf) < 1e-6,
                    "{kind:?} log σ_f²: {} vs {fd_sf}",
                    g.log_sf2
                );
                let fd_l = (objective(
                    kind,
                    &KernelParams {
                        log_ell: p.log_ell + h,
                        ..p
                    },
                    &pr.a,
                    &pr,
                ) - objective(
                    kind,
                    &KernelParams {
                        log_ell: p.log_ell - h,
                        ..p
                    },
                    &pr.a,
                    &pr,
                )) / (2.0 * h);
                assert!(
                    rel(g.log_ell, fd_l) < 1e-6 || (g.log_ell.abs() < 1e-12 && fd_l.abs() < 1e-8),
                    "{kind:?} log ℓ: {} vs {fd_l}",
                    g.log_ell
                );
            }
        }
    }

    #[test]
    fn linear_kernel_equals_explicit_inner_products() {
        // With explicit D-dimensional X̃ and X_b, K_Z = σ_f² Z Zᵀ and K_bZ = σ_f² X_b Zᵀ.
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let (m, r, b, d) = (4, 3, 5, 7);
        let mut u = || rng.random::<f64>() - 0.5;
        let xt = Mat::from_fn(r, d, |_, _| u());
        let xb = Mat::from_fn(b, d, |_, _| u());
        let a = Mat::from_fn(m, r, |_, _| u());
        let z = &a * &xt;
        let kxx = &xb * xt.transpose();
        let kt = &xt * xt.transpose();
        let norms: Vec<f64> = (0..b)
            .map(|i| (0..d).map(|k| xb[(i, k)].powi(2)).sum())
            .collect();
        let x = BasisInputs {
            kxx_b: kxx.as_ref(),
            sq_norms: &norms,
            k_tilde: kt.as_ref(),
        };
        let p = KernelParams {
            log_sf2: 0.7,
            log_ell: 0.0,
        };
        let sf2 = 0.7f64.exp();
        let lin = KernelKind::Linear.forward(&p, a.as_ref(), &x);
        assert!((&lin.k_z - (&z * z.transpose()) * faer::Scale(sf2)).norm_max() < 1e-12);
        assert!((&lin.k_bz - (&xb * z.transpose()) * faer::Scale(sf2)).norm_max() < 1e-12);
        let se = KernelKind::SquaredExponential.forward(&p, a.as_ref(), &x);
        for i in 0..b {
            for j in 0..m {
                let d2: f64 = (0..d).map(|k| (xb[(i, k)] - z[(j, k)]).powi(2)).sum();
                assert!((se.k_bz[(i, j)] - sf2 * (-d2 / 2.0).exp()).abs() < 1e-12);
            }
        }
    }
}
