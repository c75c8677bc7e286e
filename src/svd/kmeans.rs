//! Deterministic, streaming k-means over the rows of a (possibly memory-mapped) N×R f32
//! matrix: the initialisation of the subspace inducing inputs A (M×R) from the rows of
//! K_XX̃ = U_R S_R (paper §2.2).
//!
//! - Seeding: k-means++ D² sampling on a uniform sample of at most
//!   max([`SEED_SAMPLE_PER_CLUSTER`]·k, [`SEED_SAMPLE_MIN`]) rows, or k distinct random rows.
//! - Exact Lloyd iterations: every pass streams the rows in fixed blocks, assigns each row to
//!   its nearest centroid (‖x‖² − 2x·c + ‖c‖², the block product x·cᵀ by faer in f64),
//!   accumulates per-cluster sums and the objective in f64, then recomputes the means.
//! - Blocks are processed in parallel (rayon) but combined strictly in block order, so the
//!   result is bitwise identical whatever the thread count.
//!
//! Memory: centroids and accumulators O(k·R) (one set per block in flight), one block of
//! rows (block_rows × R f64) and of dot products (block_rows × min(k, 1024) f64) per block in
//! flight, plus the seeding sample. The data matrix is never copied as a whole.
//! See docs/kmeans.md.

use anyhow::{bail, ensure, Result};
use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};
use ndarray::{Array2, ArrayView2};
use rand::seq::index;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use crate::choice::choice_enum;
use crate::comm::{Comm, Single};

/// k-means++ seeding runs on a uniform sample of at most
/// `max(SEED_SAMPLE_PER_CLUSTER · k, SEED_SAMPLE_MIN)` rows.
pub const SEED_SAMPLE_PER_CLUSTER: usize = 10;
/// See [`SEED_SAMPLE_PER_CLUSTER`].
pub const SEED_SAMPLE_MIN: usize = 20_000;
/// Largest f64 copy of a block's rows (see `assign_pass`).
const BLOCK_BYTES: usize = 8 << 20;

/// Centroids per block product: bounds the dot-product buffer to block_rows × this.
const CENTROID_TILE: usize = 1024;
/// Rows per chunk of the parallel D² update during seeding.
const SEED_CHUNK: usize = 1024;

choice_enum! {
    /// How the centroids are initialised (`svd --init`).
    pub enum InitMethod("initialisation") {
        /// k-means++ (D² sampling) on a sample of the rows.
        KmeansPlusPlus = "kmeans-plus-plus" => "k-means++ (D² sampling) on a sample of the rows",
        /// k distinct rows chosen uniformly at random.
        RandomRows = "random-rows" => "k distinct rows chosen uniformly at random",
    }
}

/// Parameters of [`kmeans`].
#[derive(Debug, Clone)]
pub struct KMeansConfig {
    /// Number of clusters (M). The default, 0, is invalid: callers must set it.
    pub k: usize,
    /// Maximum number of Lloyd iterations.
    pub iters: usize,
    /// Stop when the relative decrease of the objective of an iteration is below this.
    pub tol: f64,
    pub seed: u64,
    pub init: InitMethod,
    /// Run on a uniform random subset of at most this many rows (None: all rows).
    pub max_rows: Option<usize>,
    /// Rows per block when streaming.
    pub block_rows: usize,
}

impl Default for KMeansConfig {
    fn default() -> Self {
        KMeansConfig {
            k: 0,
            iters: 10,
            tol: 1e-4,
            seed: 0,
            init: InitMethod::KmeansPlusPlus,
            max_rows: None,
            block_rows: 4096,
        }
    }
}

/// What [`kmeans`] found.
#[derive(Debug, Clone)]
pub struct KMeansResult {
    /// k × R centroids.
    pub centroids: Array2<f32>,
    /// Sum over the rows used of the squared distance to the nearest centroid (computed in
    /// f64 against the f32 centroids): after seeding, then after each accepted iteration.
    /// Non-increasing; the last entry is the objective of `centroids`.
    pub objective: Vec<f64>,
    /// Rows assigned to each cluster by the final assignment.
    pub counts: Vec<u64>,
    /// Accepted Lloyd iterations (`objective.len() - 1`).
    pub iterations: usize,
}

