//! The issue-16 options together, end to end on the toy workspace of `common::toy` (each
//! was merged from its own branch and tested alone): the full-Cholesky q(u) forms with the
//! SE + linear kernel and subspace ARD train, give the exact bound of an independent
//! one-batch computation (`pipeline elbo`) and predict; free inducing inputs with feature
//! ARD (one weight per feature, D) train, predict and round-trip their checkpoint bit for
//! bit, and so do free inducing inputs with the whitened form; `--release-hyper-after` with
//! a full-Cholesky form trains L from step 0 and holds only the kernel hyperparameters;
//! `pipeline status` and `status --run N` show the form, kernel, ARD and inducing inputs.

use crate::common;
use common::toy::*;
use common::*;
use fsgp::model::kernel::KernelKind;
use fsgp::model::params::QForm;
use fsgp::store::checkpoint::{read_checkpoint, write_checkpoint};
use std::path::Path;

/// Features of the toy dataset (D) and its basis rank (R).
const D: usize = 60;
const R: usize = 8;

/// Predicts run `run` (with and without probabilities); fails the test on an error.
fn predict_ok(ws: &Path, run: i64, label: &str) {
    let id = run.to_string();
    for extra in [None, Some("--probabilities")] {
        let mut args = vec!["predict", "--run", id.as_str()];
        args.extend(extra);
        let out = pipeline(ws, &args);
        assert!(out.status.success(), "{label} {extra:?}: {}", stderr(&out));
    }
}

/// Writes checkpoint `step` of `run` again with `write_checkpoint` and asserts the bytes
/// equal the stored file's and the copy reads back to the same tensors.
fn assert_checkpoint_round_trips(ws: &Path, run: i64, step: u64, label: &str) {
    let stored = checkpoints(ws, run)[&step].clone();
    let c = read_ckpt(ws, run, step);
    let copy = ws.join(format!("roundtrip-{run}-{step}.ckpt"));
    write_checkpoint(&copy, &c).unwrap();
    assert!(
        std::fs::read(&copy).unwrap() == stored,
        "{label}: bytes differ"
    );
    let back = read_checkpoint(&copy).unwrap();
    assert_eq!(tensor_bits(&back), tensor_bits(&c), "{label}");
    assert_eq!(back.params.q.chol(), c.params.q.chol(), "{label}");
}

/// The status table row and the `status --run` detail of `run` show every choice.
fn assert_status_shows(ws: &Path, run: i64, form: &str, kernel: &str, ard: &str, z: &str) {
    let summary = train_summary(ws, run);
    assert_eq!(summary["q_form"], form);
    assert_eq!(summary["kernel"], kernel);
    assert_eq!(summary["ard"], ard);
    assert_eq!(summary["inducing_inputs"], z);
    let table = stdout(&pipeline(ws, &["status"]));
    let row = table
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("#{run} ")))
        .unwrap_or_else(|| panic!("no row of run {run} in {table}"));
    let shown_kernel = if ard == "none" {
        kernel.to_string()
    } else {
        format!("{kernel}+ard")
    };
    assert!(row.contains(&shown_kernel) && row.contains(form), "{row}");
    let detail = stdout(&pipeline(ws, &["status", "--run", &run.to_string()]));
    let line = format!("q(u) form: {form}, kernel: {kernel}, ARD: {ard}, inducing inputs: {z}");
    assert!(detail.contains(&line), "{detail}");
}

