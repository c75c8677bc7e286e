//! `pipeline evaluate --task`: a binary dataset (L = 1) trained with today's model, its
//! predictions evaluated as binary and as multi-label, the metrics checked against an
//! independent computation from the predictions file and the test file; the errors for
//! predictions without probabilities and for truths that are not multi-class.

use crate::common;

use std::path::{Path, PathBuf};

use common::registered::query;
use common::toy::{newest_run, predictions_path};
use common::{pipeline, pipeline_ok, stderr, write};
use fsgp::store::predictions::PredictionReader;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// XC text with header `N 4 1`: a row is positive (label 0) when its feature 0 exceeds its
/// feature 1, with 10 % of the labels flipped so that probabilities are not all near 0/1.
/// Returns the text and each row's truth.
fn binary_text(rows: usize, rng: &mut ChaCha8Rng) -> (String, Vec<bool>) {
    let mut text = format!("{rows} 4 1\n");
    let mut truth = Vec::new();
    for _ in 0..rows {
        let x: Vec<f64> = (0..4).map(|_| rng.random_range(0.05..1.0)).collect();
        let positive = (x[0] > x[1]) != rng.random_bool(0.1);
        let features: Vec<String> = x
            .iter()
            .enumerate()
            .map(|(j, v)| format!("{j}:{v:.3}"))
            .collect();
        let label = if positive { "0 " } else { "" };
        text.push_str(&format!("{label}{}\n", features.join(" ")));
        truth.push(positive);
    }
    (text, truth)
}

/// Ingest, svd and 4 epochs of training of the binary data; returns the training run id
/// and the test rows' truth.
fn trained_binary(dir: &Path, ws: &Path) -> (String, Vec<bool>) {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let (train, _) = binary_text(400, &mut rng);
    let (test, truth) = binary_text(150, &mut rng);
    let train = write(dir, "train.txt", &train);
    let test = write(dir, "test.txt", &test);
    let s = |p: &PathBuf| p.to_str().unwrap().to_string();
    pipeline_ok(
        ws,
        &[
            "ingest",
            "--name",
            "bin",
            "--train",
            &s(&train),
            "--test",
            &s(&test),
            "--chunk-rows",
            "60",
        ],
    );
    pipeline_ok(
        ws,
        &[
            "svd",
            "--dataset",
            "bin",
            "--rank",
            "4",
            "--inducing",
            "8",
            "--threads",
            "1",
        ],
    );
    pipeline_ok(
        ws,
        &[
            "train",
            "--dataset",
            "bin",
            "--factors",
            "1",
            "--batch",
            "50",
            "--epochs",
            "4",
            "--lr",
            "0.05",
            "--threads",
            "1",
            "--seed",
            "0",
        ],
    );
    let run: i64 = query(ws, "SELECT MAX(id) FROM stage_runs WHERE stage = 'train'");
    (run.to_string(), truth)
}

/// Each test row's (p, truth) from a predictions file.
fn probabilities(path: &Path, truth: &[bool]) -> Vec<(f32, bool)> {
    let mut out = Vec::new();
    for block in PredictionReader::open(path).unwrap() {
        let block = block.unwrap();
        for i in 0..block.len() {
            assert_eq!(block.labels(i), &[0]);
            out.push((
                block.probabilities(i).unwrap()[0],
                truth[block.row_ids[i] as usize],
            ));
        }
    }
    assert_eq!(out.len(), truth.len());
    out
}

fn predict(ws: &Path, run: &str, with_probabilities: bool) -> PathBuf {
    let mut args = vec!["predict", "--run", run, "--split", "test", "--top-k", "1"];
    if with_probabilities {
        args.push("--probabilities");
    }
    pipeline_ok(ws, &args);
    predictions_path(ws, newest_run(ws, "predict"))
}

/// `a` and `b` have the same shape and the same numbers to a relative 1e-15.
fn same_numbers(a: &serde_json::Value, b: &serde_json::Value, at: &str) {
    use serde_json::Value;
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            assert!(
                (x - y).abs() <= 1e-15 * x.abs().max(y.abs()),
                "{at}: {x} vs {y}"
            );
        }
        (Value::Array(x), Value::Array(y)) => {
            assert_eq!(x.len(), y.len(), "{at}");
            for (i, (x, y)) in x.iter().zip(y).enumerate() {
                same_numbers(x, y, &format!("{at}[{i}]"));
            }
        }
        (Value::Object(x), Value::Object(y)) => {
            assert_eq!(
                x.keys().collect::<Vec<_>>(),
                y.keys().collect::<Vec<_>>(),
                "{at}"
            );
            for (k, v) in x {
                same_numbers(v, &y[k], &format!("{at}.{k}"));
            }
        }
        _ => assert_eq!(a, b, "{at}"),
    }
}

