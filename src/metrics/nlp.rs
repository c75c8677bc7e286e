//! Mean negative log predictive probability, −(1/n) Σ_i log p(y_i | x_i), from probabilities
//! stored as f32 (`docs/metrics.md`, "NLP and the f32 floor").
//!
//! An f32 probability cannot tell 1 from anything within 2⁻²⁵ of it, so a stored p = 1 may
//! hide 1 − p anywhere in [0, 2⁻²⁵], and log(1 − p) is then −∞ or meaningless. Every
//! probability of the true outcome is therefore floored at [`NLP_FLOOR`] = 2⁻²⁴, the gap
//! between 1 and the f32 just below it, whichever side of 0.5 it came from: a row costs at
//! most 24 ln 2 ≈ 16.64 nats, the metric is the same when the two classes of a binary task are
//! swapped (p ↔ 1 − p), and the number of rows floored is reported beside it.

use anyhow::{ensure, Result};

use super::fixed::{from_fixed, ratio, to_fixed};

/// Smallest probability of the true outcome NLP takes: 2⁻²⁴.
pub const NLP_FLOOR: f64 = 1.0 / 16_777_216.0;

/// Exact streaming sum of −log p(y_i | x_i).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NlpAccumulator {
    rows: u64,
    /// Rows whose probability was raised to [`NLP_FLOOR`].
    floored: u64,
    /// Σ −log max(p, floor), fixed point.
    sum: i128,
}

impl NlpAccumulator {
    /// Adds one row whose true outcome had probability `p_true` ∈ [0, 1] (checked by the
    /// caller); on error nothing changes.
    pub fn add(&mut self, p_true: f64) -> Result<()> {
        let floored = p_true < NLP_FLOOR;
        let term = to_fixed(-p_true.max(NLP_FLOOR).ln())?;
        ensure!(
            self.sum.checked_add(term).is_some(),
            "fixed-point NLP sum overflow"
        );
        self.rows += 1;
        self.floored += u64::from(floored);
        self.sum += term;
        Ok(())
    }

    pub fn merge(&mut self, other: &Self) -> Result<()> {
        ensure!(
            self.sum.checked_add(other.sum).is_some(),
            "fixed-point NLP sum overflow"
        );
        self.rows += other.rows;
        self.floored += other.floored;
        self.sum += other.sum;
        Ok(())
    }

    /// Rows added so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Rows whose probability was floored.
    pub fn floored(&self) -> u64 {
        self.floored
    }

    /// The mean (0 with no rows).
    pub fn mean(&self) -> f64 {
        ratio(from_fixed(self.sum), self.rows as f64)
    }
}
