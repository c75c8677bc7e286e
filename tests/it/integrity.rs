//! Faults injected into a finished workspace (flipped bytes, a truncated file, a missing
//! file of each kind; an orphan file; a damaged catalog), through the real binary: the next
//! stage that reads the file stops naming it and the repair, nothing half-written is
//! registered, `pipeline verify` reports it with exit status 1, and after `pipeline verify
//! --repair` the spec recomputes exactly what was lost and ends with outputs bitwise equal
//! to the undisturbed run's. `docs/reliability.md` lists these rows.

use crate::common;
use common::registered::*;
use common::toy::catalog;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::OnceLock;

/// The spec every workspace here is built from: ingest 1, svd 2, train 3, predict 4,
/// evaluate 5.
fn spec() -> String {
    pipeline_spec()
}

/// The undisturbed workspace, built once per test binary.
struct Baseline {
    spec: PathBuf,
    ws: PathBuf,
    outputs: Outputs,
}

fn baseline() -> &'static Baseline {
    static BASELINE: OnceLock<Baseline> = OnceLock::new();
    BASELINE.get_or_init(|| {
        let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("integrity-baseline");
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let spec = write(&root, "toy.toml", &spec());
        let ws = root.join("ws");
        let out = run_spec(&ws, &spec);
        assert!(out.status.success(), "{}", stderr(&out));
        let outputs = outputs(&ws);
        assert_eq!(outputs.ok_runs.len(), 5, "{outputs:?}");
        Baseline { spec, ws, outputs }
    })
}

fn run_spec(ws: &Path, spec: &Path) -> Output {
    pipeline(ws, &["run", spec.to_str().unwrap()])
}

/// A private copy of the undisturbed workspace.
fn fresh_copy() -> (tempfile::TempDir, PathBuf) {
    let base = baseline();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let ws = dir.path().join("ws");
    common::toy::copy_dir(&base.ws, &ws);
    (dir, ws)
}

fn one(ws: &Path, sql: &str) -> String {
    catalog(ws).query_row(sql, [], |r| r.get(0)).unwrap()
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    FlipBytes,
    Truncate,
    Remove,
}

impl Fault {
    const ALL: [Fault; 3] = [Fault::FlipBytes, Fault::Truncate, Fault::Remove];

    fn inject(self, path: &Path) {
        match self {
            Fault::FlipBytes => {
                let mut bytes = std::fs::read(path).unwrap();
                let mid = bytes.len() / 2;
                for b in &mut bytes[mid..mid + 4] {
                    *b ^= 0x5a;
                }
                std::fs::write(path, bytes).unwrap();
            }
            Fault::Truncate => {
                let len = std::fs::metadata(path).unwrap().len();
                let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
                f.set_len(len / 2).unwrap();
            }
            Fault::Remove => std::fs::remove_file(path).unwrap(),
        }
    }

    /// How the message describes the damage.
    fn described(self) -> &'static str {
        match self {
            Fault::FlipBytes => "checksum mismatch (stored ",
            Fault::Truncate => "size mismatch (stored ",
            Fault::Remove => "): missing",
        }
    }
}

fn verify(ws: &Path, args: &[&str]) -> Output {
    let mut all = vec!["verify"];
    all.extend(args);
    pipeline(ws, &all)
}

fn verify_json(ws: &Path) -> (Output, serde_json::Value) {
    let out = verify(ws, &["--json"]);
    let json = serde_json::from_slice(&out.stdout).expect("verify --json prints JSON");
    (out, json)
}

