//! Train options as fit handles them: typed [`TrainOptions`] whose `given` names the options
//! a candidate (or the caller's overrides) set. One per-flag copy lays options onto a
//! candidate ([`apply_given`]); one per-flag rendering turns them back into the flag names
//! and values the spec's `[train]` table and the outcome's `train` map show ([`flag_value`],
//! [`spec_pairs`]).

use crate::train::{TrainFlag, TrainOptions};

/// `onto` with every option `from` gives (`from.given`) copied over and recorded as given.
pub fn apply_given(onto: &mut TrainOptions, from: &TrainOptions) {
    for &flag in &from.given {
        copy_flag(onto, from, flag);
        onto.given.insert(flag);
    }
}

/// Copies option `flag`'s value of `from` into `onto` (exhaustive: a new train option does
/// not compile until it is placed here).
fn copy_flag(onto: &mut TrainOptions, from: &TrainOptions, flag: TrainFlag) {
    use TrainFlag as F;
    let o = onto;
    let f = from;
    match flag {
        F::Dataset => o.dataset.clone_from(&f.dataset),
        F::Svd => o.svd = f.svd,
        F::Kernel => o.kernel = f.kernel,
        F::Ard => o.ard = f.ard,
        F::QForm => o.q_form = f.q_form,
        F::Likelihood => o.likelihood = f.likelihood,
        F::Task => o.task = f.task,
        F::Latent => o.latent = f.latent,
        F::RobustMaxEpsilon => o.robust_max_epsilon = f.robust_max_epsilon,
        F::LearnEpsilon => o.learn_epsilon = f.learn_epsilon,
        F::McPairs => o.mc_pairs = f.mc_pairs,
        F::AmortiserHidden => o.amortiser_hidden = f.amortiser_hidden,
        F::ClassSamples => o.class_samples = f.class_samples,
        F::Inducing => o.inducing = f.inducing,
        F::Factors => o.factors = f.factors,
        F::Batch => o.batch = f.batch,
        F::Epochs => o.epochs = f.epochs,
        F::Steps => o.steps = f.steps,
        F::MaxSteps => o.max_steps = f.max_steps,
        F::Lr => o.lr = f.lr,
        F::LrDecayAt => o.lr_decay_at.clone_from(&f.lr_decay_at),
        F::LrDecay => o.lr_decay = f.lr_decay,
        F::Beta1 => o.beta1 = f.beta1,
        F::Beta2 => o.beta2 = f.beta2,
        F::Negatives => o.negatives = f.negatives,
        F::Quadrature => o.quadrature = f.quadrature,
        F::Seed => o.seed = f.seed,
        F::Threads => o.threads = f.threads,
        F::Resume => o.resume = f.resume,
        F::Fresh => o.fresh = f.fresh,
        F::CheckpointEvery => o.checkpoint_every = f.checkpoint_every,
        F::FreezeA => o.freeze_a = f.freeze_a,
        F::InducingInputs => o.inducing_inputs = f.inducing_inputs,
        F::FreezeHyper => o.freeze_hyper = f.freeze_hyper,
        F::ReleaseHyperAfter => o.release_hyper_after = f.release_hyper_after,
        F::Prefetch => o.prefetch = f.prefetch,
        F::ShuffleChunks => o.shuffle_chunks = f.shuffle_chunks,
        F::NoFinalElbo => o.final_elbo = f.final_elbo,
        F::EvalEvery => o.eval_every = f.eval_every,
        F::EvalSplit => o.eval_split = f.eval_split,
        F::KeepCheckpoints => o.keep_checkpoints = f.keep_checkpoints,
        F::EarlyStopping => o.early_stopping = f.early_stopping,
        F::Patience => o.patience = f.patience,
        F::ValidateEvery => o.validate_every = f.validate_every,
        F::StopMetric => o.stop_metric = f.stop_metric,
        F::WarmStart => o.warm_start = f.warm_start,
        F::NaturalStep => o.natural_step = f.natural_step,
    }
}

/// Option `flag`'s value in `o` as its flag takes it (a switch's is empty; an option left
/// to its rule, such as M from the svd run, is empty too).
pub fn flag_value(o: &TrainOptions, flag: TrainFlag) -> String {
    use TrainFlag as F;
    fn opt<T: ToString>(v: Option<T>) -> String {
        v.map_or(String::new(), |v| v.to_string())
    }
    match flag {
        F::Dataset => opt(o.dataset.as_ref()),
        F::Svd => opt(o.svd),
        F::Kernel => o.kernel.name().to_string(),
        F::Ard => o.ard.name().to_string(),
        F::QForm => o.q_form.name().to_string(),
        F::Likelihood => o.likelihood.name().to_string(),
        F::Task => o.task.as_str().to_string(),
        F::Latent => o.latent.name().to_string(),
        F::RobustMaxEpsilon => o.robust_max_epsilon.to_string(),
        F::McPairs => o.mc_pairs.to_string(),
        F::AmortiserHidden => o.amortiser_hidden.to_string(),
        F::ClassSamples => opt(o.class_samples),
        F::Inducing => opt(o.inducing),
        F::Factors => opt(o.factors),
        F::Batch => o.batch.to_string(),
        F::Epochs => o.epochs.to_string(),
        F::Steps => opt(o.steps),
        F::MaxSteps => opt(o.max_steps),
        F::Lr => o.lr.to_string(),
        F::LrDecayAt => {
            let epochs: Vec<String> = o.lr_decay_at.iter().map(u64::to_string).collect();
            epochs.join(",")
        }
        F::LrDecay => o.lr_decay.to_string(),
        F::Beta1 => o.beta1.to_string(),
        F::Beta2 => o.beta2.to_string(),
        F::Negatives => o.negatives.to_string(),
        F::Quadrature => o.quadrature.to_string(),
        F::Seed => o.seed.to_string(),
        F::Threads => opt(o.threads),
        F::Resume => opt(o.resume),
        F::CheckpointEvery => o.checkpoint_every.to_string(),
        F::InducingInputs => o.inducing_inputs.name().to_string(),
        F::ReleaseHyperAfter => opt(o.release_hyper_after),
        F::Prefetch => o.prefetch.to_string(),
        F::ShuffleChunks => o.shuffle_chunks.to_string(),
        F::EvalEvery => o.eval_every.to_string(),
        F::EvalSplit => o.eval_split.name().to_string(),
        F::KeepCheckpoints => o.keep_checkpoints.to_string(),
        F::Patience => o.patience.to_string(),
        F::ValidateEvery => opt(o.validate_every),
        F::StopMetric => opt(o.stop_metric.map(|m| m.name())),
        F::WarmStart => o.warm_start.name().to_string(),
        F::NaturalStep => opt(o.natural_step),
        F::LearnEpsilon
        | F::Fresh
        | F::FreezeA
        | F::FreezeHyper
        | F::NoFinalElbo
        | F::EarlyStopping => String::new(),
    }
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
