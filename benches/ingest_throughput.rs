//! Ingest throughput and memory: generates XML-repository text with `pipeline synth` at two
//! sizes (default 1 GB and 2 GB), ingests each with `pipeline ingest`, and prints MB/s of
//! input and the peak resident set size of the ingest process (from wait4's rusage).
//!
//! Run: `cargo bench --bench ingest_throughput` (env FSGP_BENCH_GB="1,2" picks the sizes,
//! FSGP_BENCH_DIR the scratch directory, FSGP_BENCH_SHAPE the synth preset).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// Runs a command to completion, returning (wall seconds, peak RSS in bytes).
// wait4 below reaps the child, which clippy cannot see.
#[allow(clippy::zombie_processes)]
fn run_measured(cmd: &mut Command) -> (f64, u64) {
    let start = Instant::now();
    let child = cmd.spawn().expect("spawning pipeline");
    let mut status = 0;
    // SAFETY: rusage is plain data; wait4 fills it for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = child.id() as libc::pid_t;
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(r, pid, "wait4 failed");
    let secs = start.elapsed().as_secs_f64();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{cmd:?} failed"
    );
    (secs, usage.ru_maxrss as u64 * 1024)
}

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
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());

    // Calibrate bytes per row with a small sample of the same shape.
    let sample = root.join("sample");
    let (_, _) = run_measured(Command::new(bin).args([
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
    println!("| input | rows | synth s | synth MB/s | ingest s | ingest MB/s | peak RSS | chunks on disk |");
    println!("|---|---|---|---|---|---|---|---|");
    for gb in sizes {
        let rows = (gb * 1e9 / bytes_per_row).ceil() as u64;
        let data = root.join(format!("text-{gb}gb"));
        let (synth_s, _) = run_measured(Command::new(bin).args([
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
        let (secs, rss) = run_measured(Command::new(bin).args([
            "--workspace",
            ws.to_str().unwrap(),
            "ingest",
            "--name",
            "bench",
            "--train",
            train.to_str().unwrap(),
        ]));
        println!(
            "| {:.2} GB | {rows} | {synth_s:.1} | {:.0} | {secs:.1} | {:.0} | {:.0} MiB | {:.0} MiB |",
            input as f64 / 1e9,
            input as f64 / 1e6 / synth_s,
            input as f64 / 1e6 / secs,
            rss as f64 / (1 << 20) as f64,
            dir_bytes(&ws.join("datasets")) as f64 / (1 << 20) as f64,
        );
        std::fs::remove_dir_all(&data).unwrap();
        std::fs::remove_dir_all(&ws).unwrap();
    }
    std::fs::remove_dir_all(&sample).unwrap();
}
