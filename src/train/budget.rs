//! How long a run trains: its budget, in epochs (`--epochs`) or in optimiser steps
//! (`--steps`, the two exclusive), cut short by `--max-steps` when that comes first; and the
//! floor the default budget keeps on small data (`docs/options.md`, "Budgets and early
//! stopping").
//!
//! An epoch is ⌈N/B⌉ steps or so, so a budget in epochs shrinks with the data: the 40
//! epochs chosen on Delicious (12 920 rows, 26 steps an epoch, 1 040 steps) are 40 steps on
//! a 333-row set, too few for Adam at η = 0.01 to move the parameters far from their start.
//! The default budget, `--epochs 10` given neither `--epochs` nor `--steps`, is therefore
//! raised to [`DEFAULT_MIN_STEPS`] steps when its epochs hold fewer; an explicit budget is
//! taken as given.

use anyhow::{bail, Result};

use super::batches::{spans_from_rows, Order, Planner, MAX_EPOCHS};
use crate::store::catalog::{DatasetRow, Split};
use crate::store::workspace::Workspace;
use crate::trained::TrainConfig;

/// The fewest optimiser steps the default budget takes. On the development sets, with
/// every other option at its default, the validation figures stop improving between 500
/// and 3 000 steps, while the 10 default epochs are 20 to 90 steps there; 3 000 steps is
/// also the measurement (P@1 54.3 after 40 steps, 80.8 after 3 000, on 333 rows),
/// and costs minutes at most on data that small (`docs/options.md`, "Budgets and early
/// stopping", has the measurements). Data of more than 300 × B rows (150 000 at B = 500)
/// runs its 10 default epochs untouched.
pub const DEFAULT_MIN_STEPS: u64 = 3000;

/// The steps of `config`'s budget alone: `--steps S`, or every minibatch of its `epochs`
/// epochs as `planner` cuts them (None past [`MAX_EPOCHS`]).
pub fn budget_steps(config: &TrainConfig, planner: &Planner) -> Option<u64> {
    match config.steps {
        Some(steps) => Some(steps),
        None => planner.steps_in(config.epochs, u64::MAX),
    }
}

/// The steps a run of `config` takes in all: its budget, or `--max-steps` if fewer.
pub fn planned_steps(config: &TrainConfig, planner: &Planner) -> Option<u64> {
    budget_steps(config, planner).map(|b| b.min(config.max_steps.unwrap_or(u64::MAX)))
}

/// The epochs `steps` optimiser steps reach: the fewest whose minibatches number at least
/// `steps` (the last of them possibly cut short). Refused past [`MAX_EPOCHS`].
pub fn epochs_for(planner: &Planner, steps: u64) -> Result<u64> {
    let too_many = || {
        format!(
            "--steps {steps}: that is more than {MAX_EPOCHS} epochs of this dataset's training \
             rows; give fewer"
        )
    };
    if let Some(per_epoch) = planner.fixed_epoch_batches() {
        if per_epoch == 0 {
            bail!("the training split has no rows");
        }
        let epochs = steps.div_ceil(per_epoch);
        if epochs > MAX_EPOCHS {
            bail!(too_many());
        }
        return Ok(epochs);
    }
    let mut total = 0u64;
    for epoch in 0..MAX_EPOCHS {
        total = total.saturating_add(planner.batches_in_epoch(epoch));
        if total >= steps {
            return Ok(epoch + 1);
        }
    }
    bail!(too_many())
}

/// The minibatch plan of a run of `config` on `dataset`'s training split, for counting its
/// steps before anything else is opened.
pub fn planner_of(ws: &Workspace, dataset: &DatasetRow, config: &TrainConfig) -> Result<Planner> {
    Ok(Planner {
        chunks: spans_from_rows(ws.split_chunks(dataset, Split::Train)?),
        batch: config.batch,
        order: Order::Shuffled {
            seed: config.seed,
            window: config.shuffle_chunks,
        },
    })
}

/// Sets `config`'s budget: `--steps S` (with `epochs` the epochs S reaches), an explicit
/// `--epochs`, or the default epochs raised to [`DEFAULT_MIN_STEPS`] steps when they hold
/// fewer. `explicit_epochs` says whether `--epochs` was given. Returns the note to print
/// when the floor applied.
pub fn settle(
    config: &mut TrainConfig,
    planner: &Planner,
    explicit_epochs: bool,
) -> Result<Option<String>> {
    if let Some(steps) = config.steps {
        config.epochs = epochs_for(planner, steps)?;
        return Ok(None);
    }
    if explicit_epochs {
        return Ok(None);
    }
    let Some(default_steps) = planner.steps_in(config.epochs, DEFAULT_MIN_STEPS) else {
        return Ok(None);
    };
    if default_steps >= DEFAULT_MIN_STEPS {
        return Ok(None);
    }
    let epochs = config.epochs;
    config.steps = Some(DEFAULT_MIN_STEPS);
    config.epochs = epochs_for(planner, DEFAULT_MIN_STEPS)?;
    Ok(Some(format!(
        "the default budget, {epochs} epochs of minibatches of {}, is {default_steps} steps on \
         this dataset, fewer than the {DEFAULT_MIN_STEPS} the default guarantees: training \
         {DEFAULT_MIN_STEPS} steps ({} epochs); --epochs or --steps sets the budget",
        config.batch, config.epochs
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::integrity::Registered;

    /// A plan over chunks of `rows` rows each, B = `batch`, shuffled in groups of 2.
    fn planner(rows: &[u64], batch: usize) -> Planner {
        let files = rows.iter().enumerate().map(|(i, &n)| {
            let file = Registered {
                kind: "chunk",
                owner: "a test".into(),
                rel: format!("c{i}"),
                path: format!("c{i}").into(),
                bytes: 0,
                checksum: String::new(),
                artifact_id: None,
                verified_at: None,
            };
            (file, n)
        });
        Planner {
            chunks: spans_from_rows(files.collect()),
            batch,
            order: Order::Shuffled { seed: 3, window: 2 },
        }
    }

    #[test]
    fn the_epochs_of_a_step_budget_are_the_fewest_that_hold_it() {
        // One chunk of 333 rows at B = 500: one step an epoch.
        let p = planner(&[333], 500);
        assert_eq!(epochs_for(&p, 3000).unwrap(), 3000);
        // 900 rows in chunks of 200, 200, 200, 200, 100 at B = 64: 16 steps an epoch.
        let p = planner(&[200, 200, 200, 200, 100], 64);
        assert_eq!(p.fixed_epoch_batches(), Some(16));
        assert_eq!(epochs_for(&p, 16).unwrap(), 1);
        assert_eq!(epochs_for(&p, 17).unwrap(), 2);
        assert_eq!(epochs_for(&p, 100).unwrap(), 7);
        // Chunks whose shuffle changes an epoch's count: summed epoch by epoch, and the
        // epochs found hold the steps while one fewer does not.
        let p = planner(&[70, 30, 70, 30, 50], 64);
        for steps in [1, 5, 50, 333] {
            let e = epochs_for(&p, steps).unwrap();
            assert!(p.steps_in(e, u64::MAX).unwrap() >= steps, "{steps}");
            assert!(p.steps_in(e - 1, u64::MAX).unwrap() < steps, "{steps}");
        }
        let e = epochs_for(&planner(&[10], 500), u64::MAX).unwrap_err();
        assert!(e.to_string().contains("more than 1000000 epochs"), "{e}");
    }
}
