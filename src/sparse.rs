//! Sparse × dense compute kernels over CSR chunks, multi-threaded: the SVD's Gram products
//! Xᵀ(X Q) and the projection of rows onto the basis, used by svd and predict.
//!
//! Dense D×k operands of the SVD are stored in *column panels*: panel p holds columns
//! `p·W .. min((p+1)·W, k)` as a contiguous row-major D×w block. A panel of the result
//! depends only on the same panel of the input, so threads own disjoint panels: no locks,
//! no per-thread D×k accumulators (memory stays 2·D·k·8 bytes), and results do not depend
//! on the thread count. A panel row is W·8 = 128 bytes (two cache lines); the Gram kernel
//! walks a panel in feature order (see [`accumulate_gram_times`]).
//!
//! Both products stay hand-written although chunks have a zero-copy sprs view
//! ([`CsrChunk::csr_view`]): sprs's projection gives the same bits but is slower, and its
//! Xᵀ(X Q) is 1.8–2.9× slower and sums B's entries in another order, so its bits differ
//! (`BENCHMARKS.md`, "Sparse kernels: sprs against the hand-written ones").

use faer::{Mat, MatRef};
use ndarray::{ArrayView2, ArrayViewMut2};
use rayon::prelude::*;

use crate::store::chunks::CsrChunk;

/// Panel width in columns.
pub const PANEL: usize = 16;

/// A rows×cols f64 matrix stored as column panels (see the module docs), each panel its
/// own allocation so that a conversion can free the panels as it goes.
#[derive(Debug, Clone, PartialEq)]
pub struct Panels {
    pub rows: usize,
    pub cols: usize,
    /// Panel p: row-major rows × width(p).
    data: Vec<Vec<f64>>,
}

impl Panels {
    pub fn zeros(rows: usize, cols: usize) -> Self {
        let data = (0..cols.div_ceil(PANEL))
            .map(|p| vec![0.0; rows * PANEL.min(cols - p * PANEL)])
            .collect();
        Panels { rows, cols, data }
    }

    fn width(&self, p: usize) -> usize {
        PANEL.min(self.cols - p * PANEL)
    }

    pub fn get(&self, i: usize, j: usize) -> f64 {
        let p = j / PANEL;
        self.data[p][i * self.width(p) + j % PANEL]
    }

    pub fn from_mat(m: MatRef<'_, f64>) -> Self {
        let mut out = Panels::zeros(m.nrows(), m.ncols());
        let rows = out.rows;
        for p in 0..out.data.len() {
            let w = out.width(p);
            let panel = &mut out.data[p];
            for i in 0..rows {
                for c in 0..w {
                    panel[i * w + c] = m[(i, p * PANEL + c)];
                }
            }
        }
        out
    }

    /// Every panel's storage, mutably (for element-wise collectives such as a sum over
    /// ranks; the layout is the same on every process with the same shape).
    pub fn storage_mut(&mut self) -> impl Iterator<Item = &mut [f64]> {
        self.data.iter_mut().map(|p| p.as_mut_slice())
    }

    pub fn to_mat(&self) -> Mat<f64> {
        Mat::from_fn(self.rows, self.cols, |i, j| self.get(i, j))
    }

    /// The dense matrix, freeing each panel once copied: the two representations together
    /// never hold more than one matrix plus one panel.
    pub fn into_mat(self) -> Mat<f64> {
        let mut m = Mat::<f64>::zeros(self.rows, self.cols);
        let (rows, cols) = (self.rows, self.cols);
        for (p, panel) in self.data.into_iter().enumerate() {
            let w = PANEL.min(cols - p * PANEL);
            for c in 0..w {
                let col = m.col_mut(p * PANEL + c);
                for (i, x) in col.iter_mut().enumerate() {
                    *x = panel[i * w + c];
                }
            }
            debug_assert_eq!(panel.len(), rows * w);
        }
        m
    }

