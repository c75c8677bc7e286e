//! `--ard features` end to end on the toy workspace of `common::toy`: a run is
//! deterministic for its seed, records the option and the D weights, resumes after a crash
//! to the bytes of an uninterrupted run and refuses to change the option on resume;
//! `pipeline elbo` equals an independent one-batch evaluation of the bound, and predict,
//! evaluate, status and `--eval-every` run; the identity basis is refused.

use crate::common;
use common::toy::*;
use common::*;
use faer::Mat;
use fsgp::model::bound::objective::{bound_and_grads_feature_ard, BoundOptions};
use fsgp::model::bound::terms::TermSet;
use fsgp::model::kernel::feature_ard::{FeatureInputs, FeatureRows};
use fsgp::model::kernel::KernelKind;
use fsgp::model::likelihood::logistic::BernoulliLogistic;
use fsgp::model::params::Params;
use fsgp::model::scratch::Scratch;
use std::path::Path;

/// The toy run with feature ARD (D = 60 weights over an R = 8 basis), ranking the test
/// split every 3 epochs.
fn run_args(kernel: &'static str) -> Vec<&'static str> {
    vec!["--kernel", kernel, "--ard", "features", "--eval-every", "3"]
}

/// The exact bound of `params` with all 900 training rows as one batch through the
/// gradient path (`bound_and_grads_feature_ard`, C_p), independently of the streaming `pipeline elbo`
/// (which weighs each minibatch's rows and runs forward only): rows and labels from the
/// chunks, the basis from `basis.npy`.
fn one_batch_feature_bound(ws: &Path, kind: KernelKind, params: &Params) -> f64 {
    let basis: ndarray::Array2<f32> = ndarray_npy::read_npy(artifact(ws, "basis")).unwrap();
    let basis = Mat::from_fn(basis.nrows(), basis.ncols(), |i, j| {
        f64::from(basis[(i, j)])
    });
    let (mut rows, mut positives) = (FeatureRows::new(), Vec::new());
    for path in train_chunks(ws) {
        let chunk = fsgp::store::chunks::read_chunk(&path).unwrap();
        for i in 0..chunk.len() {
            let r = chunk.row(i);
            rows.push_row(r.indices, r.values.iter().map(|&v| f64::from(v)));
            positives.push(r.labels.to_vec());
        }
    }
    assert_eq!(rows.len(), 900);
    let fx = FeatureInputs {
        rows: &rows,
        basis: basis.as_ref(),
    };
    let terms = TermSet::AllLabels {
        positives: &positives,
        scale: 1.0,
    };
    let lik = BernoulliLogistic::new(20).unwrap();
    let opts = BoundOptions {
        kernel_grads: false,
        ..BoundOptions::default()
    };
    bound_and_grads_feature_ard(kind, params, &fx, &terms, &lik, &opts, &Scratch::new())
        .unwrap()
        .value
}

#[test]
fn feature_ard_trains_deterministically_and_predicts_evaluates_and_bounds() {
    let p = prepared();
    for (kernel, kind) in [
        ("linear", KernelKind::Linear),
        ("se", KernelKind::SquaredExponential),
    ] {
        let ws = p.copy(&format!("{kernel}-a"));
        let id = train_ok(&ws, &run_args(kernel));
        // The same seed gives the same bytes in a second workspace.
        let again = p.copy(&format!("{kernel}-b"));
        let id_again = train_ok(&again, &run_args(kernel));
        assert_eq!(
            checkpoints(&ws, id),
            checkpoints(&again, id_again),
            "{kernel}"
        );
        assert_eq!(run_params(&ws, id)["ard"], "features", "{kernel}");
        // The D = 60 weights are in the checkpoint, started at w = 1 and trained.
        let c = read_ckpt(&ws, id, STEPS);
        let w = &c.params.kernel.log_features;
        assert_eq!(w.len(), 60, "{kernel}");
        assert!(c.params.kernel.log_ard.is_empty(), "{kernel}");
        let moved = w.iter().filter(|v| **v != 0.0).count();
        assert!(moved >= 50, "{kernel}: only {moved} of 60 weights moved");
        // The streamed exact bound equals the one-batch evaluation.
        let out = pipeline(
            &ws,
            &["elbo", "--run", &id.to_string(), "--checkpoint", "14"],
        );
        assert!(out.status.success(), "{kernel}: {}", stderr(&out));
        let recorded = metrics(&ws, id, "elbo_exact");
        let streamed = f64::from_bits(recorded.iter().find(|m| m.0 == 14).unwrap().1);
        let direct = one_batch_feature_bound(&ws, kind, &read_ckpt(&ws, id, 14).params);
        eprintln!(
            "{kernel}: exact bound at step 14 streamed {streamed:.12e}, one batch {direct:.12e}"
        );
        assert!(
            (streamed - direct).abs() <= 1e-9 * direct.abs(),
            "{kernel}: streamed {streamed} vs one batch {direct}"
        );
        // The held-out ranking of --eval-every ran on the weighted inputs.
        assert!(
            !metrics(&ws, id, "P@1").is_empty(),
            "{kernel}: no held-out P@1"
        );
        for args in [
            vec!["predict", "--run", &id.to_string(), "--probabilities"],
            vec!["evaluate", "--run", &id.to_string()],
            vec!["status", "--run", &id.to_string()],
        ] {
            let out = pipeline(&ws, &args.iter().map(|s| s.as_ref()).collect::<Vec<&str>>());
            assert!(out.status.success(), "{kernel} {args:?}: {}", stderr(&out));
            if args[0] == "status" {
                assert!(stdout(&out).contains("features"), "{}", stdout(&out));
            }
        }
    }
}

#[test]
fn a_crashed_feature_ard_run_resumes_to_the_bytes_of_an_uninterrupted_one() {
    let p = prepared();
    let reference = p.copy("ref");
    let args = run_args("linear");
    let run_ref = train_ok(&reference, &args);
    let expected = checkpoints(&reference, run_ref);
    let ws = p.copy("crash");
    let id = crash_at(&ws, &args, "checkpoint-renamed:35");
    // The option cannot change on resume; both values are named.
    let out = pipeline(
        &ws,
        &["train", "--resume", &id.to_string(), "--ard", "none"],
    );
    assert!(!out.status.success(), "--ard none was accepted on resume");
    let message = format!("--ard none: run {id} has features");
    assert!(stderr(&out).contains(&message), "{}", stderr(&out));
    let out = pipeline(&ws, &["train", "--resume", &id.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(checkpoints(&ws, id), expected);
}

#[test]
fn feature_ard_with_the_identity_basis_is_refused_pointing_to_subspace_ard() {
    let p = prepared();
    let ws = p.copy("identity");
    for inputs in ["free", "fixed-rows"] {
        let out = pipeline(
            &ws,
            &train_args(&["--ard", "features", "--inducing-inputs", inputs]),
        );
        assert!(!out.status.success(), "{inputs} was accepted");
        let e = stderr(&out);
        assert!(
            e.contains(&format!("--ard features with --inducing-inputs {inputs}"))
                && e.contains("use --ard subspace"),
            "{e}"
        );
    }
}
