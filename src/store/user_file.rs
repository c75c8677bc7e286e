//! Outputs at a path the user names, outside the workspace's catalog (`export --out`,
//! `predict --input … --output`, `fit --spec-out` and `--model-out`, and the directories
//! of `report --out` and `synth --out`): the catalog neither records nor collects them, so
//! this module is the one place that decides what may be written there. The rule:
//!
//! * Nothing but a regular file is ever replaced: a directory, a device, a FIFO, a socket
//!   or a symbolic link to one of them (or to nothing) is refused, `--force` or not.
//! * A regular file is replaced only when asked (`--force`).
//! * All of it is checked before any work ([`check_file_output`], [`OwnFiles::prepare`]),
//!   together with a missing directory to write into and outputs that name the same file
//!   as each other or as an input ([`refuse_same_file`]).
//! * A directory output receives only the command's own file names ([`OwnFiles`]); every
//!   other file in it is left alone, and the directory itself is never removed or renamed.
//!
//! The protocol of a file: write under a temporary name in the same directory
//! ([`UserFile::temporary`]), fsync, then move it into place ([`UserFile::publish`]).
//! Without `--force` the move is a hard link, which fails if the path appeared meanwhile,
//! so a file someone else wrote between the check and the end is not overwritten either.
//! A [`UserFile`] dropped before it is published removes its temporary file: a failure
//! part-way (a malformed row, a full disk) leaves nothing under either name.

use std::fs::{File, FileType, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// What stands at a path an output would take (through a symbolic link).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Occupant {
    Nothing,
    /// A regular file, or a symbolic link to one (replacing it replaces the link).
    RegularFile,
    /// A directory, or a symbolic link to one.
    Directory,
    /// Anything else, described for the refusal ("a character device").
    Other(String),
}

impl Occupant {
    fn describe(&self) -> String {
        match self {
            Occupant::Nothing => "nothing".into(),
            Occupant::RegularFile => "a regular file".into(),
            Occupant::Directory => "a directory".into(),
            Occupant::Other(what) => what.clone(),
        }
    }
}

fn occupant(path: &Path) -> Result<Occupant> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Occupant::Nothing),
        Err(e) => return Err(e).with_context(|| format!("{}: cannot inspect", path.display())),
    };
    if !meta.file_type().is_symlink() {
        return Ok(kind_of(meta.file_type()));
    }
    Ok(match std::fs::metadata(path) {
        Ok(target) => match kind_of(target.file_type()) {
            Occupant::Other(what) => Occupant::Other(format!("a symbolic link to {what}")),
            followed => followed,
        },
        Err(_) => Occupant::Other("a symbolic link to nothing".into()),
    })
}

fn kind_of(file_type: FileType) -> Occupant {
    if file_type.is_file() {
        return Occupant::RegularFile;
    }
    if file_type.is_dir() {
        return Occupant::Directory;
    }
    let what = if file_type.is_char_device() {
        "a character device"
    } else if file_type.is_block_device() {
        "a block device"
    } else if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_socket() {
        "a socket"
    } else {
        "a special file"
    };
    Occupant::Other(what.into())
}

/// Refuses, before any work, an output file at `path` that may not be written: a path
/// without a file name, a directory to write into that is missing (or not a directory),
/// anything there but a regular file, and a regular file unless `replace`.
pub fn check_file_output(path: &Path, replace: bool) -> Result<()> {
    if path.file_name().is_none() {
        bail!("{}: expected a file name", path.display());
    }
    check_directory_exists(path)?;
    check_occupant(path, replace)
}

/// Refuses what stands at `path` unless it is nothing, or a regular file and `replace`.
fn check_occupant(path: &Path, replace: bool) -> Result<()> {
    match occupant(path)? {
        Occupant::Nothing => Ok(()),
        Occupant::RegularFile if replace => Ok(()),
        Occupant::RegularFile => bail!("{}", exists_message(path)),
        other => bail!(
            "{}: found {}, expected a regular file or nothing; only a regular file is ever \
             replaced, with --force (nothing was written)",
            path.display(),
            other.describe()
        ),
    }
}

