//! Budgets (`--epochs`, `--steps`, the default's floor on small data) end to end on the toy
//! workspace of `common::toy` (16 minibatches an epoch): a budget of S steps is the same
//! stream of minibatches as an epoch budget, cut at S; the default budget is raised to
//! `DEFAULT_MIN_STEPS` steps on data whose default epochs hold fewer, and an explicit one is
//! taken as given; a step budget extended on resume ends as an uninterrupted run with it.

use crate::common;
use common::toy::*;
use common::*;
use fsgp::train::budget::DEFAULT_MIN_STEPS;

/// The `status --run N --json` detail of run `id`.
fn detail(ws: &std::path::Path, id: i64) -> serde_json::Value {
    let out = pipeline_ok(ws, &["status", "--run", &id.to_string(), "--json"]);
    serde_json::from_str(&out).unwrap()
}

#[test]
fn a_step_budget_is_the_epoch_budget_s_minibatches_cut_at_s() {
    let p = prepared();
    let (by_steps, by_epochs) = (p.copy("steps"), p.copy("epochs"));
    let id = train_with(&by_steps, &without_epochs(&["--steps", "40"]));
    let cut = train_ok(&by_epochs, &["--max-steps", "40"]);
    let params = run_params(&by_steps, id);
    // 40 steps of 16 an epoch reach into the third epoch.
    assert_eq!(
        (&params["steps"], &params["epochs"]),
        (&40.into(), &3.into())
    );
    let steps: Vec<u64> = checkpoints(&by_steps, id).into_keys().collect();
    assert_eq!(steps, [7, 14, 21, 28, 35, 40]);
    assert_eq!(
        steps,
        checkpoints(&by_epochs, cut).into_keys().collect::<Vec<_>>()
    );
    for step in steps {
        let (a, b) = (
            read_ckpt(&by_steps, id, step),
            read_ckpt(&by_epochs, cut, step),
        );
        assert_eq!(tensor_bits(&a), tensor_bits(&b), "step {step}");
        assert_eq!(a.state, b.state, "step {step}");
    }
    // The epochs' figures too, the third over the 8 steps it ran.
    assert_eq!(
        metrics(&by_steps, id, "epoch_elbo"),
        metrics(&by_epochs, cut, "epoch_elbo")
    );
    assert_eq!(metrics(&by_steps, id, "epoch_elbo").len(), 3);
    let t = train_summary(&by_steps, id);
    assert_eq!((&t["steps_total"], &t["steps"]), (&40.into(), &40.into()));
    assert_eq!(t["stopped"]["reason"], "budget");
    assert_eq!(
        train_summary(&by_epochs, cut)["stopped"]["reason"],
        "max-steps"
    );
    // The two budgets are exclusive, and a budget of no step is refused.
    let out = pipeline(&by_steps, &train_args(&["--steps", "40"]));
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("cannot be used with") && err.contains("--epochs") && err.contains("--steps"),
        "{err}"
    );
    let out = pipeline(&by_steps, &without_epochs(&["--steps", "0"]));
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("for '--steps <S>': 0 is not in 1..=10000000000"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn the_default_budget_is_raised_to_the_minimum_on_small_data_and_an_explicit_one_is_kept() {
    let p = prepared();
    // 10 default epochs of 16 minibatches are 160 steps: the budget becomes the minimum,
    // as many epochs as it takes (cut here by --max-steps, which changes no budget).
    let small = p.copy("small");
    let out = pipeline(&small, &without_epochs(&["--max-steps", "20"]));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!(
            "the default budget, 10 epochs of minibatches of 64, is 160 steps on this dataset, \
             fewer than the {DEFAULT_MIN_STEPS} the default guarantees: training \
             {DEFAULT_MIN_STEPS} steps ("
        )),
        "{}",
        stderr(&out)
    );
    let id = train_run_id(&small);
    let params = run_params(&small, id);
    assert_eq!(params["steps"], DEFAULT_MIN_STEPS);
    assert_eq!(params["epochs"], DEFAULT_MIN_STEPS.div_ceil(16));
    let t = train_summary(&small, id);
    assert_eq!(
        (&t["steps_done"], &t["steps_total"]),
        (&20.into(), &20.into())
    );
    let text = pipeline_ok(&small, &["status", "--run", &id.to_string()]);
    assert!(
        text.contains(&format!(
            "budget: {DEFAULT_MIN_STEPS} steps ({} epochs), cut at --max-steps 20; ended: \
             max-steps at step 20",
            DEFAULT_MIN_STEPS.div_ceil(16)
        )),
        "{text}"
    );
    assert_eq!(detail(&small, id)["train"]["stopped"]["step"], 20);

    // An explicit --epochs is the budget, however few its steps: the configuration is the
    // one an epoch budget always wrote (no key of the new options).
    let explicit = p.copy("explicit");
    let id = train_ok(&explicit, &["--epochs", "10", "--max-steps", "20"]);
    let params = run_params(&explicit, id);
    assert_eq!(params["epochs"], 10);
    for key in ["steps", "early_stopping"] {
        assert!(params.get(key).is_none(), "{key} in {params}");
    }
    // Data whose default epochs hold the minimum keeps them: B = 2 cuts 450 minibatches an
    // epoch, 4500 in 10 epochs.
    let large = p.copy("large");
    let out = pipeline(
        &large,
        &without_epochs(&["--batch", "2", "--max-steps", "5"]),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        !stderr(&out).contains("the default budget"),
        "{}",
        stderr(&out)
    );
    let params = run_params(&large, train_run_id(&large));
    assert_eq!(params["epochs"], 10);
    assert!(params.get("steps").is_none(), "{params}");
}

