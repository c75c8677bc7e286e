//! The per-caller arena of work buffers the model recycles between evaluations.
//!
//! A step's per-GP factors and the chunks' products are 10⁸ bytes and more, and the dense
//! likelihood's two [K×B] buffers 2 × 53 MB at AmazonCat sizes. Freshly allocated every step
//! they would be new zero pages (the pipeline fixes glibc's mmap threshold at 1 MiB), whose
//! page faults cost a noticeable part of the step. Whoever evaluates the model repeatedly (the
//! trainer's step loop, the exact bound, a predictor) owns one [`Scratch`] and passes it to
//! every call; buffers taken from it are handed back when a call is done with them.
//!
//! The pools sit behind mutexes because the per-GP tasks running on rayon take and return
//! matrices concurrently. What a buffer holds when it is taken is unspecified: every user
//! overwrites each entry it reads, so the results do not depend on the arena's history.

use std::sync::Mutex;

use faer::Mat;

/// Most matrices kept (enough for P = 64 latent GPs and their chunks).
const MAT_CAP: usize = 256;

/// Recycled work buffers; see the module documentation.
#[derive(Debug, Default)]
pub struct Scratch {
    /// M×M and M×B (or R×R and R×B) work matrices.
    mats: Mutex<Vec<Mat<f64>>>,
    /// The dense likelihood path's two [K×B] buffers.
    dense: Mutex<(Vec<f64>, Vec<f64>)>,
    /// The list path's row-major Φ and ∂Φ [K×P each]: apart from `dense`, whose lengths
    /// (K×B, or F×B for the frequent labels) would resize and zero them on every call.
    rows: Mutex<(Vec<f64>, Vec<f64>)>,
    /// The list path's gradient of Φ [K×P], kept apart from `mats` so the per-GP matrices
    /// filling their pool never push it out.
    labels: Mutex<Option<Mat<f64>>>,
}

impl Scratch {
    pub fn new() -> Self {
        Self::default()
    }

    /// An m×n matrix with unspecified contents (callers overwrite every entry they read).
    pub fn take_mat(&self, m: usize, n: usize) -> Mat<f64> {
        let mut pool = self.mats.lock().unwrap_or_else(|e| e.into_inner());
        match pool.iter().rposition(|x| x.nrows() == m && x.ncols() == n) {
            Some(i) => pool.swap_remove(i),
            None => {
                drop(pool);
                Mat::zeros(m, n)
            }
        }
    }

    /// Returns a matrix to the arena (dropped when the arena is full).
    pub fn give_mat(&self, x: Mat<f64>) {
        if x.nrows() * x.ncols() == 0 {
            return;
        }
        let mut pool = self.mats.lock().unwrap_or_else(|e| e.into_inner());
        if pool.len() < MAT_CAP {
            pool.push(x);
        }
    }

    /// The dense path's two buffers, each of length n, with unspecified contents (every
    /// entry is overwritten).
    pub fn take_dense(&self, n: usize) -> (Vec<f64>, Vec<f64>) {
        take_pair(&self.dense, n)
    }

    /// Hands the dense path's buffers back for the next call.
    pub fn give_dense(&self, a: Vec<f64>, b: Vec<f64>) {
        give_pair(&self.dense, a, b);
    }

    /// The list path's two buffers, each of length n, with unspecified contents (the
    /// caller writes every entry before it reads it).
    pub fn take_rows(&self, n: usize) -> (Vec<f64>, Vec<f64>) {
        take_pair(&self.rows, n)
    }

    /// Hands the list path's buffers back for the next call.
    pub fn give_rows(&self, a: Vec<f64>, b: Vec<f64>) {
        give_pair(&self.rows, a, b);
    }

    /// A [K×P] matrix for Φ's gradient, with unspecified contents (every entry is
    /// overwritten). Fresh, it would be new pages every step: 12 MB at 30 000 labels and
    /// P = 50, whose faults cost about a tenth of the step.
    pub fn take_labels(&self, k: usize, p: usize) -> Mat<f64> {
        let kept = self.labels.lock().unwrap_or_else(|e| e.into_inner()).take();
        match kept {
            Some(x) if x.nrows() == k && x.ncols() == p => x,
            _ => Mat::zeros(k, p),
        }
    }

    /// Hands Φ's gradient back for the next call.
    pub fn give_labels(&self, x: Mat<f64>) {
        *self.labels.lock().unwrap_or_else(|e| e.into_inner()) = Some(x);
    }
}

/// Puts the pair `a`, `b` in `slot` for the next [`take_pair`].
fn give_pair(slot: &Mutex<(Vec<f64>, Vec<f64>)>, a: Vec<f64>, b: Vec<f64>) {
    *slot.lock().unwrap_or_else(|e| e.into_inner()) = (a, b);
}

/// The pair of buffers in `slot`, each of length n: kept as they are when their length is
/// n, else cleared and resized (zeros).
fn take_pair(slot: &Mutex<(Vec<f64>, Vec<f64>)>, n: usize) -> (Vec<f64>, Vec<f64>) {
    let (mut a, mut b) = std::mem::take(&mut *slot.lock().unwrap_or_else(|e| e.into_inner()));
    for v in [&mut a, &mut b] {
        if v.len() != n {
            v.clear();
            v.resize(n, 0.0);
        }
    }
    (a, b)
}
