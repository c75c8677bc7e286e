//! Whether a workspace's catalog can vouch for the files beside it.
//!
//! The catalog is the one record of which files are whole and whose they are, and the
//! workspace deletes files on its word: the scratch and unregistered outputs of dead runs.
//! A catalog that is missing, empty, copied from another workspace or restored from an
//! older backup would have it delete a person's results, so before anything trusts the
//! catalog, the files are asked whether it is theirs:
//!
//! - `workspace.json` at the workspace's root holds a random id given when the workspace
//!   was created ([`IdentityFile`]); the catalog records the same id ([`Identity`]);
//! - every published run directory holds `.fsgp-run.json` ([`RunMarker`]): the workspace's
//!   id, the run, and the catalog's *generation* when the run put files there. The
//!   generation is raised in the catalog just before a run publishes (a memoised stage's
//!   output directory, each checkpoint of a training run), so the catalog's generation is
//!   never below any marker's while it is the catalog that wrote them. After each commit
//!   the marker also carries the run's catalog rows, from which `pipeline verify
//!   --rebuild-catalog` rebuilds a lost catalog (`store::rebuild`).
//!
//! A catalog is refused ([`Refusal`]) when it is missing or empty beside outputs, when its
//! id differs from the workspace's or from a run directory's, or when a run directory was
//! published at a generation the catalog has not reached or by a run id it never gave out
//! (a restored backup). Nothing is opened for writing, changed or deleted then.
//! Directories without a marker (written before markers existed) prove nothing either way;
//! they are never deleted as garbage.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::catalog::{Identity, RunRows, StageKind};

/// The workspace's identity file, at its root.
pub const IDENTITY_FILE: &str = "workspace.json";

/// The marker file of a published run directory.
pub const RUN_MARKER: &str = ".fsgp-run.json";

/// The value of `format` in [`IDENTITY_FILE`].
const IDENTITY_FORMAT: &str = "fsgp-workspace";

/// `workspace.json`: what makes a directory a workspace, and which one.
#[derive(Debug, Serialize, Deserialize)]
struct IdentityFile {
    format: String,
    version: u32,
    /// 32 hex digits, random.
    id: String,
}

/// `.fsgp-run.json` in a published run directory.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RunMarker {
    /// The id of the workspace whose catalog registered the run.
    pub workspace: String,
    pub run: i64,
    pub stage: String,
    /// The catalog's generation when the run last put files in this directory.
    pub generation: i64,
    /// The run's catalog rows when it last registered files here (after each commit):
    /// what `pipeline verify --rebuild-catalog` restores a lost catalog from. Absent before
    /// the run's first commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<RunRows>,
}

/// Reads the workspace's id from `root/workspace.json` (None: there is no such file).
pub fn read_identity_file(root: &Path) -> Result<Option<String>> {
    let path = root.join(IDENTITY_FILE);
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let file: IdentityFile = serde_json::from_str(&text).with_context(|| {
        format!(
            "{}: found {}, expected the workspace's identity ({{\"format\": \
             \"{IDENTITY_FORMAT}\", \"version\": 1, \"id\": …}})",
            path.display(),
            summarise(&text)
        )
    })?;
    anyhow::ensure!(
        file.format == IDENTITY_FORMAT && file.version == 1,
        "{}: found format '{}' version {}, expected '{IDENTITY_FORMAT}' version 1 (written \
         by a newer fsgp?)",
        path.display(),
        file.format,
        file.version
    );
    Ok(Some(file.id))
}

/// The first characters of a file's text, for an error message.
fn summarise(text: &str) -> String {
    let first: String = text.chars().take(40).collect();
    if text.trim().is_empty() {
        "an empty file".into()
    } else if first.len() < text.len() {
        format!("'{first}…'")
    } else {
        format!("'{first}'")
    }
}

