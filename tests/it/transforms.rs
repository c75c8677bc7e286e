//! `ingest --transform`: the statistics against the test's own computation over the rows
//! that went to the training split, the same map applied to every split bit for bit, the
//! choice of `auto` on typical inputs, what the catalog and `status` record, and the map's
//! file checked by `verify`.

use crate::common;
use common::ingest::{dataset_entry, split_rows, IngestCase, StoredRow};
use common::*;
use fsgp::ingest::validation::ValidationSplit;
use fsgp::store::scaling::{read_scaling, SCALING_FILE};

/// Dense signed rows of 3 features on different scales, binary labels: row i has
/// `(i − 7) · 0.5`, `100 + 3·(i mod 5)`, and `−(i mod 4)` (absent where 0).
fn dense_text(rows: std::ops::Range<i32>) -> String {
    rows.map(|i| {
        let label = if i % 3 == 0 { 1 } else { -1 };
        let mut line = format!(
            "{label} 1:{} 2:{}",
            f64::from(i - 7) * 0.5,
            100 + 3 * (i % 5)
        );
        if i % 4 != 0 {
            line += &format!(" 3:{}", -(i % 4));
        }
        line + "\n"
    })
    .collect()
}

/// The features of a LIBSVM line (0-based ids), with an absent feature as 0: `[f64; 3]`.
fn dense_features(line: &str) -> [f64; 3] {
    let mut x = [0.0; 3];
    for token in line.split_whitespace().skip(1) {
        let (id, v) = token.split_once(':').unwrap();
        x[id.parse::<usize>().unwrap() - 1] = v.parse().unwrap();
    }
    x
}

/// Mean and population sd of each feature over `rows`, the plain two-pass way.
fn mean_sd(rows: &[[f64; 3]]) -> Vec<(f64, f64)> {
    let n = rows.len() as f64;
    (0..3)
        .map(|j| {
            let mean = rows.iter().map(|r| r[j]).sum::<f64>() / n;
            let var = rows.iter().map(|r| (r[j] - mean).powi(2)).sum::<f64>() / n;
            (mean, var.sqrt())
        })
        .collect()
}

/// The row the ingest should store for `x` under the map (mean, sd) per feature, centred
/// or not: each value computed in f64 and rounded once, exact zeros not stored.
fn expected(x: &[f64; 3], stats: &[(f64, f64)], centre: bool, labels: Vec<u32>) -> StoredRow {
    let (mut indices, mut values) = (Vec::new(), Vec::new());
    for j in 0..3 {
        let (mean, sd) = stats[j];
        let shift = if centre { mean } else { 0.0 };
        let v = ((x[j] - shift) * (1.0 / sd)) as f32;
        if v != 0.0 {
            indices.push(j as u32);
            values.push(v);
        }
    }
    let sq: f64 = values.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    StoredRow {
        labels,
        indices,
        values: values.iter().map(|v| v.to_bits()).collect(),
        sq_norm: (sq as f32).to_bits(),
    }
}

/// The per-feature map dataset `name` (ingested with `--transform name`) stored, after
/// checking that the catalog and the file both name the transform.
fn stored_map(d: &IngestCase, name: &str) -> fsgp::store::scaling::StoredScaling {
    let entry = dataset_entry(d.ws.path(), name);
    assert_eq!(entry["normalization"], name);
    let stored = read_scaling(
        &d.ws
            .path()
            .join(entry["path"].as_str().unwrap())
            .join(SCALING_FILE),
    )
    .unwrap();
    assert_eq!(stored.transform, name);
    stored
}

