//! Binary GP classification end to end (`--task binary`, `--likelihood probit`, `--latent
//! independent`; docs/model.md, "Tasks and latent functions"): a linearly separable problem
//! made here, in the XC format with one label (label 0 the positive class, negatives with
//! no label), trained with the probit and the logistic likelihood over q(u) forms, inducing
//! inputs and kernels; predictions with probabilities in (0, 1) and accuracy far above
//! chance; `pipeline elbo` against an independent one-batch sum; Φ exactly I for
//! independent GPs (also with K = 30 labels); determinism and kill/resume; the refusals.

use crate::common;
use common::classify;
use common::toy::{
    assert_resume_refused, assert_resumes_to, assert_same_run_bytes, checkpoints, crash_with,
    metrics, newest_run, one_batch_label_bound, read_ckpt, run_params, train_with, Prepared,
};
use common::*;
use fsgp::model::kernel::KernelKind;
use fsgp::model::likelihood::probit::BernoulliProbit;
use fsgp::model::params::Params;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::Path;

/// Features per row.
const D: usize = 8;
const TRAIN_ROWS: usize = 400;
const TEST_ROWS: usize = 200;

/// Rows with D dense features uniform in (−1, 1) and the class of a fixed hyperplane
/// w·x > 0.1, written as XC-format text with L = 1: `0 f:v …` for a positive row,
/// ` f:v …` (no label field) for a negative one. Returns the classes.
fn write_split(path: &Path, rows: usize, rng: &mut ChaCha8Rng) -> Vec<bool> {
    let w = [2.0, -1.5, 1.0, 0.0, 0.5, 0.0, -0.8, 0.0];
    let mut text = format!("{rows} {D} 1\n");
    let mut classes = Vec::new();
    for _ in 0..rows {
        let x: Vec<f64> = (0..D)
            .map(|_| (rng.random::<f64>() * 2.0 - 1.0) * 1000.0)
            .map(|v: f64| v.round() / 1000.0)
            .collect();
        let positive = x.iter().zip(&w).map(|(a, b)| a * b).sum::<f64>() > 0.1;
        let feats: Vec<String> = x
            .iter()
            .enumerate()
            .map(|(j, v)| format!("{j}:{v}"))
            .collect();
        let label = if positive { "0" } else { "" };
        text.push_str(&format!("{label} {}\n", feats.join(" ")));
        classes.push(positive);
    }
    std::fs::write(path, text).unwrap();
    classes
}

/// A workspace with the binary dataset `bin` ingested (100-row chunks) and factorised
/// (R = D = 8, M = 16), and the test rows' classes.
fn prepared() -> Prepared<Vec<bool>> {
    Prepared::new(|dir| {
        let base = dir.join("base");
        let src = dir.join("src");
        std::fs::create_dir_all(&src).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(17);
        write_split(&src.join("train.txt"), TRAIN_ROWS, &mut rng);
        let test_classes = write_split(&src.join("test.txt"), TEST_ROWS, &mut rng);
        pipeline_ok(
            &base,
            &[
                "ingest",
                "--name",
                "bin",
                "--train",
                src.join("train.txt").to_str().unwrap(),
                "--test",
                src.join("test.txt").to_str().unwrap(),
                "--chunk-rows",
                "100",
            ],
        );
        pipeline_ok(
            &base,
            &[
                "svd",
                "--dataset",
                "bin",
                "--rank",
                "8",
                "--inducing",
                "16",
                "--threads",
                "2",
            ],
        );
        (base, test_classes)
    })
}

/// The binary training command ([`classify::train_args`]) on `bin`, seed 5. `--epochs` is
/// 30 unless `extra` gives it.
fn train_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let task = ["--dataset", "bin", "--task", "binary", "--seed", "5"];
    classify::train_args(&task, &[("--epochs", "30")], extra)
}

fn train(ws: &Path, extra: &[&str]) -> i64 {
    train_with(ws, &train_args(extra))
}

/// `predict --probabilities` of the test split: (row id, label, probability) per row, and
/// the predict run's params.
fn predict(ws: &Path, run: i64) -> (Vec<(u64, u32, f32)>, serde_json::Value) {
    let (rows, params) = classify::predict_probabilities(ws, run, &[], 1);
    let rows = rows
        .into_iter()
        .map(|r| (r.row, r.labels[0], r.probabilities[0]))
        .collect();
    (rows, params)
}

