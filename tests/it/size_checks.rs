//! Every size that decides an allocation is checked before anything is allocated or
//! recorded (issue 29): svd's R ≤ min(N, D) and M ≤ N, train's M against where its inducing
//! inputs come from, the memory estimates of svd and of a training step against the
//! machine's available memory, and `--epochs` within its limit, with step counts in closed
//! form so that `status` of a run of a million epochs returns at once. Each refusal exits 1
//! with its message and leaves the workspace's files and the catalog's runs as they were.

use crate::common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::toy::{catalog, crash_at, prepare, train_args, STEPS};
use common::*;

/// A catalog run: id, stage, status, error.
type Run = (i64, String, String, Option<String>);

/// The workspace's files and the catalog's runs: what a refused command must leave
/// unchanged.
fn state(ws: &Path) -> (Vec<String>, Vec<Run>) {
    let conn = catalog(ws);
    let mut stmt = conn
        .prepare("SELECT id, stage, status, error FROM stage_runs ORDER BY id")
        .unwrap();
    let runs = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    (listing(ws), runs)
}

/// `pipeline --workspace WS ARGS` with the environment `env` added.
fn pipeline_env(ws: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(pipeline_bin());
    cmd.arg("--workspace").arg(ws).args(args);
    cmd.env_remove("FSGP_WORKSPACE")
        .env_remove("FSGP_AVAILABLE_MEMORY_BYTES");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("running pipeline")
}

/// Runs `args` (with `env`), which must exit 1 with every one of `messages` on stderr and
/// change neither the workspace's files nor the catalog's runs; returns stderr.
fn assert_refused(ws: &Path, args: &[&str], env: &[(&str, &str)], messages: &[&str]) -> String {
    let before = state(ws);
    let out = pipeline_env(ws, args, env);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{args:?} {env:?}: {err}");
    for m in messages {
        assert!(err.contains(m), "{args:?}: expected {m:?} in: {err}");
    }
    assert_eq!(state(ws), before, "{args:?} registered or left something");
    err
}

