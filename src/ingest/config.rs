//! What an ingest needs to know, independent of how it was asked for (flags, a spec table).

use anyhow::Result;
use serde_json::json;

use super::input::InputLayout;
use super::sink::{MAX_CHUNK_MB, MAX_CHUNK_ROWS};
use super::validation::{Carved, ValidationSplit, MAX_FOLDS};
use crate::error::InvalidOptions;
use crate::store::catalog::{LabelKind, Split};
use crate::text::parse::{LabelRules, RowRules, UnknownFeatures, MAX_IDS};
use crate::text::source::refuse_special_file;
use crate::transform::{Transform, TransformChoice};

/// MiB of uncompressed rows a chunk file holds when no row count is given (`--chunk-mb`).
pub const DEFAULT_CHUNK_MB: usize = 32;

/// Configuration of one ingest.
#[derive(Debug)]
pub struct IngestConfig {
    /// Name of the dataset in the workspace (letters, digits, '-', '_' and '.').
    pub name: String,
    /// Where the rows come from.
    pub layout: Box<dyn InputLayout>,
    /// What is done to the feature values (`--transform`; `auto` is decided from the
    /// training split, `crate::transform::decide_auto`).
    pub transform: TransformChoice,
    /// Smallest feature and label id used in the files (0 or 1).
    pub index_base: u32,
    /// Drop rows without labels (they are always counted).
    pub drop_unlabeled: bool,
    /// Skip malformed rows (counting them) and accept CRLF line ends and a missing final
    /// newline; file-level problems stay errors.
    pub lenient: bool,
    /// Rows per chunk file; `None`: sized so a chunk holds about `chunk_mb` MiB.
    pub chunk_rows: Option<usize>,
    /// Target uncompressed size of a chunk in MiB when `chunk_rows` is `None`.
    pub chunk_mb: usize,
    /// Worker threads; `None`: all cores.
    pub threads: Option<usize>,
    /// Replace an existing dataset of this name whose inputs or options differ.
    pub replace: bool,
    /// Carve a validation split out of the training rows (`--validation-fraction`).
    pub validation: Option<ValidationSplit>,
    /// `--label-kind`: the label kind asked for (LIBSVM only); None: detected by the scan.
    pub label_kind: Option<LabelKind>,
    /// `--first-label`: keep each row's first listed label only, drop rows without one, and
    /// number the distinct first labels (a multi-class dataset from a multi-label one).
    pub first_label: bool,
    /// `--features D` (LIBSVM only): D, instead of the largest feature index seen.
    pub features: Option<u32>,
    /// `--class-map train`: number the classes of the training rows only (with
    /// `--first-label`); rows of other splits whose class is not among them are kept
    /// without a label id and counted (`docs/formats.md`, "Label kinds and the class map").
    pub class_map_from_train: bool,
}

