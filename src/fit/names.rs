//! The names `pipeline fit` gives what it makes when the user names none: its datasets
//! (from the training file's name, made unique) and its spec (a new file inside the
//! workspace). Public benchmark files are mostly `train.txt`: a second fit of another
//! `train.txt` from the same directory takes names of its own instead of being refused,
//! and a fit of the same file again takes the same names, so its datasets are reused.

use std::fs::OpenOptions;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::folds::{fold_config, fold_count};
use super::inputs::Inputs;
use crate::ingest::config::IngestConfig;
use crate::ingest::name_is_free_or_same;
use crate::ingest::validation::ValidationSplit;
use crate::store::workspace::Workspace;

/// At most this many `STEM-K` names are tried before fit asks for `--name`.
const MAX_NAME_TRIES: u32 = 1000;

/// The workspace folder of the specs fit writes when no `--spec-out` is given.
pub const SPEC_DIR: &str = "fits";

/// The dataset name when `--name` is not given: the training file's stem (`train.txt.gz`
/// → `train`), or `STEM-K` for the first K ≥ 2 whose datasets — the selection data
/// `NAME-select`, the final `NAME`, and the folds `NAME-foldI` — are each free or hold this
/// same file with these options.
pub fn free_name(ws: &Workspace, inputs: &Inputs, fraction: f64, seed: u64) -> Result<String> {
    let stem = default_name(&inputs.train);
    for k in 1..=MAX_NAME_TRIES {
        let name = match k {
            1 => stem.clone(),
            k => format!("{stem}-{k}"),
        };
        if name_is_ours(ws, inputs, &name, fraction, seed)? {
            return Ok(name);
        }
    }
    bail!(
        "{stem}, {stem}-2 … {stem}-{MAX_NAME_TRIES} are all datasets of other files in this \
         workspace; give --name"
    )
}

/// Whether every dataset a fit named `name` makes is free or already this fit's.
fn name_is_ours(
    ws: &Workspace,
    inputs: &Inputs,
    name: &str,
    fraction: f64,
    seed: u64,
) -> Result<bool> {
    let k = fold_count(fraction);
    let mut configs = vec![
        select_config(inputs, name, fraction, seed)?,
        inputs.config(name, None)?,
    ];
    for fold in 1..=k {
        configs.push(fold_config(inputs, name, fold, k, seed)?);
    }
    for config in &configs {
        if !name_is_free_or_same(ws, config)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The selection data of dataset `name`: `NAME-select`, the training file with a share
/// `fraction` of its rows carved out for validation by `seed`.
pub(super) fn select_config(
    inputs: &Inputs,
    name: &str,
    fraction: f64,
    seed: u64,
) -> Result<IngestConfig> {
    inputs.config(&select_name(name), Some(select_carve(fraction, seed)))
}

/// The selection dataset's validation carve: `fraction` of the training rows by `seed`.
pub(super) fn select_carve(fraction: f64, seed: u64) -> ValidationSplit {
    ValidationSplit::fraction(fraction, seed)
}

/// The selection dataset's name of dataset `name`.
pub fn select_name(name: &str) -> String {
    format!("{name}-select")
}

/// The dataset name from the training file's name (`train.txt.gz` → `train`).
pub fn default_name(path: &Path) -> String {
    let file = path.file_name().and_then(|f| f.to_str()).unwrap_or("data");
    let stem: String = file
        .split('.')
        .next()
        .unwrap_or("data")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || "-_".contains(*c))
        .collect();
    if stem.is_empty() {
        "data".into()
    } else {
        stem
    }
}

/// A spec file fit has made its own: created empty (exclusively, so that a fit running at
/// the same time takes another) and removed again if the fit ends before writing it.
pub struct ReservedSpec {
    pub path: PathBuf,
    written: bool,
}

impl ReservedSpec {
    /// Creates `fits/NAME-fit.toml` in the workspace, or `NAME-fit-K.toml` for the first K
    /// ≥ 2 no other fit took. `fits` must be a directory of the workspace's own, not a
    /// link.
    pub fn create(ws: &Workspace, name: &str) -> Result<ReservedSpec> {
        let dir = ws.root().join(SPEC_DIR);
        match std::fs::symlink_metadata(&dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => bail!(
                "{}: found something other than a directory, expected the folder of fit's \
                 specs; move it away or give --spec-out",
                dir.display()
            ),
            Err(e) if e.kind() == ErrorKind::NotFound => std::fs::create_dir(&dir)
                .with_context(|| format!("{}: cannot create the folder", dir.display()))?,
            Err(e) => return Err(e).with_context(|| format!("{}", dir.display())),
        }
        for k in 1..=MAX_NAME_TRIES {
            let file = match k {
                1 => format!("{name}-fit.toml"),
                k => format!("{name}-fit-{k}.toml"),
            };
            let path = dir.join(file);
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(_) => {
                    return Ok(ReservedSpec {
                        path,
                        written: false,
                    })
                }
                Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e).with_context(|| format!("{}", path.display())),
            }
        }
        bail!(
            "{}: {MAX_NAME_TRIES} specs of {name} already; give --spec-out",
            dir.display()
        )
    }

    /// The spec was written: the file stays.
    pub fn keep(&mut self) {
        self.written = true;
    }
}

impl Drop for ReservedSpec {
    fn drop(&mut self) {
        // Only the empty file this fit created: anything written there since is kept.
        let empty =
            std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.is_file() && m.len() == 0);
        if !self.written && empty {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_name_is_the_file_name_up_to_its_first_dot() {
        assert_eq!(default_name(Path::new("/data/train.txt.gz")), "train");
        assert_eq!(default_name(Path::new("my set.svm")), "myset");
        assert_eq!(default_name(Path::new(".hidden")), "data");
    }
}
