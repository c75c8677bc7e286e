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
mod header;
pub mod input;
pub mod layouts;
pub mod parse;
pub mod pipeline;
pub mod sink;
pub mod source;
pub mod stream;

use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Result};

use crate::stage::{self, Staged};
use crate::store::catalog::{SourceRow, StageKind};
use crate::store::workspace::Workspace;
use built::{print_summary, Built};
use config::IngestConfig;
use source::checksum_source;

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
    let params = config.params_json()?;
    if let Some(existing) = ws.catalog.dataset(&config.name)? {
        let same = existing.params == params && sources_unchanged(&existing.sources)?;
        // Chunks found damaged by `pipeline verify --repair`: the same ingest is run again
        // under its own id (`stage::execute`) and the dataset's row refreshed in place.
        let damaged = ws.catalog.damaged_since(existing.stage_run_id)?.is_some();
        if same && !damaged {
            eprintln!(
                "dataset '{}' is already ingested from the same files with the same options \
                 (run {}); nothing to do",
                config.name, existing.stage_run_id
            );
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
                "dataset '{}' already exists with other inputs or options; pass --replace to \
                 re-ingest it, or choose another --name",
                config.name
            );
        }
    }
    let started = Instant::now();
    let done = stage::execute(
        ws,
        StageKind::Ingest,
        &params,
        None,
        |scratch| {
            Ok(Staged {
                dir: "dataset",
                name: config.name.clone(),
                value: pipeline::build(config, scratch)?,
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
        if let Err(e) = std::fs::remove_dir_all(ws.resolve(&old)) {
            eprintln!("warning: could not remove replaced dataset files {old}: {e}");
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

fn sources_unchanged(sources: &[SourceRow]) -> Result<bool> {
    for s in sources {
        match checksum_source(Path::new(&s.path)) {
            Ok(now) if now.checksum == s.checksum && now.bytes == s.bytes => {}
            _ => return Ok(false),
        }
    }
    Ok(true)
}
