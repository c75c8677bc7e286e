//! The workspace directory: catalog, temporary space of running stages, published outputs.
//!
//! Layout:
//! ```text
//! WORKSPACE/
//!   catalog.sqlite           the catalog (+ -wal, -shm)
//!   workspace.json           the workspace's identity (`store::identity`)
//!   tmp/run-<id>/            scratch of stage run <id>; never read by other stages
//!   datasets/<name>.run<id>/ an ingested dataset, published by renaming from tmp/
//!   svd/<name>-r<R>.run<id>/ basis, singular values, K_XX̃ and A init of one SVD run
//!   train/<name>-<kernel>.run<id>/ checkpoints of one training run
//!   predictions/<name>-<split>.run<id>/ top-k predictions of one predict run
//!   locks/<stage>-<hash>.lock  held (flock) by the process running a stage with the
//!                            parameters hashed; removed when it ends
//! ```
//! How stages write here is the stage protocol's business (`crate::stage`): only below
//! `tmp/run-<id>/`, then a rename into place, then the catalog rows; each published
//! directory holds a marker (`.fsgp-run.json`) tying it to the workspace, its run and the
//! catalog's generation. Every open first checks that the catalog vouches for the files
//! (`store::identity`); opening to write then collects what dead runs left: their scratch
//! directories and the unreferenced published directories the catalog knows as theirs.
//! Opening to read ([`Workspace::open_read_only`]) creates, writes and deletes nothing.
//!
//! Two processes never compute the same stage with the same parameters at once: the run
//! holds [`StageLock`] (an exclusive `flock` on a file named after the stage and a hash of
//! its parameters) from before its catalog row is written until after its outcome is, and
//! a second process is refused with the running run's id and pid. The kernel releases the
//! lock when its process ends, however it ends, so a killed run never blocks the next one.

use std::fs;
use std::io::{Seek, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};

use super::catalog::{
    ArtifactKind, Catalog, CheckpointRow, Contended, DatasetRow, Identity, RunRow, RunStatus,
    Split, StageKind, StoredArtifact,
};
use super::identity::{self, PublishedDir, RunMarker};
use super::integrity::Registered;
use super::npy::NpyMap;
use super::owned::{checked_rel, Disposal, Disposer, LostFound, LOST_FOUND, SCRATCH_DIR};
use super::user_file::resolved;
use crate::error::did_you_mean;
use crate::stop::StopToken;

/// Top-level directories that hold published stage outputs, one per stage.
fn output_dirs() -> impl Iterator<Item = &'static str> {
    StageKind::ALL.iter().map(|k| k.output_dir())
}

/// Directory of the workspace that holds the stage locks.
pub const LOCK_DIR: &str = "locks";

/// The catalog's file name in a workspace.
pub const CATALOG_FILE: &str = "catalog.sqlite";

pub struct Workspace {
    root: PathBuf,
    pub catalog: Catalog,
    /// The id of `workspace.json` and of the catalog (`store::identity`).
    workspace_id: String,
    /// The user's request to stop, polled by the stages run here (`crate::stop`): every
    /// stage is handed the workspace, so it carries the request to all of them.
    stop: StopToken,
}

/// A directory that holds no workspace: no catalog and no outputs (a read-only open
/// refuses it; `pipeline status` says so).
#[derive(Debug, thiserror::Error)]
#[error("no workspace at {} (no catalog.sqlite and no outputs); give --workspace DIR", .0.display())]
pub struct NoWorkspace(pub PathBuf);

/// Whether the catalog file is missing or empty: SQLite would make a new catalog of either.
fn catalog_is_absent(path: &Path) -> bool {
    fs::metadata(path).map_or(true, |m| m.len() == 0)
}

/// Identity of this process for liveness checks: its pid and its start time in clock ticks
/// since boot (so a reused pid is not mistaken for the original process).
pub fn process_identity(pid: u32) -> Option<String> {
    process_state(pid).map(|(_, start)| start)
}

