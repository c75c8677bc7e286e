//! LIBSVM / SVMlight ingest (`--format libsvm`) and `--first-label`: label kinds and class
//! maps, chunk rows against an independent reading of the text bit for bit, every error
//! naming FILE:LINE, and the real classification data (banana, MNIST) against counts taken
//! here from the gzip files directly.

use crate::common;
use common::ingest::{dataset_entry as dataset, split_rows, IngestCase, StoredRow as Row};
use common::*;
use fsgp::ingest::validation::ValidationSplit;
use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

/// The test's own reading of a LIBSVM row with 1-based indices: (label values in file
/// order, features sorted by index, 0-based).
fn read_libsvm_line(line: &str) -> (Vec<i64>, Vec<(u32, f64)>) {
    let mut parts = line.split_whitespace().peekable();
    let mut labels = Vec::new();
    if let Some(first) = parts.peek() {
        if !first.contains(':') {
            labels = first.split(',').map(|t| t.parse().unwrap()).collect();
            parts.next();
        }
    }
    let mut feats: Vec<(u32, f64)> = parts
        .filter(|t| !t.starts_with("qid:"))
        .map(|t| {
            let (i, v) = t.split_once(':').unwrap();
            (i.parse::<u32>().unwrap() - 1, v.parse().unwrap())
        })
        .collect();
    feats.sort_by_key(|f| f.0);
    (labels, feats)
}

/// The row the ingest should store (docs/formats.md: norm² summed in f64 in ascending index
/// order, each value v / norm rounded once to f32; sq_norm = Σ stored² in f64, to f32).
fn expected_row(labels: Vec<u32>, feats: &[(u32, f64)], normalize: bool) -> Row {
    let norm = feats.iter().map(|f| f.1 * f.1).sum::<f64>().sqrt();
    let values: Vec<f32> = feats
        .iter()
        .map(|f| match normalize && norm > 0.0 {
            true => (f.1 * (1.0 / norm)) as f32,
            false => f.1 as f32,
        })
        .collect();
    let sq: f64 = values.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    Row {
        labels,
        indices: feats.iter().map(|f| f.0).collect(),
        values: values.iter().map(|v| v.to_bits()).collect(),
        sq_norm: (sq as f32).to_bits(),
    }
}

/// Rows of a LIBSVM text as the ingest should store them, labels mapped by `map` (value →
/// id, values without an id give no label).
fn expected_rows(text: &str, map: &BTreeMap<i64, u32>, normalize: bool) -> Vec<Row> {
    text.lines()
        .map(|line| {
            let (values, feats) = read_libsvm_line(line);
            let mut ids: Vec<u32> = values.iter().filter_map(|v| map.get(v).copied()).collect();
            ids.sort();
            expected_row(ids, &feats, normalize)
        })
        .collect()
}

const BINARY_PM: &str = "+1 1:0.5 3:-2\n-1 2:1.25\n1 1:3 2:4 3:0.1\n-1 3:7e-3\n";
const BINARY_01: &str = "1 1:0.5 3:-2\n0 2:1.25\n1 1:3 2:4 3:0.1\n0 3:7e-3\n";

