//! A full disk, injected: a checkpoint write failing with "No space left on device" names
//! the stage, run, step and path, keeps the last good checkpoint and resumes to the bytes
//! of an undisturbed run; a stage whose outputs do not fit (free space from the test hook
//! `FSGP_FREE_SPACE_BYTES`: svd's factors, an ingest chunk, predictions) is refused before
//! it writes, with both figures, and after room is made the rerun ends bitwise equal. And
//! a real full file system: the workspace on a small tmpfs, where the machine allows
//! mounting one. And a write torn midway (ENOSPC injected by the store's writers after
//! part of the file is written: an ingest chunk, svd's `.npy` factors, predictions): the
//! stage fails naming run, file and error, registers and leaves nothing, and the rerun
//! ends bitwise equal.

use crate::common;
use common::toy::*;
use common::*;
use std::process::Command;

fn count(ws: &std::path::Path, sql: &str) -> i64 {
    catalog(ws).query_row(sql, [], |r| r.get(0)).unwrap()
}

/// `pipeline train` with the toy command line and `env` set.
fn train_with(ws: &std::path::Path, env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new(pipeline_bin());
    cmd.arg("--workspace")
        .arg(ws)
        .args(TRAIN)
        .env_remove("FSGP_WORKSPACE")
        .env_remove("FSGP_FAILPOINT")
        .env_remove("FSGP_FREE_SPACE_BYTES");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

#[test]
fn a_failed_checkpoint_write_names_where_and_the_same_command_resumes_to_identical_bytes() {
    let p = prepared();
    let reference = p.copy("ref");
    let expected = checkpoints(&reference, train_ok(&reference, &[]));

    let ws = p.copy("enospc");
    let out = train_with(&ws, &[("FSGP_FAILPOINT", "checkpoint-write-enospc:21")]);
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
    assert_eq!(checkpoint_files(&dir), 2);

    // Still no room: the same command takes the failed run up and fails at once, before
    // any step, with both figures; its checkpoints stay as they were.
    let out = train_with(&ws, &[("FSGP_FREE_SPACE_BYTES", "1000")]);
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    for part in [
        format!(
            "run {id} with these parameters failed (train run {id}: writing checkpoint at \
             step 21"
        ),
        format!(
            "train run {id}: writing the 12 checkpoints this run has left (all kept) and the \
             catalog's journal needs "
        ),
        ", the workspace's file system has 1000 B free".to_string(),
    ] {
        assert!(err.contains(&part), "{part:?} missing from: {err}");
    }
    assert_eq!(checkpoints(&ws, id), kept);

    // With room, the same command resumes it from step 14 under its own id and ends with
    // the bytes of an undisturbed run.
    let out = train_with(&ws, &[]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(&format!("resuming run {id} from step 14")),
        "{err}"
    );
    assert_eq!(train_run_id(&ws), id, "a new run was started");
    assert_eq!(run_status(&ws, id), "ok");
    assert_eq!(checkpoints(&ws, id), expected);
}

/// The checkpoint files in a training run's directory.
fn checkpoint_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("ckpt-")
        })
        .count()
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
        "writing kxx.npy, basis.npy and sq_norms.npy needs 26.0 KiB".to_string(),
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

/// The whole pipeline's spec in its own directory (its generated data go beside it), with
/// its workspace path.
fn spec_in(name: &str, text: &str) -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix(name)
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let spec = write(dir.path(), "toy.toml", text);
    let ws = dir.path().join("ws");
    (dir, spec, ws)
}

