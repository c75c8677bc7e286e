//! Multi-threaded sparse × dense kernels over CSR chunks.
//!
//! Dense D×k operands of the SVD are stored in *column panels*: panel p holds columns
//! `p·W .. min((p+1)·W, k)` as a contiguous row-major D×w block. A panel of the result
//! depends only on the same panel of the input, so threads own disjoint panels: no locks,
//! no per-thread D×k accumulators (memory stays 2·D·k·8 bytes), and results do not depend
//! on the thread count. A panel row is W·8 = 512 bytes, so every gathered row of Q is a few
//! whole cache lines and a panel (D·512 bytes) tends to stay in cache across a chunk.

use faer::{Mat, MatRef};
use ndarray::{ArrayView2, ArrayViewMut2};
use rayon::prelude::*;

use crate::store::chunks::CsrChunk;

/// Panel width in columns.
pub const PANEL: usize = 64;

/// A rows×cols f64 matrix stored as column panels (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct Panels {
    pub rows: usize,
    pub cols: usize,
    data: Vec<f64>,
}

impl Panels {
    pub fn zeros(rows: usize, cols: usize) -> Self {
        Panels {
            rows,
            cols,
            data: vec![0.0; rows * cols],
        }
    }

    fn n_panels(&self) -> usize {
        self.cols.div_ceil(PANEL)
    }

    fn width(&self, p: usize) -> usize {
        PANEL.min(self.cols - p * PANEL)
    }

    /// Offset of panel p: all earlier panels are full width.
    fn offset(&self, p: usize) -> usize {
        self.rows * p * PANEL
    }

    pub fn get(&self, i: usize, j: usize) -> f64 {
        let p = j / PANEL;
        self.data[self.offset(p) + i * self.width(p) + j % PANEL]
    }

    pub fn from_mat(m: MatRef<'_, f64>) -> Self {
        let mut out = Panels::zeros(m.nrows(), m.ncols());
        let rows = out.rows;
        for p in 0..out.n_panels() {
            let (off, w) = (out.offset(p), out.width(p));
            for i in 0..rows {
                for c in 0..w {
                    out.data[off + i * w + c] = m[(i, p * PANEL + c)];
                }
            }
        }
        out
    }

    pub fn to_mat(&self) -> Mat<f64> {
        Mat::from_fn(self.rows, self.cols, |i, j| self.get(i, j))
    }

    /// (panel data, width) for every panel.
    fn panels(&self) -> Vec<(&[f64], usize)> {
        let mut rest = &self.data[..];
        (0..self.n_panels())
            .map(|p| {
                let w = self.width(p);
                let (head, tail) = rest.split_at(self.rows * w);
                rest = tail;
                (head, w)
            })
            .collect()
    }

    fn panels_mut(&mut self) -> Vec<(&mut [f64], usize)> {
        let widths: Vec<usize> = (0..self.n_panels()).map(|p| self.width(p)).collect();
        let rows = self.rows;
        let mut rest = &mut self.data[..];
        widths
            .into_iter()
            .map(|w| {
                let (head, tail) = std::mem::take(&mut rest).split_at_mut(rows * w);
                rest = tail;
                (head, w)
            })
            .collect()
    }
}

/// B += X_cᵀ (X_c Q) for one chunk X_c (n_c × D), with Q and B D×k in panels.
///
/// Flops: 4·nnz(X_c)·k.
pub fn accumulate_gram_times(chunk: &CsrChunk, q: &Panels, b: &mut Panels) {
    assert_eq!((q.rows, q.cols), (b.rows, b.cols));
    let q_panels = q.panels();
    b.panels_mut()
        .into_par_iter()
        .zip(q_panels.into_par_iter())
        .for_each(|((b_panel, w), (q_panel, _))| gram_panel(chunk, q_panel, b_panel, w));
}

fn gram_panel(chunk: &CsrChunk, q: &[f64], b: &mut [f64], w: usize) {
    let mut y = [0.0f64; PANEL];
    let y = &mut y[..w];
    for i in 0..chunk.len() {
        let row = chunk.row(i);
        y.fill(0.0);
        // y = x_i Q[:, panel]
        for (&j, &v) in row.indices.iter().zip(row.values) {
            let v = f64::from(v);
            let q_row = &q[j as usize * w..(j as usize + 1) * w];
            for (yc, &qc) in y.iter_mut().zip(q_row) {
                *yc += v * qc;
            }
        }
        // B[:, panel] += x_iᵀ y
        for (&j, &v) in row.indices.iter().zip(row.values) {
            let v = f64::from(v);
            let b_row = &mut b[j as usize * w..(j as usize + 1) * w];
            for (bc, &yc) in b_row.iter_mut().zip(y.iter()) {
                *bc += v * yc;
            }
        }
    }
}

/// out = X_c Bᵀ-projection: row i of `out` (n_c × R) is x_i · basis_t, where `basis_t` is
/// D×R (the transposed basis X̃ᵀ). Rows are independent: parallel over blocks of rows.
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
        assert!((got - expected).norm_max() < 1e-12);
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
