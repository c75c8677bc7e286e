//! The one stage protocol: how every stage turns parameters into registered outputs.
//!
//! A stage run is memoised on (stage, parameters): the catalog is asked for a finished run
//! with exactly these parameters first, and only when there is none does the stage compute.
//! Computing happens below the run's private scratch directory `tmp/run-<id>/`; the finished
//! output is renamed into `<stage dir>/<name>.run<id>` and only then are the catalog rows
//! committed, in one transaction. Any failure on the way records the run as failed and
//! removes what it wrote, so the catalog never names a half-written file:
//!
//! ```text
//! lookup ──done──▶ cached value
//!    └──new──▶ start run ─▶ compute in tmp/run-<id>/ ─▶ rename into place ─▶ commit rows ─▶ ok
//!                               └────────────── any error ──────────────▶ failed, cleaned
//! ```
//!
//! Training publishes checkpoints while it runs and resumes interrupted runs; it uses the
//! same pieces ([`lookup`], [`StageRun`]) without [`memoised`]'s single publish step.
//!
//! Concurrency: a [`StageRun`] holds the workspace's lock of its stage and parameters
//! ([`Workspace::lock_stage`]) from before its row is written until its outcome is, so a
//! second process asking for the same computation is refused, naming the running run and
//! its pid; [`memoised`] asks the catalog again once it holds the lock, so a run finished
//! meanwhile is reused rather than repeated. A run that did not finish (killed, failed,
//! or damaged and repaired) is recomputed under its own id when the same parameters are
//! asked for again, so the ids and paths of a rerun are those of an undisturbed run.
//!
//! Ranks ([`memoised_on`], with a [`Comm`] of K > 1 processes under `mpirun`): rank 0 alone
//! reads and writes the catalog, takes the lock, owns the scratch directory and publishes;
//! it tells the other ranks whether there is anything to compute, then every rank runs
//! `compute` (its share of the rows, combined through the collectives), and only rank 0's
//! staged output is renamed and committed, catalog row last, exactly as in one process.
//! The other ranks get a private scratch directory `tmp/run-<id>.rank<r>/`, removed when
//! they finish, and write nothing else; their outcome carries no value. A rank that fails
//! aborts the whole job (the command line calls MPI_Abort), so rank 0's run is left running
//! under a dead process, found interrupted and recomputed by the next invocation: never
//! half-registered.
//!
//! Crash injection ([`crate::failpoint`]): `FSGP_FAILPOINT=stage-computed:STAGE` kills the process
//! once the outputs are complete in scratch, `stage-renamed:STAGE` once they are renamed
//! into place but before the catalog commit (ingest, svd, predict, evaluate);
//! `stage-pause:STAGE` pauses it, any stage, once its run is recorded as running and its
//! scratch directory exists, until a file appears there.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::comm::Comm;
use crate::failpoint;

use crate::store::catalog::{RunRow, RunStatus, StageKind};
use crate::store::owned::{Disposal, LostFound, SCRATCH_DIR};
use crate::store::workspace::{process_identity, StageLock, Workspace};

/// What a stage returns: its value and whether it was computed now or found done.
#[derive(Debug, Clone)]
pub struct Outcome<T> {
    pub run_id: i64,
    /// False when a finished run with the same parameters was found in the catalog.
    pub computed: bool,
    pub value: T,
}

impl<T> Outcome<T> {
    /// The same run with its value mapped.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Outcome<U> {
        Outcome {
            run_id: self.run_id,
            computed: self.computed,
            value: f(self.value),
        }
    }
}

impl<T> Outcome<Option<T>> {
    /// The outcome of a stage run in one process, which is rank 0 and so holds the value
    /// (the `*_on` forms of the stages return `None` on the other ranks).
    pub fn of_one_process(self) -> Outcome<T> {
        self.map(|value| value.expect("one process is rank 0"))
    }
}

/// What the catalog holds for a stage with given parameters.
#[derive(Debug)]
pub enum Lookup {
    /// A finished run: its outputs can be reused.
    Done(RunRow),
    /// A run that did not finish — its process died, it failed, or `pipeline verify
    /// --repair` removed its damaged outputs: it can be resumed from what it registered
    /// (training).
    Unfinished(RunRow),
    /// Nothing: the stage must run.
    New,
}

