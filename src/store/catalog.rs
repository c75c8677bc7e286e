//! The workspace catalog: an embedded SQLite database (WAL mode) recording datasets,
//! artifacts, stage runs and metrics.
//!
//! Invariant: a row that names files is committed only after those files are complete and
//! renamed into place, so anything the catalog lists is whole. Files without a row are
//! garbage from an interrupted run and are collected by [`super::workspace::Workspace::open`],
//! once the catalog has been shown to be the one that wrote them (`super::identity`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use rusqlite::{
    params, Connection, ErrorCode, OptionalExtension, Transaction, TransactionBehavior,
};
use serde::Serialize;

pub use super::classes::ClassMap;
pub use super::kinds::{ArtifactKind, LabelKind, RunStatus, Split, StageKind, Task};

/// Pages the catalog's write-ahead log grows to before SQLite checkpoints it into the
/// database (SQLite's default is 1000). The catalog's transactions are a few pages each, so
/// checkpointing this often costs nothing, and it bounds the room the log needs on a disk
/// being filled by a run ([`WAL_BOUND_BYTES`]).
const WAL_AUTOCHECKPOINT_PAGES: u64 = 100;

/// The catalog's page size (SQLite's default, which the catalog never changes).
const PAGE_BYTES: u64 = 4096;

/// About the most the catalog's write-ahead log grows to between two checkpoints: what a
/// stage that writes until the disk is full must leave free for its registrations.
pub const WAL_BOUND_BYTES: u64 = WAL_AUTOCHECKPOINT_PAGES * PAGE_BYTES;

/// How long a write waits for another process's lock before failing with a clear message.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(60);

/// 1: datasets, artifacts, runs, metrics; 2: adds `checkpoints`; 3: adds `run_options`,
/// `artifacts.verified_at` and `stage_runs.repaired_at`; 4: adds `datasets.label_kind` and
/// `datasets.class_map` ([`ADDED_COLUMNS`]); 5: adds `workspace` (the workspace's identity
/// and generation, [`Identity`]); 6: adds `checkpoints.best` and `run_options.stopped`
/// (early stopping) and `datasets.transform_reason`. Every statement of [`SCHEMA`] is
/// idempotent, so upgrading runs it again, then adds the columns a table created by an
/// older version lacks.
const SCHEMA_VERSION: i64 = 6;

/// Columns added after their table was first created: (table, column, declaration).
/// `verified_at`: when a large artifact (K_XX̃) was last hashed in full after registration
/// (`Workspace::map_large`); `repaired_at`: when `pipeline verify --repair` marked the run
/// failed because its outputs were damaged (the run is then recomputed under its own id);
/// `label_kind` / `class_map`: the dataset's [`LabelKind`] and [`ClassMap`] when its ingest
/// assigned the label ids (NULL: a multi-label dataset whose ids are those of the files);
/// `best`: 1 on the one checkpoint of an early-stopping run that scored best on the
/// validation split (never pruned; `predict` reads it by default); `stopped`: how a training
/// run ended (JSON of `trained::Stopped`: why, at which step, its best evaluation);
/// `transform_reason`: why `ingest --transform auto` chose the dataset's transform (the
/// `normalization` column), NULL when it was asked for by name.
const ADDED_COLUMNS: [(&str, &str, &str); 7] = [
    ("artifacts", "verified_at", "TEXT"),
    ("stage_runs", "repaired_at", "TEXT"),
    ("datasets", "label_kind", "TEXT"),
    ("datasets", "class_map", "TEXT"),
    ("checkpoints", "best", "INTEGER NOT NULL DEFAULT 0"),
    ("run_options", "stopped", "TEXT"),
    ("datasets", "transform_reason", "TEXT"),
];

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS stage_runs (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    stage       TEXT NOT NULL,
    params      TEXT NOT NULL,
    status      TEXT NOT NULL CHECK (status IN ('running', 'ok', 'failed', 'interrupted')),
    started_at  TEXT NOT NULL,
    ended_at    TEXT,
    error       TEXT,
    pid         INTEGER NOT NULL,
    pid_start   TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS datasets (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    name           TEXT NOT NULL UNIQUE,
    format         TEXT NOT NULL,
    normalization  TEXT NOT NULL,
    index_base     INTEGER NOT NULL,
    n_features     INTEGER NOT NULL,
    n_labels       INTEGER NOT NULL,
    path           TEXT NOT NULL,
    checksum       TEXT NOT NULL,
    params         TEXT NOT NULL,
    stage_run_id   INTEGER NOT NULL REFERENCES stage_runs(id),
    created_at     TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS dataset_splits (
    dataset_id         INTEGER NOT NULL REFERENCES datasets(id) ON DELETE CASCADE,
    split              TEXT NOT NULL,
    n_rows             INTEGER NOT NULL,
    nnz                INTEGER NOT NULL,
    label_nnz          INTEGER NOT NULL,
    unlabeled_rows     INTEGER NOT NULL,
    dropped_unlabeled  INTEGER NOT NULL,
    skipped_rows       INTEGER NOT NULL,
    chunk_rows         INTEGER NOT NULL,
    n_chunks           INTEGER NOT NULL,
    path               TEXT NOT NULL,
    PRIMARY KEY (dataset_id, split)
);
CREATE TABLE IF NOT EXISTS sources (
    dataset_id   INTEGER NOT NULL REFERENCES datasets(id) ON DELETE CASCADE,
    role         TEXT NOT NULL,
    path         TEXT NOT NULL,
    bytes        INTEGER NOT NULL,
    checksum     TEXT NOT NULL,
    compression  TEXT NOT NULL,
    PRIMARY KEY (dataset_id, role)
);
CREATE TABLE IF NOT EXISTS artifacts (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    kind          TEXT NOT NULL,
    path          TEXT NOT NULL UNIQUE,
    bytes         INTEGER NOT NULL,
    rows          INTEGER,
    checksum      TEXT NOT NULL,
    stage_run_id  INTEGER NOT NULL REFERENCES stage_runs(id),
    dataset_id    INTEGER REFERENCES datasets(id) ON DELETE CASCADE,
    split         TEXT,
    created_at    TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS metrics (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    stage_run_id  INTEGER NOT NULL REFERENCES stage_runs(id),
    name          TEXT NOT NULL,
    value         REAL NOT NULL,
    step          INTEGER,
    split         TEXT,
    recorded_at   TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS checkpoints (
    stage_run_id  INTEGER NOT NULL REFERENCES stage_runs(id),
    step          INTEGER NOT NULL,
    epoch         INTEGER NOT NULL,
    path          TEXT NOT NULL UNIQUE,
    bytes         INTEGER NOT NULL,
    checksum      TEXT NOT NULL,
    created_at    TEXT NOT NULL,
    PRIMARY KEY (stage_run_id, step)
);
CREATE TABLE IF NOT EXISTS workspace (
    one         INTEGER PRIMARY KEY CHECK (one = 1),
    id          TEXT NOT NULL,
    generation  INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS run_options (
    stage_run_id  INTEGER PRIMARY KEY REFERENCES stage_runs(id),
    params        TEXT NOT NULL,
    options       TEXT NOT NULL,
    changes       TEXT NOT NULL,
    reusable      INTEGER NOT NULL,
    updated_at    TEXT NOT NULL
);
"#;

const NOW: &str = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";

/// A stage run as recorded.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RunRow {
    pub id: i64,
    pub stage: StageKind,
    pub params: serde_json::Value,
    pub status: RunStatus,
    pub started_at: String,
    pub ended_at: Option<String>,
    pub error: Option<String>,
    pub pid: i64,
    pub pid_start: String,
}

/// One split of a dataset as recorded.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SplitRow {
    pub split: Split,
    pub n_rows: u64,
    pub nnz: u64,
    pub label_nnz: u64,
    pub unlabeled_rows: u64,
    pub dropped_unlabeled: u64,
    pub skipped_rows: u64,
    pub chunk_rows: u64,
    pub n_chunks: u64,
    /// Directory of the split's chunk files, relative to the workspace.
    pub path: String,
}

/// An input file a dataset was read from.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SourceRow {
    pub role: String,
    pub path: String,
    pub bytes: u64,
    pub checksum: String,
    pub compression: String,
}

/// A file produced by a stage run.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ArtifactRow {
    pub kind: ArtifactKind,
    /// Relative to the workspace.
    pub path: String,
    pub bytes: u64,
    pub rows: Option<u64>,
    pub checksum: String,
    pub split: Option<Split>,
}

/// A registered artifact with who registered it (the catalog's view for reading and
/// checking it: `Workspace::registered`).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct StoredArtifact {
    pub id: i64,
    /// The run that registered it.
    pub run_id: i64,
    pub stage: StageKind,
    /// The dataset it belongs to, if any.
    pub dataset: Option<String>,
    /// When it was last hashed in full after registration (large files only).
    pub verified_at: Option<String>,
    pub artifact: ArtifactRow,
}

