//! What a fit tells its caller while it runs: the rule's steps as events, in order, to an
//! observer the caller gives ([`FitObserver`]). `pipeline fit` prints them as its progress
//! lines and tables; [`Quiet`] drops them. The stages a fit runs still print their own
//! progress.

use std::path::Path;

use super::outcome::{CandidateOutcome, Figures, ModelFile};
use crate::store::catalog::LabelKind;

/// Receives a fit's events as they happen.
pub trait FitObserver {
    fn event(&mut self, event: FitEvent<'_>);
}

/// An observer that ignores every event.
pub struct Quiet;

impl FitObserver for Quiet {
    fn event(&mut self, _: FitEvent<'_>) {}
}

/// One step of a fit.
pub enum FitEvent<'a> {
    /// The selection data is being ingested: the training file as `dataset`, with a
    /// validation split.
    Ingesting { train: &'a Path, dataset: &'a str },
    /// The rule's plan: the task, the selection data's sizes, the candidates listed, the
    /// budget and the seconds left after this ingest and the final one.
    Planned {
        task: LabelKind,
        rows: u64,
        features: u64,
        labels: u64,
        dense: bool,
        candidates: usize,
        budget_seconds: f64,
        left_seconds: f64,
    },
    /// A candidate's svd and probe start (on the one carve or on a fold).
    CandidateStarted { name: &'a str },
    /// The first probe's step time affords fewer candidates than listed: `kept` of them
    /// each get `needed_steps` steps (`min_epochs` epochs, or the cap); the rest are dropped.
    Dropped {
        step_ms: f64,
        needed_steps: u64,
        min_epochs: u64,
        kept: usize,
        dropped: Vec<&'a str>,
    },
    /// A candidate failed for a reason of its own; the fit goes on without it.
    CandidateFailed {
        name: &'a str,
        error: &'a anyhow::Error,
    },
    /// A candidate's line of the outcome, once it was scored or failed (on the one carve:
    /// its selection run; on folds: its folds combined).
    CandidateDone(&'a CandidateOutcome),
    /// The validation split is small, but folds do not fit the budget: the one carve
    /// decides.
    FoldsDeclined {
        validation_rows: u64,
        folds: u32,
        candidates: usize,
        step_ms: f64,
        seconds: f64,
    },
    /// The validation split is small: each candidate is trained and scored on `folds` folds.
    FoldsChosen {
        validation_rows: u64,
        below_rows: u64,
        folds: u32,
    },
    /// The fold table: every candidate that ran on the folds, and the label frequencies.
    FoldTable(&'a FoldTable),
    /// The one carve's table: every candidate (scored or failed), and the label
    /// frequencies' figures.
    Table {
        candidates: &'a [CandidateOutcome],
        baseline: &'a Figures,
    },
    /// The candidate whose run can go on trains `more` steps from step `from`, with
    /// `left_seconds` of the budget left.
    Extending {
        left_seconds: f64,
        name: &'a str,
        more: u64,
        from: u64,
    },
    /// The chosen candidate does not beat the label frequencies on validation.
    NoBetterThanBaseline,
    /// The rule's choice, trained next on every training row for `steps` steps.
    Chosen { name: &'a str, steps: u64 },
    /// A stage of the final model starts (`ingest`, `svd`, `train`, `predict`, `evaluate`).
    FinalStageStarted { stage: &'a str },
    /// The final model's stages, once all ran.
    FinalStages(&'a [FinalStage]),
    /// The final model's file was written.
    ModelWritten(&'a ModelFile),
    /// The fit is done: its seconds, of its budget; the spec reproduces the final model.
    Done {
        seconds: f64,
        budget_seconds: f64,
        spec: &'a Path,
    },
}

/// One stage of the final model: its run, whether it was memoised, its seconds.
#[derive(Debug, Clone)]
pub struct FinalStage {
    pub stage: String,
    pub run: Option<i64>,
    pub cached: bool,
    pub seconds: f64,
}

/// The fold table: per candidate the mean and standard deviation over the folds of the
/// rule's two figures, and the label frequencies' mean figures.
#[derive(Debug, Clone)]
pub struct FoldTable {
    pub folds: usize,
    /// Multi-label (P@1, P@3), else classification (accuracy, NLP).
    pub ranking: bool,
    pub rows: Vec<FoldRow>,
    /// The label frequencies' mean (primary, secondary) over the folds, higher better (the
    /// secondary of classification is −NLP).
    pub baseline: (f64, f64),
}

/// One candidate's line of the fold table. Figures as the rule keys them: (P@1, P@3), or
/// (accuracy, −NLP).
#[derive(Debug, Clone)]
pub struct FoldRow {
    pub name: String,
    /// The folds' mean milliseconds a step, as their probes measured them.
    pub step_ms: f64,
    /// Steps each fold's run trained, and their median.
    pub steps: Vec<u64>,
    pub median_steps: u64,
    /// Seconds of every fold's runs together.
    pub seconds: f64,
    /// (mean, sample standard deviation) over the folds.
    pub primary: (f64, f64),
    pub secondary: (f64, f64),
}
