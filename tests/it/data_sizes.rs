//! Sizes from the data (issue 31): `pipeline svd` without `--rank` or `--inducing` takes
//! R = min(250, N, D) and M = min(500, N), and `pipeline train` without `--factors` takes
//! P = min(30, L); the values are printed with where they came from and recorded with the
//! runs, so `status` shows them, and a run whose sizes came from the data is the run given
//! them. A two-feature dataset gets its k-means start for free inducing inputs without a
//! rank: at R = D that start is k-means of the rows in input space. Values given above
//! what the data holds are refused (R, M) or kept with a note (P, sampled negatives).

use crate::common;

use std::path::Path;

use common::toy::{catalog, newest_run};
use common::*;
use fsgp::store::chunks::read_chunk;
use fsgp::svd::kmeans::{kmeans, InitMethod, KMeansConfig};
use ndarray::Array2;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};

/// Two Gaussian blobs in two features as LIBSVM text: class ±1 centred at (±1.5, 0), unit
/// noise 0.6, rows alternating between the classes.
fn two_blobs(path: &Path, rows: usize, rng: &mut ChaCha8Rng) {
    let noise = Normal::new(0.0, 0.6).unwrap();
    let mut text = String::new();
    for i in 0..rows {
        let sign = if i % 2 == 0 { 1.0 } else { -1.0 };
        let x: f64 = 1.5 * sign + noise.sample(rng);
        let y: f64 = noise.sample(rng);
        text.push_str(&format!("{} 1:{x:.4} 2:{y:.4}\n", sign as i32));
    }
    std::fs::write(path, text).unwrap();
}

