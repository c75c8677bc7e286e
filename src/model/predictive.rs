//! The predictive distribution of the utilities at new rows (Panos, Dellaportas & Titsias,
//! *Fully Scalable Gaussian Processes using Subspace Inducing Inputs*, A.3):
//! q(f_k(x*)) = N(f̄_k, v_k) with f̄_k = Σ_p Φ_kp m_p(x*) + b_k, m_p(x*) = k(x*, Z) μ_p,
//! v_k = Σ_p Φ_kp² s_p(x*) and s_p(x*) = k(x*, x*) − k(x*, Z) (K_Z + Σ_p)⁻¹ k(Z, x*)
//! (the same marginal as in training: K_Z⁻¹ S_p K_Z⁻¹ = K_Z⁻¹ − (K_Z + Σ_p)⁻¹ by Woodbury,
//! so only K_Z + Σ_p is factorised). The marginals come from the conditional
//! (`qu/conditional.rs`), with q(u) factorised once per predictor.
//!
//! Ranking uses the mean f̄. The predictive probability E_q[σ(f_k)] is reported with the
//! probit approximation σ(f̄ / √(1 + π v / 8)) (`docs/model.md`, "Prediction").

use anyhow::Result;
use faer::Mat;

use crate::model::kernel::{BasisInputs, GramRef, KernelKind};
use crate::model::params::Params;
use crate::model::qu::conditional::{mean_weights, Conditional, FactorisedQ};
use crate::model::scratch::Scratch;

/// Mean utilities f̄ = (K_*Z w) Φᵀ + 1 bᵀ [B×K] at many blocks of rows, with the weights w
/// of the marginal means ([`mean_weights`]: μ, or for the full-Cholesky forms a solve with
/// K_Z) computed once.
pub struct MeanUtilities<'p> {
    kind: KernelKind,
    params: &'p Params,
    /// w [M×P].
    weights: Mat<f64>,
    /// ‖z_m‖² [M] (None under subspace ARD, whose Z moves with the rows).
    z_sq: Option<Vec<f64>>,
}

/// ‖z_m‖² of `params`' inducing inputs, computed once for every block of rows
/// (`Conditional::at_rows`); None under subspace ARD.
fn inducing_sq_norms(params: &Params, k_tilde: GramRef<'_>) -> Option<Vec<f64>> {
    let plain = params.kernel.log_ard.is_empty();
    plain.then(|| KernelKind::inducing_sq_norms(params.a.as_ref(), k_tilde))
}

impl<'p> MeanUtilities<'p> {
    /// Fails for a full-Cholesky form whose K_Z does not factorise; `k_tilde` [R×R] is the
    /// basis Gram the model was trained with.
    pub fn new<'g>(
        kind: KernelKind,
        params: &'p Params,
        k_tilde: impl Into<GramRef<'g>>,
    ) -> Result<Self> {
        let k_tilde = k_tilde.into();
        let weights = mean_weights(kind, params, k_tilde)?;
        Ok(MeanUtilities {
            kind,
            params,
            weights,
            z_sq: inducing_sq_norms(params, k_tilde),
        })
    }

    /// f̄ [B×K] at the rows of `x` (their K_XX̃ rows projected with the training basis).
    pub fn at(&self, x: &BasisInputs<'_>) -> Mat<f64> {
        let m = Conditional::at_rows(self.kind, self.params, x, self.z_sq.as_deref())
            .mean_given(self.weights.as_ref());
        add_bias(&m * self.params.phi.transpose(), &self.params.bias)
    }
}

/// [`MeanUtilities`] for one set of rows.
pub fn mean_utilities(kind: KernelKind, params: &Params, x: &BasisInputs<'_>) -> Result<Mat<f64>> {
    Ok(MeanUtilities::new(kind, params, x.k_tilde)?.at(x))
}

/// f + 1 bᵀ, column by column.
fn add_bias(mut f: Mat<f64>, bias: &[f64]) -> Mat<f64> {
    for (k, &b) in bias.iter().enumerate() {
        for v in f.col_mut(k).iter_mut() {
            *v += b;
        }
    }
    f
}

/// Mean and variance of q(f) at many rows: factorises q(u) once, then scores blocks of rows.
pub struct Predictor<'p> {
    kind: KernelKind,
    params: &'p Params,
    /// q(u) factorised: one Cholesky factor of K_Z + Σ_p per latent GP.
    q: FactorisedQ,
    /// Φ ∘ Φ [K×P].
    phi_sq: Mat<f64>,
    /// The predictor's work buffers, reused from block to block.
    scratch: Scratch,
    /// Largest diagonal jitter a factorisation needed (0 when none).
    pub jitter: f64,
    /// ‖z_m‖² [M] (None under subspace ARD).
    z_sq: Option<Vec<f64>>,
}