/// The newest run of `kind` with exactly `params` in force that finished, else the newest
/// that did not (interrupted or failed), else one whose damaged outputs `pipeline verify
/// --repair` removed. The parameters in force are those a run started with unless a
/// resume changed them (training; `run_options` in the catalog).
///
/// A failed run is taken up like an interrupted one: what it registered is whole (each
/// file was checked when written), and most failures come from outside the run (a full
/// disk, a damaged input). One that came from the run itself (a diverged bound) recurs
/// from its last checkpoint at no more cost than a fresh run's.
pub fn lookup(ws: &Workspace, kind: StageKind, params: &serde_json::Value) -> Result<Lookup> {
    let find = |status| ws.catalog.find_run_in_force(kind, params, status);
    if let Some(done) = find(RunStatus::Ok)? {
        return Ok(Lookup::Done(done));
    }
    let unfinished = [find(RunStatus::Interrupted)?, find(RunStatus::Failed)?]
        .into_iter()
        .flatten()
        .max_by_key(|r| r.id);
    if let Some(run) = unfinished {
        return Ok(Lookup::Unfinished(run));
    }
    Ok(match ws.catalog.find_repaired_run(kind, params)? {
        Some(repaired) => Lookup::Unfinished(repaired),
        None => Lookup::New,
    })
}

/// An output a stage finished in its scratch directory, ready to be published.
pub struct Staged<C> {
    /// Subdirectory of the scratch directory that holds the output.
    pub dir: &'static str,
    /// Published as `<stage output dir>/<name>.run<id>`.
    pub name: String,
    /// What the commit step needs (the artifact list, figures, ...).
    pub value: C,
}

/// Where a stage's output was published.
#[derive(Debug, Clone)]
pub struct Published {
    pub run_id: i64,
    /// Workspace-relative directory of the output.
    pub rel: String,
}

/// Runs a stage memoised on (`kind`, `params`): the cached value of a finished identical run,
/// else [`execute`].
pub fn memoised<T, C: Send>(
    ws: &Workspace,
    kind: StageKind,
    params: &serde_json::Value,
    pool: Option<&rayon::ThreadPool>,
    cached: impl FnOnce(&RunRow) -> Result<T>,
    compute: impl FnOnce(&Path) -> Result<Staged<C>> + Send,
    commit: impl FnOnce(&Published, C) -> Result<T>,
) -> Result<Outcome<T>> {
    match done_or_locked(ws, kind, params)? {
        DoneOrLocked::Done(done) => Ok(Outcome {
            run_id: done.id,
            computed: false,
            value: cached(&done)?,
        }),
        DoneOrLocked::Locked(lock) => execute_locked(ws, lock, kind, params, pool, compute, commit),
    }
}

/// [`memoised`] over the ranks of `comm`: every rank calls it with the same arguments.
/// Rank 0 does what [`memoised`] does and returns its value; every other rank computes its
/// share into a private scratch directory (removed afterwards) and returns `None`.
#[allow(clippy::too_many_arguments)]
pub fn memoised_on<T, C: Send>(
    ws: &Workspace,
    comm: &dyn Comm,
    kind: StageKind,
    params: &serde_json::Value,
    pool: Option<&rayon::ThreadPool>,
    cached: impl FnOnce(&RunRow) -> Result<T>,
    compute: impl FnOnce(&Path) -> Result<Staged<C>> + Send,
    commit: impl FnOnce(&Published, C) -> Result<T>,
) -> Result<Outcome<Option<T>>> {
    if !comm.is_root() {
        return follow_root(ws, comm, kind, pool, compute);
    }
    // Rank 0 tells the others the run id, or 0 when a finished run is reused (ids start at
    // 1), once it holds the lock or knows there is nothing to do.
    let done = match done_or_locked(ws, kind, params)? {
        DoneOrLocked::Done(done) => done,
        DoneOrLocked::Locked(lock) => {
            return Ok(
                execute_locked_on(ws, comm, lock, kind, params, pool, compute, commit)?.map(Some),
            );
        }
    };
    comm.broadcast_u64(0)?;
    Ok(Outcome {
        run_id: done.id,
        computed: false,
        value: Some(cached(&done)?),
    })
}

