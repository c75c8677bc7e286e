//! The catalog's vocabulary as types: which stage ran, how it ended, what kind of file it
//! registered. The database stores them as text (`'svd'`, `'ok'`, `'kxx'`) so that it stays
//! readable with `sqlite3`; the Rust API never compares those strings.

use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ToSqlOutput, ValueRef};

use crate::choice::choice_enum;

/// Declares a text-backed enum: a [`choice_enum!`] (names, `Display`, `FromStr`, serde)
/// whose names are also its SQLite text, with `as_str` for the catalog's queries.
macro_rules! text_enum {
    ($(#[$meta:meta])* $name:ident ($what:literal) {
        $($(#[$vmeta:meta])* $variant:ident = $text:literal),+ $(,)?
    }) => {
        choice_enum! {
            $(#[$meta])*
            pub enum $name($what) {
                $($(#[$vmeta])* $variant = $text),+
            }
        }

        impl $name {
            /// The text stored in the catalog.
            pub fn as_str(self) -> &'static str {
                self.name()
            }
        }

        impl ToSql for $name {
            fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
                Ok(ToSqlOutput::from(self.as_str()))
            }
        }

        impl FromSql for $name {
            fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
                value
                    .as_str()?
                    .parse()
                    .map_err(|e: String| FromSqlError::Other(e.into()))
            }
        }
    };
}

text_enum! {
    /// A pipeline stage that records runs in the catalog.
    StageKind("stage") {
        Ingest = "ingest",
        Svd = "svd",
        Train = "train",
        Predict = "predict",
        Evaluate = "evaluate",
    }
}

impl StageKind {
    /// The top-level workspace directory holding this stage's published outputs.
    pub fn output_dir(self) -> &'static str {
        match self {
            StageKind::Ingest => "datasets",
            StageKind::Svd => "svd",
            StageKind::Train => "train",
            StageKind::Predict => "predictions",
            StageKind::Evaluate => "evaluations",
        }
    }
}

text_enum! {
    /// How a stage run stands.
    RunStatus("run status") {
        Running = "running",
        Ok = "ok",
        Failed = "failed",
        /// The process died without saying so (found by the next `Workspace::open`).
        Interrupted = "interrupted",
    }
}

text_enum! {
    /// What a registered file holds (`docs/formats.md` describes each).
    ArtifactKind("artifact kind") {
        /// A Parquet CSR chunk of a dataset split.
        Chunk = "chunk",
        /// The per-feature map of a dataset's transform (ingest `--transform standardize`
        /// or `scale`).
        FeatureTransform = "feature_transform",
        /// X̃ [R×D] (svd).
        Basis = "basis",
        /// σ_1..σ_R (svd).
        SingularValues = "singular_values",
        /// K_XX̃ [N×R] (svd).
        Kxx = "kxx",
        /// ‖x_i‖² [N] (svd).
        SqNorms = "sq_norms",
        /// A's initialisation [M×R] (svd).
        AInit = "a_init",
        /// Top-k labels of a split (predict).
        Predictions = "predictions",
        /// Metrics JSON (evaluate).
        Metrics = "metrics",
    }
}

text_enum! {
    /// What labels mean: of a dataset (its recorded label kind, `docs/formats.md`, "Label
    /// kinds"), of a training run (`train --task`) and of an evaluation (`evaluate --task`).
    /// `binary` is L = 1, label id 0 the positive class, a negative row without a label;
    /// `multiclass` exactly one label per row; `multilabel` any number per row (the Extreme
    /// Classification Repository's datasets, every dataset ingested before label kinds were
    /// recorded, and every run before tasks were).
    #[derive(Default)]
    Task("task") {
        #[default]
        Multilabel = "multilabel",
        Binary = "binary",
        Multiclass = "multiclass",
    }
}

text_enum! {
    /// A split of a dataset: the rows a stage reads (`--split`, `--eval-split`), the
    /// directory and catalog rows of its chunks, the `fsgp.split` footer of chunk and
    /// predictions files. `validation` exists only when ingest carves it out of the training
    /// rows (`--validation-fraction`). Declared in the order the catalog lists a dataset's
    /// splits (and `Ord` sorts them).
    #[derive(PartialOrd, Ord)]
    Split("split") {
        Train = "train",
        Validation = "validation",
        Test = "test",
    }
}

/// A dataset's label kind is a [`Task`]: the one enum for the concept.
pub type LabelKind = Task;

impl Task {
    /// Whether this is the default (left out of a configuration's or params' JSON).
    pub fn is_multilabel(&self) -> bool {
        *self == Task::Multilabel
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_round_trips_through_its_text() {
        for &k in StageKind::ALL {
            assert_eq!(k.as_str().parse::<StageKind>(), Ok(k));
        }
        for &s in RunStatus::ALL {
            assert_eq!(s.as_str().parse::<RunStatus>(), Ok(s));
        }
        for &k in Task::ALL {
            assert_eq!(k.as_str().parse::<Task>(), Ok(k));
            assert_eq!(serde_json::to_value(k).unwrap(), k.as_str());
            assert_eq!(
                serde_json::from_value::<Task>(k.as_str().into()).unwrap(),
                k
            );
        }
        assert!(serde_json::from_value::<Task>("regression".into()).is_err());
        for &a in ArtifactKind::ALL {
            assert_eq!(a.as_str().parse::<ArtifactKind>(), Ok(a));
            assert_eq!(serde_json::to_value(a).unwrap(), a.as_str());
        }
        for &split in Split::ALL {
            assert_eq!(split.name().parse::<Split>(), Ok(split));
            assert_eq!(split.to_string(), split.name());
            assert_eq!(serde_json::to_value(split).unwrap(), split.name());
            assert_eq!(
                serde_json::from_value::<Split>(split.name().into()).unwrap(),
                split
            );
        }
        // The texts the catalog, the file footers and the params JSON hold.
        assert_eq!(Split::NAMES, ["train", "validation", "test"]);
        assert!(Split::Train < Split::Validation && Split::Validation < Split::Test);
        let e = "tset".parse::<Split>().unwrap_err();
        assert_eq!(
            e,
            "unknown split 'tset' (expected one of: train, validation, test)"
        );
        let e = "svdd".parse::<StageKind>().unwrap_err();
        assert!(e.contains("expected one of: ingest, svd"), "{e}");
    }
}
