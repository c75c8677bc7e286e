//! The SE + linear kernel, subspace ARD and the hyperparameter schedule end to end on the
//! toy workspace of `common::toy`: `--release-hyper-after` holds exactly the kernel
//! hyperparameters for its epochs and then trains them with fresh Adam moments; crashes
//! before, at and after the release resume to the bytes of an uninterrupted run; the
//! options are recorded and refused on resume when changed; train, `pipeline elbo` and
//! `pipeline predict` work for SE + linear with ARD.

use crate::common;
use common::toy::*;
use common::*;
use fsgp::model::kernel::KernelKind;
use fsgp::store::checkpoint::{read_checkpoint, Checkpoint};
use std::path::{Path, PathBuf};

/// SE + linear with subspace ARD, hyperparameters released after 2 of the 6 epochs (16
/// minibatches each, so at step 32), a checkpoint every 8 steps.
const KERNEL_RUN: &[&str] = &[
    "--kernel",
    "se+linear",
    "--ard",
    "subspace",
    "--release-hyper-after",
    "2",
    "--checkpoint-every",
    "8",
];
const RELEASE_STEP: u64 = 32;

/// The kernel hyperparameters of a checkpoint: [log σ_f², log ℓ, log σ_lin², log ω...].
fn hyper(c: &Checkpoint) -> Vec<f64> {
    let k = &c.params.kernel;
    let mut v = vec![k.log_sf2, k.log_ell, k.log_lin2.unwrap()];
    v.extend(&k.log_ard);
    v
}

/// Adam's moments of the kernel hyperparameters (the flat index's last entries).
fn hyper_moments(c: &Checkpoint) -> Vec<f64> {
    let n = hyper(c).len();
    let len = c.adam.m.len();
    c.adam.m[len - n..]
        .iter()
        .chain(&c.adam.v[len - n..])
        .copied()
        .collect()
}