/// Whether the process that recorded `pid`/`pid_start` is still running. A zombie (ended,
/// not yet reaped by its parent: `timeout -s KILL`, a parent that never waits, a container
/// without an init) has ended: its files and locks are released, so it counts as gone.
pub fn run_is_live(pid: i64, pid_start: &str) -> bool {
    u32::try_from(pid)
        .ok()
        .and_then(process_state)
        .is_some_and(|(state, start)| start == pid_start && !matches!(state, 'Z' | 'X' | 'x'))
}

/// What the garbage collection of a writing open would record for `run`: a run still
/// marked running whose process is gone is shown interrupted (a read-only open records
/// nothing, so `pipeline status` sees the catalog as the next writer will leave it).
pub fn as_seen(mut run: RunRow) -> RunRow {
    if run.status == RunStatus::Running && !run_is_live(run.pid, &run.pid_start) {
        run.status = RunStatus::Interrupted;
        run.error = Some(DEAD_RUN.into());
    }
    run
}

/// The catalog's error of a run whose process ended without saying so.
const DEAD_RUN: &str = "the process ended without finishing (killed or crashed)";

/// The state letter (`R`, `S`, `Z`, …) and start time of process `pid`, from
/// `/proc/PID/stat`.
fn process_state(pid: u32) -> Option<(char, String)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 2 (comm) may contain spaces and parentheses; fields after the last ')' are plain.
    let mut rest = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = rest.next()?.chars().next()?;
    // `rest` is now at field 4; starttime is field 22.
    Some((state, rest.nth(18)?.to_string()))
}

impl Workspace {
    /// Opens the workspace at `root` to run stages in it, creating it if needed: checks
    /// that its catalog vouches for its files (`store::identity`), then cleans up after
    /// dead runs. A catalog that cannot vouch is refused before anything is written.
    pub fn open(root: &Path) -> Result<Self> {
        fs::create_dir_all(root)
            .with_context(|| format!("creating workspace {}", root.display()))?;
        let catalog_path = root.join(CATALOG_FILE);
        let dirs = identity::published_dirs(root)?;
        if catalog_is_absent(&catalog_path) {
            if let Some(refusal) = identity::missing_catalog(root, &catalog_path, &dirs) {
                return Err(refusal.into());
            }
        }
        for dir in [SCRATCH_DIR, LOCK_DIR] {
            fs::create_dir_all(root.join(dir))
                .with_context(|| format!("creating workspace {}", root.display()))?;
        }
        for dir in output_dirs() {
            fs::create_dir_all(root.join(dir))?;
        }
        let file_id = identity::read_identity_file(root)?;
        let catalog = Catalog::open(&catalog_path)?;
        // A catalog without an identity is new, or of a schema before 5: it takes the
        // workspace's (a legacy catalog restored into a workspace with markers then shows
        // as older than them, at generation 0).
        let claimed = match catalog.identity()? {
            Some(known) => known,
            None => {
                let id = match &file_id {
                    Some(id) => id.clone(),
                    None => identity::new_workspace_id(),
                };
                catalog.claim_identity(&id)?
            }
        };
        let file_id = match file_id {
            Some(id) => id,
            None => identity::create_identity_file(root, &claimed.id)?,
        };
        identity::check_vouches(
            root,
            &catalog_path,
            &claimed,
            Some(&file_id),
            catalog.last_run_id()?,
            &dirs,
        )?;
        let ws = Workspace {
            root: root.to_path_buf(),
            catalog,
            workspace_id: claimed.id,
            stop: StopToken::new(),
        };
        ws.collect_garbage(&dirs)?;
        Ok(ws)
    }

