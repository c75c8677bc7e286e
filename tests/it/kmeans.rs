//! k-means initialisation of the subspace inducing inputs (src/svd/kmeans.rs).

use crate::common;

use common::ranks::ThreadRanks;
use fsgp::svd::kmeans::*;
use ndarray::{Array2, ArrayView2};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};

fn cfg(k: usize, seed: u64) -> KMeansConfig {
    KMeansConfig {
        k,
        seed,
        ..KMeansConfig::default()
    }
}

fn in_pool<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(f)
}

/// `blobs` Gaussian blobs (σ = 0.1) around means uniform in [-10, 10]^r, `per` rows each,
/// rows in random order. Returns (data, true label per row, true means).
fn planted(
    blobs: usize,
    per: usize,
    r: usize,
    seed: u64,
) -> (Array2<f32>, Vec<usize>, Array2<f64>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let means = Array2::from_shape_fn((blobs, r), |_| rng.random_range(-10.0..10.0));
    let noise = Normal::new(0.0, 0.1).unwrap();
    let mut labels: Vec<usize> = (0..blobs)
        .flat_map(|b| std::iter::repeat_n(b, per))
        .collect();
    labels.shuffle(&mut rng);
    let data = Array2::from_shape_fn((labels.len(), r), |(i, j)| {
        (means[(labels[i], j)] + noise.sample(&mut rng)) as f32
    });
    (data, labels, means)
}

fn uniform(n: usize, r: usize, seed: u64) -> Array2<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    Array2::from_shape_fn((n, r), |_| rng.random::<f32>())
}

/// Index of the nearest centroid of each row (ties to the lower index).
fn assign(data: ArrayView2<'_, f32>, c: &Array2<f32>) -> Vec<usize> {
    data.rows()
        .into_iter()
        .map(|x| {
            let d = |j: usize| -> f64 {
                x.iter()
                    .zip(c.row(j))
                    .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
                    .sum()
            };
            (0..c.nrows())
                .min_by(|&a, &b| d(a).total_cmp(&d(b)))
                .unwrap()
        })
        .collect()
}

fn assert_non_increasing(obj: &[f64]) {
    for w in obj.windows(2) {
        assert!(w[1] <= w[0] * (1.0 + 1e-9), "objective increased: {obj:?}");
    }
}

fn assert_finite(res: &KMeansResult) {
    assert!(res.centroids.iter().all(|v| v.is_finite()));
    assert!(res.objective.iter().all(|v| v.is_finite()));
}

#[test]
fn recovers_planted_clusters() {
    let (blobs, per, r) = (8, 250, 16);
    for seed in 0..5 {
        let (data, labels, means) = planted(blobs, per, r, 100 + seed);
        let res = kmeans(data.view(), &cfg(blobs, seed)).unwrap();
        assert_eq!(res.centroids.dim(), (blobs, r));
        assert_eq!(res.counts, vec![per as u64; blobs], "seed {seed}");
        assert_eq!(res.objective.len(), res.iterations + 1);
        assert_non_increasing(&res.objective);
        // Every blob maps to exactly one cluster and every cluster to one blob.
        let got = assign(data.view(), &res.centroids);
        let mut blob_of = vec![None; blobs];
        for (&truth, &c) in labels.iter().zip(&got) {
            match blob_of[c] {
                None => blob_of[c] = Some(truth),
                Some(b) => assert_eq!(b, truth, "seed {seed}: cluster {c} mixes blobs"),
            }
        }
        let mut seen: Vec<usize> = blob_of.iter().map(|b| b.unwrap()).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..blobs).collect::<Vec<_>>());
        // Centroids at the true means up to the noise of a mean of 250 rows (σ·√(r/250) ≈ 0.025).
        for (c, b) in blob_of.iter().enumerate() {
            let d: f64 = res
                .centroids
                .row(c)
                .iter()
                .zip(means.row(b.unwrap()))
                .map(|(&a, &m)| (f64::from(a) - m).powi(2))
                .sum::<f64>()
                .sqrt();
            assert!(
                d < 0.1,
                "seed {seed}: centroid {c} is {d} from its blob mean"
            );
        }
    }
}

#[test]
fn objective_never_increases() {
    let data = uniform(3000, 10, 7);
    for init in [InitMethod::KmeansPlusPlus, InitMethod::RandomRows] {
        let res = kmeans(
            data.view(),
            &KMeansConfig {
                k: 20,
                iters: 50,
                tol: 0.0,
                init,
                block_rows: 256,
                ..cfg(20, 3)
            },
        )
        .unwrap();
        assert!(
            res.iterations >= 5,
            "{init:?}: {} iterations",
            res.iterations
        );
        assert_eq!(res.objective.len(), res.iterations + 1);
        assert_non_increasing(&res.objective);
        assert!(res.objective.last().unwrap() < &res.objective[0]);
        assert_eq!(res.counts.iter().sum::<u64>(), 3000);
        // The last objective is that of the returned centroids.
        let got = assign(data.view(), &res.centroids);
        let obj: f64 = data
            .rows()
            .into_iter()
            .zip(&got)
            .map(|(x, &c)| {
                x.iter()
                    .zip(res.centroids.row(c))
                    .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
                    .sum::<f64>()
            })
            .sum();
        let last = *res.objective.last().unwrap();
        assert!((obj - last).abs() <= 1e-9 * last, "{obj} vs {last}");
    }
}

