//! `pipeline fit`: a small binary file to a chosen model within its budget, the spec it
//! writes, and that spec reproducing the printed test metrics in a fresh workspace.

use crate::common;
use common::ingest::split_entry;
use common::*;

/// Two noisy classes of 2-D points (LIBSVM, signed values): row i of `rows`.
pub(crate) fn points(rows: std::ops::Range<u32>) -> String {
    rows.map(|i| {
        let positive = i % 2 == 0;
        let t = f64::from(i) * 0.618;
        let (cx, cy) = if positive { (1.0, 0.5) } else { (-1.0, -0.5) };
        let x = cx + 0.8 * (t * 7.1).sin();
        let y = cy + 0.8 * (t * 3.3).cos();
        format!("{} 1:{x:.4} 2:{y:.4}\n", if positive { 1 } else { -1 })
    })
    .collect()
}

#[test]
fn fit_chooses_trains_and_writes_a_spec_that_reproduces_it() {
    let dir = tempfile::tempdir().unwrap();
    let train = dir.path().join("toy.svm");
    let test = dir.path().join("toy-test.svm");
    std::fs::write(&train, points(0..240)).unwrap();
    std::fs::write(&test, points(240..320)).unwrap();
    let spec = dir.path().join("toy-fit.toml");
    let ws = dir.path().join("ws");
    let started = std::time::Instant::now();
    let out = pipeline(
        &ws,
        &[
            "fit",
            "--train",
            train.to_str().unwrap(),
            "--test",
            test.to_str().unwrap(),
            "--budget",
            "20s",
            "--spec-out",
            spec.to_str().unwrap(),
        ],
    );
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        started.elapsed().as_secs_f64() < 60.0,
        "far over its budget"
    );
    assert!(err.contains("task binary, N = "), "{err}");
    assert!(err.contains("transform: standardize (auto: "), "{err}");
    assert!(err.contains("candidate (validation)"), "{err}");
    // The floor beside the candidates: the majority class's accuracy on validation.
    assert!(err.contains("(label frequencies, no model)"), "{err}");
    assert!(
        !err.contains("does not beat the label frequencies"),
        "{err}"
    );
    assert!(err.contains("== fit: chosen "), "{err}");
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(printed.contains("accuracy"), "{printed}");
    // The spec: the whole training file, the chosen steps, the test split.
    let text = std::fs::read_to_string(&spec).unwrap();
    assert!(text.contains("name = \"toy\""), "{text}");
    assert!(!text.contains("validation_fraction"), "{text}");
    assert!(text.contains("steps = "), "{text}");
    assert!(text.contains("split = \"test\""), "{text}");
    // `pipeline run` of the spec in a fresh workspace prints the same test metrics.
    let fresh = dir.path().join("fresh");
    let again = pipeline(&fresh, &["run", spec.to_str().unwrap()]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(String::from_utf8_lossy(&again.stdout), printed);
}

#[test]
fn fit_refuses_a_missing_file_and_a_bad_budget() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let out = pipeline(&ws, &["fit", "--train", "/nonexistent/train.svm"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("/nonexistent/train.svm"),
        "{}",
        stderr(&out)
    );
    let out = pipeline(&ws, &["fit", "--train", "x", "--budget", "5d"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("unknown unit 'd'"),
        "{}",
        stderr(&out)
    );
    // An existing file where the spec would go is neither overwritten nor is anything run.
    let train = dir.path().join("toy.svm");
    std::fs::write(&train, points(0..40)).unwrap();
    let spec = dir.path().join("mine.toml");
    std::fs::write(&spec, "# the user's own file\n").unwrap();
    let out = pipeline(
        &ws,
        &[
            "fit",
            "--train",
            train.to_str().unwrap(),
            "--spec-out",
            spec.to_str().unwrap(),
        ],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("mine.toml exists; give --force"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        std::fs::read_to_string(&spec).unwrap(),
        "# the user's own file\n"
    );
    assert!(dataset_names(&ws).is_empty(), "nothing ingested");
}

#[test]
fn a_budget_too_small_for_every_candidate_trains_the_first_and_says_which_were_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let train = dir.path().join("toy.svm");
    // 20 000 rows: ten epochs are 320 steps of the selection split, which half a second
    // cannot buy (a step of M = 100 takes well over 0.1 ms), whatever the machine.
    std::fs::write(&train, points(0..20_000)).unwrap();
    let spec = dir.path().join("toy-fit.toml");
    let ws = dir.path().join("ws");
    let out = pipeline(
        &ws,
        &[
            "fit",
            "--train",
            train.to_str().unwrap(),
            "--budget",
            "0.5s",
            "--spec-out",
            spec.to_str().unwrap(),
        ],
    );
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    // No candidate gets its ten epochs: the first (SE, M = 100) runs alone.
    assert!(
        err.contains("to 1 candidate(s); dropped: SE + linear"),
        "{err}"
    );
    let table = err.split("candidate (validation)").nth(1).unwrap();
    let rows: Vec<&str> = table
        .lines()
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter(|l| !l.starts_with("(label frequencies"))
        .collect();
    assert_eq!(rows.len(), 1, "{table}");
    assert!(rows[0].starts_with("SE, free Z, M = 100"), "{table}");
    assert!(std::fs::read_to_string(&spec)
        .unwrap()
        .contains("kernel = \"se\""));
}

#[test]
fn set_options_fix_every_candidate_and_the_final_model_is_written_as_export_writes_it() {
    let dir = tempfile::tempdir().unwrap();
    let train = dir.path().join("toy.svm");
    let test = dir.path().join("toy-test.svm");
    std::fs::write(&train, points(0..240)).unwrap();
    std::fs::write(&test, points(240..320)).unwrap();
    let (spec, model) = (
        dir.path().join("toy-fit.toml"),
        dir.path().join("toy.model"),
    );
    let ws = dir.path().join("ws");
    let fit = |extra: &[&str]| {
        let mut args = vec![
            "fit",
            "--train",
            train.to_str().unwrap(),
            "--test",
            test.to_str().unwrap(),
            "--budget",
            "20s",
            "--spec-out",
            spec.to_str().unwrap(),
            "--model-out",
            model.to_str().unwrap(),
            "--json",
        ];
        args.extend_from_slice(extra);
        pipeline(&ws, &args)
    };
    // A value train refuses is refused before anything is ingested.
    let bad = fit(&["--set", "kernel=cubic"]);
    assert!(!bad.status.success());
    assert!(stderr(&bad).contains("fit --set"), "{}", stderr(&bad));
    assert!(!stderr(&bad).contains("== fit: ingest"), "{}", stderr(&bad));
    let out = fit(&["--set", "kernel=linear", "--set", "inducing=12"]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    // The four binary candidates differ only in kernel and M: one is left, with the
    // options it trained.
    let outcome: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = scored_rows(&outcome);
    assert_eq!(rows.len(), 1, "{outcome}");
    assert_eq!(rows[0].0, "linear, free Z, M = 12", "{outcome}");
    let only = &outcome["candidates"][0];
    assert_eq!(only["train"]["kernel"], "linear", "{only}");
    assert_eq!(only["train"]["inducing"], "12", "{only}");
    assert_eq!(only["svd"]["inducing"], "12", "{only}");
    assert_eq!(outcome["evaluated_split"], "test");
    assert_eq!(outcome["model"]["path"], model.to_str().unwrap());
    let text = std::fs::read_to_string(&spec).unwrap();
    assert!(text.contains("kernel = \"linear\""), "{text}");
    assert!(text.contains("inducing = 12"), "{text}");
    // The model file scores the test file as the spec's run scored its test split.
    assert!(err.contains("== fit: the final model (train run "), "{err}");
    let scored = pipeline(
        &ws,
        &[
            "predict",
            "--model",
            model.to_str().unwrap(),
            "--input",
            test.to_str().unwrap(),
            "--probabilities",
        ],
    );
    assert!(scored.status.success(), "{}", stderr(&scored));
    assert_eq!(
        String::from_utf8_lossy(&scored.stdout).lines().count(),
        80,
        "one line per test row"
    );
    // A second fit refuses to overwrite the model file before anything runs.
    std::fs::remove_file(&spec).unwrap();
    let again = fit(&[]);
    assert!(!again.status.success());
    assert!(
        stderr(&again).contains("toy.model exists; give --force"),
        "{}",
        stderr(&again)
    );
}

/// Labels drawn independently of the features (a hash of the row number), on the same
/// 2-D points: there is nothing to learn, so every model's validation NLP is best within
/// its first scores and only worsens after.
fn noise(rows: std::ops::Range<u32>) -> String {
    rows.map(|i| {
        let t = f64::from(i) * 0.618;
        let label = if (f64::from(i) * 12.9898).sin().abs() * 43758.5453 % 1.0 < 0.5 {
            1
        } else {
            -1
        };
        format!(
            "{label} 1:{:.4} 2:{:.4}\n",
            (t * 7.1).sin(),
            (t * 3.3).cos()
        )
    })
    .collect()
}

/// The scored candidates of `pipeline fit --json`'s outcome: (name, steps planned, steps
/// trained, converged).
fn scored_rows(outcome: &serde_json::Value) -> Vec<(String, u64, u64, bool)> {
    outcome["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == "scored")
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_string(),
                c["planned_steps"].as_u64().unwrap(),
                c["trained_steps"].as_u64().unwrap(),
                c["converged"].as_bool().unwrap(),
            )
        })
        .collect()
}

