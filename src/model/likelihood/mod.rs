//! The likelihoods, seen through their Gaussian expectations: [`Likelihood`], what the bound
//! needs from a likelihood that factorises over (row, label) terms, with its two Bernoulli
//! links (`logistic.rs`, the paper's; `probit.rs`), and the multi-class likelihoods of one
//! class per row (`multiclass/`, `docs/likelihood.md`, "Multi-class").

pub mod logistic;
pub mod multiclass;
pub mod probit;

/// The default number of quadrature points used by the trainer.
pub const DEFAULT_POINTS: usize = 20;

/// Below this variance [`logistic::BernoulliLogistic::expect`] computes ∂E/∂v in the Price form
/// −½ E[σ(f) σ(−f)] instead of differentiating the node positions (which divides by √v and
/// loses accuracy, then becomes 0/0, as v → 0). At v ≤ 1e-10 the two forms differ by far less
/// than the rounding error of either (`docs/likelihood.md`).
pub const VAR_FLOOR: f64 = 1e-10;

/// A likelihood p(y | f) of labels y = ±1 that factorises over the (row, label) terms of the
/// bound, seen through its Gaussian expectation E(y, m, v) = E_{f ~ N(m, v)}[log p(y | f)]:
/// the bound (`bound/objective.rs`) needs E and its derivatives for many terms at once. A new
/// likelihood of this kind implements this trait (`docs/model.md`, "Code map").
pub trait Likelihood: Sync {
    /// Many expectations at once, in place: on entry `mean[j]`, `var[j]` hold (m_j, v_j) with
    /// labels `y[j]` = ±1; on exit `mean[j]` = ∂E/∂m, `var[j]` = ∂E/∂v and `value[j]` = E.
    /// The results must not depend on how the terms are split into calls.
    fn expect_lanes(&self, y: &[f64], mean: &mut [f64], var: &mut [f64], value: &mut [f64]);
}

/// Value and derivatives of E(y, m, v).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Expectation {
    pub value: f64,
    pub d_mean: f64,
    pub d_var: f64,
}
