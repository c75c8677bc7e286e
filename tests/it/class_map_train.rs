//! `ingest --first-label --class-map train` (`docs/formats.md`, "Label kinds and the class
//! map"): on the real Delicious files the classes are the training file's distinct first
//! labels, K = 355 as in Dhaka et al.'s Table 1 (train ∪ test gives 371); the test rows
//! whose first label no training row has are kept without a class, and their number and
//! classes, recorded in the catalog's class map, equal a plain parse of the files.

use crate::common;
use common::ingest::dataset_entry;
use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Per row of an XC text file (header line skipped): its first listed label, or None for a
/// row without labels (one whose first token is a feature `idx:val`).
fn first_labels(path: &Path) -> Vec<Option<i64>> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .skip(1)
        .map(|line| {
            let first = line.split_whitespace().next().unwrap_or("");
            (!first.is_empty() && !first.contains(':'))
                .then(|| first.split(',').next().unwrap().parse().unwrap())
        })
        .collect()
}

fn ingest(ws: &Path, name: &str, extra: &[&str]) -> serde_json::Value {
    ingest_delicious_as(ws, name, &[&["--first-label"], extra].concat());
    dataset_entry(ws, name)
}

fn split_rows(ds: &serde_json::Value, split: &str) -> u64 {
    ds["splits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["split"] == split || s["name"] == split)
        .unwrap_or_else(|| panic!("no split {split} in {ds}"))["n_rows"]
        .as_u64()
        .unwrap()
}

#[test]
fn delicious_first_label_classes_come_from_the_training_file_and_unseen_rows_are_counted() {
    let train = first_labels(&shared_data("delicious/train.txt"));
    let test = first_labels(&shared_data("delicious/test.txt"));
    let seen: BTreeSet<i64> = train.iter().flatten().copied().collect();
    let every: BTreeSet<i64> = seen.iter().chain(test.iter().flatten()).copied().collect();
    let mut unseen: BTreeMap<i64, u64> = BTreeMap::new();
    for c in test.iter().flatten().filter(|c| !seen.contains(c)) {
        *unseen.entry(*c).or_default() += 1;
    }
    let unseen_rows: u64 = unseen.values().sum();
    eprintln!(
        "plain parse: {} training classes, {} over train ∪ test, {unseen_rows} test rows of {} \
         unseen classes",
        seen.len(),
        every.len(),
        unseen.len()
    );
    assert_eq!(seen.len(), 355, "Dhaka et al.'s K for Delicious");
    assert_eq!(every.len(), 371);
    assert!(unseen_rows > 0);

    let ws = tempfile::tempdir().unwrap();
    let ds = ingest(ws.path(), "dtrain", &["--class-map", "train"]);
    assert_eq!(ds["n_labels"].as_u64(), Some(355), "{ds}");
    let map = &ds["class_map"];
    let values: Vec<i64> = serde_json::from_value(map["values"].clone()).unwrap();
    assert_eq!(values, seen.iter().copied().collect::<Vec<_>>());
    let recorded = map["unseen"].as_array().expect("unseen recorded");
    assert_eq!(recorded.len(), 1, "{map}");
    assert_eq!(recorded[0]["split"], "test");
    let recorded_values: Vec<i64> = serde_json::from_value(recorded[0]["values"].clone()).unwrap();
    assert_eq!(recorded_values, unseen.keys().copied().collect::<Vec<_>>());
    assert_eq!(recorded[0]["rows"].as_u64(), Some(unseen_rows));
    // Unseen test rows are kept: the test split holds every row with a first label.
    let labelled = |rows: &[Option<i64>]| rows.iter().flatten().count() as u64;
    assert_eq!(split_rows(&ds, "train"), labelled(&train));
    assert_eq!(split_rows(&ds, "test"), labelled(&test));

    // The default numbers the classes of both files, and records no unseen classes.
    let ds = ingest(ws.path(), "dall", &[]);
    assert_eq!(ds["n_labels"].as_u64(), Some(371), "{ds}");
    assert!(ds["class_map"].get("unseen").is_none(), "{ds}");
}

#[test]
fn class_map_train_needs_first_label() {
    let ws = tempfile::tempdir().unwrap();
    let train = shared_data("delicious/train.txt");
    let out = pipeline(
        ws.path(),
        &[
            "ingest",
            "--name",
            "d",
            "--train",
            train.to_str().unwrap(),
            "--class-map",
            "train",
        ],
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("class-map") && err.contains("--first-label"),
        "{err}"
    );
}
