//! `pipeline ingest`: Extreme Classification Repository text files → zstd Parquet CSR chunks,
//! registered in the catalog.
//!
//! The input layouts (single files, a data file with split index files, BoW feature/label
//! pairs) are in [`layouts`], each an [`input::InputLayout`]; one [`pipeline`] reads them
//! all. [`config::IngestConfig`] is what the ingest needs (the command line's flags become
//! one in `cli::args`).
//!
//! Nothing is visible until the whole dataset is written: chunks go to the run's scratch
//! directory, which is renamed into `datasets/` only after every file is complete, and the
//! catalog rows are committed last.

pub mod built;
pub mod config;
pub mod input;
pub mod labels;
pub mod layouts;
pub mod measure;
pub mod pipeline;
pub mod rows;
pub mod sink;
pub mod stream;
pub mod validation;

use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Result};

use crate::stage::{self, Staged};
use crate::store::catalog::{DatasetRow, SourceRow, StageKind};
use crate::store::owned::LostFound;
use crate::store::workspace::Workspace;
use crate::text::source::checksum_source;
use built::{print_summary, Built};
use config::IngestConfig;

/// What an ingest did, for the report and the tests.
#[derive(Debug, Clone)]
pub struct IngestOutcome {
    pub dataset: String,
    /// False when an identical dataset was already registered and nothing was done.
    pub ingested: bool,
    pub run_id: Option<i64>,
    pub seconds: f64,
    pub input_bytes: u64,
}

