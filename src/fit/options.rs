//! Train options as fit handles them: typed [`TrainOptions`] whose `given` names the options
//! a candidate (or the caller's overrides) set. [`apply_given`] lays options onto a
//! candidate; [`flag_value`] turns them back into the flag names and values the spec's
//! `[train]` table and the outcome's `train` map show ([`spec_pairs`]). Both go through
//! [`crate::train::TrainValue`], generated with the options from their one declaration.

use crate::train::{TrainFlag, TrainOptions};

/// `onto` with every option `from` gives (`from.given`) copied over and recorded as given.
pub fn apply_given(onto: &mut TrainOptions, from: &TrainOptions) {
    for &flag in &from.given {
        onto.set(from.value(flag));
    }
}

/// Option `flag`'s value in `o` as its flag takes it (a switch's is empty; an option left
/// to its rule, such as M from the svd run, is empty too).
pub fn flag_value(o: &TrainOptions, flag: TrainFlag) -> String {
    o.value(flag).flag_text()
}

/// The options of `o` given, by flag name, as the outcome's `train` map shows them.
pub fn given_values(o: &TrainOptions) -> Vec<(&'static str, String)> {
    o.given
        .iter()
        .map(|&flag| (flag.name(), flag_value(o, flag)))
        .collect()
}

/// The order the spec's `[train]` table lists a candidate's options in: the task, the
/// candidate's kernel, M and inducing inputs, its likelihood and label options, then any
/// other option given (by flag), then the options every run shares, and the steps.
const SPEC_FIRST: &[TrainFlag] = &[
    TrainFlag::Task,
    TrainFlag::Kernel,
    TrainFlag::Inducing,
    TrainFlag::InducingInputs,
    TrainFlag::Latent,
    TrainFlag::Likelihood,
    TrainFlag::QForm,
    TrainFlag::NaturalStep,
    TrainFlag::Factors,
    TrainFlag::Negatives,
];
const SPEC_LAST: &[TrainFlag] = &[
    TrainFlag::Batch,
    TrainFlag::Lr,
    TrainFlag::Seed,
    TrainFlag::NoFinalElbo,
    TrainFlag::Steps,
];

/// The given options of `o` in the spec's order ([`SPEC_FIRST`], the rest, [`SPEC_LAST`]),
/// without the dataset and svd run, which the spec's runner links in.
pub fn spec_pairs(o: &TrainOptions) -> Vec<(&'static str, String)> {
    let linked = [TrainFlag::Dataset, TrainFlag::Svd];
    let middle = o
        .given
        .iter()
        .copied()
        .filter(|f| !SPEC_FIRST.contains(f) && !SPEC_LAST.contains(f) && !linked.contains(f));
    SPEC_FIRST
        .iter()
        .copied()
        .chain(middle)
        .chain(SPEC_LAST.iter().copied())
        .filter(|f| o.given.contains(f))
        .map(|flag| (flag.name(), flag_value(o, flag)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trained::{KernelChoice, Negatives};

    #[test]
    fn given_options_are_copied_and_rendered_as_their_flags_take_them() {
        let from = TrainOptions {
            kernel: KernelChoice::SePlusLinear,
            natural_step: Some(0.1),
            negatives: Negatives::Sample(1000),
            final_elbo: false,
            lr: 0.02,
            given: [
                TrainFlag::Kernel,
                TrainFlag::NaturalStep,
                TrainFlag::Negatives,
                TrainFlag::NoFinalElbo,
                TrainFlag::Lr,
            ]
            .into(),
            ..TrainOptions::default()
        };
        let mut onto = TrainOptions {
            batch: 1000,
            given: [TrainFlag::Batch].into(),
            ..TrainOptions::default()
        };
        apply_given(&mut onto, &from);
        assert_eq!(onto.kernel, KernelChoice::SePlusLinear);
        assert!(!onto.final_elbo);
        assert_eq!((onto.batch, onto.lr), (1000, 0.02));
        assert_eq!(
            spec_pairs(&onto),
            [
                ("kernel", "se+linear".to_string()),
                ("natural-step", "0.1".into()),
                ("negatives", "1000".into()),
                ("batch", "1000".into()),
                ("lr", "0.02".into()),
                ("no-final-elbo", String::new()),
            ]
        );
    }
}
