//! The input layouts `pipeline ingest` reads (formats in `docs/formats.md`), one per module:
//! - [`XcSingle`]: single files `N D L` + rows `l1,l2 f:v ...`, one for train and optionally
//!   one for test;
//! - [`XcSplit`]: the older layout, one `*_data.txt` plus `*_trSplit.txt` / `*_tstSplit.txt`
//!   files of 1-based row numbers, one column per split;
//! - [`Bow`]: separate feature (`N D`) and label (`N L`) files of `id:value` rows;
//! - [`Libsvm`]: LIBSVM / SVMlight files `label idx:val ...` without a header;
//! - [`Rows`]: the same rows held in memory by the caller (no file).

mod bow;
mod libsvm;
mod rows;
mod xc_single;
mod xc_split;

pub use bow::Bow;
pub use libsvm::Libsvm;
pub use rows::Rows;
pub use xc_single::XcSingle;
pub use xc_split::XcSplit;
