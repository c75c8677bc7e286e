//! `pipeline train` and `pipeline elbo` end to end on a small generated dataset:
//! bitwise determinism, SIGKILL (and crashes at chosen points) followed by `--resume`
//! ending bitwise-identical to an uninterrupted run, numerical trouble stopping cleanly,
//! `--max-steps` stopping mid-epoch at exactly a longer run's parameters, and the exact
//! bound of `pipeline elbo` against an independent one-batch computation.

use crate::common;
use common::toy::*;
use common::*;
use faer::Mat;
use fsgp::model::kernel::KernelKind;
use fsgp::store::checkpoint::read_checkpoint;
use std::time::Instant;

#[test]
fn same_seed_gives_bitwise_identical_checkpoints_and_resume_matches() {
    let p = prepared();
    let (ws_a, ws_b) = (p.copy("a"), p.copy("b"));
    let t = Instant::now();
    let run_a = train_ok(&ws_a, &[]);
    let reference_secs = t.elapsed().as_secs_f64();
    let run_b = train_ok(&ws_b, &[]);
    let (ck_a, ck_b) = (checkpoints(&ws_a, run_a), checkpoints(&ws_b, run_b));
    let steps: Vec<u64> = ck_a.keys().copied().collect();
    let mut expected: Vec<u64> = (7..=STEPS).step_by(7).collect();
    expected.push(STEPS);
    assert_eq!(steps, expected);
    assert_eq!(
        ck_a, ck_b,
        "two runs with one seed must write identical bytes"
    );
    assert_eq!(
        metrics(&ws_a, run_a, "epoch_elbo"),
        metrics(&ws_b, run_b, "epoch_elbo")
    );
    assert_eq!(metrics(&ws_a, run_a, "epoch_elbo").len(), 6);

    // The model learns: the mean minibatch bound of the last epoch beats the first's.
    let elbo = metrics(&ws_a, run_a, "epoch_elbo");
    let (first, last) = (f64::from_bits(elbo[0].1), f64::from_bits(elbo[5].1));
    assert!(last > first, "bound fell from {first} to {last}");

    // A different seed gives different parameters.
    let ws_c = p.copy("c");
    let run_c = train_ok(&ws_c, &["--seed", "12"]);
    assert_ne!(checkpoints(&ws_c, run_c)[&STEPS], ck_a[&STEPS]);

    // A repeated command finds the finished run and does nothing.
    let again = pipeline(&ws_a, TRAIN);
    assert!(again.status.success());
    assert!(
        stderr(&again).contains("already done"),
        "{}",
        stderr(&again)
    );
    assert_eq!(train_run_id(&ws_a), run_a);

    // SIGKILL at several moments, then --resume: same bytes as the uninterrupted run.
    let mut resumed = 0;
    for (i, frac) in [0.15, 0.3, 0.45, 0.6, 0.75, 0.9].into_iter().enumerate() {
        let ws = p.copy(&format!("kill{i}"));
        // None: killed before the run was recorded, or after it finished.
        let Some(id) = train_killed_after(&ws, &[], reference_secs * frac) else {
            continue;
        };
        let out = pipeline(&ws, &["train", "--resume", &id.to_string()]);
        assert!(
            out.status.success(),
            "resume after kill at {frac}: {}",
            stderr(&out)
        );
        assert_eq!(run_status(&ws, id), "ok");
        assert_eq!(
            checkpoints(&ws, id),
            ck_a,
            "resumed run (killed at {:.0} % of the run) differs",
            frac * 100.0
        );
        assert_eq!(metrics(&ws, id, "epoch_elbo"), elbo);
        resumed += 1;
    }
    eprintln!("{resumed} of 6 kills landed inside a {reference_secs:.2} s run");
    assert!(
        resumed >= 2,
        "only {resumed} kills landed inside the run ({reference_secs:.2} s)"
    );
}

