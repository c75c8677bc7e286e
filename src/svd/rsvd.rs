//! Out-of-core truncated SVD by randomised subspace iteration on the Gram operator
//! (Halko, Martinsson & Tropp 2011, Alg. 4.4 with Rayleigh–Ritz), reading X chunk by chunk.
//!
//! X is N×D sparse with N possibly far beyond RAM, so nothing N-sized is kept: every pass
//! streams the chunks once and accumulates B = XᵀX Q = Σ_c X_cᵀ (X_c Q) in a D×k matrix
//! (k = R + p). With Ω a D×k Gaussian matrix:
//!
//! ```text
//! B ← XᵀX Ω                       (pass 1)
//! repeat q times: Q ← orth(B); B ← XᵀX Q     (passes 2..q+1)
//! Q ← orth(B); B ← XᵀX Q                      (pass q+2)
//! G = Qᵀ B = (XQ)ᵀ(XQ)   (k×k),   G = V Λ Vᵀ
//! X̃ = (Q V_R)ᵀ  (R×D),  σ_r = sqrt(λ_r)
//! ```
//!
//! Memory: Q and B, 2·D·k·8 bytes, plus the chunk being read and the one prefetched.
//! See docs/svd.md for the derivation and the error behaviour.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use faer::{Mat, Side};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

use crate::comm::{Comm, Single};
use crate::memtrace;
use crate::sparse::{accumulate_gram_times, Panels};
use crate::store::chunks::{read_registered_chunk, CsrChunk};
use crate::store::integrity::Registered;

/// Where the rows of X come from.
pub trait RowSource: Sync {
    fn n_rows(&self) -> u64;
    fn n_cols(&self) -> usize;
    /// Calls `f` with every chunk, in order.
    fn for_each_chunk(&self, f: &mut dyn FnMut(&CsrChunk) -> Result<()>) -> Result<()>;
}

/// In-memory chunks (tests, small data).
pub struct MemoryRows {
    pub chunks: Vec<CsrChunk>,
    pub n_cols: usize,
}

impl RowSource for MemoryRows {
    fn n_rows(&self) -> u64 {
        self.chunks.iter().map(|c| c.len() as u64).sum()
    }

    fn n_cols(&self) -> usize {
        self.n_cols
    }

    fn for_each_chunk(&self, f: &mut dyn FnMut(&CsrChunk) -> Result<()>) -> Result<()> {
        self.chunks.iter().try_for_each(f)
    }
}

/// Chunk files of an ingested split, read in order with the next file prefetched by a
/// background thread (so reading, checking and decoding overlap the compute of the current
/// chunk).
pub struct ChunkFiles {
    pub files: Vec<Registered>,
    pub n_rows: u64,
    pub n_cols: usize,
}

impl RowSource for ChunkFiles {
    fn n_rows(&self) -> u64 {
        self.n_rows
    }

    fn n_cols(&self) -> usize {
        self.n_cols
    }

    fn for_each_chunk(&self, f: &mut dyn FnMut(&CsrChunk) -> Result<()>) -> Result<()> {
        std::thread::scope(|scope| {
            let (tx, rx) = crossbeam_channel::bounded::<Result<CsrChunk>>(1);
            let files = &self.files;
            scope.spawn(move || {
                for file in files {
                    let chunk = read_registered_chunk(file);
                    let failed = chunk.is_err();
                    if tx.send(chunk).is_err() || failed {
                        break;
                    }
                }
            });
            let mut seen = 0usize;
            for chunk in rx.iter() {
                let chunk = chunk?;
                f(&chunk)?;
                seen += 1;
            }
            if seen != files.len() {
                bail!("read {seen} of {} chunk files", files.len());
            }
            Ok(())
        })
    }
}

/// The most power iterations an svd may make. Each is one more pass over the data, and
/// two or three already bring the sketch's error close to the optimum (Halko, Martinsson &
/// Tropp, §4.5); far beyond, a typo would read the data for days.
pub const MAX_POWER_ITERS: usize = 50;

/// The most oversampling directions beyond R: the sketch holds D × (R + p) numbers, and a
/// p of ten or twenty is the usual choice (Halko, Martinsson & Tropp, §4.2).
pub const MAX_OVERSAMPLE: usize = 10_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SvdConfig {
    pub rank: usize,
    pub oversample: usize,
    pub power_iters: usize,
    pub seed: u64,
}

#[derive(Debug, Clone)]
pub struct SvdResult {
    /// X̃ᵀ: D×R, columns are the top-R right singular vectors.
    pub basis_t: Mat<f64>,
    /// σ_1 ≥ … ≥ σ_R.
    pub singular_values: Vec<f64>,
    /// Wall seconds of each pass over the data.
    pub pass_seconds: Vec<f64>,
}