/// Runs k-means on the rows of `data` (N×R). See the module docs and docs/kmeans.md.
///
/// Errors when k, N or R is zero, when `block_rows` or `max_rows` is zero, or when a row
/// used holds a non-finite value.
pub fn kmeans(data: ArrayView2<'_, f32>, cfg: &KMeansConfig) -> Result<KMeansResult> {
    let result = kmeans_on(data, &Single, cfg)?;
    Ok(result.expect("the one process is rank 0"))
}

/// [`kmeans`] over the ranks of `comm`: every rank passes the same `data` (the same
/// memory-mapped file) and the same `cfg`, and calls this together with the others.
///
/// Rank 0 seeds the centroids and broadcasts them. In every Lloyd pass rank r assigns the
/// blocks b ≡ r (mod K) and rank 0 gathers each round's block results and adds them in
/// block order, exactly as one process adds its blocks: the result is bitwise the one
/// process's, whatever the number of ranks. Rank 0 takes every decision (stop, roll back)
/// and broadcasts it, so every rank walks the same collectives. Rank 0 returns the result,
/// the other ranks `None`.
pub fn kmeans_on(
    data: ArrayView2<'_, f32>,
    comm: &dyn Comm,
    cfg: &KMeansConfig,
) -> Result<Option<KMeansResult>> {
    let (n, r) = data.dim();
    let k = cfg.k;
    check_config(n, r, cfg)?;
    let root = comm.is_root();

    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let subset = match cfg.max_rows {
        Some(m) if m < n => {
            let mut idx = index::sample(&mut rng, n, m).into_vec();
            idx.sort_unstable();
            Some(idx)
        }
        _ => None,
    };
    let rows = Rows { data, subset };

    let mut cent = match (root, cfg.init) {
        (false, _) => vec![0.0; k * r],
        (true, InitMethod::KmeansPlusPlus) => seed_plus_plus(&rows, k, &mut rng)?,
        (true, InitMethod::RandomRows) => seed_random(&rows, k, &mut rng)?,
    };
    comm.broadcast(&mut cent)?;

    // Only rank 0's passes hold the totals; the others follow its decisions.
    let mut pass = assign_pass(&rows, &cent, k, cfg.block_rows, comm)?;
    let mut objective = vec![pass.objective];
    let mut iterations = 0;
    while decided(comm, iterations < cfg.iters && pass.objective > 0.0)? {
        let mut next = if root {
            update_centroids(&rows, &cent, &pass, k)?
        } else {
            vec![0.0; k * r]
        };
        if decided(comm, next == cent)? {
            break;
        }
        comm.broadcast(&mut next)?;
        let next_pass = assign_pass(&rows, &next, k, cfg.block_rows, comm)?;
        // Exact Lloyd cannot increase the objective; in floating point it can, by rounding
        // at near-ties. Such an iteration is rolled back and ends the run.
        if decided(comm, next_pass.objective > pass.objective)? {
            break;
        }
        let previous = pass.objective;
        cent = next;
        pass = next_pass;
        objective.push(pass.objective);
        iterations += 1;
        if decided(comm, previous - pass.objective < cfg.tol * previous)? {
            break;
        }
    }
    if !root {
        return Ok(None);
    }

    let centroids = Array2::from_shape_vec((k, r), cent.iter().map(|&v| v as f32).collect())?;
    Ok(Some(KMeansResult {
        centroids,
        objective,
        counts: pass.counts,
        iterations,
    }))
}

/// The checks of [`kmeans`]'s arguments, on N×R data.
fn check_config(n: usize, r: usize, cfg: &KMeansConfig) -> Result<()> {
    let k = cfg.k;
    ensure!(
        k > 0,
        "k-means: the number of clusters k must be at least 1"
    );
    ensure!(n > 0, "k-means: the data has no rows (N = 0)");
    ensure!(r > 0, "k-means: the data has no columns (R = 0)");
    ensure!(cfg.block_rows > 0, "k-means: block_rows must be at least 1");
    ensure!(
        cfg.max_rows != Some(0),
        "k-means: max_rows must be at least 1 (or unset to use all rows)"
    );
    ensure!(!cfg.tol.is_nan(), "k-means: tol is NaN");
    ensure!(
        k.checked_mul(r).and_then(|v| v.checked_mul(8)).is_some(),
        "k-means: k × R = {k} × {r} is too large"
    );
    Ok(())
}

/// Rank 0's `decision` on every rank (one process: `decision` itself).
fn decided(comm: &dyn Comm, decision: bool) -> Result<bool> {
    Ok(comm.broadcast_u64(u64::from(decision))? == 1)
}

