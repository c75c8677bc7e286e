//! `pipeline export` (issue 32, item 2): a checkpoint written as a self-contained model file
//! (`docs/formats.md`, "Model files"). Round trips against the workspace's own files (the
//! parameters bit for bit, the basis, the transform's statistics, the class map) for a
//! multi-label factor model with subspace inducing inputs and a binary model with free
//! inducing inputs on standardised features; the file scores the test rows exactly as
//! `pipeline predict` does after the workspace is deleted; and the refusals: a damaged, a
//! truncated and a newer-format file, an existing output, a missing run or checkpoint (and
//! then nothing at `--out`).

use crate::common;
use common::classify;
use common::ingest::{chunk_files, dataset_entry};
use common::toy::{self, artifact, newest_run, predictions_path, read_ckpt, train_ok, train_with};
use common::*;
use fsgp::portable::PortableModel;
use fsgp::scoring::{model_inputs, Ranker};
use fsgp::store::checkpoint::{param_tensors, Checkpoint};
use fsgp::store::chunks::{read_chunk, CsrChunk};
use fsgp::store::model_file::ModelFile;
use fsgp::store::npy::NpyMap;
use fsgp::store::predictions::PredictionReader;
use fsgp::store::scaling::{read_scaling, SCALING_FILE};
use fsgp::store::tensors::Tensor;
use fsgp::transform::Transform;
use std::path::{Path, PathBuf};

/// `pipeline export --run RUN --out OUT EXTRA...`.
fn export(ws: &Path, run: i64, out: &Path, extra: &[&str]) -> std::process::Output {
    let run = run.to_string();
    let mut args = vec!["export", "--run", &run, "--out", out.to_str().unwrap()];
    args.extend(extra);
    pipeline(ws, &args)
}

/// [`export`], which must succeed.
fn export_ok(ws: &Path, run: i64, out: &Path) {
    let o = export(ws, run, out, &[]);
    assert!(o.status.success(), "export: {}", stderr(&o));
}

/// The parameters' tensors as bits, in the order a file stores them.
fn param_bits(p: &fsgp::model::params::Params) -> Vec<(String, usize, usize, Vec<u64>)> {
    param_tensors(p).iter().map(Tensor::bits).collect()
}

/// The run's checkpoint the export took by default: its last (no early stopping here).
fn last_checkpoint(ws: &Path, run: i64) -> (u64, Checkpoint) {
    let step = *toy::checkpoints(ws, run).keys().last().unwrap();
    (step, read_ckpt(ws, run, step))
}

/// Each row of a split as predict wrote it: (row id, labels, score bits).
type Row = (u64, Vec<u32>, Vec<u32>);

fn rows_of(
    blocks: impl IntoIterator<Item = fsgp::store::predictions::PredictionBlock>,
) -> Vec<Row> {
    let mut rows = Vec::new();
    for b in blocks {
        for i in 0..b.row_ids.len() {
            let (s, e) = (b.offsets[i] as usize, b.offsets[i + 1] as usize);
            let bits = b.scores[s..e].iter().map(|v| v.to_bits()).collect();
            rows.push((b.row_ids[i], b.labels[s..e].to_vec(), bits));
        }
    }
    rows
}

/// The rows of the predictions file of the newest predict run.
fn predicted(ws: &Path) -> Vec<Row> {
    let path = predictions_path(ws, newest_run(ws, "predict"));
    rows_of(PredictionReader::open(&path).unwrap().map(|b| b.unwrap()))
}

/// Scores `chunks` with the model file alone (top `k` by the mean, as `pipeline predict`
/// without `--probabilities`).
fn scored_from_file(model: &PortableModel, chunks: &[CsrChunk], k: usize) -> Vec<Row> {
    let in_features = model.config.inducing_inputs.in_features();
    let (inputs, k_tilde, unweighted) = model_inputs(
        &model.basis,
        model.n_features(),
        in_features,
        model.params(),
    )
    .unwrap();
    let params = unweighted.as_ref().unwrap_or(model.params());
    let ranker = Ranker::open(inputs, k_tilde, model.config.kernel.kind(), params, false).unwrap();
    let blocks = chunks
        .iter()
        .flat_map(|c| ranker.rank_chunk(c, k, 1024).unwrap())
        .map(|(_, b)| b);
    rows_of(blocks)
}

fn test_chunks(ws: &Path, dataset: &str) -> Vec<CsrChunk> {
    chunk_files(ws, dataset, "test")
        .iter()
        .map(|p| read_chunk(p).unwrap())
        .collect()
}

/// Files in `dir`, sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// `ModelFile::read`'s refusal of `path`, which must name it.
fn refusal(path: &Path) -> String {
    let e = format!("{:#}", ModelFile::read(path).unwrap_err());
    assert!(e.contains(&path.display().to_string()), "{e}");
    e
}

