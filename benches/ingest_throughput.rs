//! Ingest throughput and memory: generates XML-repository text with `pipeline synth` at two
//! sizes (default 1 GB and 2 GB), ingests each with `pipeline ingest`, and prints MB/s of
//! input and the peak resident set size of the ingest process (from wait4's rusage).
//!
//! Run: `cargo bench --bench ingest_throughput` (env FSGP_BENCH_GB="1,2" picks the sizes,
//! FSGP_BENCH_DIR the scratch directory, FSGP_BENCH_SHAPE the synth preset).

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

fn dir_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        total += if p.is_dir() {
            dir_bytes(&p)
        } else {
            std::fs::metadata(&p).unwrap().len()
        };
    }
    total
}

fn main() {
    let bin = env!("CARGO_BIN_EXE_pipeline");
    let sizes: Vec<f64> = std::env::var("FSGP_BENCH_GB")
        .unwrap_or_else(|_| "1,2".into())
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .expect("FSGP_BENCH_GB: comma-separated numbers")
        })
        .collect();
    let shape = std::env::var("FSGP_BENCH_SHAPE").unwrap_or_else(|_| "amazoncat".into());
    let root = PathBuf::from(
        std::env::var("FSGP_BENCH_DIR").unwrap_or_else(|_| "target/bench-ingest".into()),
    );
    std::fs::create_dir_all(&root).unwrap();
    let threads = threads();

    // Calibrate bytes per row with a small sample of the same shape.
    let sample = root.join("sample");
    run_measured(Command::new(bin).args([
        "synth",
        "--out",
        sample.to_str().unwrap(),
        "--shape",
        &shape,
        "--rows",
        "20000",
        "--test-rows",
        "1",
        "--seed",
        "7",
    ]));
    let bytes_per_row = std::fs::metadata(sample.join("train.txt")).unwrap().len() as f64 / 20000.0;

    println!(
        "ingest benchmark: shape {shape}, {threads} cores, {:.0} bytes/row of text",
        bytes_per_row
    );
    println!("| input | rows | synth s | synth MB/s | ingest s | ingest MB/s | peak RSS | peak anon | chunks on disk |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for gb in sizes {
        let rows = (gb * 1e9 / bytes_per_row).ceil() as u64;
        let data = root.join(format!("text-{gb}gb"));
        let synth = run_measured(Command::new(bin).args([
            "synth",
            "--out",
            data.to_str().unwrap(),
            "--shape",
            &shape,
            "--rows",
            &rows.to_string(),
            "--test-rows",
            "1",
            "--seed",
            "7",
        ]));
        let train = data.join("train.txt");
        let input = std::fs::metadata(&train).unwrap().len();
        let ws = root.join(format!("ws-{gb}gb"));
        let _ = std::fs::remove_dir_all(&ws);
        let ingest = run_measured(Command::new(bin).args([
            "--workspace",
            ws.to_str().unwrap(),
            "ingest",
            "--name",
            "bench",
            "--train",
            train.to_str().unwrap(),
        ]));
        println!(
            "| {:.2} GB | {rows} | {:.1} | {:.0} | {:.1} | {:.0} | {:.0} MiB | {:.0} MiB | {:.0} MiB |",
            input as f64 / 1e9,
            synth.seconds,
            input as f64 / 1e6 / synth.seconds,
            ingest.seconds,
            input as f64 / 1e6 / ingest.seconds,
            mib(ingest.peak_rss),
            mib(ingest.peak_anon),
            mib(dir_bytes(&ws.join("datasets"))),
        );
        std::fs::remove_dir_all(&data).unwrap();
        std::fs::remove_dir_all(&ws).unwrap();
    }
    std::fs::remove_dir_all(&sample).unwrap();
}
