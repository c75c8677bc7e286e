//! The files `pipeline fit` reads (or the rows in memory a library caller gives) and the
//! ingests it runs of them: the selection data (with a validation carve), the folds, and
//! the final model's whole file. One value builds both the ingest configurations fit runs
//! and the spec's `[ingest]` table.

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::choice::choice_enum;
use crate::ingest::config::{IngestConfig, DEFAULT_CHUNK_MB};
use crate::ingest::input::InputLayout;
use crate::ingest::layouts::{Libsvm, Rows, XcSingle};
use crate::ingest::rows::MemoryRows;
use crate::ingest::validation::ValidationSplit;
use crate::transform::TransformChoice;

choice_enum! {
    /// The layout of fit's files: the Extreme Classification Repository's single file (`N D
    /// L` header), or LIBSVM.
    pub enum InputFormat("input format") {
        Xc = "xc",
        Libsvm = "libsvm",
    }
}

/// The training file (and test file) of a fit, and how they are read.
#[derive(Debug, Clone, PartialEq)]
pub struct Inputs {
    pub train: PathBuf,
    pub test: Option<PathBuf>,
    pub format: InputFormat,
    /// LIBSVM: the number of features D (None: the largest index in the files).
    pub features: Option<u32>,
    /// The training rows in memory instead of the files (`train` only names them): read
    /// as LIBSVM rows with 0-based ids, D theirs.
    pub rows: Option<MemoryRows>,
}

impl Inputs {
    /// The ingest of the files as dataset `name`, with `validation` carved out of the
    /// training rows (None: every training row trains). Checked: the name, the options, and
    /// that the files can be read.
    pub fn config(&self, name: &str, validation: Option<ValidationSplit>) -> Result<IngestConfig> {
        let (train, test) = (absolute(&self.train), self.test.as_deref().map(absolute));
        let layout: Box<dyn InputLayout> = match (&self.rows, self.format) {
            (Some(rows), _) => Box::new(Rows { rows: rows.clone() }),
            (None, InputFormat::Xc) => Box::new(XcSingle { train, test }),
            (None, InputFormat::Libsvm) => Box::new(Libsvm { train, test }),
        };
        let config = IngestConfig {
            name: name.to_string(),
            layout,
            transform: TransformChoice::Auto,
            // LIBSVM's labels are class values and its feature indices start at 1 (rows in
            // memory are LIBSVM's: their text would start at 1, their pairs are 0-based).
            index_base: match (&self.rows, self.format) {
                (Some(_), _) | (None, InputFormat::Libsvm) => 1,
                (None, InputFormat::Xc) => 0,
            },
            drop_unlabeled: false,
            lenient: false,
            chunk_rows: None,
            chunk_mb: DEFAULT_CHUNK_MB,
            threads: None,
            replace: false,
            validation,
            label_kind: None,
            first_label: false,
            features: self
                .features
                .or(self.rows.as_ref().map(MemoryRows::n_features)),
            class_map_from_train: false,
        };
        config.validate()?;
        config.check_input_files()?;
        Ok(config)
    }

    /// The spec's `[ingest]` table of the ingest of dataset `name` with `validation` carved
    /// out (the final model's: none, unless the probe on the selection data is the final
    /// model), as [`Inputs::config`] builds it. Rows in memory are recorded by their
    /// checksum (`format = "rows"`): such a spec documents the fit, `pipeline run` cannot
    /// run it.
    pub fn spec_pairs(
        &self,
        name: &str,
        validation: Option<ValidationSplit>,
    ) -> Vec<(&'static str, String)> {
        let carve = validation.iter().flat_map(ValidationSplit::keys);
        let carve = carve.map(|(k, v)| (k, v.to_string()));
        let mut o = self.files_pairs(name);
        o.extend(carve);
        o
    }

    /// [`Inputs::spec_pairs`] but the carve.
    fn files_pairs(&self, name: &str) -> Vec<(&'static str, String)> {
        if let Some(rows) = &self.rows {
            return vec![
                ("name", name.to_string()),
                ("format", "rows".to_string()),
                ("train", rows.describe()),
                ("features", rows.n_features().to_string()),
            ];
        }
        let shown = |p: &Path| absolute(p).display().to_string();
        let mut o = vec![
            ("name", name.to_string()),
            ("format", self.format.name().to_string()),
            ("train", shown(&self.train)),
        ];
        if let Some(test) = &self.test {
            o.push(("test", shown(test)));
        }
        if let Some(d) = self.features {
            o.push(("features", d.to_string()));
        }
        o
    }
}

/// `p` made absolute (as it is when it exists), so the spec runs from anywhere.
fn absolute(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}
