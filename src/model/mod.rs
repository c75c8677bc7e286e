//! The model layer: MLGPF's parameters, kernels, q(u), likelihoods, bound, optimiser and
//! predictive distribution, with no knowledge of files (`docs/model.md`, "Code map").

pub mod amortiser;
pub mod ar_logit;
pub mod ar_softmax;
pub mod ard;
pub mod argmax;
pub mod cholesky_q;
pub mod class_phase;
pub mod class_sampling;
pub mod conditional;
pub(crate) mod expected;
pub mod feature_ard;
pub mod gp_factor;
pub mod hernandez_lobato;
pub(crate) mod inducing;
pub mod kernel;
pub(crate) mod kl;
pub mod likelihood;
pub mod multiclass;
pub mod objective;
pub mod one_vs_each;
pub mod optim;
pub mod params;
pub mod predictive;
pub mod probit;
pub mod quadrature;
pub mod robust_max;
pub mod scratch;
pub mod softmax_mc;
pub mod subspace;
pub mod terms;
pub mod variational;
