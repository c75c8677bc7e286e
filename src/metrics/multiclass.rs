//! Metrics of multi-class classification (K classes, one true class per row) from ranked
//! predictions with probabilities: top-1 and top-k accuracy, coverage, NLP, and the Brier
//! score, ECE and MCE of the top-1 confidence (`docs/metrics.md`, "Multi-class").
//!
//! Coverage is eq. 18 of Dhaka, Andersen, Garcia Moreno & Vehtari, *Scalable Gaussian
//! Process for Extreme Classification* (MLSP 2020, the augment-and-reduce GP classifier):
//! K_TP / K*, K* the classes present in the test truth and K_TP those with at least one
//! true positive, i.e. at least one row of the class predicted (top 1) as it.
//!
//! NLP needs the probability of each row's true class. Predictions of a multi-class run
//! record it for every row whatever k ([`MulticlassAccumulator::add_row_knowing`]), so the
//! NLP is always known. Older predictions list only the top k classes with their
//! probabilities ([`MulticlassAccumulator::add_row`]): when a row's true class is not among
//! them its probability is unknown, the row is counted in `nlp_unlisted_rows`, and NLP is
//! reported only when that count is 0.

use anyhow::{bail, ensure, Result};

use super::calibration::{checked_probability, Calibration, CalibrationAccumulator};
use super::fixed::ratio;
use super::nlp::NlpAccumulator;
use super::task::Task;
use super::MAX_K;

/// Coverage code of a class: absent from the test truth so far, present, or present with a
/// true positive. Merging takes the maximum.
const CLASS_ABSENT: u8 = 0;
const CLASS_MISSED: u8 = 1;
const CLASS_COVERED: u8 = 2;

/// Streaming accumulator of the multi-class metrics.
#[derive(Clone, Debug, PartialEq)]
pub struct MulticlassAccumulator {
    k_max: usize,
    rows: u64,
    /// Rows whose true class is within the top k (index k − 1).
    hits: Vec<u64>,
    nlp: NlpAccumulator,
    /// Rows whose true class is not among the listed predictions.
    nlp_unlisted: u64,
    calibration: CalibrationAccumulator,
    /// One code per class id < K.
    classes: Vec<u8>,
    /// Rows whose class the training rows lack (a dataset ingested with `--class-map
    /// train`): wrong at every k.
    unseen_rows: u64,
    /// The distinct classes of those rows, counted in K* and never covered.
    unseen_classes: u64,
}

impl MulticlassAccumulator {
    /// An empty accumulator for `n_classes` = K classes and top-k accuracy at
    /// k = 1..=`k_max` (1 ≤ k_max ≤ 254).
    pub fn new(n_classes: usize, k_max: usize) -> Result<Self> {
        ensure!(
            (1..=MAX_K).contains(&k_max),
            "k_max must be in 1..={MAX_K}, got {k_max}"
        );
        ensure!(
            n_classes >= 1,
            "a multi-class task needs at least one class"
        );
        Ok(Self {
            k_max,
            rows: 0,
            hits: vec![0; k_max],
            nlp: NlpAccumulator::default(),
            nlp_unlisted: 0,
            calibration: CalibrationAccumulator::new(),
            classes: vec![CLASS_ABSENT; n_classes],
            unseen_rows: 0,
            unseen_classes: 0,
        })
    }

    /// Declares `n` classes of the evaluated rows that the training rows lack (they have no
    /// class id < K): K* counts them, and none of them can be covered.
    pub fn add_unseen_classes(&mut self, n: u64) {
        self.unseen_classes = n;
    }

    /// Adds a row whose true class the training rows lack: wrong at every k, and in the
    /// calibration as a wrong top-1 prediction with its confidence; not in the NLP (the
    /// model has no probability for a class it does not know). On error nothing changes.
    pub fn add_unseen_row(&mut self, probabilities: &[f32]) -> Result<()> {
        let confidence = match probabilities.first() {
            Some(&p) => checked_probability(p)?,
            None => 0.0,
        };
        self.calibration.add(confidence, false)?;
        self.rows += 1;
        self.unseen_rows += 1;
        Ok(())
    }

