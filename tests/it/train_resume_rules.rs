//! Checkpoint retention (`--keep-checkpoints`) and what `pipeline train --resume` may
//! change, end to end on the toy workspace of `common::toy`: retention keeps exactly the
//! last N plus the final checkpoint (files and catalog rows) and a pruned run resumes to the
//! bytes of an unpruned one; `--resume ID --max-steps S` applies S, prints and records the
//! change and ends as an uninterrupted run with S would; options that cannot change are
//! refused before anything changes; runs from before retention keep every checkpoint.

use crate::common;
use common::toy::*;
use common::*;
use serde_json::json;
use std::path::Path;
use std::process::Output;

/// `pipeline train --resume ID EXTRA...`.
fn resume(ws: &Path, id: i64, extra: &[&str]) -> Output {
    let id = id.to_string();
    let mut args = vec!["train", "--resume", id.as_str()];
    args.extend(extra);
    pipeline(ws, &args)
}

/// Names of the checkpoint files in run `id`'s directory, sorted.
/// The checkpoint files in run `id`'s directory (beside them only its marker).
fn files(ws: &Path, id: i64) -> Vec<String> {
    let dir = ws.join(format!("train/toy-linear.run{id}"));
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name != ".fsgp-run.json")
        .collect();
    names.sort();
    names
}

fn file_names(steps: &[u64]) -> Vec<String> {
    steps
        .iter()
        .map(|s| format!("ckpt-{s:09}.parquet"))
        .collect()
}

/// Run `id`'s `run_options` row: (parameters in force, steering options, changes, reusable).
fn run_options(
    ws: &Path,
    id: i64,
) -> (
    serde_json::Value,
    serde_json::Value,
    serde_json::Value,
    bool,
) {
    catalog(ws)
        .query_row(
            "SELECT params, options, changes, reusable FROM run_options WHERE stage_run_id = ?1",
            [id],
            |r| {
                let json = |i: usize| -> rusqlite::Result<serde_json::Value> {
                    Ok(serde_json::from_str(&r.get::<_, String>(i)?).unwrap())
                };
                Ok((json(0)?, json(1)?, json(2)?, r.get(3)?))
            },
        )
        .unwrap()
}

fn steps(c: &std::collections::BTreeMap<u64, Vec<u8>>) -> Vec<u64> {
    c.keys().copied().collect()
}

#[test]
fn retention_keeps_the_last_n_plus_the_final_and_a_pruned_run_resumes_to_the_same_bytes() {
    let p = prepared();
    let (ws_all, ws_keep) = (p.copy("all"), p.copy("keep"));
    let run_all = train_ok(&ws_all, &[]);
    let all = checkpoints(&ws_all, run_all);
    let run_keep = train_ok(&ws_keep, &["--keep-checkpoints", "2"]);
    let kept = checkpoints(&ws_keep, run_keep);

    // The last 2 and the final one, rows and files; the bytes are those of the full run.
    assert_eq!(steps(&kept), [84, 91, STEPS]);
    assert_eq!(files(&ws_keep, run_keep), file_names(&[84, 91, STEPS]));
    for (step, bytes) in &kept {
        assert!(
            bytes == &all[step],
            "step {step} differs from the unpruned run's"
        );
    }
    // Recorded with the run, outside its configuration (its identity).
    let (in_force, options, changes, reusable) = run_options(&ws_keep, run_keep);
    assert_eq!(options["keep_checkpoints"], json!({ "last": 2 }));
    assert_eq!(in_force, run_params(&ws_keep, run_keep));
    assert_eq!(run_params(&ws_keep, run_keep), run_params(&ws_all, run_all));
    assert_eq!((changes, reusable), (json!([]), true));

    // Killed after pruning began (a checkpoint renamed but not registered), and between
    // unregistering old checkpoints and deleting their files: the resumed run prunes the
    // leftovers and ends with exactly the files and bytes of the undisturbed run.
    for (point, left_over) in [
        ("checkpoint-renamed:56", 56),
        ("checkpoints-unregistered:7", 7),
    ] {
        let ws = p.copy(&point.replace(':', "-"));
        let id = crash_at(&ws, &["--keep-checkpoints", "2"], point);
        let registered = steps(&checkpoints(&ws, id));
        assert!(registered.len() <= 3, "{point}: {registered:?}");
        assert!(!registered.contains(&left_over), "{point}: {registered:?}");
        assert!(
            files(&ws, id).contains(&file_names(&[left_over])[0]),
            "{point}: the unregistered file should be there"
        );
        let out = resume(&ws, id, &[]);
        assert!(out.status.success(), "{point}: {}", stderr(&out));
        assert_eq!(checkpoints(&ws, id), kept, "{point}");
        assert_eq!(files(&ws, id), files(&ws_keep, run_keep), "{point}");
    }

    // The default keeps 5 and the final one.
    let ws = p.copy("default");
    let out = pipeline(&ws, &TRAIN[..TRAIN.len() - 2]);
    assert!(out.status.success(), "{}", stderr(&out));
    let id = train_run_id(&ws);
    assert_eq!(steps(&checkpoints(&ws, id)), [63, 70, 77, 84, 91, STEPS]);
}

