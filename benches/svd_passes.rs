//! `pipeline svd` timings and memory: Delicious (real data from ../shared, R=250) and a
//! generated EUR-Lex-shaped matrix (N=15539, D=5000, ~236 nnz/row, R=2500). Prints seconds
//! per pass, total, peak RSS and peak anonymous memory against the target
//! 8·D·(R+p)·2 bytes + 256 MiB.
//!
//! Run: `cargo bench --bench svd_passes` (FSGP_BENCH_DIR: scratch directory).

mod common;
use common::*;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let bin = env!("CARGO_BIN_EXE_pipeline");
    let root = PathBuf::from(
        std::env::var("FSGP_BENCH_DIR").unwrap_or_else(|_| "target/bench-svd".into()),
    );
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let ws = root.join("ws");
    let ws_s = ws.to_str().unwrap();
    let shared = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/data/delicious");
    let run =
        |args: &[&str]| run_measured(Command::new(bin).arg("--workspace").arg(ws_s).args(args));
    run(&[
        "ingest",
        "--name",
        "delicious",
        "--train",
        shared.join("train.txt").to_str().unwrap(),
    ]);
    let eurlex = root.join("eurlex");
    run_measured(Command::new(bin).args([
        "synth",
        "--out",
        eurlex.to_str().unwrap(),
        "--shape",
        "eurlex",
        "--seed",
        "1",
    ]));
    run(&[
        "ingest",
        "--name",
        "eurlex",
        "--train",
        eurlex.join("train.txt").to_str().unwrap(),
    ]);

    println!(
        "svd benchmark on {} cores (defaults p = 20, q = 2, k-means M = 500 × 10 iterations)",
        threads()
    );
    println!("| data | N×D, nnz/row | R | seconds per pass (last: K_XX̃) | total s | target s | peak RSS | peak anon | RSS target |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (name, n, d, nnz, rank, target_s) in [
        ("delicious", 12920u64, 500u64, 17.9, 250u64, 5.0),
        ("eurlex", 15539, 5000, 236.0, 2500, 120.0),
    ] {
        let m = run(&["svd", "--dataset", name, "--rank", &rank.to_string()]);
        let passes = m
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("seconds per pass (last = K_XX̃): "))
            .map(|l| l.split(';').next().unwrap().to_string())
            .unwrap_or_default();
        let target_rss = 8 * d * (rank + 20) * 2 + (256 << 20);
        println!(
            "| {name} | {n}×{d}, {nnz} | {rank} | {passes} | {:.1} | ≤ {target_s} | {:.0} MiB | {:.0} MiB | ≤ {:.0} MiB |",
            m.seconds,
            mib(m.peak_rss),
            mib(m.peak_anon),
            mib(target_rss)
        );
    }
    std::fs::remove_dir_all(&root).unwrap();
}
