//! Issue 33, lever 3 ("f32 where it is safe"): what an f32 product would save at the
//! shapes a training step multiplies, measured before building an f32 path.
//!
//! For each shape (m×k · k×n, the step's operands): faer's f64 GEMM, faer's f32 GEMM on
//! operands already in f32, and the f32 GEMM with the conversions a mixed-precision step
//! would pay around it (both operands f64 → f32, the product f32 → f64), because the
//! step's other work (Cholesky solves, the likelihood's expectations, the bound's sums,
//! Adam) stays in f64. All threads, faer's rayon parallelism, best of FSGP_BENCH_REPS
//! (default 20) after a warm-up.
//!
//! Run: `cargo bench --bench precision`.

mod common;
use common::threads;
use faer::linalg::matmul::matmul;
use faer::{Accum, Mat, Par};
use std::time::Instant;

fn best_of<F: FnMut()>(reps: usize, mut f: F) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let reps: usize = std::env::var("FSGP_BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    println!("threads: {}", threads());
    // (what, m, k, n)
    let shapes = [
        ("MNIST free Z: X_b Zᵀ, B=1000, D=784, M=200", 1000, 784, 200),
        ("MNIST free Z: ∂Z = Gᵀ X_b", 200, 1000, 784),
        (
            "MNIST subspace: X̃_b Aᵀ, B=1000, R=250, M=200",
            1000,
            250,
            200,
        ),
        ("Delicious M=500: K_bZ μ, B=500, P=30", 500, 500, 30),
        ("Delicious M=500: X̃_b Aᵀ, R=250", 500, 250, 500),
        (
            "Delicious label side: F Φ, B=500, P=30, L=983",
            500,
            30,
            983,
        ),
        ("Delicious label side: ∂Φ = Fᵀ G", 30, 500, 983),
        ("Delicious label side: ∂F = G Φᵀ", 500, 983, 30),
        ("Delicious M=150: K_bZ μ, B=500, P=30", 500, 150, 30),
    ];
    println!(
        "{:<48} {:>10} {:>10} {:>12} {:>9} {:>9}",
        "product (m×k · k×n)", "f64 ms", "f32 ms", "f32+conv ms", "f32 ×", "mixed ×"
    );
    for (what, m, k, n) in shapes {
        let a = Mat::<f64>::from_fn(m, k, |i, j| ((i * 7 + j * 3) % 11) as f64 / 11.0 - 0.5);
        let b = Mat::<f64>::from_fn(k, n, |i, j| ((i * 5 + j) % 13) as f64 / 13.0 - 0.5);
        let mut c = Mat::<f64>::zeros(m, n);
        let a32 = Mat::<f32>::from_fn(m, k, |i, j| a[(i, j)] as f32);
        let b32 = Mat::<f32>::from_fn(k, n, |i, j| b[(i, j)] as f32);
        let mut c32 = Mat::<f32>::zeros(m, n);
        let t64 = best_of(reps, || {
            matmul(
                c.as_mut(),
                Accum::Replace,
                a.as_ref(),
                b.as_ref(),
                1.0,
                Par::rayon(0),
            )
        });
        let t32 = best_of(reps, || {
            matmul(
                c32.as_mut(),
                Accum::Replace,
                a32.as_ref(),
                b32.as_ref(),
                1.0,
                Par::rayon(0),
            )
        });
        let mut a_conv = Mat::<f32>::zeros(m, k);
        let mut b_conv = Mat::<f32>::zeros(k, n);
        let tmix = best_of(reps, || {
            a_conv.as_mut().copy_from(a.as_ref().map(|&x| x as f32));
            b_conv.as_mut().copy_from(b.as_ref().map(|&x| x as f32));
            matmul(
                c32.as_mut(),
                Accum::Replace,
                a_conv.as_ref(),
                b_conv.as_ref(),
                1.0,
                Par::rayon(0),
            );
            c.as_mut().copy_from(c32.as_ref().map(|&x| x as f64));
        });
        println!(
            "{:<48} {:>10.3} {:>10.3} {:>12.3} {:>9.2} {:>9.2}",
            what,
            1e3 * t64,
            1e3 * t32,
            1e3 * tmix,
            t64 / t32,
            t64 / tmix
        );
    }
}