/// A rank other than 0 in [`memoised_on`]: waits for rank 0's decision, computes its share
/// when there is a run, and waits for rank 0 to have committed it.
fn follow_root<T, C: Send>(
    ws: &Workspace,
    comm: &dyn Comm,
    kind: StageKind,
    pool: Option<&rayon::ThreadPool>,
    compute: impl FnOnce(&Path) -> Result<Staged<C>> + Send,
) -> Result<Outcome<Option<T>>> {
    let run_id = comm.broadcast_u64(0)? as i64;
    if run_id == 0 {
        return Ok(Outcome {
            run_id,
            computed: false,
            value: None,
        });
    }
    let name = format!("run-{run_id}.rank{}", comm.rank());
    let scratch = ws.create_scratch(&name, run_id, kind)?;
    let computed = match pool {
        Some(pool) => pool.install(|| compute(&scratch)),
        None => compute(&scratch),
    };
    let _ = ws.dispose(&format!("{SCRATCH_DIR}/{name}"), &mut LostFound::new());
    drop(computed?);
    // Rank 0 broadcasts again once the outputs are registered.
    comm.broadcast_u64(0)?;
    Ok(Outcome {
        run_id,
        computed: true,
        value: None,
    })
}

/// A finished run to reuse, or the lock to compute one.
enum DoneOrLocked {
    Done(RunRow),
    Locked(StageLock),
}

/// The finished run of `kind` with `params`, else this process's lock on computing it.
fn done_or_locked(
    ws: &Workspace,
    kind: StageKind,
    params: &serde_json::Value,
) -> Result<DoneOrLocked> {
    if let Some(done) = ws.catalog.find_ok_run(kind, params)? {
        return Ok(DoneOrLocked::Done(done));
    }
    let lock = ws.lock_stage(kind, "", params)?;
    // Another process may have finished the same run between the lookup and the lock.
    Ok(match ws.catalog.find_ok_run(kind, params)? {
        Some(done) => DoneOrLocked::Done(done),
        None => DoneOrLocked::Locked(lock),
    })
}

/// Runs a stage unconditionally: starts a run, computes into its scratch directory (inside
/// `pool` when given), renames the output into place and commits the catalog rows through
/// `commit`; on any error the run is recorded as failed and its files are removed. Refused
/// while another process runs the same stage with the same parameters.
///
/// A run with the same parameters that did not finish (its process was killed, it failed,
/// or `pipeline verify --repair` removed its damaged outputs) is recomputed under its own
/// id, into the same directory, so every later run that names it (a training run's svd
/// run, ...) stays valid and nothing else is recomputed.
///
/// `subject` names the output when `params` do not (an ingest's dataset name): only runs
/// with the same subject and parameters exclude each other.
pub fn execute<T, C: Send>(
    ws: &Workspace,
    kind: StageKind,
    subject: &str,
    params: &serde_json::Value,
    pool: Option<&rayon::ThreadPool>,
    compute: impl FnOnce(&Path) -> Result<Staged<C>> + Send,
    commit: impl FnOnce(&Published, C) -> Result<T>,
) -> Result<Outcome<T>> {
    let lock = ws.lock_stage(kind, subject, params)?;
    execute_locked(ws, lock, kind, params, pool, compute, commit)
}

/// [`execute`] once this process holds the stage's lock.
fn execute_locked<T, C: Send>(
    ws: &Workspace,
    lock: StageLock,
    kind: StageKind,
    params: &serde_json::Value,
    pool: Option<&rayon::ThreadPool>,
    compute: impl FnOnce(&Path) -> Result<Staged<C>> + Send,
    commit: impl FnOnce(&Published, C) -> Result<T>,
) -> Result<Outcome<T>> {
    let single = crate::comm::Single;
    execute_locked_on(ws, &single, lock, kind, params, pool, compute, commit)
}