#[test]
fn stops_on_tolerance() {
    let data = uniform(2000, 8, 1);
    let res = kmeans(
        data.view(),
        &KMeansConfig {
            tol: 0.5,
            ..cfg(10, 0)
        },
    )
    .unwrap();
    assert_eq!(res.iterations, 1, "{:?}", res.objective);
    let res = kmeans(
        data.view(),
        &KMeansConfig {
            iters: 0,
            ..cfg(10, 0)
        },
    )
    .unwrap();
    assert_eq!((res.iterations, res.objective.len()), (0, 1));
}

#[test]
fn deterministic_across_seeds_and_threads() {
    let data = uniform(5000, 12, 11);
    let c = KMeansConfig {
        block_rows: 300,
        ..cfg(25, 42)
    };
    let a = in_pool(1, || kmeans(data.view(), &c).unwrap());
    let b = in_pool(1, || kmeans(data.view(), &c).unwrap());
    let two = in_pool(2, || kmeans(data.view(), &c).unwrap());
    let four = in_pool(4, || kmeans(data.view(), &c).unwrap());
    for other in [&b, &two, &four] {
        assert_eq!(a.centroids, other.centroids);
        assert_eq!(a.counts, other.counts);
        assert_eq!(a.iterations, other.iterations);
        let bits = |o: &[f64]| o.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a.objective), bits(&other.objective));
    }
    let d = kmeans(
        data.view(),
        &KMeansConfig {
            seed: 43,
            ..c.clone()
        },
    )
    .unwrap();
    assert_ne!(a.centroids, d.centroids);
}

#[test]
fn more_clusters_than_distinct_rows() {
    let distinct = uniform(5, 6, 5);
    let data = Array2::from_shape_fn((60, 6), |(i, j)| distinct[(i % 5, j)]);
    for init in [InitMethod::KmeansPlusPlus, InitMethod::RandomRows] {
        let res = kmeans(data.view(), &KMeansConfig { init, ..cfg(12, 9) }).unwrap();
        assert_finite(&res);
        assert_eq!(res.centroids.nrows(), 12);
        assert_eq!(*res.objective.last().unwrap(), 0.0, "{init:?}");
        assert_eq!(res.counts.iter().sum::<u64>(), 60);
        // k-means++ picks every distinct row before any duplicate.
        if init == InitMethod::KmeansPlusPlus {
            for x in distinct.rows() {
                assert!(res.centroids.rows().into_iter().any(|c| c == x));
            }
        }
    }
    // Fewer rows than clusters, and a single row.
    for n in [1, 3] {
        let small = uniform(n, 4, 2);
        for init in [InitMethod::KmeansPlusPlus, InitMethod::RandomRows] {
            let res = kmeans(small.view(), &KMeansConfig { init, ..cfg(7, 1) }).unwrap();
            assert_finite(&res);
            assert_eq!(res.centroids.nrows(), 7);
            assert_eq!(res.objective, vec![0.0]);
        }
    }
}

/// 400 rows of which 300 are the same row: random-rows seeding then picks duplicate
/// centroids, whose clusters are empty after the first assignment.
fn mostly_one_row() -> Array2<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    Array2::from_shape_fn((400, 3), |(i, j)| {
        if i < 300 {
            1.0
        } else {
            (j as f32) + rng.random::<f32>() * 5.0
        }
    })
}

#[test]
fn empty_clusters_are_reseeded() {
    // Random-rows seeding on data with heavy duplication makes duplicate centroids, whose
    // clusters are empty after the first assignment; the run stays finite and monotone.
    let data = mostly_one_row();
    let res = kmeans(
        data.view(),
        &KMeansConfig {
            init: InitMethod::RandomRows,
            iters: 30,
            tol: 0.0,
            ..cfg(16, 2)
        },
    )
    .unwrap();
    assert_finite(&res);
    assert_non_increasing(&res.objective);
    assert_eq!(res.counts.iter().sum::<u64>(), 400);
    assert!(
        res.counts.iter().filter(|&&c| c == 0).count() <= 1,
        "{:?}",
        res.counts
    );
}