#[test]
fn full_cholesky_forms_train_bound_and_predict_with_se_plus_linear_and_subspace_ard() {
    let p = prepared();
    for (form, kernel, kind, ard) in [
        (
            QForm::Whitened,
            "se+linear",
            KernelKind::SePlusLinear,
            "subspace",
        ),
        (
            QForm::Cholesky,
            "se+linear",
            KernelKind::SePlusLinear,
            "none",
        ),
        (
            QForm::Cholesky,
            "se",
            KernelKind::SquaredExponential,
            "subspace",
        ),
    ] {
        let label = format!("{} {kernel} ard={ard}", form.name());
        let ws = p.copy(&format!("{}-{kernel}-{ard}", form.name()));
        let id = train_ok(
            &ws,
            &[
                "--q-form",
                form.name(),
                "--kernel",
                kernel,
                "--ard",
                ard,
                "--epochs",
                "2",
                "--no-final-elbo",
            ],
        );
        let c = read_ckpt(&ws, id, 32);
        assert_eq!(c.params.q_form(), form, "{label}");
        assert_eq!(c.params.kernel.log_lin2.is_some(), kernel == "se+linear");
        let n_ard = if ard == "none" { 0 } else { R };
        assert_eq!(c.params.kernel.log_ard.len(), n_ard, "{label}");
        // ARD weights start at ω = 1 and are trained.
        assert!(c.params.kernel.log_ard.iter().all(|v| *v != 0.0), "{label}");
        let elbo = metrics(&ws, id, "epoch_elbo");
        let (first, last) = (f64::from_bits(elbo[0].1), f64::from_bits(elbo[1].1));
        assert!(last > first, "{label}: bound fell from {first} to {last}");

        let out = pipeline(&ws, &["elbo", "--run", &id.to_string()]);
        assert!(out.status.success(), "{label}: {}", stderr(&out));
        let streamed = f64::from_bits(metrics(&ws, id, "elbo_exact")[0].1);
        let direct = one_batch_bound(&ws, kind, &c.params);
        assert!(
            (streamed - direct).abs() <= 1e-9 * direct.abs(),
            "{label}: streamed {streamed} vs one batch {direct}"
        );
        predict_ok(&ws, id, &label);
        assert_checkpoint_round_trips(&ws, id, 32, &label);
        assert_status_shows(&ws, id, form.name(), kernel, ard, "subspace");
    }
}

#[test]
fn free_inducing_inputs_with_feature_ard_or_the_whitened_form_train_predict_and_round_trip() {
    let p = prepared();
    for (extra, ard, form) in [
        (["--ard", "subspace"], "subspace", "sites"),
        (["--q-form", "whitened"], "none", "whitened"),
    ] {
        let label = format!("free {extra:?}");
        let ws = p.copy(&format!("free-{ard}-{form}"));
        let mut args = vec!["--inducing-inputs", "free", "--epochs", "2"];
        args.extend(extra);
        let id = train_ok(&ws, &args);
        let first = read_ckpt(&ws, id, 7);
        let c = read_ckpt(&ws, id, 32);
        // Z [M×D]; under ARD one weight per feature (the identity basis's columns).
        assert_eq!((c.params.a.nrows(), c.params.a.ncols()), (16, D), "{label}");
        let n_ard = if ard == "none" { 0 } else { D };
        assert_eq!(c.params.kernel.log_ard.len(), n_ard, "{label}");
        assert_ne!(first.params.a, c.params.a, "{label}: Z must train");
        if ard != "none" {
            assert_ne!(
                first.params.kernel.log_ard, c.params.kernel.log_ard,
                "{label}: ARD weights must train"
            );
        }
        assert_eq!(c.params.q_form().name(), form, "{label}");
        let params = run_params(&ws, id);
        assert_eq!(params["inducing_inputs"], "free", "{label}");
        let exact = metrics(&ws, id, "elbo_exact");
        assert!(f64::from_bits(exact[0].1).is_finite(), "{label}");
        predict_ok(&ws, id, &label);
        assert_checkpoint_round_trips(&ws, id, 32, &label);
        assert_status_shows(&ws, id, form, "linear", ard, "free");
    }
}

