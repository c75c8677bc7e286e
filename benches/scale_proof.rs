//! The larger-than-RAM proof: every stage on AmazonCat-shaped generated data (D = 203 882,
//! K = 13 330, ~71 non-zeros and ~5 labels per row) at N rows and at 4N rows, where the
//! memory-mapped K_XX̃ of the 4N run (4N × R f32) is larger than the machine's RAM.
//!
//! For each size: `synth` → `ingest` → `svd` → `train` → `predict` → `evaluate`, each
//! measured for wall time, peak RSS (VmHWM) and peak anonymous memory (RssAnon sampled
//! from /proc every 20 ms), with the page cache dropped before every stage when the
//! process may do so (root), so each stage reads its inputs from disk. Training runs one
//! full epoch at N and `FSGP_SCALE_STEPS` steps at the larger sizes: the epoch order is a
//! random permutation of the chunks, so those steps read minibatches from chunks all over
//! the file.
//!
//! Run: `cargo bench --bench scale_proof`. Environment (defaults in brackets):
//! FSGP_SCALE_ROWS [1625000] training rows N; FSGP_SCALE_FACTORS ["1,4"] the sizes, as
//! multiples of N; FSGP_SCALE_RANK [1000] R; FSGP_SCALE_STEPS [400] training steps at the
//! sizes above N; FSGP_SCALE_NEGATIVES [1000] `--negatives`; FSGP_SCALE_DIR
//! [target/scale-proof] scratch directory (each size's files are removed once measured);
//! FSGP_SCALE_STAGES [all] the stages to measure after ingest, a comma-separated subset of
//! svd,train,predict,evaluate (synth and ingest always run; each stage needs the ones
//! before it).
//! The free space of the scratch directory is checked before anything is written.

mod common;
use common::*;
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// One measured stage of one size.
struct Row {
    size: String,
    stage: &'static str,
    m: Measured,
    /// What the stage processed, for the throughput column.
    throughput: String,
    /// Wall microseconds per row (per input row, or test row for predict/evaluate), or
    /// milliseconds per step for training.
    per_unit: String,
    notes: String,
}

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    match std::env::var(key) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{key}={v}: not a valid value")),
        Err(_) => default,
    }
}

fn free_bytes(dir: &Path) -> u64 {
    let c = CString::new(dir.to_str().unwrap()).unwrap();
    // SAFETY: statvfs fills a plain struct for a NUL-terminated path.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut s) }, 0, "statvfs");
    s.f_bavail as u64 * s.f_frsize as u64
}

/// Drops the page cache (needs root); returns whether it was dropped.
fn drop_caches() -> bool {
    let _ = Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

/// Runs `pipeline ARGS`, measured; returns the measurement and the command's stderr.
fn pipeline(bin: &str, ws: &Path, args: &[&str], log: &Path) -> (Measured, String) {
    let err = std::fs::File::create(log).unwrap();
    let mut cmd = Command::new(bin);
    cmd.arg("--workspace")
        .arg(ws)
        .args(args)
        .stderr(Stdio::from(err));
    let m = run_measured(&mut cmd);
    let stderr = std::fs::read_to_string(log).unwrap_or_default();
    (m, stderr)
}

fn line_with<'a>(text: &'a str, needle: &str) -> &'a str {
    text.lines()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{text}"))
}

/// The number after `key` in `line` (e.g. "run 3" → 3).
fn number_after(line: &str, key: &str) -> f64 {
    let rest = &line[line
        .find(key)
        .unwrap_or_else(|| panic!("{key:?} not in {line:?}"))
        + key.len()..];
    let num: String = rest
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == 'e' || *c == '-' || *c == '+')
        .collect();
    num.parse()
        .unwrap_or_else(|_| panic!("no number after {key:?} in {line:?}"))
}

