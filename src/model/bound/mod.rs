//! The bound's terms and the bound itself (`docs/model.md`, "Code map"): the likelihood
//! terms of a minibatch (`terms.rs`), the expected log-likelihood (`expected.rs`) with its
//! multi-class phase (`class_phase.rs`), and the bound with its gradients (`objective.rs`).

pub mod class_phase;
pub(crate) mod expected;
pub mod objective;
pub mod terms;
