//! The pure planning of `pipeline fit`'s budget (`docs/fit.md`, step 3): how long a probe
//! is, early stopping's period and patience, and what a selection run is given.

use crate::store::catalog::LabelKind;
use crate::train::early;

/// Steps of the probe that measures a candidate's step time (then resumed from).
pub const PROBE_STEPS: u64 = 50;

/// The probe's first steps, a run of their own: they measure the step time that decides how
/// many more the probe can afford. Three: the first step also pays for allocating the
/// step's buffers, and two more bring the average near the steady rate.
pub const FIRST_STEPS: u64 = 3;

/// A candidate's probe may cost at most this share of the whole budget. On a set of 53 000
/// labels a step took 6 s, so [`PROBE_STEPS`] steps were the whole of a five-minute
/// budget; 5 % keeps four probes under a fifth of it.
pub const PROBE_SHARE: f64 = 0.05;

/// A candidate's share must afford this many epochs (or the step cap) for the budget to
/// afford the candidate; below it, later candidates in the list are dropped, and a lone
/// candidate gets no selection run (`budget::takes_selection_run`). Twenty: a selection run
/// is worth its time only if it converges (the validation figures of every family member
/// still moved by points within the first few epochs), which takes its climb to its best
/// score and then [`PATIENCE_EPOCHS`] more; every step of one that does not
/// converge is paid again by the final model. At ten (until 2026-11-30) a 53 000-label set
/// kept two candidates, neither converged, and the final model trained half the steps a
/// lone candidate's would (docs/fit.md, "The cut at twenty epochs").
pub const MIN_EPOCHS: u64 = 20;

/// Early stopping waits at least this many passes over the training rows without a new
/// best before a run counts as converged. Five: the validation figures still moved by
/// points within the first few epochs (docs/fit.md), and a run that stopped after 30 steps
/// of a 15-step epoch had not passed over its data twice; a share of [`MIN_EPOCHS`] epochs
/// leaves fifteen for the climb to the best score.
pub const PATIENCE_EPOCHS: u64 = 5;

/// The steps a candidate's probe trains, given the step time its [`FIRST_STEPS`] measured:
/// [`PROBE_STEPS`], or fewer when those would cost more than [`PROBE_SHARE`] of `budget`
/// seconds, and never fewer than the first steps already taken.
pub fn probe_steps(step_seconds: f64, budget: f64) -> u64 {
    let affordable = (PROBE_SHARE * budget / step_seconds.max(1e-9)).floor();
    (affordable.min(PROBE_STEPS as f64) as u64).max(FIRST_STEPS)
}

/// The largest share of a selection run's seconds its validation scores may take. At
/// 50 000 labels one score of 6 000 validation rows took 4.3 s against 0.43 s a step, so
/// train's fifty scores cost more than the steps: a five-minute fit planned 146 steps in
/// 63 s and its run took 314 s. A tenth keeps the period at train's fiftieth wherever a
/// score costs less than about two steps' time a period.
pub const SCORING_SHARE: f64 = 0.1;

/// How many validation scores of `score_seconds` each a selection run of `left` seconds
/// pays for: train's [`early::EVALUATIONS_PER_BUDGET`], or the fewer that
/// [`SCORING_SHARE`] of `left` affords (at least one). A count, not seconds divided by a
/// score's seconds again: 50 scores' seconds over one score's came out at 49.999… for
/// about one measured time in eleven, and a 3 000-step run's period went from 60 steps to
/// 62, so two fits of the same rows stopped at different steps.
pub fn affordable_scores(left: f64, score_seconds: f64) -> u64 {
    scores_within(SCORING_SHARE * left, score_seconds)
}

/// The scores of `score_seconds` each that `seconds` pay for, at most train's
/// [`early::EVALUATIONS_PER_BUDGET`] and at least one.
pub fn scores_within(seconds: f64, score_seconds: f64) -> u64 {
    let most = early::EVALUATIONS_PER_BUDGET;
    if score_seconds <= 0.0 {
        return most;
    }
    let within = (seconds / score_seconds).floor();
    within.clamp(1.0, most as f64) as u64
}

/// The fewest steps worth extending a run by (a resume and a score): its scores' period
/// `every`, or, where dear scores made that period longer than train's for `planned`
/// steps, an epoch's `epoch_steps` when fewer (at 50 000 labels a run scored once in 119
/// steps, and 77 more steps, 1.6 epochs, were refused for want of 119).
pub fn extension_floor(every: u64, planned: u64, epoch_steps: u64) -> u64 {
    let every = every.max(1);
    match every > early::default_every(planned) {
        true => every.min(epoch_steps.max(1)),
        false => every,
    }
}

