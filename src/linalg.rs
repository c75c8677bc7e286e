//! Small dense helpers shared by the model and the svd stage: Cholesky, products, inner
//! products, and the lower-triangular helpers both of the model's factorisation paths use.

use faer::dyn_stack::{MemBuffer, MemStack};
use faer::linalg::cholesky::llt::factor::{cholesky_in_place, cholesky_in_place_scratch};
use faer::linalg::matmul::matmul;
use faer::linalg::matmul::triangular::{matmul as tri_matmul, BlockStructure};
use faer::linalg::triangular_inverse::invert_lower_triangular;
use faer::linalg::triangular_solve::solve_lower_triangular_in_place;
use faer::reborrow::ReborrowMut;
use faer::{Accum, Mat, MatMut, MatRef, Par};

/// `f` applied to `m` with contiguous columns: `m` itself when it has them, else a copy made
/// once (column slices, [`column_slice`], need a column-major matrix).
pub fn with_column_major<R>(m: MatRef<'_, f64>, f: impl FnOnce(MatRef<'_, f64>) -> R) -> R {
    match m.try_as_col_major() {
        Some(_) => f(m),
        None => f(m.to_owned().as_ref()),
    }
}

/// Column `j` of a column-major matrix as a slice (a matrix from [`with_column_major`], or
/// an owned `Mat`).
pub fn column_slice(m: MatRef<'_, f64>, j: usize) -> &[f64] {
    m.col(j)
        .try_as_col_major()
        .expect("a column-major matrix has contiguous columns")
        .as_slice()
}

/// Lower Cholesky factor L of a symmetric positive definite `a` [n×n] (only its lower
/// triangle is read), sequentially, with zeros above the diagonal; None when `a` is not
/// numerically positive definite. No jitter: callers that want a retry add it themselves.
pub fn cholesky_lower(mut a: Mat<f64>) -> Option<Mat<f64>> {
    let n = a.nrows();
    let mut buf = MemBuffer::new(cholesky_in_place_scratch::<f64>(
        n,
        Par::Seq,
        Default::default(),
    ));
    cholesky_in_place(
        a.as_mut(),
        Default::default(),
        Par::Seq,
        MemStack::new(&mut buf),
        Default::default(),
    )
    .ok()?;
    zero_upper(a.as_mut());
    Some(a)
}

/// Sets the entries above the diagonal of a square matrix to zero.
pub fn zero_upper(mut a: MatMut<'_, f64>) {
    for j in 1..a.ncols() {
        for i in 0..j {
            a[(i, j)] = 0.0;
        }
    }
}

/// Mirrors the lower triangle of a square matrix into its upper triangle.
pub fn mirror_lower(mut x: MatMut<'_, f64>) {
    for j in 1..x.ncols() {
        for i in 0..j {
            x[(i, j)] = x[(j, i)];
        }
    }
}

/// lhs · rhs as a new matrix (see [`product_into`]).
pub fn product(lhs: MatRef<'_, f64>, rhs: MatRef<'_, f64>) -> Mat<f64> {
    let mut out = Mat::<f64>::zeros(lhs.nrows(), rhs.ncols());
    product_into(out.as_mut(), lhs, rhs);
    out
}

/// dst = lhs · rhs on the current rayon pool; `results_are_bitwise_identical_for_one_and_two_threads`
/// (tests/it/elbo_gradients.rs) checks that the pool size does not change the bits.
pub fn product_into(dst: MatMut<'_, f64>, lhs: MatRef<'_, f64>, rhs: MatRef<'_, f64>) {
    matmul(dst, Accum::Replace, lhs, rhs, 1.0, Par::rayon(0));
}

/// dst += lhs · rhs on the current rayon pool.
pub fn product_add_into(dst: MatMut<'_, f64>, lhs: MatRef<'_, f64>, rhs: MatRef<'_, f64>) {
    matmul(dst, Accum::Add, lhs, rhs, 1.0, Par::rayon(0));
}

/// ⟨X, Y⟩ = Σ X∘Y as one running sum over the entries in column-major order.
pub fn inner(x: MatRef<'_, f64>, y: MatRef<'_, f64>) -> f64 {
    let mut s = 0.0;
    for j in 0..x.ncols() {
        for i in 0..x.nrows() {
            s += x[(i, j)] * y[(i, j)];
        }
    }
    s
}