/// One fault on one registered file: `probe` (a command reading the file) fails naming it,
/// nothing is registered by the failure, `verify` reports it, `verify --repair` and the
/// spec rerun `recomputed` (the stages that ran) and end bitwise equal to the baseline.
fn fault_is_caught_and_repaired(
    kind: &str,
    path_sql: &str,
    fault: Fault,
    probe: &[&str],
    recomputed: &[&str],
) {
    let base = baseline();
    let (_dir, ws) = fresh_copy();
    let rel = one(&ws, path_sql);
    fault.inject(&ws.join(&rel));
    let context = format!("{kind} {fault:?} {rel}");

    let probe_args: Vec<String> = probe
        .iter()
        .map(|a| a.replace("{FILE}", ws.join(&rel).to_str().unwrap()))
        .collect();
    let probe_args: Vec<&str> = probe_args.iter().map(String::as_str).collect();
    let out = pipeline(&ws, &probe_args);
    let log = stderr(&out);
    assert!(!out.status.success(), "{context}: probe succeeded: {log}");
    assert!(
        log.contains(&format!("{kind} ("))
            && log.contains(&format!(
                "{rel}{}",
                if matches!(fault, Fault::Remove) {
                    "): missing"
                } else {
                    "): "
                }
            ))
            && log.contains(fault.described())
            && log.contains("run 'pipeline verify --repair'"),
        "{context}: the message does not name the file and the repair:\n{log}"
    );
    assert!(!log.contains("panicked"), "{context}: {log}");
    // Nothing half-written was registered by the failed stage.
    assert_eq!(outputs(&ws), base.outputs, "{context}");

    let (out, report) = verify_json(&ws);
    assert_eq!(out.status.code(), Some(1), "{context}: {}", stderr(&out));
    let problems = report["problems"].as_array().unwrap();
    let files: Vec<&str> = problems.iter().filter_map(|p| p["path"].as_str()).collect();
    assert_eq!(files, [rel.as_str()], "{context}: {report:#}");
    let text = stderr(&verify(&ws, &[]));
    assert!(
        text.lines()
            .any(|l| l.starts_with(&format!("{kind} (")) && l.contains(&rel)),
        "{context}: {text}"
    );

    let out = verify(&ws, &["--repair"]);
    assert_eq!(out.status.code(), Some(1), "{context}: {}", stderr(&out));
    assert!(stderr(&out).contains("repaired: "), "{}", stderr(&out));

    let out = run_spec(&ws, &base.spec);
    let log = stderr(&out);
    assert!(out.status.success(), "{context}: rerun failed: {log}");
    assert_eq!(stages_ran(&log), recomputed, "{context}: {log}");
    assert_eq!(outputs(&ws), base.outputs, "{context}");
    let out = verify(&ws, &[]);
    assert!(out.status.success(), "{context}: {}", stderr(&out));
}

const TRAIN_CHUNK: &str = "SELECT path FROM artifacts WHERE kind = 'chunk' AND split = 'train' \
                           ORDER BY id LIMIT 1 OFFSET 1";
const LAST_CHECKPOINT: &str = "SELECT path FROM checkpoints ORDER BY step DESC LIMIT 1";

/// The directory of the training run (workspace-relative), that of its last checkpoint.
fn last_train_dir(ws: &Path) -> String {
    let last = one(ws, LAST_CHECKPOINT);
    Path::new(&last)
        .parent()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string()
}
const BASIS: &str = "SELECT path FROM artifacts WHERE kind = 'basis'";
const PREDICTIONS: &str = "SELECT path FROM artifacts WHERE kind = 'predictions'";

/// A new svd of the dataset reads every training chunk.
const SVD_PROBE: &[&str] = &[
    "svd",
    "--dataset",
    "toy",
    "--rank",
    "4",
    "--inducing",
    "8",
    "--threads",
    "2",
];
/// A new predict run reads the last checkpoint and the basis.
const PREDICT_PROBE: &[&str] = &["predict", "--run", "3", "--split", "train", "--top-k", "3"];

#[test]
fn a_damaged_chunk_is_named_and_only_the_ingest_is_redone() {
    for fault in Fault::ALL {
        fault_is_caught_and_repaired("chunk", TRAIN_CHUNK, fault, SVD_PROBE, &["ingest"]);
    }
}

#[test]
fn a_damaged_checkpoint_is_named_and_training_resumes_from_the_one_before() {
    for fault in Fault::ALL {
        fault_is_caught_and_repaired(
            "checkpoint",
            LAST_CHECKPOINT,
            fault,
            PREDICT_PROBE,
            &["train"],
        );
    }
}

#[test]
fn a_damaged_npy_is_named_and_only_its_svd_is_redone() {
    for fault in Fault::ALL {
        fault_is_caught_and_repaired("basis", BASIS, fault, PREDICT_PROBE, &["svd"]);
    }
}

#[test]
fn damaged_predictions_are_named_and_only_they_are_redone() {
    let evaluate = ["evaluate", "--predictions", "{FILE}", "--k", "3"];
    for fault in Fault::ALL {
        fault_is_caught_and_repaired("predictions", PREDICTIONS, fault, &evaluate, &["predict"]);
    }
}

