//! fsgp: fully scalable Gaussian processes for extreme multi-label classification.
//!
//! Data flows one way through the stages, each a module:
//! text files → [`ingest`] → Parquet CSR chunks → (svd) → factors → (train) → parameters →
//! (predict / evaluate). Every on-disk format and the SQLite catalog live in [`store`].

pub mod cli;
pub mod error;
pub mod evaluate;
pub mod ingest;
pub mod linalg;
pub mod memtrace;
pub mod model;
pub mod predict;
pub mod report;
pub mod runner;
pub mod sparse;
pub mod store;
pub mod svd;
pub mod synth;
pub mod train;
pub mod workspace;
