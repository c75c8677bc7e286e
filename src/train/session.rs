//! A training session: how a run starts — from the memoised result of an identical
//! finished run, resumed from the last checkpoint of an interrupted one, or anew.

use std::fs;

use anyhow::{ensure, Result};

use super::held_out::HeldOut;
use super::options::TrainOptions;
use super::setup::Setup;
use super::steps::{train_loop, LoopOptions, TrainSummary};
use crate::stage::{lookup, Lookup, Outcome, StageRun};
use crate::store::catalog::StageKind;
use crate::store::checkpoint::Checkpoint;
use crate::store::workspace::Workspace;
use crate::trained::{load_checkpoint, TrainConfig};

/// Runs `pipeline train`: the memoised result of an identical finished run, else the
/// interrupted run with this configuration resumed (unless `fresh`), else a new run.
pub fn run(ws: &Workspace, opts: &TrainOptions) -> Result<Outcome<TrainSummary>> {
    opts.validate()?;
    if let Some(id) = opts.resume {
        return resume(ws, id, opts);
    }
    let config = opts.config(ws)?;
    match lookup(ws, StageKind::Train, &config.to_json())? {
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
    let setup = Setup::open(ws, config)?;
    let run = StageRun::start(ws, StageKind::Train, &setup.config.to_json())?;
    let result = (|| {
        let start = setup.initial_checkpoint()?;
        drive(ws, &run, &setup, start, opts)
    })();
    finish(run, result)
}

/// Continues run `id` from its last registered checkpoint (or from step 0 if it wrote none).
fn resume(ws: &Workspace, id: i64, opts: &TrainOptions) -> Result<Outcome<TrainSummary>> {
    let config = TrainConfig::of_run(ws, id)?;
    let setup = Setup::open(ws, config)?;
    let run = StageRun::resume(ws, id)?;
    let result = (|| {
        let start = match ws.catalog.checkpoints(id)?.last() {
            Some(row) => {
                let c = load_checkpoint(ws, row)?;
                ensure!(
                    c.config == setup.config.to_json(),
                    "{}: configuration differs from run {id}'s",
                    row.path
                );
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
        drive(ws, &run, &setup, start, opts)
    })();
    finish(run, result)
}

/// Runs the step loop of `run` from `start` into the run's published directory.
fn drive(
    ws: &Workspace,
    run: &StageRun<'_>,
    setup: &Setup,
    start: Checkpoint,
    opts: &TrainOptions,
) -> Result<TrainSummary> {
    let out_rel = setup.out_rel(run);
    fs::create_dir_all(ws.resolve(&out_rel))?;
    let held_out = match opts.eval_every {
        0 => None,
        every => Some(HeldOut::open(ws, setup, every, &opts.eval_split)?),
    };
    let loop_opts = LoopOptions {
        final_elbo: opts.final_elbo,
        prefetch: opts.prefetch,
        held_out,
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
