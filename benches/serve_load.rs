//! Load on `pipeline serve` over loopback, and the file path beside it (BENCHMARKS.md,
//! "Serving").
//!
//! Starts `pipeline serve --model MODEL` on 127.0.0.1 (port chosen by the system), then,
//! from a hyper HTTP/1.1 client on keep-alive connections (one per simulated client), for
//! FSGP_SERVE_SECONDS each (default 10, after 1 s of warm-up):
//! - single-row requests from 1, 8 and 64 concurrent connections: p50 / p99 / mean latency
//!   (request written → answer read, client side) and requests/s;
//! - 1 000-row requests from 1 and 2 connections: rows/s;
//! - then `pipeline predict --model MODEL --input FILE --output …` on the same rows
//!   repeated to at least 20 000 (best of 3 runs, whole process): rows/s;
//! - then, on a fresh server, single-row requests from 8 connections twice: alone, and
//!   beside FSGP_SERVE_SLOW (default 1 000; 0 skips this part) slow clients, half of them
//!   trickling a request head a byte every 500 ms, half holding a connection idle, each
//!   reconnecting when the server closes it: p50 / p99 of both, their ratio, and the time
//!   from SIGTERM (slow clients still connected) to the process's exit against its
//!   `--shutdown-timeout`. The slow clients need more file descriptors than the usual
//!   1 024: the soft open-files limit is raised to the hard one.
//!
//! Rows come from FSGP_SERVE_ROWS (a text file in the model's dataset syntax; an `N D L`
//! header line is skipped), sent as text lines in request order, cycling. The client runs
//! on the same machine as the server (two tokio workers), so at high concurrency the
//! figures include the client's own CPU share.
//!
//! Run: `FSGP_SERVE_MODEL=delicious.model.parquet FSGP_SERVE_ROWS=test.txt
//! cargo bench --bench serve_load` (FSGP_SERVE_THREADS: the server's scoring threads,
//! default every core; FSGP_SERVE_CONNECTIONS: the single-row levels, default "1,8,64").

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper::Request;
use hyper_util::rt::TokioIo;

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

/// The server, killed when dropped.
struct Server {
    child: Child,
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_server(model: &Path, threads: Option<&str>, extra: &[&str]) -> Server {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pipeline"));
    cmd.args(["serve", "--model"]).arg(model);
    cmd.args(["--addr", "127.0.0.1:0", "--queue", "4096"]);
    cmd.args(extra);
    if let Some(t) = threads {
        cmd.args(["--threads", t]);
    }
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting pipeline serve");
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let addr = loop {
        let mut line = String::new();
        let n = std::io::BufRead::read_line(&mut err, &mut line).unwrap();
        assert!(n > 0, "pipeline serve exited before listening");
        if let Some(a) = line.trim().strip_prefix("listening on http://") {
            break a.to_string();
        }
    };
    // The access log goes on: drained so the pipe never fills.
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    Server { child, addr }
}

/// The rows of `path` (a header line `N D L` / `N D` skipped).
fn read_rows(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).expect("reading FSGP_SERVE_ROWS");
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let header = lines.first().is_some_and(|l| {
        let fields: Vec<&str> = l.split_whitespace().collect();
        (2..=3).contains(&fields.len()) && fields.iter().all(|f| f.parse::<u64>().is_ok())
    });
    if header {
        lines.remove(0);
    }
    lines
}

/// Request bodies of `per_request` consecutive rows each, cycling through `rows`.
fn bodies(rows: &[String], per_request: usize, count: usize) -> Vec<Bytes> {
    (0..count)
        .map(|i| {
            let batch: Vec<&String> = (0..per_request)
                .map(|j| &rows[(i * per_request + j) % rows.len()])
                .collect();
            Bytes::from(serde_json::to_vec(&serde_json::json!({ "rows": batch })).unwrap())
        })
        .collect()
}

/// What one load level measured.
struct Level {
    latencies_us: Vec<f64>,
    requests: usize,
    seconds: f64,
}