#[test]
fn binary_plus_minus_one_and_zero_one() {
    let d = IngestCase::empty();
    for (name, text, negative) in [("pm", BINARY_PM, -1), ("zo", BINARY_01, 0)] {
        let train = d.file(&format!("{name}.txt"), text);
        let err = d.ok(
            name,
            &["--format", "libsvm", "--train", &train, "--transform", "l2"],
        );
        assert!(err.contains("labels: binary (detected"), "{err}");
        let ds = dataset(d.ws.path(), name);
        assert_eq!(ds["format"], "libsvm");
        assert_eq!(ds["recorded_label_kind"], "binary");
        assert_eq!(ds["n_labels"], 1);
        assert_eq!(ds["n_features"], 3);
        assert_eq!(ds["index_base"], 1, "LIBSVM indices are 1-based by default");
        assert_eq!(
            ds["class_map"],
            serde_json::json!({"values": [1], "negative": negative})
        );
        let map = BTreeMap::from([(1, 0)]);
        let rows = split_rows(d.ws.path(), name, "train");
        assert_eq!(rows, expected_rows(text, &map, true));
        assert_eq!(
            rows.iter().map(|r| r.labels.len()).collect::<Vec<_>>(),
            [1, 0, 1, 0]
        );
        // The negative rows are kept even under --drop-unlabeled: they have a class.
        let kept = d.ok(
            &format!("{name}-drop"),
            &["--format", "libsvm", "--train", &train, "--drop-unlabeled"],
        );
        assert!(kept.contains("label kind: binary"), "{kept}");
        assert_eq!(
            split_rows(d.ws.path(), &format!("{name}-drop"), "train").len(),
            4
        );
    }
    // One class only: ambiguous unless the user says binary.
    let positives = d.file("pos.txt", "1 1:1\n1 2:1\n");
    d.fails(
        &["--format", "libsvm", "--train", &positives],
        "found the same label 1 in all 2 rows",
        "--label-kind binary",
    );
    d.ok(
        "pos",
        &[
            "--format",
            "libsvm",
            "--train",
            &positives,
            "--label-kind",
            "binary",
        ],
    );
    let ds = dataset(d.ws.path(), "pos");
    assert_eq!(ds["class_map"], serde_json::json!({"values": [1]}));
    assert_eq!(ds["n_labels"], 1);
    let negatives = d.file("neg.txt", "-1 1:1\n-1 2:1\n");
    d.ok(
        "neg",
        &[
            "--format",
            "libsvm",
            "--train",
            &negatives,
            "--label-kind",
            "binary",
        ],
    );
    let rows = split_rows(d.ws.path(), "neg", "train");
    assert!(rows.iter().all(|r| r.labels.is_empty()));
    assert_eq!(
        dataset(d.ws.path(), "neg")["class_map"],
        serde_json::json!({"values": [1], "negative": -1})
    );
    // Forced binary on class values that are not ±1 / 0/1.
    let classes = d.file("classes.txt", "2 1:1\n5 2:1\n");
    d.fails(
        &[
            "--format",
            "libsvm",
            "--train",
            &classes,
            "--label-kind",
            "binary",
        ],
        "--label-kind binary: found label values {2, 5}",
        "expected -1 and +1, or 0 and 1",
    );
}

#[test]
fn multiclass_ids_are_ranks_over_train_and_test() {
    let d = IngestCase::empty();
    let train_text = "7 1:1 4:2\n-2 2:0.5\n3 3:1\n7 1:-1\n";
    let test_text = "11 1:1\n3 4:1\n";
    let train = d.file("train.txt", train_text);
    let test = d.file("test.txt", test_text);
    let err = d.ok(
        "mc",
        &[
            "--format",
            "libsvm",
            "--train",
            &train,
            "--test",
            &test,
            "--no-normalize",
        ],
    );
    assert!(err.contains("labels: multiclass (detected"), "{err}");
    assert!(err.contains("L = 4, D = 4"), "{err}");
    let ds = dataset(d.ws.path(), "mc");
    assert_eq!(ds["recorded_label_kind"], "multiclass");
    assert_eq!(ds["n_labels"], 4);
    assert_eq!(
        ds["class_map"],
        serde_json::json!({"values": [-2, 3, 7, 11]})
    );
    let map = BTreeMap::from([(-2, 0), (3, 1), (7, 2), (11, 3)]);
    assert_eq!(
        split_rows(d.ws.path(), "mc", "train"),
        expected_rows(train_text, &map, false)
    );
    assert_eq!(
        split_rows(d.ws.path(), "mc", "test"),
        expected_rows(test_text, &map, false)
    );
    let ids: Vec<Vec<u32>> = split_rows(d.ws.path(), "mc", "train")
        .into_iter()
        .map(|r| r.labels)
        .collect();
    assert_eq!(ids, [vec![2], vec![0], vec![1], vec![2]]);
    // Two values that are not a binary pair are two classes.
    let two = d.file("two.txt", "2 1:1\n5 2:1\n");
    d.ok("two", &["--format", "libsvm", "--train", &two]);
    assert_eq!(
        dataset(d.ws.path(), "two")["recorded_label_kind"],
        "multiclass"
    );
    // Binary-looking values as two classes when asked.
    let zo = d.file("zo.txt", BINARY_01);
    d.ok(
        "zo-mc",
        &[
            "--format",
            "libsvm",
            "--train",
            &zo,
            "--label-kind",
            "multiclass",
        ],
    );
    assert_eq!(
        dataset(d.ws.path(), "zo-mc")["class_map"],
        serde_json::json!({"values": [0, 1]})
    );
}

