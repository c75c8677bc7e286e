//! The kernel's data inputs in the two shapes they take (`docs/model.md`, "Sparse rows in
//! input space"): the basis Gram K_X̃ ([`GramRef`]) and the minibatch's rows Kxx_b
//! ([`Rows`]).
//!
//! With inducing inputs in input space (`--inducing-inputs free|fixed-rows`) the basis is
//! the identity X̃ = I_D, so K_X̃ = I_D and Kxx_b = X_b, the rows' raw features. Held
//! densely those would cost D² memory and M·D² flops (A K_X̃) and B·D·M flops (X_b Aᵀ) a
//! step; here K_X̃ = I is a marker ([`GramRef::Identity`]: A K_X̃ = A, nothing computed)
//! and the rows stay in CSR ([`Rows::Sparse`]): H = X_b Aᵀ costs B·nnz·M and the data
//! term of ∂F/∂A, (∂F/∂H)ᵀ X_b, is scattered into the columns of A the minibatch's
//! features touch, at the same cost. On the svd basis both stay dense, with the GEMMs and
//! bits they always had.

use faer::reborrow::ReborrowMut;
use faer::{Mat, MatMut, MatRef};
use rayon::prelude::*;

use crate::linalg::{column_slice, with_column_major};

/// K_X̃ [R×R] as the kernel reads it.
#[derive(Debug, Clone, Copy)]
pub enum GramRef<'a> {
    /// X̃X̃ᵀ of an svd basis (or X̃WX̃ᵀ under ARD over the features).
    Dense(MatRef<'a, f64>),
    /// I_D of the identity basis, of this dimension: never materialised.
    Identity(usize),
}

impl<'a> From<MatRef<'a, f64>> for GramRef<'a> {
    fn from(m: MatRef<'a, f64>) -> Self {
        GramRef::Dense(m)
    }
}

impl<'a> From<&'a Mat<f64>> for GramRef<'a> {
    fn from(m: &'a Mat<f64>) -> Self {
        GramRef::Dense(m.as_ref())
    }
}

impl<'a> From<&'a Gram> for GramRef<'a> {
    fn from(g: &'a Gram) -> Self {
        g.as_ref()
    }
}

impl GramRef<'_> {
    /// R, the basis's rank (D for the identity).
    pub fn dim(&self) -> usize {
        match self {
            GramRef::Dense(m) => m.nrows(),
            GramRef::Identity(d) => *d,
        }
    }

    /// A K_X̃ for `a` [N×R]: a GEMM, or None with the identity, where it is `a` itself (the
    /// caller reads `a`, so nothing of N×R is computed or copied).
    pub fn times(&self, a: MatRef<'_, f64>) -> Option<Mat<f64>> {
        match self {
            GramRef::Dense(k) => Some(a * k),
            GramRef::Identity(_) => None,
        }
    }

    /// A K_X̃ [N×R] owned: the GEMM, or a copy of `a` with the identity.
    pub fn right_mul(&self, a: MatRef<'_, f64>) -> Mat<f64> {
        self.times(a).unwrap_or_else(|| a.to_owned())
    }

    /// K_X̃ as a dense matrix. For the linear kernel's subspace path alone, which runs only
    /// when R ≤ ¾M (`low_rank::worthwhile`), so the identity's D² entries are at most
    /// (¾M)².
    pub fn to_dense(&self) -> Mat<f64> {
        match self {
            GramRef::Dense(k) => k.to_owned(),
            GramRef::Identity(d) => Mat::identity(*d, *d),
        }
    }
}

/// K_X̃ owned: what a run, a predictor or a ranker holds for its whole life.
#[derive(Debug, Clone, PartialEq)]
pub enum Gram {
    Dense(Mat<f64>),
    /// I_D: the identity basis of inducing inputs in input space.
    Identity(usize),
}

impl Gram {
    pub fn as_ref(&self) -> GramRef<'_> {
        match self {
            Gram::Dense(m) => GramRef::Dense(m.as_ref()),
            Gram::Identity(d) => GramRef::Identity(*d),
        }
    }
}