/// The registered outputs of an undisturbed run of `text` (a spec).
fn undisturbed(text: &str) -> registered::Outputs {
    let (_dir, spec, ws) = spec_in("reference", text);
    let out = registered::run_spec_with(&ws, &spec, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    registered::outputs(&ws)
}

/// Asserts that `err` is a free-space refusal naming the stage run, the file, both figures
/// (`free`: how the free figure starts) and a path below the run's scratch directory.
fn assert_refusal(err: &str, run: &str, what: &str, free: &str, below: &str) {
    for part in [
        format!("{run}: {what} needs "),
        format!(", the workspace's file system has {free}"),
        below.to_string(),
    ] {
        assert!(err.contains(&part), "{part:?} missing from: {err}");
    }
}

#[test]
fn ingest_refuses_a_chunk_that_does_not_fit_and_registers_nothing() {
    let text = registered::pipeline_spec();
    let (_dir, spec, ws) = spec_in("ingest-full", &text);
    let out = registered::run_spec_with(&ws, &spec, &[("FSGP_FREE_SPACE_BYTES", "1000")]);
    assert!(!out.status.success(), "ingest ran on a full file system");
    // Chunk 0 of the training split (200 rows) holds 34.9 KiB of CSR arrays.
    assert!(stderr(&out).contains("stage ingest of "));
    assert_refusal(
        &stderr(&out),
        "ingest run 1",
        "chunk part-00000.parquet of split 'train'",
        "1000 B free (",
        "tmp/run-1/dataset/train)",
    );
    assert_eq!(run_status(&ws, 1), "failed");
    assert_eq!(count(&ws, "SELECT count(*) FROM artifacts"), 0);
    assert_eq!(count(&ws, "SELECT count(*) FROM datasets"), 0);
    assert!(!ws.join("tmp/run-1").exists());
    assert_eq!(std::fs::read_dir(ws.join("datasets")).unwrap().count(), 0);

    // With room, the same spec recomputes the failed ingest under its id: bitwise equal.
    let out = registered::run_spec_with(&ws, &spec, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(registered::outputs(&ws), undisturbed(&text));
    assert!(pipeline(&ws, &["verify"]).status.success());
}

#[test]
fn predict_refuses_predictions_that_do_not_fit_and_registers_nothing() {
    let text = registered::pipeline_spec();
    let (_dir, spec, ws) = spec_in("predict-full", &text);
    let out = registered::run_spec_with(&ws, &spec, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let reference = ws.with_file_name("reference");
    copy_dir(&ws, &reference);
    let predict = [
        "predict",
        "--run",
        "3",
        "--split",
        "train",
        "--top-k",
        "7",
        "--probabilities",
    ];
    let out = pipeline(&reference, &predict);
    assert!(out.status.success(), "{}", stderr(&out));

    let before = registered::outputs(&ws);
    let out = Command::new(pipeline_bin())
        .arg("--workspace")
        .arg(&ws)
        .args(predict)
        .env_remove("FSGP_WORKSPACE")
        .env("FSGP_FREE_SPACE_BYTES", "4096")
        .output()
        .unwrap();
    assert!(!out.status.success(), "predict ran on a full file system");
    // 900 rows × (8 + 3 lists × (4 + 7 × 4)) bytes + 4 KiB for the footer.
    let err = stderr(&out);
    assert_refusal(
        &err,
        "predict run 6",
        "predictions.parquet",
        "4.0 KiB free (",
        "tmp/run-6/predictions)",
    );
    assert!(err.contains("needs 95.4 KiB"), "{err}");
    assert_eq!(run_status(&ws, 6), "failed");
    assert_eq!(registered::outputs(&ws), before);
    assert!(!ws.join("tmp/run-6").exists());

    let out = pipeline(&ws, &predict);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(registered::outputs(&ws), registered::outputs(&reference));
    assert!(pipeline(&ws, &["verify"]).status.success());
}

/// A tmpfs mounted for one test, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (mount(8) syntax) or says why it cannot.
    fn mount(size: &str) -> Result<Tmpfs, String> {
        let dir = tempfile::Builder::new()
            .prefix("tmpfs")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed ({}): {}",
                out.status,
                stderr(&out).trim()
            ));
        }
        Ok(Tmpfs { dir })
    }

    /// [`Tmpfs::mount`], or None after saying why the test is skipped.
    fn mount_or_skip(size: &str) -> Option<Tmpfs> {
        Tmpfs::mount(size)
            .inspect_err(|why| {
                eprintln!(
                    "skipped: the real-file-system test needs to mount a tmpfs (root or \
                     CAP_SYS_ADMIN): {why}"
                )
            })
            .ok()
    }

    fn path(&self) -> &std::path::Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).output();
    }
}