#[test]
fn multilabel_rows_may_have_several_labels_or_none() {
    let d = IngestCase::empty();
    let text = "5,1 1:1 2:2\n 2:1\n3 1:2 # a comment 9:9\n1,3,5 2:0.5\n";
    let train = d.file("ml.txt", text);
    let err = d.ok(
        "ml",
        &["--format", "libsvm", "--train", &train, "--transform", "l2"],
    );
    assert!(err.contains("labels: multilabel (detected"), "{err}");
    assert!(err.contains("ml.txt:1 has several labels"), "{err}");
    let ds = dataset(d.ws.path(), "ml");
    assert_eq!(ds["recorded_label_kind"], "multilabel");
    assert_eq!(ds["class_map"], serde_json::json!({"values": [1, 3, 5]}));
    assert_eq!(ds["n_features"], 2, "the comment's 9:9 is not a feature");
    let map = BTreeMap::from([(1, 0), (3, 1), (5, 2)]);
    let without_comment = text.replace(" # a comment 9:9", "");
    assert_eq!(
        split_rows(d.ws.path(), "ml", "train"),
        expected_rows(&without_comment, &map, true)
    );
    // --drop-unlabeled keeps its meaning for multi-label data.
    d.ok(
        "ml-drop",
        &["--format", "libsvm", "--train", &train, "--drop-unlabeled"],
    );
    assert_eq!(split_rows(d.ws.path(), "ml-drop", "train").len(), 3);
    // A forced multi-class kind refuses the rows that are not one label.
    d.fails(
        &[
            "--format",
            "libsvm",
            "--train",
            &train,
            "--label-kind",
            "multiclass",
        ],
        &format!("{train}:1: "),
        "found 2 labels, expected exactly one",
    );
}

#[test]
fn qid_tokens_are_ignored_with_one_warning() {
    let d = IngestCase::empty();
    let text = "1 qid:1 1:1\n-1 qid:1 2:1\n1 qid:2 1:0.5 2:0.5\n";
    let train = d.file("q.txt", text);
    let test = d.file("qt.txt", "-1 qid:3 1:2\n");
    let err = d.ok(
        "q",
        &[
            "--format",
            "libsvm",
            "--train",
            &train,
            "--test",
            &test,
            "--transform",
            "l2",
        ],
    );
    assert_eq!(err.matches("warning:").count(), 1, "{err}");
    assert!(err.contains("warning: ignored 4 'qid:' tokens"), "{err}");
    let map = BTreeMap::from([(1, 0)]);
    assert_eq!(
        split_rows(d.ws.path(), "q", "train"),
        expected_rows(text, &map, true)
    );
}

#[test]
fn gzip_and_zstd_inputs_give_the_same_rows() {
    let d = IngestCase::empty();
    let text = "3 1:1 4:2\n1 2:0.5\n2 3:1 1:4\n";
    let plain = d.file("p.txt", text);
    let gz = d.dir.path().join("p.txt.gz");
    let mut enc = flate2::write::GzEncoder::new(
        std::fs::File::create(&gz).unwrap(),
        flate2::Compression::default(),
    );
    enc.write_all(text.as_bytes()).unwrap();
    enc.finish().unwrap();
    let zst = d.dir.path().join("p.txt.zst");
    std::fs::write(&zst, zstd::encode_all(text.as_bytes(), 3).unwrap()).unwrap();
    d.ok("plain", &["--format", "libsvm", "--train", &plain]);
    d.ok(
        "gz",
        &["--format", "libsvm", "--train", gz.to_str().unwrap()],
    );
    d.ok(
        "zst",
        &["--format", "libsvm", "--train", zst.to_str().unwrap()],
    );
    let rows = split_rows(d.ws.path(), "plain", "train");
    assert_eq!(split_rows(d.ws.path(), "gz", "train"), rows);
    assert_eq!(split_rows(d.ws.path(), "zst", "train"), rows);
    let sources = &dataset(d.ws.path(), "gz")["sources"];
    assert_eq!(sources[0]["compression"], "gzip");
    // Decreasing indices are accepted and sorted, as in the XC formats.
    assert_eq!(rows[2].indices, [0, 2]);
}

