//! The NLP of a multi-class run is known whatever `predict --top-k` was (issue 31): predict
//! records each row's probability of its true class (the `true_class_probability` column,
//! docs/formats.md, "Predictions"), evaluate takes the NLP from it, and with no `--top-k` a
//! run of K ≤ 20 classes lists every class. On ten Gaussian blobs, noisy enough that the
//! true class of some rows falls outside the top 3: the NLP of `predict --top-k 3` is the
//! mean −log p(true class) computed here from a prediction listing all ten classes; files
//! without the column (as older binaries wrote them) are still read, with the old rule.

use crate::common;
use common::blobs::Blobs;
use common::classify;
use common::toy::{newest_run, predictions_path, run_params, train_with, Prepared};
use common::*;
use fsgp::metrics::nlp::NLP_FLOOR;
use fsgp::store::predictions::{
    OptionalColumns, PredictionBlock, PredictionReader, PredictionWriter,
};
use std::path::{Path, PathBuf};

/// Classes (and features per row).
const K: usize = 10;
const TEST_ROWS: usize = 200;

/// Ten blobs, noisy (σ = 1.1 against centres 2 apart), ingested and factorised (R = 10,
/// M = 16), and the test rows' classes.
fn prepared() -> Prepared<Vec<u32>> {
    let blobs = Blobs {
        classes: K,
        noise_sd: 1.1,
        train_rows: 400,
        test_rows: TEST_ROWS,
        seed: 31,
    };
    Prepared::new(|dir| blobs.workspace(dir, 16))
}

/// A short one-vs-each run (SE kernel, independent GPs, 12 epochs): far from perfect on
/// these blobs (NLP about 1.7 nats), which is what the test needs.
fn train(ws: &Path) -> i64 {
    let task = [
        "--dataset",
        "blobs",
        "--task",
        "multiclass",
        "--likelihood",
        "ove",
        "--kernel",
        "se",
        "--latent",
        "independent",
        "--seed",
        "3",
        "--epochs",
        "12",
    ];
    train_with(ws, &classify::train_args(&task, &[], &[]))
}

/// `predict --run RUN ARGS`, which must succeed: the predictions file and the run's params.
fn predict(ws: &Path, run: i64, args: &[&str]) -> (PathBuf, serde_json::Value) {
    let run = run.to_string();
    let mut argv = vec!["predict", "--run", run.as_str()];
    argv.extend(args);
    pipeline_ok(ws, &argv);
    let id = newest_run(ws, "predict");
    (predictions_path(ws, id), run_params(ws, id))
}

/// Every block of a predictions file, and the file's optional columns and metadata.
fn read(path: &Path) -> (Vec<PredictionBlock>, OptionalColumns, Vec<(String, String)>) {
    let reader = PredictionReader::open(path).unwrap();
    let (columns, metadata) = (reader.columns, reader.metadata.clone());
    let blocks = reader.map(|b| b.unwrap()).collect();
    // The writer adds fsgp.format itself; Arrow adds its schema.
    let metadata = metadata
        .into_iter()
        .filter(|(k, _)| k.starts_with("fsgp.") && k != "fsgp.format")
        .collect();
    (blocks, columns, metadata)
}

/// `evaluate --predictions PATH --json` (task from the run): the metrics JSON.
fn evaluate(ws: &Path, path: &Path) -> serde_json::Value {
    let json = pipeline_ok(
        ws,
        &[
            "evaluate",
            "--predictions",
            path.to_str().unwrap(),
            "--json",
        ],
    );
    serde_json::from_str(&json).unwrap()
}

/// The predictions at `path` rewritten to `to` without the true class's probability, as a
/// binary from before the column wrote them.
fn without_true_class(path: &Path, to: &Path) -> PathBuf {
    let (blocks, columns, metadata) = read(path);
    let old = OptionalColumns {
        true_class: false,
        ..columns
    };
    let mut w = PredictionWriter::create(to, &metadata, old).unwrap();
    for mut b in blocks {
        b.true_class = None;
        w.write(&b).unwrap();
    }
    w.finish().unwrap();
    to.to_path_buf()
}

/// Mean −log max(p_i, 2⁻²⁴) over the rows of a prediction listing every class, p_i the
/// listed probability of row i's class in `classes` (the generator's, not the file's).
fn nlp_of_full_listing(blocks: &[PredictionBlock], classes: &[u32]) -> f64 {
    let mut sum = 0.0;
    let mut rows = 0;
    for b in blocks {
        for i in 0..b.len() {
            let row = b.row_ids[i] as usize;
            let labels = b.labels(i);
            assert_eq!(labels.len(), K, "row {row}: every class listed");
            let at = labels.iter().position(|&c| c == classes[row]).unwrap();
            let p = f64::from(b.probabilities(i).unwrap()[at]);
            sum -= p.max(NLP_FLOOR).ln();
            rows += 1;
        }
    }
    assert_eq!(rows, classes.len());
    sum / rows as f64
}

/// Rows whose class (the generator's) is not among the file's listed classes.
fn unlisted_rows(blocks: &[PredictionBlock], classes: &[u32]) -> u64 {
    let rows = blocks
        .iter()
        .flat_map(|b| (0..b.len()).map(move |i| (b, i)));
    rows.filter(|&(b, i)| !b.labels(i).contains(&classes[b.row_ids[i] as usize]))
        .count() as u64
}