/// Runs `pipeline ingest`: nothing when the same files were already ingested with the same
/// options, an error when the name is taken by other inputs (unless `replace`), else the
/// pipeline into the run's scratch directory, published under `datasets/` and registered.
pub fn run(ws: &Workspace, config: &IngestConfig) -> Result<IngestOutcome> {
    // A process that trained before (`fit`'s whole-file ingest, a spec's later datasets)
    // streams again.
    crate::alloc::for_streaming();
    config.validate()?;
    config.check_input_files()?;
    let params = config.params_json()?;
    if let Some(existing) = ws.catalog.dataset(&config.name)? {
        let same = same_inputs(&existing, &params)?;
        // Chunks found damaged by `pipeline verify --repair`: the same ingest is run again
        // under its own id (`stage::execute`) and the dataset's row refreshed in place.
        let damaged = ws.catalog.damaged_since(existing.stage_run_id)?.is_some();
        if same && !damaged {
            crate::progress::note(format!(
                "dataset '{}' is already ingested from the same files with the same options \
                 (run {}); nothing to do",
                config.name, existing.stage_run_id
            ));
            return Ok(IngestOutcome {
                dataset: config.name.clone(),
                ingested: false,
                run_id: None,
                seconds: 0.0,
                input_bytes: 0,
            });
        }
        let recompute_damaged = same && damaged;
        if !config.replace && !recompute_damaged {
            bail!(
                "dataset '{}' already exists with other inputs or options:\n  {}\npass \
                 --replace to re-ingest it, or choose another --name",
                config.name,
                differences(&existing, &params).join("\n  ")
            );
        }
    }
    let started = Instant::now();
    let stop = ws.stop().clone();
    let done = stage::execute(
        ws,
        StageKind::Ingest,
        &config.name,
        &params,
        None,
        |scratch| {
            Ok(Staged {
                dir: "dataset",
                name: config.name.clone(),
                value: pipeline::build(config, scratch, &stop)?,
            })
        },
        |published, built: Built| {
            let new = built.to_new_dataset(config, &published.rel, params.clone());
            let replaced = ws
                .catalog
                .commit_dataset(published.run_id, &new, config.replace)?;
            Ok((built, replaced))
        },
    )?;
    let (built, replaced) = done.value;
    if let Some(old) = replaced {
        // The old files are unreferenced now; failing to delete them only wastes space.
        match ws.dispose(&old, &mut LostFound::new()) {
            Ok(done) => {
                if let Some(note) = done.note(&old) {
                    crate::progress::warning(note.to_string());
                }
            }
            Err(e) => crate::progress::warning(format!(
                "could not remove replaced dataset files {old}: {e:#}"
            )),
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    print_summary(&config.name, &built, seconds);
    Ok(IngestOutcome {
        dataset: config.name.clone(),
        ingested: true,
        run_id: Some(done.run_id),
        seconds,
        input_bytes: built.input_bytes(),
    })
}

/// Whether `existing` was ingested with the options `params` (JSON, as
/// [`IngestConfig::params_json`] gives them) from files that have not changed since:
/// ingesting it again would do nothing.
fn same_inputs(existing: &DatasetRow, params: &serde_json::Value) -> Result<bool> {
    Ok(&existing.params == params && sources_unchanged(&existing.sources)?)
}

/// Whether `config` can be ingested under its name without `--replace`: no dataset has the
/// name, or the one that has it came from the same unchanged files with the same options
/// (ingest then reuses it).
pub fn name_is_free_or_same(ws: &Workspace, config: &IngestConfig) -> Result<bool> {
    match ws.catalog.dataset(&config.name)? {
        None => Ok(true),
        Some(existing) => same_inputs(&existing, &config.params_json()?),
    }
}

fn sources_unchanged(sources: &[SourceRow]) -> Result<bool> {
    for s in sources {
        match checksum_source(Path::new(&s.path)) {
            Ok(now) if now.checksum == s.checksum && now.bytes == s.bytes => {}
            _ => return Ok(false),
        }
    }
    Ok(true)
}

/// What differs between a dataset's recorded ingest and the one asked for now, one line
/// per option (`chunk_rows: 1000 → 2000`) or input file (a new path, or the same path whose
/// bytes changed since the ingest).
fn differences(existing: &DatasetRow, params: &serde_json::Value) -> Vec<String> {
    let empty = serde_json::Map::new();
    let old = existing.params.as_object().unwrap_or(&empty);
    let new = params.as_object().unwrap_or(&empty);
    let mut keys: Vec<&String> = old.keys().chain(new.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut lines = Vec::new();
    for key in keys {
        let (was, now) = (old.get(key), new.get(key));
        if key == "sources" {
            lines.extend(source_differences(was, now, &existing.sources));
        } else if was != now {
            lines.push(format!("{key}: {} → {}", shown(was), shown(now)));
        }
    }
    if lines.is_empty() {
        lines.push("the stored parameters could not be compared".into());
    }
    lines
}

/// The input files by role: renamed, added or removed roles, and files whose bytes changed.
fn source_differences(
    was: Option<&serde_json::Value>,
    now: Option<&serde_json::Value>,
    recorded: &[SourceRow],
) -> Vec<String> {
    let empty = serde_json::Map::new();
    let was = was.and_then(|v| v.as_object()).unwrap_or(&empty);
    let now = now.and_then(|v| v.as_object()).unwrap_or(&empty);
    let mut roles: Vec<&String> = was.keys().chain(now.keys()).collect();
    roles.sort();
    roles.dedup();
    let mut lines = Vec::new();
    for role in roles {
        let (a, b) = (was.get(role), now.get(role));
        if a != b {
            lines.push(format!("sources.{role}: {} → {}", shown(a), shown(b)));
            continue;
        }
        let changed = recorded
            .iter()
            .find(|s| &s.role == role)
            .and_then(source_change);
        if let Some(change) = changed {
            lines.push(format!(
                "sources.{role}: {} (changed since ingest: {change})",
                shown(b)
            ));
        }
    }
    lines
}

/// How a recorded input file differs from what is on disk now, if it does.
fn source_change(recorded: &SourceRow) -> Option<String> {
    match checksum_source(Path::new(&recorded.path)) {
        Err(e) => Some(format!("{e:#}")),
        Ok(now) if now.checksum != recorded.checksum || now.bytes != recorded.bytes => {
            Some(format!(
                "checksum {} → {}, {} → {} bytes",
                recorded.checksum, now.checksum, recorded.bytes, now.bytes
            ))
        }
        Ok(_) => None,
    }
}

/// A parameter's value as a person reads it: strings bare, absent or null as `none`.
fn shown(value: Option<&serde_json::Value>) -> String {
    match value {
        None | Some(serde_json::Value::Null) => "none".into(),
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
    }
}
