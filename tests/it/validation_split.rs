//! `pipeline ingest --validation-fraction F --validation-seed S` and the stages that use the
//! carved split: the carve is deterministic (byte-identical chunks across ingests and
//! thread counts, identical rows across chunk sizes), disjoint and complete, close to F;
//! bad fractions and a missing validation split are refused with what to do; svd never
//! reads validation rows; and a spec's seed sweep runs each seed once, memoises them all on
//! a rerun and summarises them (mean ± sd) in its output and in `pipeline report`.

use crate::common;
use common::ingest::{chunk_files, split_entry, split_rows};
use common::*;
use fsgp::ingest::validation::ValidationSplit;
use std::path::{Path, PathBuf};

/// A row by content: labels, feature ids and the f32 bits of the values.
type Row = (Vec<u32>, Vec<u32>, Vec<u32>);

/// Every row of a split in order ([`split_rows`]), by content.
fn rows(ws: &Path, dataset: &str, split: &str) -> Vec<Row> {
    split_rows(ws, dataset, split)
        .into_iter()
        .map(|r| (r.labels, r.indices, r.values))
        .collect()
}

fn synth(dir: &Path, rows: u32, test_rows: u32) -> PathBuf {
    let out = dir.join("src");
    let o = pipeline(
        dir,
        &[
            "synth",
            "--out",
            out.to_str().unwrap(),
            "--rows",
            &rows.to_string(),
            "--test-rows",
            &test_rows.to_string(),
            "--features",
            "50",
            "--labels",
            "20",
            "--seed",
            "11",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    out
}

fn ingest(ws: &Path, src: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["ingest", "--name", "d", "--train", src.to_str().unwrap()];
    args.extend(extra);
    pipeline(ws, &args)
}

fn ingest_ok(ws: &Path, src: &Path, extra: &[&str]) -> String {
    let o = ingest(ws, src, extra);
    assert!(o.status.success(), "ingest {extra:?}: {}", stderr(&o));
    stderr(&o)
}

#[test]
fn the_carve_is_deterministic_disjoint_complete_and_close_to_f() {
    let dir = tempfile::tempdir().unwrap();
    let src = synth(dir.path(), 10_000, 500);
    let (train, test) = (src.join("train.txt"), src.join("test.txt"));
    let test_arg = ["--test", test.to_str().unwrap()];
    let carve = ["--validation-fraction", "0.2", "--validation-seed", "7"];
    let ws = |name: &str| dir.path().join(name);
    fn with<'a>(fixed: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
        [fixed, extra].concat()
    }
    let fixed: Vec<&str> = test_arg.iter().chain(&carve).copied().collect();
    ingest_ok(
        &ws("one-thread"),
        &train,
        &with(&fixed, &["--threads", "1", "--chunk-rows", "700"]),
    );
    ingest_ok(
        &ws("two-threads"),
        &train,
        &with(&fixed, &["--threads", "2", "--chunk-rows", "700"]),
    );
    ingest_ok(
        &ws("again"),
        &train,
        &with(&fixed, &["--threads", "2", "--chunk-rows", "700"]),
    );
    ingest_ok(
        &ws("other-chunks"),
        &train,
        &with(&fixed, &["--threads", "2", "--chunk-rows", "333"]),
    );
    ingest_ok(
        &ws("auto-chunks"),
        &train,
        &with(&fixed, &["--threads", "2"]),
    );
    ingest_ok(
        &ws("plain"),
        &train,
        &[&test_arg[..], &["--chunk-rows", "700"]].concat(),
    );

    // Bitwise-equal chunk files across thread counts and across two ingests.
    for split in ["train", "validation", "test"] {
        let reference = chunk_files(&ws("one-thread"), "d", split);
        assert!(!reference.is_empty());
        for other in ["two-threads", "again"] {
            let files = chunk_files(&ws(other), "d", split);
            assert_eq!(files.len(), reference.len(), "{other} {split}");
            for (a, b) in reference.iter().zip(&files) {
                assert!(
                    std::fs::read(a).unwrap() == std::fs::read(b).unwrap(),
                    "{other}: {} differs from {}",
                    b.display(),
                    a.display()
                );
            }
        }
        // Other chunk sizes cut the same rows differently.
        let reference_rows = rows(&ws("one-thread"), "d", split);
        for other in ["other-chunks", "auto-chunks"] {
            assert!(
                rows(&ws(other), "d", split) == reference_rows,
                "{other} {split}"
            );
        }
    }
    assert_ne!(
        chunk_files(&ws("other-chunks"), "d", "validation").len(),
        chunk_files(&ws("one-thread"), "d", "validation").len()
    );

    // train and validation partition the original training rows: each row exactly once,
    // validation holding those whose row index the seeded hash selects, both in the
    // original order; the test split is untouched.
    let original = rows(&ws("plain"), "d", "train");
    let (carved_train, carved_val) = (
        rows(&ws("one-thread"), "d", "train"),
        rows(&ws("one-thread"), "d", "validation"),
    );
    let rule = ValidationSplit::fraction(0.2, 7);
    let (mut expect_val, mut expect_train) = (Vec::new(), Vec::new());
    for (i, row) in original.iter().enumerate() {
        if rule.selects(i as u64) {
            expect_val.push(row.clone());
        } else {
            expect_train.push(row.clone());
        }
    }
    assert!(carved_val == expect_val && carved_train == expect_train);
    let mut union: Vec<Row> = carved_train.iter().chain(&carved_val).cloned().collect();
    let mut sorted_original = original.clone();
    union.sort();
    sorted_original.sort();
    assert!(
        union == sorted_original,
        "train ∪ validation ≠ the training rows"
    );
    assert!(rows(&ws("one-thread"), "d", "test") == rows(&ws("plain"), "d", "test"));

    // Binomial(10 000, 0.2): standard deviation 40 rows, 0.004 of the fraction; the stated
    // tolerance is 0.015 (3.75 sd).
    let share = carved_val.len() as f64 / original.len() as f64;
    assert!((share - 0.2).abs() < 0.015, "validation share {share}");
    assert_eq!(
        split_entry(&ws("one-thread"), "d", "validation")["n_rows"],
        carved_val.len() as u64
    );
    let status = stdout(&pipeline(&ws("one-thread"), &["status"]));
    assert!(
        status.contains(&format!("validation {:>10}", carved_val.len()))
            && status.contains("validation carved from the training rows: fraction 0.2, seed 7"),
        "{status}"
    );
}

#[test]
fn the_split_layout_carves_by_data_row_index() {
    let dir = tempfile::tempdir().unwrap();
    let src = synth(dir.path(), 600, 10);
    // All rows in one data file; every third row is test, the rest train.
    let data = src.join("train.txt");
    let (mut train_ids, mut test_ids) = (String::new(), String::new());
    for r in 1..=600 {
        let ids = if r % 3 == 0 {
            &mut test_ids
        } else {
            &mut train_ids
        };
        ids.push_str(&format!("{r}\n"));
    }
    let tr = write(dir.path(), "tr.txt", &train_ids);
    let ts = write(dir.path(), "ts.txt", &test_ids);
    let ws = dir.path().join("ws");
    let split_args = |extra: &[&str]| {
        let mut a = vec![
            "ingest".to_string(),
            "--name".into(),
            "s".into(),
            "--data".into(),
            data.display().to_string(),
            "--train-split".into(),
            tr.display().to_string(),
            "--test-split".into(),
            ts.display().to_string(),
        ];
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let run = |args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = pipeline(&ws, &args);
        assert!(o.status.success(), "{}", stderr(&o));
    };
    run(split_args(&[]));
    let all_train = rows(&ws, "s", "train");
    let test = rows(&ws, "s", "test");
    run(split_args(&["--validation-fraction", "0.3", "--replace"]));
    // The data rows' own indices decide: row r (1-based) has index r − 1.
    let rule = ValidationSplit::fraction(0.3, 0);
    let train_indices = (1..=600u64).filter(|r| r % 3 != 0).map(|r| r - 1);
    let (mut val, mut train) = (Vec::new(), Vec::new());
    for (index, row) in train_indices.zip(all_train) {
        if rule.selects(index) {
            val.push(row);
        } else {
            train.push(row);
        }
    }
    assert!(rows(&ws, "s", "validation") == val && rows(&ws, "s", "train") == train);
    assert!(rows(&ws, "s", "test") == test);
}

#[test]
fn bad_fractions_empty_splits_and_changed_carves_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let src = synth(dir.path(), 300, 50);
    let train = src.join("train.txt");
    let ws = dir.path().join("ws");
    for bad in ["0", "1", "1.5", "-0.1", "NaN"] {
        let o = ingest(&ws, &train, &[&format!("--validation-fraction={bad}")]);
        assert!(!o.status.success(), "{bad} accepted");
        assert!(
            stderr(&o).contains(&format!("{bad} is not in (0, 1)")),
            "{bad}: {}",
            stderr(&o)
        );
    }
    let o = ingest(&ws, &train, &["--validation-seed", "3"]);
    assert!(!o.status.success() && stderr(&o).contains("--validation-fraction"));
    // 300 rows at F = 1e-9: nothing selected (checked: no index below 300 is).
    let tiny = ValidationSplit::fraction(1e-9, 0);
    assert!((0..300).all(|i| !tiny.selects(i)));
    let o = ingest(&ws, &train, &["--validation-fraction", "1e-9"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("the validation split would be empty (none of the 300 training rows"),
        "{}",
        stderr(&o)
    );
    // And at F close to 1, no training row is left.
    let o = ingest(&ws, &train, &["--validation-fraction", "0.9999999999"]);
    assert!(!o.status.success() && stderr(&o).contains("the train split would be empty"));
    assert!(
        dataset_names(&ws).is_empty(),
        "a refused carve registered a dataset"
    );

    // The by-name rule covers F and S.
    ingest_ok(&ws, &train, &["--validation-fraction", "0.2"]);
    let again = ingest_ok(&ws, &train, &["--validation-fraction", "0.2"]);
    assert!(again.contains("nothing to do"), "{again}");
    let o = ingest(
        &ws,
        &train,
        &["--validation-fraction", "0.2", "--validation-seed", "1"],
    );
    assert!(!o.status.success() && stderr(&o).contains("validation_seed: 0 → 1"));
    let o = ingest(&ws, &train, &[]);
    let e = stderr(&o);
    assert!(!o.status.success());
    assert!(
        e.contains("validation_fraction: 0.2 → none") && e.contains("validation_seed: 0 → none"),
        "{e}"
    );
}

#[test]
fn a_missing_validation_split_says_how_to_create_it() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    common::toy::prepare(ws);
    let o = pipeline(
        ws,
        &[
            "train",
            "--dataset",
            "toy",
            "--factors",
            "2",
            "--batch",
            "64",
            "--epochs",
            "1",
            "--eval-every",
            "1",
            "--eval-split",
            "validation",
        ],
    );
    let e = stderr(&o);
    assert!(!o.status.success());
    assert!(
        e.contains("dataset 'toy' has no split 'validation'")
            && e.contains("--validation-fraction 0.2"),
        "{e}"
    );
}

