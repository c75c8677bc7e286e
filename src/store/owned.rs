//! What fsgp may remove inside a workspace, decided in one place.
//!
//! Every removal a stage, the garbage collection of an open, `verify --repair` or a
//! replacing ingest makes goes through `Workspace::dispose` (through [`Disposer`]), which removes a path only
//! when both hold:
//!
//! - it resolves inside the workspace without leaving it: a relative path of plain names
//!   (no `..`, no root, no `.`), under the workspace's own folders, reached through real
//!   directories only. A run directory moved to another disk and linked back is followed for
//!   reading only: nothing is ever removed through a symbolic link;
//! - fsgp wrote it: it lies in a directory that carries this workspace's marker for the run
//!   its name carries ([`super::identity::RunMarker`]; a run's scratch directory carries
//!   one too), and its own name is one fsgp alone makes there ([`is_own_name`]).
//!
//! Anything else such a removal would have taken (a file of the user's in a run directory,
//! a directory without a marker, a link) is moved to `lost+found/<when>/<its path>` inside
//! the workspace, as fsck does, and named in the output; what cannot be moved there (a path
//! reached through a link, a move across file systems) is left in place and named.
//!
//! Paths read from the catalog or a run directory's marker go through [`checked_rel`]
//! before any use: a catalog edited by hand or a damaged marker naming `/tmp` or
//! `../../home` is refused by name, never read, written or removed.

use std::fs;
use std::path::Path;

use anyhow::{bail, Context, Result};

use super::catalog::StageKind;
use super::identity::{self, RunMarker, RUN_MARKER};

/// The workspace's folder for what a removal would have taken and fsgp did not write.
pub const LOST_FOUND: &str = "lost+found";

/// The workspace's folder of stage runs' scratch directories.
pub const SCRATCH_DIR: &str = "tmp";

/// `rel` if it is a workspace-relative path of plain names under `stage`'s output folder
/// (`datasets/…`, `train/…`): what a path read from the catalog or a marker must be before
/// it is used. The error names the path and what was expected.
pub fn checked_rel(rel: &str, stage: StageKind) -> Result<&str> {
    let top = stage.output_dir();
    if !plain_names(rel) || rel.split('/').next() != Some(top) {
        bail!(
            "found the path '{rel}', expected a path inside the workspace under '{top}/' \
             (relative, without '..'); the catalog or a run directory's marker was edited or \
             damaged, so nothing was read, written or removed there"
        );
    }
    Ok(rel)
}

/// Whether `rel` is a relative path of plain names: no leading `/`, no empty, `.` or `..`
/// component (`Path::components` would drop an inner `.`, so the text is split by hand).
fn plain_names(rel: &str) -> bool {
    !rel.is_empty()
        && rel
            .split('/')
            .all(|name| !name.is_empty() && name != "." && name != ".." && !name.contains('\0'))
}

/// Whether `name` is one fsgp alone makes inside its run and scratch directories: the
/// marker, chunks (`part-NNNNN.parquet`), checkpoints (`ckpt-NNNNNNNNN.parquet`), svd's
/// matrices (`*.npy`), the transform's statistics, predictions, metrics, and the
/// temporary names its writers use before a rename (`*.tmp`, `*.tmp-PID`).
pub fn is_own_name(name: &str) -> bool {
    const FIXED: [&str; 5] = [
        RUN_MARKER,
        // store::scaling's SCALING_FILE (its unit test holds the two together).
        "transform.parquet",
        "predictions.parquet",
        "metrics.json",
        "classes.parquet",
    ];
    let numbered = |prefix: &str, digits: usize| {
        name.strip_prefix(prefix)
            .and_then(|rest| rest.strip_suffix(".parquet"))
            .is_some_and(|n| n.len() >= digits && n.bytes().all(|b| b.is_ascii_digit()))
    };
    FIXED.contains(&name)
        || numbered("part-", 5)
        || numbered("ckpt-", 9)
        || (name.ends_with(".npy") && !name.starts_with('.'))
        || name.ends_with(".tmp")
        || name
            .rsplit_once(".tmp-")
            .is_some_and(|(_, pid)| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
}

/// What `Workspace::dispose` (through [`Disposer`]) did with a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposal {
    /// Nothing was there.
    Absent,
    /// Removed: fsgp wrote all of it.
    Removed,
    /// Removed what fsgp wrote; moved the rest to `lost+found` (workspace-relative paths).
    MovedAside(Vec<String>),
    /// Left in place, with why.
    Kept(String),
}