/// Ingests the dense set with `--transform NAME` and a validation carve, and checks the
/// stored map and every split's rows against the statistics of the rows carved to train.
fn check_fitted_on_training_rows(name: &str, centre: bool) {
    let d = IngestCase::empty();
    let train_text = dense_text(0..40);
    let test_text = dense_text(40..52);
    let train = d.file("train.svm", &train_text);
    let test = d.file("test.svm", &test_text);
    let carve = ValidationSplit::fraction(0.25, 3);
    d.ok(
        name,
        &[
            "--format",
            "libsvm",
            "--train",
            &train,
            "--test",
            &test,
            "--transform",
            name,
            "--validation-fraction",
            "0.25",
            "--validation-seed",
            "3",
        ],
    );
    let lines: Vec<&str> = train_text.lines().collect();
    type Lines<'a> = Vec<(usize, &'a str)>;
    let (carved, kept): (Lines, Lines) = lines
        .iter()
        .copied()
        .enumerate()
        .partition(|(i, _)| carve.selects(*i as u64));
    assert!(!carved.is_empty() && !kept.is_empty());
    let training: Vec<[f64; 3]> = kept.iter().map(|(_, l)| dense_features(l)).collect();
    let stats = mean_sd(&training);

    let stored = stored_map(&d, name);
    assert_eq!(stored.training_rows, kept.len() as u64);
    assert_eq!(stored.ids, vec![0, 1, 2]);
    for (j, &(mean, sd)) in stats.iter().enumerate() {
        let shift = if centre { mean } else { 0.0 };
        assert!(
            (stored.shift[j] - shift).abs() <= 1e-12 * mean.abs().max(1.0),
            "shift {j}"
        );
        assert!((stored.scale[j] * sd - 1.0).abs() <= 1e-12, "scale {j}");
    }
    // Every split through the same map: training, validation and test rows.
    let label = |l: &str| match l.starts_with('1') {
        true => vec![0],
        false => vec![],
    };
    let rows = |picked: &[(usize, &str)]| -> Vec<StoredRow> {
        picked
            .iter()
            .map(|(_, l)| expected(&dense_features(l), &stats, centre, label(l)))
            .collect()
    };
    // The statistics agree to ~1e-15, not bit for bit; compare the stored floats to 1 ulp.
    let close = |got: Vec<StoredRow>, want: Vec<StoredRow>, split: &str| {
        assert_eq!(got.len(), want.len(), "{split}");
        for (g, w) in got.iter().zip(&want) {
            assert_eq!((&g.labels, &g.indices), (&w.labels, &w.indices), "{split}");
            for (a, b) in g.values.iter().zip(&w.values) {
                assert!(
                    a.abs_diff(*b) <= 1,
                    "{split}: {} vs {}",
                    f32::from_bits(*a),
                    f32::from_bits(*b)
                );
            }
        }
    };
    close(split_rows(d.ws.path(), name, "train"), rows(&kept), "train");
    close(
        split_rows(d.ws.path(), name, "validation"),
        rows(&carved),
        "validation",
    );
    let test_lines: Vec<(usize, &str)> = test_text.lines().enumerate().collect();
    close(
        split_rows(d.ws.path(), name, "test"),
        rows(&test_lines),
        "test",
    );
}

#[test]
fn standardize_is_fitted_on_the_training_rows_and_applied_to_every_split() {
    check_fitted_on_training_rows("standardize", true);
}

#[test]
fn scale_is_fitted_on_the_training_rows_and_keeps_zeros() {
    check_fitted_on_training_rows("scale", false);
}

/// Ingests `text` as LIBSVM with the default transform; returns (normalization, reason,
/// whether a transform file was registered, stderr).
fn auto_of(d: &IngestCase, name: &str, text: &str) -> (String, String, bool, String) {
    let train = d.file(&format!("{name}.svm"), text);
    let err = d.ok(name, &["--format", "libsvm", "--train", &train]);
    let entry = dataset_entry(d.ws.path(), name);
    let file =
        d.ws.path()
            .join(entry["path"].as_str().unwrap())
            .join(SCALING_FILE)
            .exists();
    (
        entry["normalization"].as_str().unwrap().to_string(),
        entry["transform_reason"].as_str().unwrap_or("").to_string(),
        file,
        err,
    )
}

