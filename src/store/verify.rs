//! `pipeline verify [--repair]`: a workspace's fsck, in the manner of `git fsck` and a ZFS
//! scrub: every stored checksum is checked and damage is reported by name.
//!
//! Checks, in order: the catalog passes SQLite's `PRAGMA integrity_check` ([`check_catalog`],
//! before anything trusts it); every registered artifact and checkpoint exists with its
//! size and checksum (each file hashed in full, K_XX̃ included); every finished run's inputs
//! are present (an svd or training run's dataset, a training run's svd run, a predict run's
//! checkpoint); no file under the stages' output directories lacks a catalog row.
//!
//! `--repair` makes the catalog stop trusting what is damaged, so the next `pipeline run`
//! recomputes exactly that: a run with a damaged output is marked failed (and repaired) and
//! the rows vouching for its files are removed with the files — all of them for ingest, svd,
//! predict and evaluate runs (recomputed whole, under the same run id, by `stage::execute`),
//! the damaged checkpoint and those after it for a training run (resumed from the one
//! before). Orphan files are removed. A damaged catalog cannot be repaired here.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;
use std::time::Instant;

use anyhow::Result;
use serde::Serialize;
use serde_json::Value;

use super::catalog::{Catalog, RunRow, RunStatus, StageKind};
use super::identity::{published_dir, run_dir, RUN_MARKER};
use super::integrity::Registered;
use super::owned::{checked_rel, is_own_name, Disposal, LostFound};
use super::workspace::{run_is_live, Workspace};

/// What `pipeline verify` does besides checking.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VerifyOptions {
    /// Mark damaged runs failed, drop their rows and files, remove orphans.
    pub repair: bool,
}

/// One thing found wrong.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Problem {
    /// What is wrong: a file (`chunk (dataset 'toy', ingest run 1, PATH)`), a run
    /// (`train run 3`), an orphan file, the catalog.
    pub subject: String,
    /// The run it concerns, if any.
    pub run: Option<i64>,
    /// Workspace-relative path, if a file.
    pub path: Option<String>,
    pub problem: String,
}

impl Problem {
    /// Whether this is a problem of the catalog itself (damaged, or unable to vouch for the
    /// files), which `--repair` cannot mend.
    pub fn concerns_catalog(&self) -> bool {
        self.run.is_none() && self.path.is_none() && self.subject.starts_with("catalog (")
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.subject, self.problem)
    }
}

/// What `pipeline verify` checked, found and did.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct VerifyReport {
    /// Registered artifacts hashed.
    pub artifacts: usize,
    /// Registered checkpoints hashed.
    pub checkpoints: usize,
    pub bytes_hashed: u64,
    pub seconds: f64,
    pub problems: Vec<Problem>,
    /// What `--repair` did, one line per action.
    pub repaired: Vec<String>,
}

/// SQLite's `PRAGMA integrity_check` of the catalog at `path` (before the workspace is
/// opened, since opening it trusts the catalog to collect garbage).
pub fn check_catalog(path: &Path, writable_dir: bool) -> Vec<Problem> {
    let findings = Catalog::integrity_check(path, writable_dir);
    if findings.is_empty() {
        return Vec::new();
    }
    let shown: Vec<&str> = findings.iter().take(5).map(String::as_str).collect();
    vec![Problem {
        subject: format!("catalog ({})", path.display()),
        run: None,
        path: None,
        problem: format!(
            "SQLite's integrity_check failed: {}{}; the catalog is damaged and --repair cannot \
             rebuild it: restore catalog.sqlite from a backup, or start a new workspace and \
             run the spec again",
            shown.join("; "),
            if findings.len() > shown.len() {
                format!(" (and {} more)", findings.len() - shown.len())
            } else {
                String::new()
            }
        ),
    }]
}

/// A run with damaged outputs, to be repaired.
#[derive(Debug, Default)]
struct DamagedRun {
    /// The first damaged checkpoint of a training run (None: artifacts are damaged).
    first_step: Option<u64>,
    /// Workspace-relative paths of the files that are damaged or will be dropped.
    reasons: Vec<String>,
}