/// Above `rule::MANY_LABELS` labels a selection run needs at least this many steps,
/// however few an epoch has (`rule::selection_floor`). Each row's bound there holds 1 500
/// of the negatives, so a label outside the most frequent gets its negative terms from few
/// rows a minibatch, and the label side is larger (P of 50 and more): on two sets of about
/// 14 000 rows and 31 000 to 53 000 labels the ridge-started subspace was still rising at
/// 1 300 to 1 500 steps, where [`MIN_EPOCHS`] epochs were 460. A selection run that short
/// cannot converge, and the cut kept two candidates whose final model then trained a third
/// to a half of a lone candidate's steps (docs/fit.md, "Above 4 000 labels, at least 1 500
/// steps").
pub const MANY_LABELS_MIN_STEPS: u64 = 1500;

/// The steps a candidate's share must afford for a selection run ([`Plan::needed`]):
/// [`MIN_EPOCHS`] epochs of `n` rows in minibatches of `batch`, and at least `floor`
/// ([`MANY_LABELS_MIN_STEPS`] above `rule::MANY_LABELS` labels, else 0); or the step
/// `cap` when that is fewer (small data).
pub fn needed_steps(n: u64, batch: u64, cap: u64, floor: u64) -> u64 {
    let epochs = MIN_EPOCHS * n.div_ceil(batch.max(1));
    epochs.max(floor).min(cap)
}

/// Early stopping's period and patience, in optimiser steps and in scores, for a run that
/// plans `planned` steps over epochs of `epoch_steps` and may pay for `scores` validation
/// scores ([`affordable_scores`]): train's period (a fiftieth of the planned steps,
/// `early::default_every`) or the longer one that keeps to those scores, and the patience
/// that waits at least [`PATIENCE_EPOCHS`] epochs and at least train's default (a fifth of
/// the planned steps at train's period).
pub fn stopping(planned: u64, epoch_steps: u64, scores: u64) -> (u64, u64) {
    let every = early::default_every(planned).max(planned.div_ceil(scores.max(1)));
    let wait = (PATIENCE_EPOCHS * epoch_steps.max(1)).div_ceil(every);
    (every, wait.max(early::DEFAULT_PATIENCE))
}

/// What the selection loop needs besides the list.
pub struct Plan {
    pub dataset: String,
    pub kind: LabelKind,
    pub seed: u64,
    pub budget: f64,
    /// Seconds of the budget left after the selection ingest and the final one.
    pub left: f64,
    pub cap: u64,
    /// Steps of [`MIN_EPOCHS`] epochs and at least `floor` (or the cap), which a
    /// candidate's share must afford ([`needed_steps`]).
    pub needed: u64,
    /// The fewest steps a selection run needs whatever its epochs (`rule::selection_floor`:
    /// [`MANY_LABELS_MIN_STEPS`] above 4 000 labels, else 0).
    pub floor: u64,
    /// Steps an epoch of the selection data takes.
    pub epoch_steps: u64,
    pub fixed: bool,
}

/// The share of the budget that the time left to the leader and to dropped candidates
/// leaves unplanned. The final model's fixed costs (the whole file's svd, the test split's
/// scoring) are priced by what the selection data's took, and come out a little dearer on
/// the whole file: at 50 000 labels its svd took 16.5 s against 15.6, and a five-minute
/// fit whose leader trained on to the last affordable step ended at 303 s (docs/fit.md,
/// "Many labels"). 2 % is 6 s of five minutes, 1.2 s of one.
pub const UNPLANNED_SHARE: f64 = 0.02;

/// A final model trained for the time left (a candidate without a selection run, or a
/// lone one whose run did not converge) may train this many step caps. The cap bounds a
/// selection run, which early stopping ends sooner where the data allow; such a final model
/// has no validation to stop it and trains what the clock affords, which on a faster VM was
/// more than the cap: two five-minute fits whose final models stopped at the cap of 3 000
/// steps ended at 223 and 244 s (docs/fit.md, "At the step cap"). The clock bounds it;
/// four caps only bound a step time measured far too fast.
pub const TIME_LEFT_CAPS: u64 = 4;

impl Plan {
    /// The seconds the extensions plan against: the budget less [`UNPLANNED_SHARE`].
    pub fn plannable(&self) -> f64 {
        self.budget * (1.0 - UNPLANNED_SHARE)
    }

    /// The most steps a final model trained for the time left may take: [`TIME_LEFT_CAPS`]
    /// step caps.
    pub fn time_left_ceiling(&self) -> u64 {
        self.cap.saturating_mul(TIME_LEFT_CAPS)
    }
}
