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

/// Early stopping waits at least this many passes over the training rows without a new
/// best before a run counts as converged. Five: the rule's unit of enough training is ten
/// epochs ([`super::MIN_EPOCHS`]), and the validation figures still moved by points within
/// the first few epochs (docs/fit.md); a run that stopped after 30 steps of a 15-step epoch
/// had not passed over its data twice.
pub const PATIENCE_EPOCHS: u64 = 5;

/// The steps a candidate's probe trains, given the step time its [`FIRST_STEPS`] measured:
/// [`PROBE_STEPS`], or fewer when those would cost more than [`PROBE_SHARE`] of `budget`
/// seconds, and never fewer than the first steps already taken.
pub fn probe_steps(step_seconds: f64, budget: f64) -> u64 {
    let affordable = (PROBE_SHARE * budget / step_seconds.max(1e-9)).floor();
    (affordable.min(PROBE_STEPS as f64) as u64).max(FIRST_STEPS)
}

/// Early stopping's period and patience, in optimiser steps and in scores, for a run that
/// plans `planned` steps over epochs of `epoch_steps`: train's period (a fiftieth of the
/// planned steps, `early::default_every`), and the patience that waits at least
/// [`PATIENCE_EPOCHS`] epochs and at least train's default (a fifth of the planned steps).
pub fn stopping(planned: u64, epoch_steps: u64) -> (u64, u64) {
    let every = early::default_every(planned);
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
    /// Steps of ten epochs (or the cap), which a candidate's share must afford.
    pub needed: u64,
    /// Steps an epoch of the selection data takes.
    pub epoch_steps: u64,
    pub fixed: bool,
}