/// [`execute_locked`] on rank 0 of `comm`: the run id is broadcast once the run is
/// recorded, and again once its outputs are committed (one process: both are no-ops).
#[allow(clippy::too_many_arguments)]
fn execute_locked_on<T, C: Send>(
    ws: &Workspace,
    comm: &dyn Comm,
    lock: StageLock,
    kind: StageKind,
    params: &serde_json::Value,
    pool: Option<&rayon::ThreadPool>,
    compute: impl FnOnce(&Path) -> Result<Staged<C>> + Send,
    commit: impl FnOnce(&Published, C) -> Result<T>,
) -> Result<Outcome<T>> {
    let run = match unfinished_run(ws, kind, params)? {
        Some(unfinished) => {
            crate::progress::note(format!(
                "{}; recomputing it",
                why_unfinished(ws, &unfinished)?
            ));
            StageRun::resume_locked(ws, lock, unfinished.id)?
        }
        None => StageRun::start_locked(ws, lock, kind, params)?,
    };
    comm.broadcast_u64(run.id as u64)?;
    let scratch = run.tmp_dir().to_path_buf();
    let staged = match pool {
        Some(pool) => pool.install(|| compute(&scratch)),
        None => compute(&scratch),
    };
    let staged = match staged {
        Ok(staged) => staged,
        Err(e) => {
            let e = run.locate(e);
            run.failed(&e);
            return Err(e);
        }
    };
    failpoint::kill_at("stage-computed", kind);
    let published = Published {
        run_id: run.id,
        rel: run.output_rel(kind.output_dir(), &staged.name),
    };
    let value = run.publish_and_commit(staged.dir, &published.rel.clone(), || {
        commit(&published, staged.value)
    })?;
    comm.broadcast_u64(published.run_id as u64)?;
    Ok(Outcome {
        run_id: published.run_id,
        computed: true,
        value,
    })
}

/// The newest run of `kind` with exactly `params` that did not finish: interrupted (its
/// process died), failed, or marked damaged by `pipeline verify --repair`.
fn unfinished_run(
    ws: &Workspace,
    kind: StageKind,
    params: &serde_json::Value,
) -> Result<Option<RunRow>> {
    let interrupted = ws
        .catalog
        .find_run_with_status(kind, params, RunStatus::Interrupted)?;
    let failed = ws
        .catalog
        .find_run_with_status(kind, params, RunStatus::Failed)?;
    Ok(interrupted.into_iter().chain(failed).max_by_key(|r| r.id))
}

/// Why `run` is recomputed, as printed before it is.
fn why_unfinished(ws: &Workspace, run: &RunRow) -> Result<String> {
    let (kind, id) = (run.stage, run.id);
    let error = run.error.as_deref().unwrap_or("no message");
    Ok(if ws.catalog.damaged_since(id)?.is_some() {
        format!("{kind} run {id} was found damaged by 'pipeline verify --repair'")
    } else if run.status == RunStatus::Failed {
        format!("{kind} run {id} with these parameters failed ({error})")
    } else {
        format!("{kind} run {id} with these parameters was interrupted ({error})")
    })
}

/// The number of worker threads: as asked, else every core.
pub fn threads_or_all(threads: Option<usize>) -> usize {
    threads.unwrap_or_else(cores)
}

/// The cores this process may run on (2 when the system does not say).
fn cores() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

/// How many worker threads per core `--threads` may ask for. The stages are compute-bound,
/// so threads beyond the cores only share them; a few per core still lets a user match a
/// run made on a larger machine (results are reproducible for a fixed count), while a
/// count far beyond is a typo that would start millions of threads.
pub const THREADS_PER_CORE: usize = 4;

/// The most worker threads `--threads` may ask for on this machine.
pub fn max_threads() -> usize {
    THREADS_PER_CORE * cores()
}

/// A rayon pool of `threads` workers for one stage (results are reproducible for a fixed
/// count, so the count is part of a stage's configuration where it matters).
pub fn thread_pool(threads: usize) -> Result<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .context("starting the worker threads")
}

