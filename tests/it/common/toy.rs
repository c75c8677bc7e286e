//! A toy training workspace for the train-stage tests: a small generated dataset ingested
//! in 5 chunks and factorised, the training command line every test starts from, and ways
//! to look at a run's checkpoints, figures and catalog rows from the outside.

use super::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use fsgp::store::checkpoint::read_checkpoint;

/// Synthesises, ingests (5 chunks) and factorises a toy dataset in `ws`.
pub fn prepare(ws: &Path) {
    prepare_with(ws, &[]);
}

/// [`prepare`] with `ingest_extra` options added to the ingest (e.g. a validation split).
pub fn prepare_with(ws: &Path, ingest_extra: &[&str]) {
    let src = ws.join("src");
    let out = pipeline(
        ws,
        &[
            "synth",
            "--out",
            src.to_str().unwrap(),
            "--rows",
            "900",
            "--test-rows",
            "100",
            "--features",
            "60",
            "--labels",
            "30",
            "--seed",
            "3",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let (train, test) = (src.join("train.txt"), src.join("test.txt"));
    let mut ingest = vec![
        "ingest",
        "--name",
        "toy",
        "--train",
        train.to_str().unwrap(),
        "--test",
        test.to_str().unwrap(),
        "--chunk-rows",
        "200",
    ];
    ingest.extend(ingest_extra);
    let out = pipeline(ws, &ingest);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = pipeline(
        ws,
        &[
            "svd",
            "--dataset",
            "toy",
            "--rank",
            "8",
            "--inducing",
            "16",
            "--threads",
            "2",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
}

/// 6 epochs of 16 minibatches (chunk groups of 400, 400 and 100 rows; B = 64).
pub const TRAIN: &[&str] = &[
    "train",
    "--dataset",
    "toy",
    "--factors",
    "3",
    "--batch",
    "64",
    "--epochs",
    "6",
    "--checkpoint-every",
    "7",
    "--negatives",
    "5",
    "--threads",
    "2",
    "--seed",
    "11",
    // Every checkpoint stays, so the tests can compare each one (retention has its own
    // tests in train_resume_rules.rs).
    "--keep-checkpoints",
    "all",
];
pub const STEPS: u64 = 96;

pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), dst).unwrap();
        }
    }
}

pub fn catalog(ws: &Path) -> rusqlite::Connection {
    rusqlite::Connection::open(ws.join("catalog.sqlite")).unwrap()
}

/// step → checkpoint bytes, for the registered checkpoints of `run`.
pub fn checkpoints(ws: &Path, run: i64) -> BTreeMap<u64, Vec<u8>> {
    let conn = catalog(ws);
    let mut stmt = conn
        .prepare("SELECT step, path FROM checkpoints WHERE stage_run_id = ?1 ORDER BY step")
        .unwrap();
    stmt.query_map([run], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))
        .unwrap()
        .map(|r| {
            let (step, path) = r.unwrap();
            (step as u64, std::fs::read(ws.join(path)).unwrap())
        })
        .collect()
}

pub fn metrics(ws: &Path, run: i64, name: &str) -> Vec<(i64, u64)> {
    let conn = catalog(ws);
    let mut stmt = conn
        .prepare(
            "SELECT step, value FROM metrics WHERE stage_run_id = ?1 AND name = ?2 ORDER BY step",
        )
        .unwrap();
    stmt.query_map(rusqlite::params![run, name], |r| {
        Ok((r.get::<_, i64>(0)?, r.get::<_, f64>(1)?.to_bits()))
    })
    .unwrap()
    .map(|r| r.unwrap())
    .collect()
}

/// The id of the newest run of `stage` in the workspace's catalog.
pub fn newest_run(ws: &Path, stage: &str) -> i64 {
    catalog(ws)
        .query_row(
            "SELECT max(id) FROM stage_runs WHERE stage = ?1",
            [stage],
            |r| r.get(0),
        )
        .unwrap()
}

pub fn train_run_id(ws: &Path) -> i64 {
    newest_run(ws, "train")
}

