//! Checkpoints of a running training: written to the run's scratch space, renamed into
//! the run's published directory and registered one by one, so a killed run resumes from
//! the last one registered.

use std::fs;

use anyhow::{Context, Result};

use crate::stage::StageRun;
use crate::store::catalog::CheckpointRow;
use crate::store::checkpoint::{write_checkpoint, Checkpoint};
use crate::store::workspace::Workspace;

/// Writes a checkpoint into the run's directory `out_rel` (temp file, fsync, rename) and
/// registers it.
pub fn save_checkpoint(
    ws: &Workspace,
    run: &StageRun<'_>,
    out_rel: &str,
    ckpt: &Checkpoint,
) -> Result<()> {
    let name = format!("ckpt-{:09}.parquet", ckpt.state.step);
    let tmp = run.tmp_dir().join(&name);
    let written = write_checkpoint(&tmp, ckpt)?;
    failpoint("checkpoint-written", ckpt.state.step);
    let dir = ws.resolve(out_rel);
    fs::rename(&tmp, dir.join(&name))
        .with_context(|| format!("moving checkpoint into {}", dir.display()))?;
    fs::File::open(&dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing {}", dir.display()))?;
    failpoint("checkpoint-renamed", ckpt.state.step);
    ws.catalog.commit_checkpoint(&CheckpointRow {
        run_id: run.id,
        step: ckpt.state.step,
        epoch: ckpt.state.epoch,
        path: format!("{out_rel}/{name}"),
        bytes: written.bytes,
        checksum: written.checksum,
    })
}

/// Crash injection for the kill/resume tests: `FSGP_FAILPOINT=NAME:STEP` aborts the process
/// (as a crash would) when the named point is reached at that step.
fn failpoint(name: &str, step: u64) {
    if let Ok(spec) = std::env::var("FSGP_FAILPOINT") {
        if spec == format!("{name}:{step}") {
            eprintln!("failpoint {spec}: aborting");
            std::process::abort();
        }
    }
}