#[test]
fn a_multilabel_subspace_model_round_trips_and_scores_without_the_workspace() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    toy::prepare(&ws);
    let run = train_ok(&ws, &["--epochs", "1"]);
    pipeline_ok(&ws, &["predict", "--run", &run.to_string()]);
    let out = dir.path().join("models");
    std::fs::create_dir_all(&out).unwrap();
    let model = out.join("toy.model.parquet");
    let before = contents(&ws);
    export_ok(&ws, run, &model);
    assert_eq!(contents(&ws), before, "export only reads the workspace");

    let file = ModelFile::read(&model).unwrap();
    let (step, ckpt) = last_checkpoint(&ws, run);
    assert_eq!(param_bits(&file.params), param_bits(&ckpt.params));
    assert_eq!(file.config, ckpt.config);
    let basis = NpyMap::open(&artifact(&ws, "basis")).unwrap();
    let basis = basis.view2::<f32>().unwrap();
    let stored = file.basis.as_ref().expect("a subspace model carries X̃");
    assert_eq!(stored.dim(), (8, 60));
    assert!(stored
        .iter()
        .zip(basis.iter())
        .all(|(a, b)| a.to_bits() == b.to_bits()));
    let entry = dataset_entry(&ws, "toy");
    let p = &file.provenance;
    assert_eq!((p.train_run, p.checkpoint_step), (run, step));
    assert_eq!(p.dataset_checksum, entry["checksum"].as_str().unwrap());
    assert_eq!(p.fsgp_version, env!("CARGO_PKG_VERSION"));
    let d = &file.dataset;
    assert_eq!((d.name.as_str(), d.n_features, d.n_labels), ("toy", 60, 30));
    assert_eq!(d.transform, entry["normalization"].as_str().unwrap());
    assert_eq!((d.class_map.clone(), file.scaling.clone()), (None, None));

    // The same checkpoint gives the same bytes.
    let again = out.join("again.parquet");
    export_ok(&ws, run, &again);
    assert_eq!(
        std::fs::read(&again).unwrap(),
        std::fs::read(&model).unwrap()
    );

    // The file scores the test rows as predict does, with the workspace gone.
    let chunks = test_chunks(&ws, "toy");
    let expected = predicted(&ws);
    check_export_refusals(&ws, run, &out);
    std::fs::remove_dir_all(&ws).unwrap();
    let portable = PortableModel::open(&model).unwrap();
    assert_eq!(portable.transform.choice().name(), d.transform);
    assert_eq!(scored_from_file(&portable, &chunks, 5), expected);

    check_file_refusals(&model, dir.path());
}

