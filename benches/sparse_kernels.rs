//! sprs's sparse × dense products against the hand-written kernels of `fsgp::sparse`, on
//! chunks of Delicious and AmazonCat shape (random CSR data: uniform feature ids, sorted and
//! unique within a row, rows L2-normalised as ingest stores them):
//!
//! - projection X_c X̃ᵀ (f32, what predict and the svd's K_XX̃ pass do per chunk):
//!   `project_chunk` against sprs's `&csmat * &dense` (one thread, allocates its output) and
//!   against `sprs::prod::csr_mulacc_dense_rowmaj` over the same 256-row blocks in parallel;
//! - the Gram product B += X_cᵀ (X_c Q) (f64, every pass of the randomised SVD):
//!   `accumulate_gram_times` against `csr_mulacc_dense_rowmaj` (Y = X_c Q) then
//!   `csc_mulacc_dense_rowmaj` on the transposed view (B += X_cᵀ Y), its columns split in
//!   two halves for two threads.
//!
//! Prints best-of-N milliseconds, sprs / hand-written, and whether sprs's result is bitwise
//! the hand-written one (for the Gram product: B after two chunks' products from B = 0).
//!
//! Run: `cargo bench --bench sparse_kernels` (`FSGP_BENCH_SHAPES=delicious` or `amazoncat`
//! for one shape).

use std::time::Instant;

use fsgp::sparse::{accumulate_gram_times, project_chunk, Panels};
use fsgp::store::chunks::{CsrChunk, RowRef};
use ndarray::{s, Array2, ArrayView2, ArrayViewMut2, Axis};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use sprs::prod::{csc_mulacc_dense_rowmaj, csr_mulacc_dense_rowmaj};
use sprs::CsMatViewI;

/// Rows per parallel block of `project_chunk` (the same blocks for the sprs variant).
const PROJECT_BLOCK: usize = 256;

/// One chunk shape.
struct Shape {
    name: &'static str,
    rows: usize,
    features: usize,
    nnz_per_row: f64,
    /// R: columns of the projection (the basis rank).
    rank: usize,
    /// k = R + p: columns of the Gram product's Q.
    gram_cols: usize,
    reps: usize,
}

/// Mean non-zeros per row of an XML-repository text file (header line, then
/// `labels feature:value …` rows), if the file is there.
fn measured_nnz_per_row(path: &str) -> Option<f64> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut lines = text.lines().skip(1);
    let (mut rows, mut nnz) = (0usize, 0usize);
    for line in lines.by_ref() {
        rows += 1;
        nnz += line.split(' ').filter(|t| t.contains(':')).count();
    }
    (rows > 0).then(|| nnz as f64 / rows as f64)
}

/// A random chunk: row i has between 1 and 2·mean − 1 distinct features (uniform), values
/// uniform in (0, 1] scaled to unit norm.
fn random_chunk(shape: &Shape, seed: u64) -> CsrChunk {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let max_nnz = ((2.0 * shape.nnz_per_row).round() as usize - 1).min(shape.features);
    let mut chunk = CsrChunk::default();
    let mut indices: Vec<u32> = Vec::new();
    let mut values: Vec<f32> = Vec::new();
    for i in 0..shape.rows {
        let nnz = rng.random_range(1..=max_nnz);
        indices.clear();
        indices.extend(
            rand::seq::index::sample(&mut rng, shape.features, nnz)
                .into_iter()
                .map(|j| j as u32),
        );
        indices.sort_unstable();
        values.clear();
        values.extend((0..nnz).map(|_| 1.0 - rng.random::<f32>()));
        let norm = values.iter().map(|v| v * v).sum::<f32>().sqrt();
        values.iter_mut().for_each(|v| *v /= norm);
        chunk.push_row(RowRef {
            row_id: i as u64,
            labels: &[],
            indices: &indices,
            values: &values,
            sq_norm: 1.0,
        });
    }
    chunk
}

fn random_matrix<T>(
    rows: usize,
    cols: usize,
    seed: u64,
    draw: impl Fn(&mut ChaCha8Rng) -> T,
) -> Array2<T> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    Array2::from_shape_simple_fn((rows, cols), || draw(&mut rng))
}

