//! `--early-stopping`: when a run scores its validation split, what a score does to the
//! state a checkpoint carries ([`EarlyState`]), and when the run stops. The loop
//! (`steps.rs`) evaluates, keeps the best checkpoint and stops; this file decides.

use crate::store::checkpoint::EarlyState;
use crate::trained::{EarlyStopping, TrainConfig};

/// Evaluations over a budget when `--validate-every` is left out: the period is
/// ⌈budget / 50⌉ steps, so the default patience of [`DEFAULT_PATIENCE`] evaluations is a
/// fifth of the budget without improvement, whatever the budget's length.
pub const EVALUATIONS_PER_BUDGET: u64 = 50;

/// `--patience`'s default: evaluations in a row without improvement before the run stops.
/// Ten: a validation score of a few hundred rows moves by whole rows and the minibatch
/// noise of the steps between evaluations moves it back and forth, so a run stopped after
/// two or three flat evaluations would stop on noise; ten of the default fifty is a fifth of
/// the budget without a new best.
pub const DEFAULT_PATIENCE: u64 = 10;

/// The default period of the evaluations: ⌈`budget` / [`EVALUATIONS_PER_BUDGET`]⌉ steps.
pub fn default_every(budget: u64) -> u64 {
    budget.div_ceil(EVALUATIONS_PER_BUDGET).max(1)
}

/// Whether the step just taken, `step`, scores the validation split: every `every` steps,
/// counted from step 0. Only there, never at the end of a budget or at a `--max-steps` cut:
/// a run extended on resume then evaluates exactly where an uninterrupted run with the new
/// budget does. (The default period, a fiftieth of the budget rounded up, puts the last
/// evaluation less than a period before the end.)
pub fn due(es: &EarlyStopping, step: u64) -> bool {
    step % es.every == 0
}

/// What a score does: the state after scoring `value` at `step`, and whether it is a new
/// best (the first score always is).
pub fn update(
    es: &EarlyStopping,
    state: Option<EarlyState>,
    value: f64,
    step: u64,
) -> (EarlyState, bool) {
    let best = state.map(|s| s.best_value);
    if es.metric.improves(value, best) {
        let new = EarlyState {
            best_value: value,
            best_step: step,
            since_best: 0,
        };
        return (new, true);
    }
    let mut kept = state.expect("a score that does not improve follows an earlier one");
    kept.since_best += 1;
    (kept, false)
}

/// Whether a run in `state` has stopped: `--patience` evaluations in a row did not improve.
pub fn exhausted(config: &TrainConfig, state: Option<EarlyState>) -> bool {
    match (&config.early_stopping, state) {
        (Some(es), Some(s)) => s.since_best >= es.patience,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trained::StopMetric;

    #[test]
    fn the_best_is_kept_and_the_patience_counts_evaluations_without_a_strict_improvement() {
        let es = EarlyStopping {
            metric: StopMetric::P1,
            patience: 2,
            every: 5,
        };
        let (s, better) = update(&es, None, 0.5, 5);
        assert!(better);
        let (s, better) = update(&es, Some(s), 0.5, 10);
        assert!(!better, "a tie is no improvement");
        assert_eq!((s.best_step, s.since_best), (5, 1));
        let (s, better) = update(&es, Some(s), 0.6, 15);
        assert!(better);
        assert_eq!((s.best_value, s.best_step, s.since_best), (0.6, 15, 0));
        let (s, _) = update(&es, Some(s), 0.4, 20);
        let (s, _) = update(&es, Some(s), 0.59, 25);
        assert_eq!((s.best_step, s.since_best), (15, 2));
        // Lower is better for the NLP.
        let nlp = EarlyStopping {
            metric: StopMetric::Nlp,
            ..es
        };
        let (s, _) = update(&nlp, None, 0.9, 5);
        assert!(update(&nlp, Some(s), 0.8, 10).1);
        assert!(!update(&nlp, Some(s), 1.0, 10).1);
    }

    #[test]
    fn evaluations_fall_on_the_period_only() {
        let es = EarlyStopping {
            metric: StopMetric::Accuracy,
            patience: 3,
            every: 4,
        };
        let due_steps: Vec<u64> = (1..=10).filter(|&s| due(&es, s)).collect();
        assert_eq!(due_steps, [4, 8]);
        assert_eq!(default_every(3000), 60);
        assert_eq!(default_every(10), 1);
        assert_eq!(default_every(101), 3);
    }
}
