//! `pipeline status` on a small trained workspace: the training-runs table names each run
//! with its configuration, steps, checkpoints, bound and precision; `--json` carries the
//! same numbers; `status --run N` shows one run in full with the key–value metadata of its
//! Parquet files (checkpoints, chunks, predictions).

use crate::common;
use common::toy::{catalog, newest_run};
use common::*;
use fsgp::store::checkpoint::CHECKPOINT_FORMAT;
use fsgp::store::chunks::{read_chunk_metadata, CHUNK_FORMAT};
use fsgp::store::predictions::PREDICTIONS_FORMAT;
use std::path::Path;

/// Minibatches per epoch of the toy set: 900 rows in chunks of 200 (the last 100), shuffled
/// in windows of 2 chunks, B = 64: 7 + 7 + 2 or 5 + 7 + 4, whatever the order.
const STEPS_PER_EPOCH: u64 = 16;
const EPOCHS: u64 = 4;

/// Synthesises, ingests, factorises, trains (held-out metrics every 2 epochs), predicts and
/// evaluates a toy dataset in `dir/ws`; returns the workspace.
fn trained_workspace(dir: &Path) -> std::path::PathBuf {
    let spec = toy_spec(EPOCHS, "eval_every = 2\n", "top_k = 5\n");
    let spec_path = dir.join("toy.toml");
    std::fs::write(&spec_path, spec).unwrap();
    let ws = dir.join("ws");
    let out = pipeline(&ws, &["run", spec_path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    ws
}

/// The newest value of metric `name` of a run (and its step).
fn metric(ws: &Path, run: i64, name: &str) -> (f64, Option<i64>) {
    catalog(ws)
        .query_row(
            "SELECT value, step FROM metrics WHERE stage_run_id = ?1 AND name = ?2 \
             ORDER BY step DESC, id DESC LIMIT 1",
            rusqlite::params![run, name],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * a.abs().max(1.0)
}

#[test]
fn status_shows_training_runs_in_the_table_and_in_json() {
    let dir = tempfile::tempdir().unwrap();
    let ws = trained_workspace(dir.path());
    let train = newest_run(&ws, "train");
    let evaluate = newest_run(&ws, "evaluate");
    let steps = STEPS_PER_EPOCH * EPOCHS;
    let (elbo, elbo_step) = metric(&ws, train, "elbo_exact");
    assert_eq!(elbo_step, Some(steps as i64));
    let (epoch_elbo, last_epoch) = metric(&ws, train, "epoch_elbo");
    assert_eq!(last_epoch, Some(EPOCHS as i64));
    let (p1, _) = metric(&ws, evaluate, "P@1");
    let (p5, _) = metric(&ws, evaluate, "P@5");
    let checkpoints: i64 = catalog(&ws)
        .query_row(
            "SELECT count(*) FROM checkpoints WHERE stage_run_id = ?1",
            [train],
            |r| r.get(0),
        )
        .unwrap();

    // The table: one line naming the run, its configuration, steps, checkpoints, the exact
    // bound, the last epoch's mean bound and P@1/3/5 of the evaluate run.
    let out = pipeline(&ws, &["status"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let section = text
        .split("training runs (1)")
        .nth(1)
        .unwrap_or_else(|| panic!("no training runs section:\n{text}"));
    let line = section
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("#{train} ")))
        .unwrap_or_else(|| panic!("run {train} not in the table:\n{text}"));
    for want in [
        "toy".to_string(),
        "linear".to_string(),
        "16/3/8".to_string(),
        format!("{steps}/{steps}"),
        format!(" {checkpoints} "),
        format!("{elbo:.4e}"),
        format!("{epoch_elbo:.4e}"),
        format!("{:.2}/", 100.0 * p1),
        format!("/{:.2}", 100.0 * p5),
        format!("evaluate #{evaluate} on test at step {steps}"),
        " ok ".to_string(),
    ] {
        assert!(line.contains(&want), "{want:?} not in {line:?}");
    }

    // --json: the same numbers.
    let json = status_json(&ws);
    let runs = json["train_runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1);
    let t = &runs[0];
    assert_eq!(t["id"], train);
    assert_eq!(t["status"], "ok");
    assert_eq!(t["dataset"], "toy");
    assert_eq!(t["kernel"], "linear");
    assert_eq!(
        (&t["inducing"], &t["factors"], &t["rank"]),
        (&16.into(), &3.into(), &8.into())
    );
    assert_eq!((&t["batch"], &t["epochs"]), (&64.into(), &EPOCHS.into()));
    assert_eq!(t["steps_done"], steps);
    assert_eq!(t["steps_total"], steps);
    assert_eq!(t["checkpoints"], checkpoints);
    assert!(close(t["final_elbo"].as_f64().unwrap(), elbo));
    assert_eq!(t["last_epoch"]["epoch"], EPOCHS);
    assert!(close(
        t["last_epoch"]["mean_elbo"].as_f64().unwrap(),
        epoch_elbo
    ));
    let evaluation = &t["evaluations"][0];
    assert_eq!(evaluation["source"], "evaluate");
    assert_eq!(evaluation["evaluate_run"], evaluate);
    assert_eq!(evaluation["split"], "test");
    assert_eq!(evaluation["checkpoint_step"], steps);
    assert!(close(evaluation["p_at_1"].as_f64().unwrap(), p1));
    assert!(close(evaluation["p_at_5"].as_f64().unwrap(), p5));
    // The held-out figures of the last evaluated epoch, from the train run's own metrics.
    let held_out = &t["held_out"];
    assert_eq!(held_out["source"], "held_out");
    assert_eq!(held_out["epoch"], EPOCHS);
    let held_p1 = catalog(&ws)
        .query_row(
            "SELECT value FROM metrics WHERE stage_run_id = ?1 AND name = 'P@1' AND step = ?2",
            rusqlite::params![train, EPOCHS as i64],
            |r| r.get::<_, f64>(0),
        )
        .unwrap();
    assert!(close(held_out["p_at_1"].as_f64().unwrap(), held_p1));
    // The existing keys are still there.
    assert_eq!(dataset_names(&ws), vec!["toy"]);
}

#[test]
fn status_of_one_run_shows_its_files_and_their_parquet_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let ws = trained_workspace(dir.path());
    let train = newest_run(&ws, "train");
    let steps = STEPS_PER_EPOCH * EPOCHS;
    let (ckpt_path, ckpt_checksum): (String, String) = catalog(&ws)
        .query_row(
            "SELECT path, checksum FROM checkpoints WHERE stage_run_id = ?1 \
             ORDER BY step DESC LIMIT 1",
            [train],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();

    // A training run: its parameters, checkpoints with their footer metadata, metrics.
    let out = pipeline(&ws, &["status", "--run", &train.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for want in [
        format!("run #{train} (train): ok"),
        "dataset = \"toy\"".to_string(),
        format!("step {steps} (epoch {EPOCHS})"),
        ckpt_path.clone(),
        ckpt_checksum.clone(),
        format!("fsgp.format = {CHECKPOINT_FORMAT}"),
        format!("fsgp.step = {steps}"),
        "fsgp.config = {".to_string(),
        "\"dataset\":\"toy\"".to_string(),
        "elbo_exact=".to_string(),
    ] {
        assert!(text.contains(&want), "{want:?} not in:\n{text}");
    }
    let json = run_json(&ws, train);
    assert_eq!(json["run"]["id"], train);
    assert_eq!(json["run"]["stage"], "train");
    assert_eq!(json["train"]["steps_done"], steps);
    let last = json["checkpoints"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["path"], ckpt_path.as_str());
    assert_eq!(last["step"], steps);
    let on_disk = read_chunk_metadata(&ws.join(&ckpt_path)).unwrap();
    assert_eq!(on_disk.len(), last["metadata"].as_object().unwrap().len());
    for (k, v) in &on_disk {
        assert_eq!(last["metadata"][k], v.as_str(), "{k}");
    }
    assert!(json["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["name"] == "elbo_exact"));

    // A predict run: its predictions file and the file's metadata.
    let predict = newest_run(&ws, "predict");
    let json = run_json(&ws, predict);
    let file = &json["artifacts"][0];
    assert_eq!(file["kind"], "predictions");
    assert_eq!(file["metadata"]["fsgp.format"], PREDICTIONS_FORMAT);
    assert_eq!(file["metadata"]["fsgp.train_run"], train.to_string());
    assert_eq!(file["metadata"]["fsgp.checkpoint_step"], steps.to_string());

    // An ingest run: every chunk with its metadata.
    let ingest = newest_run(&ws, "ingest");
    let json = run_json(&ws, ingest);
    let chunks: Vec<_> = json["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["kind"] == "chunk")
        .collect();
    assert_eq!(chunks.len(), 5 + 1, "5 train chunks and 1 test chunk");
    for c in chunks {
        assert_eq!(c["metadata"]["fsgp.format"], CHUNK_FORMAT);
        assert_eq!(c["metadata"]["fsgp.dataset"], "toy");
    }

    // A damaged file is reported, not fatal.
    std::fs::write(ws.join(&ckpt_path), b"garbage").unwrap();
    let out = pipeline(&ws, &["status", "--run", &train.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("(metadata unreadable: "),
        "{}",
        stdout(&out)
    );

    // An unknown run: an error that points to the list.
    let out = pipeline(&ws, &["status", "--run", "999"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("no run 999"), "{}", stderr(&out));
    assert!(stderr(&out).contains("pipeline status"), "{}", stderr(&out));
}

fn run_json(ws: &Path, run: i64) -> serde_json::Value {
    let out = pipeline(ws, &["status", "--run", &run.to_string(), "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("status --run --json prints JSON")
}

/// `pipeline --help` and the main commands' `--help` end with examples, and every example
/// is a command line the parser accepts (so the examples cannot drift from the flags).
#[test]
fn help_shows_examples_that_parse() {
    use clap::Parser;
    use fsgp::cli::args::Cli;
    let dir = tempfile::tempdir().unwrap();
    let commands = [
        "", "ingest", "svd", "train", "predict", "evaluate", "run", "report", "status",
    ];
    for command in commands {
        let mut args: Vec<&str> = command.split_whitespace().collect();
        args.push("--help");
        let out = pipeline(dir.path(), &args);
        assert!(out.status.success(), "{}", stderr(&out));
        let help = stdout(&out);
        let examples = help
            .split("Examples:")
            .nth(1)
            .unwrap_or_else(|| panic!("no examples in `pipeline {command} --help`:\n{help}"));
        // Join continuation lines, drop comments, keep the command lines.
        let joined = examples.replace("\\\n", " ");
        let lines: Vec<&str> = joined
            .lines()
            .map(|l| l.split(" # ").next().unwrap().trim())
            .filter(|l| l.starts_with("pipeline "))
            .collect();
        assert!(!lines.is_empty(), "no example lines for {command:?}");
        for line in lines {
            let words: Vec<&str> = line.split_whitespace().collect();
            if !command.is_empty() {
                assert_eq!(words[1], command, "{line}");
            }
            if let Err(e) = Cli::try_parse_from(&words) {
                panic!("example `{line}` does not parse: {e}");
            }
        }
    }
}

#[test]
fn status_of_a_directory_without_a_workspace_is_empty_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("nothing-run-here");
    let out = pipeline(&ws, &["status"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("no workspace here yet: nothing has been run in it"),
        "{}",
        stdout(&out)
    );
    let json = status_json(&ws);
    assert_eq!(json["datasets"], serde_json::json!([]), "{json}");
    assert_eq!(json["runs"], serde_json::json!([]), "{json}");
    assert!(!ws.exists(), "status created the workspace");
    let out = pipeline(&ws, &["status", "--run", "1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("there is no workspace at"),
        "{}",
        stderr(&out)
    );
}