fn close(got: &serde_json::Value, want: f64, what: &str) {
    let got = got.as_f64().unwrap_or_else(|| panic!("{what}: {got}"));
    assert!(
        (got - want).abs() <= 1e-12,
        "{what}: got {got}, want {want}"
    );
}

#[test]
fn binary_evaluation_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let (run, truth) = trained_binary(dir.path(), &ws);

    // Without probabilities: refused, naming the predict run and the flag.
    let plain = predict(&ws, &run, false);
    let out = pipeline(
        &ws,
        &[
            "evaluate",
            "--predictions",
            plain.to_str().unwrap(),
            "--task",
            "binary",
        ],
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("predict run") && err.contains("--probabilities"),
        "{err}"
    );
    // Multi-label (auto: the run recorded no task) without probabilities: no calibration,
    // no new parameter.
    let json = pipeline_ok(
        &ws,
        &[
            "evaluate",
            "--predictions",
            plain.to_str().unwrap(),
            "--json",
        ],
    );
    assert!(!json.contains("calibration"), "{json}");
    let params: String = query(
        &ws,
        "SELECT params FROM stage_runs WHERE stage = 'evaluate' ORDER BY id DESC LIMIT 1",
    );
    assert!(
        !params.contains("task") && !params.contains("calibration"),
        "{params}"
    );

    let with_p = predict(&ws, &run, true);
    let rows = probabilities(&with_p, &truth);
    let json = pipeline_ok(
        &ws,
        &[
            "evaluate",
            "--predictions",
            with_p.to_str().unwrap(),
            "--task",
            "binary",
            "--json",
        ],
    );
    let m: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(m["task"], "binary");
    assert_eq!(m["rows"], 150);
    assert_eq!(m["positives"], truth.iter().filter(|&&y| y).count());
    // Independently: the formulas of docs/metrics.md, in the plainest form.
    let n = rows.len() as f64;
    let accuracy = rows.iter().filter(|(p, y)| (*p > 0.5) == *y).count() as f64 / n;
    let nlp = rows
        .iter()
        .map(|&(p, y)| {
            let p = f64::from(p);
            -(if y { p } else { 1.0 - p }).max(2f64.powi(-24)).ln()
        })
        .sum::<f64>()
        / n;
    let brier = rows
        .iter()
        .map(|&(p, y)| (f64::from(p) - f64::from(u8::from(y))).powi(2))
        .sum::<f64>()
        / n;
    let (mut wins, mut pairs) = (0.0, 0.0);
    for &(p, y) in &rows {
        for &(q, z) in &rows {
            if y && !z {
                pairs += 1.0;
                wins += if p > q {
                    1.0
                } else if p == q {
                    0.5
                } else {
                    0.0
                };
            }
        }
    }
    close(&m["accuracy"], accuracy, "accuracy");
    close(&m["nlp"], nlp, "nlp");
    close(&m["brier"], brier, "brier");
    close(&m["auc"], wins / pairs, "auc");
    assert!(
        accuracy > 0.7,
        "the model learnt the boundary: accuracy {accuracy}"
    );
    let bins = m["calibration"]["reliability"].as_array().unwrap();
    assert_eq!(bins.len(), 15);
    let counted: u64 = bins.iter().map(|b| b["count"].as_u64().unwrap()).sum();
    assert_eq!(counted, 150);
    // The table, and the catalog rows.
    let table = pipeline_ok(
        &ws,
        &[
            "evaluate",
            "--predictions",
            with_p.to_str().unwrap(),
            "--task",
            "binary",
        ],
    );
    assert!(
        table.contains("accuracy") && table.contains("auc"),
        "{table}"
    );
    let eval_run: i64 = query(
        &ws,
        "SELECT MAX(id) FROM stage_runs WHERE stage = 'evaluate'",
    );
    let auc: f64 = query(
        &ws,
        &format!("SELECT value FROM metrics WHERE stage_run_id = {eval_run} AND name = 'auc'"),
    );
    // serde_json's default parser may be an ulp off the printed shortest decimal.
    close(&m["auc"], auc, "catalog auc");

    // `--run` predicts with probabilities itself when the task needs them, the top 1 of
    // binary data whatever --k (5 by default): same metrics.
    let by_run = pipeline_ok(
        &ws,
        &["evaluate", "--run", &run, "--task", "binary", "--json"],
    );
    // (A memoised evaluation reprints what serde_json parsed from metrics.json, which can
    // be an ulp off the first print: compare numbers to a relative 1e-15.)
    same_numbers(
        &serde_json::from_str(&by_run).unwrap(),
        &m,
        "evaluate --run",
    );

    // The same file as multi-label: ranking metrics plus calibration over the (row, label)
    // pairs, here one per row, whose Brier score is the binary one bit for bit.
    let ml = pipeline_ok(
        &ws,
        &[
            "evaluate",
            "--predictions",
            with_p.to_str().unwrap(),
            "--k",
            "1",
            "--json",
        ],
    );
    let ml: serde_json::Value = serde_json::from_str(&ml).unwrap();
    assert!(ml.get("task").is_none());
    assert_eq!(ml["calibration"]["count"], 150);
    assert_eq!(ml["calibration"]["brier"], m["brier"]);

    // Not a multi-class truth: negative rows have no label.
    let out = pipeline(
        &ws,
        &[
            "evaluate",
            "--predictions",
            with_p.to_str().unwrap(),
            "--task",
            "multiclass",
        ],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("exactly one true label"),
        "{}",
        stderr(&out)
    );

    // The report draws the reliability diagrams of the run's evaluations.
    pipeline_ok(&ws, &["report", "--run", &run]);
    let report = ws.join(format!("reports/train-run{run}"));
    let readme = std::fs::read_to_string(report.join("README.md")).unwrap();
    assert!(readme.contains("reliability"), "{readme}");
    let pngs: Vec<String> = std::fs::read_dir(&report)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("reliability") && n.ends_with(".png"))
        .collect();
    assert!(
        !pngs.is_empty(),
        "no reliability diagram in {}",
        report.display()
    );
}