/// The minibatch's rows Kxx_b [B×R] as the kernel reads them.
#[derive(Debug, Clone, Copy)]
pub enum Rows<'a> {
    /// Coordinates in an svd basis, X_b X̃ᵀ [B×R].
    Dense(MatRef<'a, f64>),
    /// Raw features in CSR, X_b [B×D] (the identity basis); `width` is D.
    Sparse { rows: &'a FeatureRows, width: usize },
}

impl<'a> From<MatRef<'a, f64>> for Rows<'a> {
    fn from(m: MatRef<'a, f64>) -> Self {
        Rows::Dense(m)
    }
}

impl<'a> From<&'a Mat<f64>> for Rows<'a> {
    fn from(m: &'a Mat<f64>) -> Self {
        Rows::Dense(m.as_ref())
    }
}

impl<'a> Rows<'a> {
    /// B.
    pub fn nrows(&self) -> usize {
        match self {
            Rows::Dense(m) => m.nrows(),
            Rows::Sparse { rows, .. } => rows.len(),
        }
    }

    /// R (D for sparse rows).
    pub fn ncols(&self) -> usize {
        match self {
            Rows::Dense(m) => m.ncols(),
            Rows::Sparse { width, .. } => *width,
        }
    }

    /// The dense matrix, if the rows are dense.
    pub fn as_dense(&self) -> Option<MatRef<'a, f64>> {
        match self {
            Rows::Dense(m) => Some(*m),
            Rows::Sparse { .. } => None,
        }
    }

    /// The rows densified [B×R]: only for what reads whole rows (the amortisation network
    /// of a multi-class likelihood, subspace ARD's map), at B·D memory for sparse rows.
    pub fn to_dense(&self) -> Mat<f64> {
        match self {
            Rows::Dense(m) => m.to_owned(),
            Rows::Sparse { rows, width } => {
                let mut out = Mat::<f64>::zeros(rows.len(), *width);
                for i in 0..rows.len() {
                    for (d, v) in rows.row(i) {
                        out[(i, d)] = v;
                    }
                }
                out
            }
        }
    }

    /// H = Kxx_b Aᵀ [B×M] for `a` [M×R]: a GEMM (B·R·M), or sparse × dense (B·nnz·M).
    pub fn times_transpose(&self, a: MatRef<'_, f64>) -> Mat<f64> {
        match self {
            Rows::Dense(m) => *m * a.transpose(),
            Rows::Sparse { rows, .. } => rows.project(a),
        }
    }

    /// `acc` + gᵀ Kxx_b [M×R] for `g` = ∂F/∂H [B×M]: `acc` + a GEMM on dense rows (the
    /// expression, and so the bits, of the dense path); on sparse rows g's rows are
    /// scattered into the columns of `acc` that the minibatch's features touch (B·nnz·M),
    /// the other columns left as they are.
    pub fn add_transpose_times(&self, g: MatRef<'_, f64>, mut acc: Mat<f64>) -> Mat<f64> {
        match self {
            Rows::Dense(m) => acc + g.transpose() * *m,
            Rows::Sparse { rows, .. } => {
                // gᵀ [M×B]: row i's gradient as a contiguous column.
                let g_t = g.transpose().to_owned();
                // Tasks own blocks of acc's rows: every element (m, d) still sums the
                // batch's rows in order, so the bits are those of a serial loop.
                acc.as_mut()
                    .par_row_chunks_mut(SCATTER_ROWS)
                    .enumerate()
                    .for_each(|(block, mut part)| {
                        let first = block * SCATTER_ROWS;
                        let span = first..first + part.nrows();
                        for i in 0..rows.len() {
                            let g_row = &g_t.col_as_slice(i)[span.clone()];
                            for (d, v) in rows.row(i) {
                                axpy(column_mut(part.rb_mut(), d), v, g_row);
                            }
                        }
                    });
                acc
            }
        }
    }
}

/// Rows of the gradient per parallel task of the scatter (each task walks the batch's
/// non-zeros once): eight tasks at M = 500, blocks long enough to vectorise.
const SCATTER_ROWS: usize = 64;

/// Rows per parallel task of the projection.
const PROJECT_ROWS: usize = 16;

/// out += v · x, element by element (the expression of the serial loops, so the same bits).
fn axpy(out: &mut [f64], v: f64, x: &[f64]) {
    for (o, &b) in out.iter_mut().zip(x) {
        *o += v * b;
    }
}