#[test]
fn resume_applies_max_steps_records_it_and_ends_as_an_uninterrupted_run_would() {
    let p = prepared();
    let (ws_ref, ws) = (p.copy("ref"), p.copy("resumed"));
    let run_ref = train_ok(&ws_ref, &["--max-steps", "35"]);
    let reference = checkpoints(&ws_ref, run_ref);
    assert_eq!(steps(&reference), [7, 14, 21, 28, 35]);

    let id = crash_at(&ws, &["--max-steps", "21"], "checkpoint-renamed:14");
    let out = resume(&ws, id, &["--max-steps", "35", "--eval-every", "1"]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(&format!("run {id}: --max-steps 21 → 35")),
        "{err}"
    );
    assert!(
        err.contains(&format!("run {id}: --eval-every 0 → 1")),
        "{err}"
    );
    assert_eq!(err.matches("changed on resume").count(), 2, "{err}");
    assert_eq!(run_status(&ws, id), "ok");

    // Checkpoints written after the change are those of the uninterrupted run with
    // --max-steps 35, byte for byte; the one written before says --max-steps 21.
    let got = checkpoints(&ws, id);
    assert_eq!(steps(&got), steps(&reference));
    for step in [14, 21, 28, 35] {
        assert!(got[&step] == reference[&step], "step {step} differs");
    }
    assert_eq!(read_ckpt(&ws, id, 7).config["max_steps"], 21);
    assert_eq!(
        metrics(&ws, id, "epoch_elbo"),
        metrics(&ws_ref, run_ref, "epoch_elbo")
    );
    assert!(!metrics(&ws, id, "P@1").is_empty(), "--eval-every applied");

    // History is not rewritten: the run's params are what it started with; the record
    // holds the configuration in force and the change.
    assert_eq!(run_params(&ws, id)["max_steps"], 21);
    let (in_force, options, changes, reusable) = run_options(&ws, id);
    assert_eq!(in_force["max_steps"], 35);
    assert_eq!(options["eval_every"], 1);
    assert!(reusable);
    assert_eq!(
        changes,
        json!([
            { "step": 7, "option": "--max-steps", "old": "21", "new": "35" },
            { "step": 7, "option": "--eval-every", "old": "0", "new": "1" },
        ])
    );

    // A later train with the options in force finds the run; one with the options it
    // started with is told why the run is not reused, and computes anew.
    let again = pipeline(&ws, &train_args(&["--max-steps", "35"]));
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(
        stderr(&again).contains("already done"),
        "{}",
        stderr(&again)
    );
    assert_eq!(train_run_id(&ws), id);
    let original = pipeline(&ws, &train_args(&["--max-steps", "21"]));
    assert!(original.status.success(), "{}", stderr(&original));
    assert!(
        stderr(&original).contains(&format!(
            "run {id} started with these parameters but was resumed with other options \
             (--max-steps 21 → 35), so it is not reused"
        )),
        "{}",
        stderr(&original)
    );
    assert_ne!(train_run_id(&ws), id);
}

#[test]
fn options_that_cannot_change_are_refused_and_change_nothing() {
    let p = prepared();
    let ws = p.copy("refused");
    let id = crash_at(&ws, &["--max-steps", "21"], "checkpoint-renamed:14");
    // What the crash left is collected by the first command that writes; refused or not,
    // every one after must leave the workspace as it is then.
    create_workspace(&ws);
    let before = (listing(&ws), checkpoints(&ws, id), run_options(&ws, id));
    let cases: [(&[&str], &[String]); 4] = [
        (
            &["--lr", "0.5"],
            &[format!(
                "--lr 0.5: run {id} has 0.01, and it cannot change on resume"
            )],
        ),
        (
            &["--seed", "12", "--factors", "4"],
            &[
                format!("--seed 12: run {id} has 11"),
                format!("--factors 4: run {id} has 3"),
            ],
        ),
        (
            &["--dataset", "other"],
            &[format!("--dataset other: run {id} has toy")],
        ),
        (
            &["--max-steps", "3"],
            &[format!("run {id} is at step 7 (epoch 1), past the 3 steps")],
        ),
    ];
    for (args, messages) in cases {
        let out = resume(&ws, id, args);
        let err = stderr(&out);
        assert!(!out.status.success(), "{args:?} was accepted");
        for m in messages {
            assert!(err.contains(m.as_str()), "{args:?}: {err}");
        }
        assert_eq!(run_status(&ws, id), "interrupted", "{args:?}");
        let after = (listing(&ws), checkpoints(&ws, id), run_options(&ws, id));
        assert!(after == before, "{args:?} changed the workspace");
    }

    // Values equal to the run's are accepted; a new thread count is applied with a warning,
    // and the run is no longer reused for either count.
    let out = resume(&ws, id, &["--lr", "0.01", "--seed", "11", "--threads", "1"]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains(&format!("run {id}: --threads 2 → 1")), "{err}");
    assert!(err.contains("numbers will differ"), "{err}");
    assert_eq!(err.matches("changed on resume").count(), 1, "{err}");
    let (in_force, _, _, reusable) = run_options(&ws, id);
    assert_eq!((in_force["threads"].clone(), reusable), (json!(1), false));
    let out = pipeline(&ws, &train_args(&["--max-steps", "21", "--threads", "1"]));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_ne!(train_run_id(&ws), id, "{}", stderr(&out));
}

#[test]
fn a_run_from_before_retention_keeps_every_checkpoint_when_resumed() {
    let p = prepared();
    let ws = p.copy("legacy");
    let id = crash_at(&ws, &["--keep-checkpoints", "1"], "checkpoint-renamed:14");
    // What a catalog written before schema 3 holds: no run_options row.
    catalog(&ws)
        .execute("DELETE FROM run_options WHERE stage_run_id = ?1", [id])
        .unwrap();
    let out = resume(&ws, id, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let mut expected: Vec<u64> = (7..=STEPS).step_by(7).collect();
    expected.push(STEPS);
    assert_eq!(steps(&checkpoints(&ws, id)), expected);
    let (_, options, _, _) = run_options(&ws, id);
    assert_eq!(options["keep_checkpoints"], "all");
}