/// Best wall time of `reps` calls, in ms.
fn best_ms(reps: usize, mut f: impl FnMut()) -> f64 {
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .fold(f64::INFINITY, f64::min)
}

/// Best wall times of `reps` calls of `f` and of `g`, in ms, the calls alternating so that
/// both see the same machine load.
fn best_pair(reps: usize, mut f: impl FnMut(), mut g: impl FnMut()) -> (f64, f64) {
    let (mut best_f, mut best_g) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..reps {
        best_f = best_f.min(best_ms(1, &mut f));
        best_g = best_g.min(best_ms(1, &mut g));
    }
    (best_f, best_g)
}

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("thread pool")
}

/// B += Xᵀ (X Q) with sprs: Y = X Q, then B += (Xᵀ as CSC) Y; `y` is rows × cols scratch.
fn sprs_gram(
    x: CsMatViewI<'_, f64, u32, i32>,
    q: ArrayView2<'_, f64>,
    b: ArrayViewMut2<'_, f64>,
    y: &mut Array2<f64>,
) {
    y.fill(0.0);
    csr_mulacc_dense_rowmaj(x.view(), q, y.view_mut());
    csc_mulacc_dense_rowmaj(x.transpose_view(), y.view(), b);
}

/// The same with the columns split in two halves, one per thread.
fn sprs_gram_two_halves(
    x: CsMatViewI<'_, f64, u32, i32>,
    q: ArrayView2<'_, f64>,
    b: ArrayViewMut2<'_, f64>,
    y: (&mut Array2<f64>, &mut Array2<f64>),
) {
    let half = q.ncols() / 2;
    let (b_left, b_right) = b.split_at(Axis(1), half);
    rayon::join(
        || sprs_gram(x.view(), q.slice(s![.., ..half]), b_left, y.0),
        || sprs_gram(x.view(), q.slice(s![.., half..]), b_right, y.1),
    );
}

fn bitwise_equal<'a>(
    a: impl IntoIterator<Item = &'a f64>,
    b: impl IntoIterator<Item = &'a f64>,
) -> bool {
    a.into_iter()
        .zip(b)
        .all(|(x, y)| x.to_bits() == y.to_bits())
}

fn max_abs_diff<'a>(
    a: impl IntoIterator<Item = &'a f64>,
    b: impl IntoIterator<Item = &'a f64>,
) -> f64 {
    a.into_iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

fn yes_no(equal: bool) -> &'static str {
    if equal {
        "yes"
    } else {
        "no"
    }
}

fn bench_projection(shape: &Shape, chunk: &CsrChunk) {
    let basis_t = random_matrix(shape.features, shape.rank, 11, |r| r.random::<f32>() - 0.5);
    let x = chunk.csr_view(shape.features).expect("valid CSR");
    let mut hand = Array2::<f32>::zeros((shape.rows, shape.rank));
    let mut with_sprs = Array2::<f32>::zeros((shape.rows, shape.rank));
    let flop = 2.0 * chunk.indices.len() as f64 * shape.rank as f64;
    let same =
        |a: &Array2<f32>, b: &Array2<f32>| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    let row = |variant: &str, threads: usize, (hand_ms, sprs_ms): (f64, f64), equal: bool| {
        println!(
            "| {} | X_c X̃ᵀ, f32, R = {} | {variant} | {threads} | {hand_ms:.1} | {sprs_ms:.1} | {:.2} | {} | {:.1} |",
            shape.name,
            shape.rank,
            sprs_ms / hand_ms,
            yes_no(equal),
            flop / hand_ms / 1e6,
        );
    };

    let mut product = Array2::<f32>::zeros((0, 0));
    let times = pool(1).install(|| {
        best_pair(
            shape.reps,
            || project_chunk(chunk, basis_t.view(), hand.view_mut()),
            || product = &x * &basis_t,
        )
    });
    row("sprs `&csmat * &dense`", 1, times, same(&product, &hand));
    drop(product);
    for threads in [1, 2] {
        let times = pool(threads).install(|| {
            best_pair(
                shape.reps,
                || project_chunk(chunk, basis_t.view(), hand.view_mut()),
                || sprs_project_chunk(chunk, basis_t.view(), with_sprs.view_mut()),
            )
        });
        row(
            "sprs `csr_mulacc_dense_rowmaj` on `project_chunk`'s 256-row blocks",
            threads,
            times,
            same(&with_sprs, &hand),
        );
    }
}