/// Column `j` of a matrix whose columns are contiguous, as a slice.
fn column_mut(m: MatMut<'_, f64>, j: usize) -> &mut [f64] {
    m.col_mut(j)
        .try_as_col_major_mut()
        .expect("a block of a column-major matrix has contiguous columns")
        .as_slice_mut()
}

/// A minibatch's rows as sparse feature vectors [B×D] (CSR, f64 values).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FeatureRows {
    /// Row i's entries are `offsets[i]..offsets[i + 1]` [B + 1].
    offsets: Vec<usize>,
    /// Feature ids, increasing within a row [nnz].
    indices: Vec<u32>,
    values: Vec<f64>,
}

impl FeatureRows {
    pub fn new() -> Self {
        FeatureRows {
            offsets: vec![0],
            indices: Vec::new(),
            values: Vec::new(),
        }
    }

    /// The non-zeros of dense rows `x` [B×D] (the inverse of [`Rows::to_dense`]).
    pub fn from_dense(x: MatRef<'_, f64>) -> Self {
        let mut rows = FeatureRows::new();
        for i in 0..x.nrows() {
            let ids: Vec<u32> = (0..x.ncols() as u32)
                .filter(|&j| x[(i, j as usize)] != 0.0)
                .collect();
            rows.push_row(&ids, ids.iter().map(|&j| x[(i, j as usize)]));
        }
        rows
    }

    /// Appends a row given by its feature ids and values.
    pub fn push_row(&mut self, indices: &[u32], values: impl IntoIterator<Item = f64>) {
        if self.offsets.is_empty() {
            self.offsets.push(0);
        }
        self.indices.extend_from_slice(indices);
        self.values.extend(values);
        debug_assert_eq!(self.indices.len(), self.values.len());
        self.offsets.push(self.indices.len());
    }

    /// Appends a row given as stored (feature ids, f32 values), refusing a feature id
    /// outside `n_features`, named with the row's id.
    pub fn push_checked(
        &mut self,
        row_id: u64,
        indices: &[u32],
        values: &[f32],
        n_features: usize,
    ) -> anyhow::Result<()> {
        if let Some(&j) = indices.iter().find(|&&j| j as usize >= n_features) {
            anyhow::bail!(
                "row {row_id}: feature {j} is outside the dataset's {n_features} features"
            );
        }
        self.push_row(indices, values.iter().map(|&v| f64::from(v)));
        Ok(())
    }