    /// Opens the workspace at `root` to read it (`pipeline status`, `verify` without
    /// `--repair`): nothing is created, written or deleted, and a read-only workspace (a
    /// read-only mount, or no write permission) is read as it is. The same checks as
    /// [`Workspace::open`] refuse a catalog that cannot vouch for the files.
    pub fn open_read_only(root: &Path) -> Result<Self> {
        let catalog_path = root.join(CATALOG_FILE);
        let dirs = identity::published_dirs(root)?;
        if catalog_is_absent(&catalog_path) {
            if let Some(refusal) = identity::missing_catalog(root, &catalog_path, &dirs) {
                return Err(refusal.into());
            }
            return Err(NoWorkspace(root.to_path_buf()).into());
        }
        let file_id = identity::read_identity_file(root)?;
        let catalog = Catalog::open_read_only(&catalog_path, identity::writable_dir(root))?;
        // A catalog of schema 4 has no identity: it vouches like one at generation 0.
        let recorded = catalog.identity()?.unwrap_or_else(|| Identity {
            id: file_id.clone().unwrap_or_default(),
            generation: 0,
        });
        identity::check_vouches(
            root,
            &catalog_path,
            &recorded,
            file_id.as_deref(),
            catalog.last_run_id()?,
            &dirs,
        )?;
        Ok(Workspace {
            root: root.to_path_buf(),
            catalog,
            workspace_id: recorded.id,
            stop: StopToken::new(),
        })
    }

    /// Opens a workspace another process of the same job (MPI rank 0) opened and owns:
    /// no garbage collection, so a run that process is computing is never taken for a dead
    /// one (its pid means nothing on another node). Used by the other ranks, which read the
    /// catalog and never write it.
    pub fn open_as_follower(root: &Path) -> Result<Self> {
        let catalog = Catalog::open(&root.join(CATALOG_FILE))?;
        let workspace_id = catalog.identity()?.map(|i| i.id).unwrap_or_default();
        Ok(Workspace {
            root: root.to_path_buf(),
            catalog,
            workspace_id,
            stop: StopToken::new(),
        })
    }

    /// This handle with `stop` as the request its stages poll.
    pub fn with_stop(self, stop: StopToken) -> Self {
        Workspace { stop, ..self }
    }

    /// The request to stop that the stages run here poll.
    pub fn stop(&self) -> &StopToken {
        &self.stop
    }

    /// The workspace's id (`workspace.json`, the catalog, every run marker).
    pub fn workspace_id(&self) -> &str {
        &self.workspace_id
    }

    /// Whether `marker` is this workspace's.
    pub fn owns_marker(&self, marker: &RunMarker) -> bool {
        marker.workspace == self.workspace_id
    }

    /// Marks run directory `dir` (absolute) as `run`'s of `stage`, at a new generation of
    /// the catalog: called before the run puts files there (`store::identity`).
    pub fn stamp_run_dir(&self, dir: &Path, run: i64, stage: StageKind) -> Result<()> {
        let generation = self.catalog.next_generation()?;
        identity::write_marker(
            dir,
            &RunMarker {
                workspace: self.workspace_id.clone(),
                run,
                stage: stage.as_str().into(),
                generation,
                rows: None,
            },
        )
    }