#[test]
fn every_malformed_token_names_file_and_line() {
    // A workspace holding a dataset already, so that "left as it was" is not trivial.
    let d = IngestCase::new();
    let good = "1 1:1\n-1 2:1\n";
    let cases: [(&str, &str, u64, &str); 11] = [
        (
            "bad label",
            "x 1:1\n",
            3,
            "found label 'x' in 'x', expected an integer class label",
        ),
        ("fractional label", "1.5 1:1\n", 3, "found label '1.5'"),
        (
            "empty label entry",
            "1,,2 1:1\n",
            3,
            "found label '' in '1,,2'",
        ),
        (
            "index 0",
            "1 0:1\n",
            3,
            "found feature id 0, expected ids >= 1 (--index-base 1)",
        ),
        (
            "non-numeric value",
            "1 1:abc\n",
            3,
            "found value 'abc' in token '1:abc', expected a decimal number",
        ),
        (
            "non-finite value",
            "1 1:inf\n",
            3,
            "found non-finite value 'inf'",
        ),
        ("nan value", "1 2:nan\n", 3, "found non-finite value 'nan'"),
        (
            "duplicate index",
            "1 2:1 2:3\n",
            3,
            "found feature 2 twice in the row",
        ),
        (
            "duplicate label",
            "1,1 2:1\n",
            3,
            "found label 1 twice in the row",
        ),
        (
            "no colon",
            "1 2\n",
            3,
            "found token '2', expected 'feature:value'",
        ),
        (
            "negative index",
            "1 -3:1\n",
            3,
            "found feature id '-3', expected a non-negative integer",
        ),
    ];
    for (what, bad, line, text) in cases {
        let (name, input) = (
            format!("{}.txt", what.replace(' ', "-")),
            format!("{good}{bad}"),
        );
        let err = d.train_file_fails(&["--format", "libsvm"], (&name, &input), line, text);
        assert!(err.contains(text), "{what}: {err}");
    }
    // The test file's lines are named too, and index ≥ --features D.
    let train = d.file("t.txt", good);
    let test = d.file("tt.txt", "1 1:1\n1 5:1\n");
    d.fails(
        &[
            "--format",
            "libsvm",
            "--train",
            &train,
            "--test",
            &test,
            "--features",
            "4",
        ],
        &format!("{test}:2: "),
        "found feature id 5, expected < 5 (D = 4 from --features)",
    );
    // Binary rows need exactly one label.
    let unlabeled = d.file("u.txt", "1 1:1\n 2:1\n");
    d.fails(
        &[
            "--format",
            "libsvm",
            "--train",
            &unlabeled,
            "--label-kind",
            "binary",
        ],
        &format!("{unlabeled}:2: "),
        "found 0 labels, expected exactly one",
    );
    // CRLF and a missing last newline as in the XC formats.
    let crlf = d.file("crlf.txt", "1 1:1\r\n");
    d.fails(
        &["--format", "libsvm", "--train", &crlf],
        &format!("{crlf}:1: "),
        "CRLF",
    );
    let cut = d.file("cut.txt", "1 1:1\n-1 2:1");
    d.fails(
        &["--format", "libsvm", "--train", &cut],
        &format!("{cut}:2: "),
        "without a '\\n' line end",
    );
    // Options that do not apply.
    let xc = d.file("xc.txt", "1 2 2\n0 0:1\n");
    d.fails(
        &["--train", &xc, "--label-kind", "binary"],
        "label-kind",
        "applies to --format libsvm",
    );
    d.fails(
        &["--train", &xc, "--features", "3"],
        "features",
        "applies to --format libsvm",
    );
    d.fails(
        &[
            "--format",
            "libsvm",
            "--train",
            &train,
            "--first-label",
            "--label-kind",
            "binary",
        ],
        "label-kind",
        "cannot be combined with --first-label",
    );
    d.fails(
        &["--format", "bow", "--train", &xc],
        "--format bow",
        "the given files are the 'xc' layout's",
    );
}

