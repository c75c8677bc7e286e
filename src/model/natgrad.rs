//! Natural-gradient steps for the full-Cholesky q(u) forms (`docs/model.md`, "Natural
//! gradients"; Salimbeni, Eleftheriadis & Hensman, *Natural Gradients in Practice*, 2018).
//!
//! Each latent GP's q = N(μ, S), S = L Lᵀ, is a Gaussian with natural parameters
//! θ = (S⁻¹μ, −½S⁻¹) and expectation parameters η = (μ, S + μμᵀ). A natural-gradient step
//! of size γ on the bound F is θ ← θ + γ ∂F/∂η, with ∂F/∂η₁ = ∂F/∂μ − 2 (∂F/∂S) μ and
//! ∂F/∂η₂ = ∂F/∂S. For a conjugate (Gaussian) likelihood, γ = 1 lands on the optimal q in
//! one step; any γ moves θ to (1 − γ)θ + γθ*.
//!
//! The step works from what the bound's backward pass already gives, ∂F/∂μ and the lower
//! triangle L̄ = ∂F/∂L. Since F depends on L through S = LLᵀ, L̄ = lower(2 S̄ L) for the
//! symmetric S̄ = ∂F/∂S, and C = Lᵀ S̄ L is recovered from the lower triangle of Lᵀ L̄
//! (`docs/model.md` derives it): lower(2C) = lower(Lᵀ L̄), because Lᵀ times the strictly
//! upper rest of 2 S̄ L is strictly upper. Then, with W = I − 2γC = U Uᵀ (U upper):
//!
//! - S⁻¹_new = S⁻¹ − 2γ S̄ = L⁻ᵀ W L⁻¹, so S_new = (L U⁻ᵀ)(L U⁻ᵀ)ᵀ and L_new = L U⁻ᵀ is
//!   lower triangular (lower × lower);
//! - μ_new = S_new θ₁,new = μ + γ S_new ∂F/∂μ.
//!
//! The same algebra holds in whatever coordinates q is written: the whitened form steps
//! q(v) = N(m, L Lᵀ) with the whitened gradients, the unwhitened form q(u) with its own. A
//! natural-gradient step does not depend on that choice (it is a step in the space of
//! distributions), but the step is taken before Adam moves K_Z, so the whitened form keeps
//! q(v) and the unwhitened form q(u) across the hyperparameters' step.
//!
//! Cost per GP: Lᵀ L̄ (M³/3), the Cholesky of W (M³/3), U⁻¹ (M³/3) and L U⁻ᵀ (M³/3). Each GP
//! runs sequentially in its own task, so the bits do not depend on the thread count.

use anyhow::{anyhow, ensure, Result};
use faer::linalg::matmul::triangular::{matmul as tri_matmul, BlockStructure};
use faer::{Accum, Mat, MatRef, Par};
use rayon::prelude::*;

use crate::linalg::{cholesky_lower, lower_inverse_into, zero_upper};
use crate::model::params::QParams;
use crate::model::qu::cholesky::{factor_of, pack};

/// One natural-gradient step of size `gamma` ∈ (0, 1] on the full-Cholesky q(u) in `q`,
/// from the bound's gradients `grads` (the same form). Fails, leaving `q` unchanged, when a
/// GP's new precision is not positive definite (a γ too large for a likelihood whose
/// curvature is not bounded, or a non-finite gradient).
pub fn natural_step(q: &mut QParams, grads: &QParams, gamma: f64) -> Result<()> {
    ensure!(
        gamma > 0.0 && gamma <= 1.0,
        "internal: natural-gradient step size {gamma} outside (0, 1]"
    );
    let (
        QParams::Full { mu, chol },
        QParams::Full {
            mu: g_mu,
            chol: g_chol,
        },
    ) = (&*q, grads)
    else {
        panic!("internal: natural-gradient steps need the full-Cholesky q(u) and its gradients");
    };
    let (m, p_count) = (mu.nrows(), mu.ncols());
    let stepped: Vec<(Vec<f64>, Vec<f64>)> = (0..p_count)
        .into_par_iter()
        .map(|p| {
            let (l, l_bar) = (factor_of(chol, p, m), factor_of(g_chol, p, m));
            let (mu_p, g_mu_p) = (column(mu.as_ref(), p), column(g_mu.as_ref(), p));
            gp_step(l.as_ref(), l_bar.as_ref(), &mu_p, &g_mu_p, gamma)
                .ok_or_else(|| not_positive_definite(p, gamma))
        })
        .collect::<Result<_>>()?;
    let QParams::Full { mu, chol } = q else {
        unreachable!()
    };
    for (p, (mu_new, l_new)) in stepped.into_iter().enumerate() {
        for (i, v) in mu_new.into_iter().enumerate() {
            mu[(i, p)] = v;
        }
        for (k, v) in l_new.into_iter().enumerate() {
            chol.packed[(k, p)] = v;
        }
    }
    Ok(())
}