    /// (panel data, width) for every panel.
    fn panels(&self) -> Vec<(&[f64], usize)> {
        self.data
            .iter()
            .enumerate()
            .map(|(p, d)| (&d[..], self.width(p)))
            .collect()
    }

    fn panels_mut(&mut self) -> Vec<(&mut [f64], usize)> {
        let cols = self.cols;
        self.data
            .iter_mut()
            .enumerate()
            .map(|(p, d)| (&mut d[..], PANEL.min(cols - p * PANEL)))
            .collect()
    }
}

/// Rows per fixed group of [`Panels::gram`] and [`Panels::solve_upper_right`]: the groups
/// run in parallel, each its rows in blocks of [`ROW_BLOCK`], and the groups' partial Gram
/// matrices are summed in group order, so the result does not depend on the thread count.
const ROW_GROUP: usize = 16 * 1024;
/// Rows gathered at a time into a dense k × rows block (k·1024·8 bytes, 8 MiB at k = 1020).
const ROW_BLOCK: usize = 1024;

impl Panels {
    /// Rows `start..end` gathered into `dst` [cols × (end − start)], column j = row start + j.
    fn gather_rows(&self, start: usize, end: usize, mut dst: faer::MatMut<'_, f64>) {
        for (p, (data, w)) in self.panels().into_iter().enumerate() {
            for (j, i) in (start..end).enumerate() {
                let row = &data[i * w..(i + 1) * w];
                for (c, &x) in row.iter().enumerate() {
                    dst[(p * PANEL + c, j)] = x;
                }
            }
        }
    }

    /// Bᵀ C [cols × other.cols] for this matrix B and another C of the same rows, read in
    /// blocks of rows (no D×k temporary; the products are k × k × 1024, so no large packing
    /// buffers either). 2·rows·cols·other.cols flops.
    pub fn cross(&self, other: &Panels) -> Mat<f64> {
        assert_eq!(self.rows, other.rows);
        let (k, m) = (self.cols, other.cols);
        let groups = self.rows.div_ceil(ROW_GROUP);
        let partial: Vec<Mat<f64>> = (0..groups)
            .into_par_iter()
            .map(|g| {
                let (lo, hi) = (g * ROW_GROUP, ((g + 1) * ROW_GROUP).min(self.rows));
                let mut acc = Mat::<f64>::zeros(k, m);
                let mut mine = Mat::<f64>::zeros(k, ROW_BLOCK);
                let mut theirs = Mat::<f64>::zeros(m, ROW_BLOCK);
                let mut start = lo;
                while start < hi {
                    let end = (start + ROW_BLOCK).min(hi);
                    let n = end - start;
                    self.gather_rows(start, end, mine.as_mut().subcols_mut(0, n));
                    other.gather_rows(start, end, theirs.as_mut().subcols_mut(0, n));
                    faer::linalg::matmul::matmul(
                        acc.as_mut(),
                        faer::Accum::Add,
                        mine.as_ref().subcols(0, n),
                        theirs.as_ref().subcols(0, n).transpose(),
                        1.0,
                        faer::Par::Seq,
                    );
                    start = end;
                }
                acc
            })
            .collect();
        let mut out = Mat::<f64>::zeros(k, m);
        for part in &partial {
            out += part;
        }
        out
    }

