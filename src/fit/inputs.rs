//! The files `pipeline fit` reads and the ingests it runs of them: the selection data (with
//! a validation carve), the folds, and the final model's whole file. One value builds both
//! the ingest configurations fit runs and the spec's `[ingest]` table.

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::choice::choice_enum;
use crate::ingest::config::{IngestConfig, DEFAULT_CHUNK_MB};
use crate::ingest::layouts::{Libsvm, XcSingle};
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
}

impl Inputs {
    /// The ingest of the files as dataset `name`, with `validation` carved out of the
    /// training rows (None: every training row trains). Checked: the name, the options, and
    /// that the files can be read.
    pub fn config(&self, name: &str, validation: Option<ValidationSplit>) -> Result<IngestConfig> {
        let (train, test) = (absolute(&self.train), self.test.as_deref().map(absolute));
        let config = IngestConfig {
            name: name.to_string(),
            layout: match self.format {
                InputFormat::Xc => Box::new(XcSingle { train, test }),
                InputFormat::Libsvm => Box::new(Libsvm { train, test }),
            },
            transform: TransformChoice::Auto,
            // LIBSVM's labels are class values and its feature indices start at 1.
            index_base: match self.format {
                InputFormat::Xc => 0,
                InputFormat::Libsvm => 1,
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
            features: self.features,
            class_map_from_train: false,
        };
        config.validate()?;
        config.check_input_files()?;
        Ok(config)
    }

    /// The spec's `[ingest]` table of the final model's ingest of dataset `name` (no carve),
    /// as [`Inputs::config`] builds it.
    pub fn spec_pairs(&self, name: &str) -> Vec<(&'static str, String)> {
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