impl<'p> Predictor<'p> {
    /// `k_tilde` [R×R] is the basis Gram K_X̃ the model was trained with.
    pub fn new<'g>(
        kind: KernelKind,
        params: &'p Params,
        k_tilde: impl Into<GramRef<'g>>,
    ) -> Result<Self> {
        let k_tilde = k_tilde.into();
        let scratch = Scratch::new();
        let q = FactorisedQ::new(kind, params, k_tilde, &scratch)?;
        let phi_sq = Mat::from_fn(params.phi.nrows(), params.phi.ncols(), |k, p| {
            params.phi[(k, p)] * params.phi[(k, p)]
        });
        Ok(Predictor {
            kind,
            params,
            jitter: q.jitter(),
            q,
            phi_sq,
            scratch,
            z_sq: inducing_sq_norms(params, k_tilde),
        })
    }

    /// The parameters it predicts with.
    pub fn params(&self) -> &'p Params {
        self.params
    }

    /// The latent GPs' marginals (m [B×P], s [B×P], s ≥ 0) at the rows of `x`: what a
    /// multi-class likelihood needs to form the rows' joint utilities
    /// (`class_phase::class_probabilities`).
    pub fn marginals(&self, x: &BasisInputs<'_>) -> (Mat<f64>, Mat<f64>) {
        let cond = Conditional::at_rows(self.kind, self.params, x, self.z_sq.as_deref());
        let (m, mut s) = cond.marginals_given(&self.q, self.params, &self.scratch);
        // Rounding can make s_ip slightly negative.
        for p in 0..s.ncols() {
            for v in s.col_mut(p).iter_mut() {
                *v = v.max(0.0);
            }
        }
        (m, s)
    }

    /// (f̄ [B×K], v [B×K]) for the rows of `x`.
    pub fn mean_and_variance(&self, x: &BasisInputs<'_>) -> (Mat<f64>, Mat<f64>) {
        let (m, s) = self.marginals(x);
        let mean = add_bias(&m * self.params.phi.transpose(), &self.params.bias);
        let var = &s * self.phi_sq.transpose();
        (mean, var)
    }
}

/// E[σ(f)] for f ~ N(mean, var) by the probit approximation σ(mean / √(1 + π var / 8))
/// (MacKay 1992): exact at var = 0, absolute error below 0.02 everywhere.
pub fn probit_probability(mean: f64, var: f64) -> f64 {
    let t = mean / (1.0 + std::f64::consts::PI * var.max(0.0) / 8.0).sqrt();
    1.0 / (1.0 + (-t).exp())
}

/// Gauss–Hermite points of the logistic predictive E[σ(f)] ([`ProbabilityRule::
/// LogisticQuadrature`]): more than training's 20, since it is evaluated once per row and
/// label only, and the probabilities of confident rows enter the NLP through their logs.
pub const LOGISTIC_PREDICTIVE_POINTS: usize = 100;

/// How a predictive probability p(y = 1) = E_{f~N(f̄, v)}[p(y = 1 | f)] is computed from the
/// marginal q(f) = N(f̄, v) (`docs/model.md`, "Prediction"); chosen per run by its
/// likelihood and task (`TrainConfig::probability_rule`).
#[derive(Debug, Clone, PartialEq)]
pub enum ProbabilityRule {
    /// E[σ(f)] ≈ σ(f̄ / √(1 + π v / 8)) ([`probit_probability`]): what `predict
    /// --probabilities` has always written for multi-label logistic runs.
    LogisticProbitApproximation,
    /// E[σ(f)] by Gauss–Hermite quadrature, Σ_j u_j σ(f̄ + √v x_j) (the nodes as pairs
    /// ±x_k = ±√2 t_k with weights u_k = w_k/√π, and u_0 at 0 for odd Q).
    LogisticQuadrature {
        half_nodes: Vec<f64>,
        half_weights: Vec<f64>,
        centre_weight: f64,
    },
    /// E[Φ(f)] = Φ(f̄ / √(1 + v)), exact for the probit likelihood.
    ProbitExact,
}

impl ProbabilityRule {
    /// E[σ(f)] with a `points`-point Gauss–Hermite rule.
    pub fn logistic_quadrature(points: usize) -> anyhow::Result<Self> {
        let rule = crate::model::quadrature::GaussHermite::new(points)?;
        let crate::model::quadrature::SymmetricRule {
            half_nodes,
            half_weights,
            centre_weight,
        } = rule.symmetric();
        Ok(ProbabilityRule::LogisticQuadrature {
            half_nodes,
            half_weights,
            centre_weight,
        })
    }