    /// B V [rows × v.ncols()] for a small V [cols × n], in blocks of rows.
    pub fn times(&self, v: MatRef<'_, f64>) -> Mat<f64> {
        assert_eq!(v.nrows(), self.cols);
        let (k, n_out) = (self.cols, v.ncols());
        let mut out = Mat::<f64>::zeros(self.rows, n_out);
        let stride = out.col_stride();
        let base = SendPtr(out.as_ptr_mut());
        let groups = self.rows.div_ceil(ROW_GROUP);
        (0..groups).into_par_iter().for_each(|g| {
            let (lo, hi) = (g * ROW_GROUP, ((g + 1) * ROW_GROUP).min(self.rows));
            let mut mine = Mat::<f64>::zeros(k, ROW_BLOCK);
            let mut prod = Mat::<f64>::zeros(n_out, ROW_BLOCK);
            let mut start = lo;
            while start < hi {
                let end = (start + ROW_BLOCK).min(hi);
                let n = end - start;
                self.gather_rows(start, end, mine.as_mut().subcols_mut(0, n));
                // (B_rows V)ᵀ = Vᵀ B_rowsᵀ [n_out × n].
                faer::linalg::matmul::matmul(
                    prod.as_mut().subcols_mut(0, n),
                    faer::Accum::Replace,
                    v.transpose(),
                    mine.as_ref().subcols(0, n),
                    1.0,
                    faer::Par::Seq,
                );
                for c in 0..n_out {
                    for j in 0..n {
                        // SAFETY: row start + j of `out`, written by this group only.
                        unsafe {
                            *base.at((start + j) as isize + c as isize * stride) = prod[(c, j)]
                        };
                    }
                }
                start = end;
            }
        });
        out
    }

    /// B ← B L⁻ᵀ in place for a lower triangular L [cols × cols] (i.e. B R⁻¹ with R = Lᵀ),
    /// row block by row block: each block's rows are gathered, solved with L and scattered
    /// back. rows·cols² flops.
    pub fn solve_upper_right(&mut self, l: MatRef<'_, f64>) {
        let k = self.cols;
        let rows = self.rows;
        let groups = rows.div_ceil(ROW_GROUP);
        // Each group writes only its own rows of every panel.
        let widths: Vec<usize> = (0..self.data.len()).map(|p| self.width(p)).collect();
        let ptrs: Vec<SendPtr> = self
            .data
            .iter_mut()
            .map(|d| SendPtr(d.as_mut_ptr()))
            .collect();
        (0..groups).into_par_iter().for_each(|g| {
            let (lo, hi) = (g * ROW_GROUP, ((g + 1) * ROW_GROUP).min(rows));
            let mut block = Mat::<f64>::zeros(k, ROW_BLOCK);
            let mut start = lo;
            while start < hi {
                let end = (start + ROW_BLOCK).min(hi);
                let n = end - start;
                let mut blk = block.as_mut().subcols_mut(0, n);
                for (p, (&w, ptr)) in widths.iter().zip(&ptrs).enumerate() {
                    // SAFETY: rows start..end of panel p, written by no other group.
                    let src = unsafe { std::slice::from_raw_parts(ptr.0.add(start * w), n * w) };
                    for j in 0..n {
                        for c in 0..w {
                            blk[(p * PANEL + c, j)] = src[j * w + c];
                        }
                    }
                }
                faer::linalg::triangular_solve::solve_lower_triangular_in_place(
                    l,
                    blk.as_mut(),
                    faer::Par::Seq,
                );
                for (p, (&w, ptr)) in widths.iter().zip(&ptrs).enumerate() {
                    // SAFETY: as above; the rows are disjoint between groups.
                    let dst =
                        unsafe { std::slice::from_raw_parts_mut(ptr.0.add(start * w), n * w) };
                    for j in 0..n {
                        for c in 0..w {
                            dst[j * w + c] = blk[(p * PANEL + c, j)];
                        }
                    }
                }
                start = end;
            }
        });
    }
}

/// A panel's base pointer, shared by the row groups of [`Panels::solve_upper_right`], which
/// write disjoint rows.
#[derive(Clone, Copy)]
struct SendPtr(*mut f64);
// SAFETY: used only for disjoint row ranges (see `solve_upper_right`).
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// The pointer moved by `offset` elements.
    ///
    /// # Safety
    /// As for `pointer::offset`.
    unsafe fn at(self, offset: isize) -> *mut f64 {
        self.0.offset(offset)
    }
}

/// Rows per block of the Gram kernel: a block's Y panel (rows × [`PANEL`] f64, 6 MiB)
/// stays in cache while the block is processed.
const GRAM_BLOCK_ROWS: usize = 48 * 1024;

