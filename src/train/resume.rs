//! What `pipeline train --resume` may change. A resumed run continues with the
//! configuration in force, except for the options a person reasonably changes when
//! continuing: how long it runs (`--epochs`, `--steps`, `--max-steps`; `--epochs` and
//! `--steps` each replace the budget, whichever kind it was), how it is checkpointed
//! (`--checkpoint-every`, `--keep-checkpoints`), how fast it goes (`--threads`,
//! `--prefetch`) and what it reports (`--eval-every`, `--eval-split`, `--no-final-elbo`).
//! Those, when given, are applied and recorded in the run's record (never in its `params`,
//! which stay what it started with); any other option given with a value other than the
//! run's is refused before anything changes. That includes the model's form (`--kernel`,
//! `--ard`, `--likelihood`, `--task`, `--latent`, `--robust-max-epsilon`, `--mc-pairs`,
//! `--amortiser-hidden`, `--class-samples`), the schedules `--release-hyper-after` and
//! `--lr-decay-at`/`--lr-decay`, and early stopping (`--early-stopping`, `--patience`,
//! `--validate-every`, `--stop-metric`): a run whose schedule or stopping rule changed midway
//! would equal no uninterrupted run.
//!
//! Checkpoints written after a change embed the configuration in force, so a run extended
//! with `--epochs` or `--max-steps` ends with the bytes of an uninterrupted run started with
//! the new values, and lookups match it on those. A new thread count changes the numbers
//! (they are bitwise reproducible for a fixed count only), so such a run answers no lookup.

use anyhow::{bail, ensure, Result};

use super::batches::Planner;
use super::budget;
use super::declare::{join_epochs, train_option_table};
use super::options::{check_limits, TrainFlag, TrainOptions, DEFAULT_LR_DECAY};
use super::setup::Setup;
use crate::stage::threads_or_all;
use crate::store::catalog::RunStatus;
use crate::store::checkpoint::TrainState;
use crate::trained::{OptionChange, Retention, RunRecord, Steering, StopReason, TrainConfig};
// The rows' resume rules name these bare (`train_option_table!`).
use OnResume::{Changes, Control, Fixed};

/// What a train flag given on resume does.
#[derive(Clone, Copy)]
pub enum OnResume {
    /// Says which run to resume, or whether to start afresh: no option of the run.
    Control,
    /// Applied to the run and recorded.
    Changes(Changeable),
    /// Refused unless equal to the run's value: (the run's value, the given value), as a
    /// refusal prints them.
    Fixed(fn(&TrainConfig, &TrainOptions) -> (String, String)),
}

/// "none" for an option left out.
fn or_none(value: Option<String>) -> String {
    value.unwrap_or_else(|| "none".into())
}

impl TrainFlag {
    /// The command-line flag, `--max-steps`.
    pub fn flag(self) -> String {
        format!("--{}", self.name())
    }
}

/// `TrainFlag::on_resume`, from each row's `on resume` rule.
macro_rules! define_on_resume {
    ($(
        $(#[doc = $doc:literal])*
        #[arg($($arg:tt)*)]
        $variant:ident = $name:literal { $field:ident: $ty:ty $(= $default:expr)? }
        $(listed after $anchor:ident)?
        on resume $rule:expr;
    )+) => {
        impl TrainFlag {
            /// What this flag does on resume: its row's rule in `train_option_table!`.
            pub fn on_resume(self) -> OnResume {
                match self {
                    $(TrainFlag::$variant => $rule,)+
                }
            }
        }
    };
}

train_option_table!(define_on_resume);

/// The options a resume may change, in the order messages list them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Changeable {
    Epochs,
    Steps,
    MaxSteps,
    Threads,
    CheckpointEvery,
    KeepCheckpoints,
    Prefetch,
    EvalEvery,
    EvalSplit,
    NoFinalElbo,
}

impl Changeable {
    pub const ALL: [Changeable; 10] = [
        Changeable::Epochs,
        Changeable::Steps,
        Changeable::MaxSteps,
        Changeable::Threads,
        Changeable::CheckpointEvery,
        Changeable::KeepCheckpoints,
        Changeable::Prefetch,
        Changeable::EvalEvery,
        Changeable::EvalSplit,
        Changeable::NoFinalElbo,
    ];

    /// The flag whose resume rule (its row in `train_option_table!`) is this change.
    pub fn train_flag(self) -> TrainFlag {
        *TrainFlag::ALL
            .iter()
            .find(|flag| matches!(flag.on_resume(), Changes(change) if change == self))
            .expect("every change is the resume rule of a train option (checked by a test)")
    }

    /// Whether it changes the run's configuration (which lookups match on), not only how
    /// the run is steered.
    fn changes_configuration(self) -> bool {
        match self {
            Changeable::Epochs
            | Changeable::Steps
            | Changeable::MaxSteps
            | Changeable::Threads
            | Changeable::CheckpointEvery => true,
            Changeable::KeepCheckpoints
            | Changeable::Prefetch
            | Changeable::EvalEvery
            | Changeable::EvalSplit
            | Changeable::NoFinalElbo => false,
        }
    }

