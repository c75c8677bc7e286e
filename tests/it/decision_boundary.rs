//! `pipeline report`'s decision-boundary chart of a binary run on 2-D inputs (Hensman,
//! Matthews & Ghahramani, *Scalable Variational Gaussian Process Classification*, Figure 1):
//! the grid's probabilities are predict's (a grid point on a training row's coordinates gets
//! exactly the probability `predict --probabilities` wrote for that row, with free inducing
//! inputs and with Z = A X̃), the chart files are written for D = 2, and a D = 3 run gets one
//! line saying why there is none.

use crate::common;
use common::blobs::ingest_and_factorise;
use common::classify::predict_probabilities;
use common::toy::train_with;
use common::*;
use fsgp::report::boundary::{probabilities_at, STEM};
use fsgp::store::catalog::Split;
use fsgp::store::chunks::read_registered_chunk;
use fsgp::store::workspace::Workspace;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::Path;

const TRAIN_ROWS: usize = 300;

/// LIBSVM rows with `d` features uniform in (−2, 2), rounded to 0.01 (some exactly 0, left
/// out as LIBSVM does), class +1 inside the disc x₁² + x₂² < 1.5, else −1; the first row
/// has x₁ = 0 whatever the draw.
fn write_libsvm(path: &Path, rows: usize, d: usize, rng: &mut ChaCha8Rng) {
    let mut text = String::new();
    for r in 0..rows {
        let x: Vec<f64> = (0..d)
            .map(|j| match (r, j) {
                (0, 0) => 0.0,
                _ => ((rng.random::<f64>() * 4.0 - 2.0) * 100.0).round() / 100.0,
            })
            .collect();
        let label = if x[0] * x[0] + x[1] * x[1] < 1.5 {
            "1"
        } else {
            "-1"
        };
        let feats: Vec<String> = x
            .iter()
            .enumerate()
            .filter(|(_, v)| **v != 0.0)
            .map(|(j, v)| format!("{}:{v}", j + 1))
            .collect();
        text.push_str(&format!("{label} {}\n", feats.join(" ")));
    }
    std::fs::write(path, text).unwrap();
}

/// A workspace with dataset `disc` of `d` features ingested unnormalised (100-row chunks)
/// and factorised (R = d, M = 8).
fn prepare(ws: &Path, d: usize) {
    let src = ws.parent().unwrap().join(format!("src-{d}"));
    std::fs::create_dir_all(&src).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(23);
    write_libsvm(&src.join("train.txt"), TRAIN_ROWS, d, &mut rng);
    write_libsvm(&src.join("test.txt"), 100, d, &mut rng);
    let (train, test) = (src.join("train.txt"), src.join("test.txt"));
    ingest_and_factorise(ws, "disc", (&train, &test), d, 8);
}

/// A binary SE run of 8 epochs (B = 50) with `extra` options; returns its id.
fn train(ws: &Path, extra: &[&str]) -> i64 {
    let mut args = vec![
        "train",
        "--dataset",
        "disc",
        "--task",
        "binary",
        "--latent",
        "independent",
        "--kernel",
        "se",
        "--inducing",
        "8",
        "--batch",
        "50",
        "--epochs",
        "8",
        "--lr",
        "0.05",
        "--threads",
        "2",
        "--seed",
        "3",
        "--no-final-elbo",
    ];
    args.extend(extra);
    train_with(ws, &args)
}

/// `predict --split train --probabilities`: p(y = 1) per row, in row order.
fn predicted_train(ws: &Path, run: i64) -> Vec<f32> {
    let (rows, _) = predict_probabilities(ws, run, &["--split", "train"], 1);
    let mut out = Vec::new();
    for r in rows {
        assert_eq!(r.row, out.len() as u64);
        out.push(r.probabilities[0]);
    }
    out
}