/// The status of run `id` as `pipeline status` shows it: a run whose process is gone is
/// interrupted (status records nothing; the next command that writes does).
pub fn run_status(ws: &Path, id: i64) -> String {
    let out = pipeline(ws, &["status", "--run", &id.to_string(), "--json"]);
    assert!(out.status.success(), "status failed: {}", stderr(&out));
    let detail: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    detail["run"]["status"].as_str().unwrap().to_string()
}

/// TRAIN with `overrides` ("--flag", "value" pairs, or a lone "--switch") applied.
pub fn train_args<'a>(overrides: &[&'a str]) -> Vec<&'a str> {
    let mut args: Vec<&str> = TRAIN.to_vec();
    let mut i = 0;
    while i < overrides.len() {
        let flag = overrides[i];
        let value = overrides.get(i + 1).filter(|v| !v.starts_with("--"));
        match (args.iter().position(|a| *a == flag), value) {
            (Some(at), Some(v)) => args[at + 1] = v,
            (None, Some(v)) => args.extend([flag, v]),
            (_, None) => args.push(flag),
        }
        i += if value.is_some() { 2 } else { 1 };
    }
    args
}

/// TRAIN with `overrides` applied as [`train_args`] does and its `--epochs 6` left out (for
/// a budget in steps, or the default one).
pub fn without_epochs<'a>(overrides: &[&'a str]) -> Vec<&'a str> {
    let mut args = train_args(overrides);
    let at = args.iter().position(|a| *a == "--epochs").unwrap();
    args.drain(at..at + 2);
    args
}

/// Runs TRAIN with `overrides` until the failpoint `point` (`FSGP_FAILPOINT`, e.g.
/// "checkpoint-renamed:14") aborts it; asserts that it did and that the run is then found
/// interrupted, and returns the run's id.
pub fn crash_at(ws: &Path, overrides: &[&str], point: &str) -> i64 {
    crash_with(ws, &train_args(overrides), point)
}

/// [`crash_at`] for a whole `train` command line `args` of the caller's own.
pub fn crash_with(ws: &Path, args: &[&str], point: &str) -> i64 {
    let out = std::process::Command::new(pipeline_bin())
        .arg("--workspace")
        .arg(ws)
        .args(args)
        .env("FSGP_FAILPOINT", point)
        .env_remove("FSGP_WORKSPACE")
        .output()
        .unwrap();
    assert!(!out.status.success(), "{point}: the failpoint did not fire");
    let id = train_run_id(ws);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(run_status(ws, id), "interrupted", "{point}: {err}");
    id
}

/// Asserts that train runs `a` and `b` (each `(workspace, run id)`) wrote the same
/// checkpoint bytes and the same exact-bound metric; returns run a's checkpoint bytes.
pub fn assert_same_run_bytes(
    (ws_a, a): (&Path, i64),
    (ws_b, b): (&Path, i64),
) -> BTreeMap<u64, Vec<u8>> {
    let bytes = checkpoints(ws_a, a);
    assert_eq!(bytes, checkpoints(ws_b, b), "same seed, same bytes");
    assert_eq!(
        metrics(ws_a, a, "elbo_exact"),
        metrics(ws_b, b, "elbo_exact")
    );
    bytes
}

