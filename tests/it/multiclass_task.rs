//! Multi-class GP classification end to end (`--task multiclass` with `--likelihood ove`,
//! `robust-max`, `softmax` and `hl`; docs/model.md, "Tasks and latent functions"): four Gaussian
//! blobs made here, written as a LIBSVM file of class labels 1..4 and ingested with
//! `--format libsvm`; trained with each likelihood (independent GPs, and one factor run),
//! predicted with class probabilities and evaluated with `--task auto`: accuracy far above
//! chance (¼); `pipeline elbo` against an independent one-batch sum; determinism and
//! kill/resume to the same bytes with the sampling likelihood and with Hernández-Lobato's
//! (whose exact bound is also checked); the refusals.

use crate::common;
use common::blobs::Blobs;
use common::classify;
use common::toy::{
    assert_resume_refused, assert_resumes_to, assert_same_run_bytes, checkpoints, crash_with,
    metrics, newest_run, read_ckpt, run_params, train_with, Prepared,
};
use common::*;
use fsgp::model::bound::terms::TermSet;
use fsgp::model::kernel::KernelKind;
use fsgp::model::likelihood::multiclass::ar_logit::ArLogit;
use fsgp::model::likelihood::multiclass::ar_softmax::ArSoftmax;
use fsgp::model::likelihood::multiclass::hernandez_lobato::HernandezLobato;
use fsgp::model::likelihood::multiclass::robust_max::RobustMax;
use fsgp::model::likelihood::multiclass::{ClassLikelihood, Classes};
use fsgp::model::params::Params;
use std::path::Path;

/// Classes (and features per row).
const K: usize = 4;
const TRAIN_ROWS: usize = 400;
const TEST_ROWS: usize = 200;

/// A workspace with the blobs dataset `blobs` ingested (100-row chunks, not normalised)
/// and factorised (R = K = 4, M = 12), and the test rows' classes.
fn prepared() -> Prepared<Vec<u32>> {
    let blobs = Blobs {
        classes: K,
        noise_sd: 0.6,
        train_rows: TRAIN_ROWS,
        test_rows: TEST_ROWS,
        seed: 23,
    };
    Prepared::new(|dir| blobs.workspace(dir, 12))
}

/// The multi-class training command ([`classify::train_args`]) on `blobs`, the SE kernel,
/// seed 7. `--epochs` is 12 and `--latent` independent unless `extra` gives them.
fn train_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let task = [
        "--dataset",
        "blobs",
        "--task",
        "multiclass",
        "--kernel",
        "se",
        "--seed",
        "7",
    ];
    let defaults = [("--epochs", "12"), ("--latent", "independent")];
    classify::train_args(&task, &defaults, extra)
}

fn train(ws: &Path, extra: &[&str]) -> i64 {
    train_with(ws, &train_args(extra))
}

/// `predict --top-k 2 --probabilities` of the test split: per row its two classes and
/// their probabilities (and scores, which must equal them), and the predict run's params.
type Predicted = Vec<(u64, Vec<u32>, Vec<f32>)>;

fn predict(ws: &Path, run: i64) -> (Predicted, serde_json::Value) {
    let (rows, params) = classify::predict_probabilities(ws, run, &["--top-k", "2"], 2);
    let rows = rows
        .into_iter()
        .map(|r| {
            assert_eq!(r.scores, r.probabilities, "scores = probabilities");
            (r.row, r.labels, r.probabilities)
        })
        .collect();
    (rows, params)
}

/// Share of test rows whose most probable class is theirs; asserts the probabilities are
/// ordered, in [0, 1] and sum to at most 1 over the two kept classes.
fn accuracy(rows: &Predicted, classes: &[u32]) -> f64 {
    assert_eq!(rows.len(), classes.len());
    let mut right = 0;
    for (i, (row, labels, p)) in rows.iter().enumerate() {
        assert_eq!(*row, i as u64);
        assert!(
            p[0] >= p[1] && p[1] >= 0.0 && p[0] <= 1.0,
            "row {row}: {p:?}"
        );
        assert!(p[0] + p[1] <= 1.0 + 1e-5, "row {row}: {p:?}");
        right += usize::from(labels[0] == classes[i]);
    }
    right as f64 / classes.len() as f64
}

