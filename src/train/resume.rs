//! What `pipeline train --resume` may change. A resumed run continues with the
//! configuration in force, except for the options a person reasonably changes when
//! continuing: how long it runs (`--epochs`, `--max-steps`), how it is checkpointed
//! (`--checkpoint-every`, `--keep-checkpoints`), how fast it goes (`--threads`,
//! `--prefetch`) and what it reports (`--eval-every`, `--eval-split`, `--no-final-elbo`).
//! Those, when given, are applied and recorded in the run's record (never in its `params`,
//! which stay what it started with); any other option given with a value other than the
//! run's is refused before anything changes. That includes the model's form (`--kernel`,
//! `--ard`, `--likelihood`, `--task`, `--latent`, `--robust-max-epsilon`, `--mc-pairs`,
//! `--amortiser-hidden`, `--class-samples`) and the schedules `--release-hyper-after` and
//! `--lr-decay-at`/`--lr-decay`: a run whose schedule changed midway would equal no
//! uninterrupted run.
//!
//! Checkpoints written after a change embed the configuration in force, so a run extended
//! with `--epochs` or `--max-steps` ends with the bytes of an uninterrupted run started with
//! the new values, and lookups match it on those. A new thread count changes the numbers
//! (they are bitwise reproducible for a fixed count only), so such a run answers no lookup.

use anyhow::{bail, ensure, Result};

use super::options::{check_limits, join_epochs, TrainOptions, DEFAULT_LR_DECAY};
use super::setup::Setup;
use crate::stage::threads_or_all;
use crate::store::checkpoint::TrainState;
use crate::trained::{OptionChange, Retention, RunRecord, Steering, TrainConfig};

/// Options that may change on resume, by their names in [`TrainOptions::given`].
pub const CHANGEABLE: [&str; 9] = [
    "epochs",
    "max_steps",
    "threads",
    "checkpoint_every",
    "keep_checkpoints",
    "prefetch",
    "eval_every",
    "eval_split",
    "no_final_elbo",
];

/// Whether a change is one of the run's configuration (which lookups match on), not only of
/// how it is steered.
pub fn changes_configuration(c: &OptionChange) -> bool {
    ["epochs", "max_steps", "threads", "checkpoint_every"]
        .map(flag)
        .contains(&c.option)
}

/// A resume, checked: the run's record with this resume's changes applied.
#[derive(Debug, Clone)]
pub struct ResumePlan {
    pub record: RunRecord,
    /// The changes this resume makes (also appended to `record.changes`).
    pub changed: Vec<OptionChange>,
}

/// `--flag` of an option name.
fn flag(name: &str) -> String {
    format!("--{}", name.replace('_', "-"))
}

/// The steering options of a run that recorded none (from before they were recorded): the
/// defaults, keeping every checkpoint as those runs did.
fn legacy_steering() -> Steering {
    Steering {
        keep_checkpoints: Retention::All,
        ..TrainOptions::default().steering()
    }
}

/// The values of the changeable options, by flag, as printed and recorded.
fn changeable_values(cfg: &TrainConfig, st: &Steering) -> [(String, String); 9] {
    let max_steps = cfg.max_steps.map_or("none".to_string(), |s| s.to_string());
    [
        (flag("epochs"), cfg.epochs.to_string()),
        (flag("max_steps"), max_steps),
        (flag("threads"), cfg.threads.to_string()),
        (flag("checkpoint_every"), cfg.checkpoint_every.to_string()),
        (flag("keep_checkpoints"), st.keep_checkpoints.to_string()),
        (flag("prefetch"), st.prefetch.to_string()),
        (flag("eval_every"), st.eval_every.to_string()),
        (flag("eval_split"), st.eval_split.to_string()),
        (flag("no_final_elbo"), (!st.final_elbo).to_string()),
    ]
}

