//! Files written at a path the user names, outside the workspace (`pipeline export --out`,
//! `pipeline predict --input … --output`): the catalog neither records nor collects them,
//! so each is written whole or not at all, and an existing file is never replaced unless
//! asked (`--force`).
//!
//! The protocol: refuse an existing path before any work ([`refuse_existing`]), write under
//! a temporary name in the same directory ([`UserFile::temporary`]), fsync, then move it
//! into place ([`UserFile::publish`]). Without `--force` the move is a hard link, which
//! fails if the path appeared meanwhile, so a file someone else wrote between the check
//! and the end is not overwritten either. A [`UserFile`] dropped before it is published
//! removes its temporary file: a failure part-way (a malformed row, a full disk) leaves
//! nothing under either name.

use std::fs::File;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// Refuses an existing `path` unless `replace`; a directory always.
pub fn refuse_existing(path: &Path, replace: bool) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => bail!("{}: is a directory, expected a file name", path.display()),
        Ok(_) if !replace => bail!("{}", exists_message(path)),
        _ => Ok(()),
    }
}

fn exists_message(path: &Path) -> String {
    format!(
        "{} exists; give --force to replace it (nothing was written)",
        path.display()
    )
}

/// A file being written under a temporary name beside the path it will be published at.
#[derive(Debug)]
pub struct UserFile {
    /// `.NAME.tmp-PID` in the final path's directory (the same file system, so the move
    /// is a rename); empty once published.
    tmp: PathBuf,
    path: PathBuf,
    replace: bool,
}

impl UserFile {
    /// Checks `path` ([`refuse_existing`]) and names its temporary sibling; the caller
    /// creates and writes [`UserFile::tmp_path`].
    pub fn temporary(path: &Path, replace: bool) -> Result<Self> {
        refuse_existing(path, replace)?;
        let name = path
            .file_name()
            .with_context(|| format!("{}: expected a file name", path.display()))?;
        let dir = path.parent().unwrap_or(Path::new(""));
        let tmp = format!(".{}.tmp-{}", name.to_string_lossy(), std::process::id());
        Ok(UserFile {
            tmp: dir.join(tmp),
            path: path.to_path_buf(),
            replace,
        })
    }

    /// Where to write the content before [`UserFile::publish`].
    pub fn tmp_path(&self) -> &Path {
        &self.tmp
    }

    /// The path it is published at.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Moves the whole (closed and fsynced) temporary file to its path and syncs the
    /// directory. Without `replace`, by a hard link that fails if the path exists.
    pub fn publish(mut self) -> Result<()> {
        let (tmp, path) = (std::mem::take(&mut self.tmp), self.path.clone());
        let moved = move_into_place(&tmp, &path, self.replace);
        if moved.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        moved
    }
}

impl Drop for UserFile {
    fn drop(&mut self) {
        // Not published: whatever was written under the temporary name goes.
        if !self.tmp.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

fn move_into_place(tmp: &Path, path: &Path, replace: bool) -> Result<()> {
    if replace {
        std::fs::rename(tmp, path)
            .with_context(|| format!("moving {} to {}", tmp.display(), path.display()))?;
    } else {
        match std::fs::hard_link(tmp, path) {
            Ok(()) => {
                std::fs::remove_file(tmp).with_context(|| format!("removing {}", tmp.display()))?
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => bail!("{}", exists_message(path)),
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("linking {} as {}", tmp.display(), path.display()))
            }
        }
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing directory {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_whole(file: &UserFile, text: &str) {
        std::fs::write(file.tmp_path(), text).unwrap();
    }

    #[test]
    fn an_existing_file_is_kept_unless_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.parquet");
        std::fs::write(&path, "theirs").unwrap();
        let err = UserFile::temporary(&path, false).unwrap_err().to_string();
        assert!(err.contains("exists; give --force"), "{err}");
        let file = UserFile::temporary(&path, true).unwrap();
        write_whole(&file, "ours");
        file.publish().unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "ours");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    /// A file that appears between the check and the publication is not overwritten, and
    /// the temporary file goes.
    #[test]
    fn a_file_that_appears_meanwhile_is_not_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.parquet");
        let file = UserFile::temporary(&path, false).unwrap();
        write_whole(&file, "ours");
        std::fs::write(&path, "theirs").unwrap();
        let err = file.publish().unwrap_err().to_string();
        assert!(err.contains("exists"), "{err}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "theirs");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn an_unpublished_file_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.parquet");
        let file = UserFile::temporary(&path, false).unwrap();
        write_whole(&file, "half");
        drop(file);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        let err = UserFile::temporary(dir.path(), true)
            .unwrap_err()
            .to_string();
        assert!(err.contains("is a directory"), "{err}");
    }
}
