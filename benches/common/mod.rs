//! Shared by the benchmark binaries: running a `pipeline` command while measuring it.
#![allow(dead_code)]

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Wall time and memory of one command.
#[derive(Debug, Clone)]
pub struct Measured {
    pub seconds: f64,
    /// Peak resident set size (VmHWM, from wait4's rusage): anonymous + file-backed pages.
    pub peak_rss: u64,
    /// Peak anonymous (not file-backed) resident memory, sampled from /proc/PID/status
    /// every 20 ms; memory-mapped outputs live in the page cache and are not counted here.
    pub peak_anon: u64,
    pub stdout: String,
}

fn rss_anon_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("RssAnon:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Runs `cmd` to completion (it must succeed), measuring time and memory.
// wait4 below reaps the child, which clippy cannot see.
#[allow(clippy::zombie_processes)]
pub fn run_measured(cmd: &mut Command) -> Measured {
    let out_path = std::env::temp_dir().join(format!("fsgp-bench-{}.out", std::process::id()));
    let out_file = std::fs::File::create(&out_path).unwrap();
    let start = Instant::now();
    let child = cmd.stdout(out_file).spawn().expect("spawning pipeline");
    let pid = child.id();
    let done = Arc::new(AtomicBool::new(false));
    let peak_anon = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (done, peak) = (Arc::clone(&done), Arc::clone(&peak_anon));
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                if let Some(a) = rss_anon_bytes(pid) {
                    peak.fetch_max(a, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let mut status = 0;
    // SAFETY: rusage is plain data; wait4 fills it for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::wait4(pid as libc::pid_t, &mut status, 0, &mut usage) };
    assert_eq!(r, pid as libc::pid_t, "wait4 failed");
    let seconds = start.elapsed().as_secs_f64();
    done.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let _ = std::fs::remove_file(&out_path);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{cmd:?} failed:\n{stdout}"
    );
    Measured {
        seconds,
        peak_rss: usage.ru_maxrss as u64 * 1024,
        peak_anon: peak_anon.load(Ordering::Relaxed),
        stdout,
    }
}

pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

pub fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// faer's f64 GEMM rate on n×n matrices, all threads, best of 3.
pub fn gemm_gflops(n: usize) -> f64 {
    let a = faer::Mat::<f64>::from_fn(n, n, |i, j| ((i * 7 + j * 3) % 11) as f64);
    let b = faer::Mat::<f64>::from_fn(n, n, |i, j| ((i * 5 + j) % 13) as f64);
    let _warm = &a * &b;
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t = Instant::now();
        std::hint::black_box(&a * &b);
        best = best.min(t.elapsed().as_secs_f64());
    }
    2.0 * (n as f64).powi(3) / best / 1e9
}