/// Checks the workspace (and repairs it with `opts.repair`).
pub fn run(ws: &Workspace, opts: VerifyOptions) -> Result<VerifyReport> {
    let started = Instant::now();
    let mut report = VerifyReport::default();
    let runs = ws.catalog.all_runs()?;
    let live: BTreeSet<i64> = runs
        .iter()
        .filter(|r| r.status == RunStatus::Running && run_is_live(r.pid, &r.pid_start))
        .map(|r| r.id)
        .collect();
    let damaged = hash_registered(ws, &mut report)?;
    for r in &runs {
        if r.status == RunStatus::Ok && !damaged.contains_key(&r.id) {
            report.problems.extend(missing_inputs(ws, r, &damaged)?);
        }
    }
    let orphans = orphans(ws, &live)?;
    report.problems.extend(orphans.iter().map(|rel| Problem {
        subject: format!("orphan {rel}"),
        run: None,
        path: Some(rel.clone()),
        problem: "no catalog row references it".into(),
    }));
    if opts.repair {
        repair(ws, &damaged, &orphans, &live, &mut report)?;
    }
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// Hashes every registered artifact and checkpoint; reports each damaged one and returns
/// the runs they belong to. A row whose path leaves its stage's folder is damage too (of
/// the catalog's): reported, its run repaired, and the path never opened.
fn hash_registered(ws: &Workspace, report: &mut VerifyReport) -> Result<BTreeMap<i64, DamagedRun>> {
    let mut damaged: BTreeMap<i64, DamagedRun> = BTreeMap::new();
    let mut found = |report: &mut VerifyReport,
                     problem: Problem,
                     reason: String,
                     run: i64,
                     step: Option<u64>| {
        report.problems.push(problem);
        let entry = damaged.entry(run).or_default();
        entry.reasons.push(reason);
        if let Some(step) = step {
            entry.first_step = Some(entry.first_step.map_or(step, |s| s.min(step)));
        }
    };
    let mut files: Vec<(Result<Registered>, i64, Option<u64>)> = Vec::new();
    for a in ws.catalog.stored_artifacts(None)? {
        files.push((ws.registered(&a), a.run_id, None));
        report.artifacts += 1;
    }
    for c in &ws.catalog.all_checkpoints()? {
        files.push((ws.checkpoint_file(c), c.run_id, Some(c.step)));
        report.checkpoints += 1;
    }
    for (file, run, step) in files {
        let file = match file {
            Ok(file) => file,
            Err(e) => {
                let problem = Problem {
                    subject: format!("catalog row of run {run}"),
                    run: Some(run),
                    path: None,
                    problem: format!("{e:#}"),
                };
                found(report, problem, format!("{e:#}"), run, step);
                continue;
            }
        };
        let inspection = file.inspect()?;
        report.bytes_hashed += inspection.hashed;
        if let Some(damage) = inspection.damage {
            let problem = Problem {
                subject: file.name(),
                run: Some(run),
                path: Some(file.rel.clone()),
                problem: damage.to_string(),
            };
            found(report, problem, format!("{} {damage}", file.rel), run, step);
        }
    }
    Ok(damaged)
}

/// `--repair`: every damaged run not running now, then the orphans.
fn repair(
    ws: &Workspace,
    damaged: &BTreeMap<i64, DamagedRun>,
    orphans: &[String],
    live: &BTreeSet<i64>,
    report: &mut VerifyReport,
) -> Result<()> {
    for (&id, d) in damaged {
        if live.contains(&id) {
            report
                .repaired
                .push(format!("run {id} is running: not repaired (stop it first)"));
            continue;
        }
        report.repaired.push(repair_run(ws, id, d)?);
    }
    let mut aside = LostFound::new();
    for rel in orphans {
        let line = match why_kept(ws, rel, live)? {
            None => match ws.dispose(rel, &mut aside)? {
                Disposal::Absent | Disposal::Removed => format!("removed orphan {rel}"),
                Disposal::MovedAside(moved) => format!(
                    "moved orphan {rel} to {} (fsgp did not write it; look it over, then \
                     keep or delete it)",
                    moved.join(", ")
                ),
                Disposal::Kept(why) => format!("left orphan {rel} in place: {why}"),
            },
            Some(why) => {
                format!("left orphan {rel} in place: {why}; move it out or delete it yourself")
            }
        };
        report.repaired.push(line);
    }
    Ok(())
}

/// Why `--repair` must not delete the orphan `rel` (None: it may). An orphan inside a run
/// directory is the catalog's to judge: the directory is the run's, and the catalog
/// vouches for the workspace (it was checked when the workspace was opened). An orphan at
/// the top of a stage's directory follows the rule of garbage collection
/// ([`Workspace::why_kept`]), which here lets an unmarked run directory go too.
fn why_kept(ws: &Workspace, rel: &str, live: &BTreeSet<i64>) -> Result<Option<String>> {
    if rel.split('/').count() > 2 {
        return Ok(None);
    }
    let dir = published_dir(ws.root(), rel)?;
    ws.why_kept(&dir, |r| live.contains(&r), true)
}

/// Marks run `id` damaged in the catalog, then removes the files it no longer vouches for.
fn repair_run(ws: &Workspace, id: i64, d: &DamagedRun) -> Result<String> {
    let reason = format!(
        "damaged outputs found by 'pipeline verify --repair': {}",
        d.reasons.join("; ")
    );
    match d.first_step {
        Some(step) => {
            let dropped: Vec<String> = ws
                .catalog
                .checkpoints(id)?
                .into_iter()
                .filter(|c| c.step >= step)
                .map(|c| c.path)
                .collect();
            ws.catalog.mark_damaged(id, &reason, Some(step))?;
            let mut kept = Vec::new();
            for rel in &dropped {
                if let Some(note) = ws.dispose(rel, &mut LostFound::new())?.note(rel) {
                    kept.push(note);
                }
            }
            // The run's directory stays, and carries its rows as they are now.
            if let Some(dir) = dropped.first().and_then(|rel| run_dir(rel)) {
                ws.record_rows(&ws.resolve(&dir), id);
            }
            Ok(format!(
                "train run {id}: marked failed; dropped its checkpoints from step {step} on \
                 ({} files); the next run resumes it from the one before{}",
                dropped.len(),
                kept.iter().map(|k| format!("; {k}")).collect::<String>()
            ))
        }
        None => {
            // Only paths under the run's own stage folder: a row naming anything else is
            // dropped with the run's rows, and the path it names is left alone.
            let dirs: BTreeSet<String> = ws
                .catalog
                .stored_artifacts(Some(id))?
                .iter()
                .filter_map(|a| {
                    checked_rel(&a.artifact.path, a.stage)
                        .ok()
                        .and_then(run_dir)
                })
                .collect();
            let stage = ws.catalog.run(id)?.map_or(StageKind::Ingest, |r| r.stage);
            ws.catalog.mark_damaged(id, &reason, None)?;
            let mut aside = LostFound::new();
            let mut notes = Vec::new();
            for dir in &dirs {
                if let Some(note) = ws.dispose(dir, &mut aside)?.note(dir) {
                    notes.push(note);
                }
            }
            Ok(format!(
                "{stage} run {id}: marked failed; removed {} and its rows; the next run \
                 recomputes it{}",
                if dirs.is_empty() {
                    "no files".to_string()
                } else {
                    dirs.iter().cloned().collect::<Vec<_>>().join(", ")
                },
                notes.iter().map(|n| format!("; {n}")).collect::<String>()
            ))
        }
    }
}

/// What a finished run read that is no longer there (or is itself damaged).
fn missing_inputs(
    ws: &Workspace,
    r: &RunRow,
    damaged: &BTreeMap<i64, DamagedRun>,
) -> Result<Vec<Problem>> {
    let mut missing = Vec::new();
    let p = &r.params;
    let int = |key: &str| p.get(key).and_then(Value::as_i64);
    if matches!(
        r.stage,
        StageKind::Svd | StageKind::Train | StageKind::Evaluate
    ) {
        if let Some(name) = p.get("dataset").and_then(Value::as_str) {
            match ws.catalog.dataset(name)? {
                None => missing.push(format!("input dataset '{name}' is not in the catalog")),
                Some(d) => {
                    if let Some(why) = run_state(ws, d.stage_run_id, damaged)? {
                        missing.push(format!("input dataset '{name}' {why}"));
                    }
                }
            }
        }
    }
    if let (StageKind::Train, Some(svd)) = (r.stage, int("svd_run")) {
        if let Some(why) = run_state(ws, svd, damaged)? {
            missing.push(format!("input svd run {svd} {why}"));
        }
    }
    if let (StageKind::Predict, Some(train)) = (r.stage, int("train_run")) {
        let step = p.get("checkpoint_step").and_then(Value::as_u64);
        let checksum = p.get("checkpoint_checksum").and_then(Value::as_str);
        let found = ws
            .catalog
            .checkpoints(train)?
            .into_iter()
            .any(|c| Some(c.step) == step && Some(c.checksum.as_str()) == checksum);
        if !found {
            missing.push(format!(
                "input checkpoint of train run {train} at step {} is not registered{}",
                step.map_or("?".into(), |s| s.to_string()),
                if damaged.contains_key(&train) {
                    " (damaged)"
                } else {
                    ""
                }
            ));
        }
    }
    Ok(missing
        .into_iter()
        .map(|problem| Problem {
            subject: format!("{} run {}", r.stage, r.id),
            run: Some(r.id),
            path: None,
            problem,
        })
        .collect())
}

/// Why an input run cannot be read (None: it can).
fn run_state(
    ws: &Workspace,
    id: i64,
    damaged: &BTreeMap<i64, DamagedRun>,
) -> Result<Option<String>> {
    if damaged.contains_key(&id) {
        return Ok(Some("has damaged files".into()));
    }
    Ok(match ws.catalog.run(id)? {
        None => Some(format!("(run {id}) is not in the catalog")),
        Some(run) if run.status == RunStatus::Ok => None,
        Some(_) if ws.catalog.damaged_since(id)?.is_some() => Some(format!(
            "(run {id}) was damaged and awaits its recomputation ('pipeline run' or the \
             same stage command)"
        )),
        Some(run) => Some(format!("(run {id}) is {}", run.status)),
    })
}

/// Files and directories under the stages' output directories that no catalog row
/// references, workspace-relative (a directory wholly unreferenced is listed once). The
/// directories of running stages are skipped: their files are registered as they go.
fn orphans(ws: &Workspace, live: &BTreeSet<i64>) -> Result<Vec<String>> {
    let referenced: BTreeSet<String> = ws.catalog.referenced_paths()?.into_iter().collect();
    let mut found = Vec::new();
    for &kind in StageKind::ALL {
        walk(ws, kind.output_dir(), false, &referenced, live, &mut found)?;
    }
    Ok(found)
}

/// Lists the unreferenced entries below `rel` into `found`; returns whether anything below
/// `rel` is referenced.
///
/// A directory reached through a symbolic link (a run directory moved to another disk) is
/// read, not judged: the folder it points to may hold the user's other files, so only the
/// names fsgp makes there can be orphans.
fn walk(
    ws: &Workspace,
    rel: &str,
    linked: bool,
    referenced: &BTreeSet<String>,
    live: &BTreeSet<i64>,
    found: &mut Vec<String>,
) -> Result<bool> {
    let dir = ws.resolve(rel);
    let Ok(entries) = fs::read_dir(&dir) else {
        return Ok(false);
    };
    let mut any_referenced = false;
    let mut unreferenced = Vec::new();
    for entry in entries {
        let entry = entry?;
        let child = format!("{rel}/{}", entry.file_name().to_string_lossy());
        let owner = child
            .rsplit_once(".run")
            .and_then(|(_, id)| id.parse::<i64>().ok());
        if owner.is_some_and(|id| live.contains(&id)) {
            any_referenced = true;
            continue;
        }
        if entry.file_name() == RUN_MARKER {
            // The run directory's marker (`store::identity`): part of the directory, never
            // registered; it neither makes the directory referenced nor is an orphan.
            continue;
        }
        // Through symbolic links: a run directory moved to another disk and linked back is
        // the run's directory, whose files are registered inside it.
        let is_dir = fs::metadata(entry.path()).is_ok_and(|m| m.is_dir());
        let is_link = fs::symlink_metadata(entry.path()).is_ok_and(|m| m.is_symlink());

        let is_referenced = if is_dir {
            // A dataset's row names its directory, its artifacts the files inside: look
            // inside every directory. One holding a registered path is not an orphan even
            // when that file is missing (reported as damage instead).
            let mut below = Vec::new();
            let prefix = format!("{child}/");
            let any = walk(ws, &child, linked || is_link, referenced, live, &mut below)?
                || referenced.contains(&child)
                || referenced
                    .range(prefix.clone()..)
                    .next()
                    .is_some_and(|p| p.starts_with(&prefix));
            if any {
                found.extend(below);
            }
            any
        } else {
            referenced.contains(&child)
        };
        if is_referenced {
            any_referenced = true;
        } else if !linked || is_own_name(&entry.file_name().to_string_lossy()) {
            unreferenced.push(child);
        }
    }
    found.extend(unreferenced);
    Ok(any_referenced)
}