#[test]
fn auto_decides_from_the_training_values_and_says_why() {
    let d = IngestCase::empty();
    // Sparse word counts: 2 of 50 features a row, small whole numbers.
    let counts: String = (0..60)
        .map(|i| format!("{} {}:{} {}:1\n", i % 2, 1 + i % 25, 1 + i % 3, 26 + i % 25))
        .collect();
    // Sparse binary indicators.
    let indicators: String = (0..60)
        .map(|i| format!("{} {}:1 {}:1\n", i % 2, 1 + i % 30, 31 + i % 20))
        .collect();
    // Sparse intensities in [0, 1], mostly fractional, every feature reaching 1 somewhere
    // (pixels of strokes).
    let intensities: String = (0..60)
        .map(|i| {
            format!(
                "{} {}:0.{} {}:0.5 {}:1\n",
                i % 2,
                1 + i % 20,
                1 + i % 9,
                1 + (i + 3) % 20,
                1 + (i + 7) % 20
            )
        })
        .collect();
    // tf-idf-like: fractional, each feature's largest value following its own weight.
    let tfidf: String = (0..60)
        .map(|i| {
            let f = 1 + i % 30;
            let value = f64::from(1 + i % 3) * 0.173 * (1.0 + f64::from(f) / 10.0);
            format!("{} {f}:{value:.4} {}:0.25\n", i % 2, 31 + i % 10)
        })
        .collect();
    // Dense, signed, different scales.
    let dense = dense_text(0..60);
    // Sparse non-negative frequencies beside a run length in the thousands.
    let mixed: String = (0..60)
        .map(|i| {
            format!(
                "{} {}:0.{} 20:{}\n",
                i % 2,
                1 + i % 19,
                1 + i % 9,
                1000 + 37 * i
            )
        })
        .collect();
    // Sparse and signed.
    let signed: String = (0..60)
        .map(|i| {
            format!(
                "{} {}:{}\n",
                i % 2,
                1 + i % 10,
                if i % 2 == 0 { -0.5 } else { 0.25 }
            )
        })
        .collect();
    for (name, text, want, has_file, says) in [
        ("counts", counts.as_str(), "l2", false, "one scale"),
        ("indicators", indicators.as_str(), "l2", false, "one scale"),
        (
            "intensities",
            intensities.as_str(),
            "none",
            false,
            "kept as they are",
        ),
        ("tfidf", tfidf.as_str(), "l2", false, "one scale"),
        (
            "dense",
            dense.as_str(),
            "standardize",
            true,
            "dense features",
        ),
        ("mixed", mixed.as_str(), "scale", true, "differ"),
        ("signed", signed.as_str(), "scale", true, "signed"),
    ] {
        let (got, reason, file, err) = auto_of(&d, name, text);
        assert_eq!(got, want, "{name}: {reason}");
        assert_eq!(
            file, has_file,
            "{name}: a map file only for the fitted transforms"
        );
        assert!(reason.contains(says), "{name}: {reason}");
        assert!(
            err.contains(&format!("transform: {want} (auto: ")),
            "{name}: {err}"
        );
    }
    // `status` shows the transform and the reason.
    let out = pipeline(d.ws.path(), &["status"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains("transform standardize (auto: 91.1 % of the training values are non-zero, some negative"),
        "{text}"
    );
    assert!(text.contains("transform l2 (auto: "), "{text}");
}

#[test]
fn a_transform_asked_for_by_name_records_no_reason_and_no_normalize_is_none() {
    let d = IngestCase::empty();
    let train = d.file("t.svm", &dense_text(0..20));
    d.ok(
        "named",
        &["--format", "libsvm", "--train", &train, "--transform", "l2"],
    );
    d.ok(
        "raw",
        &["--format", "libsvm", "--train", &train, "--no-normalize"],
    );
    let named = dataset_entry(d.ws.path(), "named");
    assert_eq!(named["normalization"], "l2");
    assert!(named.get("transform_reason").is_none());
    assert_eq!(dataset_entry(d.ws.path(), "raw")["normalization"], "none");
    let rows = split_rows(d.ws.path(), "raw", "train");
    let first = dense_features(dense_text(0..1).lines().next().unwrap());
    assert_eq!(f32::from_bits(rows[0].values[0]), first[0] as f32);
    // Both at once is a usage error naming the two flags.
    let out = d.ingest(
        "both",
        &[
            "--format",
            "libsvm",
            "--train",
            &train,
            "--transform",
            "l2",
            "--no-normalize",
        ],
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("--transform") && err.contains("--no-normalize"),
        "{err}"
    );
    // An unknown name lists the known ones.
    let out = d.ingest(
        "bad",
        &[
            "--format",
            "libsvm",
            "--train",
            &train,
            "--transform",
            "zscore",
        ],
    );
    assert!(stderr(&out).contains("auto"), "{}", stderr(&out));
}

#[test]
fn verify_finds_a_damaged_transform_file() {
    let d = IngestCase::empty();
    let train = d.file("t.svm", &dense_text(0..20));
    d.ok("dense", &["--format", "libsvm", "--train", &train]);
    let entry = dataset_entry(d.ws.path(), "dense");
    let path =
        d.ws.path()
            .join(entry["path"].as_str().unwrap())
            .join(SCALING_FILE);
    let ok = pipeline(d.ws.path(), &["verify"]);
    assert!(ok.status.success(), "{}", stderr(&ok));
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&path, bytes).unwrap();
    let out = pipeline(d.ws.path(), &["verify"]);
    assert!(!out.status.success());
    let all = format!("{}{}", stderr(&out), String::from_utf8_lossy(&out.stdout));
    assert!(all.contains(SCALING_FILE), "{all}");
}

