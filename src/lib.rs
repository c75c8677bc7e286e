//! fsgp: fully scalable Gaussian processes for extreme multi-label classification.
//!
//! Data flows one way: text files → [`ingest`] → Parquet CSR chunks → [`svd`] → factors →
//! [`train`] → parameters → [`predict`] → predictions → [`evaluate`] → metrics.
//!
//! Layers, each importing only those below it (checked by `tests/architecture.rs`):
//! - [`cli`]: the command line (the only user of clap) and `pipeline run` specs;
//! - the stages [`synth`], [`ingest`], [`svd`], [`train`], [`predict`], [`evaluate`],
//!   [`report`], [`export`], [`serve`]: none imports another; each is a thin use of [`stage`], the one protocol
//!   by which a stage memoises, computes, publishes and registers its outputs;
//! - library modules the stages share: [`trained`] (a trained run's configuration, svd
//!   files and checkpoints), [`scoring`] (ranking rows under a model), [`projection`]
//!   (rows onto the basis), [`sparse`] (sparse × dense kernels), [`topk`], [`metrics`],
//!   [`transform`] (feature transforms fitted at ingest), [`text`] (input rows of text: the
//!   line reader and the row parser ingest and `predict --input` share), [`portable`] (a
//!   model file's typed contents: what scoring a new row needs without the workspace);
//! - [`model`] (the GP model; knows no files) and [`store`] (every on-disk format, the
//!   catalog, the workspace directory);
//! - [`linalg`], [`error`], [`memtrace`], [`alloc`] (the allocator's tunables per phase), [`failpoint`] (fault injection for the tests),
//!   [`comm`] (one process, or the ranks of an MPI job), [`choice`] (closed sets of named
//!   values, each declared once as a table), [`progress`] (typed progress events and the
//!   process-wide sink they go to: the library never prints progress itself).

pub mod alloc;
pub mod choice;
pub mod cli;
pub mod comm;
pub mod error;
pub mod evaluate;
pub mod export;
pub mod failpoint;
pub mod fit;
pub mod ingest;
pub mod linalg;
pub mod memtrace;
pub mod metrics;
pub mod model;
pub mod portable;
pub mod predict;
pub mod progress;
pub mod projection;
pub mod report;
pub mod scoring;
pub mod serve;
pub mod sparse;
pub mod stage;
pub mod stop;
pub mod store;
pub mod svd;
pub mod synth;
pub mod text;
pub mod topk;
pub mod train;
pub mod trained;
pub mod transform;