impl Disposal {
    /// A line for the output naming what happened to `rel`, if anything happened that a
    /// person should know of (a plain removal is the caller's to report).
    pub fn note(&self, rel: &str) -> Option<String> {
        match self {
            Disposal::Absent | Disposal::Removed => None,
            Disposal::MovedAside(moved) => Some(format!(
                "moved what fsgp did not write in {rel} to {}",
                moved.join(", ")
            )),
            Disposal::Kept(why) => Some(format!("left {rel} in place: {why}")),
        }
    }
}

/// The folder of one process's moves to `lost+found`, made on the first move.
#[derive(Debug, Default)]
pub struct LostFound {
    /// `lost+found/<when>` (workspace-relative), once chosen.
    dir: Option<String>,
}

impl LostFound {
    pub fn new() -> Self {
        LostFound::default()
    }

    /// `lost+found/<UTC time>-<pid>`: one folder per process and second, so moves of two
    /// processes or of two repairs never meet.
    fn dir(&mut self, stamp: &dyn Fn() -> Result<String>) -> Result<&str> {
        if self.dir.is_none() {
            let when = stamp()?;
            self.dir = Some(format!("{LOST_FOUND}/{when}-{}", std::process::id()));
        }
        Ok(self.dir.as_deref().unwrap_or_default())
    }
}

/// The removals of one workspace: its root, which run markers are its own, and the clock
/// that names a folder of `lost+found` (the workspace gives its catalog's).
pub struct Disposer<'a> {
    pub root: &'a Path,
    pub owns: &'a dyn Fn(&RunMarker) -> bool,
    pub stamp: &'a dyn Fn() -> Result<String>,
}