/// One pass: B = XᵀX Q = Σ_ranks X_sᵀ(X_s Q), each rank summing over its share X_s of the
/// rows, then B summed over the ranks (one process: nothing to sum).
fn gram_pass(src: &dyn RowSource, comm: &dyn Comm, q: &Panels) -> Result<Panels> {
    let mut b = Panels::zeros(q.rows, q.cols);
    src.for_each_chunk(&mut |chunk| {
        accumulate_gram_times(chunk, q, &mut b);
        Ok(())
    })?;
    for panel in b.storage_mut() {
        comm.sum_all(panel)?;
    }
    Ok(b)
}

/// Orthonormal basis of B's columns, in place: CholeskyQR2 (Fukaya, Nakatsukasa, Yanagisawa
/// and Yamamoto 2014) when B is well enough conditioned, else Householder QR.
///
/// CholeskyQR forms G = BᵀB [k×k] and R = chol(G), then Q = B R⁻¹; done twice, Q is
/// orthonormal to working precision for cond(B) up to about u^{-1/2} ≈ 10⁸. Both steps read
/// B's panels in blocks of rows, so it needs no second D×k matrix and no large GEMM
/// packing buffers: only B itself lives in memory. The first Cholesky factor is checked: if
/// the factorisation fails or its diagonal spans more than [`CQR_MAX_DIAG_RATIO`] (cond(B) is
/// then at least that), the Householder path takes over (on B, or on B R⁻¹ after a first
/// step, which spans the same space).
fn orthonormalise(mut b: Panels) -> Panels {
    if cholesky_qr_step(&mut b) && cholesky_qr_step(&mut b) {
        memtrace::mark("svd orth: CholeskyQR2");
        return b;
    }
    householder_orthonormalise(b)
}

/// Largest ratio between the diagonal entries of R in a CholeskyQR step; above it the
/// Householder path is used. 10⁵ keeps a wide margin below CholeskyQR2's limit.
const CQR_MAX_DIAG_RATIO: f64 = 1e5;

/// One CholeskyQR step: B ← B R⁻¹ with RᵀR = BᵀB. Returns false, leaving B as it was, when
/// the Cholesky factorisation fails or R is too ill-conditioned.
fn cholesky_qr_step(b: &mut Panels) -> bool {
    let Some(l) = crate::linalg::cholesky_lower(b.cross(b)) else {
        return false;
    };
    let k = l.nrows();
    let diag: Vec<f64> = (0..k).map(|i| l[(i, i)]).collect();
    let (lo, hi) = diag.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &d| {
        (lo.min(d), hi.max(d))
    });
    if !(lo > 0.0 && hi / lo <= CQR_MAX_DIAG_RATIO) {
        return false;
    }
    b.solve_upper_right(l.as_ref());
    true
}

/// Householder thin QR, with at most two D×k matrices alive at once: B converted panel by
/// panel into faer's layout, factorised in place (its strictly lower part then holds the
/// Householder vectors), thin Q formed by applying them to the first k columns of the
/// identity, then Q converted to panels. faer's `Qr` type is not used: it copies its input
/// and keeps both, a third D×k matrix.
///
/// The factorisation and the product run sequentially on a thread of their own (see
/// [`on_own_thread`]): faer's GEMM kernel keeps per-thread packing buffers sized from the
/// last-level cache, which this VM reports as 480 MiB, and a tall D×k product fills them
/// on every thread that takes part; on a short-lived thread they are freed when it ends.
fn householder_orthonormalise(b: Panels) -> Panels {
    let factors = b.into_mat();
    memtrace::mark("svd orth: B as a matrix");
    let q = on_own_thread(move || thin_q(factors));
    memtrace::mark("svd orth: thin Q");
    let panels = Panels::from_mat(q.as_ref());
    memtrace::mark("svd orth: Q as panels");
    panels
}

/// Runs `f` on a new thread and returns its result (see [`orthonormalise`]).
fn on_own_thread<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(f)
            .join()
            .expect("orthonormalisation thread panicked")
    })
}