    /// Its value in a run, as printed and recorded.
    fn value(self, cfg: &TrainConfig, st: &Steering) -> String {
        match self {
            Changeable::Epochs => cfg.epochs.to_string(),
            Changeable::Steps => or_none(cfg.steps.map(|s| s.to_string())),
            Changeable::MaxSteps => cfg.max_steps.map_or("none".to_string(), |s| s.to_string()),
            Changeable::Threads => cfg.threads.to_string(),
            Changeable::CheckpointEvery => cfg.checkpoint_every.to_string(),
            Changeable::KeepCheckpoints => st.keep_checkpoints.to_string(),
            Changeable::Prefetch => st.prefetch.to_string(),
            Changeable::EvalEvery => st.eval_every.to_string(),
            Changeable::EvalSplit => st.eval_split.to_string(),
            Changeable::NoFinalElbo => (!st.final_elbo).to_string(),
        }
    }

    /// Sets it in a run's configuration or steering options to the value `opts` gives.
    /// `--epochs` makes the budget epochs, `--steps` steps (whose epochs `plan` derives).
    fn apply(self, opts: &TrainOptions, cfg: &mut TrainConfig, st: &mut Steering) {
        match self {
            Changeable::Epochs => (cfg.epochs, cfg.steps) = (opts.epochs, None),
            Changeable::Steps => cfg.steps = opts.steps,
            Changeable::MaxSteps => cfg.max_steps = opts.max_steps,
            Changeable::Threads => cfg.threads = threads_or_all(opts.threads),
            Changeable::CheckpointEvery => cfg.checkpoint_every = opts.checkpoint_every,
            Changeable::KeepCheckpoints => st.keep_checkpoints = opts.keep_checkpoints,
            Changeable::Prefetch => st.prefetch = opts.prefetch,
            Changeable::EvalEvery => st.eval_every = opts.eval_every,
            Changeable::EvalSplit => st.eval_split = opts.eval_split,
            Changeable::NoFinalElbo => st.final_elbo = opts.final_elbo,
        }
    }
}

/// Whether a recorded change is one of the run's configuration (which lookups match on),
/// not only of how it is steered.
pub fn changes_configuration(c: &OptionChange) -> bool {
    Changeable::ALL
        .iter()
        .any(|ch| ch.changes_configuration() && ch.train_flag().flag() == c.option)
}

/// A resume, checked: the run's record with this resume's changes applied.
#[derive(Debug, Clone)]
pub struct ResumePlan {
    pub record: RunRecord,
    /// The changes this resume makes (also appended to `record.changes`).
    pub changed: Vec<OptionChange>,
}

/// The steering options of a run that recorded none (from before they were recorded): the
/// defaults, keeping every checkpoint as those runs did.
fn legacy_steering() -> Steering {
    Steering {
        keep_checkpoints: Retention::All,
        ..TrainOptions::default().steering()
    }
}

/// The run's γ as a refusal names it: with no decay listed γ changes nothing, so only its
/// default reads as the run's.
fn decay_factor(cfg: &TrainConfig, opts: &TrainOptions) -> String {
    match &cfg.lr_decay {
        Some(d) => d.factor.to_string(),
        None if opts.lr_decay == DEFAULT_LR_DECAY => DEFAULT_LR_DECAY.to_string(),
        None => "none".into(),
    }
}

/// Refuses to resume a finished run (`status` ok) unless `--max-steps` cut it and `opts`
/// gives a larger `--max-steps`: such a run is a prefix of its budget, and going on to the
/// larger cut ends where an uninterrupted run with that cut ends (`pipeline fit` gives its
/// leading candidate the time others left this way). Any other finished run is a result,
/// kept as is.
pub fn refuse_finished(status: RunStatus, record: &RunRecord, opts: &TrainOptions) -> Result<()> {
    if status != RunStatus::Ok {
        return Ok(());
    }
    let id = record.run_id;
    let cut = record
        .stopped
        .as_ref()
        .filter(|s| s.reason == StopReason::MaxSteps)
        .map(|s| s.step);
    match (cut, opts.max_steps) {
        (Some(at), Some(more)) if more > at && opts.given.contains(&TrainFlag::MaxSteps) => Ok(()),
        (Some(at), _) => bail!(
            "run {id} cannot be resumed: it finished, cut by --max-steps at step {at}; give a \
             larger --max-steps to go on"
        ),
        (None, _) => bail!(
            "run {id} cannot be resumed: its status is 'ok' (only interrupted or failed runs \
             resume, and finished ones cut by --max-steps, with a larger --max-steps)"
        ),
    }
}