#[test]
fn a_step_budget_extended_on_resume_ends_as_an_uninterrupted_run_with_it() {
    let p = prepared();
    let reference = p.copy("reference");
    let run_ref = train_with(&reference, &without_epochs(&["--steps", "40"]));
    let expected = checkpoints(&reference, run_ref);
    let ws = p.copy("extended");
    let id = crash_with(
        &ws,
        &without_epochs(&["--steps", "30"]),
        "checkpoint-renamed:14",
    );
    let out = pipeline(
        &ws,
        &["train", "--resume", &id.to_string(), "--steps", "40"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("run {id}: --steps 30 → 40 (changed on resume)")),
        "{}",
        stderr(&out)
    );
    // Checkpoints written after the change embed the new budget: those are the reference's
    // bytes; the earlier one holds the same numbers.
    let got = checkpoints(&ws, id);
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>()
    );
    for (step, bytes) in &expected {
        if *step > 7 {
            assert_eq!(&got[step], bytes, "step {step}");
        } else {
            assert_eq!(
                tensor_bits(&read_ckpt(&ws, id, *step)),
                tensor_bits(&read_ckpt(&reference, run_ref, *step))
            );
        }
    }
    assert_eq!(
        metrics(&ws, id, "elbo_exact"),
        metrics(&reference, run_ref, "elbo_exact")
    );
    // --epochs on resume makes the budget epochs again.
    let back = p.copy("back");
    let id = crash_with(
        &back,
        &without_epochs(&["--steps", "30"]),
        "checkpoint-renamed:14",
    );
    let out = pipeline(
        &back,
        &["train", "--resume", &id.to_string(), "--epochs", "2"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let t = train_summary(&back, id);
    assert_eq!(t["steps_done"], 32);
    assert_eq!(t["stopped"]["reason"], "budget");
}

#[test]
fn a_run_cut_by_max_steps_goes_on_with_a_larger_cut_and_ends_as_an_uninterrupted_run() {
    let p = prepared();
    let reference = p.copy("uncut");
    let run_ref = train_with(
        &reference,
        &without_epochs(&["--steps", "40", "--max-steps", "30"]),
    );
    let ws = p.copy("cut");
    let id = train_with(
        &ws,
        &without_epochs(&["--steps", "40", "--max-steps", "20"]),
    );
    assert_eq!(train_summary(&ws, id)["stopped"]["reason"], "max-steps");
    // A cut no later than where it ended is refused, and so is any other option.
    let out = pipeline(
        &ws,
        &["train", "--resume", &id.to_string(), "--max-steps", "20"],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("cut by --max-steps at step 20; give a larger --max-steps"),
        "{}",
        stderr(&out)
    );
    let out = pipeline(&ws, &["train", "--resume", &id.to_string()]);
    assert!(!out.status.success());
    let out = pipeline(
        &ws,
        &["train", "--resume", &id.to_string(), "--max-steps", "30"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!(
            "run {id}: --max-steps 20 → 30 (changed on resume)"
        )),
        "{}",
        stderr(&out)
    );
    let t = train_summary(&ws, id);
    assert_eq!(t["stopped"]["reason"], "max-steps");
    assert_eq!(t["stopped"]["step"], 30);
    // The parameters at step 30 are those of the run cut at 30 from the start.
    assert_eq!(
        tensor_bits(&read_ckpt(&ws, id, 30)),
        tensor_bits(&read_ckpt(&reference, run_ref, 30))
    );
    // A run that ran its whole budget is a result: it does not go on.
    let whole = train_with(&ws, &without_epochs(&["--steps", "20"]));
    assert_eq!(train_summary(&ws, whole)["stopped"]["reason"], "budget");
    let out = pipeline(
        &ws,
        &["train", "--resume", &whole.to_string(), "--max-steps", "30"],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("cannot be resumed: its status is 'ok'"),
        "{}",
        stderr(&out)
    );
}
