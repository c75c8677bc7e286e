//! A training session: how a run starts — from the memoised result of an identical
//! finished run, resumed from the last checkpoint of an interrupted one, or anew. Runs are
//! matched on their configuration in force (`trained::RunRecord`), which differs from the
//! one they started with only after a resume changed it (`resume`).
//!
//! Over the ranks of an MPI job ([`run_on`]), rank 0 does all of this exactly as one
//! process does, then tells the other ranks the run, its configuration in force, its
//! steering and the checkpoint it starts from ([`Start`]); they open the same inputs, load
//! the same checkpoint (or compute the same seeded initialisation) and train their share
//! of every minibatch, writing nothing.

use anyhow::{ensure, Context, Result};
use serde::{Deserialize, Serialize};

use super::budget;
use super::checkpoints::{ensure_room_for_checkpoints, prune_checkpoints};
use super::held_out::HeldOut;
use super::options::TrainOptions;
use super::resume;
use super::setup::Setup;
use super::steps::{train_loop, Job, LoopOptions, TrainSummary};
use crate::comm::{Comm, Single};
use crate::failpoint;
use crate::stage::{self, Lookup, Outcome, StageRun};
use crate::store::catalog::{RunStatus, Split, StageKind};
use crate::store::checkpoint::Checkpoint;
use crate::store::workspace::Workspace;
use crate::trained::{load_checkpoint, RunRecord, Steering, TrainConfig};

/// Runs `pipeline train`: the memoised result of an identical finished run, else the
/// interrupted run with this configuration resumed (unless `fresh`), else a new run.
pub fn run(ws: &Workspace, opts: &TrainOptions) -> Result<Outcome<TrainSummary>> {
    Ok(run_on(ws, &Single, opts)?.of_one_process())
}

/// [`run`] over the ranks of `comm` (`docs/scale-out.md`, "train"): every rank calls it
/// with the same options; rank 0 decides, writes and returns the summary, the other ranks
/// train their shares and return `None`.
pub fn run_on(
    ws: &Workspace,
    comm: &dyn Comm,
    opts: &TrainOptions,
) -> Result<Outcome<Option<TrainSummary>>> {
    if !comm.is_root() {
        return follow(ws, comm);
    }
    // Whatever rank 0 returns without training, the other ranks must hear of it (an
    // error aborts the whole job instead).
    let outcome = lead(ws, comm, opts)?;
    if !outcome.computed {
        announce(comm, None)?;
    }
    Ok(outcome.map(Some))
}

/// [`run`] on rank 0 of `comm`.
fn lead(ws: &Workspace, comm: &dyn Comm, opts: &TrainOptions) -> Result<Outcome<TrainSummary>> {
    opts.validate()?;
    if let Some(id) = opts.resume {
        return resume(ws, comm, id, opts);
    }
    let config = opts.config(ws)?;
    match lookup(ws, &config)? {
        Lookup::Done(done) => {
            // --fresh restarts an interrupted run; a finished one is a result, kept as is.
            let fresh = match opts.fresh {
                true => {
                    " (--fresh starts over an interrupted run, not a finished one: to \
                         train again, give another --seed or use another workspace)"
                }
                false => "",
            };
            crate::progress::note(format!(
                "training of '{}' with these parameters is already done (run {}); nothing to \
                 do{fresh}",
                config.dataset, done.id
            ));
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
                    stopped: RunRecord::of_run(ws, done.id)?.stopped,
                },
            });
        }
        Lookup::Unfinished(prev) if !opts.fresh => {
            crate::progress::note(format!(
                "run {} with these parameters {}; resuming it (--fresh starts over)",
                prev.id,
                match (prev.status, &prev.error) {
                    (RunStatus::Failed, Some(error)) => format!("failed ({error})"),
                    (RunStatus::Failed, None) => "failed".to_string(),
                    _ => "was interrupted".to_string(),
                }
            ));
            return resume(ws, comm, prev.id, opts);
        }
        Lookup::Unfinished(_) | Lookup::New => {}
    }
    let setup = Setup::open(ws, config, opts.prefetch)?;
    let run = StageRun::start(ws, StageKind::Train, &setup.config.to_json())?;
    let result = (|| {
        let steering = opts.steering();
        RunRecord::new(run.id, setup.config.clone(), steering.clone()).save(ws)?;
        let start = setup.initial_checkpoint()?;
        drive(ws, comm, &run, &setup, (start, false), &steering)
    })();
    finish(ws, &setup, run, result)
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
            crate::progress::note(format!(
                "run {} started with these parameters but was resumed with other options \
                 ({}), so it is not reused (its checkpoints serve `--run {}` of predict and \
                 evaluate)",
                run.id,
                changes.join(", "),
                run.id
            ));
            break;
        }
    }
    Ok(Lookup::New)
}