    /// Copies run `run`'s catalog rows into the marker of its directory `dir` (absolute),
    /// after a commit: what `pipeline verify --rebuild-catalog` restores a lost catalog
    /// from. The rows are committed already, so a failure here is only a warning: the
    /// directory then holds the rows of the commit before (or none).
    pub fn record_rows(&self, dir: &Path, run: i64) {
        let recorded = (|| -> Result<()> {
            let marker = identity::read_marker(dir)?
                .with_context(|| format!("{} has no marker", dir.display()))?;
            let rows = self.catalog.run_rows(run)?;
            identity::write_marker(
                dir,
                &RunMarker {
                    rows: Some(rows),
                    ..marker
                },
            )
        })();
        if let Err(e) = recorded {
            crate::progress::warning(format!(
                "run {run}'s rows were not copied into its directory ({e:#}); a \
                 catalog rebuilt from the directories would lack its latest registrations"
            ));
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Absolute path of a workspace-relative path.
    pub fn resolve(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// The chunk files of one split of a dataset with their row counts, in chunk order;
    /// checked against the split's registered chunk and row counts.
    pub fn split_chunks(&self, d: &DatasetRow, split: Split) -> Result<Vec<(Registered, u64)>> {
        let row = d.split(split).with_context(|| {
            let names = d.splits.iter().map(|s| s.split.name());
            // The one split an option creates: say which.
            let how = if split == Split::Validation {
                "; carve one from the training rows with 'pipeline ingest ... \
                 --validation-fraction 0.2 --replace' (in a spec: [ingest] \
                 validation_fraction = 0.2)"
            } else {
                ""
            };
            format!(
                "dataset '{}' has no split '{split}' (it has: {}; see 'pipeline status'){how}",
                d.name,
                names.collect::<Vec<_>>().join(", ")
            )
        })?;
        if let Some(when) = self.catalog.damaged_since(d.stage_run_id)? {
            anyhow::bail!(
                "dataset '{}' was found damaged by 'pipeline verify --repair' ({when}); ingest \
                 it again (the same 'pipeline ingest' or 'pipeline run')",
                d.name
            );
        }
        let files = self
            .catalog
            .stored_chunks(d.id, split)?
            .into_iter()
            .map(|a| {
                let rows = a
                    .artifact
                    .rows
                    .with_context(|| format!("chunk {} has no row count", a.artifact.path))?;
                Ok((self.registered(&a)?, rows))
            })
            .collect::<Result<Vec<_>>>()?;
        let rows: u64 = files.iter().map(|f| f.1).sum();
        ensure!(
            files.len() as u64 == row.n_chunks && rows == row.n_rows,
            "dataset '{}': the catalog lists {} chunks with {rows} rows for split '{split}', \
             expected {} chunks with {} rows",
            d.name,
            files.len(),
            row.n_chunks,
            row.n_rows
        );
        Ok(files)
    }

    /// A registered artifact, to be read through its checks; refused when the catalog's
    /// path for it leaves its stage's folder (`store::owned::checked_rel`).
    pub fn registered(&self, a: &StoredArtifact) -> Result<Registered> {
        let owner = match (&a.dataset, a.stage) {
            (Some(name), StageKind::Ingest) => format!("dataset '{name}', ingest run {}", a.run_id),
            _ => format!("{} run {}", a.stage, a.run_id),
        };
        let rel = checked_rel(&a.artifact.path, a.stage)
            .with_context(|| format!("{} of {owner}", a.artifact.kind.as_str()))?;
        Ok(Registered {
            kind: a.artifact.kind.as_str(),
            path: self.resolve(rel),
            rel: rel.to_string(),
            owner,
            bytes: a.artifact.bytes,
            checksum: a.artifact.checksum.clone(),
            artifact_id: Some(a.id),
            verified_at: a.verified_at.clone(),
        })
    }

    /// A registered checkpoint, to be read through its checks; refused as
    /// [`Workspace::registered`] is.
    pub fn checkpoint_file(&self, c: &CheckpointRow) -> Result<Registered> {
        let owner = format!("train run {}, step {}", c.run_id, c.step);
        let rel = checked_rel(&c.path, StageKind::Train)
            .with_context(|| format!("checkpoint of {owner}"))?;
        Ok(Registered {
            kind: "checkpoint",
            owner,
            rel: rel.to_string(),
            path: self.resolve(rel),
            bytes: c.bytes,
            checksum: c.checksum.clone(),
            artifact_id: None,
            verified_at: None,
        })
    }

    /// The artifact of `kind` that run `run_id` registered (the first if several).
    pub fn run_file(&self, run_id: i64, kind: ArtifactKind) -> Result<Option<Registered>> {
        self.catalog
            .stored_artifacts(Some(run_id))?
            .iter()
            .find(|a| a.artifact.kind == kind)
            .map(|a| self.registered(a))
            .transpose()
    }

    /// The registered artifact at `path` (absolute, or relative to the current directory),
    /// if the file lies in the workspace and the catalog lists it.
    pub fn registered_at(&self, path: &Path) -> Result<Option<Registered>> {
        let (Ok(path), Ok(root)) = (std::path::absolute(path), std::path::absolute(&self.root))
        else {
            return Ok(None);
        };
        let Some(rel) = path.strip_prefix(&root).ok().and_then(Path::to_str) else {
            return Ok(None);
        };
        self.catalog
            .stored_artifact_at(rel)?
            .map(|a| self.registered(&a))
            .transpose()
    }

    /// A memory map of a matrix too large to hash on every open (K_XX̃, possibly GBs): hashed
    /// in full on its first use after registration, which the catalog records; later opens
    /// check its size only. `pipeline verify` hashes it every time.
    pub fn map_large(&self, file: &Registered) -> Result<NpyMap> {
        match (file.artifact_id, &file.verified_at) {
            (Some(id), None) => {
                let map = NpyMap::open_registered(file)?;
                self.catalog.mark_verified(id)?;
                // The row changed: so does the copy its run's directory carries.
                if let (Some(a), Some(dir)) = (
                    self.catalog.stored_artifact_at(&file.rel)?,
                    identity::run_dir(&file.rel),
                ) {
                    self.record_rows(&self.resolve(&dir), a.run_id);
                }
                Ok(map)
            }
            _ => NpyMap::open_registered_size_checked(file),
        }
    }

    /// Marks runs whose process died as 'interrupted' and removes what dead runs left: their
    /// scratch directories, and the published directories `dirs` that no catalog row
    /// references and that the catalog vouches are a dead run's ([`Workspace::why_kept`]).
    ///
    /// Another process may be starting a run meanwhile: the directories were listed before
    /// the live runs are asked for, and a run's row is written before its directories, so
    /// every directory listed belongs to a run the catalog already shows as running.
    fn collect_garbage(&self, dirs: &[PublishedDir]) -> Result<()> {
        for run in self.catalog.running_runs()? {
            if !run_is_live(run.pid, &run.pid_start) {
                self.catalog
                    .end_run(run.id, RunStatus::Interrupted, Some(DEAD_RUN))?;
            }
        }
        let scratch = list_dir(&self.root.join(SCRATCH_DIR))?;
        let mut aside = LostFound::new();
        let live: Vec<i64> = self
            .catalog
            .running_runs()?
            .into_iter()
            .filter(|run| run_is_live(run.pid, &run.pid_start))
            .map(|run| run.id)
            .collect();
        let last_run = self.catalog.last_run_id()?;
        for name in scratch {
            // `run-<id>`, or `run-<id>.rank<r>` (an MPI rank's private scratch of run id).
            let owner = name
                .strip_prefix("run-")
                .and_then(|s| s.split('.').next())
                .and_then(|s| s.parse::<i64>().ok());
            if owner.is_some_and(|id| id <= last_run && !live.contains(&id)) {
                self.collect(&format!("{SCRATCH_DIR}/{name}"), &mut aside)?;
            }
        }
        let referenced = self.catalog.referenced_paths()?;
        for dir in dirs {
            let is_referenced = referenced
                .iter()
                .any(|p| p == &dir.rel || p.starts_with(&format!("{}/", dir.rel)));
            if !is_referenced && self.why_kept(dir, |r| live.contains(&r), false)?.is_none() {
                self.collect(&dir.rel, &mut aside)?;
            }
        }
        Ok(())
    }

    /// Removes what a dead run left at `rel` by the workspace's rule (`store::owned`),
    /// saying what it moved aside or kept instead.
    fn collect(&self, rel: &str, aside: &mut LostFound) -> Result<()> {
        if let Some(note) = self.dispose(rel, aside)?.note(rel) {
            crate::progress::warning(note.to_string());
        }
        Ok(())
    }

    /// Why the unreferenced published directory `dir` must stay (None: it is what a dead
    /// run left, and may go): it may go only when its name carries a run id, its marker is
    /// this workspace's and names that run, the run is not `live`, and the catalog knows it
    /// as ended without success. A directory without a marker proves nothing: it may go
    /// only with `unmarked_may_go` (`verify --repair`, which a person asks for), never when
    /// a workspace is opened.
    pub fn why_kept(
        &self,
        dir: &PublishedDir,
        live: impl Fn(i64) -> bool,
        unmarked_may_go: bool,
    ) -> Result<Option<String>> {
        let Some(run) = dir.run else {
            return Ok(Some("no run of this catalog wrote it".into()));
        };
        match &dir.marker {
            Some(m) if !self.owns_marker(m) || m.run != run => {
                return Ok(Some(format!(
                    "its marker names run {} of workspace {}, not this workspace's run {run}",
                    m.run, m.workspace
                )))
            }
            None if !unmarked_may_go => return Ok(Some("it has no marker".into())),
            _ => {}
        }
        Ok(match self.catalog.run(run)?.map(as_seen) {
            _ if live(run) => Some(format!("run {run} is running")),
            None => Some(format!("the catalog has no run {run}")),
            Some(r) if r.status == RunStatus::Ok => Some(format!(
                "run {run} finished and its rows name other files; the directory may hold its \
                 outputs"
            )),
            Some(_) => None,
        })
    }

    /// Takes the lock of `kind` with `params` for this process, or refuses, naming the run
    /// that holds it, its pid and what to do. Held until the [`StageLock`] is dropped (or
    /// the process ends). `subject` names what the run writes when `params` do not (an
    /// ingest's dataset name; empty for the other stages), so the same inputs ingested
    /// under two names at once do not exclude each other.
    pub fn lock_stage(
        &self,
        kind: StageKind,
        subject: &str,
        params: &serde_json::Value,
    ) -> Result<StageLock> {
        let key = format!("{subject}\n{params}");
        let hash = xxhash_rust::xxh3::xxh3_64(key.as_bytes());
        let path = self
            .root
            .join(LOCK_DIR)
            .join(format!("{kind}-{hash:016x}.lock"));
        let lock = match StageLock::try_take(&path)? {
            Some(lock) => lock,
            None => return Err(self.lock_refusal(kind, &path)),
        };
        // The lock file may have been deleted under a running holder (by hand, or by a
        // cleaner of stale files): the catalog still shows its run, so ask it too. An
        // ingest's parameters do not name its dataset, so its runs are told apart by the
        // lock alone.
        if subject.is_empty() {
            if let Some(run) = self.live_run_with(kind, params)? {
                return Err(anyhow::Error::new(Contended(format!(
                    "another process (pid {pid}) is running {kind} run {id} with these \
                     parameters in {root} (started {started}), although its lock file {lock} \
                     is gone (deleted while it ran?); wait for it to finish and run this \
                     again, or stop it (kill {pid})",
                    pid = run.pid,
                    id = run.id,
                    root = self.root.display(),
                    started = run.started_at,
                    lock = path.display()
                ))));
            }
        }
        Ok(lock)
    }

    /// A run of `kind` with `params` that the catalog shows running under a live process.
    fn live_run_with(&self, kind: StageKind, params: &serde_json::Value) -> Result<Option<RunRow>> {
        Ok(self
            .catalog
            .running_runs()?
            .into_iter()
            .find(|r| r.stage == kind && &r.params == params && run_is_live(r.pid, &r.pid_start)))
    }

    /// The refusal when another process holds the lock of `kind` at `path`.
    fn lock_refusal(&self, kind: StageKind, path: &Path) -> anyhow::Error {
        let holder: Option<i64> = fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse().ok());
        let run = holder.and_then(|pid| {
            let runs = self.catalog.running_runs().ok()?;
            runs.into_iter()
                .rev()
                .find(|r| r.stage == kind && r.pid == pid)
        });
        let pid = holder.map_or("unknown".to_string(), |p| p.to_string());
        let who = match &run {
            Some(r) => format!(
                "another process (pid {pid}) is running {kind} run {} with these parameters \
                 in {} (started {})",
                r.id,
                self.root.display(),
                r.started_at
            ),
            None => format!(
                "another process (pid {pid}) is starting {kind} with these parameters in {}",
                self.root.display()
            ),
        };
        anyhow::Error::new(Contended(format!(
            "{who}; wait for it to finish and run this again (its outputs are then reused), \
             or stop it (kill {pid}): a run whose process is gone counts as interrupted and \
             the next run takes it up (lock file {})",
            path.display()
        )))
    }
}

/// The names in directory `dir`.
fn list_dir(dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        names.push(entry?.file_name().to_string_lossy().into_owned());
    }
    Ok(names)
}

/// The exclusive lock of one stage with one set of parameters ([`Workspace::lock_stage`]):
/// an advisory `flock` on a file in `locks/` that holds the owner's pid. Dropping it
/// removes the file, while still holding the lock, then releases it.
#[derive(Debug)]
pub struct StageLock {
    /// The open file the flock is on; closing it releases the lock.
    _file: fs::File,
    path: PathBuf,
}

impl StageLock {
    /// The lock at `path`, or None when another process holds it.
    ///
    /// A holder removes the file before it lets go, so a process that opened the file
    /// just before may get a lock on a file no longer in the directory, while a third
    /// process creates and locks a new one: the lock only counts if `path` still names
    /// the locked file, else this tries again.
    fn try_take(path: &Path) -> Result<Option<StageLock>> {
        let context = || format!("taking the stage lock {}", path.display());
        loop {
            let mut file = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
                .with_context(context)?;
            // SAFETY: flock(2) on a descriptor `file` owns; no memory is passed.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if rc != 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                    return Ok(None);
                }
                return Err(e).with_context(context);
            }
            let locked = file.metadata().with_context(context)?;
            let same = fs::metadata(path)
                .is_ok_and(|now| now.dev() == locked.dev() && now.ino() == locked.ino());
            if !same {
                continue;
            }
            file.set_len(0).with_context(context)?;
            file.rewind().with_context(context)?;
            writeln!(file, "{}", std::process::id()).with_context(context)?;
            return Ok(Some(StageLock {
                _file: file,
                path: path.to_path_buf(),
            }));
        }
    }
}