/// One block of rows of a chunk in compressed-column form: the features present, in
/// increasing order, each with the (block-local row, value) pairs that use it.
struct CscBlock {
    /// Feature ids present in the block, increasing.
    cols: Vec<u32>,
    /// `ptr[c]..ptr[c + 1]` indexes `rows`/`vals` for feature `cols[c]`.
    ptr: Vec<u32>,
    /// Block-local row of each entry, increasing within a feature.
    rows: Vec<u32>,
    vals: Vec<f64>,
}

impl CscBlock {
    /// Counting sort of the block's entries by feature; `counts` is D zeros on entry and
    /// on return (a buffer reused across blocks so that nothing D-sized is allocated per
    /// block).
    fn build(chunk: &CsrChunk, rows: std::ops::Range<usize>, counts: &mut [u32]) -> Self {
        let (f0, f1) = (
            chunk.feature_offsets[rows.start] as usize,
            chunk.feature_offsets[rows.end] as usize,
        );
        let entries = &chunk.indices[f0..f1];
        for &j in entries {
            counts[j as usize] += 1;
        }
        let mut cols = Vec::new();
        let mut ptr = vec![0u32];
        for (j, count) in counts.iter_mut().enumerate() {
            if *count > 0 {
                cols.push(j as u32);
                let start = *ptr.last().unwrap();
                ptr.push(start + *count);
                // From here on `counts[j]` is the next free slot of feature j.
                *count = start;
            }
        }
        let nnz = entries.len();
        let (mut out_rows, mut vals) = (vec![0u32; nnz], vec![0f64; nnz]);
        for (local, i) in rows.clone().enumerate() {
            let row = chunk.row(i);
            for (&j, &v) in row.indices.iter().zip(row.values) {
                let slot = &mut counts[j as usize];
                out_rows[*slot as usize] = local as u32;
                vals[*slot as usize] = f64::from(v);
                *slot += 1;
            }
        }
        for &j in &cols {
            counts[j as usize] = 0;
        }
        CscBlock {
            cols,
            ptr,
            rows: out_rows,
            vals,
        }
    }

    fn entries(&self, c: usize) -> std::ops::Range<usize> {
        self.ptr[c] as usize..self.ptr[c + 1] as usize
    }
}

/// B += X_cᵀ (X_c Q) for one chunk X_c (n_c × D), with Q and B D×k in panels.
///
/// Why compressed columns: with D in the hundreds of thousands a Q panel (D × 128 bytes)
/// does not fit in cache, and gathering a random Q row for every non-zero is bound by
/// memory latency. Sorting a block of rows by feature turns the reads of Q and the
/// updates of B into forward streams (each present feature's panel row touched once per
/// block), while the random accesses go to the block's Y = X_b Q panel, which is small
/// enough to stay in cache.
///
/// Flops: 4·nnz(X_c)·k.
pub fn accumulate_gram_times(chunk: &CsrChunk, q: &Panels, b: &mut Panels) {
    accumulate_gram_times_in_blocks(chunk, q, b, GRAM_BLOCK_ROWS)
}

fn accumulate_gram_times_in_blocks(
    chunk: &CsrChunk,
    q: &Panels,
    b: &mut Panels,
    block_rows: usize,
) {
    assert_eq!((q.rows, q.cols), (b.rows, b.cols));
    let q_panels = q.panels();
    let mut b_panels = b.panels_mut();
    let mut counts = vec![0u32; q.rows];
    let mut start = 0;
    while start < chunk.len() {
        let end = (start + block_rows).min(chunk.len());
        let block = CscBlock::build(chunk, start..end, &mut counts);
        let n_rows = end - start;
        b_panels
            .par_iter_mut()
            .zip(q_panels.par_iter())
            .for_each_init(Vec::new, |y, ((b_panel, w), (q_panel, _))| {
                if *w == PANEL {
                    gram_panel::<PANEL>(&block, n_rows, q_panel, b_panel, y)
                } else {
                    gram_panel_ragged(&block, n_rows, q_panel, b_panel, *w, y)
                }
            });
        start = end;
    }
}