/// Resumes run `id` unchanged, which must succeed and finish with checkpoint bytes `bytes`
/// and the exact-bound metric `elbo` of an uninterrupted run.
pub fn assert_resumes_to(ws: &Path, id: i64, bytes: &BTreeMap<u64, Vec<u8>>, elbo: &[(i64, u64)]) {
    let out = pipeline(ws, &["train", "--resume", &id.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(&checkpoints(ws, id), bytes, "resumed to the same bytes");
    assert_eq!(metrics(ws, id, "elbo_exact"), elbo);
}

/// Runs TRAIN with `overrides`, which must be refused with an error containing `message`.
pub fn assert_train_refused(ws: &Path, overrides: &[&str], message: &str) {
    let out = pipeline(ws, &train_args(overrides));
    assert!(!out.status.success(), "{overrides:?} was accepted");
    assert!(
        stderr(&out).contains(message),
        "{overrides:?}: {}",
        stderr(&out)
    );
}

/// Resumes run `id` with `args` added, which must be refused with an error containing
/// `message` (each refused option names the given value and the run's).
pub fn assert_resume_refused(ws: &Path, id: i64, args: &[&str], message: &str) {
    let id = id.to_string();
    let mut argv = vec!["train", "--resume", &id];
    argv.extend(args);
    let out = pipeline(ws, &argv);
    assert!(!out.status.success(), "{args:?} was accepted on resume");
    assert!(stderr(&out).contains(message), "{args:?}: {}", stderr(&out));
}

/// Starts TRAIN with `overrides`, SIGKILLs it after `secs` and returns the id of the run it
/// left behind, asserting that the run is then found interrupted; None when the kill came
/// before the run was recorded or after it finished.
pub fn train_killed_after(ws: &Path, overrides: &[&str], secs: f64) -> Option<i64> {
    let mut child = std::process::Command::new(pipeline_bin())
        .arg("--workspace")
        .arg(ws)
        .args(train_args(overrides))
        .env_remove("FSGP_WORKSPACE")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs_f64(secs));
    let finished = child.try_wait().unwrap().is_some();
    let _ = child.kill(); // SIGKILL
    child.wait().unwrap();
    let id: Option<i64> = catalog(ws)
        .query_row(
            "SELECT max(id) FROM stage_runs WHERE stage = 'train'",
            [],
            |r| r.get(0),
        )
        .expect("catalog unreadable after kill");
    let id = id?;
    if finished || run_status(ws, id) == "ok" {
        return None;
    }
    assert_eq!(run_status(ws, id), "interrupted");
    Some(id)
}

/// How many runs of `stage` the catalog holds (only those with `status`, when given).
pub fn count_runs(ws: &Path, stage: &str, status: Option<&str>) -> i64 {
    catalog(ws)
        .query_row(
            "SELECT count(*) FROM stage_runs WHERE stage = ?1 AND (?2 IS NULL OR status = ?2)",
            rusqlite::params![stage, status],
            |r| r.get(0),
        )
        .unwrap()
}

/// Runs TRAIN with `overrides`, which must succeed; returns the run's id.
pub fn train_ok(ws: &Path, overrides: &[&str]) -> i64 {
    train_with(ws, &train_args(overrides))
}

/// Runs the whole `train` command line `args`, which must succeed; returns the run's id.
pub fn train_with(ws: &Path, args: &[&str]) -> i64 {
    let out = pipeline(ws, args);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    train_run_id(ws)
}

/// A workspace prepared once in a temporary directory (`base`) and copied beside it for
/// each case, with what the set-up returned besides (the test rows' classes for the
/// classification tests; nothing for the toy dataset of [`prepared`]).
pub struct Prepared<T = ()> {
    _dir: tempfile::TempDir,
    base: PathBuf,
    pub test_classes: T,
}

/// The toy dataset of [`prepare`], prepared once.
pub fn prepared() -> Prepared {
    Prepared::new(|dir| {
        let base = dir.join("base");
        prepare(&base);
        (base, ())
    })
}

/// The toy dataset with a fifth of its training rows carved into a validation split,
/// prepared once.
pub fn prepared_with_validation() -> Prepared {
    Prepared::new(|dir| {
        let base = dir.join("base");
        prepare_with(&base, &["--validation-fraction", "0.2"]);
        (base, ())
    })
}

impl<T> Prepared<T> {
    /// Runs `set_up` in a fresh temporary directory; it returns the workspace it prepared
    /// there and what the tests need to know of it.
    pub fn new(set_up: impl FnOnce(&Path) -> (PathBuf, T)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (base, test_classes) = set_up(dir.path());
        Prepared {
            _dir: dir,
            base,
            test_classes,
        }
    }

    /// A copy of the prepared workspace, named `name`, beside it.
    pub fn copy(&self, name: &str) -> PathBuf {
        let to = self.base.parent().unwrap().join(name);
        copy_dir(&self.base, &to);
        to
    }
}

/// Every parameter and Adam moment of a checkpoint, as bits.
pub fn tensor_bits(c: &fsgp::store::checkpoint::Checkpoint) -> Vec<u64> {
    let p = &c.params;
    let mut bits = Vec::new();
    for m in [
        &p.a,
        p.q.mu(),
        p.q.rho().unwrap_or(&faer::Mat::new()),
        &p.phi,
    ] {
        bits.extend([m.nrows() as u64, m.ncols() as u64]);
        for j in 0..m.ncols() {
            bits.extend((0..m.nrows()).map(|i| m[(i, j)].to_bits()));
        }
    }
    bits.extend(p.bias.iter().map(|v| v.to_bits()));
    bits.extend([p.kernel.log_sf2.to_bits(), p.kernel.log_ell.to_bits()]);
    bits.extend(p.kernel.log_lin2.map(f64::to_bits));
    bits.extend(p.kernel.log_ard.iter().map(|v| v.to_bits()));
    bits.extend(p.kernel.log_features.iter().map(|v| v.to_bits()));
    bits.extend(c.adam.m.iter().chain(&c.adam.v).map(|v| v.to_bits()));
    bits.push(c.adam.t);
    bits
}

pub fn read_ckpt(ws: &Path, run: i64, step: u64) -> fsgp::store::checkpoint::Checkpoint {
    let path: String = catalog(ws)
        .query_row(
            "SELECT path FROM checkpoints WHERE stage_run_id = ?1 AND step = ?2",
            rusqlite::params![run, step as i64],
            |r| r.get(0),
        )
        .unwrap_or_else(|e| panic!("run {run}: no checkpoint at step {step}: {e}"));
    read_checkpoint(&ws.join(path)).unwrap()
}

pub fn run_params(ws: &Path, run: i64) -> serde_json::Value {
    let text: String = catalog(ws)
        .query_row("SELECT params FROM stage_runs WHERE id = ?1", [run], |r| {
            r.get(0)
        })
        .unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The newest artifact of `kind` (kxx, sq_norms, basis, ...) in `ws`, as a path.
pub fn artifact(ws: &Path, kind: &str) -> PathBuf {
    let path: String = catalog(ws)
        .query_row(
            "SELECT path FROM artifacts WHERE kind = ?1 ORDER BY id DESC LIMIT 1",
            [kind],
            |r| r.get(0),
        )
        .unwrap_or_else(|e| panic!("no '{kind}' artifact: {e}"));
    ws.join(path)
}

/// The training split's registered chunk files, in row order (absolute).
pub fn train_chunks(ws: &Path) -> Vec<PathBuf> {
    let mut paths: Vec<String> = catalog(ws)
        .prepare("SELECT path FROM artifacts WHERE kind = 'chunk' AND split = 'train'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    paths.sort();
    paths.into_iter().map(|p| ws.join(p)).collect()
}

/// Every training row of the newest svd of a workspace as one batch, read apart from the
/// streaming `pipeline elbo` so that tests can compute exact bounds independently: K_XX̃
/// [N×R] and the squared norms from the svd artifacts, K_X̃ = X̃ X̃ᵀ from its basis, each
/// row's labels from the chunks (in row order).
pub struct OneBatch {
    pub kxx: faer::Mat<f64>,
    pub k_tilde: faer::Mat<f64>,
    pub sq_norms: Vec<f64>,
    pub labels: Vec<Vec<u32>>,
}

impl OneBatch {
    pub fn read(ws: &Path) -> Self {
        use faer::Mat;
        let kxx: ndarray::Array2<f32> = ndarray_npy::read_npy(artifact(ws, "kxx")).unwrap();
        let norms: ndarray::Array1<f32> = ndarray_npy::read_npy(artifact(ws, "sq_norms")).unwrap();
        let basis: ndarray::Array2<f32> = ndarray_npy::read_npy(artifact(ws, "basis")).unwrap();
        let mut labels = Vec::new();
        for path in train_chunks(ws) {
            let l = fsgp::store::chunks::read_chunk_labels(&path).unwrap();
            for i in 0..l.len() {
                labels.push(l.row(i).to_vec());
            }
        }
        let (n, r) = kxx.dim();
        let basis = Mat::from_fn(r, basis.ncols(), |i, j| basis[(i, j)] as f64);
        OneBatch {
            kxx: Mat::from_fn(n, r, |i, j| kxx[(i, j)] as f64),
            k_tilde: &basis * basis.transpose(),
            sq_norms: norms.iter().map(|&v| v as f64).collect(),
            labels,
        }
    }

    pub fn inputs(&self) -> fsgp::model::kernel::BasisInputs<'_> {
        fsgp::model::kernel::BasisInputs {
            kxx_b: self.kxx.as_ref().into(),
            sq_norms: &self.sq_norms,
            k_tilde: self.k_tilde.as_ref().into(),
        }
    }

    /// Each row's one class (a multi-class dataset's); asserts every row holds one label.
    pub fn classes(&self) -> Vec<u32> {
        self.labels
            .iter()
            .map(|l| {
                assert_eq!(l.len(), 1);
                l[0]
            })
            .collect()
    }

    /// The bound of `params` under kernel `kind` with this batch's inputs, the terms
    /// `terms` and the per-term likelihood `lik` (default options).
    pub fn bound(
        &self,
        kind: fsgp::model::kernel::KernelKind,
        params: &fsgp::model::params::Params,
        terms: &fsgp::model::bound::terms::TermSet<'_>,
        lik: &dyn fsgp::model::likelihood::Likelihood,
    ) -> f64 {
        fsgp::model::bound::objective::bound_and_grads(
            kind,
            params,
            &self.inputs(),
            terms,
            lik,
            &fsgp::model::bound::objective::BoundOptions::default(),
            &fsgp::model::scratch::Scratch::new(),
        )
        .unwrap()
        .value
    }
}

/// The exact bound of `params` under kernel `kind` and likelihood `lik` with every training
/// row of the workspace as one batch ([`OneBatch`]), every (row, label) pair of its `labels`
/// labels a term of weight 1; asserts the batch has `rows` rows.
pub fn one_batch_label_bound(
    ws: &Path,
    kind: fsgp::model::kernel::KernelKind,
    params: &fsgp::model::params::Params,
    lik: &dyn fsgp::model::likelihood::Likelihood,
    (rows, labels): (usize, usize),
) -> f64 {
    let batch = OneBatch::read(ws);
    assert_eq!(batch.labels.len(), rows);
    let terms = fsgp::model::bound::terms::terms_all(&batch.labels, labels, 1.0);
    batch.bound(
        kind,
        params,
        &fsgp::model::bound::terms::TermSet::List(&terms),
        lik,
    )
}

/// The exact bound of `params` under kernel `kind` with all 900 training rows of the toy
/// dataset as one batch ([`OneBatch`]), the logistic likelihood with 20 points.
pub fn one_batch_bound(
    ws: &Path,
    kind: fsgp::model::kernel::KernelKind,
    params: &fsgp::model::params::Params,
) -> f64 {
    let lik = fsgp::model::likelihood::logistic::BernoulliLogistic::new(20).unwrap();
    one_batch_label_bound(ws, kind, params, &lik, (900, 30))
}

/// The predictions file predict run `predict_run` registered, absolute.
pub fn predictions_path(ws: &Path, predict_run: i64) -> PathBuf {
    let path: String = catalog(ws)
        .query_row(
            "SELECT path FROM artifacts WHERE stage_run_id = ?1 AND kind = 'predictions'",
            [predict_run],
            |r| r.get(0),
        )
        .unwrap_or_else(|e| panic!("predict run {predict_run}: no predictions: {e}"));
    ws.join(path)
}