fn main() {
    let bin = env!("CARGO_BIN_EXE_pipeline");
    let n: u64 = env_or("FSGP_SCALE_ROWS", 1_625_000);
    let factors: Vec<u64> = std::env::var("FSGP_SCALE_FACTORS")
        .unwrap_or_else(|_| "1,4".into())
        .split(',')
        .map(|s| s.trim().parse().expect("FSGP_SCALE_FACTORS: integers"))
        .collect();
    let rank: u64 = env_or("FSGP_SCALE_RANK", 1000);
    let steps: u64 = env_or("FSGP_SCALE_STEPS", 400);
    let negatives: String = env_or("FSGP_SCALE_NEGATIVES", "1000".to_string());
    let root = PathBuf::from(
        std::env::var("FSGP_SCALE_DIR").unwrap_or_else(|_| "target/scale-proof".into()),
    );
    std::fs::create_dir_all(&root).unwrap();
    let root = root.canonicalize().unwrap();
    let ram = {
        let info = std::fs::read_to_string("/proc/meminfo").unwrap();
        number_after(line_with(&info, "MemTotal:"), "MemTotal:") as u64 * 1024
    };

    // Bytes per row of text, from a small sample of the same shape.
    let sample = root.join("sample");
    run_measured(Command::new(bin).args([
        "synth",
        "--out",
        sample.to_str().unwrap(),
        "--shape",
        "amazoncat",
        "--rows",
        "20000",
        "--seed",
        "11",
    ]));
    let sample_rows = (20000 + header_rows(&sample.join("test.txt"))) as f64;
    let text_per_row = (std::fs::metadata(sample.join("train.txt")).unwrap().len()
        + std::fs::metadata(sample.join("test.txt")).unwrap().len()) as f64
        / sample_rows;
    std::fs::remove_dir_all(&sample).unwrap();

    // Fail early when the largest size cannot fit: text (train + test), chunks (~0.4 of
    // the text), K_XX̃ (rows × R f32), predictions; files of a size are removed before
    // the next size starts, so the largest one decides.
    let largest = n * factors.iter().max().unwrap();
    let need = (text_per_row * largest as f64 * 1.26 * 1.4) as u64 + largest * rank * 4;
    let need = need + need / 10;
    let free = free_bytes(&root);
    if free < need {
        eprintln!(
            "error: the scale proof at {largest} rows needs about {:.1} GB of disk in {} \
             but only {:.1} GB are free; free space or set FSGP_SCALE_DIR / FSGP_SCALE_ROWS",
            need as f64 / 1e9,
            root.display(),
            free as f64 / 1e9
        );
        std::process::exit(2);
    }
    let stages: Vec<String> = std::env::var("FSGP_SCALE_STAGES")
        .unwrap_or_else(|_| "svd,train,predict,evaluate".into())
        .split(',')
        .map(|s| s.trim().to_string())
        .collect();
    let wants = |stage: &str| stages.iter().any(|s| s == stage);
    let cores = threads();
    println!(
        "scale proof: AmazonCat shape, N = {n}, sizes {factors:?}×N, R = {rank}, M = 500, \
         P = 30, B = 500, --negatives {negatives}; {cores} cores, {:.1} GiB RAM; \
         {:.1} GB free, {:.1} GB needed at the largest size",
        ram as f64 / (1u64 << 30) as f64,
        free as f64 / 1e9,
        need as f64 / 1e9
    );

    let mut rows_out: Vec<Row> = Vec::new();
    let mut cache_dropped = true;
    for &f in &factors {
        let rows = n * f;
        let size = if f == 1 {
            "N".to_string()
        } else {
            format!("{f}N")
        };
        let dir = root.join(format!("x{f}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (data, ws, log) = (dir.join("data"), dir.join("ws"), dir.join("stage.log"));
        let kxx_bytes = rows * rank * 4;
        eprintln!(
            "== {size}: {rows} rows; K_XX̃ will be {:.1} GiB ({:.0} % of RAM)",
            kxx_bytes as f64 / (1u64 << 30) as f64,
            100.0 * kxx_bytes as f64 / ram as f64
        );

        cache_dropped &= drop_caches();
        let synth = run_measured(Command::new(bin).args([
            "synth",
            "--out",
            data.to_str().unwrap(),
            "--shape",
            "amazoncat",
            "--rows",
            &rows.to_string(),
            "--seed",
            "11",
        ]));
        let train_txt = data.join("train.txt");
        let test_txt = data.join("test.txt");
        let text_bytes = std::fs::metadata(&train_txt).unwrap().len()
            + std::fs::metadata(&test_txt).unwrap().len();
        let test_rows = header_rows(&test_txt);
        rows_out.push(Row {
            size: size.clone(),
            stage: "synth",
            throughput: format!("{:.0} MB/s", text_bytes as f64 / 1e6 / synth.seconds),
            per_unit: format!("{:.2}", synth.seconds * 1e6 / (rows + test_rows) as f64),
            notes: format!(
                "{:.2} GB of text, {} + {test_rows} rows",
                text_bytes as f64 / 1e9,
                rows
            ),
            m: synth,
        });

        cache_dropped &= drop_caches();
        let (ingest, _) = pipeline(
            bin,
            &ws,
            &[
                "ingest",
                "--name",
                "scale",
                "--train",
                train_txt.to_str().unwrap(),
                "--test",
                test_txt.to_str().unwrap(),
            ],
            &log,
        );
        rows_out.push(Row {
            size: size.clone(),
            stage: "ingest",
            throughput: format!("{:.0} MB/s", text_bytes as f64 / 1e6 / ingest.seconds),
            per_unit: format!("{:.2}", ingest.seconds * 1e6 / (rows + test_rows) as f64),
            notes: String::new(),
            m: ingest,
        });
        std::fs::remove_dir_all(&data).unwrap();
        if !wants("svd") {
            finish_size(&dir, &size, &rows_out, cache_dropped);
            continue;
        }

        cache_dropped &= drop_caches();
        let (svd, svd_log) = pipeline(
            bin,
            &ws,
            &[
                "svd",
                "--dataset",
                "scale",
                "--rank",
                &rank.to_string(),
                "--seed",
                "11",
            ],
            &log,
        );
        let passes = line_with(&svd_log, "seconds per pass").trim().to_string();
        rows_out.push(Row {
            size: size.clone(),
            stage: "svd",
            throughput: format!("{:.0} rows/s", rows as f64 / svd.seconds),
            per_unit: format!("{:.2}", svd.seconds * 1e6 / rows as f64),
            notes: passes,
            m: svd,
        });

        if !wants("train") {
            finish_size(&dir, &size, &rows_out, cache_dropped);
            continue;
        }
        cache_dropped &= drop_caches();
        let steps_arg = steps.to_string();
        let mut train_args = vec![
            "train",
            "--dataset",
            "scale",
            "--inducing",
            "500",
            "--factors",
            "30",
            "--batch",
            "500",
            "--epochs",
            "1",
            "--negatives",
            &negatives,
            "--seed",
            "11",
            "--no-final-elbo",
            "--checkpoint-every",
            "100000",
        ];
        if f > 1 {
            train_args.extend(["--max-steps", &steps_arg]);
        }
        let (train, train_log) = pipeline(bin, &ws, &train_args, &log);
        let epoch = line_with(&train_log, "epoch 1/1:");
        let secs = number_after(&epoch[epoch.find(", ").unwrap() + 1..], "");
        let wait = number_after(epoch, "queue wait");
        let done = line_with(&train_log, "trained run");
        let run_id = number_after(done, "trained run") as u64;
        let n_steps = number_after(done, ":") as u64;
        rows_out.push(Row {
            size: size.clone(),
            stage: "train",
            throughput: format!("{:.2} steps/s", n_steps as f64 / secs),
            per_unit: format!("{:.0} ms/step", secs * 1e3 / n_steps as f64),
            notes: format!(
                "{n_steps} steps ({}), {secs:.0} s in the loop, queue wait {wait:.1} %",
                if f == 1 {
                    "one epoch".to_string()
                } else {
                    "fixed".to_string()
                }
            ),
            m: train,
        });

        if !wants("predict") {
            finish_size(&dir, &size, &rows_out, cache_dropped);
            continue;
        }
        cache_dropped &= drop_caches();
        let run = run_id.to_string();
        let (predict, _) = pipeline(
            bin,
            &ws,
            &["predict", "--run", &run, "--split", "test", "--top-k", "5"],
            &log,
        );
        rows_out.push(Row {
            size: size.clone(),
            stage: "predict",
            throughput: format!("{:.0} rows/s", test_rows as f64 / predict.seconds),
            per_unit: format!("{:.2}", predict.seconds * 1e6 / test_rows as f64),
            notes: format!("{test_rows} test rows, top 5 of 13 330"),
            m: predict,
        });

        if !wants("evaluate") {
            finish_size(&dir, &size, &rows_out, cache_dropped);
            continue;
        }
        let (evaluate, _) = pipeline(
            bin,
            &ws,
            &["evaluate", "--run", &run, "--split", "test", "--json"],
            &log,
        );
        let metrics: serde_json::Value = serde_json::from_str(&evaluate.stdout).unwrap();
        let p = |k: usize| metrics["p_at"][k - 1].as_f64().unwrap_or(f64::NAN);
        rows_out.push(Row {
            size: size.clone(),
            stage: "evaluate",
            throughput: format!("{:.0} rows/s", test_rows as f64 / evaluate.seconds),
            per_unit: format!("{:.2}", evaluate.seconds * 1e6 / test_rows as f64),
            notes: format!("P@1 {:.2}, P@5 {:.2}", 100.0 * p(1), 100.0 * p(5)),
            m: evaluate,
        });
        finish_size(&dir, &size, &rows_out, cache_dropped);
    }
}

/// Reports the disk a size used, removes its files and prints the table so far.
fn finish_size(dir: &Path, size: &str, rows: &[Row], cache_dropped: bool) {
    eprintln!(
        "   disk used by {size}: {:.1} GB",
        dir_size(dir) as f64 / 1e9
    );
    std::fs::remove_dir_all(dir).unwrap();
    print_table(rows, cache_dropped);
}

/// N from the `N D K` header of an XML-repository text file.
fn header_rows(path: &Path) -> u64 {
    use std::io::BufRead;
    let mut first = String::new();
    std::io::BufReader::new(std::fs::File::open(path).unwrap())
        .read_line(&mut first)
        .unwrap();
    first.split_whitespace().next().unwrap().parse().unwrap()
}

fn dir_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .map(|e| {
                    let p = e.unwrap().path();
                    if p.is_dir() {
                        dir_size(&p)
                    } else {
                        std::fs::metadata(&p).map_or(0, |m| m.len())
                    }
                })
                .sum()
        })
        .unwrap_or(0)
}

fn print_table(rows: &[Row], cache_dropped: bool) {
    println!();
    println!(
        "page cache dropped before every stage: {}",
        if cache_dropped {
            "yes"
        } else {
            "no (not permitted)"
        }
    );
    println!("| size | stage | wall s | throughput | cost per row (µs) or step | peak RSS | peak anon | notes |");
    println!("|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {:.1} | {} | {} | {:.0} MiB | {:.0} MiB | {} |",
            r.size,
            r.stage,
            r.m.seconds,
            r.throughput,
            r.per_unit,
            mib(r.m.peak_rss),
            mib(r.m.peak_anon),
            r.notes
        );
    }
}
