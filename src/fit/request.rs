//! What a caller asks of a fit: the files, the task, the budget, the seed, the validation
//! carve, train options every candidate takes, and where the spec and model go.

use std::path::PathBuf;

use anyhow::{ensure, Result};

use super::inputs::InputFormat;
use crate::ingest::rows::MemoryRows;
use crate::ingest::validation::ValidationSplit;
use crate::store::catalog::LabelKind;
use crate::train::TrainOptions;

/// The share of the training rows carved out for choosing the model unless one is given.
pub const DEFAULT_VALIDATION_FRACTION: f64 = 0.2;

/// The budget of a fit unless one is given: five minutes.
pub const DEFAULT_BUDGET_SECONDS: f64 = 300.0;

/// One fit, as [`run`](super::run) takes it. [`FitRequest::new`] gives `pipeline fit`'s
/// defaults for a training file.
#[derive(Debug, Clone, PartialEq)]
pub struct FitRequest {
    /// The training file (XML-repository text with its `N D L` header, or LIBSVM; gzip or
    /// zstd by their magic bytes).
    pub train: PathBuf,
    /// The test file, scored once by the final model.
    pub test: Option<PathBuf>,
    /// The files' layout (None: `xc` when the first line is an `N D L` header, else
    /// `libsvm`).
    pub format: Option<InputFormat>,
    /// LIBSVM: the number of features D (None: the largest index in the files).
    pub features: Option<u32>,
    /// The task (None: the label kind ingest detects).
    pub task: Option<LabelKind>,
    /// Wall-clock seconds of the whole fit.
    pub budget_seconds: f64,
    /// The dataset's name (None: the training file's name up to its first '.', made unique
    /// in the workspace); the selection data is `NAME-select`.
    pub name: Option<String>,
    /// Seed of the validation carve, the svd and every training run.
    pub seed: u64,
    /// Share of the training rows carved out for choosing the model, in (0, 1).
    pub validation_fraction: f64,
    /// Train options every candidate takes, overriding its own: those `overrides.given`
    /// names (an `inducing` sets the svd's count of k-means inducing rows too).
    pub overrides: TrainOptions,
    /// Whether train's early stopping ends each candidate's run once its validation score
    /// stops improving (else each trains its whole share).
    pub early_stopping: bool,
    /// Whether small data is chosen on k folds (else on the one carve).
    pub folds: bool,
    /// Where the spec of the final model goes (None: a new file in the workspace,
    /// `fits/NAME-fit.toml`).
    pub spec_out: Option<PathBuf>,
    /// Where the final model's file goes, as `pipeline export` writes it (None: nowhere).
    pub model_out: Option<PathBuf>,
    /// Replace an existing regular file at `spec_out` or `model_out`.
    pub force: bool,
    /// The training rows in memory instead of a file ([`FitRequest::from_rows`]): `train`
    /// then only names them, and there is no test file.
    pub rows: Option<MemoryRows>,
}

impl FitRequest {
    /// `pipeline fit --train TRAIN`'s request: every other option at its default.
    pub fn new(train: impl Into<PathBuf>) -> Self {
        FitRequest {
            train: train.into(),
            test: None,
            format: None,
            features: None,
            task: None,
            budget_seconds: DEFAULT_BUDGET_SECONDS,
            name: None,
            seed: 0,
            validation_fraction: DEFAULT_VALIDATION_FRACTION,
            overrides: TrainOptions::default(),
            early_stopping: true,
            folds: true,
            spec_out: None,
            model_out: None,
            force: false,
            rows: None,
        }
    }

    /// A fit of rows in memory (the Python package's arrays): no file is read or written
    /// for them; D is theirs, and the dataset's name is `rows` unless one is given.
    pub fn from_rows(rows: MemoryRows) -> Self {
        FitRequest::new("rows").with_rows(rows)
    }

    /// This request on rows in memory instead of its training file ([`FitRequest::from_rows`]).
    pub fn with_rows(self, rows: MemoryRows) -> Self {
        FitRequest {
            train: "rows".into(),
            features: Some(rows.n_features()),
            rows: Some(rows),
            ..self
        }
    }

    /// Refuses the values no type rules out: a budget that is not a positive number of
    /// seconds, a validation fraction outside (0, 1), a test file or format with rows in
    /// memory.
    pub fn check(&self) -> Result<()> {
        if let Some(rows) = &self.rows {
            ensure!(
                self.test.is_none() && self.format.is_none(),
                "test, format: a fit of {} takes neither a test file nor a format",
                rows.describe()
            );
        }
        ensure!(
            self.budget_seconds.is_finite() && self.budget_seconds > 0.0,
            "budget: found {} s, expected a positive number of seconds",
            self.budget_seconds
        );
        ensure!(
            ValidationSplit::fraction_ok(self.validation_fraction),
            "validation fraction: found {}, expected a number in (0, 1)",
            self.validation_fraction
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_refuses_a_budget_or_fraction_no_fit_can_have() {
        assert!(FitRequest::new("t.svm").check().is_ok());
        for budget in [0.0, -5.0, f64::NAN, f64::INFINITY] {
            let r = FitRequest {
                budget_seconds: budget,
                ..FitRequest::new("t.svm")
            };
            let e = r.check().unwrap_err().to_string();
            assert!(e.contains("budget: found"), "{e}");
        }
        for fraction in [0.0, 1.0, 1.5, f64::NAN] {
            let r = FitRequest {
                validation_fraction: fraction,
                ..FitRequest::new("t.svm")
            };
            let e = r.check().unwrap_err().to_string();
            assert!(e.contains("validation fraction: found"), "{e}");
        }
    }
}
