pub mod elbo;
pub mod kernel;
pub mod likelihood;
pub mod optim;
pub mod predictive;
pub mod subspace;
pub mod variational;
