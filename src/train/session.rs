//! A training session: how a run starts — from the memoised result of an identical
//! finished run, resumed from the last checkpoint of an interrupted one, or anew. Runs are
//! matched on their configuration in force (`trained::RunRecord`), which differs from the
//! one they started with only after a resume changed it (`resume`).

use std::fs;

use anyhow::{ensure, Result};

use super::checkpoints::prune_checkpoints;
use super::held_out::HeldOut;
use super::options::TrainOptions;
use super::resume;
use super::setup::Setup;
use super::steps::{train_loop, LoopOptions, TrainSummary};
use crate::stage::{self, Lookup, Outcome, StageRun};
use crate::store::catalog::StageKind;
use crate::store::checkpoint::Checkpoint;
use crate::store::workspace::Workspace;
use crate::trained::{load_checkpoint, RunRecord, Steering, TrainConfig};

/// Runs `pipeline train`: the memoised result of an identical finished run, else the
/// interrupted run with this configuration resumed (unless `fresh`), else a new run.
pub fn run(ws: &Workspace, opts: &TrainOptions) -> Result<Outcome<TrainSummary>> {
    opts.validate()?;
    if let Some(id) = opts.resume {
        return resume(ws, id, opts);
    }
    let config = opts.config(ws)?;
    match lookup(ws, &config)? {
        Lookup::Done(done) => {
            eprintln!(
                "training of '{}' with these parameters is already done (run {}); nothing to do",
                config.dataset, done.id
            );
            let last = ws
                .catalog
                .checkpoints(done.id)?
                .last()
                .map_or(0, |c| c.step);
            return Ok(Outcome {
                run_id: done.id,
                computed: false,
                value: TrainSummary {
                    final_step: last,
                    exact_elbo: None,
                },
            });
        }
        Lookup::Interrupted(prev) if !opts.fresh => {
            eprintln!(
                "run {} with these parameters was interrupted; resuming it (--fresh starts over)",
                prev.id
            );
            return resume(ws, prev.id, opts);
        }
        Lookup::Interrupted(_) | Lookup::New => {}
    }
    let setup = Setup::open(ws, config, opts.prefetch)?;
    let run = StageRun::start(ws, StageKind::Train, &setup.config.to_json())?;
    let result = (|| {
        let steering = opts.steering();
        RunRecord::new(run.id, setup.config.clone(), steering.clone()).save(ws)?;
        let start = setup.initial_checkpoint()?;
        drive(ws, &run, &setup, start, &steering)
    })();
    finish(run, result)
}

/// The stage's lookup on the configuration in force. A run that started with `config` but
/// was changed on resume is not found; it is named, so that a person looking for it does.
fn lookup(ws: &Workspace, config: &TrainConfig) -> Result<Lookup> {
    let params = config.to_json();
    let found = stage::lookup(ws, StageKind::Train, &params)?;
    if !matches!(found, Lookup::New) {
        return Ok(found);
    }
    for run in ws.catalog.runs_started_with(StageKind::Train, &params)? {
        let changes: Vec<String> = RunRecord::of_run(ws, run.id)?
            .changes
            .iter()
            .filter(|c| resume::changes_configuration(c))
            .map(|c| format!("{} {} → {}", c.option, c.old, c.new))
            .collect();
        if !changes.is_empty() {
            eprintln!(
                "run {} started with these parameters but was resumed with other options \
                 ({}), so it is not reused (its checkpoints serve `--run {}` of predict and \
                 evaluate)",
                run.id,
                changes.join(", "),
                run.id
            );
            break;
        }
    }
    Ok(Lookup::New)
}

/// Continues run `id` from its last registered checkpoint (or from step 0 if it wrote none),
/// with the options `opts` gives applied as `resume::plan` allows. Refusals come before
/// the run is touched.
fn resume(ws: &Workspace, id: i64, opts: &TrainOptions) -> Result<Outcome<TrainSummary>> {
    let record = RunRecord::of_run(ws, id)?;
    let last = ws.catalog.checkpoints(id)?.last().cloned();
    let plan = resume::plan(record, opts, last.as_ref().map_or(0, |c| c.step))?;
    let prefetch = plan
        .record
        .steering
        .as_ref()
        .map_or(opts.prefetch, |s| s.prefetch);
    let setup = Setup::open(ws, plan.record.in_force.clone(), prefetch)?;
    let checkpoint = match &last {
        Some(row) => {
            let c = load_checkpoint(ws, row)?;
            ensure!(
                resume::same_run(&c.config, &setup.config),
                "{}: configuration differs from run {id}'s",
                row.path
            );
            plan.check_position(&setup, &c.state)?;
            Some(c)
        }
        None => None,
    };
    let run = StageRun::resume(ws, id)?;
    let result = (|| {
        let start = match checkpoint {
            Some(c) => {
                eprintln!(
                    "resuming run {id} from step {} (epoch {})",
                    c.state.step, c.state.epoch
                );
                c
            }
            None => {
                eprintln!("run {id} wrote no checkpoint; starting it from the beginning");
                setup.initial_checkpoint()?
            }
        };
        plan.announce();
        plan.record.save(ws)?;
        let steering = plan.record.steering.clone().expect("a plan sets steering");
        drive(ws, &run, &setup, start, &steering)
    })();
    finish(run, result)
}

/// Runs the step loop of `run` from `start` into the run's published directory, after
/// pruning its checkpoints as `steering` says (a resume may have lowered the count, and a
/// crash may have left unregistered files).
fn drive(
    ws: &Workspace,
    run: &StageRun<'_>,
    setup: &Setup,
    start: Checkpoint,
    steering: &Steering,
) -> Result<TrainSummary> {
    let out_rel = setup.out_rel(run);
    fs::create_dir_all(ws.resolve(&out_rel))?;
    prune_checkpoints(ws, run, &out_rel, steering.keep_checkpoints)?;
    let held_out = match steering.eval_every {
        0 => None,
        every => Some(HeldOut::open(ws, setup, every, &steering.eval_split)?),
    };
    let loop_opts = LoopOptions {
        final_elbo: steering.final_elbo,
        prefetch: steering.prefetch,
        held_out,
        keep: steering.keep_checkpoints,
    };
    train_loop(ws, run, &out_rel, setup, start, &loop_opts)
}

fn finish(run: StageRun<'_>, result: Result<TrainSummary>) -> Result<Outcome<TrainSummary>> {
    let run_id = run.id;
    let value = run.finish(result)?;
    Ok(Outcome {
        run_id,
        computed: true,
        value,
    })
}
