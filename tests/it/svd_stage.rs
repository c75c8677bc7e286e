//! `pipeline svd` on real data: K_XX̃ against an independent recomputation, caching,
//! a killed run leaving nothing registered.

use crate::common;
use common::*;
use fsgp::store::chunks::read_chunk;
use ndarray::{Array1, Array2};
use std::path::{Path, PathBuf};

/// (kind → absolute path) of the artifacts of the newest svd run.
fn svd_artifacts(ws: &Path) -> Vec<(String, PathBuf)> {
    let conn = rusqlite::Connection::open(ws.join("catalog.sqlite")).unwrap();
    let mut stmt = conn
        .prepare("SELECT kind, path FROM artifacts WHERE stage_run_id = (SELECT max(id) FROM stage_runs WHERE stage = 'svd' AND status = 'ok')")
        .unwrap();
    stmt.query_map([], |r| {
        Ok((r.get::<_, String>(0)?, ws.join(r.get::<_, String>(1)?)))
    })
    .unwrap()
    .map(|r| r.unwrap())
    .collect()
}

fn path_of(arts: &[(String, PathBuf)], kind: &str) -> PathBuf {
    arts.iter()
        .find(|a| a.0 == kind)
        .unwrap_or_else(|| panic!("no {kind} artifact"))
        .1
        .clone()
}

