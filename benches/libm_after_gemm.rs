//! glibc's `exp` right after one of faer's GEMMs, with and without
//! `linalg::clear_upper_simd_state`, and the SE kernel's forward pass at the shape of the
//! MNIST odd/even runs (B = 500, M = 200, R = 784).
//!
//! Why: faer's AVX-512 GEMM microkernels (assembly, called from `private-gemm-x86`) return
//! without `vzeroupper`, so the thread that ran them carries dirty upper register state, and
//! glibc's `exp` wrapper (legacy SSE) around its FMA core (VEX) then pays a state transition
//! on every call. The first two rows time the same 10⁵ exponentials after the same
//! sequential GEMM, without and with the clear; their ratio is the penalty on this machine
//! (1.0 on a CPU without AVX, or in a build with `-C target-cpu=native`, where the compiler
//! issues `vzeroupper` before its own calls into libm). The third row is
//! `KernelKind::SquaredExponential.forward` (three GEMMs and (B + M)·M exponentials), which
//! clears before its exponentials.
//!
//! Run: `cargo bench --bench libm_after_gemm` (FSGP_BENCH_STEPS: repetitions, default 50;
//! the best is reported).

use faer::linalg::matmul::matmul;
use faer::{Accum, Mat, Par};
use fsgp::linalg::clear_upper_simd_state;
use fsgp::model::kernel::{BasisInputs, KernelKind, KernelParams};
use std::hint::black_box;
use std::time::Instant;

const B: usize = 500;
const M: usize = 200;
const R: usize = 784;

/// H = X Aᵀ [B×M] on this thread (faer `Par::Seq`, as the trainer's per-GP work runs).
fn gemm_on_this_thread(x: &Mat<f64>, a: &Mat<f64>, h: &mut Mat<f64>) {
    matmul(
        h.as_mut(),
        Accum::Replace,
        x.as_ref(),
        a.transpose(),
        1.0,
        Par::Seq,
    );
}

/// exp(−d/2) of every entry, through libm (what the SE kernel's Gram loops call).
fn exponentials(d: &Mat<f64>) -> Mat<f64> {
    Mat::from_fn(d.nrows(), d.ncols(), |i, j| (-0.5 * d[(i, j)]).exp())
}

/// Best time in seconds of `reps` runs of `prepare` (untimed) then `timed`.
fn best_of(reps: usize, mut prepare: impl FnMut(), mut timed: impl FnMut()) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        prepare();
        let t = Instant::now();
        timed();
        best = best.min(t.elapsed().as_secs_f64());
    }
    best
}

fn main() {
    let reps: usize = std::env::var("FSGP_BENCH_STEPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let x = Mat::<f64>::from_fn(B, R, |i, j| ((i * 7 + j * 13) % 17) as f64 / 170.0);
    let a = Mat::<f64>::from_fn(M, R, |i, j| ((i * 5 + j * 3) % 11) as f64 / 110.0);
    // Squared distances of the size and range of D_bZ.
    let d = Mat::<f64>::from_fn(B, M, |i, j| ((i + 3 * j) % 29) as f64 / 4.0);
    let mut h = Mat::<f64>::zeros(B, M);
    let calls = (B * M) as f64;

    let dirty = best_of(
        reps,
        || gemm_on_this_thread(&x, &a, &mut h),
        || {
            black_box(exponentials(&d));
        },
    );
    let clean = best_of(
        reps,
        || gemm_on_this_thread(&x, &a, &mut h),
        || {
            clear_upper_simd_state();
            black_box(exponentials(&d));
        },
    );
    println!(
        "machine: {} threads",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!(
        "{:.0} exp after a {B}×{R}·{R}×{M} GEMM on this thread, best of {reps}:",
        calls
    );
    println!(
        "  without clearing     {:8.1} ns per exp",
        dirty / calls * 1e9
    );
    println!(
        "  after the clear      {:8.1} ns per exp",
        clean / calls * 1e9
    );
    println!("  penalty (ratio)      {:8.1}×", dirty / clean);

    let params = KernelParams::new(0.0, 1.5);
    let sq_norms: Vec<f64> = (0..B)
        .map(|i| x.row(i).iter().map(|v| v * v).sum())
        .collect();
    let k_tilde = Mat::<f64>::identity(R, R);
    let inputs = BasisInputs {
        kxx_b: x.as_ref().into(),
        sq_norms: &sq_norms,
        k_tilde: k_tilde.as_ref().into(),
    };
    let kind = KernelKind::SquaredExponential;
    let forward = best_of(
        reps,
        || gemm_on_this_thread(&x, &a, &mut h),
        || {
            black_box(kind.forward(&params, a.as_ref(), &inputs));
        },
    );
    let exp_calls = ((B + M) * M) as f64;
    println!(
        "SE forward (B = {B}, M = {M}, R = {R}): {:.2} ms, of which {:.2} ms is its {exp_calls:.0} \
         exponentials at the cleared rate",
        forward * 1e3,
        exp_calls * clean / calls * 1e3
    );
    black_box(&h);
}
