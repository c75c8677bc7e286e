//! q(u_p) = N(K_Z μ_p, (K_Z⁻¹ + Σ_p⁻¹)⁻¹): marginals of h_p at the minibatch rows, the KL
//! terms, and their gradients (`docs/model.md`, sections "q(u) and marginals" and
//! "Gradients").
//!
//! Only C_p = K_Z + Σ_p is ever factorised: K_Z itself may be singular (R < M, linear
//! kernel). Σ_p = diag(softplus(ρ_p) + 10⁻⁶).
//!
//! Shapes: K_Z [M×M], K_bZ [B×M], k_ii [B], μ and ρ [M×P], marginal means and variances
//! [B×P].

use anyhow::{bail, Result};
use faer::linalg::solvers::{DenseSolveCore, Solve};
use faer::{Mat, MatRef, Side};

/// Smallest variance parameter σ_pm.
pub const MIN_SIGMA: f64 = 1e-6;

/// σ = softplus(ρ) + 10⁻⁶ (stable for large |ρ|).
pub fn sigma_of(rho: f64) -> f64 {
    let softplus = if rho > 30.0 { rho } else { rho.exp().ln_1p() };
    softplus + MIN_SIGMA
}

/// dσ/dρ = logistic(ρ).
fn dsigma_drho(rho: f64) -> f64 {
    1.0 / (1.0 + (-rho).exp())
}

/// Per-latent-GP factorisations and products kept for the backward pass.
#[derive(Debug, Clone)]
struct PerGp {
    /// C_p⁻¹ [M×M].
    c_inv: Mat<f64>,
    /// W_p = C_p⁻¹ K_bZᵀ [M×B].
    w: Mat<f64>,
    /// Σ_p actually used (σ plus any jitter) [M].
    sigma: Vec<f64>,
}

/// Forward results.
#[derive(Debug, Clone)]
pub struct VariationalForward {
    /// m = K_bZ μ [B×P].
    pub mean: Mat<f64>,
    /// s_ip = k_ii − k_iᵀ C_p⁻¹ k_i [B×P].
    pub var: Mat<f64>,
    /// Σ_p KL_p.
    pub kl: f64,
    /// Largest diagonal jitter that had to be added to some C_p (0 when none).
    pub jitter: f64,
    per_gp: Vec<PerGp>,
}

/// Gradients of F = ⟨G_m, m⟩ + ⟨G_s, s⟩ − Σ_p KL_p.
#[derive(Debug, Clone)]
pub struct VariationalGrads {
    pub mu: Mat<f64>,
    pub rho: Mat<f64>,
    pub k_z: Mat<f64>,
    pub k_bz: Mat<f64>,
    pub k_diag: Vec<f64>,
}

/// Cholesky of K_Z + diag(σ), retried with growing jitter on the diagonal when it fails.
pub fn factorise(
    k_z: MatRef<'_, f64>,
    sigma: &mut [f64],
) -> Result<(faer::linalg::solvers::Llt<f64>, f64)> {
    let m = k_z.nrows();
    let mean_diag = (0..m).map(|i| k_z[(i, i)] + sigma[i]).sum::<f64>() / m as f64;
    let mut jitter = 0.0;
    for attempt in 0..8 {
        let c = Mat::from_fn(m, m, |i, j| {
            k_z[(i, j)] + if i == j { sigma[i] + jitter } else { 0.0 }
        });
        if let Ok(llt) = c.llt(Side::Lower) {
            for s in sigma.iter_mut() {
                *s += jitter;
            }
            return Ok((llt, jitter));
        }
        jitter = mean_diag.max(1e-300) * 1e-10 * 10f64.powi(attempt);
    }
    bail!("Cholesky of K_Z + Σ failed even with jitter {jitter:.3e} on the diagonal")
}