    /// Adds one row: `pred_ranked` the predicted classes best first, `probabilities` theirs
    /// (same order), `truth` the row's true labels, which must be exactly one class < K.
    /// Its NLP term is the listed probability of its class; a row whose class is not listed
    /// is counted in `nlp_unlisted_rows` (NLP unknown). A row without predictions is wrong
    /// at every k, with confidence 0. A duplicate prediction within the top k_max is an
    /// error; on error nothing changes.
    pub fn add_row(
        &mut self,
        pred_ranked: &[u32],
        probabilities: &[f32],
        truth: &[u32],
    ) -> Result<()> {
        self.add(pred_ranked, probabilities, truth, None)
    }

    /// [`Self::add_row`] for a row whose predictions recorded `p_true`, the probability of
    /// its true class, listed or not: the NLP term is p_true. `None` (a row the predictions
    /// gave no value) is an error for a row with a class, and so is a listed true class
    /// whose probability differs from p_true (the two are one number in a file `predict`
    /// wrote); on error nothing changes.
    pub fn add_row_knowing(
        &mut self,
        pred_ranked: &[u32],
        probabilities: &[f32],
        truth: &[u32],
        p_true: Option<f32>,
    ) -> Result<()> {
        self.add(pred_ranked, probabilities, truth, Some(p_true))
    }

    /// One row, with its true class's probability recorded (`Some`) or to be looked up
    /// among the listed classes (`None`).
    fn add(
        &mut self,
        pred_ranked: &[u32],
        probabilities: &[f32],
        truth: &[u32],
        recorded: Option<Option<f32>>,
    ) -> Result<()> {
        ensure!(
            pred_ranked.len() == probabilities.len(),
            "{} predicted classes but {} probabilities",
            pred_ranked.len(),
            probabilities.len()
        );
        let class = match truth {
            [c] if (*c as usize) < self.classes.len() => *c,
            [c] => bail!(
                "true class {c} is not below the number of classes {}",
                self.classes.len()
            ),
            _ => bail!(
                "a multi-class row has exactly one true label; this one has {}",
                truth.len()
            ),
        };
        let top = &pred_ranked[..pred_ranked.len().min(self.k_max)];
        if let Some((r, l)) = top.iter().enumerate().find(|(r, l)| top[..*r].contains(l)) {
            bail!(
                "predicted class {l} appears twice in the row's top {} (rank {})",
                self.k_max,
                r + 1
            );
        }
        let probs = probabilities
            .iter()
            .map(|&p| checked_probability(p))
            .collect::<Result<Vec<f64>>>()?;
        let rank = top.iter().position(|&l| l == class);
        let right = rank == Some(0);
        let confidence = probs.first().copied().unwrap_or(0.0);
        let listed = pred_ranked
            .iter()
            .position(|&l| l == class)
            .map(|at| probs[at]);
        let p_true = match recorded {
            None => listed,
            Some(None) => bail!("the predictions hold no probability of its true class {class}"),
            Some(Some(p)) => {
                let p = checked_probability(p)?;
                if let Some(q) = listed.filter(|&q| q != p) {
                    bail!(
                        "true class {class} is listed with probability {q} but its recorded \
                         probability is {p}"
                    );
                }
                Some(p)
            }
        };
        let (mut nlp, mut calibration) = (self.nlp.clone(), self.calibration.clone());
        if let Some(p) = p_true {
            nlp.add(p)?;
        }
        calibration.add(confidence, right)?;
        self.nlp = nlp;
        self.calibration = calibration;
        self.nlp_unlisted += u64::from(p_true.is_none());
        self.rows += 1;
        if let Some(r) = rank {
            for h in &mut self.hits[r..] {
                *h += 1;
            }
        }
        let code = &mut self.classes[class as usize];
        *code = (*code).max(if right { CLASS_COVERED } else { CLASS_MISSED });
        Ok(())
    }