#[test]
fn svd_refuses_a_rank_above_min_n_d_inducing_above_n_and_what_does_not_fit() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    prepare(&ws); // 900 training rows, D = 60; svd run 2 at R = 8, M = 16.
    let svd = |rank: &'static str, m: &'static str| -> Vec<&'static str> {
        vec!["svd", "--dataset", "toy", "--rank", rank, "--inducing", m]
    };
    assert_refused(
        &ws,
        &svd("61", "16"),
        &[],
        &[
            "--rank 61 exceeds min(N, D) = min(900, 60) of the training split of 'toy'",
            "give --rank ≤ 60",
        ],
    );
    assert_refused(
        &ws,
        &svd("8", "901"),
        &[],
        &[
            "--inducing 901: the M inducing inputs are k-means centroids of 900 rows",
            "give --inducing ≤ 900",
        ],
    );
    let mut sampled = svd("8", "901");
    sampled.extend(["--kmeans-max-rows", "500"]);
    assert_refused(&ws, &sampled, &[], &["give --inducing ≤ 500"]);
    // R = 9, p = 20 on D = 60: Q and B are 2 × 60 × 29 f64 = 27.2 KiB; k-means++ holds
    // X̃ᵀ (60 × 9 f32), its sample of all 900 rows (9 f32 and a distance each) and three
    // 16 × 9 f64 centroid arrays: 2160 + 39 600 + 3456 bytes = 44.2 KiB.
    assert_refused(
        &ws,
        &svd("9", "16"),
        &[("FSGP_AVAILABLE_MEMORY_BYTES", "20000")],
        &[
            "svd needs about 44.2 KiB (its passes hold Q and B, two D×k f64 matrices with \
             k = --rank + --oversample: 27.2 KiB; A's k-means initialisation 44.2 KiB)",
            "this machine has 19.5 KiB available (MemAvailable); lower --rank or --oversample",
        ],
    );
    // A finished run is reused whatever memory there is now.
    let out = pipeline_env(
        &ws,
        &svd("8", "16"),
        &[("FSGP_AVAILABLE_MEMORY_BYTES", "1000")],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("already done (run 2)"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn train_refuses_inducing_beyond_its_source_and_absurd_factors() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    prepare(&ws);
    let refused = |overrides: &[&str], messages: &[&str]| {
        assert_refused(&ws, &train_args(overrides), &[], messages);
    };
    refused(
        &["--inducing", "901"],
        &[
            "--inducing 901 with --inducing-inputs subspace: the inducing inputs are k-means \
             centroids of the N = 900 training rows of 'toy', so M can be at most N = 900",
            "give --inducing ≤ 900",
        ],
    );
    refused(
        &["--inducing", "901", "--inducing-inputs", "fixed-rows"],
        &["the inducing inputs are M distinct rows of the N = 900 training rows"],
    );
    refused(
        &["--inducing", "17"],
        &[
            "--inducing 17 with --inducing-inputs subspace: the inducing inputs start at the \
             k-means centroids of svd run 2, which initialised 16; give --inducing ≤ 16",
        ],
    );
    // P = 10⁸ against the machine's real available memory: ~1.2 TiB, more than any has.
    let err = assert_refused(
        &ws,
        &train_args(&["--factors", "100000000"]),
        &[],
        &[
            "training needs about",
            "the M×M and M×B matrices of each of the P = 100000000 GPs (M = 16, B = 64)",
            "available (MemAvailable); lower --inducing or --factors",
        ],
    );
    assert!(err.contains("TiB"), "{err}");
}

#[test]
fn independent_gps_over_many_labels_are_refused_by_the_memory_estimate() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let src = dir.path().join("src");
    let src_s = src.to_str().unwrap();
    for args in [
        &[
            "synth",
            "--out",
            src_s,
            "--rows",
            "900",
            "--test-rows",
            "50",
            "--features",
            "60",
            "--labels",
            "2000",
            "--seed",
            "3",
        ][..],
        &[
            "ingest",
            "--name",
            "many",
            "--train",
            &format!("{src_s}/train.txt"),
            "--test",
            &format!("{src_s}/test.txt"),
        ],
        &[
            "svd",
            "--dataset",
            "many",
            "--rank",
            "8",
            "--inducing",
            "16",
        ],
    ] {
        let out = pipeline(&ws, args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    }
    let small = [("FSGP_AVAILABLE_MEMORY_BYTES", "67108864")]; // 64 MiB
    let train = |extra: &[&'static str]| -> Vec<&'static str> {
        let mut args = vec![
            "train",
            "--dataset",
            "many",
            "--batch",
            "64",
            "--epochs",
            "1",
            "--max-steps",
            "2",
            "--threads",
            "2",
            "--no-final-elbo",
        ];
        args.extend(extra);
        args
    };
    // K = 2000 GPs: Φ = I alone is 2000² doubles per copy.
    assert_refused(
        &ws,
        &train(&["--latent", "independent"]),
        &small,
        &[
            "training needs about",
            "the M×M and M×B matrices of each of the P = K = 2000 GPs, one per label (M = 16, \
             B = 64)",
            "This machine has 64.0 MiB available (MemAvailable); lower --inducing, or use \
             --latent factor",
        ],
    );
    // The factor model with a few GPs fits in the same memory.
    let out = pipeline_env(&ws, &train(&["--factors", "3"]), &small);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// Runs `args` and waits at most `limit` for it; None if it was still running (then killed).
fn run_within(ws: &Path, args: &[&str], limit: Duration) -> Option<Output> {
    let mut child = Command::new(pipeline_bin())
        .arg("--workspace")
        .arg(ws)
        .args(args)
        .env_remove("FSGP_WORKSPACE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            child.wait().unwrap();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(child.wait_with_output().unwrap())
}

#[test]
fn absurd_epochs_are_refused_and_status_of_a_million_epochs_returns_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    prepare(&ws);
    for (args, message) in [
        (
            ["--epochs", "9223372036854775807"],
            "for '--epochs <EPOCHS>': 9223372036854775807 is not in 1..=1000000",
        ),
        (
            ["--release-hyper-after", "1000001"],
            "for '--release-hyper-after <E0>': 1000001 is not in 1..=1000000",
        ),
    ] {
        let before = state(&ws);
        let out = pipeline(&ws, &train_args(&args));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(message),
            "{args:?}: expected {message:?} in: {err}"
        );
        assert_eq!(state(&ws), before, "{args:?} registered or left something");
    }
    // The limit itself is accepted: a run of 10⁶ epochs, stopped by a kill at step 14. Two
    // checkpoints kept, not the toy's every one: train's disk check prices what the run
    // will write, and 2 285 715 checkpoints kept (17.7 GiB) are refused on a machine with
    // less free, which is not what this test is about.
    let id = crash_at(
        &ws,
        &["--epochs", "1000000", "--keep-checkpoints", "2"],
        "checkpoint-renamed:14",
    );
    let out = run_within(&ws, &["status", "--json"], Duration::from_secs(120))
        .expect("status of a run of a million epochs did not return within 120 s");
    assert!(out.status.success(), "{}", stderr(&out));
    let run = train_summary(&ws, id);
    // 16 minibatches in every epoch of the toy plan (STEPS over its 6 epochs).
    assert_eq!(run["steps_total"], (STEPS / 6) * 1_000_000);
    assert_eq!(run["steps_done"], 7);
    // A run recorded before the limit, with 2⁶³ − 1 epochs (what a summed step count
    // spun on for over 10 minutes): the closed form saturates at once. (Status reads the
    // configuration in force, `run_options.params`, which a run records beside the one it
    // started with.)
    let set_epochs = |epochs: u64| {
        for (table, key) in [("stage_runs", "id"), ("run_options", "stage_run_id")] {
            catalog(&ws)
                .execute(
                    &format!(
                        "UPDATE {table} SET params = json_set(params, '$.epochs', ?2) \
                         WHERE {key} = ?1"
                    ),
                    rusqlite::params![id, epochs as i64],
                )
                .unwrap();
        }
    };
    set_epochs(i64::MAX as u64);
    let out = run_within(&ws, &["status"], Duration::from_secs(120))
        .expect("status of a run of 2⁶³ − 1 epochs did not return within 120 s");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!("7/{}", u64::MAX)),
        "{}",
        stdout(&out)
    );
    set_epochs(1_000_000);
    // Resuming it starts at once too (its step count is the same closed form).
    let resumed = run_within(
        &ws,
        &["train", "--resume", &id.to_string(), "--max-steps", "21"],
        Duration::from_secs(300),
    )
    .expect("resuming the run did not return");
    assert!(resumed.status.success(), "{}", stderr(&resumed));
}
