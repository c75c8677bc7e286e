//! The q(u) forms, each with its algebra over the P latent GPs, and the conditional that
//! takes any of them to the marginals at a set of rows (`docs/model.md`, "Code map"): the
//! paper's O(M) sites form (`sites/`), the full-Cholesky forms (`cholesky.rs`), the per-GP
//! pieces both share (`qu/gp_factor.rs`).

pub mod axes;
pub mod cholesky;
pub mod conditional;
pub mod gp_factor;
pub mod sites;