/// The number in `line` right after `before` (up to white space, a comma or a hyphen).
fn number_after(line: &str, before: &str) -> u64 {
    line.split(before)
        .nth(1)
        .and_then(|t| {
            t.split(|c: char| c.is_whitespace() || c == ',' || c == '-')
                .next()
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{before}: {line}"))
}

/// The chosen candidate's name and the final model's steps, from the outcome.
fn chosen_of(outcome: &serde_json::Value) -> (String, u64) {
    let i = outcome["chosen"].as_u64().unwrap() as usize;
    let name = outcome["candidates"][i]["name"]
        .as_str()
        .unwrap()
        .to_string();
    (name, outcome["final_steps"].as_u64().unwrap())
}

/// `pipeline fit --json` on [`noise`]: fit's messages, its outcome, the spec's text and
/// the workspace.
fn fit_noise(
    dir: &std::path::Path,
    extra: &[&str],
) -> (String, serde_json::Value, String, std::path::PathBuf) {
    let train = dir.join("noise.svm");
    std::fs::write(&train, noise(0..240)).unwrap();
    let spec = dir.join("noise-fit.toml");
    let ws = dir.join("ws");
    let mut args = vec![
        "fit",
        "--train",
        train.to_str().unwrap(),
        "--budget",
        "20s",
        "--spec-out",
        spec.to_str().unwrap(),
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = pipeline(&ws, &args);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let outcome: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("fit --json printed no JSON ({e}):\n{err}"));
    (err, outcome, std::fs::read_to_string(&spec).unwrap(), ws)
}

#[test]
fn fit_stops_candidates_early_and_trains_the_final_model_as_far_as_the_chosen_run() {
    let dir = tempfile::tempdir().unwrap();
    let (err, outcome, spec, ws) = fit_noise(dir.path(), &[]);
    let rows = scored_rows(&outcome);
    assert_eq!(rows.len(), 4, "{err}");
    // The table on standard error shows the outcome's figures: each candidate's line
    // holds its planned and trained steps.
    for (name, planned, trained, _) in &rows {
        let line = err
            .lines()
            .find(|l| l.starts_with(name.as_str()))
            .unwrap_or_else(|| panic!("{name} not in the table:\n{err}"));
        let numbers: Vec<&str> = line[name.len()..].split_whitespace().collect();
        assert_eq!(
            numbers[1..3],
            [planned.to_string(), trained.to_string()],
            "{line}"
        );
    }
    for (name, planned, trained, _) in &rows {
        assert!(trained <= planned, "{name}: {trained} > {planned}\n{err}");
    }
    // Every selection run (not the probes, which watch nothing) watched validation; at
    // least one stopped on it.
    let runs: Vec<serde_json::Value> = status_json(&ws)["train_runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["dataset"] == "noise-select")
        .cloned()
        .collect();
    let mut selection: Vec<serde_json::Value> = runs
        .iter()
        .filter(|r| r["early_stopping"].is_object())
        .cloned()
        .collect();
    selection.sort_by_key(|r| r["id"].as_i64());
    assert_eq!(selection.len(), 4, "{runs:?}");
    // Patience in passes over the data: at least 5 epochs (of one step here) and train's
    // default of 10 scores.
    for run in &selection {
        let es = &run["early_stopping"];
        let wait = es["every"].as_u64().unwrap() * es["patience"].as_u64().unwrap();
        assert!(es["patience"].as_u64().unwrap() >= 10 && wait >= 5, "{run}");
    }
    let stopped = selection
        .iter()
        .filter(|r| r["stopped"]["reason"] == "no-improvement")
        .count();
    assert!(stopped >= 1, "{selection:?}");
    // The table's columns are each run's planned steps (where --max-steps cuts it, after
    // any time others left) and its last step (the runs are the candidates in order), and
    // one that stopped early ended before its cut and says it converged.
    for (row, run) in rows.iter().zip(&selection) {
        assert_eq!(run["max_steps"], row.1, "{row:?}: {run}");
        assert_eq!(run["stopped"]["step"], row.2, "{row:?}: {run}");
        if run["stopped"]["reason"] == "no-improvement" {
            assert!(row.2 < row.1, "{row:?}");
        }
        assert_eq!(
            row.3,
            run["stopped"]["reason"] == "no-improvement",
            "{row:?}: {run}"
        );
    }
    // The final model trains the steps the chosen candidate's run took, and the score that
    // chose it is that last checkpoint's: the validation evaluation recorded for the run.
    let (name, steps) = chosen_of(&outcome);
    let row = rows.iter().find(|r| r.0 == name).unwrap();
    assert_eq!(steps, row.2, "{outcome}");
    assert!(spec.contains(&format!("steps = {steps}\n")), "{spec}");
    // The final model's runs are the spec's, and its metrics those its evaluate recorded.
    let last = &outcome["final_runs"][0];
    let final_run = status_json(&ws)["train_runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == last["train_run"])
        .cloned()
        .unwrap();
    assert_eq!(final_run["dataset"], "noise", "{final_run}");
    assert_eq!(outcome["evaluated_split"], "train");
    assert!(last["metrics"]["accuracy"].is_number(), "{last}");
    // (A run that went on with the time left was scored again: its last score is its
    // last step's.)
    for run in &selection {
        let evaluations = run["evaluations"].as_array().unwrap();
        let scored = evaluations.last().unwrap();
        assert!(
            evaluations.iter().all(|e| e["split"] == "validation"),
            "{run}"
        );
        assert_eq!(scored["checkpoint_step"], run["stopped"]["step"], "{run}");
    }
}

#[test]
fn fit_without_early_stopping_trains_every_candidate_its_whole_share() {
    let dir = tempfile::tempdir().unwrap();
    let (err, outcome, spec, ws) = fit_noise(dir.path(), &["--no-early-stopping"]);
    let rows = scored_rows(&outcome);
    for (name, planned, trained, _) in &rows {
        assert_eq!(planned, trained, "{name}\n{err}");
    }
    let runs = status_json(&ws)["train_runs"].as_array().unwrap().clone();
    assert!(
        runs.iter().all(|r| r["early_stopping"].is_null()),
        "{runs:?}"
    );
    let (name, steps) = chosen_of(&outcome);
    let row = rows.iter().find(|r| r.0 == name).unwrap();
    assert_eq!(steps, row.1, "{outcome}");
    assert!(spec.contains(&format!("steps = {}\n", row.1)), "{spec}");
}

/// The train runs of dataset `name` in the catalog.
fn train_runs_of(ws: &std::path::Path, name: &str) -> usize {
    status_json(ws)["train_runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["dataset"] == name)
        .count()
}

/// `fit` of `rows` toy rows with one candidate (linear, M = 5) and a budget that affords
/// anything: returns the workspace, the spec's text and fit's messages.
fn fit_one_candidate(dir: &std::path::Path, rows: u32) -> (std::path::PathBuf, String, String) {
    let train = dir.join("toy.svm");
    std::fs::write(&train, points(0..rows)).unwrap();
    let spec = dir.join("toy-fit.toml");
    let ws = dir.join("ws");
    let out = pipeline(
        &ws,
        &[
            "fit",
            "--train",
            train.to_str().unwrap(),
            "--budget",
            "1h",
            "--set",
            "kernel=linear",
            "--set",
            "inducing=5",
            "--spec-out",
            spec.to_str().unwrap(),
        ],
    );
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    (ws, std::fs::read_to_string(&spec).unwrap(), err)
}

#[test]
fn small_data_is_chosen_on_k_folds_that_validate_every_row_once() {
    let dir = tempfile::tempdir().unwrap();
    // 240 rows: about 48 in a 0.2 carve, fewer than 500: five folds.
    let (ws, spec, err) = fit_one_candidate(dir.path(), 240);
    assert!(
        err.contains("each candidate is trained and scored on 5 folds"),
        "{err}"
    );
    assert!(err.contains("candidate (mean ± sd of 5 folds)"), "{err}");
    // Each fold: its own dataset, 240 rows between its train and validation splits, its
    // validation rows disjoint from the others' and together every row once.
    let mut validated = 0;
    for fold in 1..=5 {
        let name = format!("toy-fold{fold}");
        let rows = |split: &str| split_entry(&ws, &name, split)["n_rows"].as_u64().unwrap();
        assert_eq!(rows("train") + rows("validation"), 240, "{name}");
        validated += rows("validation");
        // The candidate trained and scored on it: its probe's first steps and the probe
        // (two runs: a budget of an hour affords the whole probe), then its capped run.
        assert_eq!(train_runs_of(&ws, &name), 3, "{name}");
        // Its run was given the step cap (60 epochs of 1 step, at least 3 000): the folds
        // are chosen because every capped run fits, and a share of what the clock says is
        // left would make the steps, hence the final model, depend on the machine's load.
        let capped = status_json(&ws)["train_runs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["dataset"] == name.as_str())
            .max_by_key(|r| r["id"].as_i64())
            .cloned()
            .unwrap();
        assert_eq!(capped["max_steps"], 3000, "{name}: {capped}");
    }
    assert_eq!(
        validated, 240,
        "the folds' validation rows cover the file once"
    );
    // The final model trains the median of the folds' steps.
    let by_fold = err
        .lines()
        .find_map(|l| l.trim().strip_prefix("steps by fold: "))
        .unwrap_or_else(|| panic!("{err}"));
    let mut steps: Vec<u64> = by_fold.split(", ").map(|s| s.parse().unwrap()).collect();
    assert_eq!(steps.len(), 5, "{by_fold}");
    steps.sort_unstable();
    assert!(
        spec.contains(&format!("steps = {}\n", steps[2])),
        "{spec}\n{by_fold}"
    );
}

/// Multi-label rows of bag-of-words counts over 2 000 features (sparse): label j of 5 is
/// on when feature j + 1 is among the row's words. Their rows are sparse, so the first
/// candidate is the linear model with subspace Z, and the others put free Z in input space.
fn words(rows: std::ops::Range<u32>) -> String {
    rows.map(|i| {
        let mut features: Vec<u32> = (0..8).map(|k| 1 + (i * 37 + k * 251) % 2000).collect();
        features.sort_unstable();
        features.dedup();
        let labels: Vec<String> = (0..5u32)
            .filter(|j| features.contains(&(j + 1)) || i % 5 == *j)
            .map(|j| j.to_string())
            .collect();
        let words: Vec<String> = features.iter().map(|f| format!("{f}:1")).collect();
        format!("{} {}\n", labels.join(","), words.join(" "))
    })
    .collect()
}

/// `pipeline fit` on [`words`] with the environment `env` and `extra` options.
fn fit_words(dir: &std::path::Path, env: &[(&str, &str)], extra: &[&str]) -> std::process::Output {
    fit_rows(dir, ("words", &words(0..300)), env, extra)
}

/// `fit_words` on `rows` (LIBSVM text, written to `NAME.svm`, so the dataset is `NAME`)
/// instead of its 300 rows.
fn fit_rows(
    dir: &std::path::Path,
    (name, rows): (&str, &str),
    env: &[(&str, &str)],
    extra: &[&str],
) -> std::process::Output {
    let train = dir.join(format!("{name}.svm"));
    std::fs::write(&train, rows).unwrap();
    let spec = dir.join(format!("{name}-fit.toml"));
    let mut args = vec![
        "--workspace".to_string(),
        dir.join("ws").display().to_string(),
        "fit".into(),
        "--train".into(),
        train.display().to_string(),
        "--budget".into(),
        "20s".into(),
        "--spec-out".into(),
        spec.display().to_string(),
        // 300 rows carve fewer validation rows than the folds' threshold: these tests
        // are about the one carve's loop.
        "--no-folds".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let mut cmd = std::process::Command::new(pipeline_bin());
    cmd.args(&args).env_remove("FSGP_WORKSPACE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// [`words`]' rows with labels drawn independently of them (a hash of the row and label
/// number, about a third of 5 on, at least one): P@1 on validation levels at once and
/// then only wanders, so early stopping ends the runs on a plateau.
fn noisy_words(rows: std::ops::Range<u32>) -> String {
    words(rows.clone())
        .lines()
        .zip(rows)
        .map(|(line, i)| {
            let (_, words) = line.split_once(' ').unwrap();
            let drawn = |j: u32| (f64::from(i * 7 + j) * 12.9898).sin().abs() * 43758.5453 % 1.0;
            let mut labels: Vec<String> = (0..5u32)
                .filter(|&j| drawn(j) < 0.35)
                .map(|j| j.to_string())
                .collect();
            if labels.is_empty() {
                labels.push((i % 5).to_string());
            }
            format!("{} {words}\n", labels.join(","))
        })
        .collect()
}

#[test]
fn a_converged_multilabel_candidate_is_judged_by_the_mean_of_its_scores_from_its_best() {
    let dir = tempfile::tempdir().unwrap();
    let out = fit_rows(
        dir.path(),
        ("noisy", &noisy_words(0..600)),
        &[],
        &["--json"],
    );
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let outcome: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ws = dir.path().join("ws");
    let runs = status_json(&ws)["train_runs"].as_array().unwrap().clone();
    let (mut judged, mut apart) = (0, 0);
    for c in outcome["candidates"].as_array().unwrap() {
        if c["status"] != "scored" || c["converged"] != true {
            continue;
        }
        let id = c["selection_run"].as_i64().unwrap();
        let run = runs.iter().find(|r| r["id"] == id).unwrap();
        let best = &run["stopped"]["best"];
        assert_eq!(best["metric"], "P@1", "{run}");
        let best_step = best["step"].as_i64().unwrap();
        // The scores train recorded in the catalog, from the best to the end.
        let scores: Vec<f64> = common::toy::metrics(&ws, id, "early_stopping_score")
            .into_iter()
            .filter(|&(step, _)| step >= best_step)
            .map(|(_, bits)| f64::from_bits(bits))
            .collect();
        assert!(scores.len() > 1, "{run}: {scores:?}");
        let mean = scores.iter().sum::<f64>() / scores.len() as f64;
        let compared = c["validation"]["primary"]["value"].as_f64().unwrap();
        assert!(
            (compared - mean).abs() <= 1e-12,
            "{}: compared {compared}, the mean of {scores:?} is {mean}",
            c["name"]
        );
        judged += 1;
        // The last score alone (what the rule compared before) differs from the mean.
        apart += usize::from((scores.last().unwrap() - mean).abs() > 1e-9);
    }
    assert!(
        judged > 0 && apart > 0,
        "{judged} judged, {apart} apart:\n{err}"
    );
}

#[test]
fn a_candidate_held_at_its_probe_begins_a_selection_run_in_the_time_left() {
    let dir = tempfile::tempdir().unwrap();
    // The failpoint holds every candidate at its probe, as a share that affords no more
    // steps than the probe's would: the time left then goes to them.
    let failpoint = [("FSGP_FAILPOINT", "fit-held-at-probe:1")];
    let out = fit_words(dir.path(), &failpoint, &["--json"]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let outcome: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let runs = status_json(&dir.path().join("ws"))["train_runs"]
        .as_array()
        .unwrap()
        .clone();
    // Lines "N s left; NAME trains a selection run of TO steps with early stopping (its
    // share held it at its P-step probe)".
    let anew: Vec<&str> = err.lines().filter(|l| l.contains("-step probe)")).collect();
    assert!(!anew.is_empty(), "no run began anew:\n{err}");
    for line in &anew {
        let (to, probe) = (
            number_after(line, " a selection run of "),
            number_after(line, " held it at its "),
        );
        assert!(to > probe, "{line}");
        let c = outcome["candidates"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| {
                line.contains(&format!(
                    "; {} trains a selection run",
                    c["name"].as_str().unwrap()
                ))
            })
            .unwrap_or_else(|| panic!("{line}: no candidate"));
        // Its row is the new run's: early stopping on, and either it converged (possibly
        // before the probe's last step) or it trained to where it was planned, or later.
        let id = c["selection_run"].as_i64().unwrap();
        let run = runs.iter().find(|r| r["id"] == id).unwrap();
        assert!(!run["early_stopping"].is_null(), "{line}: {run}");
        let trained = c["trained_steps"].as_u64().unwrap();
        assert!(c["converged"] == true || trained >= to, "{line}: {c}");
        assert!(c["planned_steps"].as_u64().unwrap() >= to, "{line}: {c}");
    }
    // Within its budget (20 s), give or take the tests beside it.
    let seconds = outcome["seconds"].as_f64().unwrap();
    assert!(seconds <= 22.0, "{seconds}\n{err}");
}

#[test]
fn a_candidate_that_cannot_run_is_a_row_of_the_table_and_the_fit_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    // A limit of 1 MiB for inducing inputs in input space: the free-Z candidates' memory
    // estimate (M×D doubles, several MiB) refuses them; the subspace one needs none.
    let out = fit_words(dir.path(), &[("FSGP_INPUTS_MEMORY_MIB", "1")], &["--json"]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("task multilabel"), "{err}");
    let table = err.split("candidate (validation)").nth(1).unwrap();
    // The free-Z candidates the budget affords (the cut may drop the last under load).
    let failed: Vec<&str> = table.lines().filter(|l| l.contains(" failed: ")).collect();
    assert!(!failed.is_empty(), "{table}");
    assert!(
        err.contains("failed: --inducing-inputs free needs about"),
        "{err}"
    );
    for line in &failed {
        assert!(line.contains("free Z"), "{line}");
        assert!(
            line.contains("failed: --inducing-inputs free needs about"),
            "{line}"
        );
    }
    let outcome: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = scored_rows(&outcome);
    // The axes train no inducing inputs (their queue fits the limit) and the subspace's
    // live in the basis: those two run, and the axes under their two fixed priors when
    // the budget's cut kept them (they come after the free-Z candidates; the cut drops the
    // last first).
    assert!((2..=4).contains(&rows.len()), "{table}");
    assert!(
        rows[0].0.starts_with("linear, Z at the axes (exact), M"),
        "{table}"
    );
    assert!(rows[1].0.starts_with("linear, subspace Z"), "{table}");
    if let Some(weak) = rows.get(2) {
        assert!(weak.0.contains("weak fixed prior"), "{table}");
    }
    if let Some(per_label) = rows.get(3) {
        assert!(
            per_label.0.contains("one GP per label, fixed prior"),
            "{table}"
        );
    }
    // The outcome lists the failed candidates too, with the error's first line.
    let reasons: Vec<&str> = outcome["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == "failed")
        .map(|c| c["reason"].as_str().unwrap())
        .collect();
    assert_eq!(reasons.len(), failed.len(), "{outcome}");
    assert!(
        reasons
            .iter()
            .all(|r| r.starts_with("--inducing-inputs free needs about")),
        "{reasons:?}"
    );
    // Which of the two wins is the validation's noise on these rows (both score below the
    // label frequencies, and their step plans follow the machine's load): the choice is one
    // of the candidates that ran, never a failed one.
    let chosen = err
        .lines()
        .find_map(|l| l.strip_prefix("== fit: chosen "))
        .unwrap_or_else(|| panic!("no choice in {err}"));
    assert!(
        rows.iter()
            .any(|(name, ..)| chosen.starts_with(name.as_str())),
        "{chosen} is not one of {rows:?}"
    );
    // Every candidate refused: the fit fails, saying so after its table.
    let dir = tempfile::tempdir().unwrap();
    let out = fit_words(
        dir.path(),
        &[("FSGP_INPUTS_MEMORY_MIB", "1")],
        &["--set", "inducing-inputs=free"],
    );
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("every candidate failed"), "{err}");
    assert!(
        err.contains("failed: --inducing-inputs free needs about"),
        "{err}"
    );
    // The label frequencies' line still shows the task's figures (P@1 and P@3 here), not
    // a classifier's accuracy and NLP, though no candidate was scored.
    let baseline = err
        .lines()
        .find(|l| l.starts_with("(label frequencies, no model)"))
        .unwrap_or_else(|| panic!("no baseline line in {err}"));
    assert!(
        baseline.contains(" P@1 ") && baseline.contains(" P@3 "),
        "{baseline}"
    );
    // Settings no candidate can take (the axes with the SE kernel) are refused by name.
    let dir = tempfile::tempdir().unwrap();
    let out = fit_words(
        dir.path(),
        &[],
        &["--set", "inducing-inputs=axes", "--set", "kernel=se"],
    );
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("leave none of this task's candidates: inducing inputs at the axes"),
        "{err}"
    );
}

#[test]
fn candidates_the_cut_dropped_run_in_the_time_the_others_leave() {
    let dir = tempfile::tempdir().unwrap();
    // The cut is made as if the first probe's steps took 1 000 times as long: it keeps the
    // first candidate alone. That one's run converges in a second or two of the 20 s, and
    // the readmission, priced by the true step time, runs the dropped ones.
    let out = fit_words(
        dir.path(),
        &[("FSGP_FAILPOINT", "fit-cut-slower:1000")],
        &["--json"],
    );
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("to 1 candidate(s); dropped: "), "{err}");
    let readmitted: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("which the budget's cut dropped, runs in"))
        .collect();
    assert!(!readmitted.is_empty(), "{err}");
    let outcome: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = scored_rows(&outcome);
    // The first and every readmitted one are rows of the table, in list order.
    assert_eq!(rows.len(), 1 + readmitted.len(), "{err}");
    for (line, (name, ..)) in readmitted.iter().zip(&rows[1..]) {
        assert!(line.contains(name.as_str()), "{line} / {name}");
    }
    // The fit still ends within its budget, give or take what the tests beside it slow
    // its steps after they were measured (a tenth, as for the runs behind the leader).
    let seconds = outcome["seconds"].as_f64().unwrap();
    let budget = outcome["budget_seconds"].as_f64().unwrap();
    assert!(seconds <= 1.1 * budget, "{seconds} s of {budget}\n{err}");
}

/// `pipeline fit` of 2 800 rows with one candidate listed (the linear kernel with `inducing`
/// inputs), a 20 s budget, the spec at `toy-fit.toml` in `dir` and `FSGP_FAILPOINT` set to
/// `failpoint`, with `extra` arguments: its output and the spec's path.
fn lone_fit(
    dir: &std::path::Path,
    inducing: u32,
    failpoint: &str,
    extra: &[&str],
) -> (std::process::Output, std::path::PathBuf) {
    let train = dir.join("toy.svm");
    std::fs::write(&train, points(0..2800)).unwrap();
    let spec = dir.join("toy-fit.toml");
    let out = std::process::Command::new(pipeline_bin())
        .args(["--workspace", dir.join("ws").to_str().unwrap()])
        .args(["fit", "--train", train.to_str().unwrap(), "--budget", "20s"])
        .args([
            "--set",
            "kernel=linear",
            "--set",
            &format!("inducing={inducing}"),
        ])
        .args(["--spec-out", spec.to_str().unwrap()])
        .args(extra)
        .env_remove("FSGP_WORKSPACE")
        .env("FSGP_FAILPOINT", failpoint)
        .output()
        .unwrap();
    (out, spec)
}

#[test]
fn a_lone_candidate_short_of_its_epochs_gets_no_selection_run() {
    let dir = tempfile::tempdir().unwrap();
    // 2 800 rows: the one carve (no folds). The share is judged as if its steps took 1 000
    // times as long: fewer than the twenty epochs a selection run needs.
    let (out, spec) = lone_fit(dir.path(), 5, "fit-share-slower:1000", &["--json"]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("no selection run"), "{err}");
    let outcome: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = outcome["candidates"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{outcome}");
    // Scored at its probe's last step; no run after it.
    let probe_steps = rows[0]["trained_steps"].as_u64().unwrap();
    assert!(probe_steps <= 50, "{outcome}");
    assert_eq!(rows[0]["converged"], false, "{outcome}");
    // The final model trains the time left, by the true step time: far more steps.
    let final_steps = outcome["final_steps"].as_u64().unwrap();
    assert!(final_steps > probe_steps, "{outcome}");
    let spec_text = std::fs::read_to_string(&spec).unwrap();
    // A run of the step cap cut at its steps, so that it can go on.
    assert!(
        spec_text.contains(&format!("max_steps = {final_steps}\n")),
        "{spec_text}"
    );
    assert!(spec_text.contains("with no selection run"), "{spec_text}");
    // Within its budget, and the datasets are the selection's and the final model's only.
    let seconds = outcome["seconds"].as_f64().unwrap();
    assert!(seconds <= 20.0, "{seconds}");
    assert_eq!(dataset_names(&dir.path().join("ws")), ["toy-select", "toy"]);
    // Its final model fitted the time left: no warning that the fit will overrun.
    assert!(!err.contains("past its budget"), "{err}");
}

#[test]
fn a_budget_the_final_models_fixed_costs_overrun_makes_the_probe_the_final_model() {
    let dir = tempfile::tempdir().unwrap();
    // The failpoint prices the final model's ingest, svd and scoring at 1 000 times what
    // the selection data measured: more than the 20 s budget holds (a budget below what
    // the data's ingest and scoring take, as on a million rows and half a minute). The
    // time left then buys no step beyond the probe's: training them again on every row
    // would only end the fit past its budget.
    let (out, spec) = lone_fit(dir.path(), 5, "fit-fixed-dearer:1000", &["--json"]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("its probe's run, trained on the selection split's rows, is the final model"),
        "{err}"
    );
    assert!(!err.contains("past its budget"), "{err}");
    assert!(!err.contains("training it on every training row"), "{err}");
    let outcome: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let probe = &outcome["candidates"][0];
    let probe_steps = probe["trained_steps"].as_u64().unwrap();
    assert_eq!(
        outcome["final_steps"].as_u64(),
        Some(probe_steps),
        "{outcome}"
    );
    // The final run is the probe's own run, scored; the whole file is not ingested again.
    let final_runs = outcome["final_runs"].as_array().unwrap();
    assert_eq!(final_runs.len(), 1, "{outcome}");
    assert_eq!(
        final_runs[0]["train_run"], probe["selection_run"],
        "{outcome}"
    );
    assert_eq!(dataset_names(&dir.path().join("ws")), ["toy-select"]);
    let seconds = outcome["seconds"].as_f64().unwrap();
    assert!(seconds <= 20.0, "{seconds}");
    // The spec says so and reproduces that model: the selection carve, the probe's steps.
    let text = std::fs::read_to_string(&spec).unwrap();
    assert!(text.contains("the probe's run"), "{text}");
    assert!(text.contains("name = \"toy-select\""), "{text}");
    assert!(text.contains("validation_fraction = 0.2\n"), "{text}");
    assert!(text.contains(&format!("steps = {probe_steps}\n")), "{text}");
    assert!(!text.contains("max_steps"), "{text}");
    let again = pipeline(&dir.path().join("fresh"), &["run", spec.to_str().unwrap()]);
    assert!(again.status.success(), "{}", stderr(&again));
}

#[test]
fn a_lone_candidate_whose_selection_run_had_not_converged_gives_its_final_model_the_time_left() {
    let dir = tempfile::tempdir().unwrap();
    // A share of more than its twenty epochs, so a selection run, but short of the step cap
    // (M = 200 makes a step cost milliseconds); the failpoint counts it as unconverged
    // should it converge.
    let (out, spec) = lone_fit(dir.path(), 200, "fit-lone-unconverged:1", &["--json"]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("its selection run had not converged at step"),
        "{err}"
    );
    assert!(!err.contains("no selection run"), "{err}");
    let outcome: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = outcome["candidates"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{outcome}");
    // A selection run beyond the probe, not gone on with: the final model has the time.
    let selection_steps = rows[0]["trained_steps"].as_u64().unwrap();
    assert!(selection_steps > 50, "{outcome}");
    // ("N s left; NAME trains M steps more": a selection run going on.)
    assert!(!err.contains(" s left; "), "{err}");
    let final_steps = outcome["final_steps"].as_u64().unwrap();
    assert!(final_steps > selection_steps, "{outcome}");
    let text = std::fs::read_to_string(&spec).unwrap();
    assert!(text.contains("had not converged after"), "{text}");
    assert!(
        text.contains(&format!("max_steps = {final_steps}\n")),
        "{text}"
    );
    // Within its budget, give or take what the tests running beside it slow its steps
    // after they were measured (the final model plans up to the budget's last seconds).
    let seconds = outcome["seconds"].as_f64().unwrap();
    assert!(seconds <= 22.0, "{seconds}");
}

#[test]
fn a_final_model_planned_short_of_its_time_goes_on_and_its_spec_says_where_it_ended() {
    let dir = tempfile::tempdir().unwrap();
    let test = dir.path().join("toy-test.svm");
    std::fs::write(&test, points(2800..3000)).unwrap();
    // No selection run, and the final model's steps planned as if they took 1 000 times
    // as long as the probe's: its planned steps end far short of the budget.
    let started = std::time::Instant::now();
    let test_arg = ["--test", test.to_str().unwrap()];
    let (out, spec) = lone_fit(dir.path(), 5, "fit-lone-slower:1000", &test_arg);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(started.elapsed().as_secs_f64() < 20.0, "over its budget");
    let planned = number_after(&err, "its final model trains the time left (");
    // Its first leg, three quarters of the planned steps, then the rest by its own rate.
    let leg = (0.75 * planned as f64).ceil() as u64;
    assert!(err.contains(&format!("more from step {leg}\n")), "{err}");
    // The spec says where the final run ended.
    let text = std::fs::read_to_string(&spec).unwrap();
    let final_steps = number_after(&text, "max_steps = ");
    assert!(final_steps > planned, "{planned}: {text}");
    // The clock, not the step cap of 3 000, ends it: steps of about a millisecond here,
    // and the ceiling of four caps (12 000) bounds it.
    assert!((3_001..=12_000).contains(&final_steps), "{text}");
    // A run of that ceiling, cut where it ended.
    assert_eq!(number_after(&text, "\nsteps = "), 12_000, "{text}");
    assert!(text.contains("with no selection run"), "{text}");
    // `pipeline run` of it in a fresh workspace trains that run without a stop and prints
    // the same test metrics.
    let fresh = dir.path().join("fresh");
    let again = pipeline(&fresh, &["run", spec.to_str().unwrap()]);
    assert!(again.status.success(), "{}", stderr(&again));
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(printed.contains("accuracy"), "{printed}");
    assert_eq!(String::from_utf8_lossy(&again.stdout), printed);
}

#[test]
fn a_final_model_reads_the_clock_again_after_each_extension() {
    let dir = tempfile::tempdir().unwrap();
    // No selection run; the final model's first extension trains half of what the time
    // left affords, and the clock, read again, gives it more.
    let (out, spec) = lone_fit(dir.path(), 5, "fit-final-short-extension:1", &["--json"]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let from: Vec<u64> = err
        .lines()
        .filter_map(|l| l.split("steps more from step ").nth(1))
        .map(|n| n.parse().unwrap())
        .collect();
    assert!(from.len() >= 2 && from[1] > from[0], "{err}");
    let outcome: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let final_steps = outcome["final_steps"].as_u64().unwrap();
    assert!(final_steps > from[from.len() - 1], "{final_steps}\n{err}");
    let text = std::fs::read_to_string(&spec).unwrap();
    assert_eq!(number_after(&text, "max_steps = "), final_steps, "{text}");
}

#[test]
fn a_final_model_trained_for_the_time_left_ends_at_its_first_leg_when_its_steps_run_slow() {
    let dir = tempfile::tempdir().unwrap();
    // No selection run; the final model is planned by its probe's step time, and the
    // failpoint takes its own steps to have no end: after its first leg, the time left
    // affords no more.
    let (out, spec) = lone_fit(dir.path(), 5, "fit-final-stalled:1", &["--json"]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let planned = number_after(&err, "its final model trains the time left (");
    let outcome: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let final_steps = outcome["final_steps"].as_u64().unwrap();
    // Three quarters of the planned steps (the rest is more than an epoch of 5 steps).
    let leg = (0.75 * planned as f64).ceil() as u64;
    assert!(planned - leg >= 5, "{planned}\n{err}");
    assert_eq!(final_steps, leg, "{planned} planned\n{err}");
    assert!(
        err.contains(&format!("ends at step {leg} of the {planned} planned")),
        "{err}"
    );
    assert!(!err.contains("more from step"), "{err}");
    // The spec says where the final run ended, and `pipeline run` of it in a fresh
    // workspace trains that run and prints the same figures.
    let text = std::fs::read_to_string(&spec).unwrap();
    assert_eq!(number_after(&text, "max_steps = "), leg, "{text}");
    let fresh = dir.path().join("fresh");
    let again = pipeline(&fresh, &["run", spec.to_str().unwrap()]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(
        stderr(&again).contains(&format!("{leg} steps in")),
        "{}",
        stderr(&again)
    );
}

#[test]
fn larger_data_is_chosen_on_the_one_carve() {
    let dir = tempfile::tempdir().unwrap();
    // 2 800 rows: about 560 in a 0.2 carve (sd 21), 500 or more: no folds.
    let (ws, _, err) = fit_one_candidate(dir.path(), 2800);
    assert!(err.contains("candidate (validation)"), "{err}");
    assert!(!err.contains("folds"), "{err}");
    assert_eq!(dataset_names(&ws), ["toy-select", "toy"]);
}

#[test]
fn a_stop_asked_for_during_a_candidate_ends_the_fit_at_once() {
    let dir = tempfile::tempdir().unwrap();
    // Ctrl-C at the first probe's second step: a request, not the candidate's failure.
    let out = fit_words(dir.path(), &[("FSGP_FAILPOINT", "train-ctrl-c:2")], &[]);
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("stopped on request"), "{err}");
    assert!(!err.contains("== fit: candidate linear, free Z"), "{err}");
    assert!(!err.contains("candidate (validation)"), "{err}");
    // A disk that fills while a checkpoint is written: the workspace's fault, not the
    // candidate's.
    let dir = tempfile::tempdir().unwrap();
    let out = fit_words(
        dir.path(),
        &[("FSGP_FAILPOINT", "checkpoint-write-enospc:3")],
        &[],
    );
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("No space left on device"), "{err}");
    assert!(!err.contains("== fit: candidate linear, free Z"), "{err}");
}

#[test]
fn a_candidate_that_cannot_run_on_the_folds_is_left_out_and_the_fit_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let train = dir.path().join("words.svm");
    // 200 rows: about 40 in a 0.2 carve, so folds when the budget affords them.
    std::fs::write(&train, words(0..200)).unwrap();
    let spec = dir.path().join("words-fit.toml");
    let out = std::process::Command::new(pipeline_bin())
        .args([
            "--workspace",
            dir.path().join("ws").to_str().unwrap(),
            "fit",
        ])
        .args(["--train", train.to_str().unwrap(), "--budget", "1h"])
        .args(["--spec-out", spec.to_str().unwrap(), "--set", "inducing=10"])
        .env_remove("FSGP_WORKSPACE")
        // The free-Z candidates' memory estimate is refused; the subspace needs none.
        .env("FSGP_INPUTS_MEMORY_MIB", "0")
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("trained and scored on 5 folds"), "{err}");
    assert!(
        err.contains("failed: --inducing-inputs free needs about"),
        "{err}"
    );
    assert!(err.contains("== fit: chosen linear, subspace Z"), "{err}");
}

#[test]
fn fits_of_two_files_of_one_name_take_names_of_their_own_and_a_spec_in_the_workspace() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    for (sub, rows) in [("a", 0..240), ("b", 240..480)] {
        std::fs::create_dir(dir.path().join(sub)).unwrap();
        std::fs::write(dir.path().join(sub).join("train.txt"), points(rows)).unwrap();
    }
    // `pipeline --workspace WS` of this test.
    let in_ws = || {
        let mut cmd = std::process::Command::new(pipeline_bin());
        cmd.arg("--workspace").arg(&ws).env_remove("FSGP_WORKSPACE");
        cmd
    };
    let fit = |sub: &str, env: &[(&str, &str)], extra: &[&str]| {
        let train = dir.path().join(sub).join("train.txt");
        let mut cmd = in_ws();
        cmd.args(["fit", "--train", train.to_str().unwrap(), "--budget", "20s"])
            .args([
                "--no-folds",
                "--set",
                "kernel=linear",
                "--set",
                "inducing=5",
                "--json",
            ])
            .args(extra)
            // The working directory gets nothing: the spec goes into the workspace.
            .current_dir(dir.path());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let outcome: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        outcome
    };
    let spec_of = |outcome: &serde_json::Value| {
        let path = std::path::PathBuf::from(outcome["spec"].as_str().unwrap());
        assert!(path.starts_with(&ws), "{}", path.display());
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("[train]"), "{text}");
        path.file_name().unwrap().to_str().unwrap().to_string()
    };
    let first = fit("a", &[], &[]);
    assert_eq!(first["dataset"], "train");
    assert_eq!(spec_of(&first), "train-fit.toml");
    // Another file of the same name: datasets and a spec of its own, not a refusal.
    let other = fit("b", &[], &[]);
    assert_eq!(other["dataset"], "train-2");
    assert_eq!(spec_of(&other), "train-2-fit.toml");
    // The first file again: its datasets are reused (no ingest runs again), the spec is new.
    // Every run, not status's recent ones: under load a refit plans other steps, and its
    // new runs would push the ingests out of the recent window.
    let ingests = |ws: &std::path::Path| {
        let out = pipeline(ws, &["status", "--json", "--runs", "100000"]);
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["runs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["stage"] == "ingest")
            .count()
    };
    let before = ingests(&ws);
    let again = fit("a", &[], &[]);
    assert_eq!(again["dataset"], "train");
    assert_eq!(spec_of(&again), "train-fit-2.toml");
    assert_eq!(
        ingests(&ws),
        before,
        "the same file's datasets were ingested again"
    );
    let only_mine: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let mut only_mine = only_mine;
    only_mine.sort();
    assert_eq!(
        only_mine,
        ["a", "b", "ws"],
        "fit wrote into the working directory"
    );
    // A fit that ends before its spec is written (every candidate refused: free inducing
    // inputs over 2 000 features need more than 1 MiB) leaves no empty spec behind.
    std::fs::create_dir(dir.path().join("c")).unwrap();
    let train = dir.path().join("c").join("train.txt");
    std::fs::write(&train, words(0..300)).unwrap();
    let failed = in_ws()
        .args(["fit", "--train", train.to_str().unwrap(), "--budget", "20s"])
        .args(["--no-folds", "--set", "inducing-inputs=free"])
        .env("FSGP_INPUTS_MEMORY_MIB", "1")
        .output()
        .unwrap();
    assert!(
        stderr(&failed).contains("as 'train-3-select'"),
        "{}",
        stderr(&failed)
    );
    assert!(!failed.status.success(), "{}", stderr(&failed));
    let mut specs: Vec<String> = std::fs::read_dir(ws.join("fits"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    specs.sort();
    assert_eq!(
        specs,
        ["train-2-fit.toml", "train-fit-2.toml", "train-fit.toml"],
        "{}",
        stderr(&failed)
    );
    // A --name that would lead the spec's file out of the workspace is refused before any
    // file is made, there or anywhere.
    let escaping = in_ws()
        .args([
            "fit",
            "--train",
            train.to_str().unwrap(),
            "--name",
            "../../escape",
        ])
        .output()
        .unwrap();
    assert!(!escaping.status.success());
    assert!(
        stderr(&escaping).contains("is not allowed"),
        "{}",
        stderr(&escaping)
    );
    assert!(!dir.path().join("escape-fit.toml").exists());
    assert!(!ws.join("escape-fit.toml").exists());
    assert_eq!(std::fs::read_dir(ws.join("fits")).unwrap().count(), 3);
}

/// Every event of a library fit, by kind, in order.
struct Recorded(Vec<&'static str>);

impl fsgp::fit::FitObserver for Recorded {
    fn event(&mut self, event: fsgp::fit::FitEvent<'_>) {
        use fsgp::fit::FitEvent as E;
        self.0.push(match event {
            E::Ingesting { .. } => "ingesting",
            E::Planned { .. } => "planned",
            E::CandidateStarted { .. } => "candidate",
            E::CandidateDone(_) => "done-candidate",
            E::Table { .. } => "table",
            E::Chosen { .. } => "chosen",
            E::FinalStageStarted { .. } => "stage",
            E::FinalStages(_) => "stages",
            E::Done { .. } => "done",
            _ => "other",
        });
    }
}

#[test]
fn fit_called_from_rust_returns_its_outcome_and_tells_its_observer_each_step() {
    use fsgp::fit::{CandidateResult, FitRequest};
    use fsgp::metrics::evaluation::Evaluation;
    use fsgp::train::{TrainFlag, TrainOptions};
    use fsgp::trained::KernelChoice;

    let dir = tempfile::tempdir().unwrap();
    let train = dir.path().join("toy.svm");
    let test = dir.path().join("toy-test.svm");
    std::fs::write(&train, points(0..240)).unwrap();
    std::fs::write(&test, points(240..320)).unwrap();
    let ws = fsgp::store::workspace::Workspace::open(&dir.path().join("ws")).unwrap();
    let mut request = FitRequest::new(&train);
    request.test = Some(test);
    request.budget_seconds = 20.0;
    request.folds = false;
    request.overrides = TrainOptions {
        kernel: KernelChoice::Linear,
        given: [TrainFlag::Kernel].into(),
        ..TrainOptions::default()
    };
    let mut events = Recorded(Vec::new());
    let outcome = fsgp::fit::run(&ws, &request, &mut events).unwrap();
    assert_eq!((outcome.dataset.as_str(), outcome.task), ("toy", "binary"));
    assert_eq!((outcome.folds, outcome.evaluated_split), (1, "test"));
    // The override fixes the kernel: the four candidates collapse to the two Ms.
    let names: Vec<&str> = outcome.candidates.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        ["linear, free Z, M = 100", "linear, free Z, M = 188"]
    );
    let chosen = outcome.chosen();
    assert_eq!(chosen.train["kernel"], "linear");
    assert_eq!(chosen.train["likelihood"], "logistic");
    let CandidateResult::Scored { trained_steps, .. } = &chosen.result else {
        panic!("the chosen candidate was scored: {chosen:?}")
    };
    assert_eq!(*trained_steps, outcome.final_steps);
    assert_eq!(outcome.final_runs.len(), 1);
    let Evaluation::Binary(test_metrics) = &outcome.final_runs[0].metrics else {
        panic!("binary metrics: {:?}", outcome.final_runs[0].metrics)
    };
    assert!(test_metrics.accuracy > 0.8, "{}", test_metrics.accuracy);
    let spec = std::fs::read_to_string(&outcome.spec).unwrap();
    assert!(
        spec.contains(&format!("steps = {}", outcome.final_steps)),
        "{spec}"
    );
    // The observer heard the rule's steps in order: one line per candidate, the table, the
    // choice, the final model's five stages, the end.
    let done = events.0.iter().filter(|e| **e == "done-candidate").count();
    assert_eq!(done, outcome.candidates.len());
    let steps: Vec<&str> = events
        .0
        .iter()
        .copied()
        .filter(|e| !matches!(*e, "candidate" | "done-candidate" | "other"))
        .collect();
    assert_eq!(
        steps,
        [
            "ingesting",
            "planned",
            "table",
            "chosen",
            "stage",
            "stage",
            "stage",
            "stage",
            "stage",
            "stages",
            "done"
        ]
    );
}

#[test]
fn runs_behind_a_converged_leader_train_on_in_the_time_its_final_model_leaves() {
    let dir = tempfile::tempdir().unwrap();
    // 6 000 rows whose labels are their first word's number mod 5 and 5 + their second's
    // mod 3: the exact weights learn them in a few epochs and converge at a cheap final
    // model, while the runs with inducing inputs (tens of ms a step, ten-step epochs) end
    // their shares unconverged.
    let rows: String = words(0..6000)
        .lines()
        .map(|line| {
            let (_, words) = line.split_once(' ').unwrap();
            let ids: Vec<u32> = words
                .split(' ')
                .map(|w| w.split(':').next().unwrap().parse().unwrap())
                .collect();
            format!("{},{} {words}\n", ids[0] % 5, 5 + ids[1] % 3)
        })
        .collect();
    // The failpoint prices the final model of a run behind the leader at 1 000 times its
    // step time when the rule's reserve is kept: the leader's extensions leave them.
    let failpoint = [("FSGP_FAILPOINT", "fit-behind-dearer:1000")];
    let out = fit_rows(dir.path(), ("two-labels", &rows), &failpoint, &["--json"]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let outcome: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = scored_rows(&outcome);
    // Lines "N s left; NAME trains M steps more from step S, the final model of LEADER
    // reserved": each names a run behind the leader, which goes on from its last step; or,
    // for a run its share held at its probe of P steps, "NAME trains a selection run of
    // TO steps with early stopping (its share held it at its P-step probe), the final
    // model of LEADER reserved".
    let trailing: Vec<&str> = err
        .lines()
        .filter(|l| l.contains(", the final model of "))
        .collect();
    // Where the run of such a line was to end.
    let planned_to = |line: &str| match line.contains(" a selection run of ") {
        true => number_after(line, " a selection run of "),
        false => number_after(line, " trains ") + number_after(line, " steps more from step "),
    };
    for line in &trailing {
        let (name, ..) = rows
            .iter()
            .find(|(name, ..)| line.contains(&format!("; {name} trains ")))
            .unwrap_or_else(|| panic!("{line}: no row of {rows:?}"));
        let leader = line.split(", the final model of ").nth(1).unwrap();
        assert!(!leader.starts_with(name.as_str()), "{line}");
        let from = match line.contains(" a selection run of ") {
            true => number_after(line, " held it at its "),
            false => number_after(line, " steps more from step "),
        };
        assert!(from > 0 && planned_to(line) > from, "{line}");
    }
    // The last such run planned its steps to the budget's end, the leader's final model
    // reserved: the table's planned steps are where it was to end.
    if let Some(last) = trailing.last() {
        assert!(
            rows.iter()
                .any(|(_, planned, ..)| *planned == planned_to(last)),
            "{last}: {rows:?}"
        );
    }
    // The fit uses 80 % of its budget unless every run behind the chosen one converged.
    // On a quiet machine the runs behind end their shares unconverged and the leader's
    // final model takes a few seconds of the five its reserve kept: without the time going
    // to them it ended at 15.8 s. (Loaded by the tests beside it, the selection itself
    // takes the budget and there is nothing left to give.)
    let seconds = outcome["seconds"].as_f64().unwrap();
    let (chosen, _) = chosen_of(&outcome);
    let open_behind = rows
        .iter()
        .any(|(name, _, _, converged)| *name != chosen && !converged);
    assert!(
        seconds >= 16.0 || !open_behind,
        "{seconds} s of 20 with runs unconverged:\n{err}"
    );
    // Whatever it chose, the fit ends within its budget (give or take what the tests
    // beside it slow its steps after they were measured).
    assert!(seconds <= 22.0, "{seconds}\n{err}");
}