/// Creates `root/workspace.json` with `id` unless the file exists, and returns the id the
/// file holds then: two processes creating one workspace agree on the first one's id (the
/// file appears whole, by a hard link that fails when the name is taken).
pub fn create_identity_file(root: &Path, id: &str) -> Result<String> {
    let path = root.join(IDENTITY_FILE);
    let tmp = root.join(format!("{IDENTITY_FILE}.tmp-{}", std::process::id()));
    let file = IdentityFile {
        format: IDENTITY_FORMAT.into(),
        version: 1,
        id: id.into(),
    };
    write_synced(&tmp, &serde_json::to_vec_pretty(&file)?)?;
    let linked = fs::hard_link(&tmp, &path);
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(id.to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => read_identity_file(root)?
            .with_context(|| format!("{} vanished while being read", path.display())),
        Err(e) => Err(e).with_context(|| format!("creating {}", path.display())),
    }
}

/// A new random workspace id: 32 hex digits.
pub fn new_workspace_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// Writes `bytes` to `path` and syncs it.
fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing {}", path.display()))
}

/// Writes the marker of run directory `dir` (replacing the one there, atomically).
pub fn write_marker(dir: &Path, marker: &RunMarker) -> Result<()> {
    let tmp = dir.join(format!("{RUN_MARKER}.tmp"));
    let path = dir.join(RUN_MARKER);
    let written = write_synced(&tmp, &serde_json::to_vec(marker)?).and_then(|()| {
        fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))
    });
    if written.is_err() {
        // A full disk: the marker before stays whole, and no torn copy is left beside it.
        let _ = fs::remove_file(&tmp);
    }
    written
}

/// The marker of run directory `dir`: None when it has none; an unreadable marker is an
/// error naming it (a damaged marker must not be taken for a missing one).
pub fn read_marker(dir: &Path) -> Result<Option<RunMarker>> {
    let path = dir.join(RUN_MARKER);
    match fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).with_context(|| {
            format!(
                "{}: found {}, expected a run directory's marker ({{\"workspace\": …, \
                 \"run\": …, \"stage\": …, \"generation\": …}}); nothing was changed. \
                 Restore it from a backup, or delete it: the directory then proves nothing \
                 and is never deleted as garbage (docs/formats.md, \"Workspace identity and \
                 run markers\")",
                path.display(),
                summarise(&String::from_utf8_lossy(&bytes))
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        // A file in place of the directory, or a dangling link: no marker to read.
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// The published directory holding the workspace-relative file `rel`:
/// `<stage dir>/<name>.run<id>`.
pub fn run_dir(rel: &str) -> Option<String> {
    let mut parts = rel.split('/');
    let (top, name) = (parts.next()?, parts.next()?);
    parts.next().map(|_| format!("{top}/{name}"))
}

/// One entry of a stage's output directory: `<stage dir>/<name>.run<id>`.
#[derive(Debug, Clone)]
pub struct PublishedDir {
    /// Workspace-relative.
    pub rel: String,
    pub path: PathBuf,
    /// The run id its name carries, if it carries one.
    pub run: Option<i64>,
    pub marker: Option<RunMarker>,
}

/// Every entry of the stages' output directories of the workspace at `root`, with the
/// markers of those that have one (read through symbolic links: a run moved to another
/// disk and linked back is still the run).
pub fn published_dirs(root: &Path) -> Result<Vec<PublishedDir>> {
    let mut found = Vec::new();
    for kind in StageKind::ALL {
        let top = root.join(kind.output_dir());
        let entries = match fs::read_dir(&top) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("listing {}", top.display())),
        };
        for entry in entries {
            let name = entry
                .with_context(|| format!("listing {}", top.display()))?
                .file_name()
                .to_string_lossy()
                .into_owned();
            found.push(published_dir(
                root,
                &format!("{}/{name}", kind.output_dir()),
            )?);
        }
    }
    found.sort_by(|a, b| a.rel.cmp(&b.rel));
    Ok(found)
}

/// The entry `rel` (workspace-relative, `<stage dir>/<name>`) of the workspace at `root`:
/// the run id its name carries and its marker, if any.
pub fn published_dir(root: &Path, rel: &str) -> Result<PublishedDir> {
    let path = root.join(rel);
    Ok(PublishedDir {
        rel: rel.to_string(),
        marker: read_marker(&path)?,
        run: rel
            .rsplit_once(".run")
            .and_then(|(_, id)| id.parse::<i64>().ok()),
        path,
    })
}

/// Why the catalog cannot vouch for the workspace's files. Each says what was found, that
/// nothing was changed, and what to do (docs/reliability.md, "When the catalog cannot
/// vouch for the files").
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error(
        "workspace {root}: the catalog {catalog} is {state}, but the workspace holds the \
         outputs of earlier runs ({shown}): without their catalog nothing can tell which \
         files are whole, so nothing was opened, changed or deleted. Restore catalog.sqlite \
         from a backup, or move the outputs you want to keep out of the workspace and start \
         a new one (docs/reliability.md, \"When the catalog cannot vouch for the files\")"
    )]
    Missing {
        root: String,
        catalog: String,
        /// "missing" or "empty (0 bytes)".
        state: &'static str,
        shown: String,
    },
    #[error(
        "workspace {root}: the catalog {catalog} belongs to another workspace (its id {found}, \
         while {witness} says {expected}); nothing was changed or deleted. Put this \
         workspace's own catalog.sqlite back (or a backup of it) (docs/reliability.md, \
         \"When the catalog cannot vouch for the files\")"
    )]
    Foreign {
        root: String,
        catalog: String,
        found: String,
        expected: String,
        /// The file that holds the workspace's id.
        witness: String,
    },
    #[error(
        "workspace {root}: the catalog {catalog} is older than the files it should describe \
         ({why}): it looks like a restored backup. Trusting it would delete what it does not \
         know, so nothing was changed or deleted. Restore the newest backup of \
         catalog.sqlite, or move the directories it does not know out of the workspace \
         ({newer}) and run this again (docs/reliability.md, \"When the catalog cannot vouch \
         for the files\")"
    )]
    Older {
        root: String,
        catalog: String,
        why: String,
        newer: String,
    },
}

