//! The workspace directory: catalog, temporary space of running stages, published outputs.
//!
//! Layout:
//! ```text
//! WORKSPACE/
//!   catalog.sqlite           the catalog (+ -wal, -shm)
//!   tmp/run-<id>/            scratch of stage run <id>; never read by other stages
//!   datasets/<name>.run<id>/ an ingested dataset, published by renaming from tmp/
//!   svd/<name>-r<R>.run<id>/ basis, singular values, K_XX̃ and A init of one SVD run
//!   train/<name>-<kernel>.run<id>/ checkpoints of one training run
//!   predictions/<name>-<split>.run<id>/ top-k predictions of one predict run
//! ```
//! Training is the one stage that publishes while it runs: each checkpoint is renamed into
//! its run's directory and registered on its own, so an interrupted run can be resumed.
//! A stage writes only below its `tmp/run-<id>/`, renames the finished output into place
//! and then commits the catalog rows. Opening a workspace collects what dead runs left:
//! their scratch directories and any published directory that no catalog row references.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};

use crate::store::catalog::{Catalog, DatasetRow};

/// Top-level directories that hold published stage outputs.
const OUTPUT_DIRS: &[&str] = &["datasets", "svd", "train", "predictions", "evaluations"];

pub struct Workspace {
    root: PathBuf,
    pub catalog: Catalog,
}

/// Identity of this process for liveness checks: its pid and its start time in clock ticks
/// since boot (so a reused pid is not mistaken for the original process).
pub fn process_identity(pid: u32) -> Option<String> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 2 (comm) may contain spaces and parentheses; fields after the last ')' are plain.
    let rest = &stat[stat.rfind(')')? + 1..];
    // `rest` starts at field 3 (state); starttime is field 22.
    rest.split_whitespace().nth(19).map(str::to_string)
}

fn run_is_live(pid: i64, pid_start: &str) -> bool {
    u32::try_from(pid)
        .ok()
        .and_then(process_identity)
        .is_some_and(|s| s == pid_start)
}