/// The training rows' coordinates as stored (f32, row-major, 2 per row).
fn training_points(ws: &Path) -> Vec<f32> {
    let w = Workspace::open(ws).unwrap();
    let d = w.catalog.dataset("disc").unwrap().unwrap();
    let mut points = Vec::new();
    for (file, _) in w.split_chunks(&d, Split::Train).unwrap() {
        let chunk = read_registered_chunk(&file).unwrap();
        for r in 0..chunk.len() {
            let mut x = [0.0f32; 2];
            chunk.densify_row(r, 2, |j, v| x[j] = v).unwrap();
            points.extend(x);
        }
    }
    points
}

/// The grid's probabilities at the training rows' exact coordinates are predict's, bit for
/// bit once rounded to predict's f32.
fn assert_grid_is_predict(ws: &Path, run: i64) {
    let written = predicted_train(ws, run);
    let points = training_points(ws);
    assert_eq!(written.len(), TRAIN_ROWS);
    assert_eq!(points.len(), 2 * TRAIN_ROWS);
    assert!(
        points.chunks(2).any(|x| x[0] == 0.0),
        "a row with x₁ = 0 is scored"
    );
    let w = Workspace::open(ws).unwrap();
    let at_points = probabilities_at(&w, run, None, &points).unwrap();
    for (r, (&p, &q)) in at_points.iter().zip(&written).enumerate() {
        assert_eq!(
            (p as f32).to_bits(),
            q.to_bits(),
            "row {r}: {p} vs predict's {q}"
        );
    }
    // Not a constant: the model separates the classes somewhat.
    let (lo, hi) = at_points
        .iter()
        .fold((1.0f64, 0.0f64), |(lo, hi), &p| (lo.min(p), hi.max(p)));
    assert!(lo < 0.4 && hi > 0.6, "probabilities in [{lo}, {hi}]");
}

fn report(ws: &Path, run: i64) -> (std::path::PathBuf, String) {
    pipeline_ok(ws, &["report", "--run", &run.to_string()]);
    let dir = ws.join(format!("reports/train-run{run}"));
    let md = std::fs::read_to_string(dir.join("README.md")).unwrap();
    (dir, md)
}

#[test]
fn a_2d_binary_run_has_a_decision_boundary_with_predicts_probabilities() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    prepare(&ws, 2);
    // Free inducing inputs (Z in input space), probit link, whitened q(u).
    let free = train(
        &ws,
        &[
            "--likelihood",
            "probit",
            "--inducing-inputs",
            "free",
            "--q-form",
            "whitened",
        ],
    );
    assert_grid_is_predict(&ws, free);
    // Z = A X̃ in the svd basis, logistic link (Gauss–Hermite predictive), the paper's q(u).
    let subspace = train(&ws, &[]);
    assert_grid_is_predict(&ws, subspace);
    for run in [free, subspace] {
        let (dir, md) = report(&ws, run);
        for ext in ["png", "svg"] {
            let bytes = std::fs::read(dir.join(format!("{STEM}.{ext}"))).unwrap();
            assert!(bytes.len() > 1000, "{STEM}.{ext}: {} bytes", bytes.len());
        }
        let png = std::fs::read(dir.join(format!("{STEM}.png"))).unwrap();
        assert_eq!(&png[1..4], b"PNG");
        assert!(md.contains("## Decision boundary"), "{md}");
        assert!(
            md.contains(&format!("![decision boundary]({STEM}.png)")),
            "{md}"
        );
        assert!(md.contains("M = 8 inducing inputs"), "{md}");
    }
}

#[test]
fn a_binary_run_on_3d_inputs_says_why_it_has_no_decision_boundary() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    prepare(&ws, 3);
    let run = train(&ws, &["--likelihood", "probit"]);
    let (dir, md) = report(&ws, run);
    assert!(!dir.join(format!("{STEM}.png")).exists());
    assert!(!dir.join(format!("{STEM}.svg")).exists());
    assert!(
        md.contains("Not drawn: the inputs have D = 3 features; the decision boundary is drawn for D = 2 only."),
        "{md}"
    );
}