/// One recorded figure of a run (`step` and `split` when they apply).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct MetricRow {
    pub name: String,
    pub value: f64,
    pub step: Option<i64>,
    pub split: Option<Split>,
}

/// A registered training checkpoint.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct CheckpointRow {
    pub run_id: i64,
    pub step: u64,
    pub epoch: u64,
    /// Relative to the workspace.
    pub path: String,
    pub bytes: u64,
    pub checksum: String,
    /// The checkpoint of an early-stopping run that scored best on the validation split
    /// (at most one per run).
    pub best: bool,
}

/// How a run is steered beyond the parameters it started with (training: options changed
/// on resume, checkpoint retention). `stage_runs.params` stays what the run started with.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RunOptionsRow {
    pub run_id: i64,
    /// The parameters in force now: the run's `params` with the changes applied. Lookups
    /// match a run on these.
    pub params: serde_json::Value,
    /// Options that steer the run without changing its numbers.
    pub options: serde_json::Value,
    /// Every change made on resume, oldest first.
    pub changes: serde_json::Value,
    /// False once a change made the run's numbers differ from those of an uninterrupted run
    /// with `params`; such a run answers no lookup.
    pub reusable: bool,
    /// How the run ended (None while it runs).
    pub stopped: Option<serde_json::Value>,
}

/// A dataset with everything recorded about it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DatasetRow {
    pub id: i64,
    pub name: String,
    pub format: String,
    pub normalization: String,
    pub index_base: u32,
    pub n_features: u64,
    pub n_labels: u64,
    pub path: String,
    pub checksum: String,
    pub params: serde_json::Value,
    pub stage_run_id: i64,
    pub created_at: String,
    pub splits: Vec<SplitRow>,
    pub sources: Vec<SourceRow>,
    /// The label kind recorded at ingest (None: not recorded, read as multi-label).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded_label_kind: Option<LabelKind>,
    /// Label id → original label, when the ingest assigned the ids.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub class_map: Option<ClassMap>,
    /// Why `--transform auto` chose `normalization` (None: asked for by name, or ingested
    /// before transforms were recorded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transform_reason: Option<String>,
}

impl DatasetRow {
    pub fn split(&self, split: Split) -> Option<&SplitRow> {
        self.splits.iter().find(|s| s.split == split)
    }

    /// What the dataset's label ids mean; datasets ingested before label kinds were
    /// recorded (and the Extreme Classification layouts without `--first-label`) are
    /// multi-label.
    pub fn label_kind(&self) -> LabelKind {
        self.recorded_label_kind.unwrap_or(LabelKind::Multilabel)
    }
}

/// Everything an ingest registers, committed in one transaction.
#[derive(Debug, Clone)]
pub struct NewDataset {
    pub name: String,
    pub format: String,
    pub normalization: String,
    pub index_base: u32,
    pub n_features: u64,
    pub n_labels: u64,
    pub path: String,
    pub checksum: String,
    pub params: serde_json::Value,
    pub splits: Vec<SplitRow>,
    pub sources: Vec<SourceRow>,
    pub artifacts: Vec<ArtifactRow>,
    /// Recorded only when the ingest assigned the label ids (see [`DatasetRow::label_kind`]).
    pub label_kind: Option<LabelKind>,
    pub class_map: Option<ClassMap>,
    /// Why `auto` chose the transform (`normalization`); None when asked for by name.
    pub transform_reason: Option<String>,
}

fn artifact_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ArtifactRow> {
    Ok(ArtifactRow {
        kind: r.get(0)?,
        path: r.get(1)?,
        bytes: r.get::<_, i64>(2)? as u64,
        rows: r.get::<_, Option<i64>>(3)?.map(|v| v as u64),
        checksum: r.get(4)?,
        split: r.get(5)?,
    })
}

/// Inserts a run's artifacts and marks the run 'ok' (inside the caller's transaction).
fn insert_artifacts_and_finish(
    tx: &Transaction<'_>,
    path: &Path,
    run_id: i64,
    dataset_id: Option<i64>,
    artifacts: &[ArtifactRow],
) -> Result<()> {
    for a in artifacts {
        tx.execute(
            &format!(
                "INSERT INTO artifacts (kind, path, bytes, rows, checksum, stage_run_id, \
                 dataset_id, split, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, {NOW})"
            ),
            params![
                a.kind,
                a.path,
                a.bytes as i64,
                a.rows.map(|r| r as i64),
                a.checksum,
                run_id,
                dataset_id,
                a.split
            ],
        )
        .map_err(|e| explain(path, e))?;
    }
    tx.execute(
        &format!("UPDATE stage_runs SET status = 'ok', ended_at = {NOW} WHERE id = ?1"),
        [run_id],
    )
    .map_err(|e| explain(path, e))?;
    Ok(())
}

/// Inserts a dataset's row (inside the caller's transaction) and returns its id.
fn insert_dataset(tx: &Transaction<'_>, path: &Path, run_id: i64, d: &NewDataset) -> Result<i64> {
    tx.execute(
        &format!(
            "INSERT INTO datasets (name, format, normalization, index_base, n_features, \
             n_labels, path, checksum, params, stage_run_id, label_kind, class_map, \
             transform_reason, created_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, {NOW})"
        ),
        params![
            d.name,
            d.format,
            d.normalization,
            d.index_base,
            d.n_features as i64,
            d.n_labels as i64,
            d.path,
            d.checksum,
            d.params.to_string(),
            run_id,
            d.label_kind,
            d.class_map.as_ref().map(ClassMap::to_text),
            d.transform_reason
        ],
    )
    .map_err(|e| explain(path, e))?;
    Ok(tx.last_insert_rowid())
}

/// `ALTER TABLE ... ADD COLUMN` unless the column exists (SQLite has no IF NOT EXISTS for
/// columns), so the migration stays idempotent.
fn add_column_if_missing(
    tx: &Transaction<'_>,
    table: &str,
    column: &str,
    decl: &str,
) -> rusqlite::Result<()> {
    let mut stmt = tx.prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))?;
    let columns = stmt
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    if !columns.iter().any(|c| c == column) {
        tx.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {decl}"))?;
    }
    Ok(())
}

pub struct Catalog {
    conn: Connection,
    path: PathBuf,
}

/// Another process holds what this one needs: a stage's lock, or the catalog's write lock
/// past its busy timeout. No fault of the inputs or the options: the same command succeeds
/// once the other process is done (`pipeline fit` ends at once on it rather than counting it
/// against a candidate).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Contended(pub String);

/// Turns SQLite's "database is locked" into an error a person can act on.
fn explain(path: &Path, e: rusqlite::Error) -> anyhow::Error {
    if let rusqlite::Error::SqliteFailure(f, _) = &e {
        if matches!(f.code, ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) {
            return anyhow::Error::new(Contended(format!(
                "catalog {} is busy: another pipeline process held its lock for longer than \
                 the busy timeout ({} s); retry when it has finished",
                path.display(),
                DEFAULT_BUSY_TIMEOUT.as_secs()
            )));
        }
    }
    anyhow::Error::new(e).context(format!("catalog {}", path.display()))
}