/// What `pipeline export` refuses, each leaving nothing at `--out`.
fn check_export_refusals(ws: &Path, run: i64, out: &Path) {
    let listed = names_in(out);
    let fresh = out.join("fresh.parquet");
    for (args, message) in [
        (vec!["--checkpoint", "5"], "has no checkpoint at step 5"),
        (vec![], "no run 99"),
        (vec![], "is a svd run, not train"),
    ] {
        let id = match message {
            "no run 99" => 99,
            "is a svd run, not train" => newest_run(ws, "svd"),
            _ => run,
        };
        let o = export(ws, id, &fresh, &args);
        assert!(!o.status.success(), "{args:?}");
        assert!(stderr(&o).contains(message), "{message}: {}", stderr(&o));
        assert_eq!(
            names_in(out),
            listed,
            "nothing left at --out after {message}"
        );
    }
    // An existing file is kept, unless --force.
    let mine = out.join("mine.parquet");
    std::fs::write(&mine, b"mine").unwrap();
    let o = export(ws, run, &mine, &[]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("exists; give --force"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read(&mine).unwrap(), b"mine");
    let o = export(ws, run, &mine, &["--force"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(ModelFile::read(&mine).is_ok());
    std::fs::remove_file(&mine).unwrap();
    assert_eq!(names_in(out), listed);
}

/// A damaged, a truncated and a newer-format copy of `model` are refused, naming the file.
fn check_file_refusals(model: &Path, dir: &Path) {
    let bytes = std::fs::read(model).unwrap();
    let copy = |name: &str, bytes: &[u8]| -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    };
    let mut flipped = bytes.clone();
    flipped[bytes.len() / 2] ^= 0xff;
    let e = refusal(&copy("flipped.parquet", &flipped));
    assert!(
        e.contains("damaged") || e.contains("not a readable model file"),
        "{e}"
    );

    let e = refusal(&copy("truncated.parquet", &bytes[..bytes.len() - 100]));
    assert!(
        e.contains("not a readable model file (not Parquet, or truncated)"),
        "{e}"
    );

    let newer = replace_all(&bytes, b"fsgp-model/1", b"fsgp-model/2");
    let e = refusal(&copy("newer.parquet", &newer));
    assert!(
        e.contains("fsgp-model/2: written by a newer fsgp; this one reads fsgp-model/1"),
        "{e}"
    );
}

/// `bytes` with every `from` replaced by `to` (of the same length).
fn replace_all(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    let mut n = 0;
    for i in 0..=out.len() - from.len() {
        if &out[i..i + from.len()] == from {
            out[i..i + to.len()].copy_from_slice(to);
            n += 1;
        }
    }
    assert!(n > 0, "no {:?} in the file", String::from_utf8_lossy(from));
    out
}

/// Dense signed rows of 3 features on different scales with ±1 classes (LIBSVM): row i has
/// `(i − 7) · 0.5`, `100 + 3·(i mod 5)`, `−(i mod 4)`, class +1 when `x₁ > x₃`-ish.
fn dense_text(rows: std::ops::Range<i32>) -> String {
    rows.map(|i| {
        let (a, b, c) = (f64::from(i % 17 - 8) * 0.5, 100 + 3 * (i % 5), -(i % 4));
        let label = if a + f64::from(c) > -1.0 { 1 } else { -1 };
        format!("{label} 1:{a} 2:{b} 3:{c}\n")
    })
    .collect()
}

#[test]
fn a_binary_free_inputs_model_carries_its_fitted_transform_and_class_map() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let (train, test) = (dir.path().join("train.svm"), dir.path().join("test.svm"));
    std::fs::write(&train, dense_text(0..200)).unwrap();
    std::fs::write(&test, dense_text(200..260)).unwrap();
    for args in [
        &[
            "ingest",
            "--name",
            "bin",
            "--format",
            "libsvm",
            "--train",
            train.to_str().unwrap(),
            "--test",
            test.to_str().unwrap(),
            "--transform",
            "standardize",
            "--chunk-rows",
            "100",
        ][..],
        &[
            "svd",
            "--dataset",
            "bin",
            "--rank",
            "3",
            "--inducing",
            "16",
            "--threads",
            "2",
        ],
    ] {
        pipeline_ok(&ws, args);
    }
    let task = ["--dataset", "bin", "--task", "binary", "--seed", "5"];
    let extra = ["--inducing-inputs", "free", "--kernel", "se"];
    let run = train_with(
        &ws,
        &classify::train_args(&task, &[("--epochs", "2")], &extra),
    );
    pipeline_ok(&ws, &["predict", "--run", &run.to_string()]);
    let model = dir.path().join("bin.model.parquet");
    export_ok(&ws, run, &model);

    let file = ModelFile::read(&model).unwrap();
    let (_, ckpt) = last_checkpoint(&ws, run);
    assert_eq!(param_bits(&file.params), param_bits(&ckpt.params));
    assert!(file.basis.is_none(), "free inducing inputs never read X̃");
    let entry = dataset_entry(&ws, "bin");
    let stats = read_scaling(&ws.join(entry["path"].as_str().unwrap()).join(SCALING_FILE)).unwrap();
    assert_eq!(file.scaling.as_ref(), Some(&stats));
    assert_eq!(file.dataset.transform, "standardize");
    assert_eq!(
        serde_json::to_value(&file.dataset.class_map).unwrap(),
        entry["class_map"]
    );
    assert_eq!(file.dataset.label_kind.to_string(), "binary");
    assert_eq!(file.dataset.index_base, 1);

    let chunks = test_chunks(&ws, "bin");
    let expected = predicted(&ws);
    std::fs::remove_dir_all(&ws).unwrap();
    let portable = PortableModel::open(&model).unwrap();
    let Transform::Standardize(s) = &portable.transform else {
        panic!("{:?}", portable.transform)
    };
    assert_eq!(
        (&s.ids, &s.shift, &s.scale),
        (&stats.ids, &stats.shift, &stats.scale)
    );
    assert_eq!(portable.class_map().unwrap().value_of(0), Some(1));
    assert_eq!(scored_from_file(&portable, &chunks, 1), expected);
}

#[test]
fn an_axes_model_round_trips_and_scores_without_the_workspace() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    toy::prepare(&ws);
    let run = train_ok(&ws, &["--epochs", "1", "--inducing-inputs", "axes"]);
    pipeline_ok(&ws, &["predict", "--run", &run.to_string()]);
    let model = dir.path().join("toy-axes.model.parquet");
    export_ok(&ws, run, &model);
    let file = ModelFile::read(&model).unwrap();
    let (_, ckpt) = last_checkpoint(&ws, run);
    assert_eq!(param_bits(&file.params), param_bits(&ckpt.params));
    assert_eq!((file.params.a.nrows(), file.params.a.ncols()), (0, 60));
    assert!(file.basis.is_none(), "the axes never read X̃");
    let chunks = test_chunks(&ws, "toy");
    let expected = predicted(&ws);
    std::fs::remove_dir_all(&ws).unwrap();
    let portable = PortableModel::open(&model).unwrap();
    assert_eq!(scored_from_file(&portable, &chunks, 5), expected);
}
