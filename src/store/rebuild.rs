//! `pipeline verify --rebuild-catalog`: a new catalog from the rows every run directory's
//! marker carries (`store::identity::RunMarker::rows`), for a workspace whose catalog is
//! lost (missing or empty), or set aside because it was another workspace's or older than
//! the files.
//!
//! Runs are restored in the order of their ids, each in one transaction, with their own
//! ids, so every run that names another (a training run's svd run, a predict run's
//! checkpoint) names it still. What cannot be restored is listed with the reason and left
//! on disk: a directory without rows (written before markers carried them, or by a run
//! that died before its first commit), a run whose rows conflict with one restored before
//! it (a dataset name taken), a run whose parent rows are missing. Runs that left no
//! directory (failed or interrupted before publishing anything) leave no trace to restore;
//! the next `pipeline run` recomputes what they would have made.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use super::catalog::{Catalog, RunRows, StageKind};
use super::identity::{self, PublishedDir};
use super::owned::checked_rel;
use super::workspace::CATALOG_FILE;

/// What a rebuild restored and what it could not.
#[derive(Debug, Default, Serialize)]
pub struct RebuildReport {
    /// Runs restored: (run id, the directory its rows came from).
    pub restored: Vec<(i64, String)>,
    /// Directories not restored, each with why.
    pub not_restored: Vec<String>,
}

/// Builds a new catalog for the workspace at `root` from its run directories. Refused when
/// a catalog is there (it is never overwritten: move it away first), when there is nothing
/// to rebuild from, or when the directories disagree on the workspace they belong to.
pub fn rebuild_catalog(root: &Path) -> Result<RebuildReport> {
    let path = root.join(CATALOG_FILE);
    if std::fs::metadata(&path).is_ok_and(|m| m.len() > 0) {
        bail!(
            "{} exists: --rebuild-catalog never overwrites a catalog; move it (and any \
             catalog.sqlite-wal and -shm beside it) out of the workspace first, then run this \
             again",
            path.display()
        );
    }
    let dirs = identity::published_dirs(root)?;
    let workspace = workspace_id(root, &dirs)?;
    let mut report = RebuildReport::default();
    let mut by_run: BTreeMap<i64, (&PublishedDir, &RunRows)> = BTreeMap::new();
    for dir in &dirs {
        match dir.marker.as_ref() {
            Some(m) if m.workspace != workspace => report.not_restored.push(format!(
                "{}: its marker names workspace {}, not this one ({workspace})",
                dir.rel, m.workspace
            )),
            Some(m) => match &m.rows {
                Some(rows) => match foreign_path(rows, &dir.rel) {
                    None => {
                        by_run.insert(m.run, (dir, rows));
                    }
                    Some(why) => report
                        .not_restored
                        .push(format!("{}: its marker is refused: {why}", dir.rel)),
                },
                None => report.not_restored.push(format!(
                    "{}: its marker carries no rows (the run had not committed)",
                    dir.rel
                )),
            },
            None => report.not_restored.push(format!(
                "{}: no marker (written by an fsgp before markers, or not a run's directory)",
                dir.rel
            )),
        }
    }
    if by_run.is_empty() {
        bail!(
            "nothing to rebuild {} from: no run directory of the workspace carries its rows{}",
            path.display(),
            if report.not_restored.is_empty() {
                String::new()
            } else {
                format!(" ({})", report.not_restored.join("; "))
            }
        );
    }
    // A 0-byte file would be opened as an empty database; it goes first.
    let _ = std::fs::remove_file(&path);
    let catalog = Catalog::open(&path)?;
    catalog.claim_identity(&workspace)?;
    let generation = dirs
        .iter()
        .filter_map(|d| d.marker.as_ref().map(|m| m.generation))
        .max()
        .unwrap_or(0);
    catalog.set_generation(generation)?;
    for (run, (dir, rows)) in by_run {
        match catalog.restore_run_rows(rows) {
            Ok(()) => report.restored.push((run, dir.rel.clone())),
            Err(e) => report
                .not_restored
                .push(format!("{}: run {run} not restored: {e:#}", dir.rel)),
        }
    }
    Ok(report)
}

/// The workspace's id: that of `workspace.json`, else the one every marker names.
fn workspace_id(root: &Path, dirs: &[PublishedDir]) -> Result<String> {
    if let Some(id) = identity::read_identity_file(root)? {
        return Ok(id);
    }
    let mut ids: Vec<&str> = dirs
        .iter()
        .filter_map(|d| d.marker.as_ref().map(|m| m.workspace.as_str()))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    match ids.as_slice() {
        [one] => Ok(one.to_string()),
        [] => bail!(
            "{}: no {} and no run directory with a marker: nothing says which workspace this \
             is",
            root.display(),
            identity::IDENTITY_FILE
        ),
        many => Err(anyhow::anyhow!(
            "the run directories name {} workspaces ({}) and there is no {} to choose: move \
             the directories of the other workspaces out first",
            many.len(),
            many.join(", "),
            identity::IDENTITY_FILE
        ))
        .context(format!("rebuilding the catalog of {}", root.display())),
    }
}

/// Why the rows of a marker in run directory `dir` cannot be restored because of the paths
/// they name (None: every path is a file of `dir`, or `dir` itself): a marker edited by
/// hand or damaged must not make a catalog that points outside the run's directory, since
/// the workspace reads and removes what its catalog names.
fn foreign_path(rows: &RunRows, dir: &str) -> Option<String> {
    let stage = StageKind::ALL
        .iter()
        .copied()
        .find(|k| dir.split('/').next() == Some(k.output_dir()))?;
    let inside = format!("{dir}/");
    ["datasets", "artifacts", "checkpoints"]
        .iter()
        .flat_map(|table| rows.get(*table).into_iter().flatten())
        .filter_map(|row| {
            row.get("path")
                .map(|p| p.as_str().unwrap_or("").to_string())
        })
        .find_map(|path| match checked_rel(&path, stage) {
            Err(e) => Some(format!("{e:#}")),
            Ok(rel) if rel != dir && !rel.starts_with(&inside) => Some(format!(
                "found the path '{rel}', expected a path inside its own directory {dir}"
            )),
            Ok(_) => None,
        })
}