#[test]
fn max_rows_subsample() {
    let (data, _, _) = planted(4, 2500, 8, 3);
    let c = KMeansConfig {
        max_rows: Some(1000),
        block_rows: 128,
        ..cfg(4, 5)
    };
    let a = in_pool(1, || kmeans(data.view(), &c).unwrap());
    let b = in_pool(2, || kmeans(data.view(), &c).unwrap());
    assert_eq!(a.centroids, b.centroids);
    assert_eq!(a.objective, b.objective);
    assert_eq!(a.counts.iter().sum::<u64>(), 1000);
    // Still recovers the four blobs.
    let mut counts = a.counts.clone();
    counts.sort_unstable();
    assert!(counts[0] > 150, "{counts:?}");
    let other = kmeans(
        data.view(),
        &KMeansConfig {
            seed: 6,
            ..c.clone()
        },
    )
    .unwrap();
    assert_ne!(a.objective, other.objective);
    // max_rows ≥ N uses every row, exactly as None does.
    let all = kmeans(
        data.view(),
        &KMeansConfig {
            max_rows: Some(10_000),
            ..c.clone()
        },
    )
    .unwrap();
    let none = kmeans(
        data.view(),
        &KMeansConfig {
            max_rows: None,
            ..c.clone()
        },
    )
    .unwrap();
    assert_eq!(all.centroids, none.centroids);
    assert_eq!(all.counts.iter().sum::<u64>(), 10_000);
}

#[test]
fn random_rows_init() {
    let (data, _, _) = planted(3, 200, 5, 8);
    let c = KMeansConfig {
        init: InitMethod::RandomRows,
        iters: 0,
        ..cfg(6, 1)
    };
    let res = kmeans(data.view(), &c).unwrap();
    // With no iterations the centroids are the seeds: six distinct data rows.
    for (i, x) in res.centroids.rows().into_iter().enumerate() {
        assert!(data.rows().into_iter().any(|row| row == x));
        for y in res.centroids.rows().into_iter().skip(i + 1) {
            assert_ne!(x, y);
        }
    }
    let full = kmeans(data.view(), &KMeansConfig { iters: 10, ..c }).unwrap();
    assert_non_increasing(&full.objective);
    assert!(full.objective.last().unwrap() < &full.objective[0]);
}

#[test]
fn strided_views() {
    // Column-major (Fortran) data and a transposed view give the same result as C order.
    let data = uniform(700, 9, 21);
    let c = KMeansConfig {
        block_rows: 100,
        ..cfg(7, 3)
    };
    let base = kmeans(data.view(), &c).unwrap();
    let fortran = data.t().as_standard_layout().to_owned().reversed_axes();
    assert!(!fortran.is_standard_layout());
    let res = kmeans(fortran.view(), &c).unwrap();
    assert_eq!(base.centroids, res.centroids);
    assert_eq!(base.objective, res.objective);
}

#[test]
fn errors() {
    let data = uniform(10, 3, 0);
    let msg = |r: anyhow::Result<KMeansResult>| format!("{:#}", r.unwrap_err());
    assert!(msg(kmeans(data.view(), &KMeansConfig::default())).contains("k must be at least 1"));
    assert!(msg(kmeans(Array2::<f32>::zeros((0, 3)).view(), &cfg(2, 0))).contains("no rows"));
    assert!(msg(kmeans(Array2::<f32>::zeros((5, 0)).view(), &cfg(2, 0))).contains("no columns"));
    assert!(msg(kmeans(
        data.view(),
        &KMeansConfig {
            block_rows: 0,
            ..cfg(2, 0)
        }
    ))
    .contains("block_rows"));
    assert!(msg(kmeans(
        data.view(),
        &KMeansConfig {
            max_rows: Some(0),
            ..cfg(2, 0)
        }
    ))
    .contains("max_rows"));
    for (bad, init) in [
        (f32::NAN, InitMethod::KmeansPlusPlus),
        (f32::INFINITY, InitMethod::RandomRows),
    ] {
        let mut d = data.clone();
        d[(6, 1)] = bad;
        let m = msg(kmeans(d.view(), &KMeansConfig { init, ..cfg(2, 0) }));
        assert!(m.contains("non-finite") && m.contains("row 6"), "{m}");
    }
    // A non-finite value outside the seeding sample is found by the first assignment pass.
    let mut d = uniform(30_000, 2, 1);
    d[(29_999, 0)] = f32::NAN;
    let m = msg(kmeans(
        d.view(),
        &KMeansConfig {
            k: 1,
            ..KMeansConfig::default()
        },
    ));
    assert!(m.contains("non-finite") && m.contains("row 29999"), "{m}");
}

