//! Small dense helpers shared by the model and the svd stage.

use faer::dyn_stack::{MemBuffer, MemStack};
use faer::linalg::cholesky::llt::factor::{cholesky_in_place, cholesky_in_place_scratch};
use faer::{Mat, Par};

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
    for j in 1..n {
        for i in 0..j {
            a[(i, j)] = 0.0;
        }
    }
    Some(a)
}
