//! `pipeline fit`: a small binary file to a chosen model within its budget, the spec it
//! writes, and that spec reproducing the printed test metrics in a fresh workspace.

use crate::common;
use common::*;

/// Two noisy classes of 2-D points (LIBSVM, signed values): row i of `rows`.
fn points(rows: std::ops::Range<u32>) -> String {
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
    assert!(stderr(&out).contains("already exists"), "{}", stderr(&out));
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