/// At most this many paths are named in a refusal.
const SHOWN: usize = 4;

/// `items` joined, at most [`SHOWN`] of them, with a count of the rest.
fn shown(items: &[String]) -> String {
    let mut text = items
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > SHOWN {
        text.push_str(&format!(" and {} more", items.len() - SHOWN));
    }
    text
}

/// The refusal of a workspace whose catalog file is missing or empty, if it holds outputs
/// (a directory with neither is a new workspace, or one with nothing to lose).
pub fn missing_catalog(root: &Path, catalog: &Path, dirs: &[PublishedDir]) -> Option<Refusal> {
    if dirs.is_empty() {
        return None;
    }
    let state = if catalog.exists() {
        "empty (0 bytes)"
    } else {
        "missing"
    };
    let rels: Vec<String> = dirs.iter().map(|d| d.rel.clone()).collect();
    Some(Refusal::Missing {
        root: root.display().to_string(),
        catalog: catalog.display().to_string(),
        state,
        shown: shown(&rels),
    })
}

/// Checks that the catalog at `catalog`, whose identity is `identity` and whose runs go up
/// to `last_run`, vouches for the workspace at `root`: the identity file (`file_id`) and
/// every run directory's marker are this catalog's, and no run directory is newer than it.
pub fn check_vouches(
    root: &Path,
    catalog: &Path,
    identity: &Identity,
    file_id: Option<&str>,
    last_run: i64,
    dirs: &[PublishedDir],
) -> Result<(), Refusal> {
    let foreign = |expected: &str, witness: String| Refusal::Foreign {
        root: root.display().to_string(),
        catalog: catalog.display().to_string(),
        found: identity.id.clone(),
        expected: expected.to_string(),
        witness,
    };
    if let Some(file_id) = file_id.filter(|f| *f != identity.id) {
        return Err(foreign(file_id, IDENTITY_FILE.into()));
    }
    let mut newer = Vec::new();
    let mut why = None;
    for dir in dirs {
        if let Some(m) = &dir.marker {
            if m.workspace != identity.id {
                return Err(foreign(&m.workspace, format!("{}/{RUN_MARKER}", dir.rel)));
            }
            if m.generation > identity.generation {
                why.get_or_insert_with(|| {
                    format!(
                        "{} was published at generation {}, the catalog is at generation {}",
                        dir.rel, m.generation, identity.generation
                    )
                });
                newer.push(dir.rel.clone());
                continue;
            }
        }
        if let Some(run) = dir.run.filter(|&r| r > last_run) {
            why.get_or_insert_with(|| {
                format!(
                    "{} is run {run}'s, the catalog has given out run ids up to {last_run}",
                    dir.rel
                )
            });
            newer.push(dir.rel.clone());
        }
    }
    match why {
        None => Ok(()),
        Some(why) => Err(Refusal::Older {
            root: root.display().to_string(),
            catalog: catalog.display().to_string(),
            why,
            newer: shown(&newer),
        }),
    }
}