fn exists_message(path: &Path) -> String {
    format!(
        "{} exists; give --force to replace it (nothing was written)",
        path.display()
    )
}

/// The directory `path` is written into ("." for a bare file name).
fn directory_of(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

fn check_directory_exists(path: &Path) -> Result<()> {
    let dir = directory_of(path);
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => bail!(
            "{}: {} is not a directory (nothing was written)",
            path.display(),
            dir.display()
        ),
        Err(e) if e.kind() == ErrorKind::NotFound => bail!(
            "{}: directory {} does not exist; create it first (nothing was written)",
            path.display(),
            dir.display()
        ),
        Err(e) => Err(e).with_context(|| format!("{}: cannot inspect", dir.display())),
    }
}

/// Where `path` leads once its directory's symbolic links and `..` are resolved: the
/// canonical form of its longest existing ancestor, joined with the rest.
pub fn resolved(path: &Path) -> Result<PathBuf> {
    let absolute = std::path::absolute(path)
        .with_context(|| format!("{}: cannot make it absolute", path.display()))?;
    let mut existing = absolute.as_path();
    let mut rest = Vec::new();
    loop {
        match existing.canonicalize() {
            Ok(base) => return Ok(rest.iter().rev().fold(base, |p, part| p.join(part))),
            Err(_) => match (existing.parent(), existing.file_name()) {
                (Some(parent), Some(name)) => {
                    rest.push(name.to_os_string());
                    existing = parent;
                }
                _ => return Ok(absolute),
            },
        }
    }
}

/// Whether `path` is `dir` or lies below it, once both are [`resolved`] (so neither `..`
/// nor a symbolic link to the directory hides it).
pub fn lies_within(path: &Path, dir: &Path) -> Result<bool> {
    Ok(resolved(path)?.starts_with(resolved(dir)?))
}

/// Refuses an output that is the same file as another output or as an input (each path
/// with the option that named it): the same [`resolved`] path, or one existing file under
/// two names (a hard or symbolic link). Inputs may name the same file as each other.
pub fn refuse_same_file(outputs: &[(&str, &Path)], inputs: &[(&str, &Path)]) -> Result<()> {
    let named: Vec<(&str, &Path)> = outputs.iter().chain(inputs).copied().collect();
    let identities: Vec<(PathBuf, Option<(u64, u64)>)> = named
        .iter()
        .map(|(_, p)| Ok((resolved(p)?, file_identity(p))))
        .collect::<Result<_>>()?;
    for i in 0..outputs.len() {
        for j in i + 1..named.len() {
            let ((path_i, file_i), (path_j, file_j)) = (&identities[i], &identities[j]);
            if path_i == path_j || (file_i.is_some() && file_i == file_j) {
                let ((opt_i, given_i), (opt_j, given_j)) = (named[i], named[j]);
                bail!(
                    "{opt_i} {} and {opt_j} {} name the same file; give each its own \
                     (nothing was written)",
                    given_i.display(),
                    given_j.display()
                );
            }
        }
    }
    Ok(())
}

/// The device and inode of the file at `path` (through links), if it exists.
fn file_identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// A file being written under a temporary name beside the path it will be published at.
#[derive(Debug)]
pub struct UserFile {
    /// `.NAME.tmp-PID` in the final path's directory (the same file system, so the move
    /// is a rename), created empty by [`UserFile::temporary`]; empty once published.
    tmp: PathBuf,
    path: PathBuf,
    replace: bool,
}