#[test]
fn release_schedule_freezes_exactly_the_hyperparameters_then_trains_them() {
    let p = prepared();
    let ws = p.copy("schedule");
    let id = train_ok(&ws, KERNEL_RUN);
    let steps: Vec<u64> = checkpoints(&ws, id).keys().copied().collect();
    assert_eq!(steps, (8..=96).step_by(8).collect::<Vec<_>>());
    let first = read_ckpt(&ws, id, 8);
    let initial = hyper(&first);
    // The initial values: σ_f² = σ_lin² = ½, ω = 1 (R = 8 weights).
    assert_eq!(initial[0], -std::f64::consts::LN_2);
    assert_eq!(initial[2], -std::f64::consts::LN_2);
    assert_eq!(&initial[3..], &[0.0; 8]);
    let mut a_before = first.params.a.clone();
    for step in (16..=RELEASE_STEP).step_by(8) {
        let c = read_ckpt(&ws, id, step);
        assert_eq!(hyper(&c), initial, "step {step}: a hyperparameter moved");
        assert!(hyper_moments(&c).iter().all(|m| *m == 0.0), "step {step}");
        assert_ne!(c.params.a, a_before, "step {step}: A is trained throughout");
        a_before = c.params.a.clone();
    }
    let released = hyper(&read_ckpt(&ws, id, RELEASE_STEP + 8));
    for (i, (after, before)) in released.iter().zip(&initial).enumerate() {
        assert_ne!(
            after, before,
            "hyperparameter {i} not trained after the release"
        );
    }

    // The first released step moves each hyperparameter by lr · g/(|g| + ε) ≈ lr: its Adam
    // moments start at zero with bias corrections counted from the release.
    let cut = p.copy("cut");
    let mut args = KERNEL_RUN.to_vec();
    args.extend(["--max-steps", "33"]);
    let cut_id = train_ok(&cut, &args);
    let (at32, at33) = (read_ckpt(&cut, cut_id, 32), read_ckpt(&cut, cut_id, 33));
    assert_eq!(hyper(&at32), initial);
    for (i, (a, b)) in hyper(&at33).iter().zip(&initial).enumerate() {
        let step = (a - b).abs();
        assert!(
            (step - 0.01).abs() < 1e-5,
            "hyperparameter {i}: first step {step}, expected lr = 0.01"
        );
    }
    // The schedule and the model are in the run's configuration.
    let params = run_params(&ws, id);
    assert_eq!(params["kernel"], "se+linear");
    assert_eq!(params["ard"], "subspace");
    assert_eq!(params["release_hyper_after"], 2);
    let out = pipeline(&ws, &["status"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn crashes_around_the_release_resume_to_the_bytes_of_an_uninterrupted_run() {
    let p = prepared();
    let reference = p.copy("ref");
    let run_ref = train_ok(&reference, KERNEL_RUN);
    let expected = checkpoints(&reference, run_ref);
    for point in [
        "checkpoint-renamed:24",
        "checkpoint-renamed:32",
        "checkpoint-written:40",
    ] {
        let ws = p.copy(&point.replace(':', "-"));
        let id = crash_at(&ws, KERNEL_RUN, point);
        let out = pipeline(&ws, &["train", "--resume", &id.to_string()]);
        assert!(out.status.success(), "{point}: {}", stderr(&out));
        assert_eq!(checkpoints(&ws, id), expected, "{point}");
        if point.ends_with(":32") {
            // The model's options cannot change on resume; both values are named.
            let ws = p.copy("refused");
            let id = crash_at(&ws, KERNEL_RUN, point);
            for (args, message) in [
                (
                    ["--release-hyper-after", "3"],
                    format!("--release-hyper-after 3: run {id} has 2"),
                ),
                (
                    ["--ard", "none"],
                    format!("--ard none: run {id} has subspace"),
                ),
                (
                    ["--kernel", "se"],
                    format!("--kernel se: run {id} has se+linear"),
                ),
            ] {
                assert_resume_refused(&ws, id, &args, &message);
            }
        }
    }
}

#[test]
fn invalid_schedules_are_refused_with_the_flag_named() {
    let p = prepared();
    let ws = p.copy("invalid");
    for (args, message) in [
        (
            &["--release-hyper-after", "0"][..],
            "for '--release-hyper-after <E0>': 0 is not in 1..=1000000",
        ),
        (
            &["--release-hyper-after", "2", "--freeze-hyper"][..],
            "cannot be combined with --freeze-hyper",
        ),
        (
            &["--ard", "feature"][..],
            "possible values: none, subspace, features",
        ),
        (&["--kernel", "se+lin"][..], "se+linear"),
    ] {
        assert_train_refused(&ws, args, message);
    }
}

#[test]
fn se_plus_linear_with_ard_trains_predicts_and_gives_its_exact_bound() {
    let p = prepared();
    let ws = p.copy("e2e");
    let id = train_ok(
        &ws,
        &[
            "--kernel",
            "se+linear",
            "--ard",
            "subspace",
            "--epochs",
            "3",
        ],
    );
    let elbo = metrics(&ws, id, "epoch_elbo");
    let (first, last) = (f64::from_bits(elbo[0].1), f64::from_bits(elbo[2].1));
    assert!(last > first, "bound fell from {first} to {last}");
    // The checkpoint stores log σ_lin² and the 8 ARD weights, all trained.
    let c = read_checkpoint(&artifact_of_step(&ws, id, 48)).unwrap();
    assert!(c.params.kernel.log_lin2.is_some());
    assert_eq!(c.params.kernel.log_ard.len(), 8);
    assert!(c.params.kernel.log_ard.iter().all(|w| *w != 0.0));

    let out = pipeline(
        &ws,
        &["elbo", "--run", &id.to_string(), "--checkpoint", "14"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let recorded = metrics(&ws, id, "elbo_exact");
    let streamed = f64::from_bits(recorded.iter().find(|m| m.0 == 14).unwrap().1);
    let direct = one_batch_bound(
        &ws,
        KernelKind::SePlusLinear,
        &read_ckpt(&ws, id, 14).params,
    );
    assert!(
        (streamed - direct).abs() <= 1e-9 * direct.abs(),
        "streamed {streamed} vs one batch {direct}"
    );

    let out = pipeline(
        &ws,
        &["predict", "--run", &id.to_string(), "--probabilities"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let predictions: i64 = catalog(&ws)
        .query_row(
            "SELECT count(*) FROM artifacts WHERE kind = 'predictions'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(predictions, 1);
}

fn artifact_of_step(ws: &Path, run: i64, step: u64) -> PathBuf {
    let path: String = catalog(ws)
        .query_row(
            "SELECT path FROM checkpoints WHERE stage_run_id = ?1 AND step = ?2",
            rusqlite::params![run, step as i64],
            |r| r.get(0),
        )
        .unwrap();
    ws.join(path)
}