#[test]
fn lenient_skips_bad_rows_in_both_passes() {
    let d = IngestCase::empty();
    let text = "1 1:1\n9 1:x\n-1 2:1\r\n1 1:2\n";
    let train = d.file("l.txt", text);
    let err = d.ok("l", &["--format", "libsvm", "--train", &train, "--lenient"]);
    // The skipped row's label 9 is not a class: the data is binary.
    assert!(err.contains("labels: binary"), "{err}");
    let ds = dataset(d.ws.path(), "l");
    assert_eq!(ds["splits"][0]["skipped_rows"], 1);
    assert_eq!(ds["splits"][0]["n_rows"], 3);
}

#[test]
fn first_label_makes_an_xc_file_multiclass() {
    let d = IngestCase::empty();
    // Header N D L; the first *listed* label counts (5 in "5,2"), not the smallest.
    let train = d.file("x.txt", "4 3 10\n5,2 0:1\n 1:1\n3 2:2\n5 0:1 1:1\n");
    let test = d.file("y.txt", "2 3 10\n9,1 2:1\n2,3 0:3\n");
    let err = d.ok(
        "fl",
        &[
            "--train",
            &train,
            "--test",
            &test,
            "--first-label",
            "--no-normalize",
        ],
    );
    assert!(
        err.contains("labels: multiclass (--first-label); L = 4, D = 3"),
        "{err}"
    );
    assert!(
        err.contains("1 rows without a (first) label were dropped"),
        "{err}"
    );
    let ds = dataset(d.ws.path(), "fl");
    assert_eq!(ds["format"], "xc");
    assert_eq!(ds["recorded_label_kind"], "multiclass");
    assert_eq!(ds["class_map"], serde_json::json!({"values": [2, 3, 5, 9]}));
    assert_eq!(ds["params"]["first_label"], true);
    let train_rows = split_rows(d.ws.path(), "fl", "train");
    let labels: Vec<Vec<u32>> = train_rows.iter().map(|r| r.labels.clone()).collect();
    assert_eq!(labels, [vec![2], vec![1], vec![2]]);
    assert_eq!(ds["splits"][0]["dropped_unlabeled"], 1);
    let test_labels: Vec<Vec<u32>> = split_rows(d.ws.path(), "fl", "test")
        .into_iter()
        .map(|r| r.labels)
        .collect();
    assert_eq!(test_labels, [vec![3], vec![0]]);
    // The header's L still bounds the ids read.
    let big = d.file("big.txt", "1 3 4\n7 0:1\n");
    d.fails(
        &["--train", &big, "--first-label"],
        &format!("{big}:2: "),
        "found label id 7, expected < 4 (L = 4 in the header)",
    );
}

#[test]
fn xc_ingests_keep_their_parameters_and_read_as_multilabel() {
    let d = IngestCase::empty();
    let train = d.file("x.txt", "2 3 4\n1,2 0:1\n3 2:1\n");
    d.ok("x", &["--train", &train]);
    let ds = dataset(d.ws.path(), "x");
    assert!(ds.get("recorded_label_kind").is_none(), "{ds}");
    assert!(ds.get("class_map").is_none(), "{ds}");
    let keys: Vec<&String> = ds["params"].as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        [
            "chunk_mb",
            "chunk_rows",
            "drop_unlabeled",
            "format",
            "index_base",
            "lenient",
            "normalization",
            "sources",
            "split_column"
        ]
    );
    assert_eq!(ds["params"]["index_base"], 0);
    // `--format xc` names the layout the flags already select: the same ingest.
    let again = d.ok("x", &["--train", &train, "--format", "xc"]);
    assert!(again.contains("nothing to do"), "{again}");
}