/// Thin Q [D×k] of `factors` [D×k] (consumed), sequentially.
fn thin_q(mut factors: Mat<f64>) -> Mat<f64> {
    use faer::dyn_stack::{MemBuffer, MemStack};
    use faer::linalg::householder::{
        apply_block_householder_sequence_on_the_left_in_place_scratch,
        apply_block_householder_sequence_on_the_left_in_place_with_conj,
    };
    use faer::linalg::qr::no_pivoting::factor::{
        qr_in_place, qr_in_place_scratch, recommended_block_size,
    };
    let (d, k) = factors.shape();
    let size = d.min(k);
    let par = faer::Par::Seq;
    let block = recommended_block_size::<f64>(d, k);
    let mut coeff = Mat::<f64>::zeros(block, size);
    qr_in_place(
        factors.as_mut(),
        coeff.as_mut(),
        par,
        MemStack::new(&mut MemBuffer::new(qr_in_place_scratch::<f64>(
            d,
            k,
            block,
            par,
            Default::default(),
        ))),
        Default::default(),
    );
    memtrace::mark("svd orth: QR factors");
    let mut q = Mat::<f64>::identity(d, size);
    apply_block_householder_sequence_on_the_left_in_place_with_conj(
        factors.as_ref(),
        coeff.as_ref(),
        faer::Conj::No,
        q.as_mut(),
        par,
        MemStack::new(&mut MemBuffer::new(
            apply_block_householder_sequence_on_the_left_in_place_scratch::<f64>(d, block, size),
        )),
    );
    drop(factors);
    q
}

/// Randomised truncated SVD of the rows of `src`; `on_pass(i, total)` is called before each
/// pass (progress reporting; its error, such as a stop request, ends the svd there).
pub fn randomized_svd(
    src: &dyn RowSource,
    cfg: &SvdConfig,
    on_pass: &mut dyn FnMut(usize, usize) -> Result<()>,
) -> Result<SvdResult> {
    randomized_svd_on(src, &Single, cfg, on_pass)
}

/// [`randomized_svd`] over the ranks of `comm`, each rank's `src` holding its share of the
/// rows: every pass sums the ranks' partial products, the small factorisations run on
/// every rank from the same sums, and rank 0's basis and singular values are broadcast at
/// the end so that every rank holds the same bits (a rank's own would differ at most in
/// the last place, should the sums arrive with different rounding).
pub fn randomized_svd_on(
    src: &dyn RowSource,
    comm: &dyn Comm,
    cfg: &SvdConfig,
    on_pass: &mut dyn FnMut(usize, usize) -> Result<()>,
) -> Result<SvdResult> {
    let mut svd = randomized_svd_passes(src, comm, cfg, on_pass)?;
    if comm.size() > 1 {
        for j in 0..svd.basis_t.ncols() {
            comm.broadcast(svd.basis_t.col_as_slice_mut(j))?;
        }
        comm.broadcast(&mut svd.singular_values)?;
    }
    Ok(svd)
}

/// The passes and factorisations of [`randomized_svd_on`].
fn randomized_svd_passes(
    src: &dyn RowSource,
    comm: &dyn Comm,
    cfg: &SvdConfig,
    on_pass: &mut dyn FnMut(usize, usize) -> Result<()>,
) -> Result<SvdResult> {
    let d = src.n_cols();
    let n = if comm.size() > 1 {
        // N over the ranks (exact: row counts are far below 2⁵³).
        let mut n = [src.n_rows() as f64];
        comm.sum_all(&mut n)?;
        n[0] as u64
    } else {
        src.n_rows()
    };
    if cfg.rank == 0 {
        bail!("--rank must be at least 1");
    }
    if cfg.rank as u64 > n || cfg.rank > d {
        bail!("--rank {} exceeds min(N, D) = min({n}, {d})", cfg.rank);
    }
    if cfg.power_iters > MAX_POWER_ITERS {
        bail!(
            "--power-iters {} exceeds {MAX_POWER_ITERS}: each is a pass over the data",
            cfg.power_iters
        );
    }
    // R + p beyond D is D: the sketch cannot have more independent columns than D.
    let k = cfg.rank.saturating_add(cfg.oversample).min(d);
    let total = cfg.power_iters + 2;
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let omega = Panels::from_mat(
        Mat::<f64>::from_fn(d, k, |_, _| StandardNormal.sample(&mut rng)).as_ref(),
    );
    let mut pass_seconds = Vec::with_capacity(total);
    let mut timed_pass = |i: usize, q: &Panels| -> Result<Panels> {
        on_pass(i, total)?;
        let t = Instant::now();
        let b = gram_pass(src, comm, q)?;
        memtrace::mark(&format!("svd pass {}", i + 1));
        pass_seconds.push(t.elapsed().as_secs_f64());
        Ok(b)
    };
    let mut b = timed_pass(0, &omega)?;
    drop(omega);
    for i in 0..=cfg.power_iters {
        let q = orthonormalise(b);
        b = timed_pass(i + 1, &q)?;
        if i == cfg.power_iters {
            return rayleigh_ritz(q, b, cfg.rank, pass_seconds);
        }
    }
    unreachable!("the loop returns on its last iteration")
}

