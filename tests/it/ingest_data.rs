//! Ingest on real and generated data: values against an independent reading of the text,
//! the three layouts and compressed input giving identical rows, kill/resume, concurrency.

use crate::common;
use common::ingest::{split_rows, StoredRow as Row};
use common::*;
use fsgp::store::chunks::read_chunk_metadata;
use std::io::Write;
use std::path::Path;

/// Independent reading of an XC file, with the normalisation documented in docs/formats.md:
/// norm² summed in f64 in ascending feature order, each value v / norm rounded once to f32,
/// sq_norm = Σ (stored f32)² in f64, rounded to f32.
fn read_xc_text(path: &Path) -> (Vec<u64>, Vec<Row>) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    let header: Vec<u64> = lines
        .next()
        .unwrap()
        .split(' ')
        .map(|t| t.parse().unwrap())
        .collect();
    let rows = lines.map(parse_xc_row).collect();
    (header, rows)
}

fn parse_xc_row(line: &str) -> Row {
    let mut parts = line.split(' ').filter(|t| !t.is_empty()).peekable();
    let mut labels = Vec::new();
    if let Some(first) = parts.peek() {
        if !first.contains(':') {
            labels = first.split(',').map(|t| t.parse().unwrap()).collect();
            parts.next();
        }
    }
    let mut feats: Vec<(u32, f64)> = parts
        .map(|t| {
            let (i, v) = t.split_once(':').unwrap();
            (i.parse().unwrap(), v.parse().unwrap())
        })
        .collect();
    feats.sort_by_key(|f| f.0);
    labels.sort();
    let norm = feats.iter().map(|f| f.1 * f.1).sum::<f64>().sqrt();
    let values: Vec<f32> = feats.iter().map(|f| (f.1 * (1.0 / norm)) as f32).collect();
    let sq: f64 = values.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    Row {
        labels,
        indices: feats.iter().map(|f| f.0).collect(),
        values: values.iter().map(|v| v.to_bits()).collect(),
        sq_norm: (sq as f32).to_bits(),
    }
}

fn ingest_ok(ws: &Path, args: &[&str]) -> String {
    let out = pipeline(ws, args);
    assert!(out.status.success(), "ingest failed: {}", stderr(&out));
    // The summary goes to stderr: stdout is for results (`status --json`, metrics).
    stderr(&out)
}

#[test]
fn delicious_matches_an_independent_reading_bit_for_bit() {
    let train = shared_data("delicious/train.txt");
    let test = shared_data("delicious/test.txt");
    let ws = tempfile::tempdir().unwrap();
    // Small chunks so several files and chunk boundaries are exercised.
    ingest_delicious(ws.path(), &["--chunk-rows", "4096"]);
    let st = status_json(ws.path());
    let d = &st["datasets"][0];
    assert_eq!(
        (d["n_features"].as_u64(), d["n_labels"].as_u64()),
        (Some(500), Some(983))
    );
    for (split, path, n) in [("train", &train, 12920), ("test", &test, 3185)] {
        let (header, expected) = read_xc_text(path);
        assert_eq!(header, vec![n, 500, 983]);
        let got = split_rows(ws.path(), "delicious", split);
        assert_eq!(got.len() as u64, n);
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            assert_eq!(g, e, "{split} row {i} differs");
        }
        let s = d["splits"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["split"] == split)
            .unwrap();
        let nnz: usize = expected.iter().map(|r| r.indices.len()).sum();
        assert_eq!(s["nnz"].as_u64(), Some(nnz as u64));
        assert_eq!(
            s["unlabeled_rows"].as_u64(),
            Some(expected.iter().filter(|r| r.labels.is_empty()).count() as u64)
        );
    }
    // Dataset facts are in every chunk's key-value metadata.
    let chunk = ws
        .path()
        .join(d["splits"][0]["path"].as_str().unwrap())
        .join("part-00000.parquet");
    let kv = read_chunk_metadata(&chunk).unwrap();
    for (k, v) in [
        ("fsgp.n_features", "500"),
        ("fsgp.n_labels", "983"),
        ("fsgp.split", "train"),
        ("fsgp.normalization", "l2"),
        ("fsgp.dataset", "delicious"),
    ] {
        assert!(
            kv.contains(&(k.to_string(), v.to_string())),
            "{k} missing: {kv:?}"
        );
    }
}