impl UserFile {
    /// Checks `path` ([`check_file_output`]) and creates its temporary sibling, empty;
    /// the caller writes [`UserFile::tmp_path`].
    pub fn temporary(path: &Path, replace: bool) -> Result<Self> {
        check_file_output(path, replace)?;
        let name = path.file_name().expect("checked above").to_string_lossy();
        let tmp = directory_of(path).join(format!(".{name}.tmp-{}", std::process::id()));
        // Created here, never truncated: a file of that name is not ours to overwrite.
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .with_context(|| format!("creating the temporary file {}", tmp.display()))?;
        Ok(UserFile {
            tmp,
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
        // Checked again: a directory or a device may have appeared since the first check,
        // and a rename would replace a device node.
        check_occupant(path, true)?;
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
    let dir = directory_of(path);
    File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing directory {}", dir.display()))
}

/// A directory the user named for a command's own files (`report --out`, `synth --out`):
/// the files are written into a staging directory inside it and moved into place by name,
/// each as a [`UserFile`] is, so only those names are ever written there.
#[derive(Debug)]
pub struct OwnFiles {
    dir: PathBuf,
    /// Every name the command may write, checked before any work.
    names: Vec<String>,
    replace: bool,
    /// `.fsgp-staging-PID-N` inside `dir` (the same file system, so each move is a
    /// rename), created by [`OwnFiles::prepare`]; empty once published.
    staging: PathBuf,
    /// `dir` when [`OwnFiles::prepare`] created it: removed again if nothing was
    /// published into it.
    created: Option<PathBuf>,
}

impl OwnFiles {
    /// Refuses, before any work, a `dir` that is neither absent nor a directory (or a
    /// symbolic link to one), and each of `names` already in it that may not be written
    /// ([`check_file_output`]'s rule); then creates `dir` if missing (with its parents)
    /// and the staging directory inside it.
    pub fn prepare(dir: &Path, names: Vec<String>, replace: bool) -> Result<Self> {
        let exists = match occupant(dir)? {
            Occupant::Nothing => false,
            Occupant::Directory => true,
            other => bail!(
                "{}: found {}, expected a directory or nothing (nothing was written)",
                dir.display(),
                other.describe()
            ),
        };
        if exists {
            for name in &names {
                check_occupant(&dir.join(name), replace)?;
            }
        } else {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("creating the directory {}", dir.display()))?;
        }
        let staging = create_staging(dir)?;
        Ok(OwnFiles {
            dir: dir.to_path_buf(),
            names,
            replace,
            staging,
            created: (!exists).then(|| dir.to_path_buf()),
        })
    }

    /// Where the files are written before [`OwnFiles::publish`].
    pub fn staging(&self) -> &Path {
        &self.staging
    }

    /// Moves each file of `written` (names given to [`OwnFiles::prepare`], written into
    /// [`OwnFiles::staging`]) into the directory, then removes the staging directory.
    /// Without `replace`, each by a hard link that fails if the name was taken meanwhile
    /// (the files moved before it stay).
    pub fn publish(mut self, written: &[String]) -> Result<()> {
        for name in written {
            if !self.names.contains(name) {
                bail!("{name}: not among the files checked before the work began");
            }
            move_into_place(&self.staging.join(name), &self.dir.join(name), self.replace)?;
        }
        let staging = std::mem::take(&mut self.staging);
        self.created = None;
        // Every staged name was moved out: only an empty directory is removed here.
        std::fs::remove_dir(&staging)
            .with_context(|| format!("removing the staging directory {}", staging.display()))
    }
}

impl Drop for OwnFiles {
    fn drop(&mut self) {
        // Not published (or only in part): the staging directory is ours alone.
        if !self.staging.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.staging);
        }
        // Only an empty directory goes: one that received a file is kept.
        if let Some(dir) = &self.created {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// A new directory `.fsgp-staging-PID-N` inside `dir`; never one that was there before.
fn create_staging(dir: &Path) -> Result<PathBuf> {
    for n in 0..100 {
        let staging = dir.join(format!(".fsgp-staging-{}-{n}", std::process::id()));
        match std::fs::create_dir(&staging) {
            Ok(()) => return Ok(staging),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(e).with_context(|| format!("creating {}", staging.display()));
            }
        }
    }
    bail!(
        "{}: 100 staging directories .fsgp-staging-{}-N are already there; remove them",
        dir.display(),
        std::process::id()
    )
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
    }

    #[test]
    fn only_a_regular_file_is_ever_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let err = UserFile::temporary(dir.path(), true)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("found a directory, expected a regular file"),
            "{err}"
        );
        let err = check_file_output(Path::new("/dev/null"), true)
            .unwrap_err()
            .to_string();
        assert!(err.contains("found a character device"), "{err}");
        let link = dir.path().join("null");
        std::os::unix::fs::symlink("/dev/null", &link).unwrap();
        let err = check_file_output(&link, true).unwrap_err().to_string();
        assert!(
            err.contains("found a symbolic link to a character device"),
            "{err}"
        );
        std::os::unix::fs::symlink(dir.path().join("gone"), dir.path().join("dangling")).unwrap();
        let err = check_file_output(&dir.path().join("dangling"), true)
            .unwrap_err()
            .to_string();
        assert!(err.contains("found a symbolic link to nothing"), "{err}");
    }

    #[test]
    fn a_missing_directory_is_refused_before_any_work() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing/out.toml");
        let err = check_file_output(&path, false).unwrap_err().to_string();
        assert!(err.contains("missing does not exist"), "{err}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn the_same_file_under_two_names_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.toml");
        let dotted = dir.path().join("sub/../a.toml");
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let outputs = [
            ("--spec-out", a.as_path()),
            ("--model-out", dotted.as_path()),
        ];
        let err = refuse_same_file(&outputs, &[]).unwrap_err().to_string();
        assert!(
            err.contains("--spec-out") && err.contains("name the same file"),
            "{err}"
        );
        std::fs::write(&a, "x").unwrap();
        let linked = dir.path().join("b.toml");
        std::fs::hard_link(&a, &linked).unwrap();
        let inputs = [("--train", a.as_path()), ("--test", a.as_path())];
        assert!(refuse_same_file(&[("--spec-out", &linked)], &inputs).is_err());
        let other = dir.path().join("c.toml");
        refuse_same_file(&[("--spec-out", &other)], &inputs).unwrap();
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|n| n.to_string()).collect()
    }

    /// Only the command's own names are written; the user's other files stay, and an own
    /// name already there is refused unless replaced.
    #[test]
    fn a_directory_output_writes_only_its_own_names() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("notes.txt"), "theirs").unwrap();
        std::fs::write(dir.path().join("train.txt"), "theirs").unwrap();
        let err = OwnFiles::prepare(dir.path(), names(&["train.txt", "test.txt"]), false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("train.txt exists; give --force"), "{err}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
        let out = OwnFiles::prepare(dir.path(), names(&["train.txt", "test.txt"]), true).unwrap();
        for name in ["train.txt", "test.txt"] {
            std::fs::write(out.staging().join(name), "ours").unwrap();
        }
        out.publish(&names(&["train.txt", "test.txt"])).unwrap();
        let read = |n: &str| std::fs::read_to_string(dir.path().join(n)).unwrap();
        assert_eq!(
            (read("train.txt"), read("test.txt")),
            ("ours".into(), "ours".into())
        );
        assert_eq!(read("notes.txt"), "theirs");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            3,
            "no staging left"
        );
    }

    #[test]
    fn an_unpublished_directory_output_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let out_dir = dir.path().join("new");
        let out = OwnFiles::prepare(&out_dir, names(&["README.md"]), false).unwrap();
        std::fs::write(out.staging().join("README.md"), "half").unwrap();
        drop(out);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        let file = dir.path().join("file");
        std::fs::write(&file, "theirs").unwrap();
        let err = OwnFiles::prepare(&file, names(&["README.md"]), true)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("found a regular file, expected a directory"),
            "{err}"
        );
    }
}