/// Share of test rows whose class is predicted right by p(y = 1) > ½; asserts every
/// probability lies in [0, 1] (they are computed in (0, 1) but stored as f32, which rounds
/// p > 1 − 3e-8 to 1) and most strictly inside.
fn accuracy(rows: &[(u64, u32, f32)], classes: &[bool]) -> f64 {
    assert_eq!(rows.len(), classes.len());
    let (mut right, mut inside) = (0, 0);
    for (i, &(row, label, p)) in rows.iter().enumerate() {
        assert_eq!((row, label), (i as u64, 0));
        assert!((0.0..=1.0).contains(&p), "row {row}: p = {p}");
        inside += usize::from(p > 0.0 && p < 1.0);
        right += usize::from((p > 0.5) == classes[i]);
    }
    assert!(
        inside * 2 > rows.len(),
        "{inside} of {} strictly in (0, 1)",
        rows.len()
    );
    right as f64 / classes.len() as f64
}

/// The exact bound of `params` with all training rows as one batch, computed apart from
/// the streaming `pipeline elbo`: K_XX̃, norms and basis from the svd artifacts, classes
/// from the chunks, the probit likelihood with 20 points, every row a term.
fn one_batch_probit_bound(ws: &Path, kind: KernelKind, params: &Params) -> f64 {
    let lik = BernoulliProbit::new(20).unwrap();
    one_batch_label_bound(ws, kind, params, &lik, (TRAIN_ROWS, 1))
}

