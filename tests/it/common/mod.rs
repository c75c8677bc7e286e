//! Helpers shared by the integration tests: running the `pipeline` binary and looking at a
//! workspace from the outside.
#![allow(dead_code)]

pub mod blobs;
pub mod classify;
pub mod ingest;
pub mod model;
pub mod ranks;
pub mod registered;
pub mod toy;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn pipeline_bin() -> &'static str {
    env!("CARGO_BIN_EXE_pipeline")
}

/// The command `pipeline --workspace WS ARGS...`.
fn command(ws: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(pipeline_bin());
    cmd.arg("--workspace")
        .arg(ws)
        .args(args)
        .env_remove("FSGP_WORKSPACE");
    cmd
}

/// Runs `pipeline --workspace WS ARGS...`.
pub fn pipeline(ws: &Path, args: &[&str]) -> Output {
    command(ws, args).output().expect("running pipeline")
}

/// [`pipeline`], but a run that has not ended after `limit` is killed and the test fails
/// (for inputs that used to hang, such as a FIFO no one writes to).
pub fn pipeline_within(ws: &Path, args: &[&str], limit: std::time::Duration) -> Output {
    let mut child = command(ws, args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running pipeline");
    let started = std::time::Instant::now();
    while child.try_wait().expect("waiting for pipeline").is_none() {
        if started.elapsed() > limit {
            child.kill().expect("killing a hung pipeline");
            let out = child.wait_with_output().expect("reaping pipeline");
            panic!("pipeline {args:?} hung for {limit:?}: {}", stderr(&out));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child
        .wait_with_output()
        .expect("collecting pipeline's output")
}

/// Runs `pipeline --workspace WS ARGS...`, which must succeed; returns its standard output.
pub fn pipeline_ok(ws: &Path, args: &[&str]) -> String {
    let out = pipeline(ws, args);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    stdout(&out)
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The number a message prints between `before` and `after` (its first occurrence), or
/// None when it is not there or is not a number.
pub fn number_between(text: &str, before: &str, after: &str) -> Option<f64> {
    text.split(before)
        .nth(1)
        .and_then(|t| t.split(after).next())
        .and_then(|n| n.parse().ok())
}

/// `pipeline status --json`, parsed.
pub fn status_json(ws: &Path) -> serde_json::Value {
    let out = pipeline(ws, &["status", "--json"]);
    assert!(out.status.success(), "status failed: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("status --json prints JSON")
}

/// The `status --json` summary of train run `run`.
pub fn train_summary(ws: &Path, run: i64) -> serde_json::Value {
    let status = status_json(ws);
    status["train_runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == run)
        .unwrap_or_else(|| panic!("run {run} not in {status}"))
        .clone()
}

pub fn dataset_names(ws: &Path) -> Vec<String> {
    status_json(ws)["datasets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap().to_string())
        .collect()
}

/// Every file and directory below `ws` except the catalog's own files, sorted.
pub fn listing(ws: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            if rel.starts_with("catalog.sqlite") {
                continue;
            }
            out.push(rel);
            if p.is_dir() {
                walk(root, &p, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(ws, ws, &mut out);
    out.sort();
    out
}

/// Opens (creating it if needed) the workspace at `ws` as a command that writes does,
/// which also collects what dead runs left; `status` only reads.
pub fn create_workspace(ws: &Path) {
    drop(fsgp::store::workspace::Workspace::open(ws).expect("opening the workspace"));
}

pub fn shared_data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/data")
        .join(name)
}

/// Ingests Delicious (from `../shared`) into `ws` as dataset `delicious`, with `extra`
/// ingest options appended (e.g. `--chunk-rows 2000`); asserts success.
pub fn ingest_delicious(ws: &Path, extra: &[&str]) {
    ingest_delicious_as(ws, "delicious", extra);
}

/// [`ingest_delicious`] as dataset `name`.
pub fn ingest_delicious_as(ws: &Path, name: &str, extra: &[&str]) {
    let (train, test) = (
        shared_data("delicious/train.txt"),
        shared_data("delicious/test.txt"),
    );
    let mut args = vec![
        "ingest",
        "--name",
        name,
        "--train",
        train.to_str().unwrap(),
        "--test",
        test.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let out = pipeline(ws, &args);
    assert!(out.status.success(), "{}", stderr(&out));
}

pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// The spec of the small generated dataset several tests build a workspace from (900 rows,
/// D = 60, L = 30; svd R = 8, M = 16; 3 factors, B = 64, η = 0.05, a checkpoint every 10
/// steps). `train_extra` and `predict` are the lines added to `[train]` and `[predict]`.
pub fn toy_spec(epochs: u64, train_extra: &str, predict: &str) -> String {
    format!(
        r#"
[synth]
out = "data"
rows = 900
test_rows = 150
features = 60
labels = 30
seed = 3

[ingest]
name = "toy"
train = "data/train.txt"
test = "data/test.txt"
chunk_rows = 200

[svd]
rank = 8
inducing = 16
threads = 2

[train]
factors = 3
batch = 64
epochs = {epochs}
lr = 0.05
checkpoint_every = 10
threads = 2
seed = 5
{train_extra}
[predict]
{predict}
[evaluate]
k = 5
"#
    )
}

/// Every file below `ws` (through symbolic links) except the catalog's own files and the
/// stage locks, with an xxh3 hash of its bytes: what a command must leave as it was.
pub fn contents(ws: &Path) -> std::collections::BTreeMap<String, u64> {
    fn walk(root: &Path, dir: &Path, out: &mut std::collections::BTreeMap<String, u64>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            if rel.starts_with("catalog.sqlite") || rel.starts_with("locks") {
                continue;
            }
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                let bytes = std::fs::read(&p).unwrap();
                out.insert(rel, xxhash_rust::xxh3::xxh3_64(&bytes));
            }
        }
    }
    let mut out = std::collections::BTreeMap::new();
    walk(ws, ws, &mut out);
    out
}