#[test]
fn crashes_around_a_checkpoint_resume_to_identical_bytes() {
    let p = prepared();
    let reference = p.copy("ref");
    let run_ref = train_ok(&reference, &[]);
    let expected = checkpoints(&reference, run_ref);
    for point in [
        "checkpoint-written:14",
        "checkpoint-renamed:14",
        "checkpoint-renamed:96",
    ] {
        let ws = p.copy(&point.replace(':', "-"));
        let id = crash_at(&ws, &[], point);
        // The checkpoint being written when the process died is not registered.
        let registered: Vec<u64> = checkpoints(&ws, id).keys().copied().collect();
        let limit: u64 = point.rsplit(':').next().unwrap().parse().unwrap();
        assert!(
            registered.iter().all(|&s| s < limit),
            "{point}: {registered:?}"
        );
        let out = pipeline(&ws, &["train", "--resume", &id.to_string()]);
        assert!(out.status.success(), "{point}: {}", stderr(&out));
        assert_eq!(checkpoints(&ws, id), expected, "{point}");
        // No stray files: every checkpoint in the run's directory is registered, and
        // beside them is only the directory's marker.
        let dir = ws.join(format!("train/toy-linear.run{id}"));
        let files = std::fs::read_dir(&dir).unwrap().count();
        assert_eq!(files, expected.len() + 1, "{point}");
        assert!(dir.join(".fsgp-run.json").is_file(), "{point}");
    }
    // A finished run cannot be resumed.
    let out = pipeline(&reference, &["train", "--resume", &run_ref.to_string()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("cannot be resumed"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn exploding_learning_rate_stops_cleanly_keeping_the_last_checkpoint() {
    let p = prepared();
    let ws = p.copy("nan");
    let out = pipeline(
        &ws,
        &train_args(&["--lr", "1e300", "--checkpoint-every", "1"]),
    );
    assert!(!out.status.success(), "training with lr 1e300 should fail");
    let err = stderr(&out);
    assert!(err.contains("step ") && err.contains("--lr"), "{err}");
    let id = train_run_id(&ws);
    assert_eq!(run_status(&ws, id), "failed");
    let ck = checkpoints(&ws, id);
    assert!(!ck.is_empty(), "the last good checkpoint must be kept");
    // The error names the last checkpoint that was kept.
    let named: u64 = err
        .split("the last good checkpoint is step ")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no checkpoint named in: {err}"));
    assert_eq!(Some(&named), ck.keys().last(), "{err}");
    // Every kept checkpoint holds finite parameters.
    let conn = catalog(&ws);
    let last: String = conn
        .query_row(
            "SELECT path FROM checkpoints WHERE stage_run_id = ?1 ORDER BY step DESC LIMIT 1",
            [id],
            |r| r.get(0),
        )
        .unwrap();
    let c = read_checkpoint(&ws.join(last)).unwrap();
    let finite =
        |m: &Mat<f64>| (0..m.nrows()).all(|i| (0..m.ncols()).all(|j| m[(i, j)].is_finite()));
    assert!(finite(&c.params.a) && finite(c.params.q.mu()) && finite(&c.params.phi));
}

#[test]
fn pipeline_elbo_equals_a_one_batch_computation() {
    let p = prepared();
    let ws = p.copy("elbo");
    let id = train_ok(&ws, &["--no-final-elbo", "--epochs", "2"]);
    let out = pipeline(
        &ws,
        &["elbo", "--run", &id.to_string(), "--checkpoint", "14"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let recorded = metrics(&ws, id, "elbo_exact");
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0].0, 14);
    let streamed = f64::from_bits(recorded[0].1);

    // Independent: all 900 rows as one batch, labels read from the chunks directly.
    let direct = one_batch_bound(&ws, KernelKind::Linear, &read_ckpt(&ws, id, 14).params);
    assert!(
        (streamed - direct).abs() <= 1e-9 * direct.abs(),
        "streamed {streamed} vs one batch {direct}"
    );
}

#[test]
fn max_steps_stops_mid_epoch_at_the_parameters_of_a_longer_run() {
    // 21 steps: all of epoch 1 (16) and 5 of the 16 minibatches of epoch 2. TRAIN's
    // --checkpoint-every 7 makes the full run write step 21 too.
    const S: u64 = 21;
    let p = prepared();
    let (ws_full, ws_cut) = (p.copy("full"), p.copy("cut"));
    let run_full = train_ok(&ws_full, &[]);
    let run_cut = train_ok(&ws_cut, &["--max-steps", "21", "--eval-every", "4"]);

    assert_eq!(run_status(&ws_cut, run_cut), "ok");
    let steps: Vec<u64> = checkpoints(&ws_cut, run_cut).keys().copied().collect();
    assert_eq!(steps, [7, 14, 21], "the last checkpoint is at step S");
    for step in [7, 14, S] {
        let (full, cut) = (
            read_ckpt(&ws_full, run_full, step),
            read_ckpt(&ws_cut, run_cut, step),
        );
        assert!(
            tensor_bits(&full) == tensor_bits(&cut),
            "step {step}: parameters differ from the full run's"
        );
        assert_eq!(full.state, cut.state, "step {step}");
    }
    let last = read_ckpt(&ws_cut, run_cut, S);
    assert_eq!((last.state.epoch, last.state.batch_in_epoch), (1, 5));

    // The configuration records the limit; one without it has no such field.
    assert_eq!(run_params(&ws_cut, run_cut)["max_steps"], S);
    assert_eq!(last.config["max_steps"], S);
    assert!(run_params(&ws_full, run_full).get("max_steps").is_none());

    // Epoch 1 as in the full run; epoch 2 over its 5 steps; the run-end figures at S.
    let elbo = metrics(&ws_cut, run_cut, "epoch_elbo");
    assert_eq!(elbo.len(), 2, "{elbo:?}");
    assert_eq!(elbo[0], metrics(&ws_full, run_full, "epoch_elbo")[0]);
    assert_eq!(elbo[1], (2, (last.state.epoch_elbo_sum / 5.0).to_bits()));
    assert_eq!(metrics(&ws_cut, run_cut, "elbo_exact").len(), 1);
    assert_eq!(metrics(&ws_cut, run_cut, "elbo_exact")[0].0, S as i64);
    let held_out: Vec<i64> = metrics(&ws_cut, run_cut, "P@1")
        .iter()
        .map(|m| m.0)
        .collect();
    assert_eq!(
        held_out,
        [2],
        "held-out evaluation after the last, partial epoch"
    );

    // The same command again finds the finished run.
    let again = pipeline(&ws_cut, &train_args(&["--max-steps", "21"]));
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(
        stderr(&again).contains("already done"),
        "{}",
        stderr(&again)
    );

    // Crashes before and at the final checkpoint: --resume still stops at S, same bytes.
    let expected = checkpoints(&ws_cut, run_cut);
    for point in ["checkpoint-renamed:14", "checkpoint-renamed:21"] {
        let ws = p.copy(&point.replace(':', "-"));
        let id = crash_at(&ws, &["--max-steps", "21"], point);
        let out = pipeline(&ws, &["train", "--resume", &id.to_string()]);
        assert!(out.status.success(), "{point}: {}", stderr(&out));
        assert_eq!(run_status(&ws, id), "ok", "{point}");
        assert_eq!(checkpoints(&ws, id), expected, "{point}");
    }
}
