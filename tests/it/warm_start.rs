//! `train --warm-start ridge` end to end on the toy workspace of `common::toy`: it changes
//! the start (μ and Φ are no longer 0 and the random draw) and so every checkpoint; two
//! runs of it write the same bytes; a crash resumes to the bytes of an uninterrupted run
//! and the option cannot change on resume; the combinations it has no step for are refused
//! naming what it needs; and a run without it records nothing new (its configuration
//! JSON has no `warm_start`, so earlier runs are found as before).

use crate::common;
use common::toy::*;
use common::{pipeline, stderr};

const WARM: &[&str] = &["--warm-start", "ridge"];

#[test]
fn a_warm_start_is_deterministic_resumable_and_recorded_only_when_given() {
    let p = prepared();
    let (plain, warm_a, warm_b) = (p.copy("plain"), p.copy("warm-a"), p.copy("warm-b"));
    let plain_id = train_ok(&plain, &[]);
    let a = train_ok(&warm_a, WARM);
    let b = train_ok(&warm_b, WARM);
    let bytes = assert_same_run_bytes((&warm_a, a), (&warm_b, b));
    let first = *bytes.keys().next().unwrap();
    assert_ne!(
        bytes[&first],
        checkpoints(&plain, plain_id)[&first],
        "the warm start changes the run"
    );
    assert_eq!(run_params(&warm_a, a)["warm_start"], "ridge");
    // The same command again finds it done; with --fresh it says what --fresh does.
    let mut again = WARM.to_vec();
    again.push("--fresh");
    let out = pipeline(&warm_a, &train_args(&again));
    assert!(out.status.success(), "{}", stderr(&out));
    let says =
        format!("already done (run {a}); nothing to do (--fresh starts over an interrupted run");
    assert!(stderr(&out).contains(&says), "{}", stderr(&out));
    assert!(run_params(&plain, plain_id).get("warm_start").is_none());
    let cut = p.copy("cut");
    let id = crash_at(&cut, WARM, "checkpoint-renamed:14");
    assert_resume_refused(
        &cut,
        id,
        &["--warm-start", "none"],
        &format!("--warm-start none: run {id} has ridge"),
    );
    assert_resumes_to(&cut, id, &bytes, &metrics(&warm_a, a, "elbo_exact"));
}

#[test]
fn combinations_without_a_newton_step_are_refused() {
    let p = prepared();
    let ws = p.copy("refused");
    for (args, says) in [
        (
            &["--q-form", "whitened"][..],
            "--warm-start ridge needs --q-form sites (got whitened)",
        ),
        (
            &["--likelihood", "probit"][..],
            "--warm-start ridge needs the logistic likelihood",
        ),
        (
            &["--latent", "independent", "--factors", "30"][..],
            "--warm-start ridge needs --latent factor",
        ),
    ] {
        let mut all = WARM.to_vec();
        all.extend(args);
        assert_train_refused(&ws, &all, says);
    }
}
