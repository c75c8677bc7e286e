//! What a workspace has registered, compared between a disturbed and an undisturbed run of
//! the same spec: every registered file's path and checksum, and the runs that finished.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The integration tests' spec of the whole pipeline on generated data: ingest 1, svd 2,
/// train 3, predict 4, evaluate 5 (`tests/it/integrity.rs` and the fault tests share it).
pub fn pipeline_spec() -> String {
    super::toy_spec(2, "", "top_k = 5\nprobabilities = true\n")
}

/// Every registered file with its checksum, and the finished runs (id, stage).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outputs {
    pub files: BTreeSet<(String, String)>,
    pub ok_runs: BTreeSet<(i64, String)>,
}

pub fn outputs(ws: &Path) -> Outputs {
    let db = rusqlite::Connection::open(ws.join("catalog.sqlite")).unwrap();
    let pairs = |sql: &str| -> BTreeSet<(String, String)> {
        let mut stmt = db.prepare(sql).unwrap();
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    let mut files = pairs("SELECT path, checksum FROM artifacts");
    files.extend(pairs("SELECT path, checksum FROM checkpoints"));
    let mut stmt = db
        .prepare("SELECT id, stage FROM stage_runs WHERE status = 'ok'")
        .unwrap();
    let ok_runs = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    Outputs { files, ok_runs }
}

/// The stages a spec invocation ran (not found cached), from its summary table.
pub fn stages_ran(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.split_whitespace().nth(2) == Some("ran"))
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect()
}

/// `pipeline --workspace WS run SPEC` with `env` set.
pub fn run_spec_with(ws: &Path, spec: &Path, env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = std::process::Command::new(super::pipeline_bin());
    cmd.arg("--workspace")
        .arg(ws)
        .args(["run", spec.to_str().unwrap()])
        .env_remove("FSGP_WORKSPACE")
        .env_remove("FSGP_FAILPOINT")
        .env_remove("FSGP_FREE_SPACE_BYTES");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("running pipeline")
}

/// One value of the catalog (read directly, without opening the workspace).
pub fn query<T: rusqlite::types::FromSql>(ws: &Path, sql: &str) -> T {
    rusqlite::Connection::open(ws.join("catalog.sqlite"))
        .unwrap()
        .query_row(sql, [], |r| r.get(0))
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// A fresh directory (under the target's temporary directory, prefixed `name`) holding the
/// pipeline spec as `toy.toml`; the spec's generated data and a workspace go beside it.
pub fn spec_dir(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix(name)
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let spec = super::write(dir.path(), "toy.toml", &pipeline_spec());
    (dir, spec)
}

/// The outputs of an undisturbed run of the pipeline spec (all five stages finished), run
/// once per test binary: what the disturbed runs of the fault tests must end at.
pub fn baseline() -> &'static Outputs {
    static BASELINE: OnceLock<Outputs> = OnceLock::new();
    BASELINE.get_or_init(|| {
        let (_dir, spec) = spec_dir("baseline");
        let ws = spec.parent().unwrap().join("ws");
        let out = run_spec_with(&ws, &spec, &[]);
        assert!(out.status.success(), "{}", super::stderr(&out));
        let outputs = outputs(&ws);
        assert_eq!(outputs.ok_runs.len(), 5, "{outputs:?}");
        outputs
    })
}
