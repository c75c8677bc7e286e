//! One training step (bound + gradients + Adam) at the Delicious configuration
//! (B=500, M=500, P=30, R=250, K=983, all negatives) and, in the same run, faer's dense
//! f64 GEMM rate on this machine. Data and parameters are random of the right shapes; the
//! cost of a step does not depend on the values.
//!
//! Run: `cargo bench --bench train_step` (FSGP_BENCH_STEPS: steps timed, default 3).

mod common;
use common::threads;
use faer::Mat;
use fsgp::model::elbo::{evaluate, terms_all, Params};
use fsgp::model::kernel::{BasisInputs, KernelKind, KernelParams};
use fsgp::model::likelihood::BernoulliLogistic;
use fsgp::model::optim::{AdamConfig, AdamState};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::Instant;

fn gemm_gflops(n: usize) -> f64 {
    let a = Mat::<f64>::from_fn(n, n, |i, j| ((i * 7 + j * 3) % 11) as f64);
    let b = Mat::<f64>::from_fn(n, n, |i, j| ((i * 5 + j) % 13) as f64);
    let _warm = &a * &b;
    let t = Instant::now();
    let reps = 3;
    for _ in 0..reps {
        std::hint::black_box(&a * &b);
    }
    2.0 * (n as f64).powi(3) * reps as f64 / t.elapsed().as_secs_f64() / 1e9
}

fn main() {
    let steps: usize = std::env::var("FSGP_BENCH_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let (b, m, p, r, k) = (500, 500, 30, 250, 983);
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut u = |s: f64| (rng.random::<f64>() - 0.5) * s;
    let kxx = Mat::from_fn(b, r, |_, _| u(0.2));
    let norms: Vec<f64> = (0..b).map(|_| 1.0).collect();
    let kt = Mat::<f64>::identity(r, r);
    let mut params = Params {
        a: Mat::from_fn(m, r, |_, _| u(0.2)),
        mu: Mat::from_fn(m, p, |_, _| u(0.1)),
        rho: Mat::from_fn(m, p, |_, _| u(1.0)),
        phi: Mat::from_fn(k, p, |_, _| u(0.4)),
        bias: (0..k).map(|_| -3.0).collect(),
        kernel: KernelParams {
            log_sf2: 0.0,
            log_ell: 0.0,
        },
    };
    let mut lrng = ChaCha8Rng::seed_from_u64(2);
    let positives: Vec<Vec<u32>> = (0..b)
        .map(|_| {
            let mut v: Vec<u32> = (0..19).map(|_| lrng.random_range(0..k as u32)).collect();
            v.sort_unstable();
            v.dedup();
            v
        })
        .collect();
    let terms = terms_all(&positives, k, 12920.0 / b as f64);
    let lik = BernoulliLogistic::new(20).unwrap();
    let x = BasisInputs {
        kxx_b: kxx.as_ref(),
        sq_norms: &norms,
        k_tilde: kt.as_ref(),
    };
    let mut adam = AdamState::new(&params);
    let cfg = AdamConfig::default();
    let gemm = gemm_gflops(1000);
    let mut times = Vec::new();
    for _ in 0..steps {
        let t = Instant::now();
        let ev = evaluate(KernelKind::Linear, &params, &x, &terms, &lik).unwrap();
        adam.step(&cfg, &mut params, &ev.grads, &|_| false);
        times.push(t.elapsed().as_secs_f64());
    }
    let best = times.iter().cloned().fold(f64::INFINITY, f64::min);
    // Dominant flops: per GP, Cholesky (M³/3), C⁻¹ (M³), C⁻¹K_Z C⁻¹ (4M³), W (2M²B),
    // W D Wᵀ (2M²B), K_bZ terms; plus utilities 4·B·K·P and kernels 2M²R + 2BMR.
    let (mf, bf, pf, rf, kf) = (m as f64, b as f64, p as f64, r as f64, k as f64);
    let flops = pf * (mf.powi(3) * (1.0 / 3.0 + 1.0 + 4.0) + 4.0 * mf * mf * bf + 2.0 * bf * mf)
        + 4.0 * bf * kf * pf
        + 2.0 * mf * mf * rf
        + 2.0 * bf * mf * rf;
    println!("train step, Delicious configuration (B={b}, M={m}, P={p}, R={r}, K={k}, all negatives), {} cores", threads());
    println!("| s/step (best of {steps}) | step GFLOP | achieved GFLOP/s | faer f64 GEMM GFLOP/s | fraction | target |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| {best:.3} | {:.1} | {:.1} | {gemm:.1} | {:.0} % | ≤ 0.25 s, ≥ 50 % |",
        flops / 1e9,
        flops / best / 1e9,
        100.0 * flops / best / 1e9 / gemm
    );
}