impl Workspace {
    /// Opens the workspace at `root`, creating it if needed, and cleans up after dead runs.
    pub fn open(root: &Path) -> Result<Self> {
        fs::create_dir_all(root.join("tmp"))
            .with_context(|| format!("creating workspace {}", root.display()))?;
        for dir in OUTPUT_DIRS {
            fs::create_dir_all(root.join(dir))?;
        }
        let catalog = Catalog::open(&root.join("catalog.sqlite"))?;
        let ws = Workspace {
            root: root.to_path_buf(),
            catalog,
        };
        ws.collect_garbage()?;
        Ok(ws)
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
    pub fn split_chunks(&self, d: &DatasetRow, split: &str) -> Result<Vec<(PathBuf, u64)>> {
        let row = d.split(split).with_context(|| {
            format!(
                "dataset '{}' has no split '{split}' (it has: {})",
                d.name,
                d.splits
                    .iter()
                    .map(|s| s.split.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?;
        let files = self
            .catalog
            .artifacts(Some(d.id))?
            .into_iter()
            .filter(|a| a.kind == "chunk" && a.split.as_deref() == Some(split))
            .map(|a| {
                let rows = a
                    .rows
                    .with_context(|| format!("chunk {} has no row count", a.path))?;
                Ok((self.resolve(&a.path), rows))
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

    /// Marks runs whose process died as 'interrupted' and removes their scratch space and
    /// any published directory no catalog row references.
    fn collect_garbage(&self) -> Result<()> {
        let mut live = Vec::new();
        for run in self.catalog.running_runs()? {
            if run_is_live(run.pid, &run.pid_start) {
                live.push(run.id);
            } else {
                self.catalog.end_run(
                    run.id,
                    "interrupted",
                    Some("the process ended without finishing (killed or crashed)"),
                )?;
            }
        }
        for entry in fs::read_dir(self.root.join("tmp"))? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let owner = name
                .strip_prefix("run-")
                .and_then(|s| s.parse::<i64>().ok());
            if owner.is_some_and(|id| !live.contains(&id)) {
                remove_path(&entry.path())?;
            }
        }
        let referenced = self.catalog.referenced_paths()?;
        for dir in OUTPUT_DIRS {
            for entry in fs::read_dir(self.root.join(dir))? {
                let entry = entry?;
                let rel = format!("{dir}/{}", entry.file_name().to_string_lossy());
                let owner = rel
                    .rsplit_once(".run")
                    .and_then(|(_, id)| id.parse::<i64>().ok());
                let is_referenced = referenced
                    .iter()
                    .any(|p| p == &rel || p.starts_with(&format!("{rel}/")));
                if !is_referenced && owner.is_some_and(|id| !live.contains(&id)) {
                    remove_path(&entry.path())?;
                }
            }
        }
        Ok(())
    }

    /// Records the start of a stage run and creates its scratch directory.
    pub fn start_run(&self, stage: &str, params: &serde_json::Value) -> Result<StageRun<'_>> {
        let pid = std::process::id();
        let identity = process_identity(pid).unwrap_or_default();
        let id = self.catalog.begin_run(stage, params, pid, &identity)?;
        self.stage_run(id)
    }

    /// Takes over an interrupted or failed run (`pipeline train --resume`): it is marked
    /// running under this process and gets a fresh scratch directory.
    pub fn resume_run(&self, id: i64) -> Result<StageRun<'_>> {
        let pid = std::process::id();
        let identity = process_identity(pid).unwrap_or_default();
        self.catalog.reopen_run(id, pid, &identity)?;
        self.stage_run(id)
    }

    fn stage_run(&self, id: i64) -> Result<StageRun<'_>> {
        let tmp_dir = self.root.join("tmp").join(format!("run-{id}"));
        fs::create_dir_all(&tmp_dir)
            .with_context(|| format!("creating scratch directory {}", tmp_dir.display()))?;
        Ok(StageRun {
            ws: self,
            id,
            tmp_dir,
            ended: false,
        })
    }
}

fn remove_path(path: &Path) -> Result<()> {
    let result = if path.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    };
    match result {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", path.display()))
        }
        _ => Ok(()),
    }
}

/// A stage run in progress. Dropping it without [`StageRun::succeeded`] records it as failed
/// and deletes its scratch directory, so an error anywhere leaves nothing behind.
pub struct StageRun<'a> {
    ws: &'a Workspace,
    pub id: i64,
    tmp_dir: PathBuf,
    ended: bool,
}

impl StageRun<'_> {
    /// Scratch directory, private to this run.
    pub fn tmp_dir(&self) -> &Path {
        &self.tmp_dir
    }

    /// Name of a published output directory: `<dir>/<name>.run<id>` (workspace-relative).
    pub fn output_rel(&self, dir: &str, name: &str) -> String {
        format!("{dir}/{name}.run{}", self.id)
    }

    /// Renames `tmp_dir/<from>` to the workspace-relative `to` (same file system, atomic).
    pub fn publish(&self, from: &str, to: &str) -> Result<PathBuf> {
        let src = self.tmp_dir.join(from);
        let dst = self.ws.resolve(to);
        fs::rename(&src, &dst)
            .with_context(|| format!("publishing {} as {}", src.display(), dst.display()))?;
        Ok(dst)
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
        match self.publish(from, to).and_then(|_| commit()) {
            Ok(value) => {
                self.succeeded()?;
                Ok(value)
            }
            Err(e) => {
                let _ = remove_path(&self.ws.resolve(to));
                self.failed(&e);
                Err(e)
            }
        }
    }

    /// Call after the catalog rows naming the outputs were committed.
    pub fn succeeded(mut self) -> Result<()> {
        self.ended = true;
        remove_path(&self.tmp_dir)
    }

    /// Marks the run 'ok' for stages that registered their outputs as they went (training).
    pub fn finish_ok(self) -> Result<()> {
        self.ws.catalog.end_run(self.id, "ok", None)?;
        self.succeeded()
    }

    /// Records the failure with its message and removes the scratch space.
    pub fn failed(mut self, error: &anyhow::Error) {
        self.ended = true;
        self.record_failure(&format!("{error:#}"));
    }

    fn record_failure(&self, msg: &str) {
        // Best effort: the original error matters more than a cleanup failure.
        let _ = remove_path(&self.tmp_dir);
        let _ = self.ws.catalog.end_run(self.id, "failed", Some(msg));
    }
}

impl Drop for StageRun<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.record_failure("the stage ended without finishing");
        }
    }
}