/// A stage run in progress. Dropping it without [`StageRun::succeeded`] records it as failed
/// and deletes its scratch directory, so an error anywhere leaves nothing behind. It holds
/// the lock of its stage and parameters until its outcome is recorded.
pub struct StageRun<'a> {
    ws: &'a Workspace,
    pub id: i64,
    kind: StageKind,
    tmp_dir: PathBuf,
    ended: bool,
    /// Released after `Drop` has recorded the outcome (fields drop after `drop` runs).
    _lock: StageLock,
}

impl<'a> StageRun<'a> {
    /// Records the start of a run of `kind` and creates its scratch directory; refused
    /// while another process runs `kind` with `params`.
    pub fn start(ws: &'a Workspace, kind: StageKind, params: &serde_json::Value) -> Result<Self> {
        let lock = ws.lock_stage(kind, "", params)?;
        Self::start_locked(ws, lock, kind, params)
    }

    fn start_locked(
        ws: &'a Workspace,
        lock: StageLock,
        kind: StageKind,
        params: &serde_json::Value,
    ) -> Result<Self> {
        let pid = std::process::id();
        let identity = process_identity(pid).unwrap_or_default();
        let id = ws.catalog.begin_run(kind, params, pid, &identity)?;
        Self::with_scratch(ws, lock, kind, id)
    }

    /// Takes over an interrupted or failed run (`pipeline train --resume`): it is marked
    /// running under this process and gets a fresh scratch directory. Refused while another
    /// process runs the same stage with the run's parameters in force.
    pub fn resume(ws: &'a Workspace, id: i64) -> Result<Self> {
        let Some(row) = ws.catalog.run(id)? else {
            bail!("there is no run {id} in the catalog");
        };
        let in_force = match ws.catalog.run_options(id)? {
            Some(options) => options.params,
            None => row.params,
        };
        let lock = ws.lock_stage(row.stage, "", &in_force)?;
        Self::resume_locked(ws, lock, id)
    }

    fn resume_locked(ws: &'a Workspace, lock: StageLock, id: i64) -> Result<Self> {
        let pid = std::process::id();
        let identity = process_identity(pid).unwrap_or_default();
        let Some(row) = ws.catalog.run(id)? else {
            bail!("there is no run {id} in the catalog");
        };
        // Only train extends a finished run, and only one its caller found cut by
        // --max-steps (`train::session`); every other finished run is refused here.
        match row.status {
            RunStatus::Ok if row.stage == StageKind::Train => {
                ws.catalog.reopen_finished_run(id, pid, &identity)?
            }
            _ => ws.catalog.reopen_run(id, pid, &identity)?,
        }
        Self::with_scratch(ws, lock, row.stage, id)
    }

    fn with_scratch(ws: &'a Workspace, lock: StageLock, kind: StageKind, id: i64) -> Result<Self> {
        let tmp_dir = ws.create_scratch(&format!("run-{id}"), id, kind)?;
        failpoint::pause_at("stage-pause", kind, &tmp_dir);
        Ok(StageRun {
            ws,
            id,
            kind,
            tmp_dir,
            ended: false,
            _lock: lock,
        })
    }

    /// Adds where an error happened, `"{stage} run {id}: "`, to an error of this run's work,
    /// so every failure a person reads (and the catalog records) names the run it ended.
    pub fn locate(&self, error: anyhow::Error) -> anyhow::Error {
        error.context(format!("{} run {}", self.kind, self.id))
    }

    /// Scratch directory, private to this run.
    pub fn tmp_dir(&self) -> &Path {
        &self.tmp_dir
    }

    /// Name of a published output directory: `<dir>/<name>.run<id>` (workspace-relative).
    pub fn output_rel(&self, dir: &str, name: &str) -> String {
        format!("{dir}/{name}.run{}", self.id)
    }