/// `fsgp::sparse::project_chunk` done by sprs: `csr_mulacc_dense_rowmaj` on the same
/// 256-row blocks in parallel, over the chunk's zero-copy view.
fn sprs_project_chunk(
    chunk: &CsrChunk,
    basis_t: ArrayView2<'_, f32>,
    mut out: ArrayViewMut2<'_, f32>,
) {
    let x = chunk.csr_view(basis_t.nrows()).expect("valid CSR");
    let r = basis_t.ncols();
    let out = out.as_slice_mut().expect("contiguous row-major output");
    out.par_chunks_mut(PROJECT_BLOCK * r)
        .enumerate()
        .for_each(|(blk, out_block)| {
            let start = blk * PROJECT_BLOCK;
            let n = out_block.len() / r;
            out_block.fill(0.0);
            let out_block = ArrayViewMut2::from_shape((n, r), out_block).expect("n × R block");
            csr_mulacc_dense_rowmaj(x.slice_outer(start..start + n), basis_t, out_block);
        });
}

/// A D×k result in a form that fits beside the operands: xxh3 of its values' bits in
/// row-major order, and every 16th row's values.
struct Fingerprint {
    hash: u64,
    sample: Vec<f64>,
}

const SAMPLE_EVERY: usize = 16;

fn fingerprint(rows: usize, cols: usize, get: impl Fn(usize, usize) -> f64) -> Fingerprint {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    let mut sample = Vec::new();
    for i in 0..rows {
        for j in 0..cols {
            let v = get(i, j);
            hasher.update(&v.to_bits().to_le_bytes());
            if i % SAMPLE_EVERY == 0 {
                sample.push(v);
            }
        }
    }
    Fingerprint {
        hash: hasher.digest(),
        sample,
    }
}

fn bench_gram(shape: &Shape, chunk: &CsrChunk) {
    let (d, k) = (shape.features, shape.gram_cols);
    let flop = 4.0 * chunk.indices.len() as f64 * k as f64;
    // Hand-written: Q and B as column panels. At most two D×k matrices live at once
    // (AmazonCat: 1.7 GB each), so the variants are timed one after the other.
    let q_panels = {
        let q = faer::Mat::<f64>::from_fn(d, k, gram_entry);
        Panels::from_mat(q.as_ref())
    };
    // Compared with sprs's: B after two chunks' products from B = 0 (the SVD accumulates
    // over chunks, so the second sum lands on a non-zero B).
    let mut b_panels = Panels::zeros(d, k);
    for _ in 0..2 {
        accumulate_gram_times(chunk, &q_panels, &mut b_panels);
    }
    let hand = fingerprint(d, k, |i, j| b_panels.get(i, j));
    let mut hand_ms = [0.0; 2];
    for (t, threads) in [1, 2].into_iter().enumerate() {
        hand_ms[t] = pool(threads).install(|| {
            best_ms(shape.reps, || {
                accumulate_gram_times(chunk, &q_panels, &mut b_panels)
            })
        });
    }
    drop((q_panels, b_panels));

    let q = Array2::from_shape_fn((d, k), |(i, j)| gram_entry(i, j));
    let mut b = Array2::<f64>::zeros((d, k));
    // sprs multiplies like with like: the f32 values are widened to f64 (inside the timing).
    let widened = || {
        chunk
            .values
            .iter()
            .map(|&v| f64::from(v))
            .collect::<Vec<f64>>()
    };
    let values = widened();
    let mut y = Array2::<f64>::zeros((chunk.len(), k));
    for _ in 0..2 {
        sprs_gram(f64_view(chunk, d, &values), q.view(), b.view_mut(), &mut y);
    }
    let sprs = fingerprint(d, k, |i, j| b[[i, j]]);
    let equal = sprs.hash == hand.hash && bitwise_equal(&sprs.sample, &hand.sample);
    let diff = max_abs_diff(&sprs.sample, &hand.sample);
    let scale = hand.sample.iter().fold(0.0f64, |m, v| m.max(v.abs()));

    let one_ms = pool(1).install(|| {
        best_ms(shape.reps, || {
            let values = widened();
            sprs_gram(f64_view(chunk, d, &values), q.view(), b.view_mut(), &mut y)
        })
    });
    drop(y);
    let half = k / 2;
    let mut y_left = Array2::<f64>::zeros((chunk.len(), half));
    let mut y_right = Array2::<f64>::zeros((chunk.len(), k - half));
    let two_ms = pool(2).install(|| {
        best_ms(shape.reps, || {
            let values = widened();
            sprs_gram_two_halves(
                f64_view(chunk, d, &values),
                q.view(),
                b.view_mut(),
                (&mut y_left, &mut y_right),
            )
        })
    });
    for (t, (threads, sprs_ms)) in [(1, one_ms), (2, two_ms)].into_iter().enumerate() {
        println!(
            "| {} | B += X_cᵀ(X_c Q), f64, k = {k} | sprs CSR × dense, then CSC (Xᵀ) × dense{} | {threads} | {:.1} | {sprs_ms:.1} | {:.2} | {} (max abs diff {diff:.1e} of max {scale:.1e}) | {:.1} |",
            shape.name,
            if threads == 2 { ", column halves" } else { "" },
            hand_ms[t],
            sprs_ms / hand_ms[t],
            yes_no(equal),
            flop / hand_ms[t] / 1e6,
        );
    }
}