/// Puts the database of `conn` in WAL mode unless it is already. Switching needs an
/// exclusive lock, and SQLite answers a switch that meets another connection's lock with
/// SQLITE_BUSY at once, without its busy handler: two processes opening a new workspace
/// together both switch. So the switch is retried until the busy timeout has passed.
fn switch_to_wal(conn: &Connection) -> rusqlite::Result<()> {
    let started = std::time::Instant::now();
    loop {
        let mode: String = conn.pragma_query_value(None, "journal_mode", |r| r.get(0))?;
        if mode.eq_ignore_ascii_case("wal") {
            return Ok(());
        }
        match conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get::<_, String>(0)) {
            Ok(_) => return Ok(()),
            Err(rusqlite::Error::SqliteFailure(f, _))
                if matches!(f.code, ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
                    && started.elapsed() < DEFAULT_BUSY_TIMEOUT =>
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e),
        }
    }
}

/// The tables that hold one run's rows, each with the condition that selects them (`?1` is
/// the run id), parents first: the order a rebuilt catalog takes them back in.
const RUN_TABLES: [(&str, &str); 8] = [
    ("stage_runs", "id = ?1"),
    ("datasets", "stage_run_id = ?1"),
    (
        "dataset_splits",
        "dataset_id IN (SELECT id FROM datasets WHERE stage_run_id = ?1)",
    ),
    (
        "sources",
        "dataset_id IN (SELECT id FROM datasets WHERE stage_run_id = ?1)",
    ),
    ("artifacts", "stage_run_id = ?1"),
    ("metrics", "stage_run_id = ?1"),
    ("checkpoints", "stage_run_id = ?1"),
    ("run_options", "stage_run_id = ?1"),
];

/// Every catalog row of one run, table by table, each row as column → value: what a run
/// directory's marker carries so that a lost catalog can be rebuilt from the directories
/// (`store::identity`, `store::rebuild`).
pub type RunRows =
    std::collections::BTreeMap<String, Vec<serde_json::Map<String, serde_json::Value>>>;

/// An SQLite value as JSON (the catalog stores no blobs; reals round-trip through JSON's
/// shortest representation exactly).
fn value_to_json(v: rusqlite::types::ValueRef<'_>) -> serde_json::Value {
    use rusqlite::types::ValueRef;
    match v {
        ValueRef::Null => serde_json::Value::Null,
        ValueRef::Integer(i) => i.into(),
        ValueRef::Real(f) => f.into(),
        ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned().into(),
        ValueRef::Blob(b) => b.iter().map(|&x| u64::from(x)).collect::<Vec<_>>().into(),
    }
}

/// A JSON value of [`value_to_json`] back as an SQLite value.
fn json_to_value(v: &serde_json::Value) -> rusqlite::types::Value {
    use rusqlite::types::Value;
    match v {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(b) => Value::Integer(i64::from(*b)),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => Value::Integer(i),
            None => Value::Real(n.as_f64().unwrap_or(f64::NAN)),
        },
        serde_json::Value::String(s) => Value::Text(s.clone()),
        other => Value::Text(other.to_string()),
    }
}

/// The refusal of a catalog written by a newer fsgp: one message wherever it is met
/// (opening to write, opening to read, `pipeline verify`).
fn newer_schema(path: &Path, version: i64) -> anyhow::Error {
    anyhow!(
        "catalog {} has schema version {version}, newer than this build's ({SCHEMA_VERSION}): \
         it was written by a newer fsgp; use that version (this one changed nothing)",
        path.display()
    )
}

/// The workspace's identity as its catalog records it: a random id given when the
/// workspace was created, and a generation raised each time a run is about to publish
/// files, recorded in those files' directories too (`store::identity`), so a catalog older
/// than the files it should describe is recognised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub id: String,
    pub generation: i64,
}

/// A read-only connection to the database at `path`: immutable when its directory cannot
/// be written (a read-only mount or permissions), where SQLite could not create the
/// shared-memory file a WAL database is read through.
fn read_only_connection(path: &Path, writable_dir: bool) -> rusqlite::Result<Connection> {
    use rusqlite::OpenFlags;
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
        | OpenFlags::SQLITE_OPEN_URI
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    if writable_dir {
        Connection::open_with_flags(path, flags)
    } else {
        Connection::open_with_flags(immutable_uri(path), flags)
    }
}

/// `path` as an SQLite URI opening it immutable (nothing written, nothing locked), with
/// the characters a URI path gives meaning to escaped.
fn immutable_uri(path: &Path) -> String {
    let mut uri = String::from("file:");
    for c in path.to_string_lossy().chars() {
        match c {
            '%' | '?' | '#' => uri.push_str(&format!("%{:02X}", c as u32)),
            c => uri.push(c),
        }
    }
    uri.push_str("?immutable=1");
    uri
}

impl Catalog {
    /// Opens the catalog at `path` without writing it ([`read_only_connection`]). Refuses a
    /// catalog of a newer schema; one of an older schema is read upgraded in memory.
    pub fn open_read_only(path: &Path, writable_dir: bool) -> Result<Self> {
        let conn = read_only_connection(path, writable_dir)
            .with_context(|| format!("opening catalog {} to read", path.display()))?;
        conn.busy_timeout(DEFAULT_BUSY_TIMEOUT)
            .map_err(|e| explain(path, e))?;
        let catalog = Catalog {
            conn,
            path: path.to_path_buf(),
        };
        let version = catalog.schema_version()?;
        if version > SCHEMA_VERSION {
            return Err(newer_schema(path, version));
        }
        if version < SCHEMA_VERSION {
            return catalog.upgraded_in_memory();
        }
        Ok(catalog)
    }

