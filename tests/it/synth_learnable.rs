//! `pipeline synth` plants a structure a model can learn: a short training run on a small
//! generated set beats the label-frequency baseline (every row ranked by training label
//! frequency) by a wide margin in P@1.

use crate::common;
use common::*;
use fsgp::store::chunks::read_chunk_labels;

const SPEC: &str = r#"
[synth]
out = "data"
rows = 3000
test_rows = 500
features = 300
labels = 200
seed = 7

[ingest]
name = "planted"
train = "data/train.txt"
test = "data/test.txt"

[svd]
rank = 32
inducing = 64
threads = 2

[train]
factors = 8
batch = 200
epochs = 8
lr = 0.05
threads = 2

[predict]
top_k = 5

[evaluate]
k = 5
"#;

/// Label lists of every row of a split, from its registered chunks.
fn split_labels(ws: &std::path::Path, split: &str) -> Vec<Vec<u32>> {
    let conn = rusqlite::Connection::open(ws.join("catalog.sqlite")).unwrap();
    let mut stmt = conn
        .prepare("SELECT path FROM artifacts WHERE kind = 'chunk' AND split = ?1 ORDER BY id")
        .unwrap();
    let paths: Vec<String> = stmt
        .query_map([split], |r| r.get(0))
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    let mut rows = Vec::new();
    for p in paths {
        let c = read_chunk_labels(&ws.join(p)).unwrap();
        for i in 0..c.row_ids.len() {
            rows.push(c.labels[c.offsets[i] as usize..c.offsets[i + 1] as usize].to_vec());
        }
    }
    rows
}

#[test]
fn a_short_run_beats_the_label_frequency_baseline_by_a_wide_margin() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("planted.toml");
    std::fs::write(&spec, SPEC).unwrap();
    let ws = dir.path().join("ws");
    let out = pipeline(&ws, &["run", spec.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let metrics: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let model_p1 = metrics["p_at"][0].as_f64().unwrap();

    let train = split_labels(&ws, "train");
    let test = split_labels(&ws, "test");
    let mut counts = vec![0u64; 200];
    for row in &train {
        for &l in row {
            counts[l as usize] += 1;
        }
    }
    let most_frequent = (0..counts.len())
        .max_by_key(|&l| (counts[l], std::cmp::Reverse(l)))
        .unwrap() as u32;
    let baseline_p1 =
        test.iter().filter(|r| r.contains(&most_frequent)).count() as f64 / test.len() as f64;
    assert!(
        model_p1 >= 2.0 * baseline_p1 && model_p1 >= baseline_p1 + 0.2,
        "model P@1 {model_p1:.3} vs label-frequency baseline {baseline_p1:.3}"
    );
}