#[test]
fn memory_mapped_npy() {
    use ndarray_npy::ViewNpyExt;
    let (data, _, _) = planted(5, 400, 12, 17);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kxx.npy");
    ndarray_npy::write_npy(&path, &data).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    // SAFETY: the file is private to this test and not modified while mapped.
    let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
    let view = ArrayView2::<f32>::view_npy(&map).unwrap();
    let c = KMeansConfig {
        max_rows: Some(1500),
        block_rows: 200,
        ..cfg(5, 8)
    };
    let mapped = kmeans(view, &c).unwrap();
    let in_memory = kmeans(data.view(), &c).unwrap();
    assert_eq!(mapped.centroids, in_memory.centroids);
    assert_eq!(mapped.objective, in_memory.objective);
    assert_eq!(mapped.counts.iter().sum::<u64>(), 1500);
    assert_non_increasing(&mapped.objective);
}

/// Timing of the stage's default shape (N = 12920, R = 250, k = 500): run with
/// `cargo test --release --test kmeans -- --ignored --nocapture`. Prints the best of three
/// runs of: one assignment pass (random-rows seeding, no iteration), k-means++ seeding plus
/// one pass, and one Lloyd iteration (from 10 iterations with tol = 0).
#[test]
#[ignore]
fn timing_one_iteration() {
    let data = uniform(12_920, 250, 1);
    let best = |c: KMeansConfig| -> (f64, usize) {
        let mut t_best = f64::INFINITY;
        let mut it = 0;
        for _ in 0..3 {
            let t = std::time::Instant::now();
            it = kmeans(data.view(), &c).unwrap().iterations;
            t_best = t_best.min(t.elapsed().as_secs_f64());
        }
        (t_best, it)
    };
    let base = KMeansConfig {
        iters: 0,
        tol: 0.0,
        ..cfg(500, 0)
    };
    let (pass, _) = best(KMeansConfig {
        init: InitMethod::RandomRows,
        ..base.clone()
    });
    let (seeded, _) = best(base.clone());
    let (ten, it) = best(KMeansConfig {
        init: InitMethod::RandomRows,
        iters: 10,
        ..base
    });
    eprintln!(
        "threads {}: one pass {pass:.3} s; k-means++ seeding {:.3} s; one Lloyd iteration {:.3} s ({it} iterations)",
        rayon::current_num_threads(),
        seeded - pass,
        (ten - pass) / it as f64
    );
}

/// The result of [`kmeans_on`] over `ranks` ranks (threads here) against [`kmeans`] in one
/// process: rank 0's bitwise equal, the other ranks' `None`.
fn assert_ranks_match_one_process(data: ArrayView2<'_, f32>, c: &KMeansConfig, ranks: usize) {
    let one = kmeans(data, c).unwrap();
    let all = ThreadRanks::run(ranks, |comm| kmeans_on(data, comm, c).unwrap());
    let bits = |o: &[f64]| o.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let root = all[0].as_ref().expect("rank 0 returns the result");
    assert_eq!(root.centroids, one.centroids, "{ranks} ranks, {c:?}");
    assert_eq!(root.counts, one.counts);
    assert_eq!(root.iterations, one.iterations);
    assert_eq!(bits(&root.objective), bits(&one.objective));
    assert!(all[1..].iter().all(Option::is_none));
}

#[test]
fn over_ranks_equals_one_process_bit_for_bit() {
    // 17 blocks of 300 rows (the last one short): more blocks than ranks × threads, so the
    // rounds and the block-to-rank interleaving are both exercised; a subset of the rows.
    let data = uniform(5000, 12, 11);
    let c = KMeansConfig {
        block_rows: 300,
        max_rows: Some(4900),
        ..cfg(25, 42)
    };
    let one = kmeans(data.view(), &c).unwrap();
    assert!(
        one.iterations >= 3,
        "too few iterations to test: {}",
        one.iterations
    );
    for ranks in [2, 3, 5] {
        assert_ranks_match_one_process(data.view(), &c, ranks);
    }
    // Fewer blocks than ranks: some ranks assign nothing.
    let small = KMeansConfig {
        block_rows: 4096,
        ..c.clone()
    };
    assert_ranks_match_one_process(data.view(), &small, 3);
}

#[test]
fn over_ranks_empty_clusters_are_reseeded_as_in_one_process() {
    // The data of `empty_clusters_are_reseeded`: random-rows seeding picks duplicate
    // centroids, whose clusters are empty and re-seeded from the far rows rank 0 gathers
    // from every rank's blocks.
    let data = mostly_one_row();
    let c = KMeansConfig {
        init: InitMethod::RandomRows,
        iters: 30,
        tol: 0.0,
        block_rows: 16,
        ..cfg(16, 2)
    };
    let one = kmeans(data.view(), &c).unwrap();
    assert!(one.iterations >= 2, "{one:?}");
    for ranks in [2, 4] {
        assert_ranks_match_one_process(data.view(), &c, ranks);
    }
}
