//! Fit: from a training file (and a test file) to a chosen model in one call, inside a
//! wall-clock budget (`docs/fit.md` states the rule; it was written before any run). The
//! layer above the stages: it runs ingest, svd, train, predict and evaluate through their
//! typed options, and `pipeline fit` (`cli::fit`) is its command line.
//!
//! ```no_run
//! use fsgp::fit::{self, FitRequest, Quiet};
//! use fsgp::train::{TrainFlag, TrainOptions};
//! use fsgp::trained::KernelChoice;
//!
//! let ws = fsgp::store::workspace::Workspace::open("fsgp-workspace".as_ref())?;
//! let mut request = FitRequest::new("train.txt"); // every other option at pipeline fit's default
//! request.test = Some("test.txt".into());
//! request.budget_seconds = 120.0;
//! request.overrides = TrainOptions {
//!     kernel: KernelChoice::Linear,
//!     given: [TrainFlag::Kernel].into(),
//!     ..TrainOptions::default()
//! };
//! let outcome = fit::run(&ws, &request, &mut Quiet)?; // FitOutcome: `pipeline fit --json`, typed
//! println!("{}: {:?}", outcome.chosen().name, outcome.final_runs[0].metrics);
//! # anyhow::Ok(())
//! ```
//!
//! 1. **Selection data.** The training file is ingested with `--transform auto` and a
//!    validation carve (`<name>-select`); the task is the dataset's label kind unless given.
//! 2. **Candidates.** A short list from the family in order of preference, fixed by the
//!    task, the data's sizes and whether its rows are dense ([`candidates`]). Each gets an
//!    equal share of the selection time left: a probe of [`PROBE_STEPS`] steps (fewer when
//!    steps are slow, [`budget::probe_steps`]) measures its step time, then a run of the
//!    steps its share affords (capped, [`step_cap`]), stopped by train's early stopping
//!    once its validation score no longer improves for [`budget::PATIENCE_EPOCHS`] passes,
//!    is scored on the validation split at its last step; time a stopped run did not use
//!    goes to the candidates after it, and what is left at the end to the leader
//!    ([`budget::train_on`]). A candidate that fails for a reason of its own is a line of
//!    the table ([`budget::Row::Failed`]). The first probe also decides how many candidates the budget
//!    affords ([`affordable`]): the list is cut from its end until each share buys
//!    [`plan::MIN_EPOCHS`] epochs (or the cap), so a large dataset trains fewer candidates
//!    deeper instead of many barely. A lone candidate whose share buys fewer gets no
//!    selection run ([`budget::takes_selection_run`]): its probe is scored, and its final
//!    model trains the time left.
//! 3. **Choice.** Multi-label: the highest validation P@1; binary and multi-class: the
//!    highest validation accuracy, and within [`ACCURACY_TIE`] of it the lowest NLP. On a
//!    validation split of fewer than [`folds::FOLDS_BELOW_ROWS`] rows, by each candidate's
//!    mean over k folds when the budget affords them ([`folds`]).
//! 4. **Final model.** A spec is written that ingests the training file whole (no carve)
//!    and trains the winner for the steps its selection run took (without one, the steps
//!    the time left affords), and it is run as
//!    `pipeline run` runs it: the test metrics printed are those the spec reproduces.
//!
//! The budget is kept by measurement, not by interrupting runs: every share is converted to
//! a step count from the probe's measured step time with a safety factor, so each run is a
//! reproducible number of steps at most (early stopping ends it on the scores, never on
//! the clock).

mod budget;
mod folds;
mod inputs;
mod names;
mod observe;
mod options;
mod outcome;
mod plan;
mod request;
mod rule;
mod run;
mod sizes;

pub use inputs::InputFormat;
pub use observe::{FinalStage, FitEvent, FitObserver, FoldRow, FoldTable, Quiet, Weight};
pub use outcome::{
    CandidateOutcome, CandidateResult, Figure, Figures, FinalRun, FitOutcome, ModelFile,
};
pub use request::{FitRequest, DEFAULT_BUDGET_SECONDS, DEFAULT_VALIDATION_FRACTION};
pub use rule::ACCURACY_TIE;
pub use run::run;