/// The rows k-means runs on: all rows of `data`, or a sorted subset.
struct Rows<'a> {
    data: ArrayView2<'a, f32>,
    subset: Option<Vec<usize>>,
}

impl Rows<'_> {
    fn len(&self) -> usize {
        self.subset.as_ref().map_or(self.data.nrows(), Vec::len)
    }

    fn dim(&self) -> usize {
        self.data.ncols()
    }

    /// Row index in `data` of position `p`.
    fn original(&self, p: usize) -> usize {
        self.subset.as_ref().map_or(p, |s| s[p])
    }

    /// Copies the row at position `p` into `out` (converted to `T`); errors when it holds a
    /// non-finite value.
    fn copy_row<T: Copy>(&self, p: usize, out: &mut [T], conv: impl Fn(f32) -> T) -> Result<()> {
        let i = self.original(p);
        let row = self.data.row(i);
        let mut bad = None;
        let mut put = |(j, (o, &v)): (usize, (&mut T, &f32))| {
            if !v.is_finite() && bad.is_none() {
                bad = Some((j, v));
            }
            *o = conv(v);
        };
        match row.as_slice() {
            Some(s) => out.iter_mut().zip(s).enumerate().for_each(&mut put),
            None => out
                .iter_mut()
                .zip(row.iter())
                .enumerate()
                .for_each(&mut put),
        }
        if let Some((j, v)) = bad {
            bail!("k-means: non-finite value {v} in row {i} (column {j}) of the data");
        }
        Ok(())
    }
}

/// Partial sums in the distance kernels: an elementwise loop over this many independent
/// accumulators is vectorised by LLVM at opt-level 2 as well as 3 (a reduction into one
/// accumulator is not, floating-point addition not being associative).
const LANES: usize = 32;

/// acc[l] += (x[l] − y[l])² for every lane.
#[inline(always)]
fn accumulate_lanes<A, B, T>(acc: &mut [T; LANES], x: &[A], y: &[B])
where
    A: Copy + Into<T>,
    B: Copy + Into<T>,
    T: Copy + std::ops::Sub<Output = T> + std::ops::Mul<Output = T> + std::ops::AddAssign,
{
    for ((s, &p), &q) in acc.iter_mut().zip(x).zip(y) {
        let d = p.into() - q.into();
        *s += d * d;
    }
}

/// Σ (a_l − b_l)² accumulated in `T`, in a fixed order (lanes, then the lanes summed in
/// order): the same inputs always give the same bits. The tail shorter than [`LANES`] is
/// zero-padded so that it takes the vectorised path too.
fn sq_dist_in<A, B, T>(a: &[A], b: &[B], zero_a: A, zero_b: B, zero: T) -> T
where
    A: Copy + Into<T>,
    B: Copy + Into<T>,
    T: Copy + std::ops::Sub<Output = T> + std::ops::Mul<Output = T> + std::ops::AddAssign,
{
    let mut acc = [zero; LANES];
    let (ac, bc) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        accumulate_lanes(&mut acc, x, y);
    }
    if !ar.is_empty() {
        let (mut xa, mut yb) = ([zero_a; LANES], [zero_b; LANES]);
        xa[..ar.len()].copy_from_slice(ar);
        yb[..br.len()].copy_from_slice(br);
        accumulate_lanes(&mut acc, &xa, &yb);
    }
    let mut total = zero;
    for v in acc {
        total += v;
    }
    total
}

/// Squared Euclidean distance of an f64 row to an f64 centroid, in f64.
fn sq_dist(a: &[f64], b: &[f64]) -> f64 {
    sq_dist_in(a, b, 0.0, 0.0, 0.0f64)
}

/// Squared Euclidean distance of f32 rows computed in f32: the D² weights of the seeding,
/// where f32 precision is ample (and identical rows still give exactly 0). Falls back to f64
/// when the f32 sum overflows.
fn sq_dist_f32(a: &[f32], b: &[f32]) -> f64 {
    let v = sq_dist_in(a, b, 0.0, 0.0, 0.0f32);
    if v.is_finite() {
        f64::from(v)
    } else {
        sq_dist_in(a, b, 0.0, 0.0, 0.0f64)
    }
}

/// Rounds to f32 precision (centroids are kept f32-valued so that the objective recorded
/// is that of the returned f32 centroids).
fn round_f32(v: f64) -> f64 {
    f64::from(v as f32)
}