/// The bound of a run's `params` under the class likelihood `lik` (noise seed 0) with all
/// training rows as one batch, computed apart from the streaming `pipeline elbo`: K_XX̃,
/// norms and basis from the svd artifacts, classes from the chunks, every row a term of
/// weight 1; `bound_and_grads`'s value is Σ_i E_i − Σ_p KL_p.
fn one_batch_bound(ws: &Path, params: &Params, lik: &dyn ClassLikelihood) -> f64 {
    let batch = common::toy::OneBatch::read(ws);
    let class = batch.classes();
    assert_eq!(class.len(), TRAIN_ROWS);
    let terms = TermSet::Classes(Classes {
        class: &class,
        scale: 1.0,
        lik,
        seed: 0,
        first_stream: 0,
    });
    // The per-term likelihood argument is not used by a class term set.
    let unused = fsgp::model::likelihood::logistic::BernoulliLogistic::new(20).unwrap();
    batch.bound(KernelKind::SquaredExponential, params, &terms, &unused)
}

/// `evaluate --run RUN --k 4 --json` (its task from the run; every class listed, so NLP is
/// defined): the metrics JSON.
fn evaluate(ws: &Path, run: i64) -> serde_json::Value {
    let run = run.to_string();
    let out = pipeline_ok(ws, &["evaluate", "--run", &run, "--k", "4", "--json"]);
    serde_json::from_str(&out).unwrap()
}

#[test]
fn every_multiclass_likelihood_trains_predicts_and_evaluates_far_above_chance() {
    let p = prepared();
    let cases: [(&str, &[&str]); 8] = [
        ("ove", &["--likelihood", "ove", "--eval-every", "6"]),
        ("robust-max", &["--likelihood", "robust-max"]),
        ("softmax", &["--likelihood", "softmax", "--mc-pairs", "4"]),
        (
            "ove-factor",
            &[
                "--likelihood",
                "ove",
                "--latent",
                "factor",
                "--factors",
                "3",
            ],
        ),
        ("ar-softmax", &["--likelihood", "ar-softmax"]),
        (
            "ar-softmax-sampled",
            &[
                "--likelihood",
                "ar-softmax",
                "--class-samples",
                "2",
                "--amortiser-hidden",
                "8",
            ],
        ),
        (
            "ove-sampled",
            &["--likelihood", "ove", "--class-samples", "1"],
        ),
        ("ar-logit", &["--likelihood", "ar-logit"]),
    ];
    for (name, extra) in cases {
        let ws = p.copy(name);
        let id = train(&ws, extra);
        let params = run_params(&ws, id);
        assert_eq!(params["task"], "multiclass", "{name}");
        let lik = name
            .trim_end_matches("-factor")
            .trim_end_matches("-sampled");
        assert_eq!(params["likelihood"], lik, "{name}");
        if name == "softmax" {
            assert_eq!(params["mc_pairs"], 4);
        } else {
            assert!(params.get("mc_pairs").is_none(), "{name}: {params}");
        }
        let (rows, predict_params) = predict(&ws, id);
        assert_eq!(
            predict_params["predictive"],
            format!("classes-{lik}"),
            "{name}"
        );
        let acc = accuracy(&rows, &p.test_classes);
        eprintln!("{name}: test accuracy {acc:.3}");
        assert!(acc >= 0.85, "{name}: accuracy {acc} (chance 0.25)");
        if name == "ove" {
            // Held-out figures at epochs 6 and 12; the last is the predictions' accuracy.
            let held = metrics(&ws, id, "accuracy");
            assert_eq!(held.iter().map(|m| m.0).collect::<Vec<_>>(), [6, 12]);
            let last = f64::from_bits(held[1].1);
            assert!(
                (last - acc).abs() < 1e-12,
                "held-out {last} vs predicted {acc}"
            );
            let nlp = f64::from_bits(metrics(&ws, id, "nlp")[1].1);
            assert!(nlp > 0.0 && nlp < 0.7, "mean NLP {nlp}");
        }
        if name == "ove-factor" {
            let phi = read_ckpt(&ws, id, 96).params.phi;
            assert_eq!((phi.nrows(), phi.ncols()), (K, 3));
        }
        // The augment-and-reduce runs carry the amortisation network (R = 4 inputs; one
        // output, α, or two, q(ε)'s location and scale); the flags are recorded only when
        // given off their defaults.
        let net = read_ckpt(&ws, id, 96).params.amortiser;
        assert_eq!(net.is_some(), lik.starts_with("ar-"), "{name}");
        if lik == "ar-logit" {
            assert_eq!(net.as_ref().unwrap().outputs(), 2);
        }
        if name == "ar-softmax-sampled" {
            assert_eq!(
                (
                    params["class_samples"].clone(),
                    params["amortiser_hidden"].clone()
                ),
                (2.into(), 8.into())
            );
            let net = net.unwrap();
            assert_eq!((net.inputs(), net.hidden(), net.outputs()), (4, 8, 1));
        } else if name == "ove-sampled" {
            assert_eq!(params["class_samples"], 1);
        } else {
            for key in ["class_samples", "amortiser_hidden"] {
                assert!(params.get(key).is_none(), "{name}: {params}");
            }
        }
        let m = evaluate(&ws, id);
        assert_eq!(m["task"], "multiclass", "{m}");
        let top1 = m["accuracy"].as_f64().unwrap();
        assert!(
            (top1 - acc).abs() < 1e-9,
            "{name}: evaluate {top1} vs {acc}"
        );
        assert!(m["top_k_accuracy"][1].as_f64().unwrap() >= top1);
        assert_eq!(m["top_k_accuracy"][3].as_f64().unwrap(), 1.0, "{m}");
        let nlp = m["nlp"].as_f64().unwrap();
        eprintln!("{name}: evaluate NLP {nlp:.4}, ECE {}", m["ece"]);
        assert!(nlp > 0.0 && nlp < 0.7, "{name}: {m}");
    }
}

