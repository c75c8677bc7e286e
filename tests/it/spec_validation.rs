//! Mistakes reported early and helpfully: a `pipeline run` spec is checked whole before
//! any stage runs (every problem in one error), names that are not found come with the
//! closest one there is and a pointer to `pipeline status`, and a dataset name taken by
//! other inputs says which inputs differ.

use crate::common;
use common::*;
use std::path::{Path, PathBuf};

/// A small spec (synth → … → evaluate, about a second of work); `train` is the body of its
/// `[train]` table.
fn spec(dir: &Path, train: &str) -> PathBuf {
    let text = format!(
        r#"
[synth]
out = "data"
rows = 200
test_rows = 50
features = 30
labels = 12
seed = 1

[ingest]
name = "toy"
train = "data/train.txt"
test = "data/test.txt"

[svd]
rank = 4
inducing = 8
threads = 1

[train]
{train}

[predict]
top_k = 3
"#
    );
    let path = dir.join("toy.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn every_problem_of_a_spec_is_reported_before_any_stage_runs() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let path = spec(
        dir.path(),
        "lerning_rate = 0.05\nepochs = \"ten\"\nbatch = 0\nfactors = 2",
    );
    let out = pipeline(&ws, &["run", path.to_str().unwrap()]);
    assert!(!out.status.success(), "a bad spec must fail");
    let err = stderr(&out);
    for expected in [
        "toy.toml: [train] unknown key 'lerning_rate' (did you mean 'lr'?)",
        "toy.toml: [train] epochs: expected an integer, found a string \"ten\"",
        "toy.toml: [train] batch: invalid value '0': 0 is not in 1..=16777216",
        "3 problems in",
    ] {
        assert!(err.contains(expected), "missing {expected:?} in:\n{err}");
    }
    assert!(
        !dir.path().join("data").exists(),
        "synth ran before the spec was checked"
    );
    assert!(!err.contains("== synth"), "a stage started:\n{err}");
    assert!(
        !ws.exists(),
        "the workspace was created for a spec with mistakes"
    );
}

#[test]
fn names_not_found_suggest_the_closest_and_point_to_status() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let path = spec(
        dir.path(),
        "factors = 2\nbatch = 50\nepochs = 1\nthreads = 1\nno_final_elbo = true",
    );
    let out = pipeline(&ws, &["run", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let train_run: i64 = rusqlite::Connection::open(ws.join("catalog.sqlite"))
        .unwrap()
        .query_row(
            "SELECT max(id) FROM stage_runs WHERE stage = 'train'",
            [],
            |r| r.get(0),
        )
        .unwrap();

    let out = pipeline(&ws, &["svd", "--dataset", "tyo", "--rank", "4"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("no dataset 'tyo'")
            && err.contains("did you mean 'toy'? datasets: toy; see 'pipeline status'"),
        "{err}"
    );

    // A digit too many: the run the user meant is one edit away.
    let typo = format!("{train_run}1");
    for args in [
        vec!["predict", "--run", typo.as_str()],
        vec!["report", "--run", typo.as_str()],
        vec!["train", "--resume", typo.as_str()],
    ] {
        let out = pipeline(&ws, &args);
        assert!(!out.status.success(), "{args:?}");
        let err = stderr(&out);
        assert!(
            err.contains(&format!("no run {typo} in"))
                && err.contains(&format!(
                    "did you mean '{train_run}'? train runs: {train_run}"
                ))
                && err.contains("see 'pipeline status'"),
            "{args:?}: {err}"
        );
    }

    let svd_run: i64 = rusqlite::Connection::open(ws.join("catalog.sqlite"))
        .unwrap()
        .query_row(
            "SELECT max(id) FROM stage_runs WHERE stage = 'svd'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let typo = format!("{svd_run}1");
    let out = pipeline(&ws, &["train", "--dataset", "toy", "--svd", &typo]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains(&format!("no run {typo} in"))
            && err.contains(&format!("did you mean '{svd_run}'? svd runs: {svd_run};")),
        "{err}"
    );

    let run = train_run.to_string();
    // A split name is checked by the parser, before the dataset is opened.
    let out = pipeline(&ws, &["predict", "--run", &run, "--split", "tset"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("invalid value 'tset' for '--split <SPLIT>'")
            && err.contains("[possible values: train, validation, test]")
            && err.contains("a similar value exists: 'test'"),
        "{err}"
    );
}

#[test]
fn a_taken_dataset_name_lists_the_inputs_that_differ() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let train = write(
        dir.path(),
        "train.txt",
        "4 3 2\n0 0:1.0\n1 1:1.0\n0,1 2:1.0\n1 0:0.5 1:0.5\n",
    );
    let ingest = |chunk_rows: &str| {
        pipeline(
            &ws,
            &[
                "ingest",
                "--name",
                "tiny",
                "--train",
                train.to_str().unwrap(),
                "--chunk-rows",
                chunk_rows,
            ],
        )
    };
    let out = ingest("2");
    assert!(out.status.success(), "{}", stderr(&out));

    let out = ingest("3");
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("already exists with other inputs or options")
            && err.contains("chunk_rows: 2 → 3")
            && err.contains("pass --replace"),
        "{err}"
    );
    assert!(
        !err.contains("sources.train"),
        "the file did not change: {err}"
    );

    std::fs::write(
        &train,
        "4 3 2\n0 0:1.0\n1 1:1.0\n0,1 2:1.0\n1 0:0.25 1:0.5\n",
    )
    .unwrap();
    let out = ingest("2");
    assert!(!out.status.success());
    let err = stderr(&out);
    let canonical = train.canonicalize().unwrap();
    assert!(
        err.contains(&format!(
            "sources.train: {} (changed since ingest: checksum ",
            canonical.display()
        )),
        "{err}"
    );
    assert!(
        !err.contains("chunk_rows"),
        "the options did not change: {err}"
    );
}