/// k distinct random rows (all rows, then random duplicates, when k exceeds them).
fn seed_random(rows: &Rows<'_>, k: usize, rng: &mut ChaCha8Rng) -> Result<Vec<f64>> {
    let (n, r) = (rows.len(), rows.dim());
    let mut picks = index::sample(rng, n, k.min(n)).into_vec();
    while picks.len() < k {
        picks.push(rng.random_range(0..n));
    }
    let mut cent = vec![0.0f64; k * r];
    for (c, &p) in cent.chunks_exact_mut(r).zip(&picks) {
        rows.copy_row(p, c, f64::from)?;
    }
    Ok(cent)
}

/// k-means++ D² sampling on a uniform sample of the rows.
fn seed_plus_plus(rows: &Rows<'_>, k: usize, rng: &mut ChaCha8Rng) -> Result<Vec<f64>> {
    let (n, r) = (rows.len(), rows.dim());
    let s = n.min(SEED_SAMPLE_MIN.max(k.saturating_mul(SEED_SAMPLE_PER_CLUSTER)));
    let positions: Vec<usize> = if s == n {
        (0..n).collect()
    } else {
        let mut v = index::sample(rng, n, s).into_vec();
        v.sort_unstable();
        v
    };
    let mut sample = vec![0.0f32; s * r];
    for (dst, &p) in sample.chunks_exact_mut(r).zip(&positions) {
        rows.copy_row(p, dst, |v| v)?;
    }

    let mut chosen: Vec<usize> = Vec::with_capacity(k);
    let mut d2 = vec![f64::INFINITY; s];
    let mut pick = rng.random_range(0..s);
    loop {
        chosen.push(pick);
        if chosen.len() == k {
            break;
        }
        let c = &sample[pick * r..(pick + 1) * r];
        // Each entry depends only on its own row: deterministic whatever the thread count.
        d2.par_chunks_mut(SEED_CHUNK)
            .zip(sample.par_chunks(SEED_CHUNK * r))
            .for_each(|(d, xs)| {
                for (di, x) in d.iter_mut().zip(xs.chunks_exact(r)) {
                    let v = sq_dist_f32(x, c);
                    if v < *di {
                        *di = v;
                    }
                }
            });
        let total: f64 = d2.iter().sum();
        if total <= 0.0 {
            // Every sampled row coincides with a chosen centroid.
            break;
        }
        let u = rng.random::<f64>() * total;
        let mut acc = 0.0;
        let mut last = None;
        let mut found = None;
        for (i, &w) in d2.iter().enumerate() {
            if w > 0.0 {
                acc += w;
                last = Some(i);
                if acc > u {
                    found = Some(i);
                    break;
                }
            }
        }
        match found.or(last) {
            Some(i) => pick = i,
            None => break,
        }
    }
    while chosen.len() < k {
        chosen.push(rng.random_range(0..s));
    }

    let mut cent = vec![0.0f64; k * r];
    for (c, &i) in cent.chunks_exact_mut(r).zip(&chosen) {
        for (o, &v) in c.iter_mut().zip(&sample[i * r..(i + 1) * r]) {
            *o = f64::from(v);
        }
    }
    Ok(cent)
}

/// Result of assigning rows to centroids: over one block, or over all rows.
struct Pass {
    objective: f64,
    /// k × R sums of the rows of each cluster.
    sums: Vec<f64>,
    counts: Vec<u64>,
    /// The rows farthest from their centroid, (squared distance, position), distance > 0,
    /// sorted by decreasing distance then increasing position, at most k of them.
    far: Vec<(f64, usize)>,
}

fn far_order(a: &(f64, usize), b: &(f64, usize)) -> std::cmp::Ordering {
    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
}

fn keep_farthest(far: &mut Vec<(f64, usize)>, k: usize) {
    if far.len() > k {
        far.select_nth_unstable_by(k - 1, far_order);
        far.truncate(k);
    }
    far.sort_unstable_by(far_order);
}