    /// p(y = 1) under q(f) = N(mean, var) (a negative var, from rounding, counts as 0).
    pub fn probability(&self, mean: f64, var: f64) -> f64 {
        let var = var.max(0.0);
        match self {
            ProbabilityRule::LogisticProbitApproximation => probit_probability(mean, var),
            ProbabilityRule::LogisticQuadrature {
                half_nodes,
                half_weights,
                centre_weight,
            } => {
                let s = var.sqrt();
                let mut p = centre_weight * sigmoid(mean);
                for (&x, &u) in half_nodes.iter().zip(half_weights) {
                    p += u * (sigmoid(mean + s * x) + sigmoid(mean - s * x));
                }
                p.clamp(0.0, 1.0)
            }
            ProbabilityRule::ProbitExact => {
                crate::model::likelihood::probit::normal_cdf(mean / (1.0 + var).sqrt())
            }
        }
    }

    /// The name a predict run records (`predictive` in its params; the probit
    /// approximation, the default, is not recorded).
    pub fn name(&self) -> &'static str {
        match self {
            ProbabilityRule::LogisticProbitApproximation => "logistic-probit-approximation",
            ProbabilityRule::LogisticQuadrature { .. } => "logistic-gauss-hermite",
            ProbabilityRule::ProbitExact => "probit-exact",
        }
    }
}