#[test]
fn a_real_full_file_system_refuses_an_ingest_chunk_then_reruns_to_identical_outputs() {
    // One chunk of the training split (900 rows, 169.4 KiB of CSR arrays), so the refusal
    // comes at the first chunk and the catalog's own writes fit beside the filler.
    let text = registered::pipeline_spec().replace("chunk_rows = 200", "chunk_rows = 2000");
    let Some(fs) = Tmpfs::mount_or_skip("1m") else {
        return;
    };
    let (_dir, spec, _) = spec_in("tmpfs", &text);
    let ws = fs.path().join("ws");
    // The workspace and its catalog first, so the filler below leaves their room.
    drop(fsgp::store::workspace::Workspace::open(&ws).unwrap());
    // Leave 96 KiB free: room for the catalog's WAL and shared memory, not for the chunk.
    let free = fsgp::store::space::free_bytes(fs.path()).unwrap();
    let filler = fs.path().join("filler");
    std::fs::write(&filler, vec![0x5au8; (free - 96 * 1024) as usize]).unwrap();

    let out = registered::run_spec_with(&ws, &spec, &[]);
    assert!(!out.status.success(), "ingest ran on a full file system");
    let err = stderr(&out);
    assert_refusal(
        &err,
        "ingest run 1",
        "chunk part-00000.parquet of split 'train'",
        "",
        "tmp/run-1/dataset/train)",
    );
    assert!(err.contains("stage ingest of "), "{err}");
    // The chunk's CSR arrays; the free figure is what statvfs says (the catalog's files
    // took some of the 96 KiB), and less.
    assert!(err.contains("needs 169.4 KiB, "), "{err}");
    let free_kib = number_between(&err, "file system has ", " KiB free (")
        .unwrap_or_else(|| panic!("no free figure in KiB: {err}"));
    assert!(free_kib > 0.0 && free_kib <= 96.0, "{err}");
    assert_eq!(run_status(&ws, 1), "failed");
    assert_eq!(count(&ws, "SELECT count(*) FROM artifacts"), 0);
    assert_eq!(count(&ws, "SELECT count(*) FROM datasets"), 0);
    assert!(!ws.join("tmp/run-1").exists());

    std::fs::remove_file(&filler).unwrap();
    let out = registered::run_spec_with(&ws, &spec, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(registered::outputs(&ws), undisturbed(&text));
    assert!(pipeline(&ws, &["verify"]).status.success());
}

/// ENOSPC injected midway through one file of `stage` (run `id`), by the writer itself in
/// `store` (`point`, e.g. `chunk-write-enospc:train/part-00001.parquet`), in a run of the
/// whole pipeline spec: the stage fails naming its run, the file and the OS error; its run
/// is failed, nothing of it registered, its scratch (holding the torn file) removed and
/// nothing published; the spec rerun recomputes it under its id and ends with the
/// undisturbed run's registered files; `pipeline verify` is clean.
fn torn_write_then_rerun(stage: &str, id: i64, point: &str, file: &str) {
    let (_dir, spec) = registered::spec_dir(stage);
    let ws = spec.parent().unwrap().join("ws");
    let out = registered::run_spec_with(&ws, &spec, &[("FSGP_FAILPOINT", point)]);
    assert!(!out.status.success(), "{point}: the failpoint did not fire");
    let err = stderr(&out);
    for part in [
        format!("{stage} run {id}: "),
        file.to_string(),
        format!("tmp/run-{id}/"),
        "No space left on device (os error 28)".to_string(),
    ] {
        assert!(err.contains(&part), "{point}: {part:?} missing from: {err}");
    }
    assert_eq!(run_status(&ws, id), "failed", "{point}");
    let recorded: String = registered::query(
        &ws,
        &format!("SELECT error FROM stage_runs WHERE id = {id}"),
    );
    assert!(recorded.contains(file), "{point}: {recorded}");
    assert_eq!(
        count(
            &ws,
            &format!("SELECT count(*) FROM artifacts WHERE stage_run_id = {id}")
        ),
        0,
        "{point}"
    );
    assert!(!ws.join(format!("tmp/run-{id}")).exists(), "{point}");
    // The stage's output directory holds only this run's outputs in the spec.
    let output_dir = match stage {
        "ingest" => "datasets/",
        "svd" => "svd/",
        _ => "predictions/",
    };
    let published: Vec<String> = listing(&ws)
        .into_iter()
        .filter(|p| p.starts_with(output_dir))
        .collect();
    assert!(published.is_empty(), "{point}: {published:?}");

    let out = registered::run_spec_with(&ws, &spec, &[]);
    assert!(out.status.success(), "{point}: {}", stderr(&out));
    assert_eq!(&registered::outputs(&ws), registered::baseline(), "{point}");
    assert!(pipeline(&ws, &["verify"]).status.success(), "{point}");
}

#[test]
fn a_chunk_write_failing_midway_leaves_nothing_and_reruns_to_identical_outputs() {
    // Chunk 0 is complete; chunk 1's row group is in its file, its footer is not.
    torn_write_then_rerun(
        "ingest",
        1,
        "chunk-write-enospc:train/part-00001.parquet",
        "part-00001.parquet",
    );
}

#[test]
fn an_svd_factor_write_failing_midway_leaves_nothing_and_reruns_to_identical_outputs() {
    // basis.npy and singular_values.npy are written; kxx.npy has its header, and the
    // reservation of its data region fails as on a full disk.
    torn_write_then_rerun("svd", 2, "npy-write-enospc:kxx.npy", "kxx.npy");
    // A small array's write failing after its bytes went to the file, before its fsync.
    torn_write_then_rerun("svd", 2, "npy-write-enospc:basis.npy", "basis.npy");
}

#[test]
fn a_predictions_write_failing_midway_leaves_nothing_and_reruns_to_identical_outputs() {
    // The first block (row group) is in the file, the footer is not.
    torn_write_then_rerun(
        "predict",
        4,
        "predictions-write-enospc:1",
        "predictions.parquet",
    );
}

#[test]
fn a_training_on_a_really_full_file_system_fails_at_once_then_resumes_with_room() {
    let Some(fs) = Tmpfs::mount_or_skip("4m") else {
        return;
    };
    let p = prepared();
    let reference = p.copy("ref");
    let expected = checkpoints(&reference, train_ok(&reference, &[]));
    let ws = fs.path().join("ws");
    copy_dir(&p.copy("tmpfs-source"), &ws);

    // Room for the catalog's journal and half the run's 14 checkpoints of 8.1 KiB: refused
    // before the first step, with both figures, twice; nothing registered, nothing left.
    let free = fsgp::store::space::free_bytes(fs.path()).unwrap();
    let filler = fs.path().join("filler");
    let room = fsgp::store::catalog::WAL_BOUND_BYTES + 7 * 8300;
    std::fs::write(&filler, vec![0x5au8; (free - room) as usize]).unwrap();
    for attempt in 0..2 {
        let out = pipeline(&ws, TRAIN);
        let err = stderr(&out);
        assert!(
            !out.status.success(),
            "trained on a full file system: {err}"
        );
        let id = train_run_id(&ws);
        for part in [
            format!(
                "train run {id}: writing the 14 checkpoints this run has left (all kept) \
                     and the catalog's journal needs "
            ),
            ", the workspace's file system has ".to_string(),
        ] {
            assert!(
                err.contains(&part),
                "{attempt}: {part:?} missing from: {err}"
            );
        }
        assert!(
            !err.contains("epoch 1/"),
            "{attempt}: a step was taken: {err}"
        );
        assert!(checkpoints(&ws, id).is_empty(), "{attempt}");
        assert_eq!(
            count(&ws, "SELECT count(*) FROM stage_runs WHERE stage = 'train'"),
            1
        );
    }

    // With room made, the same command takes the failed run up under its own id and ends
    // with the bytes of an undisturbed run.
    std::fs::remove_file(&filler).unwrap();
    let out = train_with(&ws, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let id = train_run_id(&ws);
    assert_eq!(
        count(&ws, "SELECT count(*) FROM stage_runs WHERE stage = 'train'"),
        1
    );
    assert_eq!(checkpoints(&ws, id), expected);
}