#[test]
fn release_hyper_after_with_a_full_cholesky_form_trains_l_from_the_first_step() {
    let p = prepared();
    let base = [
        "--q-form",
        "whitened",
        "--kernel",
        "se",
        "--epochs",
        "3",
        "--no-final-elbo",
    ];
    let ws = p.copy("release");
    let mut args = base.to_vec();
    args.extend(["--release-hyper-after", "2"]);
    let id = train_ok(&ws, &args);
    let ws_frozen = p.copy("frozen");
    let mut args = base.to_vec();
    args.push("--freeze-hyper");
    let frozen = train_ok(&ws_frozen, &args);
    // The whitened form starts at L_p = I: by step 7 (epoch 0) every factor has moved,
    // while the kernel hyperparameters are still at their initial values, those of the
    // --freeze-hyper run, whose other blocks took the same steps bit for bit.
    let held = read_ckpt(&ws, id, 7).params;
    let reference = read_ckpt(&ws_frozen, frozen, 7).params;
    let packed = &held.q.chol().unwrap().packed;
    let m = held.a.nrows();
    let identity = fsgp::model::qu::cholesky::pack_factors(
        &vec![faer::Mat::<f64>::identity(m, m); packed.ncols()],
        true,
    );
    for p in 0..packed.ncols() {
        assert_ne!(
            packed.col(p).to_owned(),
            identity.packed.col(p).to_owned(),
            "L_{p} did not train before the release"
        );
    }
    assert_eq!(held, reference);
    // From epoch 2 (step 32) on the hyperparameters train; the frozen run's do not.
    let released = read_ckpt(&ws, id, 48).params.kernel;
    let still = read_ckpt(&ws_frozen, frozen, 48).params.kernel;
    assert_eq!(still, reference.kernel);
    assert_ne!(released.log_sf2, held.kernel.log_sf2);
    assert_ne!(released.log_ell, held.kernel.log_ell);
    assert_eq!(run_params(&ws, id)["release_hyper_after"], 2);
}

/// Replaces checkpoint `step` of `run` by `c`, registering its new size and checksum so
/// that it loads as a valid checkpoint.
fn replace_checkpoint(ws: &Path, run: i64, step: u64, c: &fsgp::store::checkpoint::Checkpoint) {
    let conn = catalog(ws);
    let path: String = conn
        .query_row(
            "SELECT path FROM checkpoints WHERE stage_run_id = ?1 AND step = ?2",
            rusqlite::params![run, step as i64],
            |r| r.get(0),
        )
        .unwrap();
    let written = write_checkpoint(&ws.join(&path), c).unwrap();
    conn.execute(
        "UPDATE checkpoints SET bytes = ?1, checksum = ?2 WHERE path = ?3",
        rusqlite::params![written.bytes as i64, written.checksum, path],
    )
    .unwrap();
}

#[test]
fn full_cholesky_messages_name_k_z_and_an_unfactorisable_k_z_fails_predict_by_name() {
    let p = prepared();
    let ws = p.copy("messages");
    // The linear kernel at R = 8 < M = 16: K_Z is singular, the whitened form adds jitter,
    // and the log says what it factorised.
    let out = pipeline(
        &ws,
        &train_args(&["--q-form", "whitened", "--epochs", "1", "--no-final-elbo"]),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let log = stderr(&out);
    assert!(log.contains("Cholesky of K_Z failed; retried"), "{log}");
    assert!(!log.contains("K_Z + Σ"), "{log}");
    let id = train_run_id(&ws);
    // A checkpoint whose K_Z is NaN: predict stops with an error naming the run and the
    // checkpoint rather than writing rankings of NaN means.
    let mut c = read_ckpt(&ws, id, 16);
    c.params.kernel.log_sf2 = f64::NAN;
    replace_checkpoint(&ws, id, 16, &c);
    for extra in [None, Some("--probabilities")] {
        let id_s = id.to_string();
        let mut args = vec!["predict", "--run", id_s.as_str()];
        args.extend(extra);
        let out = pipeline(&ws, &args);
        assert!(
            !out.status.success(),
            "{extra:?}: predict accepted a NaN K_Z"
        );
        let err = stderr(&out);
        assert!(err.contains("Cholesky of K_Z failed"), "{extra:?}: {err}");
        assert!(
            err.contains(&format!("train run {id} (checkpoint step 16)")),
            "{extra:?}: {err}"
        );
    }
    assert_eq!(count_runs(&ws, "predict", Some("ok")), 0);
}