/// ⟨X, Y⟩ = Σ X∘Y summed column by column, then over the columns. The rounding differs
/// from [`inner`]'s; each caller keeps the order it was validated with, so that results stay
/// the same bit for bit.
pub fn inner_by_columns(x: MatRef<'_, f64>, y: MatRef<'_, f64>) -> f64 {
    let mut s = 0.0;
    for j in 0..x.ncols() {
        s += x
            .col(j)
            .iter()
            .zip(y.col(j).iter())
            .map(|(a, b)| a * b)
            .sum::<f64>();
    }
    s
}

/// L⁻¹ [n×n] of a lower triangular `l` into the lower triangle of `inv` (n³/3 flops,
/// sequential); the entries above the diagonal are unspecified and never read by the
/// helpers below (every use names the triangular structure).
pub fn lower_inverse_into(inv: MatMut<'_, f64>, l: MatRef<'_, f64>) {
    invert_lower_triangular(inv, l, Par::Seq);
}

/// X = L⁻¹ B [n×k] (n²k flops, sequential) into `x`: by a triangular solve with L, or, when
/// L⁻¹ is at hand, by a triangular × dense product, which faer runs about 1.3× faster than
/// the solve at n = k = 500.
pub fn lower_solve_into(
    mut x: MatMut<'_, f64>,
    l: MatRef<'_, f64>,
    l_inv: Option<MatRef<'_, f64>>,
    rhs: MatRef<'_, f64>,
) {
    match l_inv {
        Some(l_inv) => tri_matmul(
            x,
            BlockStructure::Rectangular,
            Accum::Replace,
            l_inv,
            BlockStructure::TriangularLower,
            rhs,
            BlockStructure::Rectangular,
            1.0,
            Par::Seq,
        ),
        None => {
            x.copy_from(rhs);
            solve_lower_triangular_in_place(l, x, Par::Seq);
        }
    }
}

/// From L⁻¹ [n×n] (lower triangle) and V = L⁻¹ X [n×B]: `inv` ← (L Lᵀ)⁻¹ = L⁻ᵀ L⁻¹ (its
/// lower triangle by a triangular product, half the flops of the full one, then mirrored)
/// and `w` ← L⁻ᵀ V = (L Lᵀ)⁻¹ X. Sequential.
pub fn inverse_and_solve(
    l_inv: MatRef<'_, f64>,
    v: MatRef<'_, f64>,
    mut inv: MatMut<'_, f64>,
    w: MatMut<'_, f64>,
) {
    tri_matmul(
        inv.rb_mut(),
        BlockStructure::TriangularLower,
        Accum::Replace,
        l_inv.transpose(),
        BlockStructure::TriangularUpper,
        l_inv,
        BlockStructure::TriangularLower,
        1.0,
        Par::Seq,
    );
    mirror_lower(inv);
    tri_matmul(
        w,
        BlockStructure::Rectangular,
        Accum::Replace,
        l_inv.transpose(),
        BlockStructure::TriangularUpper,
        v,
        BlockStructure::Rectangular,
        1.0,
        Par::Seq,
    );
}

/// The lower triangle of Y (Y diag(d))ᵀ = Y diag(d) Yᵀ into `out`, given `yd` = Y diag(d)
/// (half the flops of the full product; the upper triangle is left as it was). Sequential.
pub fn lower_product(out: MatMut<'_, f64>, y: MatRef<'_, f64>, yd: MatRef<'_, f64>) {
    tri_matmul(
        out,
        BlockStructure::TriangularLower,
        Accum::Replace,
        y,
        BlockStructure::Rectangular,
        yd.transpose(),
        BlockStructure::Rectangular,
        1.0,
        Par::Seq,
    );
}

/// Clears the upper halves of the AVX registers (`vzeroupper`). faer's AVX-512 GEMM kernels
/// return with them dirty, and until they are cleared every legacy-SSE instruction on that
/// thread pays a state-transition penalty: glibc's `exp`, `log` and `erfc` wrappers ran
/// about 30× slower right after a faer GEMM (1.05 s against 0.036 s for 5.7·10⁶ `exp`,
/// measured on this machine's AVX-512 Xeon). Call it after GEMMs and before a loop of libm
/// calls. Changes no value, only speed; a no-op without AVX.
#[inline]
pub fn clear_upper_simd_state() {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx") {
            // SAFETY: AVX was just detected; `vzeroupper` only zeroes the upper halves of
            // the vector registers, which the compiler knows the intrinsic clobbers.
            unsafe { vzeroupper() }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn vzeroupper() {
    std::arch::x86_64::_mm256_zeroupper()
}