#[test]
fn binary_probit_with_independent_gps_trains_predicts_and_has_the_exact_bound() {
    let p = prepared();
    let ws = p.copy("probit");
    let id = train(
        &ws,
        &[
            "--likelihood",
            "probit",
            "--latent",
            "independent",
            "--no-final-elbo",
            "--eval-every",
            "10",
        ],
    );
    let params = run_params(&ws, id);
    assert_eq!(params["task"], "binary");
    assert_eq!(params["likelihood"], "probit");
    assert_eq!(params["latent"], "independent");
    assert_eq!(params["factors"], 1, "P = K = 1");
    // Φ = I = [1] in every checkpoint, exactly: its gradient is never applied.
    for (step, _) in checkpoints(&ws, id) {
        let c = read_ckpt(&ws, id, step);
        assert_eq!((c.params.phi.nrows(), c.params.phi.ncols()), (1, 1));
        assert_eq!(
            c.params.phi[(0, 0)].to_bits(),
            1.0f64.to_bits(),
            "step {step}"
        );
    }
    let (rows, predict_params) = predict(&ws, id);
    assert_eq!(predict_params["predictive"], "probit-exact");
    assert_eq!(
        predict_params["top_k"], 1,
        "--top-k is one label for a binary run"
    );
    let acc = accuracy(&rows, &p.test_classes);
    eprintln!("binary probit, independent GP: test accuracy {acc:.3}");
    assert!(acc >= 0.9, "accuracy {acc}");
    // --eval-every records a binary run's held-out accuracy and mean NLP per epoch; the
    // last equals the accuracy of the predictions (the same parameters).
    let held_acc = metrics(&ws, id, "accuracy");
    let held_nlp = metrics(&ws, id, "nlp");
    let epochs: Vec<i64> = held_acc.iter().map(|m| m.0).collect();
    assert_eq!(epochs, [10, 20, 30]);
    assert_eq!(held_nlp.len(), 3);
    let (last_acc, last_nlp) = (f64::from_bits(held_acc[2].1), f64::from_bits(held_nlp[2].1));
    eprintln!("held-out at epoch 30: accuracy {last_acc:.3}, mean NLP {last_nlp:.4}");
    assert!(
        (last_acc - acc).abs() <= 1.0 / TEST_ROWS as f64,
        "{last_acc} vs {acc}"
    );
    assert!(last_nlp > 0.0 && last_nlp < 0.3, "mean NLP {last_nlp}");

    // pipeline elbo: the streamed exact bound equals the one-batch sum.
    let last = *checkpoints(&ws, id).keys().last().unwrap();
    let out = pipeline(&ws, &["elbo", "--run", &id.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let recorded = metrics(&ws, id, "elbo_exact");
    assert_eq!(recorded.len(), 1);
    let streamed = f64::from_bits(recorded[0].1);
    let direct = one_batch_probit_bound(&ws, KernelKind::Linear, &read_ckpt(&ws, id, last).params);
    assert!(
        (streamed - direct).abs() <= 1e-9 * direct.abs(),
        "streamed {streamed} vs one batch {direct}"
    );
}

#[test]
fn every_q_form_inducing_input_mode_and_kernel_trains_a_binary_classifier() {
    let p = prepared();
    let cases: [(&str, &[&str], &str); 4] = [
        (
            "sites-subspace-linear-logistic",
            &[],
            "logistic-gauss-hermite",
        ),
        (
            "whitened-free-se-probit",
            &[
                "--q-form",
                "whitened",
                "--inducing-inputs",
                "free",
                "--kernel",
                "se",
                "--likelihood",
                "probit",
            ],
            "probit-exact",
        ),
        (
            "whitened-free-se-logistic",
            &[
                "--q-form",
                "whitened",
                "--inducing-inputs",
                "free",
                "--kernel",
                "se",
            ],
            "logistic-gauss-hermite",
        ),
        (
            "cholesky-fixed-rows-se-linear-probit-factor",
            &[
                "--q-form",
                "cholesky",
                "--inducing-inputs",
                "fixed-rows",
                "--kernel",
                "se+linear",
                "--likelihood",
                "probit",
                "--factors",
                "2",
            ],
            "probit-exact",
        ),
    ];
    for (name, extra, predictive) in cases {
        let ws = p.copy(name);
        let id = train(&ws, extra);
        let (rows, params) = predict(&ws, id);
        assert_eq!(params["predictive"], predictive, "{name}");
        let acc = accuracy(&rows, &p.test_classes);
        eprintln!("{name}: test accuracy {acc:.3}");
        assert!(acc >= 0.85, "{name}: accuracy {acc}");
    }
}

#[test]
fn independent_gps_keep_phi_exactly_the_identity_with_thirty_labels() {
    let ws_dir = tempfile::tempdir().unwrap();
    let ws = ws_dir.path().join("toy");
    common::toy::prepare(&ws);
    let mut args = common::toy::train_args(&["--epochs", "2", "--no-final-elbo"]);
    args.retain(|a| *a != "--factors" && *a != "3");
    // --factors other than K is refused, naming K.
    let mut wrong = args.clone();
    wrong.extend(["--latent", "independent", "--factors", "4"]);
    let out = pipeline(&ws, &wrong);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("--factors 4 with --latent independent") && err.contains("= 30"),
        "{err}"
    );
    args.extend(["--latent", "independent"]);
    let out = pipeline(&ws, &args);
    assert!(out.status.success(), "{}", stderr(&out));
    let id = newest_run(&ws, "train");
    let ckpts = checkpoints(&ws, id);
    assert!(ckpts.len() >= 2);
    for step in ckpts.keys() {
        let phi = read_ckpt(&ws, id, *step).params.phi;
        assert_eq!((phi.nrows(), phi.ncols()), (30, 30));
        for k in 0..30 {
            for q in 0..30 {
                let want = if k == q { 1.0f64 } else { 0.0 };
                assert_eq!(
                    phi[(k, q)].to_bits(),
                    want.to_bits(),
                    "step {step} Φ[{k},{q}]"
                );
            }
        }
    }
    // The bias and q(u) did train.
    let first = read_ckpt(&ws, id, *ckpts.keys().next().unwrap()).params;
    let last = read_ckpt(&ws, id, *ckpts.keys().last().unwrap()).params;
    assert_ne!(first.bias, last.bias);
}

#[test]
fn binary_probit_runs_are_deterministic_and_resume_after_a_kill_to_the_same_bytes() {
    let p = prepared();
    let extra = [
        "--likelihood",
        "probit",
        "--latent",
        "independent",
        "--epochs",
        "4",
    ];
    let (ws_a, ws_b, ws_cut) = (p.copy("a"), p.copy("b"), p.copy("cut"));
    let run_a = train(&ws_a, &extra);
    let run_b = train(&ws_b, &extra);
    let bytes = assert_same_run_bytes((&ws_a, run_a), (&ws_b, run_b));
    assert_eq!(
        bytes.keys().copied().collect::<Vec<_>>(),
        [6, 12, 18, 24, 30, 32]
    );

    // Killed just after the checkpoint of step 18 was published, then resumed.
    let id = crash_with(&ws_cut, &train_args(&extra), "checkpoint-renamed:18");
    // Resuming with another likelihood is refused, naming both.
    assert_resume_refused(
        &ws_cut,
        id,
        &["--likelihood", "logistic"],
        &format!("--likelihood logistic: run {id} has probit"),
    );
    assert_resumes_to(&ws_cut, id, &bytes, &metrics(&ws_a, run_a, "elbo_exact"));
    let phi = read_ckpt(&ws_cut, id, 32).params.phi;
    assert_eq!(
        phi[(0, 0)].to_bits(),
        1.0f64.to_bits(),
        "Φ = I after the resume"
    );
}

#[test]
fn binary_needs_one_label_and_all_negatives() {
    let p = prepared();
    let ws = p.copy("refusals");
    let out = pipeline(&ws, &train_args(&["--negatives", "3"]));
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("--negatives all is the only choice"), "{err}");
    // The multi-class task refuses a dataset of one label, naming its kind and count.
    let mut multiclass = train_args(&["--likelihood", "ove"]);
    let at = multiclass.iter().position(|a| *a == "binary").unwrap();
    multiclass[at] = "multiclass";
    let out = pipeline(&ws, &multiclass);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("--task multiclass needs a dataset of K ≥ 2 classes")
            && err.contains("with 1 label(s)"),
        "{err}"
    );

    let toy_dir = tempfile::tempdir().unwrap();
    let toy = toy_dir.path().join("toy");
    common::toy::prepare(&toy);
    let out = pipeline(
        &toy,
        &common::toy::train_args(&["--task", "binary", "--negatives", "all"]),
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("--task binary needs a dataset with one label")
            && err.contains("has 30 labels"),
        "{err}"
    );
}