    /// Adds the rows of `other` (same K and k_max); any grouping gives bit-identical metrics.
    pub fn merge(&mut self, other: &Self) -> Result<()> {
        ensure!(
            self.k_max == other.k_max && self.classes.len() == other.classes.len(),
            "cannot merge multi-class accumulators with different k_max or class counts"
        );
        let mut nlp = self.nlp.clone();
        nlp.merge(&other.nlp)?;
        self.calibration.merge(&other.calibration)?;
        self.nlp = nlp;
        self.rows += other.rows;
        self.nlp_unlisted += other.nlp_unlisted;
        self.unseen_rows += other.unseen_rows;
        self.unseen_classes = self.unseen_classes.max(other.unseen_classes);
        for (a, b) in self.hits.iter_mut().zip(&other.hits) {
            *a += *b;
        }
        for (a, &b) in self.classes.iter_mut().zip(&other.classes) {
            *a = (*a).max(b);
        }
        Ok(())
    }

    /// The metrics of the rows added so far.
    pub fn finish(&self) -> MulticlassMetrics {
        let rows = self.rows as f64;
        let test_classes = self.classes.iter().filter(|&&c| c != CLASS_ABSENT).count() as u64
            + self.unseen_classes;
        let covered_classes = self.classes.iter().filter(|&&c| c == CLASS_COVERED).count() as u64;
        let calibration = self.calibration.finish();
        MulticlassMetrics {
            task: Task::Multiclass,
            k_max: self.k_max,
            rows: self.rows,
            classes: self.classes.len() as u64,
            test_classes,
            covered_classes,
            accuracy: ratio(self.hits[0] as f64, rows),
            top_k_accuracy: self.hits.iter().map(|&h| ratio(h as f64, rows)).collect(),
            coverage: ratio(covered_classes as f64, test_classes as f64),
            nlp: (self.nlp_unlisted == 0).then(|| self.nlp.mean()),
            nlp_floored_rows: self.nlp.floored(),
            nlp_unlisted_rows: self.nlp_unlisted,
            brier: calibration.brier,
            ece: calibration.ece,
            mce: calibration.mce,
            calibration,
            unseen_rows: self.unseen_rows,
            unseen_classes: self.unseen_classes,
        }
    }
}

/// Multi-class metrics, as fractions.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MulticlassMetrics {
    /// Always [`Task::Multiclass`].
    pub task: Task,
    pub k_max: usize,
    pub rows: u64,
    /// K, the number of classes.
    pub classes: u64,
    /// K*: classes present in the test truth (with `unseen_classes`).
    pub test_classes: u64,
    /// K_TP: test classes with at least one row predicted (top 1) as them.
    pub covered_classes: u64,
    /// Top-1 accuracy.
    pub accuracy: f64,
    /// Fraction of rows whose class is within the top k (index k − 1).
    pub top_k_accuracy: Vec<f64>,
    /// K_TP / K* (eq. 18 of Dhaka et al.).
    pub coverage: f64,
    /// −mean log p(y_i | x_i) (probabilities floored at 2⁻²⁴); None (JSON null) when some
    /// row's true class had no known probability (predictions that list the top k classes
    /// only and do not record the true class's).
    pub nlp: Option<f64>,
    pub nlp_floored_rows: u64,
    /// Rows whose true class's probability is unknown: not listed, and not recorded (0
    /// for predictions that record it).
    pub nlp_unlisted_rows: u64,
    /// Brier score of the top-1 confidence: mean (c_i − right_i)².
    pub brier: f64,
    /// Expected calibration error of the top-1 confidence, 15 equal-width bins.
    pub ece: f64,
    pub mce: f64,
    /// The bins behind ECE and MCE, for the reliability diagram.
    pub calibration: Calibration,
    /// Rows whose class the training rows lack (`ingest --class-map train`): in `rows`,
    /// wrong at every k, in the calibration, not in the NLP. Absent from the JSON when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unseen_rows: u64,
    /// Their distinct classes, counted in K* (`test_classes`). Absent from the JSON when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unseen_classes: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}