    /// A catalog of an older schema, read without writing it: copied into memory (SQLite's
    /// online backup) and upgraded there. Catalogs are small (rows, not data).
    fn upgraded_in_memory(self) -> Result<Self> {
        use rusqlite::backup::{Backup, StepResult};
        let e = |e| explain(&self.path, e);
        let mut memory = Connection::open_in_memory().map_err(e)?;
        {
            let backup = Backup::new(&self.conn, &mut memory).map_err(e)?;
            let started = std::time::Instant::now();
            loop {
                match backup.step(-1).map_err(e)? {
                    StepResult::Done => break,
                    StepResult::More => {}
                    // A writer holds the file: wait for it as a reader would.
                    _ if started.elapsed() < DEFAULT_BUSY_TIMEOUT => {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    _ => {
                        return Err(explain(
                            &self.path,
                            rusqlite::Error::SqliteFailure(
                                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
                                None,
                            ),
                        ))
                    }
                }
            }
        }
        let upgraded = Catalog {
            conn: memory,
            path: self.path,
        };
        upgraded.migrate()?;
        Ok(upgraded)
    }

    fn schema_version(&self) -> Result<i64> {
        self.conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(|e| explain(&self.path, e))
    }

    /// The identity recorded in the catalog; None for a catalog that has none yet (new, or
    /// of a schema before 5).
    pub fn identity(&self) -> Result<Option<Identity>> {
        let has_table: bool = self
            .conn
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = \
                 'workspace')",
                [],
                |r| r.get(0),
            )
            .map_err(|e| explain(&self.path, e))?;
        if !has_table {
            return Ok(None);
        }
        self.conn
            .query_row(
                "SELECT id, generation FROM workspace WHERE one = 1",
                [],
                |r| {
                    Ok(Identity {
                        id: r.get(0)?,
                        generation: r.get(1)?,
                    })
                },
            )
            .optional()
            .map_err(|e| explain(&self.path, e))
    }

    /// Records `id` as the workspace's identity unless the catalog has one, and returns the
    /// one it has then (another process may have recorded its own first).
    pub fn claim_identity(&self, id: &str) -> Result<Identity> {
        let tx = self.write_tx()?;
        let e = |e| explain(&self.path, e);
        tx.execute(
            "INSERT OR IGNORE INTO workspace (one, id, generation) VALUES (1, ?1, 0)",
            [id],
        )
        .map_err(e)?;
        tx.commit().map_err(e)?;
        self.identity()?.with_context(|| {
            format!(
                "catalog {}: no identity after recording one",
                self.path.display()
            )
        })
    }

    /// Raises the workspace's generation by one and returns it: called before a run puts
    /// files in place, whose directory then records it (`store::identity::RunMarker`).
    pub fn next_generation(&self) -> Result<i64> {
        let tx = self.write_tx()?;
        let e = |e| explain(&self.path, e);
        let generation = tx
            .query_row(
                "UPDATE workspace SET generation = generation + 1 WHERE one = 1 \
                 RETURNING generation",
                [],
                |r| r.get(0),
            )
            .optional()
            .map_err(e)?
            .with_context(|| {
                format!(
                    "catalog {}: the workspace has no identity yet",
                    self.path.display()
                )
            })?;
        tx.commit().map_err(e)?;
        Ok(generation)
    }

    /// Every row of run `run` ([`RUN_TABLES`]).
    pub fn run_rows(&self, run: i64) -> Result<RunRows> {
        let mut rows = RunRows::new();
        for (table, condition) in RUN_TABLES {
            let sql = format!("SELECT * FROM {table} WHERE {condition}");
            let e = |e| explain(&self.path, e);
            let mut stmt = self.conn.prepare(&sql).map_err(e)?;
            let columns: Vec<String> = stmt.column_names().map(str::to_string).collect();
            let found = stmt
                .query_map([run], |r| {
                    let mut row = serde_json::Map::new();
                    for (i, column) in columns.iter().enumerate() {
                        row.insert(column.clone(), value_to_json(r.get_ref(i)?));
                    }
                    Ok(row)
                })
                .map_err(e)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(e)?;
            if !found.is_empty() {
                rows.insert(table.to_string(), found);
            }
        }
        Ok(rows)
    }

    /// Inserts the rows of one run, as [`Catalog::run_rows`] gave them, in one transaction:
    /// all of them or, on any conflict (a dataset name taken, a parent row missing), none.
    pub fn restore_run_rows(&self, rows: &RunRows) -> Result<()> {
        let tx = self.write_tx()?;
        let e = |e| explain(&self.path, e);
        for (table, _) in RUN_TABLES {
            for row in rows.get(table).into_iter().flatten() {
                let columns: Vec<&str> = row.keys().map(String::as_str).collect();
                let marks: Vec<String> = (1..=columns.len()).map(|i| format!("?{i}")).collect();
                let sql = format!(
                    "INSERT INTO {table} ({}) VALUES ({})",
                    columns.join(", "),
                    marks.join(", ")
                );
                let values: Vec<rusqlite::types::Value> = row.values().map(json_to_value).collect();
                tx.execute(&sql, rusqlite::params_from_iter(values))
                    .map_err(e)
                    .with_context(|| format!("restoring a row of {table}"))?;
            }
        }
        tx.commit().map_err(e)
    }

    /// The time now in UTC as `YYYYMMDDTHHMMSSZ`, by the catalog's clock (the one its rows'
    /// times come from): the name of a folder in `lost+found`.
    pub fn utc_stamp(&self) -> Result<String> {
        self.conn
            .query_row("SELECT strftime('%Y%m%dT%H%M%SZ', 'now')", [], |r| r.get(0))
            .map_err(|e| explain(&self.path, e))
    }

    /// Sets the workspace's generation (a rebuilt catalog takes the highest its run
    /// directories recorded).
    pub fn set_generation(&self, generation: i64) -> Result<()> {
        self.conn
            .execute(
                "UPDATE workspace SET generation = ?1 WHERE one = 1",
                [generation],
            )
            .map_err(|e| explain(&self.path, e))?;
        Ok(())
    }

    /// The largest run id the catalog has given out (0 for none): its AUTOINCREMENT
    /// counter, which outlives deleted rows.
    pub fn last_run_id(&self) -> Result<i64> {
        self.conn
            .query_row(
                "SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = \
                 'stage_runs'), 0), coalesce((SELECT max(id) FROM stage_runs), 0))",
                [],
                |r| r.get(0),
            )
            .map_err(|e| explain(&self.path, e))
    }

    /// Opens (creating if needed) the catalog database at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let conn = Connection::open(path)
            .with_context(|| format!("opening catalog {}", path.display()))?;
        conn.busy_timeout(DEFAULT_BUSY_TIMEOUT)
            .map_err(|e| explain(path, e))?;
        // WAL lets readers (`pipeline status`) run beside a writer; NORMAL sync is durable
        // at every checkpoint and never corrupts on power loss in WAL mode.
        switch_to_wal(&conn).map_err(|e| explain(path, e))?;
        conn.pragma_update(None, "wal_autocheckpoint", WAL_AUTOCHECKPOINT_PAGES as i64)
            .map_err(|e| explain(path, e))?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(|e| explain(path, e))?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(|e| explain(path, e))?;
        let catalog = Catalog {
            conn,
            path: path.to_path_buf(),
        };
        catalog.migrate()?;
        Ok(catalog)
    }

    /// Starts a write transaction, taking the write lock up front (BEGIN IMMEDIATE) so two
    /// writers queue on the busy timeout instead of failing on a lock upgrade.
    fn write_tx(&self) -> Result<Transaction<'_>> {
        Transaction::new_unchecked(&self.conn, TransactionBehavior::Immediate)
            .map_err(|e| explain(&self.path, e))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn migrate(&self) -> Result<()> {
        let path = self.path.clone();
        let tx = self.write_tx()?;
        let version: i64 = tx
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(|e| explain(&path, e))?;
        if version > SCHEMA_VERSION {
            return Err(newer_schema(&path, version));
        }
        if version < SCHEMA_VERSION {
            tx.execute_batch(SCHEMA).map_err(|e| explain(&path, e))?;
            for (table, column, decl) in ADDED_COLUMNS {
                add_column_if_missing(&tx, table, column, decl).map_err(|e| explain(&path, e))?;
            }
            tx.pragma_update(None, "user_version", SCHEMA_VERSION)
                .map_err(|e| explain(&path, e))?;
        }
        tx.commit().map_err(|e| explain(&path, e))
    }

    /// Records the start of a stage run and returns its id.
    pub fn begin_run(
        &self,
        stage: StageKind,
        params: &serde_json::Value,
        pid: u32,
        pid_start: &str,
    ) -> Result<i64> {
        self.conn
            .execute(
                &format!(
                    "INSERT INTO stage_runs (stage, params, status, started_at, pid, pid_start) \
                     VALUES (?1, ?2, 'running', {NOW}, ?3, ?4)"
                ),
                params![stage, params.to_string(), pid, pid_start],
            )
            .map_err(|e| explain(&self.path, e))?;
        Ok(self.conn.last_insert_rowid())
    }

    /// Marks a run ended with `status` (ok, failed or interrupted).
    pub fn end_run(&self, id: i64, status: RunStatus, error: Option<&str>) -> Result<()> {
        self.conn
            .execute(
                &format!(
                    "UPDATE stage_runs SET status = ?2, ended_at = {NOW}, error = ?3 WHERE id = ?1"
                ),
                params![id, status, error],
            )
            .map_err(|e| explain(&self.path, e))?;
        Ok(())
    }

    fn run_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RunRow> {
        let params: String = r.get(2)?;
        Ok(RunRow {
            id: r.get(0)?,
            stage: r.get(1)?,
            params: serde_json::from_str(&params).unwrap_or(serde_json::Value::Null),
            status: r.get(3)?,
            started_at: r.get(4)?,
            ended_at: r.get(5)?,
            error: r.get(6)?,
            pid: r.get(7)?,
            pid_start: r.get(8)?,
        })
    }

    const RUN_COLUMNS: &'static str =
        "id, stage, params, status, started_at, ended_at, error, pid, pid_start";

    /// Stage runs, newest first.
    pub fn runs(&self, limit: usize) -> Result<Vec<RunRow>> {
        let sql = format!(
            "SELECT {} FROM stage_runs ORDER BY id DESC LIMIT ?1",
            Self::RUN_COLUMNS
        );
        self.rows(&sql, [limit as i64], Self::run_from_row)
    }

    /// Runs still marked 'running' (live, or dead without having said so).
    pub fn running_runs(&self) -> Result<Vec<RunRow>> {
        let sql = format!(
            "SELECT {} FROM stage_runs WHERE status = 'running' ORDER BY id",
            Self::RUN_COLUMNS
        );
        self.rows(&sql, [], Self::run_from_row)
    }

    /// Registers a dataset with its splits, sources and artifacts and marks its run 'ok',
    /// all in one transaction: either everything is recorded or nothing is.
    /// With `replace`, an existing dataset of the same name is deleted in the same
    /// transaction and its directory (workspace-relative) is returned for the caller to remove.
    pub fn commit_dataset(
        &self,
        run_id: i64,
        d: &NewDataset,
        replace: bool,
    ) -> Result<Option<String>> {
        let path = self.path.clone();
        let tx = self.write_tx()?;
        let existing: Option<(i64, String, i64)> = tx
            .query_row(
                "SELECT id, path, stage_run_id FROM datasets WHERE name = ?1",
                [&d.name],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()
            .map_err(|e| explain(&path, e))?;
        let (dataset_id, replaced) = match existing {
            // The dataset's own ingest run recomputed after `pipeline verify --repair`: the
            // row keeps its id, so the artifacts of later stages stay attached to it.
            Some((id, _, owner)) if owner == run_id => {
                for table in ["dataset_splits", "sources"] {
                    tx.execute(&format!("DELETE FROM {table} WHERE dataset_id = ?1"), [id])
                        .map_err(|e| explain(&path, e))?;
                }
                tx.execute("DELETE FROM artifacts WHERE stage_run_id = ?1", [run_id])
                    .map_err(|e| explain(&path, e))?;
                tx.execute(
                    "UPDATE datasets SET format = ?2, normalization = ?3, index_base = ?4, \
                     n_features = ?5, n_labels = ?6, path = ?7, checksum = ?8, params = ?9, \
                     label_kind = ?10, class_map = ?11, transform_reason = ?12 WHERE id = ?1",
                    params![
                        id,
                        d.format,
                        d.normalization,
                        d.index_base,
                        d.n_features as i64,
                        d.n_labels as i64,
                        d.path,
                        d.checksum,
                        d.params.to_string(),
                        d.label_kind,
                        d.class_map.as_ref().map(ClassMap::to_text),
                        d.transform_reason
                    ],
                )
                .map_err(|e| explain(&path, e))?;
                (id, None)
            }
            Some((id, old_path, _)) if replace => {
                tx.execute("DELETE FROM datasets WHERE id = ?1", [id])
                    .map_err(|e| explain(&path, e))?;
                (insert_dataset(&tx, &path, run_id, d)?, Some(old_path))
            }
            Some(_) => anyhow::bail!(
                "dataset '{}' was registered by another process while this one ran",
                d.name
            ),
            None => (insert_dataset(&tx, &path, run_id, d)?, None),
        };
        for s in &d.splits {
            tx.execute(
                "INSERT INTO dataset_splits (dataset_id, split, n_rows, nnz, label_nnz, \
                 unlabeled_rows, dropped_unlabeled, skipped_rows, chunk_rows, n_chunks, path) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                params![
                    dataset_id,
                    s.split,
                    s.n_rows as i64,
                    s.nnz as i64,
                    s.label_nnz as i64,
                    s.unlabeled_rows as i64,
                    s.dropped_unlabeled as i64,
                    s.skipped_rows as i64,
                    s.chunk_rows as i64,
                    s.n_chunks as i64,
                    s.path
                ],
            )
            .map_err(|e| explain(&path, e))?;
        }
        for s in &d.sources {
            tx.execute(
                "INSERT INTO sources (dataset_id, role, path, bytes, checksum, compression) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    dataset_id,
                    s.role,
                    s.path,
                    s.bytes as i64,
                    s.checksum,
                    s.compression
                ],
            )
            .map_err(|e| explain(&path, e))?;
        }
        insert_artifacts_and_finish(&tx, &path, run_id, Some(dataset_id), &d.artifacts)?;
        tx.commit().map_err(|e| explain(&path, e))?;
        Ok(replaced)
    }

    /// Registers the artifacts of a run and marks the run 'ok', in one transaction.
    pub fn commit_artifacts(
        &self,
        run_id: i64,
        dataset_id: Option<i64>,
        artifacts: &[ArtifactRow],
    ) -> Result<()> {
        let tx = self.write_tx()?;
        insert_artifacts_and_finish(&tx, &self.path, run_id, dataset_id, artifacts)?;
        tx.commit().map_err(|e| explain(&self.path, e))
    }

    /// The newest successful run of `stage` with exactly these parameters.
    pub fn find_ok_run(
        &self,
        stage: StageKind,
        params: &serde_json::Value,
    ) -> Result<Option<RunRow>> {
        self.find_run_with_status(stage, params, RunStatus::Ok)
    }

    /// The newest run of `stage` with exactly these parameters and this status.
    pub fn find_run_with_status(
        &self,
        stage: StageKind,
        params: &serde_json::Value,
        status: RunStatus,
    ) -> Result<Option<RunRow>> {
        Ok(self
            .query_runs(
                "WHERE stage = ?1 AND params = ?2 AND status = ?3 ORDER BY id DESC LIMIT 1",
                params![stage, params.to_string(), status],
            )?
            .pop())
    }

    /// The newest successful run of `stage` whose parameters name this dataset and
    /// ingest (`dataset`, `dataset_checksum` fields), e.g. the svd a training run uses.
    pub fn newest_ok_run_of_dataset(
        &self,
        stage: StageKind,
        dataset: &str,
        dataset_checksum: &str,
    ) -> Result<Option<RunRow>> {
        Ok(self
            .query_runs(
                "WHERE stage = ?1 AND status = ?2 \
                 AND json_extract(params, '$.dataset') = ?3 \
                 AND json_extract(params, '$.dataset_checksum') = ?4 \
                 ORDER BY id DESC LIMIT 1",
                params![stage, RunStatus::Ok, dataset, dataset_checksum],
            )?
            .pop())
    }

    /// Runs of `stage` with `status`, newest first.
    pub fn runs_of(&self, stage: StageKind, status: RunStatus) -> Result<Vec<RunRow>> {
        self.query_runs(
            "WHERE stage = ?1 AND status = ?2 ORDER BY id DESC",
            params![stage, status],
        )
    }

    /// Runs of `stage` with `status` whose integer parameter `key` is `value` (e.g. the
    /// predict runs of one training run), newest first.
    pub fn runs_with_param(
        &self,
        stage: StageKind,
        status: RunStatus,
        key: &str,
        value: i64,
    ) -> Result<Vec<RunRow>> {
        self.query_runs(
            "WHERE stage = ?1 AND status = ?2 AND json_extract(params, '$.' || ?3) = ?4 \
             ORDER BY id DESC",
            params![stage, status, key, value],
        )
    }

    /// Every row of `sql` with `args`, each turned into a `T` by `row`; errors name the
    /// catalog file.
    fn rows<T>(
        &self,
        sql: &str,
        args: impl rusqlite::Params,
        row: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    ) -> Result<Vec<T>> {
        let e = |e| explain(&self.path, e);
        let mut stmt = self.conn.prepare(sql).map_err(e)?;
        let rows = stmt.query_map(args, row).map_err(e)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(e)
    }

    fn query_runs(&self, tail: &str, args: impl rusqlite::Params) -> Result<Vec<RunRow>> {
        let sql = format!("SELECT {} FROM stage_runs {tail}", Self::RUN_COLUMNS);
        self.rows(&sql, args, Self::run_from_row)
    }

    /// The artifact of `kind` a run registered, if any (the first when there are several).
    pub fn run_artifact(&self, run_id: i64, kind: ArtifactKind) -> Result<Option<ArtifactRow>> {
        Ok(self
            .run_artifacts(run_id)?
            .into_iter()
            .find(|a| a.kind == kind))
    }

    /// Artifacts produced by one run, in id order.
    pub fn run_artifacts(&self, run_id: i64) -> Result<Vec<ArtifactRow>> {
        self.rows(
            "SELECT kind, path, bytes, rows, checksum, split FROM artifacts \
             WHERE stage_run_id = ?1 ORDER BY id",
            [run_id],
            artifact_from_row,
        )
    }

    pub fn dataset(&self, name: &str) -> Result<Option<DatasetRow>> {
        Ok(self.datasets()?.into_iter().find(|d| d.name == name))
    }

    /// All datasets with their splits and sources, oldest first.
    pub fn datasets(&self) -> Result<Vec<DatasetRow>> {
        let sql = "SELECT id, name, format, normalization, index_base, n_features, n_labels, \
                   path, checksum, params, stage_run_id, created_at, label_kind, class_map, \
                   transform_reason FROM datasets ORDER BY id";
        let mut datasets = self.rows(sql, [], |r| {
            let params: String = r.get(9)?;
            let class_map = r
                .get::<_, Option<String>>(13)?
                .map(|text| ClassMap::from_text(&text))
                .transpose()
                .map_err(|e| {
                    rusqlite::Error::FromSqlConversionFailure(
                        13,
                        rusqlite::types::Type::Text,
                        e.into(),
                    )
                })?;
            Ok(DatasetRow {
                id: r.get(0)?,
                name: r.get(1)?,
                format: r.get(2)?,
                normalization: r.get(3)?,
                index_base: r.get(4)?,
                n_features: r.get::<_, i64>(5)? as u64,
                n_labels: r.get::<_, i64>(6)? as u64,
                path: r.get(7)?,
                checksum: r.get(8)?,
                params: serde_json::from_str(&params).unwrap_or(serde_json::Value::Null),
                stage_run_id: r.get(10)?,
                created_at: r.get(11)?,
                splits: Vec::new(),
                sources: Vec::new(),
                recorded_label_kind: r.get(12)?,
                class_map,
                transform_reason: r.get(14)?,
            })
        })?;
        for d in &mut datasets {
            d.splits = self.splits(d.id)?;
            d.sources = self.sources(d.id)?;
        }
        Ok(datasets)
    }

    /// A dataset's splits in [`Split`]'s order: train, validation, test.
    fn splits(&self, dataset_id: i64) -> Result<Vec<SplitRow>> {
        let mut splits = self.rows(
            "SELECT split, n_rows, nnz, label_nnz, unlabeled_rows, dropped_unlabeled, \
             skipped_rows, chunk_rows, n_chunks, path FROM dataset_splits \
             WHERE dataset_id = ?1",
            [dataset_id],
            |r| {
                let u = |i: usize| r.get::<_, i64>(i).map(|v| v as u64);
                Ok(SplitRow {
                    split: r.get(0)?,
                    n_rows: u(1)?,
                    nnz: u(2)?,
                    label_nnz: u(3)?,
                    unlabeled_rows: u(4)?,
                    dropped_unlabeled: u(5)?,
                    skipped_rows: u(6)?,
                    chunk_rows: u(7)?,
                    n_chunks: u(8)?,
                    path: r.get(9)?,
                })
            },
        )?;
        splits.sort_by_key(|s| s.split);
        Ok(splits)
    }

    fn sources(&self, dataset_id: i64) -> Result<Vec<SourceRow>> {
        self.rows(
            "SELECT role, path, bytes, checksum, compression FROM sources \
             WHERE dataset_id = ?1 ORDER BY role",
            [dataset_id],
            |r| {
                Ok(SourceRow {
                    role: r.get(0)?,
                    path: r.get(1)?,
                    bytes: r.get::<_, i64>(2)? as u64,
                    checksum: r.get(3)?,
                    compression: r.get(4)?,
                })
            },
        )
    }

    /// Artifacts, optionally only those of one dataset, in id order.
    pub fn artifacts(&self, dataset_id: Option<i64>) -> Result<Vec<ArtifactRow>> {
        self.rows(
            "SELECT kind, path, bytes, rows, checksum, split FROM artifacts \
             WHERE ?1 IS NULL OR dataset_id = ?1 ORDER BY id",
            [dataset_id],
            artifact_from_row,
        )
    }

    /// One stage run by id.
    pub fn run(&self, id: i64) -> Result<Option<RunRow>> {
        let sql = format!("SELECT {} FROM stage_runs WHERE id = ?1", Self::RUN_COLUMNS);
        self.conn
            .query_row(&sql, [id], Self::run_from_row)
            .optional()
            .map_err(|e| explain(&self.path, e))
    }

    /// The wall-clock seconds a finished stage run took (from its start to its end, as
    /// recorded to the millisecond); None for a run without an end or an unknown id.
    pub fn run_seconds(&self, id: i64) -> Result<Option<f64>> {
        self.conn
            .query_row(
                "SELECT (julianday(ended_at) - julianday(started_at)) * 86400.0 \
                 FROM stage_runs WHERE id = ?1 AND ended_at IS NOT NULL",
                [id],
                |r| r.get::<_, Option<f64>>(0),
            )
            .optional()
            .map(Option::flatten)
            .map_err(|e| explain(&self.path, e))
    }

    /// Marks an interrupted or failed run as running again under this process (resume).
    /// Fails when the run is not resumable, so two processes cannot resume one run.
    pub fn reopen_run(&self, id: i64, pid: u32, pid_start: &str) -> Result<()> {
        self.reopen(
            id,
            pid,
            pid_start,
            [RunStatus::Interrupted, RunStatus::Failed],
        )
    }

    /// Marks a finished (`ok`) run as running again under this process: a train run cut by
    /// `--max-steps` that goes on with a larger one (`train::session`, which checks that it
    /// was cut). Fails unless the run is finished, so two processes cannot extend one run.
    pub fn reopen_finished_run(&self, id: i64, pid: u32, pid_start: &str) -> Result<()> {
        self.reopen(id, pid, pid_start, [RunStatus::Ok, RunStatus::Ok])
    }

    /// Marks run `id` running under this process if its status is one of `from`.
    fn reopen(&self, id: i64, pid: u32, pid_start: &str, from: [RunStatus; 2]) -> Result<()> {
        let changed = self
            .conn
            .execute(
                "UPDATE stage_runs SET status = ?4, ended_at = NULL, error = NULL, \
                 pid = ?2, pid_start = ?3 WHERE id = ?1 AND status IN (?5, ?6)",
                params![id, pid, pid_start, RunStatus::Running, from[0], from[1]],
            )
            .map_err(|e| explain(&self.path, e))?;
        if changed == 0 {
            let status = self.run(id)?.map(|r| r.status);
            anyhow::bail!(
                "run {id} cannot be resumed: {}",
                match status {
                    None => "no such run".to_string(),
                    Some(s) =>
                        format!("its status is '{s}' (only interrupted or failed runs resume)"),
                }
            );
        }
        Ok(())
    }

    /// Records figures of a run in one transaction. A figure with the same run, name, step
    /// and split replaces the old one, so a resumed run that repeats a step does not
    /// duplicate it.
    pub fn record_metrics(&self, run_id: i64, metrics: &[MetricRow]) -> Result<()> {
        let tx = self.write_tx()?;
        let e = |e| explain(&self.path, e);
        for m in metrics {
            tx.execute(
                "DELETE FROM metrics WHERE stage_run_id = ?1 AND name = ?2 \
                 AND step IS ?3 AND split IS ?4",
                params![run_id, m.name, m.step, m.split],
            )
            .map_err(e)?;
            tx.execute(
                &format!(
                    "INSERT INTO metrics (stage_run_id, name, value, step, split, recorded_at) \
                     VALUES (?1, ?2, ?3, ?4, ?5, {NOW})"
                ),
                params![run_id, m.name, m.value, m.step, m.split],
            )
            .map_err(e)?;
        }
        tx.commit().map_err(e)
    }

    /// Figures of a run in the order recorded.
    pub fn metrics(&self, run_id: i64) -> Result<Vec<MetricRow>> {
        self.rows(
            "SELECT name, value, step, split FROM metrics WHERE stage_run_id = ?1 ORDER BY id",
            [run_id],
            |r| {
                Ok(MetricRow {
                    name: r.get(0)?,
                    value: r.get(1)?,
                    step: r.get(2)?,
                    split: r.get(3)?,
                })
            },
        )
    }

    /// Registers a checkpoint whose file is complete and in place. Re-registering a step
    /// (a resumed run writing it again) replaces the row. A checkpoint registered as the
    /// best takes the mark from the run's previous best in the same transaction, so the run
    /// has one best checkpoint at every moment.
    pub fn commit_checkpoint(&self, c: &CheckpointRow) -> Result<()> {
        let tx = self.write_tx()?;
        let e = |e| explain(&self.path, e);
        if c.best {
            tx.execute(
                "UPDATE checkpoints SET best = 0 WHERE stage_run_id = ?1 AND best = 1",
                [c.run_id],
            )
            .map_err(e)?;
        }
        tx.execute(
            &format!(
                "INSERT OR REPLACE INTO checkpoints (stage_run_id, step, epoch, path, bytes, \
                 checksum, best, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, {NOW})"
            ),
            params![
                c.run_id,
                c.step as i64,
                c.epoch as i64,
                c.path,
                c.bytes as i64,
                c.checksum,
                c.best
            ],
        )
        .map_err(e)?;
        tx.commit().map_err(e)
    }

    /// Checkpoints of a run, by step.
    pub fn checkpoints(&self, run_id: i64) -> Result<Vec<CheckpointRow>> {
        self.query_checkpoints("WHERE stage_run_id = ?1 ORDER BY step", [run_id])
    }

    fn query_checkpoints(
        &self,
        tail: &str,
        args: impl rusqlite::Params,
    ) -> Result<Vec<CheckpointRow>> {
        let sql = format!(
            "SELECT stage_run_id, step, epoch, path, bytes, checksum, best FROM checkpoints \
             {tail}"
        );
        self.rows(&sql, args, |r| {
            Ok(CheckpointRow {
                run_id: r.get(0)?,
                step: r.get::<_, i64>(1)? as u64,
                epoch: r.get::<_, i64>(2)? as u64,
                path: r.get(3)?,
                bytes: r.get::<_, i64>(4)? as u64,
                checksum: r.get(5)?,
                best: r.get(6)?,
            })
        })
    }

    /// Paths (relative to the workspace) that registered rows point to.
    pub fn referenced_paths(&self) -> Result<Vec<String>> {
        self.rows(
            "SELECT path FROM datasets UNION SELECT path FROM artifacts \
             UNION SELECT path FROM checkpoints",
            [],
            |r| r.get::<_, String>(0),
        )
    }

    /// Records (or replaces) how a run is steered.
    pub fn set_run_options(&self, o: &RunOptionsRow) -> Result<()> {
        let tx = self.write_tx()?;
        let e = |e| explain(&self.path, e);
        tx.execute(
            &format!(
                "INSERT OR REPLACE INTO run_options (stage_run_id, params, options, changes, \
                 reusable, stopped, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, {NOW})"
            ),
            params![
                o.run_id,
                o.params.to_string(),
                o.options.to_string(),
                o.changes.to_string(),
                o.reusable,
                o.stopped.as_ref().map(serde_json::Value::to_string)
            ],
        )
        .map_err(e)?;
        tx.commit().map_err(e)
    }

    /// How a run is steered, if it recorded it (runs from before schema 3 did not).
    pub fn run_options(&self, run_id: i64) -> Result<Option<RunOptionsRow>> {
        let json = |text: String| serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
        self.conn
            .query_row(
                "SELECT params, options, changes, reusable, stopped FROM run_options \
                 WHERE stage_run_id = ?1",
                [run_id],
                |r| {
                    Ok(RunOptionsRow {
                        run_id,
                        params: json(r.get(0)?),
                        options: json(r.get(1)?),
                        changes: json(r.get(2)?),
                        reusable: r.get(3)?,
                        stopped: r.get::<_, Option<String>>(4)?.map(json),
                    })
                },
            )
            .optional()
            .map_err(|e| explain(&self.path, e))
    }

    /// The newest reusable run of `stage` with `status` whose parameters in force (its
    /// `run_options.params`, else its `params`) are exactly `params`.
    pub fn find_run_in_force(
        &self,
        stage: StageKind,
        params: &serde_json::Value,
        status: RunStatus,
    ) -> Result<Option<RunRow>> {
        Ok(self
            .query_runs(
                "WHERE stage = ?1 AND status = ?3 \
                 AND coalesce((SELECT o.params FROM run_options o \
                               WHERE o.stage_run_id = stage_runs.id), params) = ?2 \
                 AND coalesce((SELECT o.reusable FROM run_options o \
                               WHERE o.stage_run_id = stage_runs.id), 1) = 1 \
                 ORDER BY id DESC LIMIT 1",
                params![stage, params.to_string(), status],
            )?
            .pop())
    }

    /// Runs of `stage` that started with exactly `params`, whatever their status, newest
    /// first.
    pub fn runs_started_with(
        &self,
        stage: StageKind,
        params: &serde_json::Value,
    ) -> Result<Vec<RunRow>> {
        self.query_runs(
            "WHERE stage = ?1 AND params = ?2 ORDER BY id DESC",
            params![stage, params.to_string()],
        )
    }

    /// Unregisters checkpoints of a run, in one transaction. The caller deletes the files
    /// afterwards: a file without a row is garbage, a row without a file would be damage.
    pub fn remove_checkpoint_rows(&self, run_id: i64, steps: &[u64]) -> Result<()> {
        let tx = self.write_tx()?;
        let e = |e| explain(&self.path, e);
        for &step in steps {
            tx.execute(
                "DELETE FROM checkpoints WHERE stage_run_id = ?1 AND step = ?2",
                params![run_id, step as i64],
            )
            .map_err(e)?;
        }
        tx.commit().map_err(e)
    }

    /// Artifacts with who registered them, in id order: all of them, or those of one run.
    pub fn stored_artifacts(&self, run_id: Option<i64>) -> Result<Vec<StoredArtifact>> {
        self.query_stored(
            "WHERE ?1 IS NULL OR a.stage_run_id = ?1 ORDER BY a.id",
            [run_id],
        )
    }

    /// The chunk artifacts of one split of a dataset, in id (chunk) order.
    pub fn stored_chunks(&self, dataset_id: i64, split: Split) -> Result<Vec<StoredArtifact>> {
        self.query_stored(
            "WHERE a.dataset_id = ?1 AND a.kind = ?2 AND a.split = ?3 ORDER BY a.id",
            params![dataset_id, ArtifactKind::Chunk, split],
        )
    }

    /// The artifact registered at a workspace-relative path, if any.
    pub fn stored_artifact_at(&self, rel: &str) -> Result<Option<StoredArtifact>> {
        Ok(self.query_stored("WHERE a.path = ?1", [rel])?.pop())
    }

    fn query_stored(&self, tail: &str, args: impl rusqlite::Params) -> Result<Vec<StoredArtifact>> {
        let sql = format!(
            "SELECT a.id, a.stage_run_id, r.stage, d.name, a.verified_at, a.kind, a.path, \
             a.bytes, a.rows, a.checksum, a.split FROM artifacts a \
             JOIN stage_runs r ON r.id = a.stage_run_id \
             LEFT JOIN datasets d ON d.id = a.dataset_id {tail}"
        );
        self.rows(&sql, args, |r| {
            Ok(StoredArtifact {
                id: r.get(0)?,
                run_id: r.get(1)?,
                stage: r.get(2)?,
                dataset: r.get(3)?,
                verified_at: r.get(4)?,
                artifact: ArtifactRow {
                    kind: r.get(5)?,
                    path: r.get(6)?,
                    bytes: r.get::<_, i64>(7)? as u64,
                    rows: r.get::<_, Option<i64>>(8)?.map(|v| v as u64),
                    checksum: r.get(9)?,
                    split: r.get(10)?,
                },
            })
        })
    }

    /// Records that artifact `id` was hashed in full and found as registered.
    pub fn mark_verified(&self, id: i64) -> Result<()> {
        self.conn
            .execute(
                &format!("UPDATE artifacts SET verified_at = {NOW} WHERE id = ?1"),
                [id],
            )
            .map_err(|e| explain(&self.path, e))?;
        Ok(())
    }

    /// Every registered checkpoint, by run and step.
    pub fn all_checkpoints(&self) -> Result<Vec<CheckpointRow>> {
        self.query_checkpoints("ORDER BY stage_run_id, step", [])
    }

    /// Every stage run, oldest first.
    pub fn all_runs(&self) -> Result<Vec<RunRow>> {
        self.query_runs("ORDER BY id", [])
    }

    /// When `pipeline verify --repair` marked run `id` damaged, if the run still awaits its
    /// recomputation (None: never damaged, recomputed since, or no such run).
    pub fn damaged_since(&self, id: i64) -> Result<Option<String>> {
        self.conn
            .query_row(
                "SELECT repaired_at FROM stage_runs WHERE id = ?1 AND status = ?2",
                params![id, RunStatus::Failed],
                |r| r.get::<_, Option<String>>(0),
            )
            .optional()
            .map(Option::flatten)
            .map_err(|e| explain(&self.path, e))
    }

    /// The newest run of `stage` with exactly these parameters that `pipeline verify
    /// --repair` marked failed because its outputs were damaged: it is recomputed under
    /// its own id, so every later run naming it stays valid.
    pub fn find_repaired_run(
        &self,
        stage: StageKind,
        params: &serde_json::Value,
    ) -> Result<Option<RunRow>> {
        Ok(self
            .query_runs(
                "WHERE stage = ?1 AND params = ?2 AND status = ?3 AND repaired_at IS NOT NULL \
                 ORDER BY id DESC LIMIT 1",
                params![stage, params.to_string(), RunStatus::Failed],
            )?
            .pop())
    }

    /// `pipeline verify --repair` on a run whose outputs are damaged, in one transaction:
    /// the run is marked failed (and repaired), and the rows that vouch for its damaged
    /// files are removed so nothing trusts them: its checkpoints from step `from_step` on
    /// (a training run, resumed from the one before), else all its artifacts.
    pub fn mark_damaged(&self, run_id: i64, reason: &str, from_step: Option<u64>) -> Result<()> {
        let tx = self.write_tx()?;
        let e = |e| explain(&self.path, e);
        tx.execute(
            &format!(
                "UPDATE stage_runs SET status = ?2, error = ?3, ended_at = {NOW}, \
                 repaired_at = {NOW} WHERE id = ?1"
            ),
            params![run_id, RunStatus::Failed, reason],
        )
        .map_err(e)?;
        match from_step {
            Some(step) => tx.execute(
                "DELETE FROM checkpoints WHERE stage_run_id = ?1 AND step >= ?2",
                params![run_id, step as i64],
            ),
            None => tx.execute("DELETE FROM artifacts WHERE stage_run_id = ?1", [run_id]),
        }
        .map_err(e)?;
        tx.commit().map_err(e)
    }

    /// SQLite's `PRAGMA integrity_check` of the catalog file at `path`, without migrating
    /// or otherwise writing it: an empty list when the database is sound, else SQLite's
    /// findings (an unreadable file is one finding).
    pub fn integrity_check(path: &Path, writable_dir: bool) -> Vec<String> {
        let check = || -> rusqlite::Result<Vec<String>> {
            let conn = read_only_connection(path, writable_dir)?;
            let mut stmt = conn.prepare("PRAGMA integrity_check")?;
            let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
            rows.collect()
        };
        match check() {
            Ok(lines) if lines == ["ok"] => Vec::new(),
            Ok(lines) => lines,
            Err(e) => vec![e.to_string()],
        }
    }

    /// Runs of `stage` in any status, newest first, at most `limit` of them.
    pub fn runs_of_stage(&self, stage: StageKind, limit: usize) -> Result<Vec<RunRow>> {
        self.query_runs(
            "WHERE stage = ?1 ORDER BY id DESC LIMIT ?2",
            params![stage, limit as i64],
        )
    }

    /// Completed evaluate runs of the predictions of training run `train_run`, oldest first:
    /// an evaluate run names its predictions by checksum, the predictions artifact names
    /// the predict run that wrote it, and that run's parameters name the training run.
    pub fn evaluations_of_train_run(&self, train_run: i64) -> Result<Vec<EvaluationLink>> {
        self.rows(
            "SELECT ev.id, min(pr.id), json_extract(ev.params, '$.split'), \
             json_extract(pr.params, '$.checkpoint_step') \
             FROM stage_runs ev \
             JOIN artifacts a ON a.kind = ?2 \
                      AND a.checksum = json_extract(ev.params, '$.predictions_checksum') \
             JOIN stage_runs pr ON pr.id = a.stage_run_id \
             WHERE ev.stage = ?3 AND ev.status = ?5 AND pr.stage = ?4 AND pr.status = ?5 \
             AND json_extract(pr.params, '$.train_run') = ?1 \
             GROUP BY ev.id ORDER BY ev.id",
            params![
                train_run,
                ArtifactKind::Predictions,
                StageKind::Evaluate,
                StageKind::Predict,
                RunStatus::Ok
            ],
            |r| {
                Ok(EvaluationLink {
                    evaluate_run: r.get(0)?,
                    predict_run: r.get(1)?,
                    split: r.get(2)?,
                    checkpoint_step: r.get::<_, Option<i64>>(3)?.map(|v| v as u64),
                })
            },
        )
    }
}

