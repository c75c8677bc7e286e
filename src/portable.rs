//! A model file's contents as scoring uses them: what a new row needs without the
//! workspace. [`PortableModel::open`] reads a model file (`store::model_file`, written by
//! `pipeline export`) and types its parts: the run's [`TrainConfig`], the dataset's
//! [`Transform`] with its statistics, and X̃ as the memory map `scoring::model_inputs` reads,
//! so a row is transformed, projected and scored exactly as the workspace's run would.
//!
//! `predict --model` and `serve` rank rows with [`PortableModel::scoring_model`] through
//! `scoring::ranking::with_ranking`, as `predict --run` ranks them with the run's files.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::choice::Choice;
use crate::model::params::Params;
use crate::scoring::ranking::Model;
use crate::store::classes::ClassMap;
use crate::store::model_file::{DatasetFacts, ModelFile, Provenance};
use crate::store::npy::NpyMap;
use crate::store::scaling::StoredScaling;
use crate::trained::TrainConfig;
use crate::transform::{FeatureScaling, Transform, TransformChoice};

/// A model file, read, checked and typed.
pub struct PortableModel {
    /// The file it was read from (messages).
    pub path: PathBuf,
    /// Everything the file holds, as stored.
    pub file: ModelFile,
    /// The run's configuration (kernel, inducing inputs, likelihood, task, seed, …).
    pub config: TrainConfig,
    /// The dataset's transform, with its fitted statistics when it has them: what a new
    /// row's values go through before scoring (`Transform::apply`).
    pub transform: Transform,
    /// X̃ [R×D] f32 in memory, as `basis.npy` ([`ModelFile::basis_map`]; 0×D when the model
    /// never reads it).
    pub basis: NpyMap,
}

impl PortableModel {
    /// Reads `path` ([`ModelFile::read`]: refused by name when damaged, truncated, of
    /// another format or a newer version) and types its parts.
    pub fn open(path: &Path) -> Result<Self> {
        Self::from_file(path, ModelFile::read(path)?)
    }

    /// Types the parts of `file`, read from `path`.
    pub fn from_file(path: &Path, file: ModelFile) -> Result<Self> {
        let p = path.display();
        let config: TrainConfig = serde_json::from_value(file.config.clone())
            .with_context(|| format!("{p}: unreadable configuration (fsgp.config)"))?;
        let transform = recorded_transform(&file.dataset, file.scaling.as_ref())
            .with_context(|| format!("{p}: unusable transform"))?;
        let basis = file.basis_map(path)?;
        Ok(PortableModel {
            path: path.to_path_buf(),
            file,
            config,
            transform,
            basis,
        })
    }

    /// The checkpoint's parameters.
    pub fn params(&self) -> &Params {
        &self.file.params
    }

    /// D: a new row's feature ids (after the index base) must be below it.
    pub fn n_features(&self) -> u64 {
        self.file.dataset.n_features
    }

    /// The dataset's facts (format, index base, D, L, label kind, class map).
    pub fn dataset(&self) -> &DatasetFacts {
        &self.file.dataset
    }

    /// Label id → original label, when ingest assigned the ids.
    pub fn class_map(&self) -> Option<&ClassMap> {
        self.file.dataset.class_map.as_ref()
    }

    pub fn provenance(&self) -> &Provenance {
        &self.file.provenance
    }

    /// The model as [`crate::scoring::ranking::with_ranking`] ranks rows with it.
    pub fn scoring_model(&self) -> Model<'_> {
        Model {
            config: &self.config,
            n_features: self.n_features(),
            params: self.params(),
            basis: &self.basis,
        }
    }
}

/// The resolved transform a dataset's facts name, with its stored statistics for the two
/// that need them: how a new row's values are transformed, whether the dataset comes from
/// a model file or from the workspace (`predict --input --run`).
pub fn recorded_transform(
    facts: &DatasetFacts,
    scaling: Option<&StoredScaling>,
) -> Result<Transform> {
    let choice = TransformChoice::parse_name(&facts.transform).map_err(|e| {
        anyhow::anyhow!(
            "dataset '{}': its transform '{}' is not one this build knows ({e})",
            facts.name,
            facts.transform
        )
    })?;
    Transform::from_recorded(choice, || {
        let s = scaling
            .with_context(|| format!("transform '{}' without its statistics", facts.transform))?;
        Ok(FeatureScaling {
            ids: s.ids.clone(),
            shift: s.shift.clone(),
            scale: s.scale.clone(),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::catalog::LabelKind;

    /// The model file's layer names the transforms with a stored map itself (it is below
    /// the transforms'): the two lists agree.
    #[test]
    fn model_files_carry_the_map_of_every_transform_that_has_one() {
        for &choice in TransformChoice::ALL {
            if choice == TransformChoice::Auto {
                continue;
            }
            let facts = DatasetFacts {
                name: "d".into(),
                format: "libsvm".into(),
                index_base: 1,
                n_features: 3,
                n_labels: 2,
                label_kind: LabelKind::Multilabel,
                class_map: None,
                first_label: false,
                transform: choice.name().to_string(),
                transform_reason: None,
            };
            assert_eq!(
                facts.has_statistics(),
                choice.needs_statistics(),
                "{choice}"
            );
        }
    }
}
