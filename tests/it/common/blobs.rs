//! K Gaussian blobs in K features as a LIBSVM multi-class dataset, ingested and factorised:
//! the toy data of the multi-class tests (tests/it/multiclass_task.rs, tests/mpi_ranks.rs); and
//! the ingest and svd set-up of any toy LIBSVM dataset (tests/it/decision_boundary.rs too).

use super::{pipeline, stderr};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};
use std::path::{Path, PathBuf};

/// The blobs: K classes in K features, class k (written k + 1) centred at 2·e_k with
/// N(0, σ²) noise per feature; rows cycle through the classes.
#[derive(Debug, Clone, Copy)]
pub struct Blobs {
    pub classes: usize,
    pub noise_sd: f64,
    pub train_rows: usize,
    pub test_rows: usize,
    pub seed: u64,
}

impl Blobs {
    /// `rows` rows as LIBSVM text at `path` (features to 3 decimals); returns the class ids
    /// (0-based, the ingest's label ids).
    fn write(&self, path: &Path, rows: usize, rng: &mut ChaCha8Rng) -> Vec<u32> {
        let noise = Normal::new(0.0, self.noise_sd).unwrap();
        let mut text = String::new();
        let mut ids = Vec::with_capacity(rows);
        for i in 0..rows {
            let class = i % self.classes;
            let feats: Vec<String> = (0..self.classes)
                .map(|j| {
                    let centre = if j == class { 2.0 } else { 0.0 };
                    let v: f64 = centre + noise.sample(rng);
                    format!("{}:{}", j + 1, (v * 1000.0).round() / 1000.0)
                })
                .collect();
            text.push_str(&format!("{} {}\n", class + 1, feats.join(" ")));
            ids.push(class as u32);
        }
        std::fs::write(path, text).unwrap();
        ids
    }

    /// Writes the splits under `dir/src`, ingests them as `blobs` into the workspace
    /// `dir/base` (100-row chunks, not normalised) and factorises it (rank R = K, M
    /// inducing inputs, 2 threads). Returns the workspace and the test rows' class ids.
    pub fn workspace(&self, dir: &Path, inducing: usize) -> (PathBuf, Vec<u32>) {
        let src = dir.join("src");
        std::fs::create_dir_all(&src).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        let (train, test) = (src.join("train.txt"), src.join("test.txt"));
        self.write(&train, self.train_rows, &mut rng);
        let test_classes = self.write(&test, self.test_rows, &mut rng);
        let ws = dir.join("base");
        ingest_and_factorise(&ws, "blobs", (&train, &test), self.classes, inducing);
        (ws, test_classes)
    }
}

/// Ingests the LIBSVM files `splits` (train, test) into workspace `ws` as dataset `name`
/// (100-row chunks, not normalised) and factorises it (rank R, M inducing inputs, 2
/// threads): the set-up of every toy classification test.
pub fn ingest_and_factorise(
    ws: &Path,
    name: &str,
    splits: (&Path, &Path),
    rank: usize,
    inducing: usize,
) {
    let (rank, m) = (rank.to_string(), inducing.to_string());
    for args in [
        &[
            "ingest",
            "--name",
            name,
            "--format",
            "libsvm",
            "--train",
            splits.0.to_str().unwrap(),
            "--test",
            splits.1.to_str().unwrap(),
            "--no-normalize",
            "--chunk-rows",
            "100",
        ][..],
        &[
            "svd",
            "--dataset",
            name,
            "--rank",
            &rank,
            "--inducing",
            &m,
            "--threads",
            "2",
        ],
    ] {
        let out = pipeline(ws, args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    }
}
