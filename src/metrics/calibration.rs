//! Calibration of predicted probabilities: the Brier score, the expected and maximum
//! calibration errors over equal-width confidence bins (Guo, Pleiss, Sun & Weinberger, *On
//! Calibration of Modern Neural Networks*, ICML 2017), and the per-bin counts a reliability
//! diagram draws.
//!
//! Each item is a (confidence c ∈ [0, 1], outcome o ∈ {0, 1}) pair: for binary and
//! multi-class predictions the probability of the predicted class and whether the
//! prediction is right, for multi-label predictions a (row, label) pair's probability and
//! whether the label is true (`docs/metrics.md`, "Calibration"). Sums are exact (integers and
//! the fixed-point grid of [`super::fixed`]), so accumulators merge bit-identically in any
//! grouping.

use anyhow::{ensure, Result};

use super::fixed::{from_fixed, ratio, to_fixed};

/// Number of equal-width bins over [0, 1]: Guo et al.'s M = 15.
pub const CALIBRATION_BINS: usize = 15;

/// The bin of confidence `c` ∈ [0, 1]: bin m (0-based) holds m/M < c ≤ (m + 1)/M, with
/// c = 0 in bin 0 (Guo et al.'s I_m = ((m − 1)/M, m/M], 1-based), M = [`CALIBRATION_BINS`].
/// c·M is rounded once in f64, which decides a c within an ulp of a bin edge.
pub fn bin_of(c: f64) -> usize {
    let m = (c * CALIBRATION_BINS as f64).ceil() as usize;
    m.clamp(1, CALIBRATION_BINS) - 1
}

/// A probability as stored (f32), checked: finite and in [0, 1] (−0 is read as 0).
pub fn checked_probability(p: f32) -> Result<f64> {
    ensure!(
        p.is_finite() && (0.0..=1.0).contains(&p),
        "probability {p} is not in [0, 1]"
    );
    Ok(f64::from(p) + 0.0)
}

/// Streaming sums of (confidence, outcome) pairs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CalibrationAccumulator {
    count: u64,
    /// Pairs per bin.
    bin_count: [u64; CALIBRATION_BINS],
    /// Pairs with outcome 1 per bin.
    bin_hits: [u64; CALIBRATION_BINS],
    /// Σ c per bin, fixed point.
    bin_confidence: [i128; CALIBRATION_BINS],
    /// Σ (c − o)², fixed point.
    squared_error: i128,
}

impl CalibrationAccumulator {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one pair; `confidence` must be in [0, 1] (on error nothing changes).
    pub fn add(&mut self, confidence: f64, outcome: bool) -> Result<()> {
        ensure!(
            (0.0..=1.0).contains(&confidence),
            "confidence {confidence} is not in [0, 1]"
        );
        let c = confidence + 0.0;
        let o = if outcome { 1.0 } else { 0.0 };
        let (c_fixed, se_fixed) = (to_fixed(c)?, to_fixed((c - o) * (c - o))?);
        let b = bin_of(c);
        ensure!(
            self.bin_confidence[b].checked_add(c_fixed).is_some()
                && self.squared_error.checked_add(se_fixed).is_some(),
            "fixed-point calibration sum overflow"
        );
        self.count += 1;
        self.bin_count[b] += 1;
        self.bin_hits[b] += u64::from(outcome);
        self.bin_confidence[b] += c_fixed;
        self.squared_error += se_fixed;
        Ok(())
    }

    /// Adds the pairs of `other`; exact, so any grouping of merges gives the same sums.
    pub fn merge(&mut self, other: &Self) -> Result<()> {
        ensure!(
            self.squared_error
                .checked_add(other.squared_error)
                .is_some()
                && self
                    .bin_confidence
                    .iter()
                    .zip(&other.bin_confidence)
                    .all(|(a, b)| a.checked_add(*b).is_some()),
            "fixed-point calibration sum overflow"
        );
        self.count += other.count;
        self.squared_error += other.squared_error;
        for b in 0..CALIBRATION_BINS {
            self.bin_count[b] += other.bin_count[b];
            self.bin_hits[b] += other.bin_hits[b];
            self.bin_confidence[b] += other.bin_confidence[b];
        }
        Ok(())
    }

    /// Pairs added so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The Brier score, ECE, MCE and reliability bins of the pairs added so far (all 0,
    /// and every bin empty, when there are none).
    pub fn finish(&self) -> Calibration {
        let n = self.count as f64;
        let mut ece_sum = 0.0;
        let mut mce: f64 = 0.0;
        let mut reliability = Vec::with_capacity(CALIBRATION_BINS);
        for b in 0..CALIBRATION_BINS {
            let count = self.bin_count[b];
            let conf_sum = from_fixed(self.bin_confidence[b]);
            let hits = self.bin_hits[b] as f64;
            let filled = count > 0;
            if filled {
                // n_b |acc_b − conf_b| = |Σ o − Σ c| over the bin.
                ece_sum += (hits - conf_sum).abs();
                mce = mce.max((hits - conf_sum).abs() / count as f64);
            }
            reliability.push(ReliabilityBin {
                count,
                mean_confidence: filled.then(|| conf_sum / count as f64),
                accuracy: filled.then(|| hits / count as f64),
            });
        }
        Calibration {
            bins: CALIBRATION_BINS,
            count: self.count,
            brier: ratio(from_fixed(self.squared_error), n),
            ece: ratio(ece_sum, n),
            mce,
            reliability,
        }
    }
}

/// Calibration of a set of (confidence, outcome) pairs.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Calibration {
    /// Number of equal-width bins over [0, 1].
    pub bins: usize,
    /// Pairs measured (rows for binary and multi-class, (row, label) pairs for multi-label).
    pub count: u64,
    /// Brier score: mean (c − o)².
    pub brier: f64,
    /// Expected calibration error: Σ_b (n_b / n) |acc_b − conf_b|.
    pub ece: f64,
    /// Maximum calibration error: max over non-empty bins of |acc_b − conf_b|.
    pub mce: f64,
    /// One entry per bin, lowest confidences first.
    pub reliability: Vec<ReliabilityBin>,
}

/// One bin of a reliability diagram: bin b of M holds b/M < c ≤ (b + 1)/M (c = 0 too in
/// the first), see [`bin_of`]; the edges are not stored (the JSON would not give them
/// back bit for bit).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReliabilityBin {
    /// Pairs in the bin.
    pub count: u64,
    /// Mean confidence of its pairs (None when empty).
    pub mean_confidence: Option<f64>,
    /// Fraction of its pairs with outcome 1 (None when empty).
    pub accuracy: Option<f64>,
}