/// The parameters the catalog recorded for run `run`.
fn params(ws: &Path, run: i64) -> serde_json::Value {
    let text: String = catalog(ws)
        .query_row("SELECT params FROM stage_runs WHERE id = ?1", [run], |r| {
            r.get(0)
        })
        .unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The file of `kind` (`basis`, `a_init`) of svd run `run`.
fn artifact(ws: &Path, run: i64, kind: &str) -> Array2<f32> {
    let rel: String = catalog(ws)
        .query_row(
            "SELECT path FROM artifacts WHERE stage_run_id = ?1 AND kind = ?2",
            rusqlite::params![run, kind],
            |r| r.get(0),
        )
        .unwrap();
    ndarray_npy::read_npy(ws.join(rel)).unwrap()
}

/// Every training row of dataset `name` (ingested as run 1) densified [N×D] in f32.
fn training_rows(ws: &Path, name: &str, d: usize) -> Array2<f32> {
    let dir = ws.join(format!("datasets/{name}.run1/train"));
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let mut values = Vec::new();
    for f in files {
        let chunk = read_chunk(&f).unwrap();
        for i in 0..chunk.len() {
            let mut dense = vec![0f32; d];
            chunk.densify_row(i, d, |j, v| dense[j] = v).unwrap();
            values.extend(dense);
        }
    }
    Array2::from_shape_vec((values.len() / d, d), values).unwrap()
}

/// Runs `args`, which must succeed; returns stderr.
fn ok_stderr(ws: &Path, args: &[&str]) -> String {
    let out = pipeline(ws, args);
    let err = stderr(&out);
    assert!(out.status.success(), "{args:?}: {err}");
    err
}

#[test]
fn two_features_train_free_inducing_inputs_without_a_rank() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let src = dir.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let (train, test) = (src.join("train.txt"), src.join("test.txt"));
    two_blobs(&train, 150, &mut rng);
    two_blobs(&test, 200, &mut rng);
    ok_stderr(
        &ws,
        &[
            "ingest",
            "--name",
            "two",
            "--format",
            "libsvm",
            "--train",
            train.to_str().unwrap(),
            "--test",
            test.to_str().unwrap(),
            "--features",
            "2",
            "--no-normalize",
        ],
    );

    // No --rank, no --inducing: R = min(250, N, D) = D, M = min(500, N) = N.
    let err = ok_stderr(&ws, &["svd", "--dataset", "two"]);
    assert!(
        err.contains(
            "svd of 'two': R = 2 (--rank left out: min(250, N = 150, D = 2); R = D: a full \
             orthonormal basis of the input space), M = 150 (--inducing left out: min(500, \
             N = 150))"
        ),
        "{err}"
    );
    let svd = newest_run(&ws, "svd");
    assert_eq!(
        (&params(&ws, svd)["rank"], &params(&ws, svd)["inducing"]),
        (&2.into(), &150.into())
    );
    assert_eq!(artifact(&ws, svd, "a_init").dim(), (150, 2));
    // The same sizes given are the same run.
    let err = ok_stderr(
        &ws,
        &[
            "svd",
            "--dataset",
            "two",
            "--rank",
            "2",
            "--inducing",
            "150",
        ],
    );
    assert!(err.contains(&format!("already done (run {svd})")), "{err}");
    // Given above what the data holds: refused, naming the bound and the default.
    for (flag, value, message) in [
        (
            "--rank",
            "3",
            "--rank 3 exceeds min(N, D) = min(150, 2) of the training split of 'two'",
        ),
        (
            "--inducing",
            "151",
            "--inducing 151: the M inducing inputs are k-means centroids of 150 rows",
        ),
    ] {
        let out = pipeline(&ws, &["svd", "--dataset", "two", flag, value]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains(message), "{err}");
        assert!(err.contains(&format!("or leave {flag} out")), "{err}");
    }
    assert_eq!(newest_run(&ws, "svd"), svd, "a refused svd records nothing");

    // M = 8 centroids, still no rank: at R = D the k-means start mapped to input space,
    // Z₀ = A₀X̃, is k-means of the rows themselves (the basis only rotates them).
    ok_stderr(&ws, &["svd", "--dataset", "two", "--inducing", "8"]);
    let svd8 = newest_run(&ws, "svd");
    let z0 = artifact(&ws, svd8, "a_init").dot(&artifact(&ws, svd8, "basis"));
    let direct = kmeans(
        training_rows(&ws, "two", 2).view(),
        &KMeansConfig {
            k: 8,
            iters: 10,
            seed: 0,
            init: InitMethod::KmeansPlusPlus,
            max_rows: Some(200_000),
            ..KMeansConfig::default()
        },
    )
    .unwrap();
    let gap = (&z0 - &direct.centroids)
        .iter()
        .fold(0f32, |m, v| m.max(v.abs()));
    assert!(
        gap < 1e-4,
        "Z₀ = A₀X̃ {z0} vs k-means in input space {} ({gap})",
        direct.centroids
    );

    // Free inducing inputs on that start; P from L = 1.
    let err = ok_stderr(
        &ws,
        &[
            "train",
            "--dataset",
            "two",
            "--task",
            "binary",
            "--kernel",
            "se",
            "--likelihood",
            "probit",
            "--q-form",
            "whitened",
            "--inducing-inputs",
            "free",
            "--batch",
            "150",
            "--epochs",
            "60",
            "--lr",
            "0.05",
            "--threads",
            "1",
        ],
    );
    assert!(
        err.contains(&format!(
            "train on 'two': M = 8 (--inducing left out: the k-means centroids of svd run \
             {svd8}), P = 1 (--factors left out: min(30, L = 1)), R = D = 2 (inducing inputs in \
             input space; their start from svd run {svd8}, R = 2)"
        )),
        "{err}"
    );
    let run = newest_run(&ws, "train");
    let summary = train_summary(&ws, run);
    assert_eq!(
        (&summary["inducing"], &summary["factors"], &summary["rank"]),
        (&8.into(), &1.into(), &2.into())
    );
    let out = pipeline(&ws, &["evaluate", "--run", &run.to_string(), "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let accuracy = json["accuracy"].as_f64().expect("a binary evaluation");
    // The blobs are 2.5 noise deviations from the boundary: the Bayes rate is 99.4 %.
    assert!(accuracy > 0.95, "test accuracy {accuracy}: {json}");
}

#[test]
fn defaults_hold_m_to_n_r_to_d_and_p_to_l() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let src = dir.path().join("src");
    let s = src.to_str().unwrap();
    // N = 120 < 500, D = 30 < 250, L = 6 < 30.
    ok_stderr(
        &ws,
        &[
            "synth",
            "--out",
            s,
            "--rows",
            "120",
            "--test-rows",
            "30",
            "--features",
            "30",
            "--labels",
            "6",
            "--seed",
            "4",
        ],
    );
    ok_stderr(
        &ws,
        &[
            "ingest",
            "--name",
            "small",
            "--train",
            &format!("{s}/train.txt"),
            "--test",
            &format!("{s}/test.txt"),
        ],
    );
    let err = ok_stderr(&ws, &["svd", "--dataset", "small"]);
    assert!(
        err.contains("R = 30 (--rank left out: min(250, N = 120, D = 30); R = D"),
        "{err}"
    );
    assert!(
        err.contains("M = 120 (--inducing left out: min(500, N = 120))"),
        "{err}"
    );
    let svd = newest_run(&ws, "svd");
    let train = |extra: &[&str]| -> (i64, String) {
        let mut args = vec![
            "train",
            "--dataset",
            "small",
            "--batch",
            "40",
            "--epochs",
            "1",
            "--max-steps",
            "2",
            "--threads",
            "1",
            "--no-final-elbo",
        ];
        args.extend(extra);
        let err = ok_stderr(&ws, &args);
        (newest_run(&ws, "train"), err)
    };

    let (run, err) = train(&[]);
    assert!(
        err.contains(&format!(
            "train on 'small': M = 120 (--inducing left out: the k-means centroids of svd run \
             {svd}), P = 6 (--factors left out: min(30, L = 6)), R = 30 (svd run {svd})"
        )),
        "{err}"
    );
    assert_eq!(
        (&params(&ws, run)["inducing"], &params(&ws, run)["factors"]),
        (&120.into(), &6.into())
    );
    let summary = train_summary(&ws, run);
    assert_eq!(
        (&summary["inducing"], &summary["factors"], &summary["rank"]),
        (&120.into(), &6.into(), &30.into())
    );
    // P given as L is the same run.
    let (again, err) = train(&["--factors", "6"]);
    assert_eq!(again, run);
    assert!(err.contains("already done"), "{err}");

    // P above L is the user's: kept, with a note; sampled negatives ≥ L likewise.
    let (run, err) = train(&["--factors", "8", "--negatives", "6"]);
    assert!(
        err.contains("P = 8 (--factors, above L = 6: the prior of f = Φg + b is whole at P = L"),
        "{err}"
    );
    assert!(
        err.contains("--negatives 6 ≥ L = 6 takes every negative label of every row"),
        "{err}"
    );
    assert_eq!(params(&ws, run)["factors"], 8);
    let (run, err) = train(&["--latent", "independent"]);
    assert!(
        err.contains("P = 6 (--latent independent: P = K = 6)"),
        "{err}"
    );
    assert_eq!(params(&ws, run)["factors"], 6);
    // M given above a_init.npy's rows is refused as before.
    let out = pipeline(
        &ws,
        &[
            "train",
            "--dataset",
            "small",
            "--inducing",
            "121",
            "--epochs",
            "1",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("so M can be at most N = 120; give --inducing ≤ 120"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn fewer_rows_than_features_give_a_basis_of_rank_n() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let src = dir.path().join("src");
    let s = src.to_str().unwrap();
    ok_stderr(
        &ws,
        &[
            "synth",
            "--out",
            s,
            "--rows",
            "40",
            "--test-rows",
            "10",
            "--features",
            "100",
            "--labels",
            "6",
            "--seed",
            "2",
        ],
    );
    ok_stderr(
        &ws,
        &[
            "ingest",
            "--name",
            "wide",
            "--train",
            &format!("{s}/train.txt"),
            "--test",
            &format!("{s}/test.txt"),
        ],
    );
    // k = R + p = 60 sketch columns on a matrix of rank ≤ 40: the rank-deficient path.
    let err = ok_stderr(&ws, &["svd", "--dataset", "wide"]);
    assert!(
        err.contains("R = 40 (--rank left out: min(250, N = 40, D = 100)), M = 40"),
        "{err}"
    );
    let svd = newest_run(&ws, "svd");
    let basis = artifact(&ws, svd, "basis");
    assert_eq!(basis.dim(), (40, 100));
    // Its rows are orthonormal.
    let gram = basis.dot(&basis.t());
    for ((i, j), v) in gram.indexed_iter() {
        let expected = if i == j { 1.0 } else { 0.0 };
        assert!((v - expected).abs() < 1e-4, "X̃X̃ᵀ[{i},{j}] = {v}");
    }
    let err = ok_stderr(
        &ws,
        &[
            "train",
            "--dataset",
            "wide",
            "--batch",
            "20",
            "--epochs",
            "2",
            "--threads",
            "1",
        ],
    );
    assert!(err.contains("M = 40 ("), "{err}");
    assert!(err.contains("P = 6 (--factors left out"), "{err}");
}

/// A spec without an `[svd]` table: the svd's sizes come from the data, and a free run on
/// two features needs nothing about a rank.
#[test]
fn a_spec_needs_no_svd_table() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    two_blobs(&dir.path().join("train.txt"), 100, &mut rng);
    two_blobs(&dir.path().join("test.txt"), 100, &mut rng);
    let spec = write(
        dir.path(),
        "two.toml",
        r#"
[ingest]
name = "two"
format = "libsvm"
train = "train.txt"
test = "test.txt"
features = 2
no_normalize = true

[train]
task = "binary"
kernel = "se"
inducing = 10
inducing_inputs = "free"
batch = 100
epochs = 30
lr = 0.05
threads = 1

[predict]
top_k = 1
probabilities = true
"#,
    );
    let ws = dir.path().join("ws");
    let err = ok_stderr(&ws, &["run", spec.to_str().unwrap()]);
    assert!(
        err.contains("svd of 'two': R = 2 (--rank left out: min(250, N = 100, D = 2)"),
        "{err}"
    );
    let svd = newest_run(&ws, "svd");
    assert_eq!(params(&ws, svd)["rank"], 2);
    assert_eq!(params(&ws, svd)["inducing"], 100);
    let run = newest_run(&ws, "train");
    assert_eq!(params(&ws, run)["inducing"], 10);
    assert_eq!(params(&ws, run)["factors"], 1);
}
