//! The model layer: MLGPF's parameters, kernels, q(u), likelihoods, bound, optimiser and
//! predictive distribution, with no knowledge of files (`docs/model.md`, "Code map"). One
//! folder per kind; which may import which is checked in `tests/architecture.rs`.

pub mod bound;
pub mod kernel;
pub mod likelihood;
pub mod natgrad;
pub mod optim;
pub mod params;
pub mod predictive;
pub mod qu;
pub mod quadrature;
pub mod scratch;