/// A small XC text with label-less rows, feature-less rows and unsorted ids.
fn small_xc(rows: usize) -> (String, Vec<String>) {
    let mut lines = Vec::new();
    for i in 0..rows {
        let labels = match i % 7 {
            0 => String::new(),
            k => (0..k % 3 + 1)
                .map(|j| ((i * 3 + j * 5) % 11).to_string())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect::<Vec<_>>()
                .join(","),
        };
        let feats: Vec<String> = if i % 13 == 5 {
            Vec::new()
        } else {
            let mut ids: Vec<usize> = (0..(i % 5 + 1)).map(|j| (i * 7 + j * 11) % 40).collect();
            ids.sort();
            ids.dedup();
            ids.reverse();
            ids.iter()
                .map(|&f| format!("{f}:{}.{:03}", (i + f) % 4, (i * f) % 1000 + 1))
                .collect()
        };
        let line = match (labels.is_empty(), feats.is_empty()) {
            (true, _) => feats.join(" "),
            (false, true) => labels,
            (false, false) => format!("{labels} {}", feats.join(" ")),
        };
        lines.push(line);
    }
    (format!("{rows} 40 11\n{}\n", lines.join("\n")), lines)
}

#[test]
fn layouts_and_compression_give_identical_rows() {
    // One named transform for every layout: `auto` decides from each layout's training rows,
    // and the split layout's are half of the others'.
    let dir = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let (text, lines) = small_xc(500);
    let single = write(dir.path(), "all.txt", &text);
    ingest_ok(
        ws.path(),
        &[
            "ingest",
            "--name",
            "single",
            "--train",
            single.to_str().unwrap(),
            "--transform",
            "l2",
            "--chunk-rows",
            "64",
        ],
    );
    let reference = split_rows(ws.path(), "single", "train");
    assert_eq!(reference.len(), 500);

    // gzip and zstd copies of the same file.
    let gz = dir.path().join("all.txt.gz");
    let mut enc = flate2::write::GzEncoder::new(
        std::fs::File::create(&gz).unwrap(),
        flate2::Compression::default(),
    );
    enc.write_all(text.as_bytes()).unwrap();
    enc.finish().unwrap();
    let zst = dir.path().join("all.txt.zst");
    std::fs::write(&zst, zstd::encode_all(text.as_bytes(), 3).unwrap()).unwrap();
    for (name, path) in [("gz", &gz), ("zst", &zst)] {
        ingest_ok(
            ws.path(),
            &[
                "ingest",
                "--name",
                name,
                "--train",
                path.to_str().unwrap(),
                "--transform",
                "l2",
                "--chunk-rows",
                "64",
            ],
        );
        assert_eq!(split_rows(ws.path(), name, "train"), reference, "{name}");
    }

    // Split layout: odd rows (1-based) train, even rows test, listed out of order in column 1.
    let train_rows: Vec<usize> = (1..=500).filter(|r| r % 2 == 1).collect();
    let test_rows: Vec<usize> = (1..=500).filter(|r| r % 2 == 0).collect();
    let col = |rows: &[usize]| {
        rows.iter()
            .rev()
            .map(|r| format!("{} {r}", (r % 9) + 1))
            .collect::<Vec<_>>()
            .join("\n")
            + "\n"
    };
    let tr = write(dir.path(), "trSplit.txt", &col(&train_rows));
    let te = write(dir.path(), "tstSplit.txt", &col(&test_rows));
    ingest_ok(
        ws.path(),
        &[
            "ingest",
            "--name",
            "split",
            "--data",
            single.to_str().unwrap(),
            "--train-split",
            tr.to_str().unwrap(),
            "--test-split",
            te.to_str().unwrap(),
            "--split-column",
            "1",
            "--transform",
            "l2",
            "--chunk-rows",
            "64",
        ],
    );
    let pick = |rows: &[usize]| {
        rows.iter()
            .map(|r| reference[r - 1].clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(split_rows(ws.path(), "split", "train"), pick(&train_rows));
    assert_eq!(split_rows(ws.path(), "split", "test"), pick(&test_rows));

    // BoW layout: features and labels in separate files, 1-based ids.
    let mut x = String::from("500 40\n");
    let mut y = String::from("500 11\n");
    for line in &lines {
        let mut toks = line.split(' ').peekable();
        let labels: Vec<u32> = match toks.peek() {
            Some(t) if !t.is_empty() && !t.contains(':') => toks
                .next()
                .unwrap()
                .split(',')
                .map(|l| l.parse().unwrap())
                .collect(),
            _ => Vec::new(),
        };
        let feats: Vec<String> = toks
            .filter(|t| !t.is_empty())
            .map(|t| {
                let (i, v) = t.split_once(':').unwrap();
                format!("{}:{v}", i.parse::<u32>().unwrap() + 1)
            })
            .collect();
        x.push_str(&feats.join(" "));
        x.push('\n');
        y.push_str(
            &labels
                .iter()
                .map(|l| format!("{}:1", l + 1))
                .collect::<Vec<_>>()
                .join(" "),
        );
        y.push('\n');
    }
    let xp = write(dir.path(), "X.txt", &x);
    let yp = write(dir.path(), "Y.txt", &y);
    ingest_ok(
        ws.path(),
        &[
            "ingest",
            "--name",
            "bow",
            "--train-features",
            xp.to_str().unwrap(),
            "--train-labels",
            yp.to_str().unwrap(),
            "--index-base",
            "1",
            "--transform",
            "l2",
            "--chunk-rows",
            "64",
        ],
    );
    assert_eq!(split_rows(ws.path(), "bow", "train"), reference);
}

#[test]
fn options_normalisation_and_unlabeled_rows() {
    let dir = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let f = write(dir.path(), "t.txt", "3 4 3\n0 0:3 1:4\n 2:2\n1,2 3:1\n");
    ingest_ok(
        ws.path(),
        &[
            "ingest",
            "--name",
            "raw",
            "--train",
            f.to_str().unwrap(),
            "--no-normalize",
        ],
    );
    let raw = split_rows(ws.path(), "raw", "train");
    assert_eq!(raw[0].values, vec![3f32.to_bits(), 4f32.to_bits()]);
    assert_eq!(raw[0].sq_norm, 25f32.to_bits());
    assert!(raw[1].labels.is_empty());
    ingest_ok(
        ws.path(),
        &[
            "ingest",
            "--name",
            "dropped",
            "--train",
            f.to_str().unwrap(),
            "--drop-unlabeled",
        ],
    );
    let dropped = split_rows(ws.path(), "dropped", "train");
    assert_eq!(dropped.len(), 2);
    assert_eq!(dropped[0].values, vec![0.6f32.to_bits(), 0.8f32.to_bits()]);
    let st = status_json(ws.path());
    let d = st["datasets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "dropped")
        .unwrap()
        .clone();
    assert_eq!(d["splits"][0]["unlabeled_rows"], 1);
    assert_eq!(d["splits"][0]["dropped_unlabeled"], 1);
}

/// A text file big enough that ingest takes a while (rows of 40 features).
fn big_xc(path: &Path, rows: usize) {
    let mut w = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    writeln!(w, "{rows} 1000 50").unwrap();
    for i in 0..rows {
        write!(w, "{},{}", i % 50, (i * 7 + 1) % 50).unwrap();
        for j in 0..40 {
            write!(
                w,
                " {}:0.{:06}",
                j * 25 + (i % 25),
                (i * 31 + j) % 999_983 + 1
            )
            .unwrap();
        }
        writeln!(w).unwrap();
    }
}

#[test]
fn sigkill_midway_leaves_nothing_registered_and_a_rerun_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let f = dir.path().join("big.txt");
    big_xc(&f, 300_000);
    // Prime the workspace so its directories exist.
    create_workspace(ws.path());
    let mut child = std::process::Command::new(pipeline_bin())
        .args([
            "--workspace",
            ws.path().to_str().unwrap(),
            "ingest",
            "--name",
            "big",
            "--train",
            f.to_str().unwrap(),
            "--chunk-rows",
            "2048",
        ])
        .stderr(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait until a chunk file exists in the run's scratch space, then kill -9.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut killed_midway = false;
    while std::time::Instant::now() < deadline {
        let chunks = listing(ws.path())
            .iter()
            .filter(|p| p.starts_with("tmp/run-") && p.ends_with(".parquet"))
            .count();
        if chunks > 0 {
            killed_midway = child.try_wait().unwrap().is_none();
            child.kill().unwrap();
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    child.wait().unwrap();
    assert!(
        killed_midway,
        "the ingest finished before it could be killed; make the file bigger"
    );
    let st = status_json(ws.path());
    assert!(st["datasets"].as_array().unwrap().is_empty());
    assert_eq!(st["runs"][0]["status"], "interrupted");
    // `status` only reads; the next command that writes collects the dead run's scratch.
    create_workspace(ws.path());
    assert!(
        listing(ws.path()).iter().all(|p| !p.ends_with(".parquet")),
        "scratch files removed: {:?}",
        listing(ws.path())
    );
    ingest_ok(
        ws.path(),
        &[
            "ingest",
            "--name",
            "big",
            "--train",
            f.to_str().unwrap(),
            "--chunk-rows",
            "2048",
        ],
    );
    let st = status_json(ws.path());
    assert_eq!(st["datasets"][0]["splits"][0]["n_rows"], 300_000);
}

#[test]
fn concurrent_ingests_share_a_workspace_safely() {
    let dir = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let f = dir.path().join("mid.txt");
    big_xc(&f, 20_000);
    let spawn = |name: &str| {
        std::process::Command::new(pipeline_bin())
            .args([
                "--workspace",
                ws.path().to_str().unwrap(),
                "ingest",
                "--name",
                name,
                "--train",
                f.to_str().unwrap(),
                "--threads",
                "1",
            ])
            .output_async()
    };
    // Different names: both land.
    let (a, b) = (spawn("a"), spawn("b"));
    let (a, b) = (a.join().unwrap(), b.join().unwrap());
    assert!(
        a.status.success() && b.status.success(),
        "{} {}",
        stderr(&a),
        stderr(&b)
    );
    // The same name twice at once: exactly one dataset, the loser says why.
    let (c1, c2) = (spawn("same"), spawn("same"));
    let (c1, c2) = (c1.join().unwrap(), c2.join().unwrap());
    assert!(c1.status.success() || c2.status.success());
    for o in [&c1, &c2] {
        if !o.status.success() {
            assert!(stderr(o).contains("another process"), "{}", stderr(o));
        }
    }
    let mut names = dataset_names(ws.path());
    names.sort();
    assert_eq!(names, vec!["a", "b", "same"]);
    let dirs = listing(ws.path())
        .into_iter()
        .filter(|p| p.starts_with("datasets/") && p.matches('/').count() == 1)
        .count();
    assert_eq!(dirs, 3, "no orphaned dataset directories");
    let conn = rusqlite::Connection::open(ws.path().join("catalog.sqlite")).unwrap();
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
}

trait OutputAsync {
    fn output_async(&mut self) -> std::thread::JoinHandle<std::process::Output>;
}

impl OutputAsync for std::process::Command {
    fn output_async(&mut self) -> std::thread::JoinHandle<std::process::Output> {
        let child = self
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::spawn(move || child.wait_with_output().unwrap())
    }
}