/// A split the dataset lacks is refused before the model is read: with the run's
/// checkpoint damaged, predict of the missing split names the split, and predict of one the
/// dataset has names the damaged checkpoint (it is still verified when it is read).
#[test]
fn predict_refuses_a_missing_split_before_reading_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    common::toy::prepare(ws);
    let args = [
        "train",
        "--dataset",
        "toy",
        "--factors",
        "2",
        "--batch",
        "64",
        "--steps",
        "3",
    ];
    let o = pipeline(ws, &args);
    assert!(o.status.success(), "{}", stderr(&o));
    let run = stderr(&o)
        .split("trained run ")
        .nth(1)
        .and_then(|t| t.split(':').next())
        .unwrap_or_else(|| panic!("{}", stderr(&o)))
        .to_string();
    let ckpt = std::fs::read_dir(ws.join("train"))
        .unwrap()
        .flat_map(|d| std::fs::read_dir(d.unwrap().path()).unwrap())
        .map(|f| f.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "parquet"))
        .expect("a checkpoint");
    let mut bytes = std::fs::read(&ckpt).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&ckpt, bytes).unwrap();
    let missing = pipeline(ws, &["predict", "--run", &run, "--split", "validation"]);
    let e = stderr(&missing);
    assert!(!missing.status.success());
    assert!(e.contains("dataset 'toy' has no split 'validation'"), "{e}");
    let damaged = pipeline(ws, &["predict", "--run", &run, "--split", "test"]);
    let e = stderr(&damaged);
    assert!(!damaged.status.success());
    assert!(
        e.contains(ckpt.file_name().unwrap().to_str().unwrap()),
        "{e}"
    );
}

