//! `pipeline train --q-form` end to end on the toy workspace of `common::toy`: each
//! full-Cholesky form trains, records the form in its configuration and checkpoints (the
//! packed factors, no ρ), learns, and its exact bound (`pipeline elbo`) equals an independent
//! one-batch computation; predictions run; a killed or crashed run of the unwhitened form
//! resumes to the bytes of an uninterrupted one; a changed --q-form is refused on resume;
//! the unwhitened form with a singular linear K_Z is refused up front; `pipeline run` specs
//! check the `q_form` key before any stage runs and pass it on.

use crate::common;
use common::toy::*;
use common::*;
use fsgp::model::kernel::KernelKind;
use fsgp::model::params::{packed_len, QForm};
use std::time::Instant;

#[test]
fn each_full_cholesky_form_trains_bounds_and_predicts() {
    let p = prepared();
    for (form, kernel, kind) in [
        (QForm::Whitened, "linear", KernelKind::Linear),
        (QForm::Cholesky, "se", KernelKind::SquaredExponential),
        (QForm::Whitened, "se", KernelKind::SquaredExponential),
    ] {
        let ws = p.copy(&format!("{}-{kernel}", form.name()));
        let id = train_ok(
            &ws,
            &[
                "--q-form",
                form.name(),
                "--kernel",
                kernel,
                "--epochs",
                "3",
                "--no-final-elbo",
            ],
        );
        let label = format!("{} {kernel}", form.name());
        assert_eq!(run_params(&ws, id)["q_form"], form.name(), "{label}");
        let c = read_ckpt(&ws, id, 48);
        assert_eq!(c.params.q_form(), form, "{label}");
        let chol = c.params.q.chol().unwrap();
        assert_eq!(chol.packed.nrows(), packed_len(16), "{label}");
        assert_eq!(chol.packed.ncols(), 3, "{label}");
        assert!(c.params.q.rho().is_none(), "{label}");
        let elbo = metrics(&ws, id, "epoch_elbo");
        let (first, last) = (f64::from_bits(elbo[0].1), f64::from_bits(elbo[2].1));
        assert!(last > first, "{label}: bound fell from {first} to {last}");

        let out = pipeline(&ws, &["elbo", "--run", &id.to_string()]);
        assert!(out.status.success(), "{label}: {}", stderr(&out));
        let recorded = metrics(&ws, id, "elbo_exact");
        assert_eq!(recorded.len(), 1, "{label}");
        let streamed = f64::from_bits(recorded[0].1);
        let direct = one_batch_bound(&ws, kind, &c.params);
        assert!(
            (streamed - direct).abs() <= 1e-9 * direct.abs(),
            "{label}: streamed {streamed} vs one batch {direct}"
        );
        for extra in [None, Some("--probabilities")] {
            let mut args = vec!["predict", "--run"];
            let id_s = id.to_string();
            args.push(&id_s);
            args.extend(extra);
            let out = pipeline(&ws, &args);
            assert!(out.status.success(), "{label} {extra:?}: {}", stderr(&out));
        }
    }
}

#[test]
fn a_killed_or_crashed_cholesky_run_resumes_to_identical_bytes() {
    let p = prepared();
    let args = ["--q-form", "cholesky", "--kernel", "se"];
    let reference = p.copy("ref");
    let t = Instant::now();
    let run_ref = train_ok(&reference, &args);
    let reference_secs = t.elapsed().as_secs_f64();
    let expected = checkpoints(&reference, run_ref);
    let elbo = metrics(&reference, run_ref, "epoch_elbo");

    // A crash right after a checkpoint is renamed into place.
    let ws = p.copy("crash");
    let id = crash_at(&ws, &args, "checkpoint-renamed:14");
    let out = pipeline(&ws, &["train", "--resume", &id.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(checkpoints(&ws, id), expected);

    // SIGKILL at several moments.
    let mut resumed = 0;
    for (i, frac) in [0.2, 0.4, 0.6, 0.8].into_iter().enumerate() {
        let ws = p.copy(&format!("kill{i}"));
        let Some(id) = train_killed_after(&ws, &args, reference_secs * frac) else {
            continue;
        };
        let out = pipeline(&ws, &["train", "--resume", &id.to_string()]);
        assert!(out.status.success(), "kill at {frac}: {}", stderr(&out));
        assert_eq!(checkpoints(&ws, id), expected, "kill at {frac}");
        assert_eq!(metrics(&ws, id, "epoch_elbo"), elbo, "kill at {frac}");
        resumed += 1;
    }
    eprintln!("{resumed} of 4 kills landed inside a {reference_secs:.2} s run");

    // The form cannot change on resume; the refusal names both values.
    let ws = p.copy("refuse");
    let id = crash_at(&ws, &args, "checkpoint-renamed:14");
    let out = pipeline(
        &ws,
        &["train", "--resume", &id.to_string(), "--q-form", "whitened"],
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("--q-form") && err.contains("cholesky") && err.contains("whitened"),
        "{err}"
    );
    assert_eq!(run_status(&ws, id), "interrupted");
}

#[test]
fn bad_or_unusable_q_forms_are_refused_up_front() {
    let p = prepared();
    let ws = p.copy("bad");
    let out = pipeline(&ws, &train_args(&["--q-form", "diagonal"]));
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("diagonal") && err.contains("sites, cholesky, whitened"),
        "{err}"
    );
    // The toy basis has rank 8 < M = 16: the linear K_Z is singular.
    let out = pipeline(&ws, &train_args(&["--q-form", "cholesky"]));
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("--q-form cholesky") && err.contains("R = 8") && err.contains("whitened"),
        "{err}"
    );
    assert_eq!(count_runs(&ws, "train", None), 0);
}

#[test]
fn pipeline_run_specs_validate_and_run_the_q_form() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let bad = write(
        dir.path(),
        "bad.toml",
        &toy_spec(1, "q_form = \"diagonal\"\n", ""),
    );
    let out = pipeline(&ws, &["run", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("[train]") && err.contains("diagonal") && err.contains("whitened"),
        "{err}"
    );
    assert!(
        !dir.path().join("data").exists() && !ws.exists(),
        "no stage may run on a bad spec"
    );

    let good = write(
        dir.path(),
        "good.toml",
        &toy_spec(2, "q_form = \"whitened\"\n", "probabilities = true\n"),
    );
    let out = pipeline(&ws, &["run", good.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let id = train_run_id(&ws);
    assert_eq!(run_params(&ws, id)["q_form"], "whitened");
}
