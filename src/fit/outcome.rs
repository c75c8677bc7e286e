//! What `pipeline fit` did, as a value: every candidate with its options and validation
//! figures (or why it could not run), the label frequencies' figures, the choice, and the
//! final model's runs, test metrics, spec and model file. `pipeline fit --json` prints it;
//! tests and scripts read it rather than the columns of fit's table.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Serialize;

use crate::metrics::evaluation::Evaluation;

/// The whole of one `pipeline fit`.
#[derive(Debug, Clone, Serialize)]
pub struct FitOutcome {
    /// The dataset the final model trains on (the selection data is `NAME-select`).
    pub dataset: String,
    pub task: &'static str,
    /// Sizes of the selection data's training split, which the candidates were sized by.
    pub selection_rows: u64,
    pub features: u64,
    pub labels: u64,
    pub dense: bool,
    pub budget_seconds: f64,
    /// Wall-clock seconds the whole fit took.
    pub seconds: f64,
    /// How the choice was made: on 1 (the one validation carve) or k folds, whose figures
    /// are then each candidate's means.
    pub folds: u32,
    /// In the order they were listed; the rule's choice is `candidates[chosen]`.
    pub candidates: Vec<CandidateOutcome>,
    pub chosen: usize,
    /// The label frequencies' figures on validation: what a model that learnt nothing from
    /// the features scores.
    pub baseline: Figures,
    /// Steps the final model trained (the chosen candidate's).
    pub final_steps: u64,
    /// The final model's train and evaluate runs (one per seed of the spec).
    pub final_runs: Vec<FinalRun>,
    /// The split the final model was evaluated on: `test` when fit was given a test file,
    /// else `train` (every training row).
    pub evaluated_split: &'static str,
    pub spec: PathBuf,
    pub model: Option<ModelFile>,
}

impl FitOutcome {
    /// The chosen candidate.
    pub fn chosen(&self) -> &CandidateOutcome {
        &self.candidates[self.chosen]
    }
}

/// One candidate of fit's list.
#[derive(Debug, Clone, Serialize)]
pub struct CandidateOutcome {
    pub name: String,
    /// Its svd's and train's options by flag name (a switch's value is empty).
    pub svd: BTreeMap<String, String>,
    pub train: BTreeMap<String, String>,
    #[serde(flatten)]
    pub result: CandidateResult,
}

/// A candidate scored on validation, or one whose svd, probe or run failed for a reason of
/// its own.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub enum CandidateResult {
    Scored {
        /// Milliseconds a step, as its probe measured them (the folds' mean).
        step_ms: f64,
        /// Steps its share of the budget afforded, and steps trained (fewer when early
        /// stopping ended the run; the median over folds).
        planned_steps: u64,
        trained_steps: u64,
        seconds: f64,
        /// Whether early stopping ended its run (on every fold).
        converged: bool,
        validation: Figures,
        /// Its selection run (the first fold's, on folds).
        selection_run: i64,
    },
    Failed {
        /// The first line of the error.
        reason: String,
    },
}

/// The rule's two figures on validation: P@1 and P@3 (multi-label), or accuracy and the
/// negative log predictive density (classification); P@k and accuracy as fractions.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Figures {
    pub primary: Figure,
    pub secondary: Figure,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Figure {
    pub name: &'static str,
    pub value: f64,
}

impl Figures {
    /// The figures of a rule's key (primary, secondary), higher better, for `ranking`
    /// (multi-label) or classification, whose secondary key is −NLP.
    pub fn of_key((primary, secondary): (f64, f64), ranking: bool) -> Figures {
        let figure = |name, value| Figure { name, value };
        match ranking {
            true => Figures {
                primary: figure("P@1", primary),
                secondary: figure("P@3", secondary),
            },
            false => Figures {
                primary: figure("accuracy", primary),
                secondary: figure("nlp", -secondary),
            },
        }
    }
}

/// One seed's final model.
#[derive(Debug, Clone, Serialize)]
pub struct FinalRun {
    pub seed: u64,
    pub train_run: i64,
    /// The steps it trained: the chosen candidate's, or more when a final model trained
    /// for the time left went on with what its faster steps left.
    pub steps: u64,
    pub evaluate_run: i64,
    pub metrics: Evaluation,
}

/// The model file `--model-out` wrote.
#[derive(Debug, Clone, Serialize)]
pub struct ModelFile {
    pub path: PathBuf,
    pub train_run: i64,
    pub checkpoint_step: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification_reports_nlp_as_the_positive_figure_the_key_negates() {
        let f = Figures::of_key((0.9, -0.25), false);
        assert_eq!((f.primary.name, f.primary.value), ("accuracy", 0.9));
        assert_eq!((f.secondary.name, f.secondary.value), ("nlp", 0.25));
        let r = Figures::of_key((0.6, 0.4), true);
        assert_eq!((r.primary.name, r.secondary.name), ("P@1", "P@3"));
        assert_eq!(r.secondary.value, 0.4);
    }
}
