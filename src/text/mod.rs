//! Rows of input text, shared by the stages that read them: `pipeline ingest` (which writes
//! them as chunks) and `pipeline predict --input` (which scores rows never ingested, so they
//! must be read exactly as the run's dataset was).
//!
//! - [`source`]: a plain, gzip or zstd file (compression by magic bytes) or standard input,
//!   cut into lines and blocks of whole lines with their line numbers, lines capped;
//! - [`header`]: `N D L` / `N D` header lines, and holding a file to its N;
//! - [`parse`]: the row syntaxes (XML repository, BoW, LIBSVM) and their checks, one block
//!   of lines → CSR rows, with the dataset's label ids and feature transform;
//! - [`new_rows`]: rows a trained model never saw, read with its dataset's rules (a model
//!   file's [`crate::store::model_file::DatasetFacts`]), for `predict --input` and `serve`.
//! - [`write`]: rows held in memory written as LIBSVM text (the Python package's arrays,
//!   which `pipeline fit` then ingests as it ingests a user's file).

pub mod header;
pub mod new_rows;
pub mod parse;
pub mod source;
pub mod write;