/// svd of a dataset with a validation split equals, byte for byte, svd of a dataset
/// ingested from only the rows the carve leaves in train: the basis never sees a
/// validation row.
#[test]
fn svd_never_reads_validation_rows() {
    let dir = tempfile::tempdir().unwrap();
    let src = synth(dir.path(), 1_200, 10);
    let train = src.join("train.txt");
    let text = std::fs::read_to_string(&train).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(' ').collect();
    let rule = ValidationSplit::fraction(0.25, 3);
    let kept: Vec<&str> = lines
        .enumerate()
        .filter(|(i, _)| !rule.selects(*i as u64))
        .map(|(_, l)| l)
        .collect();
    let only_train = write(
        dir.path(),
        "only-train.txt",
        &format!(
            "{} {} {}\n{}\n",
            kept.len(),
            header[1],
            header[2],
            kept.join("\n")
        ),
    );
    let (carved, plain) = (dir.path().join("carved"), dir.path().join("plain"));
    ingest_ok(
        &carved,
        &train,
        &[
            "--validation-fraction",
            "0.25",
            "--validation-seed",
            "3",
            "--chunk-rows",
            "256",
        ],
    );
    ingest_ok(&plain, &only_train, &["--chunk-rows", "256"]);
    assert!(rows(&carved, "d", "train") == rows(&plain, "d", "train"));
    for ws in [&carved, &plain] {
        let o = pipeline(
            ws,
            &[
                "svd",
                "--dataset",
                "d",
                "--rank",
                "6",
                "--inducing",
                "10",
                "--threads",
                "2",
            ],
        );
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let svd_dir = |ws: &Path| {
        let d = std::fs::read_dir(ws.join("svd"))
            .unwrap()
            .next()
            .unwrap()
            .unwrap();
        d.path()
    };
    let (a, b) = (svd_dir(&carved), svd_dir(&plain));
    let mut compared = 0;
    for f in [
        "basis.npy",
        "singular_values.npy",
        "kxx.npy",
        "sq_norms.npy",
        "a_init.npy",
    ] {
        assert!(
            std::fs::read(a.join(f)).unwrap() == std::fs::read(b.join(f)).unwrap(),
            "{f} differs"
        );
        compared += 1;
    }
    assert_eq!(compared, 5);
}

/// A spec sweeping three seeds on a carved validation split.
fn sweep_spec(dir: &Path) -> PathBuf {
    let text = toy_spec(
        2,
        "seeds = [4, 1, 9]\neval_every = 1\neval_split = \"validation\"\n",
        "split = \"validation\"\n",
    )
    .replace("seed = 5\n", "")
    .replace(
        "chunk_rows = 200\n",
        "chunk_rows = 200\nvalidation_fraction = 0.25\nvalidation_seed = 2\n",
    );
    let path = dir.join("sweep.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn a_seed_sweep_runs_each_seed_once_memoises_them_and_summarises_them() {
    let dir = tempfile::tempdir().unwrap();
    let spec = sweep_spec(dir.path());
    let ws = dir.path().join("ws");
    let o = pipeline(&ws, &["run", spec.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let first = stderr(&o);
    for seed in [4, 1, 9] {
        for stage in ["train", "predict", "evaluate"] {
            let line = first
                .lines()
                .find(|l| l.starts_with(&format!("{stage} (seed {seed})")) && l.contains('#'))
                .unwrap_or_else(|| panic!("no {stage} line for seed {seed}:\n{first}"));
            assert!(line.contains(" ran "), "{line}");
        }
    }
    let out: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let runs = out["runs"].as_array().unwrap();
    let seeds: Vec<u64> = runs.iter().map(|r| r["seed"].as_u64().unwrap()).collect();
    assert_eq!(seeds, [4, 1, 9]);
    // One training run per seed, each with its seed in its parameters.
    let catalog = rusqlite::Connection::open(ws.join("catalog.sqlite")).unwrap();
    let mut stmt = catalog
        .prepare("SELECT json_extract(params, '$.seed') FROM stage_runs WHERE stage = 'train'")
        .unwrap();
    let trained: Vec<i64> = stmt
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let mut sorted = trained.clone();
    sorted.sort();
    assert_eq!(sorted, [1, 4, 9], "{trained:?}");
    // The summary against the runs' own P@1: mean and sample standard deviation.
    let p1: Vec<f64> = runs
        .iter()
        .map(|r| r["metrics"]["p_at"][0].as_f64().unwrap())
        .collect();
    let mean = p1.iter().sum::<f64>() / 3.0;
    let sd = (p1.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 2.0).sqrt();
    let summary = &out["summary"]["metrics"];
    let p1_summary = summary
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "P@1")
        .unwrap();
    assert_eq!(p1_summary["n"], 3);
    assert!((p1_summary["mean"].as_f64().unwrap() - mean).abs() < 1e-12);
    assert!((p1_summary["sd"].as_f64().unwrap() - sd).abs() < 1e-12);
    for r in runs {
        assert_eq!(
            r["metrics"]["rows"],
            split_entry(&ws, "toy", "validation")["n_rows"]
        );
    }

    // A rerun finds every stage of every seed cached, and prints the same summary.
    let o = pipeline(&ws, &["run", spec.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let again = stderr(&o);
    let stage_lines: Vec<&str> = again.lines().filter(|l| l.contains('#')).collect();
    assert_eq!(stage_lines.len(), 1 + 9, "{again}");
    assert!(stage_lines.iter().all(|l| l.contains("cached")), "{again}");
    let table = stdout(&o);
    assert!(
        table.contains("over 3 seeds (4, 1, 9): mean ± sample standard deviation, in percent")
            && table.contains(&format!("{:.2} ± {:.2}", 100.0 * mean, 100.0 * sd)),
        "{table}"
    );

    // The report of any of the three runs shows the summary over the seeds.
    let run = runs[1]["train_run"].as_i64().unwrap().to_string();
    let o = pipeline(&ws, &["report", "--run", &run]);
    assert!(o.status.success(), "{}", stderr(&o));
    let md = std::fs::read_to_string(ws.join(format!("reports/train-run{run}/README.md"))).unwrap();
    assert!(
        md.contains("## Over seeds") && md.contains("Split `validation`"),
        "{md}"
    );
    assert!(
        md.contains(&format!("| P | {:.2} ± {:.2} |", 100.0 * mean, 100.0 * sd)),
        "{md}"
    );
    // The per-epoch held-out curve was recorded on the validation split.
    assert!(md.contains("metrics per epoch"), "{md}");
}

#[test]
fn a_spec_with_bad_sweep_or_validation_keys_runs_no_stage() {
    let dir = tempfile::tempdir().unwrap();
    let text = toy_spec(1, "seeds = [1, 1]\neval_split = \"validation\"\n", "").replace(
        "chunk_rows = 200\n",
        "chunk_rows = 200\nvalidation_fracton = 0.2\n",
    );
    let spec = write(dir.path(), "bad.toml", &text);
    let ws = dir.path().join("ws");
    let o = pipeline(&ws, &["run", spec.to_str().unwrap()]);
    let e = stderr(&o);
    assert!(!o.status.success());
    for expected in [
        "[ingest] unknown key 'validation_fracton' (did you mean 'validation_fraction'?)",
        "[train] seeds: seed 1 is given twice",
        "[train] seeds and seed: give one",
        "[train] eval_split = \"validation\": the dataset has no validation split",
        "no stage was run",
    ] {
        assert!(e.contains(expected), "missing {expected:?} in:\n{e}");
    }
    assert!(!dir.path().join("data").exists(), "synth ran");
    assert!(!ws.join("catalog.sqlite").exists() || dataset_names(&ws).is_empty());
}

/// The same rows as separate feature and label files (BoW layout, 0-based ids).
fn to_bow(xc: &Path, dir: &Path) -> (PathBuf, PathBuf) {
    let text = std::fs::read_to_string(xc).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(' ').collect();
    let mut x = format!("{} {}\n", header[0], header[1]);
    let mut y = format!("{} {}\n", header[0], header[2]);
    for line in lines {
        let mut tokens = line.split(' ').filter(|t| !t.is_empty()).peekable();
        let labels: Vec<&str> = match tokens.peek() {
            Some(t) if !t.contains(':') => tokens.next().unwrap().split(',').collect(),
            _ => Vec::new(),
        };
        x.push_str(&tokens.collect::<Vec<_>>().join(" "));
        x.push('\n');
        let labels: Vec<String> = labels.iter().map(|l| format!("{l}:1")).collect();
        y.push_str(&labels.join(" "));
        y.push('\n');
    }
    (write(dir, "X.txt", &x), write(dir, "Y.txt", &y))
}

#[test]
fn the_bow_layout_carves_the_same_rows_as_the_single_file_layout() {
    let dir = tempfile::tempdir().unwrap();
    let src = synth(dir.path(), 800, 10);
    let (x, y) = to_bow(&src.join("train.txt"), dir.path());
    let carve = ["--validation-fraction", "0.3", "--validation-seed", "5"];
    let single = dir.path().join("single");
    ingest_ok(&single, &src.join("train.txt"), &carve);
    let bow = dir.path().join("bow");
    let mut args = vec![
        "ingest",
        "--name",
        "d",
        "--train-features",
        x.to_str().unwrap(),
        "--train-labels",
        y.to_str().unwrap(),
    ];
    args.extend(carve);
    let o = pipeline(&bow, &args);
    assert!(o.status.success(), "{}", stderr(&o));
    for split in ["train", "validation"] {
        let a = rows(&single, "d", split);
        assert!(!a.is_empty());
        assert!(
            a == rows(&bow, "d", split),
            "{split} differs between layouts"
        );
    }
}