impl Drop for StageLock {
    fn drop(&mut self) {
        // Removed while held; the lock itself goes with the descriptor, closed after this.
        let _ = fs::remove_file(&self.path);
    }
}

/// What the workspace removes, and the paths it keeps for itself (`store::owned`).
impl Workspace {
    /// Removes the workspace-relative `rel` (a file, or a directory tree) by the
    /// workspace's one rule (`store::owned`): what fsgp wrote is removed, what it did not
    /// is moved to `lost+found`, and nothing is touched through a link or outside.
    pub fn dispose(&self, rel: &str, aside: &mut LostFound) -> Result<Disposal> {
        Disposer {
            root: &self.root,
            owns: &|marker| self.owns_marker(marker),
            stamp: &|| self.catalog.utc_stamp(),
        }
        .dispose(rel, aside)
    }

    /// Creates the scratch directory `tmp/run-<id>` (or an MPI rank's `run-<id>.rank<r>`)
    /// of run `run`, marked as its own so that it may be removed later. What is there
    /// already is disposed of first: a dead attempt's scratch of this run is removed, a
    /// folder fsgp did not make there is moved aside and named.
    pub fn create_scratch(&self, name: &str, run: i64, stage: StageKind) -> Result<PathBuf> {
        let rel = format!("{SCRATCH_DIR}/{name}");
        let mut aside = LostFound::new();
        if let Some(note) = self.dispose(&rel, &mut aside)?.note(&rel) {
            crate::progress::warning(note.to_string());
        }
        let dir = self.root.join(&rel);
        fs::create_dir_all(&dir)
            .with_context(|| format!("creating scratch directory {}", dir.display()))?;
        identity::write_marker(
            &dir,
            &RunMarker {
                workspace: self.workspace_id().to_string(),
                run,
                stage: stage.as_str().into(),
                generation: 0,
                rows: None,
            },
        )?;
        Ok(dir)
    }