#[test]
fn the_validation_carve_works_on_libsvm_rows() {
    let d = IngestCase::empty();
    let text: String = (0..400)
        .map(|i| format!("{} {}:1 {}:0.5\n", i % 3, i % 7 + 1, i % 5 + 8))
        .collect();
    let train = d.file("v.txt", &text);
    d.ok(
        "v",
        &[
            "--format",
            "libsvm",
            "--train",
            &train,
            "--validation-fraction",
            "0.25",
            "--validation-seed",
            "3",
            "--no-normalize",
        ],
    );
    let carve = ValidationSplit::fraction(0.25, 3);
    let map = BTreeMap::from([(0, 0), (1, 1), (2, 2)]);
    let all = expected_rows(&text, &map, false);
    // Row i (0-based, the file's line i + 1: no header) goes to validation iff selected.
    let (picked, kept): (Vec<_>, Vec<_>) = (0..all.len()).partition(|&i| carve.selects(i as u64));
    let rows = |idx: Vec<usize>| idx.into_iter().map(|i| all[i].clone()).collect::<Vec<_>>();
    assert_eq!(split_rows(d.ws.path(), "v", "validation"), rows(picked));
    assert_eq!(split_rows(d.ws.path(), "v", "train"), rows(kept));
}

#[test]
fn a_spec_takes_the_same_keys_and_checks_them_first() {
    let d = IngestCase::empty();
    let spec = |ingest: &str| {
        let text = format!(
            "[ingest]\nname = \"b\"\ntrain = \"b.txt\"\n{ingest}\n[svd]\nrank = 1\n\
             inducing = 2\n[train]\nepochs = 1\n[predict]\ntop_k = 1\n"
        );
        write(d.dir.path(), "spec.toml", &text)
    };
    let bad = spec("format = \"svmlite\"\nlabel_kind = \"ternary\"\nfeatures = 0\n");
    let out = pipeline(d.ws.path(), &["run", bad.to_str().unwrap()]);
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(err.contains("[ingest]") && err.contains("svmlite"), "{err}");
    assert!(err.contains("ternary"), "{err}");
    assert!(
        err.contains("no stage was run") || err.contains("spec.toml: "),
        "{err}"
    );
    let bad = spec("format = \"libsvm\"\nfeatures = 0\n");
    let err = stderr(&pipeline(d.ws.path(), &["run", bad.to_str().unwrap()]));
    assert!(
        err.contains("[ingest] features: invalid value '0': 0 is not in 1..=2147483647"),
        "{err}"
    );
    let bad = spec("label_kind = \"binary\"\n");
    let err = stderr(&pipeline(d.ws.path(), &["run", bad.to_str().unwrap()]));
    assert!(
        err.contains("[ingest] label_kind applies to --format libsvm"),
        "{err}"
    );
    assert!(
        !d.ws.path().join("catalog.sqlite").exists(),
        "a workspace was made"
    );
}

/// Counts taken straight from a gzip LIBSVM file: rows, and rows per label value.
fn count_labels(path: &Path) -> (u64, BTreeMap<i64, u64>) {
    let file = std::fs::File::open(path).unwrap();
    let reader = std::io::BufReader::new(flate2::read::GzDecoder::new(file));
    let mut counts = BTreeMap::new();
    let mut rows = 0;
    for line in reader.lines() {
        let line = line.unwrap();
        let label: i64 = line.split(' ').next().unwrap().parse().unwrap();
        *counts.entry(label).or_insert(0) += 1;
        rows += 1;
    }
    (rows, counts)
}

/// Rows per label id over a split's chunks.
fn chunk_label_counts(ws: &Path, name: &str, split: &str) -> (usize, BTreeMap<u32, u64>) {
    let rows = split_rows(ws, name, split);
    let mut counts = BTreeMap::new();
    for r in &rows {
        for &l in &r.labels {
            *counts.entry(l).or_insert(0) += 1;
        }
    }
    (rows.len(), counts)
}