#[test]
fn delicious_kxx_equals_x_times_basis() {
    let ws = tempfile::tempdir().unwrap();
    ingest_delicious(ws.path(), &[]);
    let out = pipeline(
        ws.path(),
        &[
            "svd",
            "--dataset",
            "delicious",
            "--rank",
            "250",
            "--inducing",
            "100",
            "--kmeans-iters",
            "3",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let arts = svd_artifacts(ws.path());
    let basis: Array2<f32> = ndarray_npy::read_npy(path_of(&arts, "basis")).unwrap();
    let kxx: Array2<f32> = ndarray_npy::read_npy(path_of(&arts, "kxx")).unwrap();
    let sv: Array1<f64> = ndarray_npy::read_npy(path_of(&arts, "singular_values")).unwrap();
    let norms: Array1<f32> = ndarray_npy::read_npy(path_of(&arts, "sq_norms")).unwrap();
    let a_init: Array2<f32> = ndarray_npy::read_npy(path_of(&arts, "a_init")).unwrap();
    assert_eq!(basis.dim(), (250, 500));
    assert_eq!(kxx.dim(), (12920, 250));
    assert_eq!(a_init.dim(), (100, 250));
    assert!(sv.windows(2).into_iter().all(|w| w[0] >= w[1]));
    // Independent recomputation: dense X (from the chunks) times basisᵀ, in f64.
    let chunk_dir = ws.path().join(
        status_json(ws.path())["datasets"][0]["splits"][0]["path"]
            .as_str()
            .unwrap(),
    );
    let mut files: Vec<PathBuf> = std::fs::read_dir(chunk_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let mut i = 0;
    let mut worst = 0.0f64;
    for f in files {
        let chunk = read_chunk(&f).unwrap();
        for row in chunk.rows() {
            assert_eq!(norms[i].to_bits(), row.sq_norm.to_bits());
            for r in 0..250 {
                let e: f64 = row
                    .indices
                    .iter()
                    .zip(row.values)
                    .map(|(&j, &v)| f64::from(v) * f64::from(basis[[r, j as usize]]))
                    .sum();
                let g = f64::from(kxx[[i, r]]);
                // Relative to the row's norm (entries themselves may be ~0).
                worst = worst.max((g - e).abs() / f64::from(row.sq_norm).sqrt().max(1e-30));
            }
            i += 1;
        }
    }
    assert_eq!(i, 12920);
    assert!(worst <= 1e-5, "max relative deviation {worst}");
    // Σ_i ‖K_XX̃ row‖² = Σ σ_r² (U_R S_R has column norms σ_r).
    let total: f64 = kxx.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    let expect: f64 = sv.iter().map(|s| s * s).sum();
    assert!(
        (total - expect).abs() / expect < 1e-4,
        "{total} vs {expect}"
    );

    // Projection of another split (what predict uses), against the same independent product.
    let test_split = status_json(ws.path())["datasets"][0]["splits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["split"] == "test")
        .unwrap()
        .clone();
    let test_dir = ws.path().join(test_split["path"].as_str().unwrap());
    let mut test_files: Vec<PathBuf> = std::fs::read_dir(test_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    test_files.sort();
    let proj_path = ws.path().join("projected-test.npy");
    fsgp::projection::project_split(&test_files, 3185, basis.view(), &proj_path).unwrap();
    let proj: Array2<f32> = ndarray_npy::read_npy(&proj_path).unwrap();
    assert_eq!(proj.dim(), (3185, 250));
    let mut i = 0;
    for f in &test_files {
        for row in read_chunk(f).unwrap().rows() {
            for r in (0..250).step_by(7) {
                let e: f64 = row
                    .indices
                    .iter()
                    .zip(row.values)
                    .map(|(&j, &v)| f64::from(v) * f64::from(basis[[r, j as usize]]))
                    .sum();
                assert!(
                    (f64::from(proj[[i, r]]) - e).abs()
                        <= 1e-5 * f64::from(row.sq_norm).sqrt().max(1e-30)
                );
            }
            i += 1;
        }
    }
    assert_eq!(i, 3185);
    std::fs::remove_file(&proj_path).unwrap();

    // Same parameters again: nothing to do. Another rank: a new artifact set.
    let again = pipeline(
        ws.path(),
        &[
            "svd",
            "--dataset",
            "delicious",
            "--rank",
            "250",
            "--inducing",
            "100",
            "--kmeans-iters",
            "3",
        ],
    );
    assert!(again.status.success());
    assert!(
        stderr(&again).contains("nothing to do"),
        "{}",
        stderr(&again)
    );
    let other = pipeline(
        ws.path(),
        &[
            "svd",
            "--dataset",
            "delicious",
            "--rank",
            "50",
            "--inducing",
            "100",
            "--kmeans-iters",
            "3",
        ],
    );
    assert!(other.status.success(), "{}", stderr(&other));
    let dirs = listing(ws.path())
        .into_iter()
        .filter(|p| p.starts_with("svd/") && p.matches('/').count() == 1)
        .count();
    assert_eq!(dirs, 2);
}

#[test]
fn killed_svd_registers_nothing_and_a_rerun_completes() {
    let ws = tempfile::tempdir().unwrap();
    ingest_delicious(ws.path(), &[]);
    let args = [
        "svd",
        "--dataset",
        "delicious",
        "--rank",
        "400",
        "--oversample",
        "60",
        "--power-iters",
        "4",
        "--inducing",
        "50",
    ];
    let mut child = std::process::Command::new(pipeline_bin())
        .arg("--workspace")
        .arg(ws.path())
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Kill once the run's scratch directory exists (the run is registered as running).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut killed_midway = false;
    while std::time::Instant::now() < deadline {
        if listing(ws.path())
            .iter()
            .any(|p| p.starts_with("tmp/run-") && p.ends_with("/svd"))
        {
            std::thread::sleep(std::time::Duration::from_millis(150));
            killed_midway = child.try_wait().unwrap().is_none();
            child.kill().unwrap();
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    child.wait().unwrap();
    assert!(killed_midway, "svd finished before the kill");
    let st = status_json(ws.path());
    assert_eq!(st["runs"][0]["stage"], "svd");
    assert_eq!(st["runs"][0]["status"], "interrupted");
    assert!(svd_artifacts(ws.path()).is_empty());
    // `status` only reads; the next command that writes collects the dead run's files.
    create_workspace(ws.path());
    assert!(
        listing(ws.path())
            .iter()
            .all(|p| !p.starts_with("tmp/run-") && !p.starts_with("svd/")),
        "{:?}",
        listing(ws.path())
    );
    let out = pipeline(ws.path(), &args);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(svd_artifacts(ws.path()).len(), 5);
}
