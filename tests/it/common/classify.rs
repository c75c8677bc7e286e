//! What the end-to-end classification tests share (tests/it/binary_task.rs,
//! tests/it/multiclass_task.rs): the training command on a prepared 400-row dataset, and
//! the rows of a predict run with probabilities, read back from its predictions file.

use super::toy::{newest_run, predictions_path, run_params};
use super::{pipeline, stderr};
use fsgp::store::predictions::PredictionReader;
use std::path::Path;

/// The training command of the classification tests: 8 steps per epoch of 400 rows
/// (B = 50), η = 0.05, a checkpoint every 6 steps (all kept), 2 threads; then the task's own
/// `task` flags (dataset, task, seed, …), each of `defaults` ("--flag", "value") unless
/// `extra` gives that flag, and `extra`.
pub fn train_args<'a>(
    task: &[&'a str],
    defaults: &[(&'a str, &'a str)],
    extra: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec![
        "train",
        "--batch",
        "50",
        "--lr",
        "0.05",
        "--checkpoint-every",
        "6",
        "--keep-checkpoints",
        "all",
        "--threads",
        "2",
    ];
    args.extend(task);
    for &(flag, value) in defaults {
        if !extra.contains(&flag) {
            args.extend([flag, value]);
        }
    }
    args.extend(extra);
    args
}

/// One row of a predictions file: its row id, and its kept labels with their scores and
/// probabilities.
pub struct PredictedRow {
    pub row: u64,
    pub labels: Vec<u32>,
    pub scores: Vec<f32>,
    pub probabilities: Vec<f32>,
}

/// `predict --run RUN --probabilities ARGS`, which must succeed: every row of the
/// predictions file in file order, each asserted to hold `per_row` labels, and the predict
/// run's params.
pub fn predict_probabilities(
    ws: &Path,
    run: i64,
    args: &[&str],
    per_row: usize,
) -> (Vec<PredictedRow>, serde_json::Value) {
    let run = run.to_string();
    let mut argv = vec!["predict", "--run", &run, "--probabilities"];
    argv.extend(args);
    let out = pipeline(ws, &argv);
    assert!(out.status.success(), "{argv:?}: {}", stderr(&out));
    let id = newest_run(ws, "predict");
    let mut rows = Vec::new();
    for block in PredictionReader::open(&predictions_path(ws, id)).unwrap() {
        let b = block.unwrap();
        let probs = b
            .probabilities
            .as_ref()
            .expect("probabilities were asked for");
        for i in 0..b.row_ids.len() {
            let (start, end) = (b.offsets[i] as usize, b.offsets[i + 1] as usize);
            assert_eq!(end - start, per_row, "labels per row");
            rows.push(PredictedRow {
                row: b.row_ids[i],
                labels: b.labels[start..end].to_vec(),
                scores: b.scores[start..end].to_vec(),
                probabilities: probs[start..end].to_vec(),
            });
        }
    }
    (rows, run_params(ws, id))
}
