//! A full disk, injected: a checkpoint write failing with "No space left on device" names
//! the stage, run, step and path, keeps the last good checkpoint and resumes to the bytes
//! of an undisturbed run; a stage whose outputs do not fit (free space from the test hook
//! `FSGP_FREE_SPACE_BYTES`) is refused before it writes, with both figures.

mod common;
use common::toy::*;
use common::*;
use std::process::Command;

fn count(ws: &std::path::Path, sql: &str) -> i64 {
    catalog(ws).query_row(sql, [], |r| r.get(0)).unwrap()
}

#[test]
fn a_failed_checkpoint_write_names_where_and_resumes_to_identical_bytes() {
    let p = prepared();
    let reference = p.copy("ref");
    let expected = checkpoints(&reference, train_ok(&reference, &[]));

    let ws = p.copy("enospc");
    let out = Command::new(pipeline_bin())
        .arg("--workspace")
        .arg(&ws)
        .args(TRAIN)
        .env_remove("FSGP_WORKSPACE")
        .env("FSGP_FAILPOINT", "checkpoint-write-enospc:21")
        .output()
        .unwrap();
    assert!(!out.status.success(), "the write failpoint did not fire");
    let err = stderr(&out);
    let id = train_run_id(&ws);
    for part in [
        format!("train run {id}: writing checkpoint at step 21 to "),
        "ckpt-000000021.parquet".to_string(),
        "No space left on device (os error 28)".to_string(),
    ] {
        assert!(err.contains(&part), "{part:?} missing from: {err}");
    }
    assert_eq!(run_status(&ws, id), "failed");
    let recorded: String = catalog(&ws)
        .query_row("SELECT error FROM stage_runs WHERE id = ?1", [id], |r| {
            r.get(0)
        })
        .unwrap();
    assert!(
        recorded.contains("writing checkpoint at step 21"),
        "{recorded}"
    );

    // The good checkpoints stay registered, byte for byte; the failed one is not there.
    let kept = checkpoints(&ws, id);
    assert_eq!(kept.keys().copied().collect::<Vec<_>>(), vec![7, 14]);
    for (step, bytes) in &kept {
        assert_eq!(Some(bytes), expected.get(step), "step {step}");
    }
    let dir = ws.join(format!("train/toy-linear.run{id}"));
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);

    let out = pipeline(&ws, &["train", "--resume", &id.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(run_status(&ws, id), "ok");
    assert_eq!(checkpoints(&ws, id), expected);
}

#[test]
fn svd_refuses_outputs_that_do_not_fit_and_registers_nothing() {
    let p = prepared();
    let ws = p.copy("full");
    let artifacts = count(&ws, "SELECT count(*) FROM artifacts");
    let out = Command::new(pipeline_bin())
        .arg("--workspace")
        .arg(&ws)
        .args(["svd", "--dataset", "toy", "--rank", "6", "--inducing", "16"])
        .env_remove("FSGP_WORKSPACE")
        .env("FSGP_FREE_SPACE_BYTES", "1000")
        .output()
        .unwrap();
    assert!(!out.status.success(), "svd ran on a full file system");
    let err = stderr(&out);
    let id = count(&ws, "SELECT max(id) FROM stage_runs WHERE stage = 'svd'");
    // K_XX̃ [900×6] + basis [6×60] + norms [900], f32: 4 × (5400 + 360 + 900) bytes.
    for part in [
        format!("svd run {id}: "),
        "kxx.npy".to_string(),
        "needs 26.0 KiB".to_string(),
        "has 1000 B free".to_string(),
    ] {
        assert!(err.contains(&part), "{part:?} missing from: {err}");
    }
    assert_eq!(run_status(&ws, id), "failed");
    assert_eq!(count(&ws, "SELECT count(*) FROM artifacts"), artifacts);
    let published = std::fs::read_dir(ws.join("svd"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(&format!(".run{id}"))
        })
        .count();
    assert_eq!(published, 0);
    assert!(!ws.join(format!("tmp/run-{id}")).exists());
}