/// One streaming pass: assigns every row to its nearest centroid. Blocks of `block_rows`
/// rows are processed in parallel in rounds and combined strictly in block order.
///
/// Over K ranks, block b is rank b mod K's and rank 0 gathers every round's block results
/// before adding them in the same order: the total (rank 0's; the other ranks return an
/// empty pass) is bitwise the one process's.
fn assign_pass(
    rows: &Rows<'_>,
    cent: &[f64],
    k: usize,
    block_rows: usize,
    comm: &dyn Comm,
) -> Result<Pass> {
    let (n, r) = (rows.len(), rows.dim());
    let c_norms: Vec<f64> = cent
        .chunks_exact(r)
        .map(|c| c.iter().map(|v| v * v).sum())
        .collect();
    // Cap a block's f64 copy of its rows at BLOCK_BYTES, so wide R (thousands) does not
    // multiply into hundreds of MB per wave. Depends on R only, never on the thread count.
    let block_rows = block_rows.min((BLOCK_BYTES / (8 * r)).max(16));
    let n_blocks = n.div_ceil(block_rows);
    // The round size only bounds memory (rank 0's threads' worth of blocks per rank); it
    // does not affect the result.
    let wave = comm.broadcast_u64(rayon::current_num_threads().max(1) as u64)? as usize;
    let (ranks, me) = (comm.size(), comm.rank());
    let mut total = Pass::empty(k, r);
    for w0 in (0..n_blocks).step_by(wave * ranks) {
        let w1 = (w0 + wave * ranks).min(n_blocks);
        let mine: Vec<usize> = (w0..w1).filter(|b| b % ranks == me).collect();
        let parts: Vec<Result<Pass>> = mine
            .par_iter()
            .map(|&b| {
                let p0 = b * block_rows;
                assign_block(rows, p0..(p0 + block_rows).min(n), cent, &c_norms)
            })
            .collect();
        let parts = parts.into_iter().collect::<Result<Vec<Pass>>>()?;
        let parts = if ranks > 1 {
            gather_in_block_order(comm, &parts, w0..w1, k, r)?
        } else {
            parts
        };
        for part in parts {
            total.objective += part.objective;
            for (t, v) in total.sums.iter_mut().zip(&part.sums) {
                *t += v;
            }
            for (t, v) in total.counts.iter_mut().zip(&part.counts) {
                *t += v;
            }
            total.far.extend(part.far);
            keep_farthest(&mut total.far, k);
        }
    }
    Ok(total)
}

/// Every rank's results for the blocks of one round (`blocks`; rank q holds those with
/// b mod K = q, in increasing order), gathered on rank 0 in block order. Other ranks get
/// an empty list.
fn gather_in_block_order(
    comm: &dyn Comm,
    parts: &[Pass],
    blocks: std::ops::Range<usize>,
    k: usize,
    r: usize,
) -> Result<Vec<Pass>> {
    let mut bytes = Vec::new();
    for p in parts {
        p.encode(&mut bytes);
    }
    let gathered = comm.gather_bytes(&bytes)?;
    if !comm.is_root() {
        return Ok(Vec::new());
    }
    let mut per_rank: Vec<std::vec::IntoIter<Pass>> = gathered
        .iter()
        .map(|b| Pass::decode_all(b, k, r).map(Vec::into_iter))
        .collect::<Result<_>>()?;
    let ranks = per_rank.len();
    blocks
        .map(|b| {
            per_rank[b % ranks].next().ok_or_else(|| {
                anyhow::anyhow!("k-means: rank {} sent no result for block {b}", b % ranks)
            })
        })
        .collect()
}

impl Pass {
    fn empty(k: usize, r: usize) -> Pass {
        Pass {
            objective: 0.0,
            sums: vec![0.0; k * r],
            counts: vec![0; k],
            far: Vec::new(),
        }
    }

    /// Appends the pass to `out`: objective, k counts, k·R sums, the number of far rows and
    /// each (distance, position), all as little-endian 8-byte words.
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend(self.objective.to_le_bytes());
        out.extend(self.counts.iter().flat_map(|c| c.to_le_bytes()));
        out.extend(self.sums.iter().flat_map(|v| v.to_le_bytes()));
        out.extend((self.far.len() as u64).to_le_bytes());
        for &(d, p) in &self.far {
            out.extend(d.to_le_bytes());
            out.extend((p as u64).to_le_bytes());
        }
    }

    /// The passes [`Pass::encode`] wrote one after another into `bytes`.
    fn decode_all(bytes: &[u8], k: usize, r: usize) -> Result<Vec<Pass>> {
        let mut words = bytes
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")));
        ensure!(
            bytes.len() % 8 == 0,
            "k-means: a rank sent {} bytes, not whole words",
            bytes.len()
        );
        let mut out = Vec::new();
        let truncated = || anyhow::anyhow!("k-means: a rank's block results are truncated");
        while let Some(objective) = words.next() {
            let mut take = |len: usize| -> Result<Vec<u64>> {
                let v: Vec<u64> = words.by_ref().take(len).collect();
                ensure!(v.len() == len, truncated());
                Ok(v)
            };
            let counts = take(k)?;
            let sums = take(k * r)?.into_iter().map(f64::from_bits).collect();
            let n_far = take(1)?[0] as usize;
            let far = take(2 * n_far)?
                .chunks_exact(2)
                .map(|w| (f64::from_bits(w[0]), w[1] as usize))
                .collect();
            out.push(Pass {
                objective: f64::from_bits(objective),
                sums,
                counts,
                far,
            });
        }
        Ok(out)
    }
}