#[test]
fn kxx_is_hashed_on_first_use_then_by_verify() {
    let base = baseline();
    let kxx = "SELECT path FROM artifacts WHERE kind = 'kxx'";
    // Training used K_XX̃, so the catalog records it as verified.
    let verified = one(
        &base.ws,
        "SELECT coalesce(verified_at, '') FROM artifacts WHERE kind = 'kxx'",
    );
    assert!(!verified.is_empty(), "kxx.npy not marked verified");

    // Not yet verified (as just after svd): the first reader hashes it and stops.
    let (_dir, ws) = fresh_copy();
    catalog(&ws)
        .execute("UPDATE artifacts SET verified_at = NULL", [])
        .unwrap();
    let rel = one(&ws, kxx);
    Fault::FlipBytes.inject(&ws.join(&rel));
    let train = [
        "train",
        "--dataset",
        "toy",
        "--svd",
        "2",
        "--factors",
        "2",
        "--batch",
        "64",
        "--epochs",
        "1",
        "--threads",
        "2",
        "--seed",
        "9",
    ];
    let out = pipeline(&ws, &train);
    let log = stderr(&out);
    assert!(!out.status.success());
    assert!(
        log.contains(&format!(
            "kxx (svd run 2, {rel}): checksum mismatch (stored "
        )),
        "{log}"
    );

    // Verified since registration: later opens check its size only; verify hashes it.
    let (_dir, ws) = fresh_copy();
    Fault::Truncate.inject(&ws.join(&rel));
    let out = pipeline(&ws, &train);
    assert!(
        stderr(&out).contains(&format!("kxx (svd run 2, {rel}): size mismatch")),
        "{}",
        stderr(&out)
    );
    let (_dir, ws) = fresh_copy();
    Fault::FlipBytes.inject(&ws.join(&rel));
    let (out, report) = verify_json(&ws);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(report["problems"][0]["path"], rel.as_str(), "{report:#}");
    assert!(report["bytes_hashed"].as_u64().unwrap() > 0);
    assert!(verify(&ws, &["--repair"]).status.code() == Some(1));
    let out = run_spec(&ws, &base.spec);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stages_ran(&stderr(&out)), ["svd"]);
    assert_eq!(outputs(&ws), base.outputs);
}