impl IngestConfig {
    /// Checks the values no type rules out: the dataset name and the chunk sizes (the
    /// command line and `pipeline run`'s spec check call it).
    pub fn validate(&self) -> Result<(), InvalidOptions> {
        let mut c = InvalidOptions::new("");
        let name_ok = !self.name.is_empty()
            && self
                .name
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || "-_.".contains(ch));
        c.check(name_ok, "name", || {
            format!(
                "'{}' is not allowed: use letters, digits, '-', '_' and '.'",
                self.name
            )
        });
        c.check(self.chunk_rows != Some(0), "chunk-rows", || {
            "must be positive".into()
        });
        c.check(self.chunk_mb != 0, "chunk-mb", || "must be positive".into());
        // A chunk is held whole in memory, several at once, before it is written.
        c.check(
            self.chunk_rows.is_none_or(|r| r <= MAX_CHUNK_ROWS),
            "chunk-rows",
            || {
                format!(
                    "must be at most {MAX_CHUNK_ROWS}, the largest automatic size \
                     (docs/formats.md, \"Limits\")"
                )
            },
        );
        c.check(self.chunk_mb <= MAX_CHUNK_MB, "chunk-mb", || {
            format!("must be at most {MAX_CHUNK_MB} (docs/formats.md, \"Limits\")")
        });
        self.check_label_options(&mut c);
        match self.validation.map(|v| v.rows) {
            Some(Carved::Fraction(f)) => c.check(
                ValidationSplit::fraction_ok(f),
                "validation-fraction",
                || {
                    format!(
                        "must be in (0, 1), not {f}: the expected share of the training rows \
                         that go to the validation split"
                    )
                },
            ),
            Some(Carved::Fold { fold, folds }) => {
                c.check(
                    ValidationSplit::fold_ok(1, folds),
                    "validation-folds",
                    || format!("must be in 2 to {MAX_FOLDS}, not {folds}"),
                );
                c.check(
                    ValidationSplit::fold_ok(fold, folds.clamp(2, MAX_FOLDS)),
                    "validation-fold",
                    || format!("must be in 1 to --validation-folds ({folds}), not {fold}"),
                );
            }
            None => {}
        }
        c.into_result()
    }

    /// `--label-kind`, `--first-label` and `--features` against the format and each other.
    fn check_label_options(&self, c: &mut InvalidOptions) {
        let libsvm = !self.layout.declares_sizes();
        let format = self.layout.format();
        c.check(libsvm || self.label_kind.is_none(), "label-kind", || {
            format!(
                "applies to --format libsvm, not to the '{format}' layout (its datasets are \
                 multi-label, or multi-class with --first-label)"
            )
        });
        c.check(libsvm || self.features.is_none(), "features", || {
            format!("applies to --format libsvm; the '{format}' layout's header declares D")
        });
        c.check(self.features != Some(0), "features", || {
            "must be positive".into()
        });
        c.check(
            self.features.is_none_or(|d| d <= MAX_IDS),
            "features",
            || {
                format!(
                    "must be at most {MAX_IDS}: D is at most 2^31 - 1 (docs/formats.md, \
                     \"Limits\")"
                )
            },
        );
        c.check(
            !self.class_map_from_train || self.first_label,
            "class-map",
            || {
                "train applies with --first-label (a multi-class dataset from a multi-label \
                 one); without it the classes of every split are numbered"
                    .into()
            },
        );
        let kind_ok =
            !self.first_label || matches!(self.label_kind, None | Some(LabelKind::Multiclass));
        c.check(kind_ok, "label-kind", || {
            format!(
                "{} cannot be combined with --first-label, which makes a multi-class dataset",
                self.label_kind.map_or("", |k| k.as_str())
            )
        });
    }

    /// Refuses input paths that exist but are not regular files (a FIFO, a device, a
    /// directory: [`refuse_special_file`]) before the workspace is touched. Missing files are
    /// left to the ingest's "cannot open": a spec's earlier stage may write them.
    pub fn check_input_files(&self) -> Result<()> {
        for (_, path) in self.layout.sources() {
            refuse_special_file(&path)?;
        }
        Ok(())
    }

    /// Whether this ingest assigns the label ids through a class map (a scan pass first).
    pub fn assigns_labels(&self) -> bool {
        self.first_label || !self.layout.declares_sizes()
    }

    /// Everything that decides the output, recorded with the run and the dataset.
    pub fn params_json(&self) -> Result<serde_json::Value> {
        let mut sources = serde_json::Map::new();
        for (role, source) in self.layout.source_params()? {
            sources.insert(role.into(), json!(source));
        }
        let mut params = json!({
            "format": self.layout.format(),
            "sources": sources,
            "split_column": self.layout.split_column(),
            // The transform asked for (the one `auto` decided is the dataset's
            // `normalization` column); the key keeps the name of the option it replaced.
            "normalization": self.transform.name(),
            "index_base": self.index_base,
            "drop_unlabeled": self.drop_unlabeled,
            "lenient": self.lenient,
            "chunk_rows": self.chunk_rows,
            "chunk_mb": self.chunk_mb,
        });
        // Only when carving: datasets ingested without it keep their parameters as before.
        if let Some(v) = &self.validation {
            for (key, value) in v.keys() {
                params[key] = value;
            }
        }
        // Likewise only when given, so that the parameters of other ingests stay as they were.
        if let Some(kind) = self.label_kind {
            params["label_kind"] = json!(kind.as_str());
        }
        if self.first_label {
            params["first_label"] = json!(true);
        }
        if let Some(d) = self.features {
            params["features"] = json!(d);
        }
        if self.class_map_from_train {
            // `--class-map train`: the option's value is the split's name.
            params["class_map"] = json!(Split::Train.name());
        }
        Ok(params)
    }

    /// Worker threads to use (at least one).
    pub fn worker_threads(&self) -> usize {
        self.threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
            .max(1)
    }

    /// How rows of a dataset with `d` features and `l` labels are checked and transformed.
    /// `labels` says how label ids are assigned (the default: as in the file); `transform`
    /// is the fitted transform of the writing pass ([`Transform::None`] for the scans).
    pub fn row_rules(&self, d: u32, l: u32, labels: LabelRules, transform: Transform) -> RowRules {
        RowRules {
            n_features: d,
            n_labels: l,
            index_base: self.index_base,
            transform,
            lenient: self.lenient,
            offers_lenient: true,
            features_from: if self.features.is_some() {
                "from --features"
            } else {
                "in the header"
            },
            labels,
            unknown_features: UnknownFeatures::Refuse,
        }
    }

    /// Parquet key-value metadata shared by every chunk of the dataset.
    /// `label_kind` is written only when the ingest assigned the label ids.
    /// `transform` is the one the rows went through.
    pub fn chunk_metadata(
        &self,
        d: u32,
        l: u32,
        label_kind: Option<LabelKind>,
        transform: TransformChoice,
    ) -> Vec<(String, String)> {
        let mut meta = vec![
            ("fsgp.dataset".into(), self.name.clone()),
            ("fsgp.n_features".into(), d.to_string()),
            ("fsgp.n_labels".into(), l.to_string()),
            ("fsgp.normalization".into(), transform.name().into()),
        ];
        if let Some(kind) = label_kind {
            meta.push(("fsgp.label_kind".into(), kind.as_str().into()));
        }
        meta
    }
}
