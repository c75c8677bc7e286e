//! Checkpoints of a running training: written to the run's scratch space, renamed into
//! the run's published directory and registered one by one, so a killed run resumes from
//! the last one registered; the oldest are deleted as `--keep-checkpoints` says, except the
//! one an early-stopping run marks best, which stays whatever the retention.

use std::collections::BTreeSet;
use std::fs;

use anyhow::{Context, Result};

use crate::failpoint::{enospc_at, kill_at};
use crate::stage::StageRun;
use crate::store::catalog::{CheckpointRow, StageKind, WAL_BOUND_BYTES};
use crate::store::checkpoint::{write_checkpoint, CheckpointRef};
use crate::store::owned::LostFound;
use crate::store::space::ensure_free;
use crate::store::workspace::Workspace;
use crate::trained::{EarlyStopping, Retention};

/// Writes a checkpoint into the run's directory `out_rel` (temp file, fsync, rename) and
/// registers it; `best` registers it as the run's best (taking the mark from the previous
/// best in the same transaction).
pub fn save_checkpoint(
    ws: &Workspace,
    run: &StageRun<'_>,
    out_rel: &str,
    ckpt: CheckpointRef<'_>,
    best: bool,
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
        best,
    })?;
    ws.record_rows(&dir, run.id);
    Ok(())
}

/// Refuses, with the figures, when the run's file system has no room for the checkpoints
/// the run still writes: from its step `from` to `total`, one every `every` steps and one
/// at the end, each the size of `ckpt`, of which the directory holds at once as many more
/// than the `held` registered now as `keep` lets it (one more than it keeps, while the
/// newest is written and the oldest not yet pruned). With early stopping (`early`) each
/// evaluation may write one more (a new best), and the best is kept beside the others. So
/// a run on a disk too small fails before its first step, with both figures, not after the
/// steps to a checkpoint.
pub fn ensure_room_for_checkpoints(
    run: &StageRun<'_>,
    ckpt: CheckpointRef<'_>,
    (from, total, every): (u64, u64, u64),
    (keep, early): (Retention, Option<EarlyStopping>),
    held: usize,
) -> Result<()> {
    let bests = early.map_or(0, |es| total / es.every - from.min(total) / es.every);
    let left = saves_left(from, total, every).saturating_add(bests);
    let best_kept = u64::from(early.is_some());
    let at_once = match keep {
        Retention::All => left,
        Retention::Last(n) => left.min(
            n.saturating_add(2)
                .saturating_add(best_kept)
                .saturating_sub(held as u64),
        ),
    };
    if at_once == 0 {
        return Ok(());
    }
    let what = match keep {
        Retention::All => format!(
            "writing the {left} checkpoints this run has left (all kept) and the catalog's \
             journal"
        ),
        Retention::Last(_) => format!(
            "writing the checkpoints this run has left ({left}, of which {at_once} more than \
             now on disk at once) and the catalog's journal"
        ),
    };
    let bytes = uncompressed_bytes(ckpt)
        .saturating_mul(at_once)
        // The catalog's log grows with every registration until it is checkpointed: a
        // run whose checkpoints fit exactly would fail on its catalog's next commit.
        .saturating_add(WAL_BOUND_BYTES);
    ensure_free(run.tmp_dir(), bytes, &what)
}

/// How many checkpoints a run at step `from` writes until step `total`: at every multiple
/// of `every` after `from`, and at `total` if that is not one.
fn saves_left(from: u64, total: u64, every: u64) -> u64 {
    if total <= from {
        return 0;
    }
    let every = every.max(1);
    total / every - from / every + u64::from(total % every != 0)
}

/// The checkpoint's tensors as raw f64 (the parameters and Adam's two moments, each as
/// long as the flat parameter vector): its file, zstd-compressed, is no larger.
fn uncompressed_bytes(ckpt: CheckpointRef<'_>) -> u64 {
    let floats = 2 * ckpt.adam.m.len() + ckpt.adam.v.len();
    (floats * std::mem::size_of::<f64>()) as u64
}

/// Deletes the checkpoints of `run` that `keep` lets go (the oldest, never the one marked
/// best: the retention counts the others), then every checkpoint file in the run's
/// directory `out_rel` that no catalog row names.
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
    let (best, rows): (Vec<CheckpointRow>, Vec<CheckpointRow>) = ws
        .catalog
        .checkpoints(run.id)?
        .into_iter()
        .partition(|c| c.best);
    let (old, kept) = rows.split_at(keep.excess(rows.len()));
    if !old.is_empty() {
        let steps: Vec<u64> = old.iter().map(|c| c.step).collect();
        ws.catalog.remove_checkpoint_rows(run.id, &steps)?;
        kill_at("checkpoints-unregistered", steps[steps.len() - 1]);
    }
    let registered: BTreeSet<&str> = kept.iter().chain(&best).map(|c| c.path.as_str()).collect();
    let just_dropped: BTreeSet<&str> = old.iter().map(|c| c.path.as_str()).collect();
    let dir = ws.resolve(out_rel);
    let mut aside = LostFound::new();
    for entry in fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        let rel = format!("{out_rel}/{name}");
        let is_checkpoint = name.starts_with("ckpt-") && name.ends_with(".parquet");
        if is_checkpoint && !registered.contains(rel.as_str()) {
            let note = ws.dispose(&rel, &mut aside)?.note(&rel);
            // A run directory linked from elsewhere keeps its old checkpoints: said once,
            // when each leaves the catalog.
            if let Some(note) = note.filter(|_| just_dropped.contains(rel.as_str())) {
                crate::progress::warning(note.to_string());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::saves_left;

    #[test]
    fn the_checkpoints_left_are_counted_as_the_loop_writes_them() {
        for every in 1..9 {
            for total in 0..40 {
                for from in 0..=total {
                    let looped = (from + 1..=total)
                        .filter(|s| s % every == 0 || *s == total)
                        .count() as u64;
                    assert_eq!(
                        saves_left(from, total, every),
                        looped,
                        "{from} {total} {every}"
                    );
                }
            }
        }
    }
}
