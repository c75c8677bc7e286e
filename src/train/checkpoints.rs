//! Checkpoints of a running training: written to the run's scratch space, renamed into
//! the run's published directory and registered one by one, so a killed run resumes from
//! the last one registered; the oldest are deleted as `--keep-checkpoints` says.

use std::collections::BTreeSet;
use std::fs;

use anyhow::{Context, Result};

use crate::failpoint::{enospc_at, kill_at};
use crate::stage::StageRun;
use crate::store::catalog::{CheckpointRow, StageKind};
use crate::store::checkpoint::{write_checkpoint, Checkpoint};
use crate::store::space::ensure_free;
use crate::store::workspace::{remove_path, Workspace};
use crate::trained::Retention;

/// Writes a checkpoint into the run's directory `out_rel` (temp file, fsync, rename) and
/// registers it.
pub fn save_checkpoint(
    ws: &Workspace,
    run: &StageRun<'_>,
    out_rel: &str,
    ckpt: &Checkpoint,
) -> Result<()> {
    let step = ckpt.state.step;
    let name = format!("ckpt-{step:09}.parquet");
    let tmp = run.tmp_dir().join(&name);
    ensure_free(
        run.tmp_dir(),
        uncompressed_bytes(ckpt),
        &format!("the checkpoint at step {step}"),
    )?;
    let written = enospc_at("checkpoint-write-enospc", step)
        .map_err(anyhow::Error::from)
        .and_then(|()| write_checkpoint(&tmp, ckpt))
        .with_context(|| format!("writing checkpoint at step {step} to {}", tmp.display()))?;
    kill_at("checkpoint-written", ckpt.state.step);
    let dir = ws.resolve(out_rel);
    fs::rename(&tmp, dir.join(&name))
        .with_context(|| format!("moving checkpoint into {}", dir.display()))?;
    fs::File::open(&dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing {}", dir.display()))?;
    kill_at("checkpoint-renamed", ckpt.state.step);
    // The directory records the generation at which the catalog registers this checkpoint,
    // so a catalog restored from before it is recognised as older (`store::identity`).
    ws.stamp_run_dir(&dir, run.id, StageKind::Train)?;
    ws.catalog.commit_checkpoint(&CheckpointRow {
        run_id: run.id,
        step: ckpt.state.step,
        epoch: ckpt.state.epoch,
        path: format!("{out_rel}/{name}"),
        bytes: written.bytes,
        checksum: written.checksum,
    })
}

/// Refuses, with the figures, when the run's file system has no room for a checkpoint like
/// `ckpt` (every checkpoint of a run has the same tensors).
pub fn ensure_room_for_checkpoint(run: &StageRun<'_>, ckpt: &Checkpoint) -> Result<()> {
    ensure_free(
        run.tmp_dir(),
        uncompressed_bytes(ckpt),
        "a checkpoint of this run",
    )
}

/// The checkpoint's tensors as raw f64 (the parameters and Adam's two moments, each as
/// long as the flat parameter vector): its file, zstd-compressed, is no larger.
fn uncompressed_bytes(ckpt: &Checkpoint) -> u64 {
    let floats = 2 * ckpt.adam.m.len() + ckpt.adam.v.len();
    (floats * std::mem::size_of::<f64>()) as u64
}

/// Deletes the checkpoints of `run` that `keep` lets go (the oldest), then every checkpoint
/// file in the run's directory `out_rel` that no catalog row names.
///
/// The rows go first, in one transaction, and the files after: a crash in between leaves
/// files without rows, never rows without files. Such a file is garbage; the next prune of
/// this run (each resume prunes before its first step) removes it. Only the process that
/// holds the run calls this, so no file in the directory is a checkpoint being registered.
pub fn prune_checkpoints(
    ws: &Workspace,
    run: &StageRun<'_>,
    out_rel: &str,
    keep: Retention,
) -> Result<()> {
    let rows = ws.catalog.checkpoints(run.id)?;
    let (old, kept) = rows.split_at(keep.excess(rows.len()));
    if !old.is_empty() {
        let steps: Vec<u64> = old.iter().map(|c| c.step).collect();
        ws.catalog.remove_checkpoint_rows(run.id, &steps)?;
        kill_at("checkpoints-unregistered", steps[steps.len() - 1]);
    }
    let registered: BTreeSet<&str> = kept.iter().map(|c| c.path.as_str()).collect();
    let dir = ws.resolve(out_rel);
    for entry in fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        let is_checkpoint = name.starts_with("ckpt-") && name.ends_with(".parquet");
        if is_checkpoint && !registered.contains(format!("{out_rel}/{name}").as_str()) {
            remove_path(&dir.join(&name))?;
        }
    }
    Ok(())
}