/// Continues run `id` from its last registered checkpoint (or from step 0 if it wrote none),
/// with the options `opts` gives applied as `resume::plan` allows. Refusals come before
/// the run is touched.
fn resume(
    ws: &Workspace,
    comm: &dyn Comm,
    id: i64,
    opts: &TrainOptions,
) -> Result<Outcome<TrainSummary>> {
    let record = RunRecord::of_run(ws, id)?;
    let status = ws.catalog.run(id)?.map(|row| row.status);
    let finished = status.map(|s| resume::refuse_finished(s, &record, opts));
    let last = ws.catalog.checkpoints(id)?.last().cloned();
    let dataset = record.in_force.dataset_row(ws)?;
    let planner = budget::planner_of(ws, &dataset, &record.in_force)?;
    let plan = resume::plan(record, opts, last.as_ref().map_or(0, |c| c.step), &planner)?;
    // Options that cannot change are named first, whatever the run's status.
    finished.transpose()?;
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
                crate::progress::note(format!(
                    "resuming run {id} from step {} (epoch {})",
                    c.state.step, c.state.epoch
                ));
                (c, true)
            }
            None => {
                crate::progress::note(format!(
                    "run {id} wrote no checkpoint; starting it from the beginning"
                ));
                (setup.initial_checkpoint()?, false)
            }
        };
        plan.announce();
        plan.record.save(ws)?;
        let steering = plan.record.steering.clone().expect("a plan sets steering");
        drive(ws, comm, &run, &setup, start, &steering)
    })();
    finish(ws, &setup, run, result)
}

/// Runs the step loop of `run` from `start` (a checkpoint, and whether it is a registered
/// one of the run rather than the initial parameters) into the run's published directory,
/// after pruning its checkpoints as `steering` says (a resume may have lowered the count,
/// and a crash may have left unregistered files). Over MPI ranks, the other ranks are
/// told where to start first.
fn drive(
    ws: &Workspace,
    comm: &dyn Comm,
    run: &StageRun<'_>,
    setup: &Setup,
    (start, registered): (Checkpoint, bool),
    steering: &Steering,
) -> Result<TrainSummary> {
    let out_rel = setup.out_rel(run);
    run.create_output_dir(&out_rel)?;
    let told = Start {
        run_id: run.id,
        config: setup.config.clone(),
        steering: steering.clone(),
        from_step: registered.then_some(start.state.step),
    };
    announce(comm, Some(&told))?;
    // The other ranks have read the checkpoint before any is pruned.
    if comm.size() > 1 {
        comm.barrier()?;
    }
    prune_checkpoints(ws, run, &out_rel, steering.keep_checkpoints)?;
    let total = setup.total_steps(&setup.shuffled())?;
    let held = ws.catalog.checkpoints(run.id)?.len();
    ensure_room_for_checkpoints(
        run,
        (&start).into(),
        (start.state.step, total, setup.config.checkpoint_every),
        (steering.keep_checkpoints, setup.config.early_stopping),
        held,
    )?;
    let held_out = match steering.eval_every {
        0 => None,
        every => Some(HeldOut::open(ws, setup, every, steering.eval_split)?),
    };
    let validation = match &setup.config.early_stopping {
        Some(es) => Some(HeldOut::open(ws, setup, es.every, Split::Validation)?),
        None => None,
    };
    let loop_opts = LoopOptions {
        final_elbo: steering.final_elbo,
        prefetch: steering.prefetch,
        held_out,
        validation,
        keep: steering.keep_checkpoints,
    };
    let job = Job {
        comm,
        run: Some(run),
    };
    let summary = train_loop(ws, job, &out_rel, setup, start, &loop_opts)?;
    // How the run ended, with it, before it is marked finished (a run killed in between
    // resumes to the same end and records it again).
    let mut record = RunRecord::of_run(ws, run.id)?;
    record.stopped = summary.stopped;
    record.save(ws)?;
    failpoint::kill_at("train-ended", summary.final_step);
    Ok(summary)
}