fn close(got: &serde_json::Value, want: f64, what: &str) {
    let got = got
        .as_f64()
        .unwrap_or_else(|| panic!("{what}: {got} is not a number"));
    assert!((got - want).abs() < 1e-12, "{what}: {got} vs {want}");
}

#[test]
fn the_nlp_of_a_multiclass_run_is_known_whatever_top_k() {
    let p = prepared();
    let classes = &p.test_classes;
    let ws = p.copy("nlp");
    let run = train(&ws);

    // Every class, with probabilities: the reference NLP, computed here.
    let (full, full_params) = predict(&ws, run, &["--top-k", "10", "--probabilities"]);
    assert_eq!(full_params["true_class_probability"], true);
    let (full_blocks, columns, _) = read(&full);
    assert_eq!(columns, OptionalColumns::with(true, true));
    let want = nlp_of_full_listing(&full_blocks, classes);
    eprintln!("reference NLP {want:.5}");

    // The default predict with a top-k below K: the NLP is the reference, although some
    // rows' classes are not listed; the recorded probabilities are the full listing's.
    let (top3, top3_params) = predict(&ws, run, &["--top-k", "3"]);
    assert_eq!(top3_params["top_k"], 3);
    let (top3_blocks, columns, _) = read(&top3);
    assert_eq!(columns, OptionalColumns::with(false, true));
    let unlisted = unlisted_rows(&top3_blocks, classes);
    eprintln!("{unlisted} of {TEST_ROWS} rows' classes outside the top 3");
    assert!(unlisted >= 5, "the test needs rows whose class is unlisted");
    for (b3, bf) in top3_blocks.iter().zip(&full_blocks) {
        for i in 0..b3.len() {
            let row = b3.row_ids[i] as usize;
            let at = bf
                .labels(i)
                .iter()
                .position(|&c| c == classes[row])
                .unwrap();
            let listed = bf.probabilities(i).unwrap()[at];
            let recorded = b3.true_class_probability(i).unwrap().unwrap();
            assert_eq!(recorded.to_bits(), listed.to_bits(), "row {row}");
        }
    }
    let m = evaluate(&ws, &top3);
    assert_eq!(m["task"], "multiclass");
    assert_eq!(m["nlp_unlisted_rows"], 0, "{m}");
    close(&m["nlp"], want, "NLP of the top 3");
    let table = pipeline_ok(&ws, &["evaluate", "--predictions", top3.to_str().unwrap()]);
    assert!(!table.contains("unknown"), "{table}");

    // `evaluate --run` predicts the top --k (5) itself: the same NLP.
    let json = pipeline_ok(&ws, &["evaluate", "--run", &run.to_string(), "--json"]);
    let by_run: serde_json::Value = serde_json::from_str(&json).unwrap();
    close(&by_run["nlp"], want, "NLP of evaluate --run");
    close(
        &by_run["accuracy"],
        m["accuracy"].as_f64().unwrap(),
        "accuracy",
    );

    // Without --top-k, ten classes are every class listed (K ≤ 20).
    let (all, all_params) = predict(&ws, run, &[]);
    assert_eq!(all_params["top_k"], K);
    let (all_blocks, _, metadata) = read(&all);
    assert!(metadata.contains(&("fsgp.top_k".into(), K.to_string())));
    assert_eq!(nlp_of_full_listing_of_scores(&all_blocks, classes), want);

    // Files without the column, as older binaries wrote them: the listed probabilities
    // give the NLP when every class is listed, and leave it unknown otherwise.
    let dir = tempfile::tempdir().unwrap();
    let old_full = without_true_class(&full, &dir.path().join("full.parquet"));
    let m = evaluate(&ws, &old_full);
    assert_eq!(m["nlp_unlisted_rows"], 0, "{m}");
    close(&m["nlp"], want, "NLP of an old full listing");
    let (top3p, _) = predict(&ws, run, &["--top-k", "3", "--probabilities"]);
    let old_top3 = without_true_class(&top3p, &dir.path().join("top3.parquet"));
    assert_eq!(read(&old_top3).1, OptionalColumns::with(true, false));
    let m = evaluate(&ws, &old_top3);
    assert!(m["nlp"].is_null(), "{m}");
    assert_eq!(m["nlp_unlisted_rows"], unlisted, "{m}");
    // An old file without probabilities cannot be measured, as before.
    let old_plain = without_true_class(&top3, &dir.path().join("plain.parquet"));
    let out = pipeline(
        &ws,
        &["evaluate", "--predictions", old_plain.to_str().unwrap()],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("have no probabilities"),
        "{}",
        stderr(&out)
    );
}

/// [`nlp_of_full_listing`] of a file without a probabilities column: a multi-class run's
/// scores are its class probabilities.
fn nlp_of_full_listing_of_scores(blocks: &[PredictionBlock], classes: &[u32]) -> f64 {
    let as_probabilities: Vec<PredictionBlock> = blocks
        .iter()
        .map(|b| PredictionBlock {
            probabilities: Some(b.scores.clone()),
            ..b.clone()
        })
        .collect();
    nlp_of_full_listing(&as_probabilities, classes)
}
