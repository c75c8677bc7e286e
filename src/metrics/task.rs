//! What a dataset's labels mean, which decides the metrics (`docs/metrics.md`): the one
//! [`Task`] enum of the store's vocabulary, shared with ingest (a dataset's label kind) and
//! train (`--task`).

pub use crate::store::kinds::Task;
