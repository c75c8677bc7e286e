//! The step-size schedule `--lr-decay-at E1,E2,… --lr-decay γ` end to end on the toy
//! workspace of `common::toy` (6 epochs of 16 minibatches): the epochs before a decay are
//! the bytes of a run without one; the first step after it is γ times the step the
//! undecayed run takes from the same state; crashes around the decay resume to the bytes of
//! an uninterrupted run; the schedule is recorded, refused on resume when changed, and
//! malformed values are refused with the flag named.

use crate::common;
use common::toy::*;
use common::*;
use fsgp::model::params::flat_values;

/// η × 0.5 after epoch 2 (step 32), a checkpoint every 8 steps.
const DECAY_RUN: &[&str] = &[
    "--lr-decay-at",
    "2",
    "--lr-decay",
    "0.5",
    "--checkpoint-every",
    "8",
];
const DECAY_STEP: u64 = 32;

#[test]
fn epochs_before_the_decay_are_untouched_and_the_first_step_after_it_is_scaled() {
    let p = prepared();
    let plain = p.copy("plain");
    let plain_id = train_ok(&plain, &["--checkpoint-every", "8", "--max-steps", "33"]);
    let decayed = p.copy("decayed");
    let mut args = DECAY_RUN.to_vec();
    args.extend(["--max-steps", "33"]);
    let decayed_id = train_ok(&decayed, &args);
    for step in (8..=DECAY_STEP).step_by(8) {
        assert_eq!(
            tensor_bits(&read_ckpt(&decayed, decayed_id, step)),
            tensor_bits(&read_ckpt(&plain, plain_id, step)),
            "step {step}: before the decay the runs must be the same"
        );
    }
    // From the same state and the same minibatch, Adam's direction m̂/(√v̂ + ε) is the same:
    // only η differs, so each parameter moves by exactly half the undecayed step.
    let before = flat_values(&read_ckpt(&plain, plain_id, DECAY_STEP).params);
    let plain_after = flat_values(&read_ckpt(&plain, plain_id, DECAY_STEP + 1).params);
    let decayed_after = flat_values(&read_ckpt(&decayed, decayed_id, DECAY_STEP + 1).params);
    let mut moved = 0;
    for (i, ((b, p), d)) in before
        .iter()
        .zip(&plain_after)
        .zip(&decayed_after)
        .enumerate()
    {
        let (full, half) = (p - b, d - b);
        let tol = 1e-12 * b.abs().max(1.0);
        assert!(
            (half - 0.5 * full).abs() <= tol,
            "entry {i}: step {half:e} after the decay, {full:e} without it"
        );
        moved += usize::from(full.abs() > 1e-4);
    }
    assert!(
        moved > 10,
        "only {moved} entries moved: the check would be empty"
    );
    let params = run_params(&decayed, decayed_id);
    assert_eq!(params["lr_decay"]["after"], serde_json::json!([2]));
    assert_eq!(params["lr_decay"]["factor"], 0.5);
    assert!(run_params(&plain, plain_id).get("lr_decay").is_none());
}

#[test]
fn crashes_around_the_decay_resume_to_the_bytes_of_an_uninterrupted_run() {
    let p = prepared();
    let reference = p.copy("ref");
    let run_ref = train_ok(&reference, DECAY_RUN);
    let expected = checkpoints(&reference, run_ref);
    for point in ["checkpoint-renamed:32", "checkpoint-written:40"] {
        let ws = p.copy(&point.replace(':', "-"));
        let id = crash_at(&ws, DECAY_RUN, point);
        if point.ends_with(":32") {
            // The schedule cannot change on resume; both values are named.
            for (args, message) in [
                (
                    ["--lr-decay-at", "3"],
                    format!("--lr-decay-at 3: run {id} has 2"),
                ),
                (
                    ["--lr-decay", "0.1"],
                    format!("--lr-decay 0.1: run {id} has 0.5"),
                ),
            ] {
                assert_resume_refused(&ws, id, &args, &message);
            }
        }
        let out = pipeline(&ws, &["train", "--resume", &id.to_string()]);
        assert!(out.status.success(), "{point}: {}", stderr(&out));
        assert_eq!(checkpoints(&ws, id), expected, "{point}");
    }
}

#[test]
fn malformed_schedules_are_refused_with_the_flag_named() {
    let p = prepared();
    let ws = p.copy("invalid");
    for (args, message) in [
        (
            &["--lr-decay-at", "3,2"][..],
            "lr-decay-at must increase strictly, not 3,2",
        ),
        (
            &["--lr-decay-at", "0"][..],
            "for '--lr-decay-at <E1,E2,…>': 0 is not in 1..=1000000",
        ),
        (
            &["--lr-decay-at", "2,6"][..],
            "lr-decay-at 2,6: a decay after epoch 6 or later never takes effect",
        ),
        (
            &["--lr-decay-at", "2", "--lr-decay", "0"][..],
            "for '--lr-decay <γ>': 0 is not in (0, ∞)",
        ),
        (
            &["--lr-decay", "0.5"][..],
            "0.5 is the factor of --lr-decay-at's decays; give the epochs too",
        ),
        (&["--lr-decay-at", "two"][..], "invalid value 'two'"),
    ] {
        assert_train_refused(&ws, args, message);
    }
    assert_eq!(
        count_runs(&ws, "train", None),
        0,
        "a refused run was recorded"
    );
}