/// Computes the marginals and the KL terms.
pub fn forward(
    k_z: MatRef<'_, f64>,
    k_bz: MatRef<'_, f64>,
    k_diag: &[f64],
    mu: MatRef<'_, f64>,
    rho: MatRef<'_, f64>,
) -> Result<VariationalForward> {
    let (m, p_count, b) = (k_z.nrows(), mu.ncols(), k_bz.nrows());
    let mean = k_bz * mu;
    let mut var = Mat::<f64>::zeros(b, p_count);
    let mut kl = 0.0;
    let mut max_jitter = 0.0f64;
    let mut per_gp = Vec::with_capacity(p_count);
    for p in 0..p_count {
        let mut sigma: Vec<f64> = (0..m).map(|i| sigma_of(rho[(i, p)])).collect();
        let (llt, jitter) = factorise(k_z, &mut sigma)?;
        max_jitter = max_jitter.max(jitter);
        let w = llt.solve(k_bz.transpose());
        for i in 0..b {
            let quad: f64 = (0..m).map(|j| k_bz[(i, j)] * w[(j, i)]).sum();
            var[(i, p)] = k_diag[i] - quad;
        }
        let c_inv = llt.inverse();
        let mu_p = mu.col(p);
        let k_mu = k_z * mu_p;
        let quad_mu: f64 = (0..m).map(|j| mu_p[j] * k_mu[j]).sum();
        let tr_cinv_kz: f64 = (0..m)
            .map(|i| (0..m).map(|j| c_inv[(i, j)] * k_z[(j, i)]).sum::<f64>())
            .sum();
        let logdet_c = 2.0 * (0..m).map(|i| llt.L()[(i, i)].ln()).sum::<f64>();
        let logdet_sigma: f64 = sigma.iter().map(|s| s.ln()).sum();
        kl += 0.5 * (quad_mu - tr_cinv_kz + logdet_c - logdet_sigma);
        per_gp.push(PerGp { c_inv, w, sigma });
    }
    Ok(VariationalForward {
        mean,
        var,
        kl,
        jitter: max_jitter,
        per_gp,
    })
}