/// Multi-class metrics through `pipeline evaluate --task multiclass` on predictions written
/// with the store's API (the multi-class model comes later): the four rows of
/// `tests/it/classification_metrics.rs`'s hand-worked case, K = 4.
#[test]
fn multiclass_evaluation_of_written_predictions() {
    use fsgp::store::predictions::{OptionalColumns, PredictionBlock, PredictionWriter};
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let text = "4 2 4\n0 0:1\n1 1:1\n1 0:1\n3 1:1\n";
    let file = write(dir.path(), "rows.txt", text);
    let f = file.to_str().unwrap();
    pipeline_ok(&ws, &["ingest", "--name", "mc", "--train", f, "--test", f]);
    let meta = [
        ("fsgp.dataset".to_string(), "mc".to_string()),
        ("fsgp.split".to_string(), "test".to_string()),
    ];
    let write_predictions = |name: &str, rows: &[(&[u32], &[f32])]| {
        let path = dir.path().join(name);
        let mut w =
            PredictionWriter::create(&path, &meta, OptionalColumns::with(true, false)).unwrap();
        let mut block = PredictionBlock::with_probabilities();
        for (i, (labels, probs)) in rows.iter().enumerate() {
            block.push_with_probabilities(i as u64, labels, &vec![0.0; labels.len()], probs);
        }
        w.write(&block).unwrap();
        w.finish().unwrap();
        path
    };
    let hand: [(&[u32], &[f32]); 4] = [
        (&[0, 1], &[0.75, 0.125]),
        (&[2, 1], &[0.5, 0.25]),
        (&[1, 3], &[0.625, 0.25]),
        (&[0, 2], &[0.5, 0.375]),
    ];
    let path = write_predictions("hand.parquet", &hand);
    let json = pipeline_ok(
        &ws,
        &[
            "evaluate",
            "--predictions",
            path.to_str().unwrap(),
            "--task",
            "multiclass",
            "--k",
            "2",
            "--json",
        ],
    );
    let m: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(m["task"], "multiclass");
    assert_eq!(
        (m["test_classes"].as_u64(), m["covered_classes"].as_u64()),
        (Some(3), Some(2))
    );
    close(&m["accuracy"], 0.5, "accuracy");
    close(&m["top_k_accuracy"][1], 0.75, "top-2 accuracy");
    close(&m["coverage"], 2.0 / 3.0, "coverage");
    close(&m["brier"], 0.703125 / 4.0, "brier");
    close(&m["ece"], 1.625 / 4.0, "ece");
    assert!(m["nlp"].is_null() && m["nlp_unlisted_rows"] == 1, "{json}");
    let table = pipeline_ok(
        &ws,
        &[
            "evaluate",
            "--predictions",
            path.to_str().unwrap(),
            "--task",
            "multiclass",
            "--k",
            "2",
        ],
    );
    assert!(
        table.contains("unknown: true class unlisted in 1 rows"),
        "{table}"
    );
    assert!(table.contains("top2_accuracy"), "{table}");
}
