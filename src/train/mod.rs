//! `pipeline train` and `pipeline elbo`: stochastic variational inference for MLGPF on the
//! factors of `pipeline svd`, minibatches streamed through a bounded prefetch queue,
//! Parquet checkpoints registered as they are written (so a killed run resumes), and the
//! exact full-data bound of a checkpoint.
//!
//! Data flow: `kxx.npy` + `sq_norms.npy` (memory maps) + the train split's label columns →
//! [`batches::Prefetcher`] → `model` (bound and gradient) → Adam → `store::checkpoint`.
//!
//! Files: `options` (what a caller asks), `budget` (how many steps: `--epochs`, `--steps`,
//! the default's floor on small data), `setup` (what is fixed for a run),
//! `session` (start, memoise or resume a run), `resume` (what `--resume` may change),
//! `steps` (the step loop), `checkpoints` (writing, registering and pruning them; the best
//! one of an early-stopping run kept), `early` (`--early-stopping`: when to score the
//! validation split, what a score does, when to stop),
//! `held_out` (`--eval-every`, and early stopping's scores), `exact` (the full-data bound, `pipeline elbo`), `batches`
//! (planner and prefetch queue), `classes` (the multi-class task's terms), `init` (initial
//! parameters), `ranks` (over MPI ranks: the all-reduce of the bound and gradient, the
//! divergence check).

pub mod batches;
pub mod budget;
mod checkpoints;
mod classes;
pub(crate) mod declare;
pub mod early;
mod exact;
mod held_out;
pub mod init;
mod options;
mod ranks;
mod resume;
mod session;
mod setup;
mod steps;
mod warm;

pub use exact::{elbo, ElboOptions};
pub use options::{
    TrainFlag, TrainOptions, TrainValue, DEFAULT_FACTORS, DEFAULT_LR_DECAY, MAX_PRIOR_VARIANCE,
    MIN_PRIOR_VARIANCE,
};
pub use session::{run, run_on};
pub use steps::TrainSummary;