/// `connections` clients, each on its own keep-alive connection, sending `bodies` in turn
/// (shared cursor) for `warmup + seconds`; latencies after the warm-up only.
async fn load(addr: &str, bodies: Arc<Vec<Bytes>>, connections: usize, seconds: f64) -> Level {
    let cursor = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let warm = started + Duration::from_secs(1);
    let end = warm + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for _ in 0..connections {
        let (addr, bodies, cursor) = (addr.to_string(), Arc::clone(&bodies), Arc::clone(&cursor));
        tasks.push(tokio::spawn(async move {
            let stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
            stream.set_nodelay(true).unwrap();
            let (mut sender, conn) = http1::handshake(TokioIo::new(stream)).await.unwrap();
            tokio::spawn(conn);
            let mut latencies = Vec::new();
            loop {
                let now = Instant::now();
                if now >= end {
                    break;
                }
                let body = bodies[cursor.fetch_add(1, Ordering::Relaxed) % bodies.len()].clone();
                let request = Request::post("/v1/predict")
                    .header("host", "bench")
                    .header("content-type", "application/json")
                    .body(Full::new(body))
                    .unwrap();
                let response = sender.send_request(request).await.unwrap();
                let status = response.status();
                let answer = response.into_body().collect().await.unwrap().to_bytes();
                assert!(
                    status.is_success(),
                    "{status}: {}",
                    String::from_utf8_lossy(&answer)
                );
                if now >= warm {
                    latencies.push(now.elapsed().as_secs_f64() * 1e6);
                }
            }
            latencies
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let requests = all.len();
    Level {
        latencies_us: all,
        requests,
        seconds,
    }
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The file path: `predict --model --input` on `rows` repeated to ≥ 20 000, best of 3.
fn file_path_rate(model: &Path, rows: &[String], threads: Option<&str>) -> (usize, f64) {
    let dir = std::env::temp_dir().join(format!("fsgp-serve-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let n = rows.len() * 20_000usize.div_ceil(rows.len());
    let input = dir.join("rows.txt");
    let text: String = (0..n)
        .map(|i| format!("{}\n", rows[i % rows.len()]))
        .collect();
    std::fs::write(&input, text).unwrap();
    let mut best = f64::INFINITY;
    for i in 0..3 {
        let out = dir.join(format!("out-{i}.parquet"));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_pipeline"));
        cmd.args(["predict", "--model"])
            .arg(model)
            .arg("--input")
            .arg(&input);
        cmd.arg("--output").arg(&out).stderr(Stdio::null());
        if let Some(t) = threads {
            cmd.args(["--threads", t]);
        }
        let started = Instant::now();
        assert!(cmd.status().unwrap().success(), "predict --input failed");
        best = best.min(started.elapsed().as_secs_f64());
    }
    let _ = std::fs::remove_dir_all(&dir);
    (n, n as f64 / best)
}

fn main() {
    let (Ok(model), Ok(rows)) = (
        std::env::var("FSGP_SERVE_MODEL"),
        std::env::var("FSGP_SERVE_ROWS"),
    ) else {
        eprintln!("serve_load: set FSGP_SERVE_MODEL (a model file) and FSGP_SERVE_ROWS (its rows)");
        return;
    };
    let (model, rows) = (PathBuf::from(model), read_rows(Path::new(&rows)));
    let seconds: f64 = env_or("FSGP_SERVE_SECONDS", "10").parse().unwrap();
    let threads = std::env::var("FSGP_SERVE_THREADS").ok();
    let levels: Vec<usize> = env_or("FSGP_SERVE_CONNECTIONS", "1,8,64")
        .split(',')
        .map(|c| c.trim().parse().unwrap())
        .collect();
    let server = start_server(&model, threads.as_deref(), &[]);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!(
        "model {} ({} rows from the rows file), {seconds} s per level, cores {}",
        model.display(),
        rows.len(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!("\n| requests | connections | p50 ms | p99 ms | mean ms | requests/s | rows/s |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let single = Arc::new(bodies(&rows, 1, rows.len()));
    for &c in &levels {
        let mut level = runtime.block_on(load(&server.addr, Arc::clone(&single), c, seconds));
        report("1 row", c, &mut level, 1);
    }
    let thousand = Arc::new(bodies(&rows, 1000, 8));
    let mut batched_rate: f64 = 0.0;
    for c in [1, 2] {
        let mut level = runtime.block_on(load(&server.addr, Arc::clone(&thousand), c, seconds));
        batched_rate = batched_rate.max(report("1 000 rows", c, &mut level, 1000));
    }
    drop(server);
    let (n, file_rate) = file_path_rate(&model, &rows, threads.as_deref());
    println!(
        "\npredict --model --input on {n} rows (whole process, best of 3): {file_rate:.0} rows/s"
    );
    println!(
        "served 1 000-row requests / file path: {:.2}",
        batched_rate / file_rate
    );
    let slow: usize = env_or("FSGP_SERVE_SLOW", "1000").parse().unwrap();
    if slow > 0 {
        beside_slow_clients(&runtime, &model, threads.as_deref(), &single, slow, seconds);
    }
}

/// The server's time limit after SIGTERM in the slow-clients part (`--shutdown-timeout`).
const SHUTDOWN_SECONDS: f64 = 5.0;

/// Normal traffic alone and beside `slow` slow clients on one fresh server, then SIGTERM.
fn beside_slow_clients(
    runtime: &tokio::runtime::Runtime,
    model: &Path,
    threads: Option<&str>,
    bodies: &Arc<Vec<Bytes>>,
    slow: usize,
    seconds: f64,
) {
    let files = raise_open_files_limit();
    let shutdown = SHUTDOWN_SECONDS.to_string();
    let connections = (slow + 64).to_string();
    let extra = [
        "--max-connections",
        connections.as_str(),
        "--shutdown-timeout",
        shutdown.as_str(),
    ];
    let mut server = start_server(model, threads, &extra);
    println!(
        "\n{slow} slow clients (half trickling a head, half idle; open-files limit {files}), \
         8 connections of single-row requests, {seconds} s each:"
    );
    println!("\n| server | p50 ms | p99 ms | mean ms | requests/s |");
    println!("|---|---:|---:|---:|---:|");
    let mut alone = runtime.block_on(load(&server.addr, Arc::clone(bodies), 8, seconds));
    let (_, alone_p99) = report_beside("alone", &mut alone);
    let end = Instant::now() + Duration::from_secs_f64(seconds + 30.0);
    let held = Arc::new(AtomicUsize::new(0));
    // The slow clients run on a runtime of their own (one thread), so that the measuring
    // client's latencies are not its tasks' scheduling delays.
    let slow_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let clients: Vec<_> = (0..slow)
        .map(|i| {
            let (addr, held) = (server.addr.clone(), Arc::clone(&held));
            slow_runtime.spawn(slow_client(addr, i % 2 == 0, end, held))
        })
        .collect();
    // Every slow client connected (the listener's backlog makes some retry), at most 10 s.
    let connecting = Instant::now();
    while held.load(Ordering::Relaxed) < slow && connecting.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let connected = held.load(Ordering::Relaxed);
    let mut beside = runtime.block_on(load(&server.addr, Arc::clone(bodies), 8, seconds));
    let (_, beside_p99) = report_beside("beside the slow clients", &mut beside);
    println!(
        "\nslow connections open when the second level started: {connected}; p99 beside / \
         alone: {:.2}",
        beside_p99 / alone_p99
    );
    let open_at_signal = held.load(Ordering::Relaxed);
    let signalled = Instant::now();
    // SAFETY: kill sends a signal to the server this bench started; no memory is touched.
    unsafe { libc::kill(server.child.id() as libc::pid_t, libc::SIGTERM) };
    let limit = Duration::from_secs_f64(SHUTDOWN_SECONDS + 10.0);
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break Some(status);
        }
        if signalled.elapsed() > limit {
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    println!(
        "SIGTERM with {} slow connections open → exit {:?} after {:.3} s (--shutdown-timeout \
         {SHUTDOWN_SECONDS} s)",
        open_at_signal,
        status.and_then(|s| s.code()),
        signalled.elapsed().as_secs_f64()
    );
    for client in clients {
        client.abort();
    }
    slow_runtime.shutdown_background();
}

/// Raises the soft open-files limit to the hard one (the slow clients' sockets); returns
/// the soft limit after.
fn raise_open_files_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read or write the struct given, which outlives them.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        limit.rlim_cur = limit.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
    }
    limit.rlim_cur
}

/// A client that holds a connection without finishing a request: trickling a head a byte
/// every 500 ms, or sending nothing; when the server closes it, it connects again (after
/// 100 ms), until `end`. `held` counts its open connections.
async fn slow_client(addr: String, trickle: bool, end: Instant, held: Arc<AtomicUsize>) {
    while Instant::now() < end {
        let Ok(stream) = tokio::net::TcpStream::connect(&addr).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        held.fetch_add(1, Ordering::Relaxed);
        let mut next: &[u8] = match trickle {
            true => b"GET /healthz HTTP/1.1\r\nHost: bench\r\nX-Slow: ",
            false => b"",
        };
        // Until the server closes the connection (or resets it).
        while Instant::now() < end {
            if !next.is_empty() && stream.try_write(next).is_err() {
                break;
            }
            next = match trickle {
                true => b"x",
                false => b"",
            };
            let wait = tokio::time::timeout(Duration::from_millis(500), stream.readable());
            if let Ok(ready) = wait.await {
                let mut sink = [0u8; 512];
                match (ready, stream.try_read(&mut sink)) {
                    (Err(_), _) | (_, Ok(0)) => break,
                    (_, Err(e)) if e.kind() != std::io::ErrorKind::WouldBlock => break,
                    _ => {}
                }
            }
        }
        held.fetch_sub(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Prints one row of the slow-clients table; returns (p50, p99) in ms.
fn report_beside(server: &str, level: &mut Level) -> (f64, f64) {
    level.latencies_us.sort_by(f64::total_cmp);
    let l = &level.latencies_us;
    let mean = l.iter().sum::<f64>() / l.len().max(1) as f64;
    let (p50, p99) = (percentile(l, 0.5) / 1e3, percentile(l, 0.99) / 1e3);
    println!(
        "| {server} | {p50:.3} | {p99:.3} | {:.3} | {:.0} |",
        mean / 1e3,
        level.requests as f64 / level.seconds
    );
    (p50, p99)
}

/// Prints one table row; returns rows/s.
fn report(what: &str, connections: usize, level: &mut Level, rows_per_request: usize) -> f64 {
    level.latencies_us.sort_by(f64::total_cmp);
    let l = &level.latencies_us;
    let mean = l.iter().sum::<f64>() / l.len().max(1) as f64;
    let rps = level.requests as f64 / level.seconds;
    let rows = rps * rows_per_request as f64;
    println!(
        "| {what} | {connections} | {:.3} | {:.3} | {:.3} | {rps:.0} | {rows:.0} |",
        percentile(l, 0.5) / 1e3,
        percentile(l, 0.99) / 1e3,
        mean / 1e3
    );
    rows
}