    /// Renames `tmp_dir/<from>` to the workspace-relative `to` (same file system, atomic),
    /// marked as this run's at a new generation of the catalog (`store::identity`).
    ///
    /// A directory already at `to` is what this run left when it died before its commit
    /// (the name carries the run id, this process holds the run, and the catalog that said
    /// so was checked to vouch for the workspace when it was opened): it is replaced.
    pub fn publish(&self, from: &str, to: &str) -> Result<PathBuf> {
        let src = self.tmp_dir.join(from);
        let dst = self.ws.resolve(to);
        self.ws.stamp_run_dir(&src, self.id, self.kind)?;
        let mut aside = LostFound::new();
        match self.ws.dispose(to, &mut aside)? {
            Disposal::Absent | Disposal::Removed => {}
            Disposal::MovedAside(moved) => crate::progress::warning(format!(
                "moved what fsgp did not write in {to} to {} before publishing \
                 there",
                moved.join(", ")
            )),
            Disposal::Kept(why) => bail!("cannot publish {to}: {why}"),
        }
        fs::rename(&src, &dst)
            .with_context(|| format!("publishing {} as {}", src.display(), dst.display()))?;
        Ok(dst)
    }

    /// Creates the published directory `rel` (workspace-relative) of a run that registers
    /// its files as it goes (training), marked as this run's, unless it exists. It appears
    /// whole: made and marked in scratch, then renamed into place.
    pub fn create_output_dir(&self, rel: &str) -> Result<PathBuf> {
        let dst = self.ws.resolve(rel);
        if dst.is_dir() {
            return Ok(dst);
        }
        let staged = self.tmp_dir.join("output-dir");
        fs::create_dir_all(&staged).with_context(|| format!("creating {}", staged.display()))?;
        self.publish("output-dir", rel)
    }

    /// The last step of every stage: renames `tmp_dir/<from>` to the workspace-relative `to`,
    /// then runs `commit` (which registers the outputs in one catalog transaction). If
    /// either fails, the published directory is removed and the run recorded as failed, so
    /// nothing unregistered stays visible.
    pub fn publish_and_commit<T>(
        self,
        from: &str,
        to: &str,
        commit: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let published = self.publish(from, to).map(|_| {
            failpoint::kill_at("stage-renamed", self.kind);
        });
        match published.and_then(|()| commit()) {
            Ok(value) => {
                self.ws.record_rows(&self.ws.resolve(to), self.id);
                self.succeeded()?;
                Ok(value)
            }
            Err(e) => {
                let _ = self.ws.dispose(to, &mut LostFound::new());
                let e = self.locate(e);
                self.failed(&e);
                Err(e)
            }
        }
    }

    /// Call after the catalog rows naming the outputs were committed.
    pub fn succeeded(mut self) -> Result<()> {
        self.ended = true;
        self.remove_scratch()
    }

    /// Ends a stage that registered its outputs as it went (training): ok when `result` is,
    /// failed with its message otherwise.
    pub fn finish<T>(self, result: Result<T>) -> Result<T> {
        match result {
            Ok(value) => {
                self.ws.catalog.end_run(self.id, RunStatus::Ok, None)?;
                self.succeeded()?;
                Ok(value)
            }
            Err(e) => {
                let e = self.locate(e);
                self.failed(&e);
                Err(e)
            }
        }
    }

    /// Records the failure with its message and removes the scratch space.
    pub fn failed(mut self, error: &anyhow::Error) {
        self.ended = true;
        self.record_failure(&format!("{error:#}"));
    }

    /// Removes this run's scratch directory (`tmp/run-<id>`), by the workspace's rule.
    fn remove_scratch(&self) -> Result<()> {
        let rel = format!("{SCRATCH_DIR}/run-{}", self.id);
        if let Some(note) = self.ws.dispose(&rel, &mut LostFound::new())?.note(&rel) {
            crate::progress::warning(note.to_string());
        }
        Ok(())
    }

    fn record_failure(&self, msg: &str) {
        // Best effort: the original error matters more than a cleanup failure.
        let _ = self.remove_scratch();
        let _ = self
            .ws
            .catalog
            .end_run(self.id, RunStatus::Failed, Some(msg));
    }
}

impl Drop for StageRun<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.record_failure("the stage ended without finishing");
        }
    }
}