/// The chunk as a sprs CSR view with f64 values: the chunk's offsets and ids, `values`
/// widened from its f32s.
fn f64_view<'a>(chunk: &'a CsrChunk, d: usize, values: &'a [f64]) -> CsMatViewI<'a, f64, u32, i32> {
    CsMatViewI::try_new(
        (chunk.len(), d),
        &chunk.feature_offsets[..],
        &chunk.indices[..],
        values,
    )
    .expect("valid CSR")
}

/// Q's entries: deterministic, cheap, in [−0.5, 0.5).
fn gram_entry(i: usize, j: usize) -> f64 {
    // Small primes spread the entries; the modulus keeps them below 1.
    (((i * 7919 + j * 104_729) % 1_000_003) as f64) / 1_000_003.0 - 0.5
}

fn main() {
    let delicious = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/data/delicious/train.txt"
    );
    let (delicious_nnz, source) = match measured_nnz_per_row(delicious) {
        Some(nnz) => (nnz, "measured from ../shared/data/delicious/train.txt"),
        None => (17.9, "../shared/data/delicious absent: the measured 17.9"),
    };
    let shapes = [
        // One 32 MiB chunk holds all 12 920 Delicious training rows.
        Shape {
            name: "Delicious",
            rows: 12_920,
            features: 500,
            nnz_per_row: delicious_nnz,
            rank: 250,
            gram_cols: 270,
            reps: 20,
        },
        // A 32 MiB chunk holds ~55 000 AmazonCat rows (≈ 600 bytes each).
        Shape {
            name: "AmazonCat",
            rows: 50_000,
            features: 203_882,
            nnz_per_row: 71.0,
            rank: 1000,
            gram_cols: 1020,
            reps: 3,
        },
    ];
    println!(
        "sparse kernels: sprs against the hand-written ones; Delicious nnz/row {delicious_nnz:.1} ({source}); {} cores",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!("| chunk | product | sprs variant | threads | hand-written ms | sprs ms | sprs / hand | sprs bitwise equal | hand GFLOP/s |");
    println!("|---|---|---|---|---|---|---|---|---|");
    // FSGP_BENCH_SHAPES=delicious (or amazoncat) runs one shape only.
    let only = std::env::var("FSGP_BENCH_SHAPES").ok();
    for (seed, shape) in shapes.iter().enumerate() {
        if only
            .as_deref()
            .is_some_and(|o| !o.to_lowercase().contains(&shape.name.to_lowercase()))
        {
            continue;
        }
        let chunk = random_chunk(shape, seed as u64 + 1);
        bench_projection(shape, &chunk);
        bench_gram(shape, &chunk);
    }
}