/// One full-width panel: Y = X_b Q[:, panel] (scatter in feature order), then
/// B[:, panel] += X_bᵀ Y (gather in feature order). Each B entry is updated by the one task
/// that owns its panel, in block order: the result does not depend on the thread count.
fn gram_panel<const W: usize>(
    block: &CscBlock,
    n_rows: usize,
    q: &[f64],
    b: &mut [f64],
    y: &mut Vec<f64>,
) {
    y.clear();
    y.resize(n_rows * W, 0.0);
    for (c, &j) in block.cols.iter().enumerate() {
        let q_row: &[f64; W] = row_of(q, j as usize);
        for e in block.entries(c) {
            let v = block.vals[e];
            let y_row: &mut [f64; W] = row_of_mut(y, block.rows[e] as usize);
            for t in 0..W {
                y_row[t] += v * q_row[t];
            }
        }
    }
    for (c, &j) in block.cols.iter().enumerate() {
        let mut acc = [0.0f64; W];
        for e in block.entries(c) {
            let v = block.vals[e];
            let y_row: &[f64; W] = row_of(y, block.rows[e] as usize);
            for t in 0..W {
                acc[t] += v * y_row[t];
            }
        }
        let b_row: &mut [f64; W] = row_of_mut(b, j as usize);
        for t in 0..W {
            b_row[t] += acc[t];
        }
    }
}

/// The last, narrower panel (k not a multiple of [`PANEL`]): same as [`gram_panel`].
fn gram_panel_ragged(
    block: &CscBlock,
    n_rows: usize,
    q: &[f64],
    b: &mut [f64],
    w: usize,
    y: &mut Vec<f64>,
) {
    y.clear();
    y.resize(n_rows * w, 0.0);
    for (c, &j) in block.cols.iter().enumerate() {
        let q_row = &q[j as usize * w..(j as usize + 1) * w];
        for e in block.entries(c) {
            let v = block.vals[e];
            let i = block.rows[e] as usize;
            for (yc, &qc) in y[i * w..(i + 1) * w].iter_mut().zip(q_row) {
                *yc += v * qc;
            }
        }
    }
    let mut acc = vec![0.0f64; w];
    for (c, &j) in block.cols.iter().enumerate() {
        acc.fill(0.0);
        for e in block.entries(c) {
            let v = block.vals[e];
            let i = block.rows[e] as usize;
            for (a, &yc) in acc.iter_mut().zip(&y[i * w..(i + 1) * w]) {
                *a += v * yc;
            }
        }
        for (bc, &a) in b[j as usize * w..(j as usize + 1) * w].iter_mut().zip(&acc) {
            *bc += a;
        }
    }
}

/// Row i of a row-major slice of W-wide rows, as a fixed-size array (lets the compiler
/// keep a whole panel row in registers).
#[inline(always)]
fn row_of<const W: usize>(s: &[f64], i: usize) -> &[f64; W] {
    s[i * W..(i + 1) * W].try_into().expect("W-wide row")
}

#[inline(always)]
fn row_of_mut<const W: usize>(s: &mut [f64], i: usize) -> &mut [f64; W] {
    (&mut s[i * W..(i + 1) * W]).try_into().expect("W-wide row")
}

