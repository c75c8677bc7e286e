//! Rows projected onto a training basis: X X̃ᵀ for the rows of a split, and the basis Gram
//! K_X̃ = X̃X̃ᵀ. The svd stage writes the training rows' projection (K_XX̃); prediction and
//! the trainer's held-out ranking project other splits the same way.

use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Result};
use faer::Mat;
use ndarray::{Array2, ArrayView2};

use crate::sparse::project_chunk;
use crate::store::chunks::{read_chunk, CsrChunk, WrittenFile};
use crate::store::npy::{NpyMap, NpyRowWriter};

/// K_X̃ = X̃X̃ᵀ [R×R] from `basis.npy` [R×D] (mapped), accumulated over blocks of columns
/// so the f64 copy never exceeds a few tens of MiB whatever D is.
pub fn basis_gram(map: &NpyMap) -> Result<Mat<f64>> {
    let basis = map.view2::<f32>()?;
    let (r, d) = basis.dim();
    let block = (4 << 20) / r.max(1);
    let mut gram = Mat::<f64>::zeros(r, r);
    let mut start = 0;
    while start < d {
        let end = (start + block.max(1)).min(d);
        let x = Mat::<f64>::from_fn(r, end - start, |i, j| basis[(i, start + j)] as f64);
        gram += &x * x.transpose();
        start = end;
    }
    Ok(gram)
}

/// X̃ᵀ [D×R] of `basis.npy` [R×D], contiguous for the sparse × dense projection; checked to
/// have `n_features` columns.
pub fn load_basis_t(map: &NpyMap, n_features: u64) -> Result<Array2<f32>> {
    let basis = map.view2::<f32>()?;
    ensure!(
        basis.ncols() as u64 == n_features,
        "{}: basis has {} columns, the dataset {n_features} features",
        map.path().display(),
        basis.ncols()
    );
    Ok(basis.t().as_standard_layout().into_owned())
}

/// The rows of `chunk` projected onto the basis: x_i X̃ᵀ [rows×R], f32.
pub fn project_rows(chunk: &CsrChunk, basis_t: ArrayView2<'_, f32>) -> Array2<f32> {
    let mut projected = Array2::<f32>::zeros((chunk.len(), basis_t.ncols()));
    project_chunk(chunk, basis_t, projected.view_mut());
    projected
}

/// Projects every row of a split onto a basis, chunk by chunk: writes `out` (n×R f32 .npy)
/// with row i = x_i X̃ᵀ. `basis` is R×D as stored in `basis.npy`.
pub fn project_split(
    files: &[PathBuf],
    n_rows: usize,
    basis: ArrayView2<'_, f32>,
    out: &Path,
) -> Result<WrittenFile> {
    let basis_t = basis.t().as_standard_layout().into_owned();
    let mut writer = NpyRowWriter::create(out, n_rows, basis.nrows())?;
    let mut row = 0usize;
    for path in files {
        let chunk = read_chunk(path)?;
        if row + chunk.len() > n_rows {
            bail!("{}: more rows than the {n_rows} expected", path.display());
        }
        let mut view = writer.view_mut()?;
        project_chunk(
            &chunk,
            basis_t.view(),
            view.slice_mut(ndarray::s![row..row + chunk.len(), ..]),
        );
        row += chunk.len();
    }
    if row != n_rows {
        bail!("projected {row} rows, expected {n_rows}");
    }
    writer.finish()
}
