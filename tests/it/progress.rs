//! Progress as the command line shows it when standard error is not a terminal (as here):
//! the per-epoch lines of text by default, JSON lines with `--log-format jsonl`, and with
//! `--quiet` nothing of progress but the results (docs/progress.md).

use crate::common;
use common::toy::{copy_dir, newest_run, prepare, STEPS, TRAIN};
use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The fields every event of a kind has (docs/progress.md, "JSON lines").
const FIELDS: &[(&str, &[&str])] = &[
    ("started", &["task", "kind", "name", "total", "unit"]),
    ("steps", &["task", "done"]),
    (
        "epoch",
        &[
            "task",
            "epoch",
            "epochs",
            "mean_elbo",
            "seconds",
            "queue_wait",
            "cut",
        ],
    ),
    (
        "validation",
        &["task", "split", "epoch", "step", "seconds", "kind"],
    ),
    ("note", &["task", "level", "message"]),
    ("finished", &["task"]),
];

/// The toy run's epochs (`toy::TRAIN`).
const EPOCHS: u64 = 6;

/// The toy run with `extra` flags, in a copy `name` of the prepared workspace `base` (a
/// run done once is not run again in one workspace); the copy and the command's output.
fn train_with(base: &Path, name: &str, extra: &[&str]) -> (PathBuf, std::process::Output) {
    let ws = base.with_file_name(name);
    copy_dir(base, &ws);
    let mut args: Vec<&str> = TRAIN.to_vec();
    args.extend(["--eval-every", "2"]);
    args.extend(extra);
    let out = pipeline(&ws, &args);
    assert!(out.status.success(), "{extra:?}: {}", stderr(&out));
    (ws, out)
}

/// Every line of `text` parsed as a JSON object with the documented fields of its event.
fn events(text: &str) -> Vec<Value> {
    text.lines()
        .map(|line| {
            let event: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
            let name = event["event"].as_str().expect("an \"event\" field");
            let (_, fields) = FIELDS
                .iter()
                .find(|(n, _)| *n == name)
                .unwrap_or_else(|| panic!("undocumented event {name}: {line}"));
            for field in *fields {
                assert!(event.get(field).is_some(), "{name} without {field}: {line}");
            }
            event
        })
        .collect()
}

fn of_kind<'a>(events: &'a [Value], name: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["event"] == name).collect()
}

#[test]
fn train_prints_epoch_lines_json_lines_or_nothing_of_progress() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base");
    prepare(&base);

    // Not a terminal, no flag: the lines of text, one per epoch and held-out evaluation.
    let (ws, out) = train_with(&base, "text", &[]);
    let text = stderr(&out);
    for epoch in 1..=EPOCHS {
        let line = format!("epoch {epoch}/{EPOCHS}: mean minibatch ELBO ");
        assert_eq!(text.matches(&line).count(), 1, "{line}: {text}");
    }
    for epoch in [2, 4, 6] {
        assert!(
            text.contains(&format!("epoch {epoch}: 'test' P@1 ")),
            "{text}"
        );
    }
    let run = newest_run(&ws, "train");
    assert!(
        text.contains(&format!("trained run {run}: {STEPS} steps")),
        "{text}"
    );

    // JSON lines: every line an event with its documented fields.
    let (ws, out) = train_with(&base, "jsonl", &["--log-format", "jsonl"]);
    let events = events(&stderr(&out));
    let started = of_kind(&events, "started");
    let train: Vec<_> = started.iter().filter(|e| e["kind"] == "train").collect();
    assert_eq!(train.len(), 1, "{started:?}");
    let task = &train[0]["task"];
    assert_eq!(train[0]["total"], STEPS);
    let epochs: Vec<u64> = of_kind(&events, "epoch")
        .iter()
        .map(|e| {
            assert_eq!(&e["task"], task);
            assert_eq!(e["epochs"], EPOCHS);
            assert!(e["mean_elbo"].as_f64().unwrap().is_finite(), "{e}");
            e["epoch"].as_u64().unwrap()
        })
        .collect();
    assert_eq!(epochs, (1..=EPOCHS).collect::<Vec<_>>());
    let scored: Vec<(u64, &str)> = of_kind(&events, "validation")
        .iter()
        .map(|e| (e["epoch"].as_u64().unwrap(), e["kind"].as_str().unwrap()))
        .collect();
    assert_eq!(scored, [(2, "ranking"), (4, "ranking"), (6, "ranking")]);
    let last_steps = of_kind(&events, "steps")
        .into_iter()
        .rfind(|e| &e["task"] == task)
        .expect("the run's steps");
    assert_eq!(last_steps["done"], STEPS);
    assert!(of_kind(&events, "finished")
        .iter()
        .any(|e| &e["task"] == task));
    let run = newest_run(&ws, "train");
    let trained = format!("trained run {run}: {STEPS} steps");
    assert!(
        of_kind(&events, "note")
            .iter()
            .any(|e| e["message"].as_str().unwrap().starts_with(&trained)),
        "{events:?}"
    );

    // --quiet: no epoch, evaluation or note line.
    let (ws, out) = train_with(&base, "quiet", &["--quiet"]);
    assert_eq!(stderr(&out), "", "train --quiet printed");

    // ... and a command's result is still printed: evaluate's metrics table.
    let run = newest_run(&ws, "train").to_string();
    let out = pipeline(&ws, &["--quiet", "evaluate", "--run", &run]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stderr(&out), "", "evaluate --quiet printed notes");
    let table = stdout(&out);
    assert!(
        table.starts_with("rows ") && table.contains("@1"),
        "{table}"
    );
}