/// out = X_c Bᵀ-projection: row i of `out` (n_c × R) is x_i · basis_t, where `basis_t` is
/// D×R (the transposed basis X̃ᵀ). Rows are independent: parallel over blocks of rows.
///
/// Hand-written rather than sprs's `csr_mulacc_dense_rowmaj` over the chunk's
/// [`CsrChunk::csr_view`]: sprs gives the same bits (it sums each row in stored order too)
/// but takes up to 1.2× the time on one thread and gains nothing from a second
/// (`BENCHMARKS.md`, "Sparse kernels: sprs against the hand-written ones").
///
/// Flops: 2·nnz(X_c)·R.
pub fn project_chunk(
    chunk: &CsrChunk,
    basis_t: ArrayView2<'_, f32>,
    mut out: ArrayViewMut2<'_, f32>,
) {
    assert_eq!(out.nrows(), chunk.len());
    assert_eq!(out.ncols(), basis_t.ncols());
    let basis = basis_t
        .as_slice()
        .expect("basis_t must be contiguous row-major");
    let r = basis_t.ncols();
    const BLOCK: usize = 256;
    let out = out
        .as_slice_mut()
        .expect("output block must be contiguous row-major");
    out.par_chunks_mut(BLOCK * r)
        .enumerate()
        .for_each(|(blk, out_block)| {
            for (local, acc) in out_block.chunks_mut(r).enumerate() {
                let row = chunk.row(blk * BLOCK + local);
                acc.fill(0.0);
                for (&j, &v) in row.indices.iter().zip(row.values) {
                    let b_row = &basis[j as usize * r..(j as usize + 1) * r];
                    for (a, &bv) in acc.iter_mut().zip(b_row) {
                        *a += v * bv;
                    }
                }
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::chunks::RowRef;

    fn chunk() -> CsrChunk {
        let mut c = CsrChunk::default();
        let rows: [(&[u32], &[f32]); 3] = [
            (&[0, 2], &[1.0, 2.0]),
            (&[], &[]),
            (&[1, 2, 4], &[-1.0, 0.5, 3.0]),
        ];
        for (i, (idx, val)) in rows.iter().enumerate() {
            c.push_row(RowRef {
                row_id: i as u64,
                labels: &[],
                indices: idx,
                values: val,
                sq_norm: 0.0,
            });
        }
        c
    }

    fn dense(c: &CsrChunk, d: usize) -> Mat<f64> {
        let mut x = Mat::<f64>::zeros(c.len(), d);
        for i in 0..c.len() {
            let r = c.row(i);
            for (&j, &v) in r.indices.iter().zip(r.values) {
                x[(i, j as usize)] = f64::from(v);
            }
        }
        x
    }

    #[test]
    fn gram_times_matches_dense_for_ragged_panels() {
        let c = chunk();
        let k = PANEL + 7; // a full panel and a narrow one
        let q = Mat::<f64>::from_fn(5, k, |i, j| ((i * 31 + j * 7) % 13) as f64 - 6.0);
        let mut b = Panels::zeros(5, k);
        accumulate_gram_times(&c, &Panels::from_mat(q.as_ref()), &mut b);
        accumulate_gram_times(&c, &Panels::from_mat(q.as_ref()), &mut b);
        let x = dense(&c, 5);
        let expected = (x.transpose() * (&x * &q)) * 2.0;
        let got = b.to_mat();
        assert!((got - &expected).norm_max() < 1e-12);
        // Blocks of 2 rows (the second block holds one row): same sums.
        let mut blocked = Panels::zeros(5, k);
        for _ in 0..2 {
            accumulate_gram_times_in_blocks(&c, &Panels::from_mat(q.as_ref()), &mut blocked, 2);
        }
        assert!((blocked.to_mat() - &expected).norm_max() < 1e-12);
    }

    #[test]
    fn projection_matches_dense() {
        let c = chunk();
        let basis_t = ndarray::Array2::from_shape_fn((5, 3), |(i, j)| (i as f32) * 0.5 - j as f32);
        let mut out = ndarray::Array2::<f32>::zeros((3, 3));
        project_chunk(&c, basis_t.view(), out.view_mut());
        let x = dense(&c, 5);
        for i in 0..3 {
            for j in 0..3 {
                let e: f64 = (0..5).map(|d| x[(i, d)] * f64::from(basis_t[[d, j]])).sum();
                assert!((f64::from(out[[i, j]]) - e).abs() < 1e-6);
            }
        }
    }
}