/// Word-count rows over 6 features: row i has feature j with count 1 + (i + j) mod 3 when
/// (i · (j + 1)) mod 4 is not 0, so features differ in how many rows have them.
fn count_text(rows: std::ops::Range<usize>) -> String {
    rows.map(|i| {
        let label = if i % 2 == 0 { 1 } else { -1 };
        let words: Vec<String> = (0..6)
            .filter(|j| (i * (j + 1)) % 4 != 0)
            .map(|j| format!("{}:{}", j + 1, 1 + (i + j) % 3))
            .collect();
        format!("{label} {}\n", words.join(" "))
    })
    .collect()
}

/// `tfidf` stores the idf of each feature over the rows carved to train (the test's own
/// document frequencies) and each row as `ln(1 + count) · idf` scaled to unit length, on
/// every split; a test row's feature no training row has is dropped.
#[test]
fn tfidf_is_fitted_on_the_training_rows_and_applied_to_every_split() {
    let d = IngestCase::empty();
    let train_text = count_text(0..40);
    // A test row with feature 7, which no training row has.
    let test_text = count_text(40..46) + "1 1:2 7:5\n";
    let train = d.file("train.svm", &train_text);
    let test = d.file("test.svm", &test_text);
    let carve = ValidationSplit::fraction(0.25, 3);
    d.ok(
        "tfidf",
        &[
            "--format",
            "libsvm",
            "--train",
            &train,
            "--test",
            &test,
            "--features",
            "7",
            "--transform",
            "tfidf",
            "--validation-fraction",
            "0.25",
            "--validation-seed",
            "3",
        ],
    );
    let parse = |line: &str| -> Vec<(u32, f64)> {
        line.split_whitespace()
            .skip(1)
            .map(|t| {
                let (id, v) = t.split_once(':').unwrap();
                (id.parse::<u32>().unwrap() - 1, v.parse().unwrap())
            })
            .collect()
    };
    let lines: Vec<&str> = train_text.lines().collect();
    let kept: Vec<&str> = (0..lines.len())
        .filter(|&i| !carve.selects(i as u64))
        .map(|i| lines[i])
        .collect();
    let carved: Vec<&str> = (0..lines.len())
        .filter(|&i| carve.selects(i as u64))
        .map(|i| lines[i])
        .collect();
    let n = kept.len() as f64;
    let mut df = [0u32; 7];
    for l in &kept {
        for (j, _) in parse(l) {
            df[j as usize] += 1;
        }
    }
    let idf = |j: u32| match df[j as usize] {
        0 => None,
        c => Some(((1.0 + n) / (1.0 + f64::from(c))).ln() + 1.0),
    };

    let stored = stored_map(&d, "tfidf");
    assert_eq!(stored.training_rows, kept.len() as u64);
    let present: Vec<u32> = (0..7).filter(|&j| df[j as usize] > 0).collect();
    assert_eq!(stored.ids, present);
    for (k, &j) in present.iter().enumerate() {
        assert!((stored.scale[k] - idf(j).unwrap()).abs() < 1e-12, "idf {j}");
        assert_eq!(stored.shift[k], 0.0);
    }
    let expected = |line: &str| -> (Vec<u32>, Vec<f32>) {
        let w: Vec<(u32, f64)> = parse(line)
            .into_iter()
            .filter_map(|(j, v)| idf(j).map(|idf| (j, v.ln_1p() * idf)))
            .collect();
        let norm = w.iter().map(|p| p.1 * p.1).sum::<f64>().sqrt();
        w.into_iter().map(|(j, x)| (j, (x / norm) as f32)).unzip()
    };
    let check = |split: &str, want: &[&str]| {
        let got = split_rows(d.ws.path(), "tfidf", split);
        assert_eq!(got.len(), want.len(), "{split}");
        for (g, line) in got.iter().zip(want) {
            let (ids, values) = expected(line);
            assert_eq!(g.indices, ids, "{split}: {line}");
            for (a, b) in g.values.iter().zip(&values) {
                assert!(
                    a.abs_diff(b.to_bits()) <= 1,
                    "{split}: {} vs {b}",
                    f32::from_bits(*a)
                );
            }
        }
    };
    check("train", &kept);
    check("validation", &carved);
    let test_lines: Vec<&str> = test_text.lines().collect();
    check("test", &test_lines);
    let last = split_rows(d.ws.path(), "tfidf", "test").pop().unwrap();
    assert_eq!(last.indices, vec![0], "feature 7 is dropped");
}
