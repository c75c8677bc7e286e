//! SIGKILL at each commit point of the one stage protocol (`src/stage.rs`), for ingest,
//! svd, predict and evaluate (training has its own kill tests in `tests/it/train_stage.rs`):
//! `FSGP_FAILPOINT=stage-computed:STAGE` kills the process once the stage's outputs are
//! complete in its scratch directory, `stage-renamed:STAGE` once they are renamed into
//! place but before the catalog commit. After the kill nothing of the run is registered;
//! the next process marks it interrupted and removes what it left; a rerun of the same spec
//! recomputes it under its own id and ends with the undisturbed run's registered files
//! (paths and checksums) and runs; `pipeline verify` is clean. `docs/reliability.md` lists
//! these rows.

use crate::common;
use common::registered::*;
use common::*;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;

/// The run ids the spec gives each stage.
fn run_id_of(stage: &str) -> i64 {
    match stage {
        "ingest" => 1,
        "svd" => 2,
        "predict" => 4,
        "evaluate" => 5,
        _ => unreachable!(),
    }
}

/// The stages the spec runs from `stage` on.
fn from(stage: &str) -> Vec<String> {
    let all = ["ingest", "svd", "train", "predict", "evaluate"];
    let at = all.iter().position(|s| *s == stage).unwrap();
    all[at..].iter().map(|s| s.to_string()).collect()
}

/// Workspace-relative paths below `dir` (one level).
fn entries(ws: &Path, dir: &str) -> Vec<String> {
    match std::fs::read_dir(ws.join(dir)) {
        Ok(rd) => rd
            .map(|e| format!("{dir}/{}", e.unwrap().file_name().to_string_lossy()))
            .collect(),
        Err(_) => Vec::new(),
    }
}

fn killed_at_point_then_rerun(stage: &str, point: &str) {
    let context = format!("{point}:{stage}");
    let (_dir, spec) = spec_dir(stage);
    let ws = spec.parent().unwrap().join("ws");
    let out = run_spec_with(&ws, &spec, &[("FSGP_FAILPOINT", &context)]);
    assert_eq!(out.status.signal(), Some(9), "{context}: {}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("failpoint {context}: killing")),
        "{context}: {}",
        stderr(&out)
    );

    // As the kill left it: the run still 'running', nothing of it registered, its output
    // complete in scratch (computed) or in place under its final name (renamed).
    let id = run_id_of(stage);
    let status: String = query(
        &ws,
        &format!("SELECT status FROM stage_runs WHERE id = {id}"),
    );
    assert_eq!(status, "running", "{context}");
    let registered: i64 = query(
        &ws,
        &format!("SELECT count(*) FROM artifacts WHERE stage_run_id = {id}"),
    );
    assert_eq!(
        registered, 0,
        "{context}: a half-committed run registered files"
    );
    let output_dir = match stage {
        "ingest" => "datasets",
        "evaluate" => "evaluations",
        "svd" => "svd",
        _ => "predictions",
    };
    let published = entries(&ws, output_dir);
    let scratch = ws.join(format!("tmp/run-{id}"));
    match point {
        "stage-computed" => {
            assert!(scratch.is_dir(), "{context}");
            assert!(published.is_empty(), "{context}: {published:?}");
        }
        _ => assert_eq!(published.len(), 1, "{context}: {published:?}"),
    }

    // `status` shows the run as interrupted, and only reads: its files stay until a
    // command that writes collects them.
    let st = status_json(&ws);
    let run = st["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == id)
        .unwrap_or_else(|| panic!("{context}: run {id} not in status: {st:#}"));
    assert_eq!(run["status"], "interrupted", "{context}");
    assert_eq!(
        entries(&ws, output_dir),
        published,
        "{context}: status deleted"
    );
    assert!(scratch.is_dir(), "{context}: status deleted the scratch");

    let out = run_spec_with(&ws, &spec, &[]);
    let log = stderr(&out);
    assert!(out.status.success(), "{context}: rerun failed: {log}");
    assert!(
        log.contains(&format!(
            "{stage} run {id} with these parameters was interrupted"
        )),
        "{context}: {log}"
    );
    assert_eq!(stages_ran(&log), from(stage), "{context}: {log}");
    assert!(!scratch.exists(), "{context}: scratch left");
    assert_eq!(&outputs(&ws), baseline(), "{context}");
    let out = pipeline(&ws, &["verify"]);
    assert!(out.status.success(), "{context}: {}", stderr(&out));
}

fn both_points(stage: &str) {
    for point in ["stage-computed", "stage-renamed"] {
        killed_at_point_then_rerun(stage, point);
    }
}

#[test]
fn ingest_killed_at_each_commit_point_reruns_to_identical_outputs() {
    both_points("ingest");
}

#[test]
fn svd_killed_at_each_commit_point_reruns_to_identical_outputs() {
    both_points("svd");
}

#[test]
fn predict_killed_at_each_commit_point_reruns_to_identical_outputs() {
    both_points("predict");
}

#[test]
fn evaluate_killed_at_each_commit_point_reruns_to_identical_outputs() {
    both_points("evaluate");
}
