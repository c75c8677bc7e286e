//! `pipeline ingest`: Extreme Classification Repository text files → zstd Parquet CSR chunks,
//! registered in the catalog.
//!
//! The input layouts (single files, a data file with split index files, BoW feature/label
//! pairs) are in [`layouts`], each an [`input::InputLayout`]; one [`pipeline`] reads them
//! all. [`config::IngestConfig`] is what the ingest needs, [`IngestArgs`] the flags it is
//! made from.
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

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Result};

use crate::store::catalog::SourceRow;
use crate::workspace::Workspace;
use built::print_summary;
use config::IngestConfig;
use input::InputLayout;
use layouts::{Bow, XcSingle, XcSplit};
use source::checksum_source;

/// Arguments of `pipeline ingest`.
#[derive(clap::Args, Debug, Clone)]
pub struct IngestArgs {
    /// Name of the dataset in the workspace.
    #[arg(long)]
    pub name: String,
    /// Single-file layout: training file (`N D L` header, rows `l1,l2 f:v ...`).
    #[arg(long, conflicts_with_all = ["data", "train_features"])]
    pub train: Option<PathBuf>,
    /// Single-file layout: test file with the same D and L.
    #[arg(long, requires = "train")]
    pub test: Option<PathBuf>,
    /// Split layout: the `*_data.txt` file holding all rows.
    #[arg(long, requires = "train_split", conflicts_with = "train_features")]
    pub data: Option<PathBuf>,
    /// Split layout: file of 1-based row numbers of the training rows, one column per split.
    #[arg(long, requires = "data")]
    pub train_split: Option<PathBuf>,
    /// Split layout: file of 1-based row numbers of the test rows.
    #[arg(long, requires = "data")]
    pub test_split: Option<PathBuf>,
    /// Split layout: which column of the split files to use (0 = the first).
    #[arg(long, default_value_t = 0)]
    pub split_column: usize,
    /// BoW layout: training feature file (`N D` header, rows `f:v ...`).
    #[arg(long, requires = "train_labels")]
    pub train_features: Option<PathBuf>,
    /// BoW layout: training label file (`N L` header, rows `l:v ...`).
    #[arg(long, requires = "train_features")]
    pub train_labels: Option<PathBuf>,
    /// BoW layout: test feature file.
    #[arg(long, requires_all = ["test_labels", "train_features"])]
    pub test_features: Option<PathBuf>,
    /// BoW layout: test label file.
    #[arg(long, requires = "test_features")]
    pub test_labels: Option<PathBuf>,
    /// Keep feature values as given instead of scaling each row to unit L2 norm.
    #[arg(long)]
    pub no_normalize: bool,
    /// Smallest feature and label id used in the files (0 or 1).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1))]
    pub index_base: u32,
    /// Drop rows without labels (they are always counted).
    #[arg(long)]
    pub drop_unlabeled: bool,
    /// Skip malformed rows (counting them) and accept CRLF line ends and a missing final
    /// newline; file-level problems (headers, row counts, split files) stay errors.
    #[arg(long)]
    pub lenient: bool,
    /// Rows per chunk file (default: sized so a chunk holds about --chunk-mb of data).
    #[arg(long)]
    pub chunk_rows: Option<usize>,
    /// Target uncompressed size of a chunk in MiB when --chunk-rows is not given.
    #[arg(long, default_value_t = 32)]
    pub chunk_mb: usize,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Replace an existing dataset of this name whose inputs or options differ.
    #[arg(long)]
    pub replace: bool,
}

impl IngestArgs {
    /// The configuration these flags ask for, checked.
    pub fn config(&self) -> Result<IngestConfig> {
        let config = IngestConfig {
            name: self.name.clone(),
            layout: self.layout()?,
            normalize: !self.no_normalize,
            index_base: self.index_base,
            drop_unlabeled: self.drop_unlabeled,
            lenient: self.lenient,
            chunk_rows: self.chunk_rows,
            chunk_mb: self.chunk_mb,
            threads: self.threads,
            replace: self.replace,
        };
        config.validate()?;
        Ok(config)
    }

    /// The input layout the given file flags select (clap rules out mixing layouts).
    fn layout(&self) -> Result<Box<dyn InputLayout>> {
        if let Some(train) = &self.train {
            return Ok(Box::new(XcSingle {
                train: train.clone(),
                test: self.test.clone(),
            }));
        }
        if let (Some(data), Some(train_split)) = (&self.data, &self.train_split) {
            return Ok(Box::new(XcSplit {
                data: data.clone(),
                train_split: train_split.clone(),
                test_split: self.test_split.clone(),
                column: self.split_column,
            }));
        }
        if let (Some(f), Some(l)) = (&self.train_features, &self.train_labels) {
            return Ok(Box::new(Bow {
                train: (f.clone(), l.clone()),
                test: self.test_features.clone().zip(self.test_labels.clone()),
            }));
        }
        bail!(
            "no input given: pass --train FILE [--test FILE], or --data FILE --train-split FILE \
             [--test-split FILE], or --train-features FILE --train-labels FILE \
             [--test-features FILE --test-labels FILE]"
        )
    }
}

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

/// Runs `pipeline ingest`.
pub fn run(workspace: &Path, args: &IngestArgs) -> Result<IngestOutcome> {
    run_config(workspace, &args.config()?)
}

/// Ingests `config.name` into the workspace at `workspace` unless the same files were
/// already ingested with the same options.
pub fn run_config(workspace: &Path, config: &IngestConfig) -> Result<IngestOutcome> {
    let params = config.params_json()?;
    let ws = Workspace::open(workspace)?;
    if let Some(existing) = ws.catalog.dataset(&config.name)? {
        if existing.params == params && sources_unchanged(&existing.sources)? {
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
        if !config.replace {
            bail!(
                "dataset '{}' already exists with other inputs or options; pass --replace to \
                 re-ingest it, or choose another --name",
                config.name
            );
        }
    }

    let started = Instant::now();
    let run = ws.start_run("ingest", &params)?;
    let built = match pipeline::build(config, run.tmp_dir()) {
        Ok(built) => built,
        Err(e) => {
            run.failed(&e);
            return Err(e);
        }
    };
    let final_rel = run.output_rel("datasets", &config.name);
    let run_id = run.id;
    let new = built.to_new_dataset(config, &final_rel, params.clone());
    let replaced = run.publish_and_commit("dataset", &final_rel, || {
        ws.catalog.commit_dataset(run_id, &new, config.replace)
    })?;
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
        run_id: Some(run_id),
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