impl Disposer<'_> {
    fn root(&self) -> &Path {
        self.root
    }

    /// Removes the root-relative `rel` (a file, or a directory tree) by the rule of this
    /// module: what fsgp wrote is removed, what it did not is moved to `lost+found`, and
    /// nothing is touched through a link or outside the root.
    pub fn dispose(&self, rel: &str, aside: &mut LostFound) -> Result<Disposal> {
        let top_ok = rel.split('/').next().is_some_and(|top| {
            top == SCRATCH_DIR || StageKind::ALL.iter().any(|k| k.output_dir() == top)
        });
        if !top_ok || !plain_names(rel) || rel.split('/').count() < 2 {
            return Ok(Disposal::Kept(format!(
                "'{rel}' is not a path under the workspace's stage or scratch folders"
            )));
        }
        if let Some(link) = self.link_on_the_way(rel) {
            return Ok(Disposal::Kept(format!(
                "it is reached through the symbolic link {link}, and fsgp removes nothing \
                 through a link"
            )));
        }
        let path = self.root().join(rel);
        let Ok(meta) = fs::symlink_metadata(&path) else {
            return Ok(Disposal::Absent);
        };
        let mut moved = Vec::new();
        if meta.is_symlink() || !self.wrote_container(rel) {
            // A link, or a directory without this workspace's marker: the user's (or an
            // older fsgp's) to judge; moved whole, links as links.
            self.move_aside(rel, aside, &mut moved)?;
        } else {
            // A scratch directory is the run's private space: every name in it is fsgp's.
            let any_name = rel.starts_with(&format!("{SCRATCH_DIR}/"));
            self.remove_owned(rel, any_name, aside, &mut moved)?;
        }
        Ok(match fs::symlink_metadata(&path) {
            Ok(_) => Disposal::Kept(format!(
                "it could not be emptied (moved: {})",
                if moved.is_empty() {
                    "nothing".into()
                } else {
                    moved.join(", ")
                }
            )),
            Err(_) if moved.is_empty() => Disposal::Removed,
            Err(_) => Disposal::MovedAside(moved),
        })
    }

    /// The first symbolic link among the folders leading to `rel` (not `rel` itself).
    fn link_on_the_way(&self, rel: &str) -> Option<String> {
        let names: Vec<&str> = rel.split('/').collect();
        (1..names.len()).find_map(|n| {
            let prefix = names[..n].join("/");
            fs::symlink_metadata(self.root().join(&prefix))
                .is_ok_and(|m| m.is_symlink())
                .then_some(prefix)
        })
    }

    /// Whether the run or scratch directory holding `rel` (its top two names:
    /// `train/x.run3`, `tmp/run-3`) is a real directory carrying this workspace's marker for
    /// the run its name carries: one fsgp wrote.
    fn wrote_container(&self, rel: &str) -> bool {
        let top: String = rel.split('/').take(2).collect::<Vec<_>>().join("/");
        let path = self.root().join(&top);
        let real_dir = fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir());
        real_dir
            && match (run_of_name(&top), identity::read_marker(&path)) {
                (Some(run), Ok(Some(marker))) => (self.owns)(&marker) && marker.run == run,
                _ => false,
            }
    }

    /// Removes `rel` inside a directory fsgp wrote: its own names (`any_name`: every
    /// name) go, a directory is emptied the same way then removed, anything else (links
    /// always) is moved aside.
    fn remove_owned(
        &self,
        rel: &str,
        any_name: bool,
        aside: &mut LostFound,
        moved: &mut Vec<String>,
    ) -> Result<()> {
        let path = self.root().join(rel);
        let meta =
            fs::symlink_metadata(&path).with_context(|| format!("reading {}", path.display()))?;
        let name = rel.rsplit('/').next().unwrap_or(rel);
        if meta.is_dir() {
            let mut entries: Vec<String> = Vec::new();
            for entry in
                fs::read_dir(&path).with_context(|| format!("listing {}", path.display()))?
            {
                entries.push(entry?.file_name().to_string_lossy().into_owned());
            }
            // The marker last: a directory emptied part-way still says whose it is.
            entries.sort_by_key(|e| e == RUN_MARKER);
            for entry in entries {
                self.remove_owned(&format!("{rel}/{entry}"), any_name, aside, moved)?;
            }
            match fs::remove_dir(&path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
            }
        } else if meta.is_file() && (any_name || is_own_name(name)) {
            match fs::remove_file(&path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
            }
        } else {
            self.move_aside(rel, aside, moved)
        }
    }

    /// Moves `rel` to `lost+found/<when>/rel` (a rename: links move as links, nothing is
    /// copied). A move that fails (another file system) leaves it in place.
    fn move_aside(&self, rel: &str, aside: &mut LostFound, moved: &mut Vec<String>) -> Result<()> {
        let to = format!("{}/{rel}", aside.dir(self.stamp)?);
        let dst = self.root().join(&to);
        if let Some(parent) = dst.parent() {
            fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        match fs::rename(self.root().join(rel), &dst) {
            Ok(()) => {
                moved.push(to);
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            // Left in place; `dispose` reports it as kept.
            Err(_) => Ok(()),
        }
    }
}

/// The run id a run or scratch directory's name carries: `<name>.run<id>` under a stage's
/// folder, `run-<id>` or `run-<id>.rank<r>` under `tmp/`.
pub fn run_of_name(rel: &str) -> Option<i64> {
    let (top, name) = rel.split_once('/')?;
    if top == SCRATCH_DIR {
        name.strip_prefix("run-")?.split('.').next()?.parse().ok()
    } else {
        name.rsplit_once(".run")?.1.parse().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_from_the_catalog_must_stay_under_their_stage_folder() {
        for good in ["train/x.run3/ckpt-000000007.parquet", "train/x.run3"] {
            assert_eq!(checked_rel(good, StageKind::Train).unwrap(), good);
        }
        for bad in [
            "/tmp/victim",
            "train/../../victim",
            "train/./x",
            "../train/x",
            "svd/x.run2/basis.npy",
            "",
            "train//x",
            "train/x/",
        ] {
            let err = checked_rel(bad, StageKind::Train).unwrap_err().to_string();
            assert!(err.contains(&format!("found the path '{bad}'")), "{err}");
        }
    }

    #[test]
    fn own_names_are_the_ones_fsgp_makes() {
        for own in [
            ".fsgp-run.json",
            "part-00012.parquet",
            "ckpt-000000070.parquet",
            "kxx.npy",
            "predictions.parquet",
            ".fsgp-run.json.tmp",
            ".predictions.parquet.tmp-4242",
        ] {
            assert!(is_own_name(own), "{own}");
        }
        for theirs in [
            "notes.txt",
            "ckpt-7.parquet",
            "part-x.parquet",
            ".npy",
            "a.tmp-",
            "data.csv",
        ] {
            assert!(!is_own_name(theirs), "{theirs}");
        }
    }

    #[test]
    fn run_ids_come_from_the_names_fsgp_gives() {
        assert_eq!(run_of_name("train/delicious-linear.run12"), Some(12));
        assert_eq!(run_of_name("tmp/run-4"), Some(4));
        assert_eq!(run_of_name("tmp/run-4.rank1"), Some(4));
        assert_eq!(run_of_name("train/notes"), None);
        assert_eq!(run_of_name("tmp/other"), None);
    }
}