/// A completed evaluation of a training run's predictions
/// ([`Catalog::evaluations_of_train_run`]).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct EvaluationLink {
    pub evaluate_run: i64,
    /// The predict run whose file was evaluated.
    pub predict_run: i64,
    /// The evaluated split (None: its parameters name none).
    pub split: Option<Split>,
    /// The training checkpoint the predictions were made with.
    pub checkpoint_step: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run's seconds are its end less its start as recorded: a run that slept 150 ms
    /// between them took that long (to the millisecond the timestamps keep), a running one
    /// and an unknown id have none.
    #[test]
    fn a_runs_seconds_are_its_recorded_end_less_its_start() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::open(&dir.path().join("catalog.sqlite")).unwrap();
        let id = catalog
            .begin_run(StageKind::Svd, &serde_json::json!({}), 1, "0")
            .unwrap();
        assert_eq!(catalog.run_seconds(id).unwrap(), None, "still running");
        std::thread::sleep(std::time::Duration::from_millis(150));
        catalog.end_run(id, RunStatus::Ok, None).unwrap();
        let seconds = catalog.run_seconds(id).unwrap().unwrap();
        assert!((0.14..5.0).contains(&seconds), "{seconds}");
        assert_eq!(catalog.run_seconds(id + 1).unwrap(), None);
    }
}