#[test]
fn a_spec_with_a_bad_likelihood_task_or_latent_is_refused_before_any_stage() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("bad.toml");
    std::fs::write(
        &spec,
        "[synth]\nout = \"data\"\nrows = 50\ntest_rows = 10\nfeatures = 10\nlabels = 3\n\n\
         [ingest]\nname = \"toy\"\ntrain = \"data/train.txt\"\ntest = \"data/test.txt\"\n\n\
         [svd]\nrank = 3\ninducing = 4\n\n\
         [train]\nlikelihood = \"logit\"\ntask = \"regression\"\nlatent = \"shared\"\n",
    )
    .unwrap();
    let out = pipeline(&dir.path().join("ws"), &["run", spec.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = stderr(&out);
    for key in ["likelihood", "task", "latent"] {
        assert!(err.contains(&format!("[train] {key}")), "{key}: {err}");
    }
    assert!(!dir.path().join("data").exists(), "no stage ran");
}

#[test]
fn early_stopping_of_a_binary_run_watches_the_validation_nlp_lower_is_better() {
    let p = prepared();
    let ws = p.copy("early");
    // The same rows with a quarter carved into a validation split.
    let src = ws.parent().unwrap().join("src");
    pipeline_ok(
        &ws,
        &[
            "ingest",
            "--name",
            "binval",
            "--train",
            src.join("train.txt").to_str().unwrap(),
            "--chunk-rows",
            "100",
            "--validation-fraction",
            "0.25",
        ],
    );
    let svd = [
        "svd",
        "--dataset",
        "binval",
        "--rank",
        "8",
        "--inducing",
        "16",
    ];
    pipeline_ok(&ws, &svd);
    let task = ["--dataset", "binval", "--task", "binary", "--seed", "5"];
    let early = [
        "--steps",
        "90",
        "--early-stopping",
        "--validate-every",
        "3",
        "--patience",
        "4",
    ];
    let id = train_with(&ws, &classify::train_args(&task, &[], &early));
    assert_eq!(
        run_params(&ws, id)["early_stopping"],
        serde_json::json!({"metric": "nlp", "patience": 4, "every": 3})
    );
    let scores: Vec<(i64, f64)> = metrics(&ws, id, "early_stopping_score")
        .into_iter()
        .map(|(step, bits)| (step, f64::from_bits(bits)))
        .collect();
    assert!(scores.len() >= 5, "{scores:?}");
    // The rule, lower is better: the first of the lowest NLPs before a stop, and the stop
    // after 4 scores without a strictly lower one.
    let (mut best, mut best_step, mut since, mut stop) = (f64::INFINITY, 0, 0, None);
    for &(step, nlp) in &scores {
        assert!(nlp.is_finite() && nlp > 0.0, "step {step}: NLP {nlp}");
        if nlp < best {
            (best, best_step, since) = (nlp, step, 0);
        } else {
            since += 1;
            if since == 4 {
                stop = Some(step);
                break;
            }
        }
    }
    let text: String = common::toy::catalog(&ws)
        .query_row(
            "SELECT stopped FROM run_options WHERE stage_run_id = ?1",
            [id],
            |r| r.get(0),
        )
        .unwrap();
    let record: serde_json::Value = serde_json::from_str(&text).unwrap();
    let (reason, last) = match stop {
        Some(step) => ("no-improvement", step),
        None => ("budget", 90),
    };
    assert_eq!(
        (&record["reason"], &record["step"]),
        (&reason.into(), &last.into())
    );
    assert_eq!(record["best"]["metric"], "nlp");
    assert_eq!(record["best"]["step"], best_step);
    assert_eq!(
        record["best"]["value"].as_f64().unwrap().to_bits(),
        best.to_bits()
    );
    // The scores fell from the first: the NLP was watched, not a figure that rises.
    assert!(best < scores[0].1, "{scores:?}");
    let marked: i64 = common::toy::catalog(&ws)
        .query_row(
            "SELECT step FROM checkpoints WHERE stage_run_id = ?1 AND best = 1",
            [id],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(marked, best_step);
}