/// `pipeline fit` on a small binary file, one carve (no folds), with `extra` flags.
fn fit_with(dir: &Path, extra: &[&str]) -> std::process::Output {
    let train = dir.join("toy.svm");
    let test = dir.join("toy-test.svm");
    std::fs::write(&train, crate::fit::points(0..240)).unwrap();
    std::fs::write(&test, crate::fit::points(240..320)).unwrap();
    let ws = dir.join(format!("ws{}", extra.join("")));
    let mut args = vec![
        "fit",
        "--train",
        train.to_str().unwrap(),
        "--test",
        test.to_str().unwrap(),
        "--budget",
        "20s",
        "--no-folds",
    ];
    args.extend(extra);
    let out = pipeline(&ws, &args);
    assert!(out.status.success(), "{extra:?}: {}", stderr(&out));
    out
}

#[test]
fn fit_prints_epoch_lines_unless_quiet_and_its_result_always() {
    let dir = tempfile::tempdir().unwrap();
    let out = fit_with(dir.path(), &[]);
    let err = stderr(&out);
    assert!(err.contains("epoch 1/"), "{err}");
    assert!(err.contains(": mean minibatch ELBO "), "{err}");
    assert!(err.contains("== fit: chosen "), "{err}");
    assert!(stdout(&out).contains("accuracy"), "{}", stdout(&out));

    // JSON lines: every train run fit starts reports its epochs as events. (fit's own
    // table lines are its own printing, still text.)
    let out = fit_with(dir.path(), &["--log-format", "jsonl"]);
    let err = stderr(&out);
    assert!(!err.contains("mean minibatch ELBO"), "{err}");
    let json: Vec<&str> = err.lines().filter(|l| l.starts_with('{')).collect();
    let events = events(&json.join("\n"));
    let runs = of_kind(&events, "started")
        .iter()
        .filter(|e| e["kind"] == "train")
        .count();
    assert!(runs >= 2, "candidates and the final model: {runs} runs");
    let epochs = of_kind(&events, "epoch");
    assert!(
        epochs.iter().any(|e| e["epoch"] == 1) && epochs.iter().all(|e| e["mean_elbo"].is_f64()),
        "{epochs:?}"
    );
    assert!(err.contains("== fit: chosen "), "{err}");

    let out = fit_with(dir.path(), &["--quiet"]);
    let err = stderr(&out);
    assert!(!err.contains("mean minibatch ELBO"), "{err}");
    assert!(!err.contains("'validation' "), "{err}");
    assert!(!err.contains("train on '"), "{err}");
    // What fit exists to print: its candidates' table, its choice, the test metrics.
    assert!(err.contains("candidate (validation)"), "{err}");
    assert!(err.contains("== fit: chosen "), "{err}");
    assert!(stdout(&out).contains("accuracy"), "{}", stdout(&out));
}