fn not_positive_definite(p: usize, gamma: f64) -> anyhow::Error {
    anyhow!(
        "the natural-gradient step of size {gamma} left latent GP {p}'s q(u) precision not \
         positive definite (the likelihood's curvature is too large for this step, or the \
         gradient is not finite); resume with a smaller --natural-step"
    )
}

fn column(x: MatRef<'_, f64>, p: usize) -> Vec<f64> {
    x.col(p).iter().copied().collect()
}

/// One GP's step: (μ_new [M], L_new packed [M(M+1)/2]) from L, L̄ = ∂F/∂L (lower), μ and
/// ∂F/∂μ; None when W = I − 2γC is not positive definite.
fn gp_step(
    l: MatRef<'_, f64>,
    l_bar: MatRef<'_, f64>,
    mu: &[f64],
    g_mu: &[f64],
    gamma: f64,
) -> Option<(Vec<f64>, Vec<f64>)> {
    let m = l.nrows();
    // Lᵀ L̄: upper × lower.
    let mut lt_lbar = Mat::<f64>::zeros(m, m);
    tri_matmul(
        lt_lbar.as_mut(),
        BlockStructure::Rectangular,
        Accum::Replace,
        l.transpose(),
        BlockStructure::TriangularUpper,
        l_bar,
        BlockStructure::TriangularLower,
        1.0,
        Par::Seq,
    );
    // W = I − 2γC, C = sym(½ lower(Lᵀ L̄)), written reversed (J W J) so that its lower
    // Cholesky factor R gives W = U Uᵀ with U = J R J upper.
    let rev = |i: usize| m - 1 - i;
    let w_rev = Mat::from_fn(m, m, |i, j| {
        let (a, b) = (rev(i).max(rev(j)), rev(i).min(rev(j)));
        let identity = if i == j { 1.0 } else { 0.0 };
        identity - gamma * lt_lbar[(a, b)]
    });
    if !(0..m).all(|j| w_rev.col(j).iter().all(|v| v.is_finite())) {
        return None;
    }
    let r = cholesky_lower(w_rev)?;
    let mut r_inv = Mat::<f64>::zeros(m, m);
    lower_inverse_into(r_inv.as_mut(), r.as_ref());
    zero_upper(r_inv.as_mut());
    // U⁻ᵀ = J R⁻ᵀ J: (U⁻ᵀ)_ij = (R⁻¹)_{rev j, rev i}, lower triangular.
    let u_inv_t = Mat::from_fn(m, m, |i, j| r_inv[(rev(j), rev(i))]);
    let mut l_new = Mat::<f64>::zeros(m, m);
    tri_matmul(
        l_new.as_mut(),
        BlockStructure::TriangularLower,
        Accum::Replace,
        l,
        BlockStructure::TriangularLower,
        u_inv_t.as_ref(),
        BlockStructure::TriangularLower,
        1.0,
        Par::Seq,
    );
    zero_upper(l_new.as_mut());
    // μ_new = μ + γ L_new L_newᵀ ∂F/∂μ.
    let t: Vec<f64> = (0..m)
        .map(|j| (j..m).map(|i| l_new[(i, j)] * g_mu[i]).sum())
        .collect();
    let mu_new: Vec<f64> = (0..m)
        .map(|i| mu[i] + gamma * (0..=i).map(|j| l_new[(i, j)] * t[j]).sum::<f64>())
        .collect();
    let packed = pack(l_new.as_ref());
    let finite = mu_new.iter().chain(&packed).all(|v| v.is_finite());
    finite.then_some((mu_new, packed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linalg::product;
    use crate::model::qu::cholesky::pack_factors;
    use faer::Scale;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// A conjugate problem: prior N(0, K), y = H u + ε with ε ~ N(0, σ²I).
    struct Conjugate {
        k: Mat<f64>,
        h: Mat<f64>,
        y: Vec<f64>,
        noise: f64,
    }

    fn random(rng: &mut ChaCha8Rng, r: usize, c: usize) -> Mat<f64> {
        Mat::from_fn(r, c, |_, _| rng.random_range(-1.0..1.0))
    }

    /// (A)⁻¹ = L⁻ᵀ L⁻¹ of a symmetric positive definite A = LLᵀ.
    fn inverse(a: MatRef<'_, f64>) -> Mat<f64> {
        let l = cholesky_lower(a.to_owned()).unwrap();
        let mut l_inv = Mat::<f64>::zeros(a.nrows(), a.nrows());
        lower_inverse_into(l_inv.as_mut(), l.as_ref());
        zero_upper(l_inv.as_mut());
        product(l_inv.transpose(), l_inv.as_ref())
    }

    impl Conjugate {
        fn new(rng: &mut ChaCha8Rng, m: usize, n: usize) -> Self {
            let g = random(rng, m, m);
            let k = product(g.as_ref(), g.transpose()) + Mat::<f64>::identity(m, m) * Scale(0.5);
            Conjugate {
                k,
                h: random(rng, n, m),
                y: (0..n).map(|_| rng.random_range(-2.0..2.0)).collect(),
                noise: 0.7,
            }
        }

        /// F(μ, L) = E_q[log N(y | H u, σ²I)] − KL(N(μ, LLᵀ) ‖ N(0, K)), dense and direct.
        fn bound(&self, mu: &[f64], l: MatRef<'_, f64>) -> f64 {
            let (m, n) = (mu.len(), self.y.len());
            let s = product(l, l.transpose());
            let hs = product(self.h.as_ref(), s.as_ref());
            let mut lik = 0.0;
            for i in 0..n {
                let mean: f64 = (0..m).map(|j| self.h[(i, j)] * mu[j]).sum();
                let var: f64 = (0..m).map(|j| hs[(i, j)] * self.h[(i, j)]).sum();
                lik += -0.5 * ((self.y[i] - mean).powi(2) + var) / self.noise
                    - 0.5 * (2.0 * std::f64::consts::PI * self.noise).ln();
            }
            let k_inv = inverse(self.k.as_ref());
            let k_inv_s = product(k_inv.as_ref(), s.as_ref());
            let trace: f64 = (0..m).map(|i| k_inv_s[(i, i)]).sum();
            let quad: f64 = (0..m)
                .map(|i| (0..m).map(|j| mu[i] * k_inv[(i, j)] * mu[j]).sum::<f64>())
                .sum();
            let l_k = cholesky_lower(self.k.clone()).unwrap();
            let logdet_k: f64 = 2.0 * (0..m).map(|i| l_k[(i, i)].ln()).sum::<f64>();
            let logdet_s: f64 = 2.0 * (0..m).map(|i| l[(i, i)].abs().ln()).sum::<f64>();
            lik - 0.5 * (trace + quad - m as f64 + logdet_k - logdet_s)
        }

        /// ∂F/∂μ and ∂F/∂L (lower) by central differences.
        fn gradients(&self, mu: &[f64], l: &Mat<f64>) -> (Vec<f64>, Mat<f64>) {
            let h = 1e-5;
            let g_mu = (0..mu.len())
                .map(|i| {
                    let (mut up, mut down) = (mu.to_vec(), mu.to_vec());
                    up[i] += h;
                    down[i] -= h;
                    (self.bound(&up, l.as_ref()) - self.bound(&down, l.as_ref())) / (2.0 * h)
                })
                .collect();
            let m = l.nrows();
            let g_l = Mat::from_fn(m, m, |i, j| {
                if i < j {
                    return 0.0;
                }
                let (mut up, mut down) = (l.clone(), l.clone());
                up[(i, j)] += h;
                down[(i, j)] -= h;
                (self.bound(mu, up.as_ref()) - self.bound(mu, down.as_ref())) / (2.0 * h)
            });
            (g_mu, g_l)
        }

        /// The exact posterior's precision K⁻¹ + HᵀH/σ² and precision × mean Hᵀy/σ².
        fn posterior(&self) -> (Mat<f64>, Vec<f64>) {
            let m = self.k.nrows();
            let hth = product(self.h.transpose(), self.h.as_ref());
            let prec = inverse(self.k.as_ref()) + hth * Scale(1.0 / self.noise);
            let theta1 = (0..m)
                .map(|j| {
                    (0..self.y.len())
                        .map(|i| self.h[(i, j)] * self.y[i])
                        .sum::<f64>()
                        / self.noise
                })
                .collect();
            (prec, theta1)
        }
    }

    /// Natural parameters (S⁻¹μ, S⁻¹) of N(μ, LLᵀ).
    fn natural(mu: &[f64], l: &Mat<f64>) -> (Vec<f64>, Mat<f64>) {
        let prec = inverse(product(l.as_ref(), l.transpose()).as_ref());
        let m = mu.len();
        let theta1 = (0..m)
            .map(|i| (0..m).map(|j| prec[(i, j)] * mu[j]).sum())
            .collect();
        (theta1, prec)
    }

    /// On a conjugate problem a step of size γ moves the natural parameters exactly to
    /// (1 − γ)θ + γθ*, θ* the exact posterior's, from gradients taken by finite differences
    /// of an independently written dense bound (γ = 1: the posterior in one step).
    #[test]
    fn a_step_moves_the_natural_parameters_toward_the_exact_posterior() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let (m, n) = (4, 6);
        let problem = Conjugate::new(&mut rng, m, n);
        let (post_prec, post_theta1) = problem.posterior();
        for gamma in [1.0, 0.3] {
            // A start away from the posterior; one L with a negative diagonal entry.
            let mut l = Mat::from_fn(m, m, |i, j| match i.cmp(&j) {
                std::cmp::Ordering::Greater => rng.random_range(-0.3..0.3),
                std::cmp::Ordering::Equal => rng.random_range(0.5..1.5),
                std::cmp::Ordering::Less => 0.0,
            });
            l[(2, 2)] = -l[(2, 2)];
            let mu: Vec<f64> = (0..m).map(|_| rng.random_range(-1.0..1.0)).collect();
            let (g_mu, g_l) = problem.gradients(&mu, &l);
            let mut q = QParams::Full {
                mu: Mat::from_fn(m, 1, |i, _| mu[i]),
                chol: pack_factors(std::slice::from_ref(&l), false),
            };
            let grads = QParams::Full {
                mu: Mat::from_fn(m, 1, |i, _| g_mu[i]),
                chol: pack_factors(std::slice::from_ref(&g_l), false),
            };
            natural_step(&mut q, &grads, gamma).unwrap();
            let QParams::Full { mu: mu_new, chol } = &q else {
                unreachable!()
            };
            let l_new = factor_of(chol, 0, m);
            let mu_new: Vec<f64> = mu_new.col(0).iter().copied().collect();
            let (theta1_new, prec_new) = natural(&mu_new, &l_new);
            let (theta1_old, prec_old) = natural(&mu, &l);
            for i in 0..m {
                let want = (1.0 - gamma) * theta1_old[i] + gamma * post_theta1[i];
                assert!(
                    (theta1_new[i] - want).abs() < 1e-6 * (1.0 + want.abs()),
                    "γ {gamma}: θ₁[{i}] {} against {want}",
                    theta1_new[i]
                );
                for j in 0..m {
                    let want = (1.0 - gamma) * prec_old[(i, j)] + gamma * post_prec[(i, j)];
                    assert!(
                        (prec_new[(i, j)] - want).abs() < 1e-6 * (1.0 + want.abs()),
                        "γ {gamma}: precision ({i},{j}) {} against {want}",
                        prec_new[(i, j)]
                    );
                }
            }
        }
    }

    /// A step that would make the precision indefinite is refused and leaves q unchanged.
    #[test]
    fn an_indefinite_precision_is_refused() {
        let m = 3;
        let l = Mat::<f64>::identity(m, m);
        let mut q = QParams::Full {
            mu: Mat::zeros(m, 1),
            chol: pack_factors(std::slice::from_ref(&l), true),
        };
        let before = q.clone();
        // ∂F/∂L = 2 S̄ L with S̄ = +I (a convex "likelihood"): W = I − 2γI at γ = 1.
        let grads = QParams::Full {
            mu: Mat::zeros(m, 1),
            chol: pack_factors(
                std::slice::from_ref(&(Mat::<f64>::identity(m, m) * Scale(2.0))),
                true,
            ),
        };
        let err = natural_step(&mut q, &grads, 1.0).unwrap_err().to_string();
        assert!(err.contains("not positive definite"), "{err}");
        assert_eq!(q, before);
    }
}