#[test]
fn orphan_files_are_reported_and_removed_by_repair() {
    let (_dir, ws) = fresh_copy();
    let (out, _) = verify_json(&ws);
    assert!(out.status.success(), "{}", stderr(&out));
    let train_dir = last_train_dir(&ws);
    let strays = [
        "svd/stray.bin".to_string(),
        format!("{train_dir}/extra.parquet"),
    ];
    for s in &strays {
        std::fs::write(ws.join(s), b"not registered").unwrap();
    }
    let (out, report) = verify_json(&ws);
    assert_eq!(out.status.code(), Some(1));
    let mut found: Vec<String> = report["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["path"].as_str().unwrap().to_string())
        .collect();
    found.sort();
    let mut expected = strays.to_vec();
    expected.sort();
    assert_eq!(found, expected, "{report:#}");
    let text = stderr(&verify(&ws, &[]));
    assert!(
        text.contains("orphan svd/stray.bin: no catalog row references it"),
        "{text}"
    );

    // The stray inside the run's directory is the catalog's to judge and is removed; the
    // one at the top of svd/ was written by no run the catalog knows, and is left to its
    // owner.
    let out = verify(&ws, &["--repair"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(!ws.join(&strays[1]).exists(), "{} left behind", strays[1]);
    assert!(
        stderr(&out).contains(
            "repaired: left orphan svd/stray.bin in place: no run of this catalog wrote it; \
             move it out or delete it yourself"
        ),
        "{}",
        stderr(&out)
    );
    assert!(ws.join(&strays[0]).exists(), "svd/stray.bin was deleted");
    std::fs::remove_file(ws.join(&strays[0])).unwrap();
    assert!(verify(&ws, &[]).status.success());
    assert_eq!(outputs(&ws), baseline().outputs);
}

#[test]
fn a_damaged_catalog_is_reported_not_a_panic() {
    let (_dir, ws) = fresh_copy();
    let path = ws.join("catalog.sqlite");
    let mut bytes = std::fs::read(&path).unwrap();
    let page = u16::from_be_bytes([bytes[16], bytes[17]]) as usize;
    // The b-tree page headers of every page after the first (which holds the schema):
    // SQLite keeps no page checksums, so damage it can see is structural damage.
    let mut at = page;
    while at < bytes.len() {
        for b in &mut bytes[at..at + 8] {
            *b ^= 0xa5;
        }
        at += page;
    }
    std::fs::write(&path, bytes).unwrap();
    for args in [&[][..], &["--repair"][..]] {
        let out = verify(&ws, args);
        let log = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{log}");
        assert!(!log.contains("panicked"), "{log}");
        assert!(
            log.contains("catalog (") && log.contains("integrity_check failed"),
            "{log}"
        );
        assert!(
            log.contains("restore catalog.sqlite from a backup"),
            "{log}"
        );
    }
}

#[test]
fn a_catalog_of_the_previous_schema_is_upgraded_in_place() {
    // A v2 catalog (before `verified_at`, `repaired_at`, v4's `label_kind` and `class_map`,
    // and v6's `checkpoints.best` and `run_options.stopped`): opening migrates it, twice is
    // harmless, and verify finds the workspace sound.
    let (_dir, ws) = fresh_copy();
    {
        let db = catalog(&ws);
        db.execute_batch(
            "ALTER TABLE artifacts DROP COLUMN verified_at; \
             ALTER TABLE stage_runs DROP COLUMN repaired_at; \
             ALTER TABLE datasets DROP COLUMN label_kind; \
             ALTER TABLE datasets DROP COLUMN class_map; \
             ALTER TABLE datasets DROP COLUMN transform_reason; \
             ALTER TABLE checkpoints DROP COLUMN best; \
             ALTER TABLE run_options DROP COLUMN stopped; PRAGMA user_version = 2;",
        )
        .unwrap();
    }
    let version = || -> i64 {
        catalog(&ws)
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap()
    };
    // Read-only commands read it upgraded in memory and leave the file as it is.
    for args in [vec!["status"], vec!["verify"]] {
        let out = pipeline(&ws, &args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        assert_eq!(version(), 2, "{args:?} wrote the catalog");
    }
    // A command that writes upgrades it in place.
    for _ in 0..2 {
        let out = verify(&ws, &["--repair"]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(version(), 6);
    }
}

// When the catalog cannot vouch for the files (`store::identity`): every command refuses,
// read-only or not, and no file of the workspace changes.

/// Runs status, verify, verify --repair and the spec on `ws`: each must exit 1 with every
/// one of `parts` in its message, and leave every file of the workspace as it was.
fn assert_refused_untouched(ws: &Path, parts: &[&str]) {
    let before = contents(ws);
    assert!(!before.is_empty());
    let spec = baseline().spec.to_str().unwrap();
    for args in [
        vec!["status"],
        vec!["verify"],
        vec!["verify", "--repair"],
        vec!["run", spec],
    ] {
        let out = pipeline(ws, &args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        for part in parts {
            assert!(err.contains(part), "{args:?}: {part:?} missing from: {err}");
        }
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(
            contents(ws),
            before,
            "{args:?} changed the workspace's files"
        );
    }
}

/// Moves the catalog's files (database, WAL, shared memory) of `ws` into `to`.
fn move_catalog(ws: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(ws).unwrap() {
        let name = e.unwrap().file_name();
        if name.to_string_lossy().starts_with("catalog.sqlite") {
            std::fs::rename(ws.join(&name), to.join(&name)).unwrap();
        }
    }
}

#[test]
fn a_missing_or_empty_catalog_is_refused_and_deletes_nothing() {
    for empty in [false, true] {
        let (dir, ws) = fresh_copy();
        let kept = dir.path().join("kept");
        move_catalog(&ws, &kept);
        let state = if empty {
            std::fs::write(ws.join("catalog.sqlite"), b"").unwrap();
            "is empty (0 bytes), but the workspace holds the outputs of earlier runs ("
        } else {
            "is missing, but the workspace holds the outputs of earlier runs ("
        };
        assert_refused_untouched(
            &ws,
            &[
                state,
                "datasets/toy.run1",
                "nothing was opened, changed or deleted",
                "Restore catalog.sqlite from a backup",
            ],
        );
        assert_eq!(
            ws.join("catalog.sqlite").exists(),
            empty,
            "a catalog was created"
        );
        // With its catalog back the workspace is whole.
        let _ = std::fs::remove_file(ws.join("catalog.sqlite"));
        move_catalog(&kept, &ws);
        assert!(verify(&ws, &[]).status.success());
        assert_eq!(outputs(&ws), baseline().outputs);
    }
}

#[test]
fn a_catalog_of_another_workspace_is_refused_and_deletes_nothing() {
    let (dir, ws) = fresh_copy();
    // Another workspace: the same data ingested on its own.
    let other = dir.path().join("other");
    let data = baseline().spec.parent().unwrap().join("data/train.txt");
    let out = pipeline(
        &other,
        &["ingest", "--name", "toy", "--train", data.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    move_catalog(&ws, &dir.path().join("kept"));
    std::fs::copy(other.join("catalog.sqlite"), ws.join("catalog.sqlite")).unwrap();
    assert_refused_untouched(
        &ws,
        &[
            "belongs to another workspace (its id ",
            "while workspace.json says ",
            "nothing was changed or deleted",
        ],
    );
}

#[test]
fn a_run_directory_linked_from_another_disk_is_the_run_and_is_kept() {
    let (dir, ws) = fresh_copy();
    let train_dir = last_train_dir(&ws);
    let moved = dir.path().join("other-disk/train-run");
    std::fs::create_dir_all(moved.parent().unwrap()).unwrap();
    std::fs::rename(ws.join(&train_dir), &moved).unwrap();
    std::os::unix::fs::symlink(&moved, ws.join(&train_dir)).unwrap();
    let before = contents(&ws);
    for args in [vec![], vec!["--repair"]] {
        let out = verify(&ws, &args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(": no problems"), "{}", stderr(&out));
    }
    assert!(ws.join(&train_dir).is_symlink(), "the link was removed");
    // The spec finds everything done, reading the checkpoints through the link.
    let out = run_spec(&ws, &baseline().spec);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stages_ran(&stderr(&out)).is_empty(), "{}", stderr(&out));
    assert_eq!(contents(&ws), before);
    assert_eq!(outputs(&ws), baseline().outputs);
}

/// A read-only view of a copy of the baseline workspace: a tmpfs remounted read-only where
/// this process may mount (root), else a copy without write permissions (which binds an
/// unprivileged process only). Undone when dropped.
struct ReadOnlyCopy {
    dir: tempfile::TempDir,
    mounted: bool,
}

impl ReadOnlyCopy {
    /// The copy, or None (after saying why the test is skipped) for root where mounting is
    /// refused: permissions do not bind root.
    fn new() -> Option<ReadOnlyCopy> {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let mount = |args: &[&str]| {
            std::process::Command::new("mount")
                .args(args)
                .arg(dir.path())
                .output()
                .is_ok_and(|o| o.status.success())
        };
        // SAFETY: geteuid(2) takes nothing and cannot fail.
        let is_root = unsafe { libc::geteuid() } == 0;
        let mounted = is_root && mount(&["-t", "tmpfs", "-o", "size=64m", "tmpfs"]);
        common::toy::copy_dir(&baseline().ws, &dir.path().join("ws"));
        let read_only = if mounted {
            mount(&["-o", "remount,ro"])
        } else {
            chmod_tree(dir.path(), false);
            !is_root
        };
        let copy = ReadOnlyCopy { dir, mounted };
        if !read_only {
            eprintln!(
                "skipped: a read-only workspace needs, as root, to mount a tmpfs (CAP_SYS_ADMIN)"
            );
            return None;
        }
        Some(copy)
    }

    fn ws(&self) -> PathBuf {
        self.dir.path().join("ws")
    }
}

impl Drop for ReadOnlyCopy {
    fn drop(&mut self) {
        if self.mounted {
            let _ = std::process::Command::new("umount")
                .arg(self.dir.path())
                .output();
        } else {
            chmod_tree(self.dir.path(), true);
        }
    }
}

/// Adds or removes the write permissions of everything below `dir`.
fn chmod_tree(dir: &Path, writable: bool) {
    use std::os::unix::fs::PermissionsExt;
    let set = |p: &Path| {
        let mode = std::fs::metadata(p).unwrap().permissions().mode();
        let mode = if writable {
            mode | 0o200
        } else {
            mode & !0o222
        };
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    if writable {
        set(dir);
    }
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            chmod_tree(&p, writable);
        } else {
            set(&p);
        }
    }
    if !writable {
        set(dir);
    }
}

#[test]
fn a_read_only_workspace_is_read_as_it_is() {
    let Some(copy) = ReadOnlyCopy::new() else {
        return;
    };
    let ws = copy.ws();
    let before = contents(&ws);
    let status = status_json(&ws);
    assert_eq!(status["datasets"][0]["name"], "toy", "{status}");
    let out = pipeline(&ws, &["status", "--run", "3"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("run #3 (train): ok"),
        "{}",
        stdout(&out)
    );
    let out = verify(&ws, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains(": no problems"), "{}", stderr(&out));
    assert_eq!(contents(&ws), before);
}

#[test]
fn a_catalog_of_a_newer_schema_is_refused_with_one_message() {
    let (_dir, ws) = fresh_copy();
    catalog(&ws)
        .execute_batch("PRAGMA user_version = 99;")
        .unwrap();
    assert_refused_untouched(
        &ws,
        &[
            "has schema version 99, newer than this build's (6): it was written by a newer \
           fsgp; use that version (this one changed nothing)",
        ],
    );
}

/// Every row of every table of the catalog at `path`, in a stable order, as text.
fn all_rows(path: &Path) -> Vec<String> {
    let db = rusqlite::Connection::open(path).unwrap();
    let tables: Vec<String> = db
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let mut rows = Vec::new();
    for table in tables {
        let mut stmt = db.prepare(&format!("SELECT * FROM {table}")).unwrap();
        let n = stmt.column_count();
        let mut found: Vec<String> = stmt
            .query_map([], |r| {
                let values: Vec<String> = (0..n)
                    .map(|i| match r.get_ref(i).unwrap() {
                        rusqlite::types::ValueRef::Text(t) => {
                            String::from_utf8_lossy(t).into_owned()
                        }
                        other => format!("{other:?}"),
                    })
                    .collect();
                Ok(format!("{table}: {}", values.join(" | ")))
            })
            .unwrap()
            .map(Result::unwrap)
            .collect();
        found.sort();
        rows.extend(found);
    }
    rows
}

#[test]
fn a_lost_catalog_is_rebuilt_from_the_run_directories_row_for_row() {
    for empty in [false, true] {
        let (dir, ws) = fresh_copy();
        let kept = dir.path().join("kept");
        move_catalog(&ws, &kept);
        if empty {
            std::fs::write(ws.join("catalog.sqlite"), b"").unwrap();
        }
        let before = contents(&ws);
        let out = verify(&ws, &["--rebuild-catalog"]);
        let err = stderr(&out);
        assert!(out.status.success(), "{err}");
        for part in [
            "rebuilt: run 1 from datasets/toy.run1",
            "rebuilt: run 3 from train/",
            "with 5 runs; checking the workspace against it",
            ": no problems",
        ] {
            assert!(err.contains(part), "{part:?} missing from: {err}");
        }
        // Every row of every table as the lost catalog had it, and no file touched.
        let (rebuilt, lost) = (
            all_rows(&ws.join("catalog.sqlite")),
            all_rows(&kept.join("catalog.sqlite")),
        );
        let only = |a: &[String], b: &[String]| -> Vec<String> {
            a.iter().filter(|r| !b.contains(r)).cloned().collect()
        };
        assert!(
            rebuilt == lost,
            "only in the rebuilt catalog: {:#?}\nonly in the lost one: {:#?}",
            only(&rebuilt, &lost),
            only(&lost, &rebuilt)
        );
        assert_eq!(contents(&ws), before);
        let out = run_spec(&ws, &baseline().spec);
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(stages_ran(&stderr(&out)).is_empty(), "{}", stderr(&out));
        assert_eq!(outputs(&ws), baseline().outputs);
        // A catalog that is there is never overwritten.
        let out = verify(&ws, &["--rebuild-catalog"]);
        assert_eq!(out.status.code(), Some(1));
        assert!(
            stderr(&out).contains("--rebuild-catalog never overwrites a catalog"),
            "{}",
            stderr(&out)
        );
    }
}

/// Files of a person's beside the workspace (the victims a wrong deletion would take), each
/// with the xxh3 hash of its bytes, and a check that every one is unchanged.
struct Victims {
    root: PathBuf,
    before: std::collections::BTreeMap<String, u64>,
}

impl Victims {
    /// Writes a few files and a folder under `root`.
    fn plant(root: &Path) -> Victims {
        for (rel, text) in [
            ("notes.txt", "my notes"),
            ("data/big.csv", "a,b\n1,2\n"),
            ("venv/bin/python", "#!/bin/sh\n"),
        ] {
            let path = root.join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        Victims {
            root: root.to_path_buf(),
            before: contents(root),
        }
    }

    /// Whether every planted file is there with its bytes (other files may have come).
    fn untouched(&self) -> bool {
        let now = contents(&self.root);
        self.before
            .iter()
            .all(|(rel, hash)| now.get(rel) == Some(hash))
    }

    fn assert_untouched(&self, after: &str) {
        assert!(
            self.untouched(),
            "{after} changed files outside the workspace: {:?}, expected {:?}",
            contents(&self.root),
            self.before
        );
    }
}

#[test]
fn repair_removes_nothing_through_a_linked_run_directory() {
    let (dir, ws) = fresh_copy();
    let train_dir = last_train_dir(&ws);
    // The run's directory moved to a folder that also holds the person's other files.
    let moved = dir.path().join("other-disk/mine");
    let victims = Victims::plant(&moved);
    for e in std::fs::read_dir(ws.join(&train_dir)).unwrap() {
        let e = e.unwrap();
        std::fs::rename(e.path(), moved.join(e.file_name())).unwrap();
    }
    std::fs::remove_dir(ws.join(&train_dir)).unwrap();
    std::os::unix::fs::symlink(&moved, ws.join(&train_dir)).unwrap();
    // The person's files there are not the run's orphans.
    let out = verify(&ws, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    // A stray checkpoint (a name fsgp makes) there is, but is never removed through the
    // link.
    let stray = format!("{train_dir}/ckpt-000999999.parquet");
    std::fs::write(ws.join(&stray), b"stray").unwrap();
    let out = verify(&ws, &["--repair"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "left orphan {stray} in place: it is reached through the symbolic link {train_dir}"
        )),
        "{err}"
    );
    assert_eq!(std::fs::read(ws.join(&stray)).unwrap(), b"stray");
    std::fs::remove_file(moved.join("ckpt-000999999.parquet")).unwrap();
    victims.assert_untouched("verify --repair");
    assert!(ws.join(&train_dir).is_symlink());
}

#[test]
fn paths_in_a_tampered_catalog_are_refused_and_nothing_outside_is_touched() {
    let (dir, ws) = fresh_copy();
    let victims = Victims::plant(&dir.path().join("victims"));
    let absolute = dir.path().join("victims/notes.txt");
    let db = catalog(&ws);
    db.execute(
        "UPDATE checkpoints SET path = ?1 WHERE step = (SELECT max(step) FROM checkpoints)",
        [absolute.to_str().unwrap()],
    )
    .unwrap();
    db.execute(
        "UPDATE artifacts SET path = 'predictions/../../victims/data/big.csv' \
         WHERE kind = 'predictions'",
        [],
    )
    .unwrap();
    drop(db);
    let (out, report) = verify_json(&ws);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let problems = report["problems"].to_string();
    for path in [
        absolute.to_str().unwrap(),
        "predictions/../../victims/data/big.csv",
    ] {
        assert!(
            problems.contains(&format!("found the path '{path}', expected a path inside")),
            "{path}: {problems}"
        );
    }
    let out = verify(&ws, &["--repair"]);
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
    victims.assert_untouched("verify --repair");
    // The runs those rows belonged to are recomputed, and the workspace ends whole.
    let out = run_spec(&ws, &baseline().spec);
    assert!(out.status.success(), "{}", stderr(&out));
    victims.assert_untouched("the spec's rerun");
    assert!(verify(&ws, &[]).status.success());
}

#[test]
fn a_marker_naming_paths_outside_its_directory_is_not_restored() {
    let (dir, ws) = fresh_copy();
    let victims = Victims::plant(&dir.path().join("victims"));
    let predictions: String = one(&ws, PREDICTIONS);
    let run_dir = Path::new(&predictions).parent().unwrap().to_path_buf();
    let marker_path = ws.join(&run_dir).join(".fsgp-run.json");
    let mut marker: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&marker_path).unwrap()).unwrap();
    let outside = dir.path().join("victims");
    for row in marker["rows"]["artifacts"].as_array_mut().unwrap() {
        row["path"] = outside.to_str().unwrap().into();
    }
    std::fs::write(&marker_path, serde_json::to_vec(&marker).unwrap()).unwrap();
    move_catalog(&ws, &dir.path().join("kept"));
    let out = verify(&ws, &["--rebuild-catalog"]);
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "{}: its marker is refused: found the path '{}'",
            run_dir.display(),
            outside.display()
        )),
        "{err}"
    );
    let out = verify(&ws, &["--repair"]);
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
    victims.assert_untouched("verify --rebuild-catalog and --repair");
    let paths: String = one(&ws, "SELECT group_concat(path) FROM artifacts");
    assert!(!paths.contains("victims"), "{paths}");
}

#[test]
fn a_folder_fsgp_did_not_make_in_its_scratch_space_is_moved_aside() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let ws = dir.path().join("ws");
    // A person's folder where the first run's scratch space goes.
    let victims = Victims::plant(&ws.join("tmp/run-1"));
    let out = run_spec(&ws, &baseline().spec);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("moved what fsgp did not write in tmp/run-1 to lost+found/"),
        "{err}"
    );
    let aside: Vec<PathBuf> = std::fs::read_dir(ws.join("lost+found"))
        .unwrap()
        .map(|e| e.unwrap().path().join("tmp/run-1"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(contents(&aside[0]), victims.before);
    assert_eq!(outputs(&ws), baseline().outputs);
}

/// `status` and `verify` in a workspace whose parent folder is read-only: a tmpfs
/// remounted `ro` with the workspace on a tmpfs of its own mounted inside it (as root;
/// without root, the parent's write permission removed). They succeed, and the parent's
/// files are as they were.
#[test]
fn status_and_verify_write_nothing_outside_the_workspace() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let parent = dir.path().join("parent");
    std::fs::create_dir_all(&parent).unwrap();
    let mount = |args: &[&str], at: &Path| {
        std::process::Command::new("mount")
            .args(args)
            .arg(at)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    // SAFETY: geteuid(2) takes nothing and cannot fail.
    let is_root = unsafe { libc::geteuid() } == 0;
    let mounted = is_root && mount(&["-t", "tmpfs", "-o", "size=64m", "tmpfs"], &parent);
    if is_root && !mounted {
        eprintln!("skipped: a read-only parent needs, as root, to mount a tmpfs");
        return;
    }
    let victims = Victims::plant(&parent.join("beside"));
    let ws = parent.join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let inner = mounted && mount(&["-t", "tmpfs", "-o", "size=64m", "tmpfs"], &ws);
    common::toy::copy_dir(&baseline().ws, &ws);
    let read_only = if mounted {
        inner && mount(&["-o", "remount,ro"], &parent)
    } else {
        let mut perms = std::fs::metadata(&parent).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o555);
        std::fs::set_permissions(&parent, perms).is_ok()
    };
    let listing_before = listing(&parent);
    let results: Vec<(Vec<&str>, Output)> = [
        vec!["status", "--json"],
        vec!["status", "--run", "3"],
        vec!["verify"],
        vec!["verify", "--repair"],
    ]
    .into_iter()
    .map(|args| {
        let out = pipeline(&ws, &args);
        (args, out)
    })
    .collect();
    let listing_after = listing(&parent);
    let untouched = victims.untouched();
    if mounted {
        let _ = mount(&["-o", "remount,rw"], &parent);
        let _ = std::process::Command::new("umount").arg(&ws).output();
        let _ = std::process::Command::new("umount").arg(&parent).output();
    }
    assert!(read_only, "the parent could not be made read-only");
    for (args, out) in results {
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    }
    let outside = |l: &[String]| -> Vec<String> {
        l.iter().filter(|p| !p.starts_with("ws")).cloned().collect()
    };
    assert_eq!(outside(&listing_after), outside(&listing_before));
    assert!(
        untouched,
        "status or verify changed the files beside the workspace"
    );
}