/// Gradients of F = ⟨g_mean, m⟩ + ⟨g_var, s⟩ − Σ_p KL_p.
pub fn backward(
    fwd: &VariationalForward,
    k_z: MatRef<'_, f64>,
    k_bz: MatRef<'_, f64>,
    mu: MatRef<'_, f64>,
    rho: MatRef<'_, f64>,
    g_mean: MatRef<'_, f64>,
    g_var: MatRef<'_, f64>,
) -> VariationalGrads {
    let (m, p_count, b) = (k_z.nrows(), mu.ncols(), k_bz.nrows());
    // ∂F/∂μ = K_bZᵀ G_m − K_Z μ.
    let g_mu = k_bz.transpose() * g_mean - k_z * mu;
    // ∂F/∂K_bZ = G_m μᵀ − 2 Σ_p D_p W_pᵀ.
    let mut g_kbz = g_mean * mu.transpose();
    let mut g_kz = Mat::<f64>::zeros(m, m);
    let mut g_rho = Mat::<f64>::zeros(m, p_count);
    let k_diag: Vec<f64> = (0..b)
        .map(|i| (0..p_count).map(|p| g_var[(i, p)]).sum())
        .collect();
    for (p, gp) in fwd.per_gp.iter().enumerate() {
        for i in 0..b {
            let d = g_var[(i, p)];
            for j in 0..m {
                g_kbz[(i, j)] -= 2.0 * d * gp.w[(j, i)];
            }
        }
        // W_p D_p W_pᵀ [M×M].
        let w_d = Mat::from_fn(m, b, |j, i| gp.w[(j, i)] * g_var[(i, p)]);
        let wdw = &w_d * gp.w.transpose();
        // C⁻¹ K_Z C⁻¹.
        let ckc = &gp.c_inv * k_z * &gp.c_inv;
        let mu_p = mu.col(p);
        for i in 0..m {
            for j in 0..m {
                g_kz[(i, j)] += -0.5 * mu_p[i] * mu_p[j] - 0.5 * ckc[(i, j)] + wdw[(i, j)];
            }
            let d_sigma =
                -0.5 * ckc[(i, i)] - 0.5 * gp.c_inv[(i, i)] + wdw[(i, i)] + 0.5 / gp.sigma[i];
            g_rho[(i, p)] = d_sigma * dsigma_drho(rho[(i, p)]);
        }
    }
    VariationalGrads {
        mu: g_mu,
        rho: g_rho,
        k_z: g_kz,
        k_bz: g_kbz,
        k_diag,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kernel::{BasisInputs, KernelKind, KernelParams};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn rand_mat(rng: &mut ChaCha8Rng, r: usize, c: usize, s: f64) -> Mat<f64> {
        Mat::from_fn(r, c, |_, _| (rng.random::<f64>() - 0.5) * s)
    }

    #[test]
    fn kl_equals_the_textbook_gaussian_kl() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let (m, p) = (6, 3);
        let w = rand_mat(&mut rng, m, m, 1.0);
        let k_z = &w * w.transpose() + Mat::<f64>::identity(m, m) * faer::Scale(0.1);
        let mu = rand_mat(&mut rng, m, p, 2.0);
        let rho = rand_mat(&mut rng, m, p, 3.0);
        let fwd = forward(
            k_z.as_ref(),
            Mat::<f64>::zeros(0, m).as_ref(),
            &[],
            mu.as_ref(),
            rho.as_ref(),
        )
        .unwrap();
        let k_inv = k_z.llt(Side::Lower).unwrap().inverse();
        let logdet = |a: &Mat<f64>| {
            2.0 * (0..m)
                .map(|i| a.llt(Side::Lower).unwrap().L()[(i, i)].ln())
                .sum::<f64>()
        };
        let mut expected = 0.0;
        for q in 0..p {
            // S = (K⁻¹ + Σ⁻¹)⁻¹, mean K μ; KL(N(mean, S) ‖ N(0, K)).
            let sig_inv = Mat::from_fn(m, m, |i, j| {
                if i == j {
                    1.0 / sigma_of(rho[(i, q)])
                } else {
                    0.0
                }
            });
            let s = (&k_inv + &sig_inv).llt(Side::Lower).unwrap().inverse();
            let mean = &k_z * mu.col(q);
            let quad: f64 = (0..m)
                .map(|i| {
                    (0..m)
                        .map(|j| mean[i] * k_inv[(i, j)] * mean[j])
                        .sum::<f64>()
                })
                .sum();
            let tr: f64 = (0..m)
                .map(|i| (0..m).map(|j| k_inv[(i, j)] * s[(j, i)]).sum::<f64>())
                .sum();
            expected += 0.5 * (tr + quad - m as f64 + logdet(&k_z) - logdet(&s));
        }
        assert!(
            (fwd.kl - expected).abs() < 1e-9 * expected.abs().max(1.0),
            "{} vs {expected}",
            fwd.kl
        );
    }

    /// F(A, μ, ρ, log σ_f², log ℓ) = ⟨R_m, m⟩ + ⟨R_s, s⟩ − KL through a real kernel, so
    /// K_Z stays symmetric under every perturbation.
    struct Setup {
        kxx: Mat<f64>,
        norms: Vec<f64>,
        kt: Mat<f64>,
        r_m: Mat<f64>,
        r_s: Mat<f64>,
    }

    fn objective(
        s: &Setup,
        kind: KernelKind,
        kp: &KernelParams,
        a: &Mat<f64>,
        mu: &Mat<f64>,
        rho: &Mat<f64>,
    ) -> f64 {
        let x = BasisInputs {
            kxx_b: s.kxx.as_ref(),
            sq_norms: &s.norms,
            k_tilde: s.kt.as_ref(),
        };
        let kf = kind.forward(kp, a.as_ref(), &x);
        let f = forward(
            kf.k_z.as_ref(),
            kf.k_bz.as_ref(),
            &kf.k_diag,
            mu.as_ref(),
            rho.as_ref(),
        )
        .unwrap();
        let dot = |x: &Mat<f64>, y: &Mat<f64>| {
            (0..x.nrows())
                .map(|i| (0..x.ncols()).map(|j| x[(i, j)] * y[(i, j)]).sum::<f64>())
                .sum::<f64>()
        };
        dot(&s.r_m, &f.mean) + dot(&s.r_s, &f.var) - f.kl
    }

    #[test]
    fn gradients_match_central_differences_through_both_kernels() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        // R < M: K_Z is singular for the linear kernel, as in real runs.
        let (m, r, b, p) = (6, 4, 5, 2);
        let kxx = rand_mat(&mut rng, b, r, 1.0);
        let norms: Vec<f64> = (0..b)
            .map(|i| (0..r).map(|k| kxx[(i, k)].powi(2)).sum::<f64>() + 0.2)
            .collect();
        let kt = Mat::<f64>::identity(r, r);
        let s = Setup {
            r_m: rand_mat(&mut rng, b, p, 2.0),
            r_s: rand_mat(&mut rng, b, p, 2.0),
            kxx,
            norms,
            kt,
        };
        let a = rand_mat(&mut rng, m, r, 1.0);
        let mu = rand_mat(&mut rng, m, p, 1.0);
        let rho = rand_mat(&mut rng, m, p, 2.0);
        for kind in [KernelKind::Linear, KernelKind::SquaredExponential] {
            let kp = KernelParams {
                log_sf2: 0.2,
                log_ell: 0.1,
            };
            let x = BasisInputs {
                kxx_b: s.kxx.as_ref(),
                sq_norms: &s.norms,
                k_tilde: s.kt.as_ref(),
            };
            let kf = kind.forward(&kp, a.as_ref(), &x);
            let f = forward(
                kf.k_z.as_ref(),
                kf.k_bz.as_ref(),
                &kf.k_diag,
                mu.as_ref(),
                rho.as_ref(),
            )
            .unwrap();
            assert_eq!(f.jitter, 0.0);
            let g = backward(
                &f,
                kf.k_z.as_ref(),
                kf.k_bz.as_ref(),
                mu.as_ref(),
                rho.as_ref(),
                s.r_m.as_ref(),
                s.r_s.as_ref(),
            );
            let kg = kind.backward(&kp, &x, &kf, g.k_z.as_ref(), g.k_bz.as_ref(), &g.k_diag);
            let h = 1e-6;
            let check = |name: &str, analytic: f64, plus: f64, minus: f64| {
                let fd = (plus - minus) / (2.0 * h);
                let rel = (analytic - fd).abs() / analytic.abs().max(fd.abs()).max(1e-6);
                assert!(
                    rel < 1e-6,
                    "{kind:?} {name}: analytic {analytic} vs fd {fd}"
                );
            };
            for i in 0..m {
                for j in 0..p {
                    let (mut up, mut dn) = (mu.clone(), mu.clone());
                    up[(i, j)] += h;
                    dn[(i, j)] -= h;
                    check(
                        "μ",
                        g.mu[(i, j)],
                        objective(&s, kind, &kp, &a, &up, &rho),
                        objective(&s, kind, &kp, &a, &dn, &rho),
                    );
                    let (mut up, mut dn) = (rho.clone(), rho.clone());
                    up[(i, j)] += h;
                    dn[(i, j)] -= h;
                    check(
                        "ρ",
                        g.rho[(i, j)],
                        objective(&s, kind, &kp, &a, &mu, &up),
                        objective(&s, kind, &kp, &a, &mu, &dn),
                    );
                }
                for j in 0..r {
                    let (mut up, mut dn) = (a.clone(), a.clone());
                    up[(i, j)] += h;
                    dn[(i, j)] -= h;
                    check(
                        "A",
                        kg.a[(i, j)],
                        objective(&s, kind, &kp, &up, &mu, &rho),
                        objective(&s, kind, &kp, &dn, &mu, &rho),
                    );
                }
            }
            let shift = |d_sf: f64, d_l: f64| KernelParams {
                log_sf2: kp.log_sf2 + d_sf,
                log_ell: kp.log_ell + d_l,
            };
            check(
                "log σ_f²",
                kg.log_sf2,
                objective(&s, kind, &shift(h, 0.0), &a, &mu, &rho),
                objective(&s, kind, &shift(-h, 0.0), &a, &mu, &rho),
            );
            if kind == KernelKind::SquaredExponential {
                check(
                    "log ℓ",
                    kg.log_ell,
                    objective(&s, kind, &shift(0.0, h), &a, &mu, &rho),
                    objective(&s, kind, &shift(0.0, -h), &a, &mu, &rho),
                );
            }
        }
    }

    #[test]
    fn singular_c_is_rescued_by_jitter() {
        // K_Z of rank 1 and σ at its floor: C is numerically singular in f64 for large K_Z.
        let v = Mat::from_fn(4, 1, |i, _| 1e9 * (i as f64 + 1.0));
        let k_z = &v * v.transpose();
        let rho = Mat::from_fn(4, 1, |_, _| -60.0);
        let f = forward(
            k_z.as_ref(),
            Mat::<f64>::zeros(0, 4).as_ref(),
            &[],
            Mat::<f64>::zeros(4, 1).as_ref(),
            rho.as_ref(),
        )
        .unwrap();
        assert!(f.jitter > 0.0);
        assert!(f.kl.is_finite());
    }
}