/// What rank 0 tells the other ranks of an MPI job before the first step.
#[derive(Debug, Serialize, Deserialize)]
struct Start {
    run_id: i64,
    /// The configuration in force.
    config: TrainConfig,
    steering: Steering,
    /// The step of the run's registered checkpoint it starts from; None: the initial
    /// parameters, which every rank computes from the seed.
    from_step: Option<u64>,
}

/// Rank 0 sends `start` (None: nothing to train) to the other ranks, as JSON; nothing in
/// one process.
fn announce(comm: &dyn Comm, start: Option<&Start>) -> Result<()> {
    if comm.size() == 1 {
        return Ok(());
    }
    let mut bytes = match start {
        Some(s) => serde_json::to_vec(s)?,
        None => Vec::new(),
    };
    comm.broadcast_u64(bytes.len() as u64)?;
    if !bytes.is_empty() {
        comm.broadcast_bytes(&mut bytes)?;
    }
    Ok(())
}

/// A rank other than 0: waits for rank 0's [`Start`], opens the same inputs, starts from
/// the same state and trains its share of every minibatch.
fn follow(ws: &Workspace, comm: &dyn Comm) -> Result<Outcome<Option<TrainSummary>>> {
    let len = comm.broadcast_u64(0)? as usize;
    if len == 0 {
        return Ok(Outcome {
            run_id: 0,
            computed: false,
            value: None,
        });
    }
    let mut bytes = vec![0u8; len];
    comm.broadcast_bytes(&mut bytes)?;
    let start: Start = serde_json::from_slice(&bytes).context("rank 0's start of training")?;
    let setup = Setup::open(ws, start.config, start.steering.prefetch)?;
    let checkpoint = match start.from_step {
        Some(step) => {
            let rows = ws.catalog.checkpoints(start.run_id)?;
            let row = rows.iter().find(|c| c.step == step).with_context(|| {
                format!(
                    "run {}: no registered checkpoint at step {step}",
                    start.run_id
                )
            })?;
            load_checkpoint(ws, row)?
        }
        None => setup.initial_checkpoint()?,
    };
    comm.barrier()?;
    let loop_opts = LoopOptions {
        final_elbo: false,
        prefetch: start.steering.prefetch,
        held_out: None,
        // Rank 0 scores the validation split and tells the others whether to stop.
        validation: None,
        keep: start.steering.keep_checkpoints,
    };
    let job = Job { comm, run: None };
    train_loop(ws, job, "", &setup, checkpoint, &loop_opts)?;
    Ok(Outcome {
        run_id: start.run_id,
        computed: true,
        value: None,
    })
}

/// Records how `run` ended; a finished run's final rows (its status, last figures) are
/// copied into its directory's marker too.
fn finish(
    ws: &Workspace,
    setup: &Setup,
    run: StageRun<'_>,
    result: Result<TrainSummary>,
) -> Result<Outcome<TrainSummary>> {
    let run_id = run.id;
    let out_dir = ws.resolve(&setup.out_rel(&run));
    let value = run.finish(result)?;
    ws.record_rows(&out_dir, run_id);
    Ok(Outcome {
        run_id,
        computed: true,
        value,
    })
}