/// Checks the options `opts` gives against run `record` resuming from `step`: refuses any
/// that cannot change, applies and records the others. `planner` (the run's minibatch plan,
/// which no resume changes) gives the epochs a new `--steps` reaches.
pub fn plan(
    mut record: RunRecord,
    opts: &TrainOptions,
    step: u64,
    planner: &Planner,
) -> Result<ResumePlan> {
    let id = record.run_id;
    let old_steering = record.steering.clone().unwrap_or_else(legacy_steering);
    let (mut cfg, mut st) = (record.in_force.clone(), old_steering.clone());
    let mut refused = Vec::new();
    for &given in &opts.given {
        match given.on_resume() {
            OnResume::Control => {}
            OnResume::Changes(option) => option.apply(opts, &mut cfg, &mut st),
            OnResume::Fixed(values) => {
                let (run, value) = values(&record.in_force, opts);
                if run != value {
                    refused.push(format!(
                        "{} {value}: run {id} has {run}, and it cannot change on resume",
                        given.flag()
                    ));
                }
            }
        }
    }
    if !refused.is_empty() {
        bail!(
            "{}\n(only {} can change when a run resumes; start a new run for other values)",
            refused.join("\n"),
            Changeable::ALL.map(|c| c.train_flag().flag()).join(", ")
        );
    }
    if cfg.steps.is_some() && cfg.steps != record.in_force.steps {
        budget::settle(&mut cfg, planner, false)?;
    }
    check_limits(&cfg)?;
    let changed: Vec<OptionChange> = Changeable::ALL
        .iter()
        .map(|c| {
            (
                c,
                c.value(&record.in_force, &old_steering),
                c.value(&cfg, &st),
            )
        })
        .filter(|(_, old, new)| old != new)
        .map(|(c, old, new)| OptionChange {
            step,
            option: c.train_flag().flag(),
            old,
            new,
        })
        .collect();
    record.reusable &= cfg.threads == record.in_force.threads;
    record.in_force = cfg;
    // How it ends is recorded again when it does.
    record.stopped = None;
    record.steering = Some(st);
    record.changes.extend(changed.iter().cloned());
    Ok(ResumePlan { record, changed })
}

impl ResumePlan {
    /// Refuses limits that lie before `state` (the checkpoint the run resumes from): the
    /// run cannot go back.
    pub fn check_position(&self, setup: &Setup, state: &TrainState) -> Result<()> {
        let cfg = &self.record.in_force;
        let total = setup.total_steps(&setup.shuffled())?;
        let budget = match cfg.steps {
            Some(steps) => format!("--steps {steps}"),
            None => format!("--epochs {}", cfg.epochs),
        };
        ensure!(
            state.step <= total,
            "run {} is at step {} (epoch {}), past the {total} steps of {budget}{}; give more",
            self.record.run_id,
            state.step,
            state.epoch + 1,
            cfg.max_steps
                .map_or(String::new(), |s| format!(" and --max-steps {s}"))
        );
        Ok(())
    }

    /// Prints one line per changed option, old → new.
    pub fn announce(&self) {
        let id = self.record.run_id;
        for c in &self.changed {
            crate::progress::note(format!(
                "run {id}: {} {} → {} (changed on resume)",
                c.option, c.old, c.new
            ));
            if c.option == TrainFlag::Threads.flag() {
                crate::progress::note(format!(
                    "run {id}: with another thread count the numbers will differ from an \
                     uninterrupted run (they are bitwise reproducible for a fixed count), \
                     so `pipeline train` will not reuse this run"
                ));
            }
        }
    }
}

/// Whether a checkpoint's embedded configuration belongs to the run whose configuration in
/// force is `in_force`: equal but for the options a resume may have changed since it was
/// written (a crash can fall between recording a change and the first checkpoint after it).
pub fn same_run(ckpt_config: &serde_json::Value, in_force: &TrainConfig) -> bool {
    let Ok(mut c) = serde_json::from_value::<TrainConfig>(ckpt_config.clone()) else {
        return false;
    };
    c.epochs = in_force.epochs;
    c.steps = in_force.steps;
    c.max_steps = in_force.max_steps;
    c.threads = in_force.threads;
    c.checkpoint_every = in_force.checkpoint_every;
    c == *in_force
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each change a resume may make is the rule of exactly one train option, so
    /// [`Changeable::train_flag`] finds it.
    #[test]
    fn every_change_is_the_resume_rule_of_one_option() {
        for change in Changeable::ALL {
            let flags: Vec<TrainFlag> = TrainFlag::ALL
                .iter()
                .copied()
                .filter(|f| matches!(f.on_resume(), Changes(c) if c == change))
                .collect();
            assert_eq!(flags, [change.train_flag()], "{change:?}");
        }
        assert_eq!(Changeable::Epochs.train_flag(), TrainFlag::Epochs);
        assert_eq!(Changeable::NoFinalElbo.train_flag(), TrainFlag::NoFinalElbo);
    }
}