    /// Refuses a path the user named for an output (`export --out`, `predict --output`,
    /// `fit --spec-out`/`--model-out`) that lies in what the workspace keeps for itself:
    /// its catalog and identity files, a stage's folder, the scratch space, the locks or
    /// `lost+found`. `--force` could otherwise replace a registered checkpoint or chunk
    /// behind the catalog's back. Elsewhere in the workspace is the user's to choose.
    pub fn refuse_output_inside(&self, option: &str, path: &Path) -> Result<()> {
        let (Ok(target), Ok(root)) = (resolved(path), resolved(&self.root)) else {
            return Ok(());
        };
        let Ok(rel) = target.strip_prefix(&root) else {
            return Ok(());
        };
        let top = rel
            .components()
            .next()
            .map(|c| c.as_os_str().to_string_lossy());
        let kept = |name: &str| {
            name.starts_with(CATALOG_FILE)
                || name == identity::IDENTITY_FILE
                || [SCRATCH_DIR, LOST_FOUND, LOCK_DIR].contains(&name)
                || StageKind::ALL.iter().any(|k| k.output_dir() == name)
        };
        match top {
            None => bail!(
                "{option} {}: is the workspace {} itself, expected a file (nothing was written)",
                path.display(),
                self.root.display()
            ),
            Some(name) if kept(&name) => bail!(
                "{option} {}: lies in the workspace's own '{name}' (the catalog, run outputs, \
                 scratch and locks are fsgp's to write); name a file outside them (nothing \
                 was written)",
                path.display()
            ),
            Some(_) => Ok(()),
        }
    }
}