/// Top-R eigenpairs of G = Qᵀ(XᵀX Q) lifted back to D dimensions.
fn rayleigh_ritz(q: Panels, b: Panels, rank: usize, pass_seconds: Vec<f64>) -> Result<SvdResult> {
    // G = Qᵀ B and later Q V_R, both from the panels in blocks of rows: no third D×k matrix
    // and no tall GEMM.
    let g = q.cross(&b);
    drop(b);
    memtrace::mark("svd Rayleigh-Ritz: G");
    let g = Mat::from_fn(g.nrows(), g.ncols(), |i, j| 0.5 * (g[(i, j)] + g[(j, i)]));
    let eig = g
        .self_adjoint_eigen(Side::Lower)
        .ok()
        .context("eigendecomposition of the k×k Gram matrix did not converge")?;
    let k = g.nrows();
    // Eigenvalues come in non-decreasing order: the top R are the last R, reversed.
    let order: Vec<usize> = (k - rank..k).rev().collect();
    let v_top = Mat::from_fn(k, rank, |i, r| eig.U()[(i, order[r])]);
    let singular_values = order.iter().map(|&i| eig.S()[i].max(0.0).sqrt()).collect();
    let basis_t = q.times(v_top.as_ref());
    drop(q);
    Ok(SvdResult {
        basis_t,
        singular_values,
        pass_seconds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ‖QᵀQ − I‖_max and ‖B − Q QᵀB‖_max / ‖B‖_max for panels Q and a dense B.
    fn errors(q: &Panels, b: &Mat<f64>) -> (f64, f64) {
        let qm = q.to_mat();
        let k = qm.ncols();
        let qtq = qm.transpose() * &qm;
        let orth = (0..k)
            .flat_map(|i| (0..k).map(move |j| (i, j)))
            .map(|(i, j)| (qtq[(i, j)] - if i == j { 1.0 } else { 0.0 }).abs())
            .fold(0.0, f64::max);
        let resid = b - &qm * (qm.transpose() * b);
        (orth, resid.norm_max() / b.norm_max())
    }

    fn random(rows: usize, cols: usize, seed: u64) -> Mat<f64> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        Mat::from_fn(rows, cols, |_, _| StandardNormal.sample(&mut rng))
    }

    #[test]
    fn cholesky_qr2_orthonormalises_a_well_conditioned_block() {
        // 20 000 rows spread over two row groups, 37 columns (a ragged last panel); columns
        // scaled over four orders of magnitude.
        let mut b = random(20_000, 37, 1);
        for j in 0..37 {
            let s = 10f64.powf(-4.0 * j as f64 / 36.0);
            for i in 0..b.nrows() {
                b[(i, j)] *= s;
            }
        }
        let mut p = Panels::from_mat(b.as_ref());
        assert!(cholesky_qr_step(&mut p) && cholesky_qr_step(&mut p));
        let (orth, resid) = errors(&p, &b);
        assert!(orth < 1e-13, "‖QᵀQ − I‖ = {orth:e}");
        assert!(resid < 1e-12, "span residual {resid:e}");
    }

    #[test]
    fn rank_deficient_block_falls_back_to_householder() {
        // Column 5 repeats column 2: B is singular, CholeskyQR must refuse it, and the
        // Householder path must still return an orthonormal basis of the column space.
        let mut b = random(3000, 20, 2);
        for i in 0..b.nrows() {
            b[(i, 5)] = b[(i, 2)];
        }
        let mut p = Panels::from_mat(b.as_ref());
        assert!(
            !cholesky_qr_step(&mut p),
            "a singular Gram matrix was accepted"
        );
        assert_eq!(p.to_mat(), b, "a refused step must leave B unchanged");
        let q = orthonormalise(p);
        let (orth, resid) = errors(&q, &b);
        assert!(orth < 1e-13, "‖QᵀQ − I‖ = {orth:e}");
        assert!(resid < 1e-12, "span residual {resid:e}");
    }

    #[test]
    fn row_block_products_match_dense() {
        let (b, c, v) = (
            random(17_000, 21, 3),
            random(17_000, 9, 4),
            random(21, 6, 5),
        );
        let (pb, pc) = (Panels::from_mat(b.as_ref()), Panels::from_mat(c.as_ref()));
        let cross = pb.cross(&pc);
        let times = pb.times(v.as_ref());
        let d1 = (&cross - b.transpose() * &c).norm_max();
        let d2 = (&times - &b * &v).norm_max();
        assert!(d1 < 1e-9 && d2 < 1e-12, "cross {d1:e}, times {d2:e}");
    }
}
