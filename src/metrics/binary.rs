//! Metrics of binary classification from the predicted probabilities p_i = P(y_i = 1 | x_i):
//! accuracy, NLP, Brier score, ECE/MCE and the AUC (`docs/metrics.md`, "Binary").
//!
//! The class predicted is positive when p_i > 0.5 and negative when p_i ≤ 0.5 (a row at
//! exactly 0.5 is predicted negative, as `p > 0.5` decides in GPflow's and scikit-learn's
//! examples). Calibration is measured on the confidence of the predicted class,
//! max(p_i, 1 − p_i), whether the prediction is right being the outcome; its squared error
//! (max(p, 1 − p) − right)² equals (p_i − y_i)², so the Brier score is the usual one.
//!
//! The AUC needs every score: the accumulator keeps each row's p_i as an f32 (4 bytes per
//! row, in a list per class), and merging concatenates the lists; the AUC is computed on
//! sorted copies, so it does not depend on the order the rows came in.

use anyhow::Result;

use super::calibration::{checked_probability, Calibration, CalibrationAccumulator};
use super::fixed::ratio;
use super::nlp::NlpAccumulator;
use super::task::Task;

/// Streaming accumulator of the binary metrics.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BinaryAccumulator {
    rows: u64,
    /// Rows predicted right.
    correct: u64,
    nlp: NlpAccumulator,
    calibration: CalibrationAccumulator,
    /// p_i of the positive rows, and of the negative ones (−0 stored as 0).
    positive_scores: Vec<f32>,
    negative_scores: Vec<f32>,
}

impl BinaryAccumulator {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a row with predicted probability `p` of the positive class and truth
    /// `positive`; on error (p not in [0, 1]) nothing changes.
    pub fn add_row(&mut self, p: f32, positive: bool) -> Result<()> {
        let p64 = checked_probability(p)?;
        let predicted_positive = p64 > 0.5;
        let right = predicted_positive == positive;
        let confidence = if predicted_positive { p64 } else { 1.0 - p64 };
        let p_true = if positive { p64 } else { 1.0 - p64 };
        // Both checks before any change: the NLP term and the calibration pair.
        let (mut nlp, mut calibration) = (self.nlp.clone(), self.calibration.clone());
        nlp.add(p_true)?;
        // 1 − p is exact in f64 for an f32 p.
        calibration.add(confidence, right)?;
        self.nlp = nlp;
        self.calibration = calibration;
        self.rows += 1;
        self.correct += u64::from(right);
        let score = p + 0.0;
        if positive {
            self.positive_scores.push(score);
        } else {
            self.negative_scores.push(score);
        }
        Ok(())
    }

    /// Adds the rows of `other`; any grouping of merges gives bit-identical metrics.
    pub fn merge(&mut self, other: &Self) -> Result<()> {
        let mut nlp = self.nlp.clone();
        nlp.merge(&other.nlp)?;
        self.calibration.merge(&other.calibration)?;
        self.nlp = nlp;
        self.rows += other.rows;
        self.correct += other.correct;
        self.positive_scores
            .extend_from_slice(&other.positive_scores);
        self.negative_scores
            .extend_from_slice(&other.negative_scores);
        Ok(())
    }

    /// The metrics of the rows added so far.
    pub fn finish(&self) -> BinaryMetrics {
        let calibration = self.calibration.finish();
        BinaryMetrics {
            task: Task::Binary,
            rows: self.rows,
            positives: self.positive_scores.len() as u64,
            accuracy: ratio(self.correct as f64, self.rows as f64),
            nlp: self.nlp.mean(),
            nlp_floored_rows: self.nlp.floored(),
            brier: calibration.brier,
            ece: calibration.ece,
            mce: calibration.mce,
            auc: auc(&self.positive_scores, &self.negative_scores),
            calibration,
        }
    }
}

/// The AUC of scores of positive and negative rows: the Mann–Whitney statistic
/// U / (n₁ n₀), U = #{(i, j) : s_i > s_j} + ½ #{(i, j) : s_i = s_j} over positive i and
/// negative j, which is the rank-sum formula with average ranks for ties. None when either
/// class has no row (the AUC is undefined). Counts are exact (u128); one division at the end.
pub fn auc(positive_scores: &[f32], negative_scores: &[f32]) -> Option<f64> {
    if positive_scores.is_empty() || negative_scores.is_empty() {
        return None;
    }
    let sorted = |s: &[f32]| {
        let mut v = s.to_vec();
        v.sort_unstable_by(f32::total_cmp);
        v
    };
    let (pos, neg) = (sorted(positive_scores), sorted(negative_scores));
    // 2U = Σ over distinct positive scores v: (positives at v) · (2 · negatives below v +
    // negatives at v).
    let (mut twice_u, mut below, mut i) = (0u128, 0usize, 0usize);
    while i < pos.len() {
        let v = pos[i];
        let run = pos[i..].iter().take_while(|&&s| s == v).count();
        while below < neg.len() && neg[below] < v {
            below += 1;
        }
        let ties = neg[below..].iter().take_while(|&&s| s == v).count();
        twice_u += run as u128 * (2 * below + ties) as u128;
        i += run;
    }
    let pairs = pos.len() as u128 * neg.len() as u128;
    Some(twice_u as f64 / (2 * pairs) as f64)
}

/// Binary classification metrics, as fractions.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BinaryMetrics {
    /// Always [`Task::Binary`] (tells the metrics file apart from the others).
    pub task: Task,
    pub rows: u64,
    /// Rows whose truth is positive.
    pub positives: u64,
    /// Fraction of rows with (p > 0.5) = y.
    pub accuracy: f64,
    /// −mean log p(y_i | x_i), each probability floored at 2⁻²⁴.
    pub nlp: f64,
    /// Rows whose probability of the true class was below 2⁻²⁴ and floored.
    pub nlp_floored_rows: u64,
    /// Mean (p_i − y_i)².
    pub brier: f64,
    /// Expected calibration error on max(p, 1 − p), 15 equal-width bins.
    pub ece: f64,
    /// Maximum calibration error over the same bins.
    pub mce: f64,
    /// Area under the ROC curve; None (JSON null) when the truth has a single class.
    pub auc: Option<f64>,
    /// The bins behind ECE and MCE, for the reliability diagram.
    pub calibration: Calibration,
}
