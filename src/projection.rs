//! Rows projected onto a training basis: X X̃ᵀ for the rows of a split, and the basis Gram
//! K_X̃ = X̃X̃ᵀ. The svd stage writes the training rows' projection (K_XX̃); prediction and
//! the trainer's held-out ranking project other splits the same way.
//!
//! [`RowInputs`] is how a model sees a row: its coordinates in the svd basis (X X̃ᵀ, R
//! columns) or, for inducing inputs in input space, its raw features kept sparse (the
//! identity basis X̃ = I_D, D columns; `docs/model.md`, "Sparse rows in input space"; the
//! scorer hands them to the kernel as they are, `scoring::model_inputs`).

use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
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

/// K'_X̃ = X̃ W X̃ᵀ [R×R] with W = diag(`weights`) [D] (ARD over the features), accumulated
/// over blocks of columns as [`basis_gram`].
pub fn weighted_basis_gram(map: &NpyMap, weights: &[f64]) -> Result<Mat<f64>> {
    let basis = map.view2::<f32>()?;
    let (r, d) = basis.dim();
    ensure!(
        weights.len() == d,
        "{}: basis has {d} columns, the model {} feature weights",
        map.path().display(),
        weights.len()
    );
    let block = (4 << 20) / r.max(1);
    let mut gram = Mat::<f64>::zeros(r, r);
    let mut start = 0;
    while start < d {
        let end = (start + block.max(1)).min(d);
        let x = Mat::<f64>::from_fn(r, end - start, |i, j| basis[(i, start + j)] as f64);
        let xw = Mat::<f64>::from_fn(r, end - start, |i, j| x[(i, j)] * weights[start + j]);
        gram += &xw * x.transpose();
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

/// How a model sees the rows of a split (`Kxx_b` of `docs/model.md`).
#[derive(Debug, Clone)]
pub enum RowInputs {
    /// Coordinates in the training basis, x_i X̃ᵀ [R]; holds X̃ᵀ [D×R].
    Basis { basis_t: Array2<f32> },
    /// The raw features x_i [D], kept sparse (the identity basis, K_X̃ = I_D).
    Features { n_features: usize },
    /// ARD over the features: coordinates in the weighted basis, x_i W X̃ᵀ [R]; holds
    /// (X̃W)ᵀ [D×R] and the weights w [D], which also weigh the squared norms
    /// (n'_i = Σ_d w_d x_id²).
    Weighted {
        basis_t: Array2<f32>,
        weights: Vec<f64>,
    },
}

impl RowInputs {
    /// The rows' view a run was trained with: the svd run's basis (`basis.npy` [R×D],
    /// mapped), or with `in_features` the identity basis.
    pub fn open(basis: &NpyMap, n_features: u64, in_features: bool) -> Result<Self> {
        if in_features {
            let n_features = usize::try_from(n_features).context("feature count")?;
            return Ok(RowInputs::Features { n_features });
        }
        Ok(RowInputs::Basis {
            basis_t: load_basis_t(basis, n_features)?,
        })
    }

    /// The weighted view of ARD over the features, with weights `weights` [D] (w, not
    /// log w).
    pub fn open_weighted(basis: &NpyMap, n_features: u64, weights: Vec<f64>) -> Result<Self> {
        let mut basis_t = load_basis_t(basis, n_features)?;
        ensure!(
            weights.len() == basis_t.nrows(),
            "{} feature weights for {n_features} features",
            weights.len()
        );
        for (mut row, &w) in basis_t.rows_mut().into_iter().zip(&weights) {
            row.mapv_inplace(|v| (f64::from(v) * w) as f32);
        }
        Ok(RowInputs::Weighted { basis_t, weights })
    }

    /// The squared norms the model sees for rows `start..end` of `chunk` [end − start]: the
    /// stored ‖x_i‖², or Σ_d w_d x_id² in the weighted view.
    pub fn sq_norms(&self, chunk: &CsrChunk, start: usize, end: usize) -> Vec<f64> {
        match self {
            RowInputs::Weighted { weights, .. } => (start..end)
                .map(|i| {
                    let row = chunk.row(i);
                    row.indices
                        .iter()
                        .zip(row.values)
                        .map(|(&d, &v)| weights[d as usize] * f64::from(v) * f64::from(v))
                        .sum()
                })
                .collect(),
            _ => chunk.sq_norms[start..end]
                .iter()
                .map(|&v| v as f64)
                .collect(),
        }
    }

    /// A chunk prepared for scoring: projected whole onto the basis, or kept sparse (the
    /// identity basis).
    pub fn of_chunk<'c>(&self, chunk: &'c CsrChunk) -> ChunkInputs<'c> {
        match self {
            RowInputs::Basis { basis_t } | RowInputs::Weighted { basis_t, .. } => {
                ChunkInputs::Projected(project_rows(chunk, basis_t.view()))
            }
            RowInputs::Features { n_features } => ChunkInputs::Sparse {
                chunk,
                n_features: *n_features,
            },
        }
    }
}

/// The rows of one chunk in a model's view (see [`RowInputs::of_chunk`]).
pub enum ChunkInputs<'c> {
    /// x_i X̃ᵀ [rows×R], f32.
    Projected(Array2<f32>),
    /// The chunk's rows as stored, over `n_features` features.
    Sparse {
        chunk: &'c CsrChunk,
        n_features: usize,
    },
}