/// Assigns the rows at positions `range` (one block).
fn assign_block(
    rows: &Rows<'_>,
    range: std::ops::Range<usize>,
    cent: &[f64],
    c_norms: &[f64],
) -> Result<Pass> {
    let (m, r, k) = (range.len(), rows.dim(), c_norms.len());
    let mut x = vec![0.0f64; m * r];
    for (dst, p) in x.chunks_exact_mut(r).zip(range.clone()) {
        rows.copy_row(p, dst, f64::from)?;
    }

    // Nearest centroid by ‖c‖² − 2 x·c (‖x‖² is common to a row), ties to the lower index.
    let mut best = vec![f64::INFINITY; m];
    let mut best_j = vec![0usize; m];
    let tile = k.min(CENTROID_TILE);
    let mut g = vec![0.0f64; m * tile];
    let lhs = MatRef::from_row_major_slice(&x, m, r);
    for j0 in (0..k).step_by(tile) {
        let j1 = (j0 + tile).min(k);
        let kt = j1 - j0;
        let gt = &mut g[..m * kt];
        let rhs = MatRef::from_row_major_slice(&cent[j0 * r..j1 * r], kt, r).transpose();
        // Sequential: rayon already runs blocks in parallel, and a thread-count-dependent
        // split inside the product would break determinism.
        matmul(
            MatMut::from_row_major_slice_mut(gt, m, kt),
            Accum::Replace,
            lhs,
            rhs,
            1.0,
            Par::Seq,
        );
        for ((gi, b), bj) in gt.chunks_exact(kt).zip(&mut best).zip(&mut best_j) {
            for (jj, (&gv, &cn)) in gi.iter().zip(&c_norms[j0..j1]).enumerate() {
                let v = cn - 2.0 * gv;
                if v < *b {
                    *b = v;
                    *bj = j0 + jj;
                }
            }
        }
    }

    let mut out = Pass::empty(k, r);
    for ((xi, &j), p) in x.chunks_exact(r).zip(&best_j).zip(range) {
        let c = &cent[j * r..(j + 1) * r];
        // The objective uses the exact difference, not the expanded form.
        let d = sq_dist(xi, c);
        out.objective += d;
        out.counts[j] += 1;
        for (s, &v) in out.sums[j * r..(j + 1) * r].iter_mut().zip(xi) {
            *s += v;
        }
        if d > 0.0 {
            out.far.push((d, p));
        }
    }
    keep_farthest(&mut out.far, k);
    Ok(out)
}

/// New centroids: the means of the clusters (rounded to f32). An empty cluster is re-seeded
/// with the row farthest from its centroid in this pass (the next farthest for the next
/// empty cluster, and so on); when no row is left at a positive distance it keeps its
/// centroid.
fn update_centroids(rows: &Rows<'_>, cent: &[f64], pass: &Pass, k: usize) -> Result<Vec<f64>> {
    let r = rows.dim();
    let mut next = cent.to_vec();
    let mut empty = Vec::new();
    for j in 0..k {
        let count = pass.counts[j];
        if count == 0 {
            empty.push(j);
            continue;
        }
        let count = count as f64;
        for (c, &s) in next[j * r..(j + 1) * r]
            .iter_mut()
            .zip(&pass.sums[j * r..(j + 1) * r])
        {
            *c = round_f32(s / count);
        }
    }
    for (&j, &(_, p)) in empty.iter().zip(&pass.far) {
        rows.copy_row(p, &mut next[j * r..(j + 1) * r], f64::from)?;
    }
    Ok(next)
}