/// Ingests a classification data set from `../shared/data/classification/NAME`.
fn ingest_classification(d: &IngestCase, name: &str, extra: &[&str]) -> (PathBuf, PathBuf) {
    let dir = shared_data("classification").join(name);
    let (train, test) = (dir.join("train.txt.gz"), dir.join("test.txt.gz"));
    let mut args = vec![
        "--format",
        "libsvm",
        "--train",
        train.to_str().unwrap(),
        "--test",
        test.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    d.ok(name, &args);
    (train, test)
}

#[test]
fn banana_is_binary_with_the_counts_of_its_files() {
    let d = IngestCase::empty();
    let (train, test) = ingest_classification(&d, "banana", &[]);
    let ds = dataset(d.ws.path(), "banana");
    assert_eq!(
        (ds["n_features"].as_u64(), ds["n_labels"].as_u64()),
        (Some(2), Some(1))
    );
    assert_eq!(ds["recorded_label_kind"], "binary");
    for (split, path, n) in [("train", &train, 400), ("test", &test, 4900)] {
        let (rows, by_value) = count_labels(path);
        assert_eq!(rows, n);
        assert_eq!(by_value.keys().copied().collect::<Vec<_>>(), [-1, 1]);
        let (n_rows, by_id) = chunk_label_counts(d.ws.path(), "banana", split);
        assert_eq!(n_rows as u64, n);
        assert_eq!(
            by_id.get(&0).copied(),
            Some(by_value[&1]),
            "{split} positives"
        );
    }
}

#[test]
fn mnist_odd_even_and_ten_classes() {
    let d = IngestCase::empty();
    // MNIST's last pixels are zero in every image: the largest index seen is 780, so D =
    // 784 needs --features 784.
    let (train, test) = ingest_classification(&d, "mnist-oddeven", &["--features", "784"]);
    let ds = dataset(d.ws.path(), "mnist-oddeven");
    assert_eq!(
        (ds["n_features"].as_u64(), ds["n_labels"].as_u64()),
        (Some(784), Some(1))
    );
    assert_eq!(ds["recorded_label_kind"], "binary");
    for (split, path, n) in [("train", &train, 60_000), ("test", &test, 10_000)] {
        let (rows, by_value) = count_labels(path);
        assert_eq!(rows, n);
        let (n_rows, by_id) = chunk_label_counts(d.ws.path(), "mnist-oddeven", split);
        assert_eq!(n_rows as u64, n);
        assert_eq!(
            by_id.get(&0).copied(),
            Some(by_value[&1]),
            "{split} odd digits"
        );
    }
    let (train, _) = ingest_classification(&d, "mnist", &[]);
    let ds = dataset(d.ws.path(), "mnist");
    assert_eq!(
        (ds["n_features"].as_u64(), ds["n_labels"].as_u64()),
        (Some(780), Some(10))
    );
    assert_eq!(ds["recorded_label_kind"], "multiclass");
    assert_eq!(
        ds["class_map"]["values"],
        serde_json::json!([0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
    );
    let (_, by_value) = count_labels(&train);
    let (_, by_id) = chunk_label_counts(d.ws.path(), "mnist", "train");
    let by_digit: BTreeMap<i64, u64> = by_id
        .into_iter()
        .map(|(id, c)| (i64::from(id), c))
        .collect();
    assert_eq!(by_digit, by_value, "rows per digit");
}

#[test]
fn delicious_first_labels() {
    let d = IngestCase::empty();
    let (train, test) = (
        shared_data("delicious/train.txt"),
        shared_data("delicious/test.txt"),
    );
    let err = d.ok(
        "del",
        &[
            "--train",
            train.to_str().unwrap(),
            "--test",
            test.to_str().unwrap(),
            "--first-label",
        ],
    );
    // Independent count of the distinct first labels and of the rows without labels.
    let mut firsts = std::collections::BTreeSet::new();
    let mut unlabeled = 0;
    for path in [&train, &test] {
        for line in std::fs::read_to_string(path).unwrap().lines().skip(1) {
            match line
                .split(' ')
                .next()
                .filter(|t| !t.contains(':') && !t.is_empty())
            {
                Some(t) => {
                    firsts.insert(t.split(',').next().unwrap().parse::<i64>().unwrap());
                }
                None => unlabeled += 1,
            }
        }
    }
    let ds = dataset(d.ws.path(), "del");
    assert_eq!(ds["n_labels"].as_u64(), Some(firsts.len() as u64));
    assert!(firsts.len() < 983);
    let values: Vec<i64> = firsts.into_iter().collect();
    assert_eq!(ds["class_map"]["values"], serde_json::json!(values));
    let dropped: u64 = ds["splits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["dropped_unlabeled"].as_u64().unwrap())
        .sum();
    assert_eq!(dropped, unlabeled);
    assert!(err.contains(&format!(
        "{unlabeled} rows without a (first) label were dropped"
    )));
}