/// Whether the directory `dir` can be written by this process: not on a read-only mount,
/// and writable by its permissions. Asked without writing anything.
pub fn writable_dir(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c_path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: statvfs(3) and access(2) read the NUL-terminated path and write only into
    // the zeroed struct passed; nothing is retained.
    unsafe {
        let mut fs: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c_path.as_ptr(), &mut fs) == 0 && fs.f_flag & libc::ST_RDONLY != 0 {
            return false;
        }
        libc::access(c_path.as_ptr(), libc::W_OK) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(rel: &str, run: i64, marker: Option<(&str, i64)>) -> PublishedDir {
        PublishedDir {
            rel: rel.into(),
            path: PathBuf::from(rel),
            run: Some(run),
            marker: marker.map(|(ws, generation)| RunMarker {
                workspace: ws.into(),
                run,
                stage: "svd".into(),
                generation,
                rows: None,
            }),
        }
    }

    #[test]
    fn a_catalog_vouches_only_for_its_own_files_up_to_its_generation() {
        let (root, cat) = (Path::new("ws"), Path::new("ws/catalog.sqlite"));
        let identity = Identity {
            id: "aa".into(),
            generation: 5,
        };
        let ours = [
            dir("svd/x.run2", 2, Some(("aa", 5))),
            dir("datasets/d.run1", 1, None),
        ];
        assert!(check_vouches(root, cat, &identity, Some("aa"), 2, &ours).is_ok());
        // The identity file says another workspace.
        let e = check_vouches(root, cat, &identity, Some("bb"), 2, &ours).unwrap_err();
        assert!(matches!(e, Refusal::Foreign { .. }), "{e}");
        // A run directory of another workspace.
        let theirs = [dir("svd/x.run2", 2, Some(("bb", 1)))];
        let e = check_vouches(root, cat, &identity, None, 2, &theirs).unwrap_err();
        assert!(
            e.to_string().contains("svd/x.run2/.fsgp-run.json says bb"),
            "{e}"
        );
        // Published after the catalog's generation: a restored backup.
        let later = [dir("svd/x.run2", 2, Some(("aa", 6)))];
        let e = check_vouches(root, cat, &identity, None, 2, &later).unwrap_err();
        assert!(
            e.to_string().contains(
                "svd/x.run2 was published at generation 6, the catalog is at generation 5"
            ),
            "{e}"
        );
        // An unmarked directory of a run id never given out.
        let unknown = [dir("train/x.run9", 9, None)];
        let e = check_vouches(root, cat, &identity, None, 2, &unknown).unwrap_err();
        assert!(
            e.to_string()
                .contains("train/x.run9 is run 9's, the catalog has given out run ids up to 2"),
            "{e}"
        );
    }

    #[test]
    fn the_identity_file_is_created_once_and_markers_round_trip() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(read_identity_file(root.path()).unwrap(), None);
        assert_eq!(create_identity_file(root.path(), "aa").unwrap(), "aa");
        // A second creator gets the first one's id, and no temporary file is left.
        assert_eq!(create_identity_file(root.path(), "bb").unwrap(), "aa");
        assert_eq!(fs::read_dir(root.path()).unwrap().count(), 1);
        fs::write(root.path().join(IDENTITY_FILE), "{").unwrap();
        let e = read_identity_file(root.path()).unwrap_err();
        assert!(format!("{e:#}").contains("found '{', expected the workspace's identity"));

        let marker = RunMarker {
            workspace: "aa".into(),
            run: 3,
            stage: "train".into(),
            generation: 7,
            rows: None,
        };
        assert_eq!(read_marker(root.path()).unwrap(), None);
        write_marker(root.path(), &marker).unwrap();
        assert_eq!(read_marker(root.path()).unwrap(), Some(marker));
    }
}
