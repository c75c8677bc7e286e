//! Two processes running the same stage with the same parameters on one workspace at
//! once. The first is paused inside its run by `FSGP_FAILPOINT=stage-pause:STAGE` (its
//! run recorded as running, its scratch directory created), which it signals by writing
//! `tmp/run-<id>/paused`; so the second starts while the first is known to hold the run,
//! whatever the timing. The second is refused before it writes anything, naming the
//! running run, its pid and what to do; once the first finishes, the second finds its
//! outputs and reuses them. A first process that is killed instead no longer counts: the
//! second takes its run up as interrupted. `docs/reliability.md` lists these rows.

use crate::common;
use common::registered::*;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `pipeline run` paused at `stage-pause:STAGE`; killed if the test ends before it does.
struct Paused {
    child: Child,
    /// The paused run's scratch directory.
    scratch: PathBuf,
    log: PathBuf,
}

impl Paused {
    fn start(ws: &Path, spec: &Path, stage: &str) -> Paused {
        let log = spec.with_file_name(format!("first-{stage}.log"));
        let mut child = Command::new(pipeline_bin())
            .arg("--workspace")
            .arg(ws)
            .args(["run", spec.to_str().unwrap()])
            .env_remove("FSGP_WORKSPACE")
            .env("FSGP_FAILPOINT", format!("stage-pause:{stage}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let paused = std::fs::read_dir(ws.join("tmp")).ok().and_then(|rd| {
                rd.map(|e| e.unwrap().path())
                    .find(|p| p.join("paused").exists())
            });
            if let Some(scratch) = paused {
                return Paused {
                    child,
                    scratch,
                    log,
                };
            }
            if let Some(status) = child.try_wait().unwrap() {
                panic!(
                    "the first process ended ({status}) before pausing: {}",
                    std::fs::read_to_string(&log).unwrap()
                );
            }
            assert!(Instant::now() < deadline, "the first process never paused");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Lets it go on; it must then finish the whole spec.
    fn release(mut self) {
        std::fs::write(self.scratch.join("resume"), b"").unwrap();
        let status = self.child.wait().unwrap();
        assert!(
            status.success(),
            "{}",
            std::fs::read_to_string(&self.log).unwrap()
        );
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn count(ws: &Path, table: &str) -> i64 {
    query(ws, &format!("SELECT count(*) FROM {table}"))
}

fn second_process_is_refused_then_reuses(stage: &str, run_id: i64) {
    let (_dir, spec) = spec_dir(stage);
    let ws = spec.parent().unwrap().join("ws");
    let first = Paused::start(&ws, &spec, stage);
    let (runs, artifacts) = (count(&ws, "stage_runs"), count(&ws, "artifacts"));

    let out = run_spec_with(&ws, &spec, &[]);
    let log = stderr(&out);
    assert!(
        !out.status.success(),
        "{stage}: the second process ran: {log}"
    );
    let pid = first.pid();
    for part in [
        format!("stage {stage} of "),
        format!(
            "another process (pid {pid}) is running {stage} run {run_id} with these parameters in "
        ),
        " (started ".to_string(),
        "wait for it to finish and run this again".to_string(),
        format!("stop it (kill {pid})"),
    ] {
        assert!(log.contains(&part), "{stage}: {part:?} missing from: {log}");
    }
    assert!(!log.contains("panicked"), "{log}");
    // Nothing written by the second process: no run row, no artifact.
    assert_eq!(count(&ws, "stage_runs"), runs, "{stage}");
    assert_eq!(count(&ws, "artifacts"), artifacts, "{stage}");

    first.release();
    let out = run_spec_with(&ws, &spec, &[]);
    let log = stderr(&out);
    assert!(out.status.success(), "{stage}: {log}");
    assert!(stages_ran(&log).is_empty(), "{stage}: {log}");
    assert_eq!(&outputs(&ws), baseline(), "{stage}");
    let out = pipeline(&ws, &["verify"]);
    assert!(out.status.success(), "{stage}: {}", stderr(&out));
}

#[test]
fn a_second_ingest_is_refused_while_the_first_runs() {
    second_process_is_refused_then_reuses("ingest", 1);
}

#[test]
fn a_second_svd_is_refused_while_the_first_runs() {
    second_process_is_refused_then_reuses("svd", 2);
}

#[test]
fn a_second_training_is_refused_while_the_first_runs() {
    second_process_is_refused_then_reuses("train", 3);
}

#[test]
fn a_second_predict_is_refused_while_the_first_runs() {
    second_process_is_refused_then_reuses("predict", 4);
}

#[test]
fn a_second_evaluate_is_refused_while_the_first_runs() {
    second_process_is_refused_then_reuses("evaluate", 5);
}

#[test]
fn a_run_whose_process_is_gone_is_taken_up_as_interrupted() {
    let (_dir, spec) = spec_dir("dead");
    let ws = spec.parent().unwrap().join("ws");
    let mut first = Paused::start(&ws, &spec, "svd");
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let out = run_spec_with(&ws, &spec, &[]);
    let log = stderr(&out);
    assert!(out.status.success(), "{log}");
    assert!(
        log.contains("svd run 2 with these parameters was interrupted"),
        "{log}"
    );
    assert_eq!(&outputs(&ws), baseline());
    assert!(pipeline(&ws, &["verify"]).status.success());
}

/// The state letter of process `pid` (`/proc/PID/stat`), None once it is reaped.
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..].trim_start().chars().next()
}

#[test]
fn a_killed_process_not_yet_reaped_counts_as_gone() {
    let (_dir, spec) = spec_dir("zombie");
    let ws = spec.parent().unwrap().join("ws");
    let mut first = Paused::start(&ws, &spec, "train");
    // SIGKILL, and no wait: the process stays a zombie of this one until reaped below, as
    // under `timeout -s KILL` or a parent that never waits.
    first.child.kill().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while process_state(first.pid()) != Some('Z') {
        assert!(
            Instant::now() < deadline,
            "the killed process never became a zombie"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = run_spec_with(&ws, &spec, &[]);
    let log = stderr(&out);
    assert!(out.status.success(), "{log}");
    assert!(
        log.contains("run 3 with these parameters was interrupted; resuming it"),
        "{log}"
    );
    assert_eq!(process_state(first.pid()), Some('Z'), "reaped too early");
    // The rerun took the run's own id and ended as an undisturbed run.
    assert_eq!(&outputs(&ws), baseline());
    assert_eq!(count(&ws, "stage_runs"), 5);
    assert!(pipeline(&ws, &["verify"]).status.success());
    first.child.wait().unwrap();
}

#[test]
fn a_running_run_is_refused_when_its_lock_file_was_deleted() {
    let (_dir, spec) = spec_dir("lockless");
    let ws = spec.parent().unwrap().join("ws");
    let first = Paused::start(&ws, &spec, "train");
    for lock in std::fs::read_dir(ws.join("locks")).unwrap() {
        std::fs::remove_file(lock.unwrap().path()).unwrap();
    }
    let (runs, checkpoints) = (count(&ws, "stage_runs"), count(&ws, "checkpoints"));
    let out = run_spec_with(&ws, &spec, &[]);
    let log = stderr(&out);
    assert!(!out.status.success(), "the second process trained: {log}");
    let pid = first.pid();
    for part in [
        format!("another process (pid {pid}) is running train run 3 with these parameters"),
        "although its lock file ".to_string(),
        format!("stop it (kill {pid})"),
    ] {
        assert!(log.contains(&part), "{part:?} missing from: {log}");
    }
    assert_eq!(count(&ws, "stage_runs"), runs);
    assert_eq!(count(&ws, "checkpoints"), checkpoints);
    first.release();
    assert_eq!(&outputs(&ws), baseline());
}

/// A consistent copy of the catalog of `ws` at `to`, taken beside running processes (as
/// a backup tool would: SQLite's `VACUUM INTO`).
fn back_up_catalog(ws: &Path, to: &Path) {
    let db = rusqlite::Connection::open(ws.join("catalog.sqlite")).unwrap();
    db.execute("VACUUM INTO ?1", [to.to_str().unwrap()])
        .unwrap();
}

/// Puts the catalog backup `from` in place of the catalog of `ws`.
fn restore_catalog(ws: &Path, from: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(ws.join(format!("catalog.sqlite{suffix}")));
    }
    std::fs::copy(from, ws.join("catalog.sqlite")).unwrap();
}

#[test]
fn a_catalog_backup_taken_mid_run_is_refused_and_deletes_nothing() {
    let (dir, spec) = spec_dir("backup");
    let ws = spec.parent().unwrap().join("ws");
    let first = Paused::start(&ws, &spec, "train");
    let mid_run = dir.path().join("mid-run.sqlite");
    back_up_catalog(&ws, &mid_run);
    first.release();
    let newest = dir.path().join("newest.sqlite");
    back_up_catalog(&ws, &newest);

    restore_catalog(&ws, &mid_run);
    let before = common::contents(&ws);
    for args in [
        vec!["status"],
        vec!["verify"],
        vec!["verify", "--repair"],
        vec!["run", spec.to_str().unwrap()],
    ] {
        let out = pipeline(&ws, &args);
        let log = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {log}");
        for part in [
            "is older than the files it should describe (",
            "it looks like a restored backup",
            "nothing was changed or deleted",
            "predictions/",
        ] {
            assert!(log.contains(part), "{args:?}: {part:?} missing from: {log}");
        }
        assert_eq!(common::contents(&ws), before, "{args:?} changed files");
    }
    // Without the later runs' directories, only the generation tells: training registered
    // checkpoints after the backup, which the run's own id does not show. Trusted, the
    // backup would have its resume prune those checkpoints as unregistered.
    let alone = dir.path().join("train-alone");
    common::toy::copy_dir(&ws, &alone);
    for later in ["predictions", "evaluations"] {
        std::fs::remove_dir_all(alone.join(later)).unwrap();
    }
    let alone_before = common::contents(&alone);
    for args in [vec!["status"], vec!["run", spec.to_str().unwrap()]] {
        let out = pipeline(&alone, &args);
        let log = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {log}");
        assert!(
            log.contains("train/toy-linear.run3 was published at generation "),
            "{args:?}: {log}"
        );
        assert_eq!(
            common::contents(&alone),
            alone_before,
            "{args:?} changed files"
        );
    }
    // With the old catalog set aside, the run directories rebuild it, row for row as the
    // newest backup has it.
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(ws.join(format!("catalog.sqlite{suffix}")));
    }
    let out = pipeline(&ws, &["verify", "--rebuild-catalog"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("with 5 runs"), "{}", stderr(&out));
    assert_eq!(&outputs(&ws), baseline());
    assert_eq!(common::contents(&ws), before);
    restore_catalog(&ws, &newest);
    assert_eq!(&outputs(&ws), baseline());
    let out = run_spec_with(&ws, &spec, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stages_ran(&stderr(&out)).is_empty(), "{}", stderr(&out));
    assert_eq!(&outputs(&ws), baseline());
    assert!(pipeline(&ws, &["verify"]).status.success());
}

#[test]
fn two_commands_creating_one_workspace_at_once_both_succeed() {
    let (dir, spec) = spec_dir("create");
    // The generated data of the spec, ingested under two names into new workspaces.
    let out = run_spec_with(&dir.path().join("seed-ws"), &spec, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let train = spec.parent().unwrap().join("data/train.txt");
    for trial in 0..6 {
        let ws = dir.path().join(format!("ws{trial}"));
        let start = |name: &str| {
            Command::new(pipeline_bin())
                .arg("--workspace")
                .arg(&ws)
                .args(["ingest", "--name", name, "--train", train.to_str().unwrap()])
                .env_remove("FSGP_WORKSPACE")
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        };
        let (a, b) = (start("a"), start("b"));
        for child in [a, b] {
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "trial {trial}: {}", stderr(&out));
        }
        let mut names = dataset_names(&ws);
        names.sort();
        assert_eq!(names, ["a", "b"], "trial {trial}");
        assert!(pipeline(&ws, &["verify"]).status.success());
    }
}
