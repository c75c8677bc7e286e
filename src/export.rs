//! `pipeline export`: one training checkpoint written as a self-contained model file
//! (`store::model_file`, `docs/formats.md`, "Model files"): the run's configuration, the
//! dataset's facts and transform statistics, X̃ when the model reads it, the parameters
//! without Adam's state, checksums and provenance. A model file is scored without the
//! workspace (`portable::PortableModel`).
//!
//! The command only reads the workspace (opened read-only, like `status` and `report`):
//! every file it copies is read through its catalog checksum, and nothing is recorded.
//! The output is a file the user named, outside the workspace, which the workspace can
//! neither vouch for nor collect; it carries its own checksums and provenance instead.

use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::store::chunks::WrittenFile;
use crate::store::model_file::{reads_basis, DatasetFacts, ModelFile, Provenance};
use crate::store::npy::NpyMap;
use crate::store::scaling::read_dataset_scaling;
use crate::store::user_file::check_file_output;
use crate::store::workspace::Workspace;
use crate::trained::{load_run_checkpoint, SvdFiles, TrainConfig};

/// What `pipeline export` writes.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportOptions {
    /// Training run.
    pub run: i64,
    /// Checkpoint step (None: the run's model, as predict takes it: the checkpoint early
    /// stopping marked best, else the last).
    pub checkpoint: Option<u64>,
    /// The model file to write.
    pub out: PathBuf,
    /// Replace an existing file at `out`.
    pub force: bool,
}

/// The written model file.
#[derive(Debug, Clone, PartialEq)]
pub struct Exported {
    pub path: PathBuf,
    pub checkpoint_step: u64,
    pub file: WrittenFile,
}

/// Runs `pipeline export`: reads the run's checkpoint, dataset and svd files through their
/// checksums, then writes the model file whole (or nothing).
pub fn run(ws: &Workspace, opts: &ExportOptions) -> Result<Exported> {
    // Refused before anything is read; the write refuses again if the file appears since.
    check_file_output(&opts.out, opts.force)?;
    ws.refuse_output_inside("--out", &opts.out)?;
    let model = collect(ws, opts)?;
    let file = model.write(&opts.out, opts.force)?;
    let step = model.provenance.checkpoint_step;
    crate::progress::note(format!(
        "exported train run {} (checkpoint step {step}) to {} ({} bytes, checksum {})",
        opts.run,
        opts.out.display(),
        file.bytes,
        file.checksum
    ));
    Ok(Exported {
        path: opts.out.clone(),
        checkpoint_step: step,
        file,
    })
}

/// Everything the model file holds, read from the workspace.
fn collect(ws: &Workspace, opts: &ExportOptions) -> Result<ModelFile> {
    let (started, ckpt_row, ckpt) = load_run_checkpoint(ws, opts.run, opts.checkpoint)?;
    // The configuration the checkpoint embeds: the one in force when it was written.
    let config: TrainConfig = serde_json::from_value(ckpt.config.clone())
        .with_context(|| format!("run {}: unreadable checkpoint configuration", opts.run))?;
    let dataset = started.dataset_row(ws)?;
    let facts = DatasetFacts::of(&dataset);
    let scaling = match facts.has_statistics() {
        true => Some(read_dataset_scaling(ws, &dataset)?),
        false => None,
    };
    let basis = match reads_basis(&ckpt.config, &ckpt.params) {
        true => {
            let file = SvdFiles::of_run(ws, config.svd_run)?.basis;
            Some(NpyMap::open_registered(&file)?.view2::<f32>()?.to_owned())
        }
        false => None,
    };
    Ok(ModelFile {
        provenance: Provenance {
            dataset_checksum: dataset.checksum.clone(),
            train_run: opts.run,
            checkpoint_step: ckpt_row.step,
            checkpoint_checksum: ckpt_row.checksum.clone(),
            svd_run: config.svd_run,
            fsgp_version: env!("CARGO_PKG_VERSION").to_string(),
        },
        config: ckpt.config,
        dataset: facts,
        params: ckpt.params,
        basis,
        scaling,
    })
}