    /// Rows B.
    pub fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Row i's (feature id, value) pairs.
    pub fn row(&self, i: usize) -> impl Iterator<Item = (usize, f64)> + '_ {
        let (s, e) = (self.offsets[i], self.offsets[i + 1]);
        self.indices[s..e]
            .iter()
            .zip(&self.values[s..e])
            .map(|(&d, &v)| (d as usize, v))
    }

    /// The largest feature id + 1 (0 without entries).
    pub fn width(&self) -> usize {
        self.indices.iter().max().map_or(0, |&d| d as usize + 1)
    }

    /// The rows projected onto `basis` [R×D]: X_b basisᵀ [B×R], accumulated feature by
    /// feature in the row's order (nnz·R).
    pub fn project(&self, basis: MatRef<'_, f64>) -> Mat<f64> {
        with_column_major(basis, |basis| self.project_columns(basis))
    }

    /// [`FeatureRows::project`] onto a column-major `basis`.
    fn project_columns(&self, basis: MatRef<'_, f64>) -> Mat<f64> {
        let column = |d: usize| column_slice(basis, d);
        // Built transposed, [R×B], so each row's accumulator is a contiguous column; tasks
        // own blocks of rows, each summed over its features in order (serial bits).
        let mut out_t = Mat::<f64>::zeros(basis.nrows(), self.len());
        out_t
            .as_mut()
            .par_col_chunks_mut(PROJECT_ROWS)
            .enumerate()
            .for_each(|(block, mut part)| {
                for local in 0..part.ncols() {
                    let acc = column_mut(part.rb_mut(), local);
                    for (d, v) in self.row(block * PROJECT_ROWS + local) {
                        axpy(acc, v, column(d));
                    }
                }
            });
        out_t.transpose().to_owned()
    }

    /// Σ_d c_d x_id² for every row [B] (c = 1: the squared norms n).
    pub fn weighted_sq_norms(&self, weights: Option<&[f64]>) -> Vec<f64> {
        (0..self.len())
            .map(|i| {
                self.row(i)
                    .map(|(d, v)| weights.map_or(1.0, |w| w[d]) * v * v)
                    .sum()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn sparse_rows(b: usize, d: usize, seed: u64) -> FeatureRows {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut rows = FeatureRows::new();
        for _ in 0..b {
            let ids: Vec<u32> = (0..d as u32)
                .filter(|_| rng.random::<f64>() < 0.3)
                .collect();
            let vals: Vec<f64> = ids.iter().map(|_| rng.random::<f64>() - 0.5).collect();
            rows.push_row(&ids, vals);
        }
        rows
    }

    #[test]
    fn dense_rows_round_trip_through_their_non_zeros() {
        let x = Mat::from_fn(4, 6, |i, j| {
            if (i + j) % 3 == 0 {
                0.0
            } else {
                (i * 6 + j) as f64 - 7.5
            }
        });
        let rows = FeatureRows::from_dense(x.as_ref());
        assert_eq!(rows.len(), 4);
        let stored: usize = (0..4).map(|i| rows.row(i).count()).sum();
        assert_eq!(
            stored,
            (0..4)
                .flat_map(|i| (0..6).map(move |j| (i, j)))
                .filter(|&(i, j)| x[(i, j)] != 0.0)
                .count()
        );
        let back = Rows::Sparse {
            rows: &rows,
            width: 6,
        }
        .to_dense();
        assert_eq!(back, x);
    }

    /// The parallel products give the bits of serial loops that sum every element over the
    /// batch's rows and features in order, whatever the block boundaries (M and B not
    /// multiples of the blocks, a strided basis view).
    #[test]
    fn parallel_sparse_products_have_the_serial_loops_bits() {
        let (b, d, m) = (37, 23, 150);
        let rows = sparse_rows(b, d, 5);
        let mut rng = ChaCha8Rng::seed_from_u64(6);
        let mut u = || rng.random::<f64>() - 0.5;
        let a = Mat::from_fn(m, d, |_, _| u());
        let g = Mat::from_fn(b, m, |_, _| u());
        let acc = Mat::from_fn(m, d, |_, _| u());
        let mut h_serial = Mat::<f64>::zeros(b, m);
        let mut scatter_serial = acc.clone();
        for i in 0..b {
            for (f, v) in rows.row(i) {
                for k in 0..m {
                    h_serial[(i, k)] += v * a[(k, f)];
                    scatter_serial[(k, f)] += v * g[(i, k)];
                }
            }
        }
        let sparse = Rows::Sparse {
            rows: &rows,
            width: d,
        };
        assert!(sparse.times_transpose(a.as_ref()) == h_serial);
        assert!(sparse.add_transpose_times(g.as_ref(), acc) == scatter_serial);
        // A row-major copy viewed transposed has strided columns: copied, same bits.
        let a_t = a.transpose().to_owned();
        assert!(rows.project(a_t.transpose()) == h_serial);
    }

    /// Sparse × dense products equal the dense ones on the densified rows, and the scatter
    /// leaves the columns no row touches exactly as they were.
    #[test]
    fn sparse_products_equal_the_dense_ones() {
        let (b, d, m) = (6, 11, 4);
        let rows = sparse_rows(b, d, 3);
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        let mut u = || rng.random::<f64>() - 0.5;
        let a = Mat::from_fn(m, d, |_, _| u());
        let g = Mat::from_fn(b, m, |_, _| u());
        let acc = Mat::from_fn(m, d, |_, _| u());
        let sparse = Rows::Sparse {
            rows: &rows,
            width: d,
        };
        let dense_rows = sparse.to_dense();
        let dense = Rows::Dense(dense_rows.as_ref());
        assert_eq!((sparse.nrows(), sparse.ncols()), (b, d));
        let h = sparse.times_transpose(a.as_ref());
        assert!((&h - dense.times_transpose(a.as_ref())).norm_max() < 1e-15);
        let by_scatter = sparse.add_transpose_times(g.as_ref(), acc.clone());
        let by_gemm = dense.add_transpose_times(g.as_ref(), acc.clone());
        assert!((&by_scatter - &by_gemm).norm_max() < 1e-15);
        for col in 0..d {
            let touched = (0..b).any(|i| rows.row(i).any(|(j, _)| j == col));
            if !touched {
                assert_eq!(by_scatter.col(col), acc.col(col), "column {col}");
            }
        }
    }

    fn max_rel(a: &Mat<f64>, b: &Mat<f64>) -> f64 {
        (a - b).norm_max() / a.norm_max().max(b.norm_max()).max(1e-300)
    }

    /// The kernel's forward and backward passes on sparse rows with the identity marker
    /// equal those on the densified rows with a dense I_D, for every kernel: K_Z bit for
    /// bit (G = A Aᵀ is the GEMM A·I_D feeds), the rest to 1e-12 relative.
    #[test]
    fn kernels_on_sparse_rows_equal_the_dense_identity_path() {
        use crate::model::kernel::{BasisInputs, KernelKind, KernelParams};
        let (m, d, b) = (5, 13, 7);
        let rows = sparse_rows(b, d, 8);
        let sparse = Rows::Sparse {
            rows: &rows,
            width: d,
        };
        let dense_rows = sparse.to_dense();
        let norms = rows.weighted_sq_norms(None);
        let identity = Mat::<f64>::identity(d, d);
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let mut u = |s: f64| (rng.random::<f64>() - 0.5) * s;
        let a = Mat::from_fn(m, d, |_, _| u(1.0));
        let g_z = Mat::from_fn(m, m, |_, _| u(2.0));
        let g_bz = Mat::from_fn(b, m, |_, _| u(2.0));
        let g_diag: Vec<f64> = (0..b).map(|_| u(2.0)).collect();
        let x_sparse = BasisInputs {
            kxx_b: sparse,
            sq_norms: &norms,
            k_tilde: GramRef::Identity(d),
        };
        let x_dense = BasisInputs {
            kxx_b: dense_rows.as_ref().into(),
            sq_norms: &norms,
            k_tilde: identity.as_ref().into(),
        };
        for kind in [
            KernelKind::Linear,
            KernelKind::SquaredExponential,
            KernelKind::SePlusLinear,
        ] {
            let p = KernelParams {
                log_lin2: (kind == KernelKind::SePlusLinear).then_some(-0.3),
                ..KernelParams::new(0.2, 0.4)
            };
            let (fs, fd) = (
                kind.forward(&p, a.as_ref(), &x_sparse),
                kind.forward(&p, a.as_ref(), &x_dense),
            );
            assert_eq!(fs.k_z, fd.k_z, "{kind:?} K_Z");
            assert!(max_rel(&fs.k_bz, &fd.k_bz) < 1e-12, "{kind:?} K_bZ");
            assert_eq!(fs.k_diag, fd.k_diag, "{kind:?} k_ii");
            let back = |x: &BasisInputs<'_>, f| {
                kind.backward(&p, a.as_ref(), x, f, g_z.as_ref(), g_bz.as_ref(), &g_diag)
            };
            let (gs, gd) = (back(&x_sparse, &fs), back(&x_dense, &fd));
            assert!(
                max_rel(&gs.a, &gd.a) < 1e-12,
                "{kind:?} ∂A {}",
                max_rel(&gs.a, &gd.a)
            );
            for (name, s, t) in [
                ("log σ_f²", gs.log_sf2, gd.log_sf2),
                ("log ℓ", gs.log_ell, gd.log_ell),
                ("log σ_lin²", gs.log_lin2, gd.log_lin2),
            ] {
                assert!(
                    (s - t).abs() <= 1e-12 * s.abs().max(t.abs()),
                    "{kind:?} {name}"
                );
            }
            let z_sq = KernelKind::inducing_sq_norms(a.as_ref(), GramRef::Identity(d));
            let cross = kind.cross(&p, a.as_ref(), &z_sq, &x_sparse);
            assert_eq!(cross.k_bz, fs.k_bz, "{kind:?}: cross is forward's block");
        }
    }

    #[test]
    fn the_identity_multiplies_as_the_dense_identity() {
        let a = Mat::from_fn(3, 5, |i, j| (i * 5 + j) as f64 * 0.1 - 0.4);
        let id = GramRef::Identity(5);
        assert!(id.times(a.as_ref()).is_none());
        let dense = id.to_dense();
        assert_eq!(id.right_mul(a.as_ref()), &a * &dense);
        assert_eq!(GramRef::Dense(dense.as_ref()).right_mul(a.as_ref()), a);
        assert_eq!(id.dim(), 5);
    }
}