/// (the run's value, the given value) of an option that cannot change on resume; None for
/// a name without a rule.
fn fixed_values(name: &str, cfg: &TrainConfig, opts: &TrainOptions) -> Option<(String, String)> {
    let given = |v: Option<String>| v.unwrap_or_else(|| "none".into());
    Some(match name {
        "dataset" => (cfg.dataset.clone(), given(opts.dataset.clone())),
        "svd" => (
            cfg.svd_run.to_string(),
            given(opts.svd.map(|s| s.to_string())),
        ),
        "kernel" => (cfg.kernel.name().into(), opts.kernel.name().into()),
        "q_form" => (cfg.q_form.name().into(), opts.q_form.name().into()),
        "likelihood" => (cfg.likelihood.name().into(), opts.likelihood.name().into()),
        "task" => (cfg.task.name().into(), opts.task.name().into()),
        "latent" => (cfg.latent.name().into(), opts.latent.name().into()),
        "robust_max_epsilon" => (
            cfg.epsilon().to_string(),
            opts.robust_max_epsilon.to_string(),
        ),
        "mc_pairs" => (cfg.pairs().to_string(), opts.mc_pairs.to_string()),
        "amortiser_hidden" => (
            cfg.amortiser_width().to_string(),
            opts.amortiser_hidden.to_string(),
        ),
        "class_samples" => (
            given(cfg.class_samples.map(|s| s.to_string())),
            given(opts.class_samples.map(|s| s.to_string())),
        ),
        "learn_epsilon" => (
            cfg.learn_epsilon.to_string(),
            opts.learn_epsilon.to_string(),
        ),
        "inducing" => (
            cfg.inducing.to_string(),
            given(opts.inducing.map(|m| m.to_string())),
        ),
        "factors" => (cfg.factors.to_string(), opts.factors.to_string()),
        "batch" => (cfg.batch.to_string(), opts.batch.to_string()),
        "lr" => (cfg.lr.to_string(), opts.lr.to_string()),
        "lr_decay_at" => (
            given(cfg.lr_decay.as_ref().map(|d| join_epochs(&d.after))),
            given(Some(join_epochs(&opts.lr_decay_at)).filter(|s| !s.is_empty())),
        ),
        "lr_decay" => (decay_factor(cfg, opts), opts.lr_decay.to_string()),
        "beta1" => (cfg.beta1.to_string(), opts.beta1.to_string()),
        "beta2" => (cfg.beta2.to_string(), opts.beta2.to_string()),
        "negatives" => (cfg.negatives.to_string(), opts.negatives.to_string()),
        "quadrature" => (cfg.quadrature.to_string(), opts.quadrature.to_string()),
        "seed" => (cfg.seed.to_string(), opts.seed.to_string()),
        "freeze_a" => (cfg.freeze_a.to_string(), opts.freeze_a.to_string()),
        "freeze_hyper" => (cfg.freeze_hyper.to_string(), opts.freeze_hyper.to_string()),
        "ard" => (cfg.ard.name().into(), opts.ard.name().into()),
        "release_hyper_after" => (
            given(cfg.release_hyper_after.map(|e| e.to_string())),
            given(opts.release_hyper_after.map(|e| e.to_string())),
        ),
        "inducing_inputs" => (
            cfg.inducing_choice().name().into(),
            opts.inducing_inputs.name().into(),
        ),
        "shuffle_chunks" => (
            cfg.shuffle_chunks.to_string(),
            opts.shuffle_chunks.to_string(),
        ),
        _ => return None,
    })
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

/// Applies the changeable options `opts` gives to the configuration and steering options.
fn apply(name: &str, opts: &TrainOptions, cfg: &mut TrainConfig, st: &mut Steering) {
    match name {
        "epochs" => cfg.epochs = opts.epochs,
        "max_steps" => cfg.max_steps = opts.max_steps,
        "threads" => cfg.threads = threads_or_all(opts.threads),
        "checkpoint_every" => cfg.checkpoint_every = opts.checkpoint_every,
        "keep_checkpoints" => st.keep_checkpoints = opts.keep_checkpoints,
        "prefetch" => st.prefetch = opts.prefetch,
        "eval_every" => st.eval_every = opts.eval_every,
        "eval_split" => st.eval_split = opts.eval_split,
        "no_final_elbo" => st.final_elbo = opts.final_elbo,
        _ => unreachable!("{name} is not in CHANGEABLE"),
    }
}

/// Checks the options `opts` gives against run `record` resuming from `step`: refuses any
/// that cannot change, applies and records the others.
pub fn plan(mut record: RunRecord, opts: &TrainOptions, step: u64) -> Result<ResumePlan> {
    let id = record.run_id;
    let old_steering = record.steering.clone().unwrap_or_else(legacy_steering);
    let (mut cfg, mut st) = (record.in_force.clone(), old_steering.clone());
    let mut refused = Vec::new();
    for name in &opts.given {
        if name == "resume" || name == "fresh" {
            continue;
        }
        if CHANGEABLE.contains(&name.as_str()) {
            apply(name, opts, &mut cfg, &mut st);
            continue;
        }
        let Some((run, given)) = fixed_values(name, &record.in_force, opts) else {
            bail!("internal: option {} has no resume rule", flag(name));
        };
        if run != given {
            refused.push(format!(
                "{} {given}: run {id} has {run}, and it cannot change on resume",
                flag(name)
            ));
        }
    }
    if !refused.is_empty() {
        bail!(
            "{}\n(only {} can change when a run resumes; start a new run for other values)",
            refused.join("\n"),
            CHANGEABLE.map(flag).join(", ")
        );
    }
    check_limits(&cfg)?;
    let changed: Vec<OptionChange> = changeable_values(&record.in_force, &old_steering)
        .into_iter()
        .zip(changeable_values(&cfg, &st))
        .filter(|(old, new)| old.1 != new.1)
        .map(|((option, old), (_, new))| OptionChange {
            step,
            option,
            old,
            new,
        })
        .collect();
    record.reusable &= cfg.threads == record.in_force.threads;
    record.in_force = cfg;
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
        ensure!(
            state.step <= total,
            "run {} is at step {} (epoch {}), past the {total} steps of --epochs {}{}; \
             give more",
            self.record.run_id,
            state.step,
            state.epoch + 1,
            cfg.epochs,
            cfg.max_steps
                .map_or(String::new(), |s| format!(" and --max-steps {s}"))
        );
        Ok(())
    }

    /// Prints one line per changed option, old → new.
    pub fn announce(&self) {
        let id = self.record.run_id;
        for c in &self.changed {
            eprintln!(
                "run {id}: {} {} → {} (changed on resume)",
                c.option, c.old, c.new
            );
            if c.option == flag("threads") {
                eprintln!(
                    "run {id}: with another thread count the numbers will differ from an \
                     uninterrupted run (they are bitwise reproducible for a fixed count), \
                     so `pipeline train` will not reuse this run"
                );
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
    c.max_steps = in_force.max_steps;
    c.threads = in_force.threads;
    c.checkpoint_every = in_force.checkpoint_every;
    c == *in_force
}
