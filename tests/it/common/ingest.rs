//! The set-up of the ingest tests (tests/it/ingest_errors.rs, tests/it/ingest_libsvm.rs): a
//! workspace and a directory of input files, ingests that must succeed, and ingests that
//! must fail naming FILE:LINE and leave the workspace as it was.

use super::{dataset_names, listing, pipeline_within, status_json, stderr, write};
use std::path::Path;
use std::process::Output;
use std::time::Duration;

/// A small valid XC file: N = 3 rows, D = 5 features, L = 4 labels.
pub const GOOD: &str = "3 5 4\n0,2 0:1.0 3:2.0\n1 1:0.5\n3 4:1.5 2:1\n";

/// `PATH:LINE: `, as an error names a line of an input.
pub fn loc(path: &str, line: u64) -> String {
    format!("{path}:{line}: ")
}

/// A workspace (`ws`) and a directory of input files (`dir`).
pub struct IngestCase {
    pub ws: tempfile::TempDir,
    pub dir: tempfile::TempDir,
}

impl IngestCase {
    /// A workspace that already holds one good dataset (`good`, from [`GOOD`]), so that
    /// "unchanged" is not trivially true.
    pub fn new() -> Self {
        let case = Self::empty();
        let good = case.file("good.txt", GOOD);
        case.ok("good", &["--train", &good]);
        case
    }

    /// An empty workspace.
    pub fn empty() -> Self {
        IngestCase {
            ws: tempfile::tempdir().unwrap(),
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// Writes the input file `name`; returns its path.
    pub fn file(&self, name: &str, text: &str) -> String {
        write(self.dir.path(), name, text).display().to_string()
    }

    /// `pipeline ingest --name NAME ARGS...`; no input may hang it (a FIFO used to), so a
    /// run of 120 s fails the test.
    pub fn ingest(&self, name: &str, args: &[&str]) -> Output {
        let mut full = vec!["ingest", "--name", name];
        full.extend_from_slice(args);
        pipeline_within(self.ws.path(), &full, Duration::from_secs(120))
    }

    /// An ingest that must succeed; returns its stderr (the summary).
    pub fn ok(&self, name: &str, args: &[&str]) -> String {
        let out = self.ingest(name, args);
        assert!(out.status.success(), "ingest failed: {}", stderr(&out));
        stderr(&out)
    }

    /// An ingest (as dataset `bad`) that must exit 1 naming `location` and saying `text`,
    /// and leave the datasets and the workspace's files as they were; a run it recorded
    /// is recorded as failed. Returns the error.
    pub fn fails(&self, args: &[&str], location: &str, text: &str) -> String {
        let ws = self.ws.path();
        let (names, before) = (dataset_names(ws), listing(ws));
        let runs_before = status_json(ws)["runs"].as_array().unwrap().len();
        let out = self.ingest("bad", args);
        let err = stderr(&out);
        assert!(!out.status.success(), "should fail: {args:?}");
        assert_eq!(out.status.code(), Some(1));
        assert!(
            err.contains(location),
            "error should name {location}: {err}"
        );
        assert!(err.contains(text), "error should say {text}: {err}");
        assert_eq!(dataset_names(ws), names);
        assert_eq!(listing(ws), before, "workspace files changed");
        // A run is recorded as failed, unless the input was rejected before a run started.
        let runs = status_json(ws)["runs"].as_array().unwrap().clone();
        if runs.len() > runs_before {
            assert_eq!(
                runs[0]["status"], "failed",
                "the failed run is recorded as failed"
            );
        }
        err
    }

    /// Writes `text` as the input file `name` and ingests it with `args` and `--train
    /// FILE`, which must fail ([`Self::fails`]) naming line `line` of it and saying
    /// `message`. Returns the error.
    pub fn train_file_fails(
        &self,
        args: &[&str],
        (name, text): (&str, &str),
        line: u64,
        message: &str,
    ) -> String {
        let f = self.file(name, text);
        let mut full = args.to_vec();
        full.extend(["--train", &f]);
        self.fails(&full, &loc(&f, line), message)
    }

    /// [`Self::fails`] for an input refused before the ingest starts: no run is recorded.
    pub fn refused_up_front(&self, args: &[&str], location: &str, text: &str) {
        let runs = |ws: &Path| status_json(ws)["runs"].as_array().unwrap().len();
        let before = runs(self.ws.path());
        self.fails(args, location, text);
        assert_eq!(runs(self.ws.path()), before, "no run recorded for {args:?}");
    }
}

/// A row as a split's chunk stores it: labels, feature ids, and the f32 bits of its values
/// and of its squared norm.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredRow {
    pub labels: Vec<u32>,
    pub indices: Vec<u32>,
    pub values: Vec<u32>,
    pub sq_norm: u32,
}

/// The catalog entry of dataset `name`, from `pipeline status --json`.
pub fn dataset_entry(ws: &Path, name: &str) -> serde_json::Value {
    status_json(ws)["datasets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == name)
        .unwrap_or_else(|| panic!("no dataset {name}"))
        .clone()
}

/// The entry of split `split` of dataset `dataset`, from `pipeline status --json`.
pub fn split_entry(ws: &Path, dataset: &str, split: &str) -> serde_json::Value {
    dataset_entry(ws, dataset)["splits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["split"] == split)
        .unwrap_or_else(|| panic!("no split {split}"))
        .clone()
}

/// The chunk files of a split, in order; asserts there are as many as the catalog says.
pub fn chunk_files(ws: &Path, dataset: &str, split: &str) -> Vec<std::path::PathBuf> {
    let entry = split_entry(ws, dataset, split);
    let mut files: Vec<_> = std::fs::read_dir(ws.join(entry["path"].as_str().unwrap()))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert_eq!(files.len() as u64, entry["n_chunks"].as_u64().unwrap());
    files
}

/// Every row of a split, from its chunk files in order; asserts that each row's id is its
/// position in the split and that there are as many as the catalog says.
pub fn split_rows(ws: &Path, dataset: &str, split: &str) -> Vec<StoredRow> {
    let mut rows = Vec::new();
    for f in chunk_files(ws, dataset, split) {
        let chunk = fsgp::store::chunks::read_chunk(&f).unwrap();
        for r in chunk.rows() {
            assert_eq!(
                r.row_id,
                rows.len() as u64,
                "row ids are positions in the split"
            );
            rows.push(StoredRow {
                labels: r.labels.to_vec(),
                indices: r.indices.to_vec(),
                values: r.values.iter().map(|v| v.to_bits()).collect(),
                sq_norm: r.sq_norm.to_bits(),
            });
        }
    }
    let n_rows = split_entry(ws, dataset, split)["n_rows"].as_u64().unwrap();
    assert_eq!(rows.len() as u64, n_rows);
    rows
}