/// σ(t) without overflow.
fn sigmoid(t: f64) -> f64 {
    crate::model::likelihood::logistic::sigmoid(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kernel::ard::Warp;
    use crate::model::kernel::KernelParams;
    use crate::model::params::QParams;
    use crate::model::qu::sites;
    use crate::model::quadrature::GaussHermite;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn problem(kind: KernelKind, ard: bool) -> (Params, Mat<f64>, Mat<f64>, Vec<f64>) {
        let (m, r, p, k, b) = (6, 4, 3, 5, 7);
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut u = |s: f64| (rng.random::<f64>() - 0.5) * s;
        let basis = Mat::from_fn(r, 9, |_, _| u(2.0));
        let k_tilde = &basis * basis.transpose();
        let rows = Mat::from_fn(b, 9, |_, _| u(2.0));
        let kxx = &rows * basis.transpose();
        let sq: Vec<f64> = (0..b)
            .map(|i| rows.row(i).iter().map(|v| v * v).sum())
            .collect();
        let params = Params {
            logit_epsilon: None,
            a: Mat::from_fn(m, r, |_, _| u(2.0)),
            q: QParams::Sites {
                mu: Mat::from_fn(m, p, |_, _| u(1.0)),
                rho: Mat::from_fn(m, p, |_, _| u(2.0)),
            },
            phi: Mat::from_fn(k, p, |_, _| u(2.0)),
            bias: (0..k).map(|_| u(1.0)).collect(),
            kernel: KernelParams {
                log_lin2: (kind == KernelKind::SePlusLinear).then_some(-0.3),
                log_ard: if ard {
                    vec![0.4, -0.6, 0.1, 0.9]
                } else {
                    Vec::new()
                },
                ..KernelParams::new(u(0.5), if kind == KernelKind::Linear { 0.0 } else { 0.7 })
            },
            amortiser: None,
        };
        (params, k_tilde, kxx, sq)
    }

    /// Mean and variance equal the training-time marginals pushed through Φ and b.
    #[test]
    fn moments_match_training_marginals() {
        for (kind, ard) in [
            (KernelKind::Linear, false),
            (KernelKind::SquaredExponential, false),
            (KernelKind::SePlusLinear, false),
            (KernelKind::Linear, true),
            (KernelKind::SquaredExponential, true),
            (KernelKind::SePlusLinear, true),
        ] {
            let (params, k_tilde, kxx, sq) = problem(kind, ard);
            let x = BasisInputs {
                kxx_b: kxx.as_ref().into(),
                sq_norms: &sq,
                k_tilde: k_tilde.as_ref().into(),
            };
            // The training-time kernel: on the inputs after ARD's map when there is one.
            let kf = if ard {
                let warp = Warp::new(&params.kernel.log_ard, params.a.as_ref(), &x);
                kind.forward(&params.kernel, warp.a.as_ref(), &warp.inputs(x.k_tilde))
            } else {
                kind.forward(&params.kernel, params.a.as_ref(), &x)
            };
            let vf = sites::forward(
                kf.k_z.as_ref(),
                kf.k_bz.as_ref(),
                &kf.k_diag,
                params.q.mu().as_ref(),
                params.q.rho().unwrap().as_ref(),
                None,
                &Scratch::new(),
            )
            .unwrap();
            let predictor = Predictor::new(kind, &params, k_tilde.as_ref()).unwrap();
            let (mean, var) = predictor.mean_and_variance(&x);
            let plain = mean_utilities(kind, &params, &x).unwrap();
            for i in 0..kxx.nrows() {
                for k in 0..params.phi.nrows() {
                    let mut f = params.bias[k];
                    let mut v = 0.0;
                    for p in 0..params.q.mu().ncols() {
                        f += params.phi[(k, p)] * vf.mean[(i, p)];
                        v += params.phi[(k, p)].powi(2) * vf.var[(i, p)];
                    }
                    assert!((mean[(i, k)] - f).abs() <= 1e-10 * (1.0 + f.abs()));
                    assert!((plain[(i, k)] - f).abs() <= 1e-10 * (1.0 + f.abs()));
                    assert!(
                        (var[(i, k)] - v).abs() <= 1e-9 * (1.0 + v.abs()),
                        "{kind:?}"
                    );
                    assert!(var[(i, k)] >= 0.0);
                }
            }
        }
    }

    /// The probit approximation against E[σ(f)] by a 120-point Gauss–Hermite rule: exact at
    /// v = 0, within 0.02 over a grid of means and variances.
    #[test]
    fn probit_probability_close_to_quadrature() {
        let gh = GaussHermite::new(120).unwrap();
        let sigmoid = |t: f64| 1.0 / (1.0 + (-t).exp());
        let mut worst = 0.0f64;
        for mi in -40..=40 {
            let mean = mi as f64 * 0.25;
            for var in [0.0, 0.01, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 50.0] {
                let exact: f64 = gh
                    .nodes
                    .iter()
                    .zip(&gh.weights)
                    .map(|(t, w)| w * sigmoid(mean + (2.0f64 * var).sqrt() * t))
                    .sum::<f64>()
                    / std::f64::consts::PI.sqrt();
                let approx = probit_probability(mean, var);
                if var == 0.0 {
                    assert!((approx - sigmoid(mean)).abs() < 1e-15);
                }
                worst = worst.max((approx - exact).abs());
            }
        }
        assert!(worst < 0.02, "worst error {worst}");
        assert!(worst > 1e-4, "the approximation is not exact: {worst}");
    }

    /// The rules against independent integrals: E[Φ(f)] and E[σ(f)] by a 300-point rule
    /// (Φ(f̄/√(1 + v)) is exact; the logistic rule of [`LOGISTIC_PREDICTIVE_POINTS`] points
    /// is within 1e-7 absolute for |f̄| ≤ 12, v ≤ 10, and the probability of the less
    /// likely class within 2.1e-8 relative, measured).
    #[test]
    fn probability_rules_match_fine_quadrature() {
        let gh = GaussHermite::new(300).unwrap();
        let expect = |g: &dyn Fn(f64) -> f64, mean: f64, var: f64| {
            gh.nodes
                .iter()
                .zip(&gh.weights)
                .map(|(t, w)| w * g(mean + (2.0f64 * var).sqrt() * t))
                .sum::<f64>()
                / std::f64::consts::PI.sqrt()
        };
        let logistic = ProbabilityRule::logistic_quadrature(LOGISTIC_PREDICTIVE_POINTS).unwrap();
        let odd = ProbabilityRule::logistic_quadrature(LOGISTIC_PREDICTIVE_POINTS + 1).unwrap();
        let mut worst = 0.0f64;
        for mi in -24..=24 {
            let mean = mi as f64 * 0.5;
            for var in [0.0, 0.01, 0.3, 1.0, 4.0, 10.0] {
                let probit = expect(&crate::model::likelihood::probit::normal_cdf, mean, var);
                let got = ProbabilityRule::ProbitExact.probability(mean, var);
                assert!((got - probit).abs() < 1e-12, "probit m={mean} v={var}");
                let sig = expect(&sigmoid, mean, var);
                for rule in [&logistic, &odd] {
                    let got = rule.probability(mean, var);
                    let err = (got - sig).abs();
                    worst = worst.max(err / sig.min(1.0 - sig));
                    assert!(err < 1e-7, "logistic m={mean} v={var}: {got} {sig}");
                }
            }
        }
        eprintln!("logistic predictive: worst relative error of the smaller class {worst:e}");
        assert!(
            worst < 1e-7,
            "worst relative error of the smaller class {worst:e}"
        );
        assert_eq!(
            ProbabilityRule::LogisticProbitApproximation.probability(0.3, 2.0),
            probit_probability(0.3, 2.0)
        );
    }
}