#[test]
fn the_exact_bound_of_a_robust_max_run_is_the_one_batch_sum() {
    let p = prepared();
    let ws = p.copy("elbo");
    let id = train(&ws, &["--likelihood", "robust-max", "--epochs", "3"]);
    let recorded = metrics(&ws, id, "elbo_exact");
    assert_eq!(recorded.len(), 1, "the final bound");
    let last = *checkpoints(&ws, id).keys().last().unwrap();
    let out = pipeline(&ws, &["elbo", "--run", &id.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let recorded = metrics(&ws, id, "elbo_exact");
    let streamed = f64::from_bits(recorded.last().unwrap().1);
    // ε = 10⁻³, 20 Gauss–Hermite points: the run's.
    let lik = RobustMax::new(1e-3, 20).unwrap();
    let direct = one_batch_bound(&ws, &read_ckpt(&ws, id, last).params, &lik);
    eprintln!("exact bound: streamed {streamed}, one batch {direct}");
    assert!(
        (streamed - direct).abs() <= 1e-9 * direct.abs(),
        "streamed {streamed} vs one batch {direct}"
    );
}

#[test]
fn the_exact_bound_of_a_subsampled_augment_and_reduce_run_sums_every_negative_through_the_network()
{
    let p = prepared();
    let points = fsgp::model::likelihood::DEFAULT_POINTS;
    type Lik = Box<dyn ClassLikelihood>;
    let cases: [(&str, Lik, Lik); 2] = [
        (
            "ar-softmax",
            Box::new(ArSoftmax::new(16, None).unwrap()),
            Box::new(ArSoftmax::new(16, Some(1)).unwrap()),
        ),
        (
            "ar-logit",
            Box::new(ArLogit::new(points, 16, None).unwrap()),
            Box::new(ArLogit::new(points, 16, Some(1)).unwrap()),
        ),
    ];
    for (name, all, one) in cases {
        let ws = p.copy(&format!("{name}-elbo"));
        let id = train(
            &ws,
            &[
                "--likelihood",
                name,
                "--class-samples",
                "1",
                "--epochs",
                "3",
            ],
        );
        let last = *checkpoints(&ws, id).keys().last().unwrap();
        let out = pipeline(&ws, &["elbo", "--run", &id.to_string()]);
        assert!(out.status.success(), "{}", stderr(&out));
        let streamed = f64::from_bits(metrics(&ws, id, "elbo_exact").last().unwrap().1);
        let params = read_ckpt(&ws, id, last).params;
        assert!(params.amortiser.is_some());
        let direct = one_batch_bound(&ws, &params, all.as_ref());
        eprintln!("{name} exact bound: streamed {streamed}, one batch {direct}");
        assert!(
            (streamed - direct).abs() <= 1e-9 * direct.abs(),
            "{name}: streamed {streamed} vs one batch {direct}"
        );
        // One sampled negative of three is another number: the exact bound is not it.
        let sampled = one_batch_bound(&ws, &params, one.as_ref());
        assert!(
            (sampled - direct).abs() > 1e-6 * direct.abs(),
            "{name}: {sampled} vs {direct}"
        );
    }
}

#[test]
fn ove_with_as_many_class_samples_as_negatives_trains_the_same_parameters() {
    let p = prepared();
    let (ws_all, ws_s) = (p.copy("all"), p.copy("s3"));
    let extra = ["--likelihood", "ove", "--epochs", "2"];
    let run_all = train(&ws_all, &extra);
    let mut with_s = extra.to_vec();
    with_s.extend(["--class-samples", "3"]);
    let run_s = train(&ws_s, &with_s);
    let last = *checkpoints(&ws_all, run_all).keys().last().unwrap();
    let (a, b) = (
        read_ckpt(&ws_all, run_all, last),
        read_ckpt(&ws_s, run_s, last),
    );
    assert!(
        a.params == b.params && a.adam == b.adam,
        "S = K − 1 is every negative"
    );
    assert_eq!(
        metrics(&ws_all, run_all, "elbo_exact"),
        metrics(&ws_s, run_s, "elbo_exact")
    );
}

#[test]
fn ar_softmax_runs_are_deterministic_and_resume_after_a_kill_to_the_same_bytes() {
    let p = prepared();
    let extra = [
        "--likelihood",
        "ar-softmax",
        "--class-samples",
        "2",
        "--amortiser-hidden",
        "6",
        "--epochs",
        "4",
    ];
    let (ws_a, ws_b, ws_cut) = (p.copy("a"), p.copy("b"), p.copy("cut"));
    let run_a = train(&ws_a, &extra);
    let run_b = train(&ws_b, &extra);
    let bytes = assert_same_run_bytes((&ws_a, run_a), (&ws_b, run_b));
    let id = crash_with(&ws_cut, &train_args(&extra), "checkpoint-renamed:18");
    // Changing the class samples or the network's width is refused, naming both values.
    for (flag, value, run) in [("--class-samples", "3", 2), ("--amortiser-hidden", "7", 6)] {
        let message = format!("{flag} {value}: run {id} has {run}");
        assert_resume_refused(&ws_cut, id, &[flag, value], &message);
    }
    assert_resumes_to(&ws_cut, id, &bytes, &metrics(&ws_a, run_a, "elbo_exact"));
}

#[test]
fn softmax_runs_are_deterministic_and_resume_after_a_kill_to_the_same_bytes() {
    let p = prepared();
    let extra = [
        "--likelihood",
        "softmax",
        "--mc-pairs",
        "3",
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
    // Another seed draws other noise (and another shuffle): other bytes.
    let ws_c = p.copy("c");
    let mut other = extra.to_vec();
    other.extend(["--fresh"]);
    let args: Vec<&str> = train_args(&other)
        .into_iter()
        .map(|a| if a == "7" { "8" } else { a })
        .collect();
    let out = pipeline(&ws_c, &args);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_ne!(
        checkpoints(&ws_c, newest_run(&ws_c, "train"))[&32],
        bytes[&32]
    );

    // Killed just after the checkpoint of step 18 was published, then resumed.
    let id = crash_with(&ws_cut, &train_args(&extra), "checkpoint-renamed:18");
    // Resuming with another likelihood or other Monte Carlo pairs is refused, naming both.
    let refused = [("--likelihood", "ove", "softmax"), ("--mc-pairs", "5", "3")];
    for (flag, value, run) in refused {
        let message = format!("{flag} {value}: run {id} has {run}");
        assert_resume_refused(&ws_cut, id, &[flag, value], &message);
    }
    assert_resumes_to(&ws_cut, id, &bytes, &metrics(&ws_a, run_a, "elbo_exact"));
}

/// The Hernández-Lobato likelihood end to end: far above chance on the four blobs, its
/// exact bound the one-batch sum of `HernandezLobato` (20 points), the same bytes from the
/// same seed, and a run killed after a checkpoint resumes to those bytes.
#[test]
fn hernandez_lobato_runs_train_exactly_deterministically_and_resume() {
    let p = prepared();
    let extra = ["--likelihood", "hl"];
    let (ws_a, ws_b, ws_cut) = (p.copy("hl-a"), p.copy("hl-b"), p.copy("hl-cut"));
    let run_a = train(&ws_a, &extra);
    let params = run_params(&ws_a, run_a);
    assert_eq!(params["likelihood"], "hl");
    assert!(params.get("mc_pairs").is_none(), "{params}");
    let (rows, predict_params) = predict(&ws_a, run_a);
    assert_eq!(predict_params["predictive"], "classes-hl");
    let acc = accuracy(&rows, &p.test_classes);
    eprintln!("hl: test accuracy {acc:.3}");
    assert!(acc >= 0.85, "hl: accuracy {acc} (chance 0.25)");
    let m = evaluate(&ws_a, run_a);
    assert!((m["accuracy"].as_f64().unwrap() - acc).abs() < 1e-9, "{m}");
    let nlp = m["nlp"].as_f64().unwrap();
    assert!(nlp > 0.0 && nlp < 0.7, "hl: {m}");

    let bytes = checkpoints(&ws_a, run_a);
    let last = *bytes.keys().last().unwrap();
    let recorded = metrics(&ws_a, run_a, "elbo_exact");
    let streamed = f64::from_bits(recorded.last().unwrap().1);
    let lik = HernandezLobato::new(20).unwrap();
    let direct = one_batch_bound(&ws_a, &read_ckpt(&ws_a, run_a, last).params, &lik);
    eprintln!("hl exact bound: streamed {streamed}, one batch {direct}");
    assert!(
        (streamed - direct).abs() <= 1e-9 * direct.abs(),
        "streamed {streamed} vs one batch {direct}"
    );

    let run_b = train(&ws_b, &extra);
    assert_same_run_bytes((&ws_a, run_a), (&ws_b, run_b));
    let id = crash_with(&ws_cut, &train_args(&extra), "checkpoint-renamed:18");
    let message = format!("--likelihood ove: run {id} has hl");
    assert_resume_refused(&ws_cut, id, &["--likelihood", "ove"], &message);
    assert_resumes_to(&ws_cut, id, &bytes, &recorded);
}

/// `--learn-epsilon`: robust-max's ε trained as logit ε from the fixed default 10⁻³,
/// recorded in the run and its checkpoints, used by the exact bound, and fixed on resume.
#[test]
fn robust_max_with_a_learnt_epsilon_trains_and_records_it() {
    let p = prepared();
    let ws = p.copy("learn-eps");
    let extra = [
        "--likelihood",
        "robust-max",
        "--learn-epsilon",
        "--epochs",
        "6",
    ];
    let id = train(&ws, &extra);
    assert_eq!(run_params(&ws, id)["learn_epsilon"], true);
    let bytes = checkpoints(&ws, id);
    let last = *bytes.keys().last().unwrap();
    let params = read_ckpt(&ws, id, last).params;
    let theta = params.logit_epsilon.expect("the checkpoint holds logit ε");
    let start = (1e-3f64 / (1.0 - 1e-3)).ln();
    let eps = 1.0 / (1.0 + (-theta).exp());
    eprintln!("learnt ε {eps:.3e} (from 1e-3)");
    assert!((theta - start).abs() > 1e-3, "θ stayed at {theta}");
    let (rows, _) = predict(&ws, id);
    let acc = accuracy(&rows, &p.test_classes);
    assert!(acc >= 0.85, "accuracy {acc}");
    // The exact bound is the one-batch sum at the learnt ε (the fixed ε is then unused).
    let streamed = f64::from_bits(metrics(&ws, id, "elbo_exact").last().unwrap().1);
    let lik = RobustMax::new(1e-3, 20).unwrap();
    let direct = one_batch_bound(&ws, &params, &lik);
    assert!(
        (streamed - direct).abs() <= 1e-9 * direct.abs(),
        "streamed {streamed} vs one batch {direct}"
    );
    // A fixed-ε run has no such block, and a resume cannot switch learning on.
    let ws_fixed = p.copy("fixed-eps");
    let fixed = train(&ws_fixed, &["--likelihood", "robust-max", "--epochs", "1"]);
    assert!(run_params(&ws_fixed, fixed).get("learn_epsilon").is_none());
    let fixed_last = *checkpoints(&ws_fixed, fixed).keys().last().unwrap();
    assert!(read_ckpt(&ws_fixed, fixed, fixed_last)
        .params
        .logit_epsilon
        .is_none());
    let out = pipeline(
        &ws_fixed,
        &["train", "--resume", &fixed.to_string(), "--learn-epsilon"],
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("--learn-epsilon true: run") && err.contains("has false"),
        "{err}"
    );
}

#[test]
fn likelihoods_must_suit_the_task_and_the_data() {
    let p = prepared();
    let ws = p.copy("refusals");
    let refused = |ws: &Path, args: Vec<&str>, texts: &[&str]| {
        let out = pipeline(ws, &args);
        assert!(!out.status.success(), "{args:?} should fail");
        let err = stderr(&out);
        for t in texts {
            assert!(err.contains(t), "{args:?}: expected {t:?} in {err}");
        }
    };
    refused(
        &ws,
        train_args(&[]),
        &[
            "logistic with --task multiclass",
            "ove, robust-max, softmax, hl, ar-softmax or ar-logit",
        ],
    );
    let mut ove_multilabel = train_args(&["--likelihood", "ove"]);
    let at = ove_multilabel
        .iter()
        .position(|a| *a == "multiclass")
        .unwrap();
    ove_multilabel[at] = "multilabel";
    refused(
        &ws,
        ove_multilabel,
        &["ove is a likelihood of one class among K"],
    );
    refused(
        &ws,
        train_args(&["--likelihood", "softmax", "--robust-max-epsilon", "0.01"]),
        &["robust-max-epsilon", "the likelihood is softmax"],
    );
    refused(
        &ws,
        train_args(&["--likelihood", "robust-max", "--robust-max-epsilon", "1.5"]),
        &["robust-max-epsilon", "(0, 1)"],
    );
    refused(
        &ws,
        train_args(&["--likelihood", "ove", "--learn-epsilon"]),
        &["learn-epsilon", "the likelihood is ove"],
    );
    refused(
        &ws,
        train_args(&["--likelihood", "robust-max", "--mc-pairs", "2"]),
        &["mc-pairs", "the likelihood is robust-max"],
    );
    refused(
        &ws,
        train_args(&["--likelihood", "ove", "--negatives", "2"]),
        &["--negatives all is the only choice"],
    );
    refused(
        &ws,
        train_args(&["--likelihood", "robust-max", "--class-samples", "2"]),
        &[
            "class-samples",
            "sum over the negative classes",
            "the likelihood is robust-max",
        ],
    );
    refused(
        &ws,
        train_args(&["--likelihood", "ove", "--class-samples", "0"]),
        &["class-samples", "0 is not in 1..="],
    );
    refused(
        &ws,
        train_args(&["--likelihood", "ove", "--amortiser-hidden", "8"]),
        &["amortiser-hidden", "the likelihood is ove"],
    );
    refused(
        &ws,
        train_args(&["--likelihood", "ar-softmax", "--amortiser-hidden", "0"]),
        &["amortiser-hidden", "0 is not in 1..="],
    );
    // A multi-label dataset whose rows hold several labels: refused at the first row that
    // does not hold exactly one, naming it.
    let toy_dir = tempfile::tempdir().unwrap();
    let toy = toy_dir.path().join("toy");
    common::toy::prepare(&toy);
    let mut args = common::toy::train_args(&[
        "--task",
        "multiclass",
        "--likelihood",
        "ove",
        "--negatives",
        "all",
    ]);
    args.extend(["--no-final-elbo"]);
    refused(
        &toy,
        args,
        &["--task multiclass: training row", "exactly one class"],
    );
}

#[test]
fn a_spec_with_a_likelihood_unfit_for_its_task_is_refused_before_any_stage() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("bad.toml");
    std::fs::write(
        &spec,
        "[synth]\nout = \"data\"\nrows = 50\ntest_rows = 10\nfeatures = 10\nlabels = 3\n\n\
         [ingest]\nname = \"toy\"\ntrain = \"data/train.txt\"\ntest = \"data/test.txt\"\n\n\
         [svd]\nrank = 3\ninducing = 4\n\n\
         [train]\ntask = \"multiclass\"\nlikelihood = \"probit\"\nmc_pairs = 0\n\
         robust_max_epsilon = 2.0\nclass_samples = 0\namortiser_hidden = 0\n\n\
         [predict]\n\n[evaluate]\n",
    )
    .unwrap();
    let out = pipeline(&dir.path().join("ws"), &["run", spec.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = stderr(&out);
    for key in [
        "likelihood",
        "mc_pairs",
        "robust_max_epsilon",
        "class_samples",
        "amortiser_hidden",
    ] {
        assert!(err.contains(&format!("[train] {key}")), "{key}: {err}");
    }
    assert!(!dir.path().join("data").exists(), "no stage ran");
}
