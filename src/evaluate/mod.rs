//! Evaluation of ranked predictions against a split's ground truth.
//!
//! [`metrics`] holds the ranking metrics of the Extreme Classification Repository
//! (P@k, nDCG@k, PSP@k, PSnDCG@k) plus label coverage@k, with pyxclib's conventions;
//! see `docs/metrics.md` for the exact formulas.

pub mod metrics;