/// Looking up what a person named on the command line or in a spec: a name not found is
/// answered with the closest one there is and a pointer to `pipeline status`.
impl Workspace {
    /// The dataset named `name` (as named at ingest).
    pub fn dataset_named(&self, name: &str) -> Result<DatasetRow> {
        if let Some(d) = self.catalog.dataset(name)? {
            return Ok(d);
        }
        let datasets = self.catalog.datasets()?;
        if datasets.is_empty() {
            bail!(
                "no dataset '{name}' in {}: it holds none yet; run `pipeline ingest` first",
                self.root.display()
            );
        }
        let names = datasets.iter().map(|d| d.name.as_str());
        bail!(
            "no dataset '{name}' in {} ({}datasets: {}; see 'pipeline status')",
            self.root.display(),
            did_you_mean(name, names.clone()),
            names.collect::<Vec<_>>().join(", ")
        )
    }

    /// Stage run `id`, of any stage; when there is none, the error suggests the runs of
    /// `stage` (the kind the caller wants).
    pub fn run_numbered(&self, id: i64, stage: StageKind) -> Result<RunRow> {
        if let Some(run) = self.catalog.run(id)? {
            return Ok(run);
        }
        /// Runs listed in the hint, the newest ones.
        const LISTED: usize = 12;
        let mut ids: Vec<String> = self
            .catalog
            .runs(usize::MAX >> 1)?
            .into_iter()
            .filter(|r| r.stage == stage)
            .map(|r| r.id.to_string())
            .collect();
        if ids.is_empty() {
            bail!(
                "no run {id} in {}: it holds no {stage} runs yet (see 'pipeline status')",
                self.root.display()
            );
        }
        let wanted = id.to_string();
        let hint = did_you_mean(&wanted, ids.iter().map(String::as_str));
        let more = if ids.len() > LISTED { "…, " } else { "" };
        ids.truncate(LISTED);
        ids.reverse();
        bail!(
            "no run {id} in {} ({hint}{stage} runs: {more}{}; see 'pipeline status')",
            self.root.display(),
            ids.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_stage_lock_excludes_the_same_computation_only_and_goes_with_its_holder() {
        let dir = tempfile::tempdir().unwrap();
        // Two opens stand for two processes: flock locks of two open files conflict.
        let (first, second) = (
            Workspace::open(dir.path()).unwrap(),
            Workspace::open(dir.path()).unwrap(),
        );
        let params = json!({"rank": 8});
        let held = first.lock_stage(StageKind::Svd, "", &params).unwrap();
        let lock_file = held.path.clone();
        assert_eq!(
            fs::read_to_string(&lock_file).unwrap().trim(),
            std::process::id().to_string()
        );
        let refusal = second
            .lock_stage(StageKind::Svd, "", &params)
            .unwrap_err()
            .to_string();
        assert!(
            refusal.contains(&format!(
                "another process (pid {}) is starting svd with these parameters",
                std::process::id()
            )) && refusal.contains("kill "),
            "{refusal}"
        );
        // Other parameters, another stage, another ingest subject: no conflict.
        let others = [
            second.lock_stage(StageKind::Svd, "", &json!({"rank": 9})),
            second.lock_stage(StageKind::Predict, "", &params),
            second.lock_stage(StageKind::Svd, "toy", &params),
        ];
        assert!(others.iter().all(Result::is_ok));
        drop(held);
        assert!(!lock_file.exists(), "the holder removes its lock file");
        assert!(second.lock_stage(StageKind::Svd, "", &params).is_ok());
    }
}
