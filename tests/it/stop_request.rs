//! A stop request (`fsgp::stop`): Ctrl-C to the `pipeline` binary, or a token an embedding
//! program sets. Training stops after a step with a checkpoint there, and the same command
//! takes the run up and ends with an uninterrupted run's bytes; a second Ctrl-C ends the
//! process at once and the run resumes as after a kill; ingest and the svd stop between
//! blocks and passes, registering nothing, and run again whole.

use crate::common;
use common::toy::*;
use common::*;
use fsgp::stop::StopToken;

use clap::Parser;

/// The catalog's (status, error) of run `id`.
fn recorded(ws: &std::path::Path, id: i64) -> (String, Option<String>) {
    catalog(ws)
        .query_row(
            "SELECT status, error FROM stage_runs WHERE id = ?1",
            [id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap()
}

/// Runs TRAIN with `FSGP_FAILPOINT=point`; returns its output.
fn train_with_failpoint(ws: &std::path::Path, point: &str) -> std::process::Output {
    std::process::Command::new(pipeline_bin())
        .arg("--workspace")
        .arg(ws)
        .args(TRAIN)
        .env("FSGP_FAILPOINT", point)
        .env_remove("FSGP_WORKSPACE")
        .output()
        .unwrap()
}

#[test]
fn ctrl_c_stops_training_at_a_checkpoint_and_the_same_command_ends_as_an_uninterrupted_run() {
    let p = prepared();
    let reference = p.copy("reference");
    let run_ref = train_ok(&reference, &[]);
    let expected = checkpoints(&reference, run_ref);
    let elbo = metrics(&reference, run_ref, "elbo_exact");
    let epochs = metrics(&reference, run_ref, "epoch_elbo");

    // Ctrl-C at step 20, between the checkpoints at 14 and 21 (every 7 steps).
    let ws = p.copy("stopped");
    let out = train_with_failpoint(&ws, "train-ctrl-c:20");
    let log = stderr(&out);
    assert_eq!(out.status.code(), Some(130), "{log}");
    assert!(
        log.contains("stopped on request after step 20 (epoch 2), checkpoint written at step 20"),
        "{log}"
    );
    let id = train_run_id(&ws);
    let (status, error) = recorded(&ws, id);
    assert_eq!(status, "failed");
    assert!(error.unwrap().contains("stopped on request after step 20"));
    // Nothing after step 20 ran: the checkpoints are the reference's up to it, plus one at
    // step 20 itself, so no step is lost.
    let kept = checkpoints(&ws, id);
    assert_eq!(kept.keys().copied().collect::<Vec<_>>(), [7, 14, 20]);
    for step in [7, 14] {
        assert_eq!(kept[&step], expected[&step], "step {step}");
    }
    assert!(metrics(&ws, id, "elbo_exact").is_empty());
    let verify = pipeline(&ws, &["verify"]);
    assert!(verify.status.success(), "{}", stderr(&verify));

    // The same command takes the run up from step 20 and ends with the reference's bytes.
    let again = pipeline(&ws, TRAIN);
    let log = stderr(&again);
    assert!(again.status.success(), "{log}");
    assert!(
        log.contains(&format!("run {id} with these parameters failed")),
        "{log}"
    );
    assert!(log.contains("resuming it"), "{log}");
    assert_eq!(train_run_id(&ws), id, "the same run, taken up");
    assert_eq!(recorded(&ws, id).0, "ok");
    let mut resumed = checkpoints(&ws, id);
    assert!(resumed.remove(&20).is_some());
    assert_eq!(resumed, expected, "an uninterrupted run's checkpoints");
    assert_eq!(metrics(&ws, id, "elbo_exact"), elbo);
    assert_eq!(metrics(&ws, id, "epoch_elbo"), epochs);
}

#[test]
fn a_second_ctrl_c_ends_the_process_at_once_and_the_run_resumes_as_after_a_kill() {
    let p = prepared();
    let reference = p.copy("reference");
    let run_ref = train_ok(&reference, &[]);
    let expected = checkpoints(&reference, run_ref);
    let elbo = metrics(&reference, run_ref, "elbo_exact");

    let ws = p.copy("twice");
    let out = train_with_failpoint(&ws, "train-ctrl-c-twice:20");
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    assert!(!stderr(&out).contains("stopped on request"));
    let id = train_run_id(&ws);
    // Ended without a word to the catalog: found dead, as after SIGKILL.
    assert_eq!(run_status(&ws, id), "interrupted");
    let kept: Vec<u64> = checkpoints(&ws, id).keys().copied().collect();
    assert_eq!(kept, [7, 14]);
    assert_resumes_to(&ws, id, &expected, &elbo);
}

/// Runs `pipeline ARGS…` in this process, as the Python package does, with `stop` already
/// requested.
fn run_stopped(ws: &std::path::Path, args: &[&str]) -> anyhow::Error {
    let argv = ["pipeline", "--workspace", ws.to_str().unwrap()]
        .into_iter()
        .chain(args.iter().copied());
    let cli = fsgp::cli::args::Cli::try_parse_from(argv).unwrap();
    let stop = StopToken::new();
    stop.request();
    let err = fsgp::cli::run(cli, &stop).expect_err("a stop was requested");
    assert!(fsgp::cli::is_stop(&err), "{err:#}");
    err
}

#[test]
fn a_requested_stop_ends_ingest_and_the_svd_registering_nothing_and_they_run_again_whole() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let src = dir.path().join("src");
    let synth = pipeline(
        &ws,
        &[
            "synth",
            "--out",
            src.to_str().unwrap(),
            "--rows",
            "300",
            "--test-rows",
            "50",
            "--features",
            "40",
            "--labels",
            "10",
            "--seed",
            "2",
        ],
    ); // fmt: skip
    assert!(synth.status.success(), "{}", stderr(&synth));
    let train = src.join("train.txt");
    let ingest = [
        "ingest",
        "--name",
        "toy",
        "--train",
        train.to_str().unwrap(),
    ];

    let err = run_stopped(&ws, &ingest);
    assert!(
        format!("{err:#}").contains("stopped on request while reading"),
        "{err:#}"
    );
    let id = newest_run(&ws, "ingest");
    assert_eq!(recorded(&ws, id).0, "failed");
    assert!(dataset_names(&ws).is_empty(), "nothing registered");
    assert!(
        listing(&ws).iter().all(|f| !f.starts_with("datasets/")),
        "{:?}",
        listing(&ws)
    );
    pipeline_ok(&ws, &ingest);
    assert_eq!(dataset_names(&ws), ["toy"]);

    let svd = ["svd", "--dataset", "toy", "--rank", "5", "--inducing", "8"];
    let err = run_stopped(&ws, &svd);
    assert!(
        format!("{err:#}").contains("stopped on request before basis pass 1"),
        "{err:#}"
    );
    let id = newest_run(&ws, "svd");
    assert_eq!(recorded(&ws, id).0, "failed");
    let svd_artifacts = "SELECT count(*) FROM artifacts WHERE stage_run_id IN \
         (SELECT id FROM stage_runs WHERE stage = 'svd')";
    assert_eq!(common::registered::query::<i64>(&ws, svd_artifacts), 0);
    pipeline_ok(&ws, &svd);

    // Training asked to stop before it starts takes one step and keeps it.
    let err = run_stopped(
        &ws,
        &[
            "train",
            "--dataset",
            "toy",
            "--epochs",
            "2",
            "--batch",
            "50",
        ],
    );
    assert!(
        format!("{err:#}").contains("after step 1 (epoch 1), checkpoint written at step 1"),
        "{err:#}"
    );
    let id = train_run_id(&ws);
    assert_eq!(
        checkpoints(&ws, id).keys().copied().collect::<Vec<_>>(),
        [1]
    );
}
