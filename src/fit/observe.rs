//! What a fit tells its caller while it runs: the rule's steps as events, in order, to an
//! observer the caller gives ([`FitObserver`]). `pipeline fit` prints them as its progress
//! lines and tables; [`Quiet`] drops them. The stages a fit runs still print their own
//! progress.

use std::path::Path;

use super::outcome::{CandidateOutcome, CandidateResult, Figures, ModelFile};
use super::plan::MIN_EPOCHS;
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
    /// each get `needed_steps` steps (`min_epochs` epochs and at least `floor` steps, or the
    /// cap); the rest are dropped.
    Dropped {
        step_ms: f64,
        needed_steps: u64,
        min_epochs: u64,
        floor: u64,
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
        /// What the capped fold runs would take, each candidate at its own probe's rate.
        needed_seconds: f64,
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
    /// `left_seconds` of the budget left; `anew` when it was held at its probe of `from`
    /// steps, and its selection run begins from step 0.
    Extending {
        left_seconds: f64,
        name: &'a str,
        more: u64,
        from: u64,
        anew: bool,
    },
    /// No run can train on with its own final model reserved, and the time `leader`'s
    /// final model leaves goes to `name`, whose run is still rising: `more` steps from
    /// `from`, with `left_seconds` of the budget left.
    TrailingExtending {
        left_seconds: f64,
        name: &'a str,
        leader: &'a str,
        more: u64,
        from: u64,
        anew: bool,
    },
    /// `name` scored best on validation, but its run went on in time reserved for another
    /// final model, and its own (about `final_seconds`) no longer fits the `left_seconds`
    /// left to plan with: the best whose final model fits is chosen.
    PassedOver {
        name: &'a str,
        final_seconds: f64,
        left_seconds: f64,
    },
    /// The final model of a candidate without a selection run trained its first leg
    /// (`budget::first_leg`) at `step_ms` a step against its probe's `probe_ms`, and
    /// `spare_seconds` of the plannable budget are left after its scoring: it trains `more`
    /// steps from `from`.
    FinalGoesOn {
        spare_seconds: f64,
        step_ms: f64,
        probe_ms: f64,
        more: u64,
        from: u64,
    },
    /// The final model trained for the time left ends at step `steps` of the `planned`: at
    /// its own rate the time left after its first leg afforded no more.
    FinalEndsShort { steps: u64, planned: u64 },
    /// The one candidate scored had not converged when its selection run ended at `steps`:
    /// its final model trains the time left, `final_steps` steps.
    LoneTimeLeft {
        name: &'a str,
        steps: u64,
        final_steps: u64,
    },
    /// The spec at `spec` changed while the final model trained on to `steps` steps; it
    /// was kept as it is.
    SpecKept { spec: &'a Path, steps: u64 },
    /// No run can train on and `left_seconds` of the budget are left: a candidate the first
    /// probe's cut dropped runs in `share_seconds` of them.
    Readmitted {
        left_seconds: f64,
        name: &'a str,
        share_seconds: f64,
    },
    /// The chosen candidate does not beat the label frequencies on validation.
    NoBetterThanBaseline,
    /// The rule's choice, trained next on every training row for `steps` steps.
    Chosen {
        name: &'a str,
        steps: u64,
        /// Its probe's run is the final model ([`FitEvent::FinalIsProbe`]): nothing is
        /// trained again.
        probe: bool,
    },
    /// The one candidate the budget kept affords fewer steps than a selection run needs
    /// (`needed`: [`MIN_EPOCHS`] epochs and at least `floor` steps, or the cap): no
    /// selection run, its final model trains the time left.
    NoSelectionRun {
        name: &'a str,
        afforded: u64,
        needed: u64,
        floor: u64,
        final_steps: u64,
    },
    /// The final model's fixed costs alone (the whole file's ingest, its svd and scoring,
    /// as measured on the selection data) and the steps its run already took do not fit the
    /// seconds left: the fit is expected to end near `expected_end` seconds, past its budget.
    PastTheBudget {
        fixed_seconds: f64,
        left_seconds: f64,
        expected_end: f64,
        budget_seconds: f64,
    },
    /// The final model's fixed costs do not fit the seconds left, which buy no step more
    /// than the probe of the one candidate took: the probe's run (trained on the selection
    /// split's rows) is the final model.
    FinalIsProbe {
        name: &'a str,
        steps: u64,
        fixed_seconds: f64,
        left_seconds: f64,
    },
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

/// What an event's line is to a person following the fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Weight {
    /// A step of the rule: shown while the fit runs, left out by a quiet caller.
    Progress,
    /// Something the caller should look at (a candidate failed, the choice is no better
    /// than the label frequencies).
    Warning,
    /// What the fit decided or wrote: the choice, the model's file, the end.
    Result,
}

impl FitEvent<'_> {
    /// The event as one line of text and its weight, the one wording every caller shows
    /// (`pipeline fit`'s progress, Python's `logging` records). None for the tables (the
    /// candidates', the folds', the final stages'), which a caller renders from their
    /// values, and for a failed candidate's line ([`FitEvent::CandidateFailed`] said it). A
    /// scored candidate's line repeats what the table will show, for a caller without it.
    pub fn describe(&self) -> Option<(Weight, String)> {
        use Weight::{Progress, Result, Warning};
        let line = match self {
            FitEvent::Ingesting { train, dataset } => (
                Progress,
                format!(
                    "ingest {} as '{dataset}' (with a validation split)",
                    train.display()
                ),
            ),
            FitEvent::Planned {
                task,
                rows,
                features,
                labels,
                dense,
                candidates,
                budget_seconds,
                left_seconds,
            } => (
                Progress,
                format!(
                    "task {}, N = {rows}, D = {features}, L = {labels}, {} rows; \
                     {candidates} candidates (budget {budget_seconds:.0} s, \
                     {left_seconds:.0} s left after this ingest and the final one)",
                    task.as_str(),
                    if *dense { "dense" } else { "sparse" },
                ),
            ),
            FitEvent::CandidateStarted { name } => (Progress, format!("candidate {name}")),
            FitEvent::Dropped {
                step_ms,
                needed_steps,
                min_epochs,
                floor,
                kept,
                dropped,
            } => (
                Progress,
                format!(
                    "at {step_ms:.1} ms a step the budget affords {needed_steps} steps \
                     {} to {kept} candidate(s); dropped: {}",
                    what_a_selection_run_needs(*min_epochs, *floor),
                    dropped.join("; ")
                ),
            ),
            FitEvent::CandidateFailed { name, error } => {
                (Warning, format!("candidate {name} failed: {error:#}"))
            }
            FitEvent::FoldsDeclined {
                validation_rows,
                folds,
                candidates,
                needed_seconds,
                seconds,
            } => (
                Progress,
                format!(
                    "{validation_rows} validation rows, but {folds} folds of {candidates} \
                     candidate(s) need about {needed_seconds:.0} s at their probes' step \
                     times, more than {seconds:.0} s: one carve decides"
                ),
            ),
            FitEvent::FoldsChosen {
                validation_rows,
                below_rows,
                folds,
            } => (
                Progress,
                format!(
                    "{validation_rows} validation rows (fewer than {below_rows}): each \
                     candidate is trained and scored on {folds} folds, chosen by its mean"
                ),
            ),
            FitEvent::Extending {
                left_seconds,
                name,
                more,
                from,
                anew,
            } => (
                Progress,
                format!(
                    "{left_seconds:.0} s left; {name} trains {}",
                    going_on(*more, *from, *anew)
                ),
            ),
            FitEvent::TrailingExtending {
                left_seconds,
                name,
                leader,
                more,
                from,
                anew,
            } => (
                Progress,
                format!(
                    "{left_seconds:.0} s left; {name} trains {}, the final model of {leader} \
                     reserved (it is chosen only if its own final model then fits)",
                    going_on(*more, *from, *anew)
                ),
            ),
            FitEvent::PassedOver {
                name,
                final_seconds,
                left_seconds,
            } => (
                Warning,
                format!(
                    "{name} scored best on validation, but its final model (about \
                     {final_seconds:.0} s) no longer fits the {left_seconds:.0} s left: the \
                     best whose final model fits is chosen"
                ),
            ),
            FitEvent::Readmitted {
                left_seconds,
                name,
                share_seconds,
            } => (
                Progress,
                format!(
                    "{left_seconds:.0} s left and no run can train on: {name}, which the \
                     budget's cut dropped, runs in {share_seconds:.0} s of them"
                ),
            ),
            FitEvent::NoBetterThanBaseline => (
                Warning,
                "the chosen model does not beat the label frequencies on validation: its \
                 features taught it nothing it could show there (features on the wrong \
                 scale, no signal, or too small a budget)"
                    .to_string(),
            ),
            FitEvent::Chosen { name, steps, probe } => (
                Result,
                match probe {
                    false => {
                        format!("chosen {name} ({steps} steps); training it on every training row")
                    }
                    true => {
                        format!("chosen {name} ({steps} steps); its probe's run is the final model")
                    }
                },
            ),
            FitEvent::NoSelectionRun {
                name,
                afforded,
                needed,
                floor,
                final_steps,
            } => (
                Progress,
                format!(
                    "{name}: the budget affords it {afforded} steps of the {needed} {} a \
                     selection run needs, and nothing else is left to choose: no selection \
                     run; its probe is scored, and its final model trains the time left \
                     ({final_steps} steps)",
                    what_a_selection_run_needs(MIN_EPOCHS, *floor)
                ),
            ),
            FitEvent::PastTheBudget {
                fixed_seconds,
                left_seconds,
                expected_end,
                budget_seconds,
            } => (
                Warning,
                format!(
                    "the final model's fixed costs (the whole file's ingest, its svd and \
                     scoring: {fixed_seconds:.0} s) do not fit the {left_seconds:.0} s left: \
                     the fit will end near {expected_end:.0} s, past its budget of \
                     {budget_seconds:.0} s; a budget of {expected_end:.0} s or more fits them"
                ),
            ),
            FitEvent::FinalIsProbe {
                name,
                steps,
                fixed_seconds,
                left_seconds,
            } => (
                Warning,
                format!(
                    "{name}: training it again on every row (the whole file's ingest, its \
                     svd and scoring: {fixed_seconds:.0} s, and its {steps} steps) does not \
                     fit the {left_seconds:.0} s left: its probe's run, trained on the \
                     selection split's rows, is the final model"
                ),
            ),
            FitEvent::FinalStageStarted { stage } => (Progress, format!("final model: {stage}")),
            FitEvent::FinalEndsShort { steps, planned } => (
                Progress,
                format!(
                    "the final model ends at step {steps} of the {planned} planned: at the rate \
                     its own steps ran, the time left affords no more"
                ),
            ),
            FitEvent::FinalGoesOn {
                spare_seconds,
                step_ms,
                probe_ms,
                more,
                from,
            } => (
                Progress,
                format!(
                    "{spare_seconds:.0} s left: the final model's steps took {step_ms:.1} ms \
                     each against its probe's {probe_ms:.1}; it trains {more} steps more from \
                     step {from}"
                ),
            ),
            FitEvent::LoneTimeLeft {
                name,
                steps,
                final_steps,
            } => (
                Progress,
                format!(
                    "{name}: its selection run had not converged at step {steps}, and nothing \
                     else is left to choose: its final model trains the time left \
                     ({final_steps} steps)"
                ),
            ),
            FitEvent::SpecKept { spec, steps } => (
                Warning,
                format!(
                    "{} changed while the final model trained on to step {steps}; it was \
                     kept as it is, and does not say so",
                    spec.display()
                ),
            ),
            FitEvent::ModelWritten(file) => (
                Result,
                format!(
                    "the final model (train run {}, step {}) is in {}",
                    file.train_run,
                    file.checkpoint_step,
                    file.path.display()
                ),
            ),
            FitEvent::Done {
                seconds,
                budget_seconds,
                spec,
            } => (
                Result,
                format!(
                    "{seconds:.0} s of a {budget_seconds:.0} s budget; `pipeline run {}` \
                     reproduces the final model",
                    spec.display()
                ),
            ),
            FitEvent::CandidateDone(c) => match &c.result {
                CandidateResult::Scored {
                    trained_steps,
                    seconds,
                    validation,
                    ..
                } => (
                    Progress,
                    format!(
                        "candidate {}: {} {:.4}, {} {:.4} on validation ({trained_steps} \
                         steps, {seconds:.1} s)",
                        c.name,
                        validation.primary.name,
                        validation.primary.value,
                        validation.secondary.name,
                        validation.secondary.value
                    ),
                ),
                CandidateResult::Failed { .. } => return None,
            },
            FitEvent::FoldTable(_) | FitEvent::Table { .. } | FitEvent::FinalStages(_) => {
                return None
            }
        };
        Some(line)
    }
}

/// What a selection run needs, in the words of a line: "(20 epochs, or the cap)", or with
/// a `floor` of steps (many labels) "(20 epochs and at least 1500 steps at this many
/// labels, or the cap)".
fn what_a_selection_run_needs(min_epochs: u64, floor: u64) -> String {
    match floor {
        0 => format!("({min_epochs} epochs, or the cap)"),
        _ => format!(
            "({min_epochs} epochs and at least {floor} steps at this many labels, or the cap)"
        ),
    }
}

/// What a run that goes on trains: `more` steps from step `from`, or, `anew` (held at its
/// probe of `from` steps), a selection run of its own to step `from + more`.
fn going_on(more: u64, from: u64, anew: bool) -> String {
    match anew {
        true => format!(
            "a selection run of {} steps with early stopping (its share held it at its \
             {from}-step probe)",
            from + more
        ),
        false => format!("{more} steps more from step {from}"),
    }
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
