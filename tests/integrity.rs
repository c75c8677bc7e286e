//! Faults injected into a finished workspace (flipped bytes, a truncated file, a missing
//! file of each kind; an orphan file; a damaged catalog), through the real binary: the next
//! stage that reads the file stops naming it and the repair, nothing half-written is
//! registered, `pipeline verify` reports it with exit status 1, and after `pipeline verify
//! --repair` the spec recomputes exactly what was lost and ends with outputs bitwise equal
//! to the undisturbed run's. `docs/reliability.md` lists these rows.

mod common;
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
    let train_dir = Path::new(&one(&ws, LAST_CHECKPOINT))
        .parent()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
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

    assert_eq!(verify(&ws, &["--repair"]).status.code(), Some(1));
    for s in &strays {
        assert!(!ws.join(s).exists(), "{s} left behind");
    }
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
    // A v2 catalog (before `verified_at`, `repaired_at`, and v4's `label_kind` and
    // `class_map`): opening migrates it, twice is harmless, and verify finds the workspace
    // sound.
    let (_dir, ws) = fresh_copy();
    {
        let db = catalog(&ws);
        db.execute_batch(
            "ALTER TABLE artifacts DROP COLUMN verified_at; \
             ALTER TABLE stage_runs DROP COLUMN repaired_at; \
             ALTER TABLE datasets DROP COLUMN label_kind; \
             ALTER TABLE datasets DROP COLUMN class_map; PRAGMA user_version = 2;",
        )
        .unwrap();
    }
    for _ in 0..2 {
        let out = verify(&ws, &[]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let version: i64 = catalog(&ws)
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, 4);
}
