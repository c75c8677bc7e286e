//! Model files (`pipeline export`): one self-contained, versioned file holding everything
//! scoring a new row needs without the workspace (`docs/formats.md`, "Model files").
//!
//! The container is the checkpoints' tensor file (`tensors`): zstd Parquet, one row per
//! tensor, with key-value metadata for the rest.
//!
//! | part         | where                                                  | holds |
//! |--------------|--------------------------------------------------------|-------|
//! | `config`     | `fsgp.config`                                          | the run's `TrainConfig` as JSON |
//! | `dataset`    | `fsgp.dataset`                                         | [`DatasetFacts`]: name, format, index base, D, L, label kind, class map, transform |
//! | `provenance` | `fsgp.provenance`                                      | [`Provenance`]: dataset checksum, runs, step, checkpoint checksum, fsgp version |
//! | `params`     | tensors `A`, `mu`, … (a checkpoint's, without Adam's)  | the model's parameters |
//! | `basis`      | tensor `basis` [R×D]                                   | X̃, when the model reads it |
//! | `transform`  | `fsgp.transform` and tensors `transform_feature`, `transform_shift`, `transform_scale` [1×n] | the feature transform's statistics, when it has them |
//!
//! `fsgp.parts` maps each part present to the xxh3-64 of its content (JSON parts: the text;
//! tensor parts: each tensor's name, shape and values' bytes in order) and `fsgp.checksum`
//! is the xxh3-64 of that text, so any damaged part is named when the file is read.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;

use anyhow::{bail, ensure, Context, Result};
use ndarray::Array2;
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::Xxh3;

use super::catalog::{DatasetRow, LabelKind};
use super::checkpoint::{param_tensors, read_params};
use super::chunks::WrittenFile;
use super::classes::ClassMap;
use super::integrity::checksum_of;
use super::npy::NpyMap;
use super::scaling::StoredScaling;
use super::tensors::{write_tensors, Tensor, TensorFile, Tensors};
use super::user_file::UserFile;
use crate::model::params::Params;

/// Value of `fsgp.format` in the model files this build writes and reads.
pub const MODEL_FORMAT: &str = "fsgp-model/1";

/// The version in [`MODEL_FORMAT`]; a file of a higher one is refused as newer.
const MODEL_VERSION: u32 = 1;

/// The prefix of every model file's format, whatever its version.
const MODEL_FAMILY: &str = "fsgp-model/";

/// What the file is, in messages.
const WHAT: &str = "model file";

/// The tensor of X̃ [R×D].
const BASIS: &str = "basis";

/// The tensors of the feature transform's statistics [1×n each].
const TRANSFORM_TENSORS: [&str; 3] = ["transform_feature", "transform_shift", "transform_scale"];

/// The parts every model file has.
const REQUIRED: [&str; 4] = ["config", "dataset", "provenance", "params"];

/// What a new row's parsing and placing needs of the dataset the model was trained on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DatasetFacts {
    pub name: String,
    /// The input layout ingest read: `xc`, `xc-split`, `bow` or `libsvm`.
    pub format: String,
    /// The feature ids' base in the input (0 or 1).
    pub index_base: u32,
    /// D.
    pub n_features: u64,
    /// L (K classes of a multi-class dataset; 1 for a binary one).
    pub n_labels: u64,
    pub label_kind: LabelKind,
    /// Label id → original label, when ingest assigned the ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class_map: Option<ClassMap>,
    /// XML-repository rows whose first label is the class (`ingest --first-label`): a new
    /// row's first label goes through the class map.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub first_label: bool,
    /// The transform the values went through (`none`, `l2`, `standardize`, `scale`, `tfidf`).
    pub transform: String,
    /// Why `--transform auto` chose it (None: asked for by name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transform_reason: Option<String>,
}

impl DatasetFacts {
    /// The facts of a dataset as the catalog records them.
    pub fn of(d: &DatasetRow) -> Self {
        DatasetFacts {
            name: d.name.clone(),
            format: d.format.clone(),
            index_base: d.index_base,
            n_features: d.n_features,
            n_labels: d.n_labels,
            label_kind: d.label_kind(),
            class_map: d.class_map.clone(),
            first_label: d.params.get("first_label").and_then(|v| v.as_bool()) == Some(true),
            transform: d.normalization.clone(),
            transform_reason: d.transform_reason.clone(),
        }
    }

    /// Whether the transform has per-feature statistics (a `transform.parquet`): the
    /// transforms whose `TransformChoice::needs_statistics` holds, by name (this layer
    /// is below the transforms').
    pub fn has_statistics(&self) -> bool {
        matches!(self.transform.as_str(), "standardize" | "scale" | "tfidf")
    }
}

/// Where a model file's numbers come from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Provenance {
    /// The checksum of the ingest the model was trained on (the catalog's).
    pub dataset_checksum: String,
    pub train_run: i64,
    pub checkpoint_step: u64,
    /// The checkpoint file's xxh3-64, as the catalog registered it.
    pub checkpoint_checksum: String,
    /// The svd run whose basis (and A's initialisation) the run used.
    pub svd_run: i64,
    /// The fsgp version that wrote the file (`CARGO_PKG_VERSION`).
    pub fsgp_version: String,
}

/// Everything a model file holds.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelFile {
    /// The run's `TrainConfig` as JSON (the one its checkpoint embeds).
    pub config: serde_json::Value,
    pub dataset: DatasetFacts,
    pub provenance: Provenance,
    /// The checkpoint's parameters (Adam's state left out: prediction does not need it).
    pub params: Params,
    /// X̃ [R×D] f32 as `basis.npy` holds it; None when the model never reads it (inducing
    /// inputs in input space without ARD over the features).
    pub basis: Option<Array2<f32>>,
    /// The transform's statistics, when it has them (`standardize`, `scale`).
    pub scaling: Option<StoredScaling>,
}

/// The fsgp.transform part's JSON: the statistics' scalars (the vectors are tensors).
#[derive(Serialize, Deserialize)]
struct TransformFacts {
    transform: String,
    reason: String,
    training_rows: u64,
}

/// Whether a model of configuration `config` with `params` reads X̃: always, unless its
/// inducing inputs are in input space (the identity basis) and it has no ARD over the
/// features (whose weighted view projects onto X̃ W). Mirrors `InducingInputs::in_features`
/// over the stored names, which are part of the checkpoint format.
pub fn reads_basis(config: &serde_json::Value, params: &Params) -> bool {
    let inputs = config.get("inducing_inputs").and_then(|v| v.as_str());
    let in_features = matches!(inputs, Some("free" | "fixed-rows" | "axes"));
    !in_features || !params.kernel.log_features.is_empty()
}

/// xxh3-64 of tensors: each one's name, a 0 byte, rows and cols (u64 LE) and its values
/// (f64 LE), in order, after `prefix` (a JSON part's text, or nothing).
fn tensors_checksum(prefix: &str, tensors: &[&Tensor]) -> String {
    let mut h = Xxh3::new();
    h.update(prefix.as_bytes());
    for t in tensors {
        h.update(t.name.as_bytes());
        h.update(&[0]);
        h.update(&(t.rows as u64).to_le_bytes());
        h.update(&(t.cols as u64).to_le_bytes());
        for v in t.values.iter() {
            h.update(&v.to_le_bytes());
        }
    }
    format!("{:016x}", h.digest())
}

/// The part a tensor belongs to.
fn part_of(tensor: &str) -> &'static str {
    match tensor {
        BASIS => "basis",
        t if TRANSFORM_TENSORS.contains(&t) => "transform",
        _ => "params",
    }
}

/// The file's content as written: tensors and key-value pairs (checksums included).
struct Encoded<'a> {
    tensors: Vec<Tensor<'a>>,
    meta: Vec<(String, String)>,
}

impl ModelFile {
    fn encode(&self) -> Result<Encoded<'_>> {
        let mut tensors = param_tensors(&self.params);
        if let Some(b) = &self.basis {
            let values = b.iter().map(|&v| f64::from(v)).collect();
            tensors.push(Tensor::owned(BASIS, b.nrows(), b.ncols(), values));
        }
        let mut meta = vec![
            ("fsgp.format".to_string(), MODEL_FORMAT.to_string()),
            ("fsgp.config".to_string(), self.config.to_string()),
            ("fsgp.dataset".to_string(), json(&self.dataset)),
            ("fsgp.provenance".to_string(), json(&self.provenance)),
        ];
        if let Some(s) = &self.scaling {
            let ids: Vec<f64> = s.ids.iter().map(|&i| f64::from(i)).collect();
            tensors.push(Tensor::owned(TRANSFORM_TENSORS[0], 1, ids.len(), ids));
            tensors.push(Tensor::vector(TRANSFORM_TENSORS[1], &s.shift));
            tensors.push(Tensor::vector(TRANSFORM_TENSORS[2], &s.scale));
            let facts = TransformFacts {
                transform: s.transform.clone(),
                reason: s.reason.clone(),
                training_rows: s.training_rows,
            };
            meta.push(("fsgp.transform".to_string(), json(&facts)));
        }
        let parts = part_checksums(&meta, &tensors);
        let parts_text = serde_json::to_string(&parts)?;
        meta.push((
            "fsgp.checksum".to_string(),
            checksum_of(parts_text.as_bytes()),
        ));
        meta.push(("fsgp.parts".to_string(), parts_text));
        Ok(Encoded { tensors, meta })
    }

    /// Writes the file at `path`: to a temporary file beside it, fsynced, then moved into
    /// place, so `path` is either absent or whole. An existing `path` is refused unless
    /// `replace`. Returns the file's size and checksum.
    pub fn write(&self, path: &Path, replace: bool) -> Result<WrittenFile> {
        let file = UserFile::temporary(path, replace)?;
        let encoded = self.encode()?;
        let written = write_tensors(file.tmp_path(), &encoded.tensors, &encoded.meta)?;
        file.publish()?;
        Ok(written)
    }

    /// Reads and checks a model file: refused, naming `path` and what is wrong, when it is
    /// not Parquet or truncated, of another or a newer format, lacks a part, or a part's
    /// checksum does not match its content (damaged).
    pub fn read(path: &Path) -> Result<ModelFile> {
        let file =
            File::open(path).with_context(|| format!("opening model file {}", path.display()))?;
        let file = TensorFile::open(file, path).map_err(|e| {
            anyhow::anyhow!(
                "{}: not a readable model file (not Parquet, or truncated): {e:#}",
                path.display()
            )
        })?;
        check_format(file.key("fsgp.format"), path)?;
        let parts = listed_parts(&file, path)?;
        let meta = file.meta.clone();
        let tensors = file.tensors(path, WHAT).map_err(|e| {
            anyhow::anyhow!(
                "{}: damaged: its tensors do not decode: {e:#}",
                path.display()
            )
        })?;
        check_parts(&parts, &meta, &tensors, path)?;
        decode(&meta, &tensors, path)
    }

    /// X̃ as the memory map scoring reads (`scoring::model_inputs`), the bytes of the svd
    /// run's `basis.npy` array; a 0×D matrix when the file has no basis (the model never
    /// reads it). `path` names the file in messages.
    pub fn basis_map(&self, path: &Path) -> Result<NpyMap> {
        let empty = Array2::<f32>::zeros((0, self.dataset.n_features as usize));
        NpyMap::in_memory(path, self.basis.as_ref().unwrap_or(&empty).view())
    }
}

/// A part's JSON text.
fn json<T: Serialize>(part: &T) -> String {
    serde_json::to_string(part).expect("a model file part serialises")
}

/// Part name → checksum of its content (see the module's documentation).
fn part_checksums(meta: &[(String, String)], tensors: &[Tensor]) -> BTreeMap<String, String> {
    let mut parts = BTreeMap::new();
    for (key, part) in [
        ("fsgp.config", "config"),
        ("fsgp.dataset", "dataset"),
        ("fsgp.provenance", "provenance"),
    ] {
        if let Some((_, text)) = meta.iter().find(|(k, _)| k == key) {
            parts.insert(part.to_string(), checksum_of(text.as_bytes()));
        }
    }
    for part in ["params", "basis", "transform"] {
        let of_part: Vec<&Tensor> = tensors
            .iter()
            .filter(|t| part_of(&t.name) == part)
            .collect();
        if of_part.is_empty() {
            continue;
        }
        let prefix = match part {
            "transform" => meta
                .iter()
                .find(|(k, _)| k == "fsgp.transform")
                .map_or("", |(_, v)| v.as_str()),
            _ => "",
        };
        parts.insert(part.to_string(), tensors_checksum(prefix, &of_part));
    }
    parts
}

/// Refuses a format other than [`MODEL_FORMAT`], saying whether it is a newer model file.
fn check_format(format: Option<&str>, path: &Path) -> Result<()> {
    let p = path.display();
    let Some(format) = format else {
        bail!("{p}: not an fsgp model file (its metadata has no fsgp.format)");
    };
    if format == MODEL_FORMAT {
        return Ok(());
    }
    match format.strip_prefix(MODEL_FAMILY).map(str::parse::<u32>) {
        Some(Ok(v)) if v > MODEL_VERSION => bail!(
            "{p}: {format}: written by a newer fsgp; this one reads {MODEL_FORMAT} (use a \
             newer fsgp, or export the model again with this one)"
        ),
        _ => bail!("{p}: format '{format}' is not an fsgp model file (expected {MODEL_FORMAT})"),
    }
}

/// The parts and checksums the file lists, checked against `fsgp.checksum`.
fn listed_parts(file: &TensorFile<File>, path: &Path) -> Result<BTreeMap<String, String>> {
    let p = path.display();
    let text = file
        .key("fsgp.parts")
        .with_context(|| format!("{p}: missing part list (fsgp.parts)"))?;
    let stored = file
        .key("fsgp.checksum")
        .with_context(|| format!("{p}: missing checksum (fsgp.checksum)"))?;
    let found = checksum_of(text.as_bytes());
    ensure!(
        found == stored,
        "{p}: damaged: its list of parts does not match its checksum (stored {stored}, found \
         {found})"
    );
    serde_json::from_str(text).with_context(|| format!("{p}: damaged: fsgp.parts is not JSON"))
}

/// Every required part is listed, every listed part present, and each part's content has
/// the listed checksum.
fn check_parts(
    listed: &BTreeMap<String, String>,
    meta: &[(String, String)],
    tensors: &Tensors,
    path: &Path,
) -> Result<()> {
    let p = path.display();
    let found = part_checksums(meta, &tensors.found);
    for part in REQUIRED
        .iter()
        .copied()
        .chain(listed.keys().map(String::as_str))
    {
        let (Some(stored), Some(now)) = (listed.get(part), found.get(part)) else {
            bail!("{p}: missing part '{part}'");
        };
        ensure!(
            stored == now,
            "{p}: damaged: part '{part}' does not match its checksum (stored {stored}, found \
             {now})"
        );
    }
    if let Some(extra) = found.keys().find(|k| !listed.contains_key(*k)) {
        bail!("{p}: damaged: part '{extra}' is not in the file's list of parts");
    }
    Ok(())
}

/// The checked parts, decoded.
fn decode(meta: &[(String, String)], tensors: &Tensors, path: &Path) -> Result<ModelFile> {
    let p = path.display();
    let text = |key: &str| {
        meta.iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .with_context(|| format!("{p}: missing {key}"))
    };
    let config: serde_json::Value = serde_json::from_str(text("fsgp.config")?)
        .with_context(|| format!("{p}: fsgp.config is not JSON"))?;
    let dataset: DatasetFacts = serde_json::from_str(text("fsgp.dataset")?)
        .with_context(|| format!("{p}: unreadable fsgp.dataset"))?;
    let provenance: Provenance = serde_json::from_str(text("fsgp.provenance")?)
        .with_context(|| format!("{p}: unreadable fsgp.provenance"))?;
    let params = read_params(tensors, &config)?;
    let basis = match tensors.has(BASIS) {
        true => Some(decode_basis(tensors.get(BASIS)?, dataset.n_features, path)?),
        false => None,
    };
    if basis.is_none() && reads_basis(&config, &params) {
        bail!("{p}: missing part 'basis' (the model reads X̃: its inducing inputs are in the svd subspace, or it weighs the features)");
    }
    let scaling = match dataset.has_statistics() {
        true => Some(decode_scaling(text("fsgp.transform")?, tensors, path)?),
        false => None,
    };
    if scaling.is_none() && tensors.has(TRANSFORM_TENSORS[0]) {
        bail!(
            "{p}: has transform statistics, but its dataset's transform '{}' has none",
            dataset.transform
        );
    }
    Ok(ModelFile {
        config,
        dataset,
        provenance,
        params,
        basis,
        scaling,
    })
}

/// X̃ [R×D] from its tensor: D columns, entries that are f32 values.
fn decode_basis(t: &Tensor, n_features: u64, path: &Path) -> Result<Array2<f32>> {
    ensure!(
        t.cols as u64 == n_features,
        "{}: basis has {} columns, the dataset {n_features} features",
        path.display(),
        t.cols
    );
    let values: Vec<f32> = t.values.iter().map(|&v| v as f32).collect();
    Ok(Array2::from_shape_vec((t.rows, t.cols), values)?)
}

/// The transform's statistics from `fsgp.transform` and its three tensors.
fn decode_scaling(text: &str, tensors: &Tensors, path: &Path) -> Result<StoredScaling> {
    let p = path.display();
    let facts: TransformFacts =
        serde_json::from_str(text).with_context(|| format!("{p}: unreadable fsgp.transform"))?;
    let [ids, shift, scale] = TRANSFORM_TENSORS.map(|name| tensors.vector(name));
    let (ids, shift, scale) = (ids?, shift?, scale?);
    ensure!(
        ids.len() == shift.len() && ids.len() == scale.len(),
        "{p}: the transform's feature, shift and scale tensors differ in length"
    );
    let ids = ids
        .iter()
        .map(|&v| {
            u32::try_from(v as i64)
                .ok()
                .filter(|&id| f64::from(id) == v)
        })
        .collect::<Option<Vec<u32>>>()
        .with_context(|| format!("{p}: a transform feature id is not a u32"))?;
    ensure!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "{p}: the transform's feature ids do not increase"
    );
    Ok(StoredScaling {
        transform: facts.transform,
        reason: facts.reason,
        training_rows: facts.training_rows,
        ids,
        shift,
        scale,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kernel::KernelParams;
    use crate::model::params::QParams;
    use crate::store::catalog::Task;
    use faer::Mat;

    fn sample(free: bool) -> ModelFile {
        let f = |r: usize, c: usize, s: f64| {
            Mat::from_fn(r, c, |i, j| s * (i as f64 - j as f64 * 0.37).sin())
        };
        let d = if free { 5 } else { 3 };
        let params = Params {
            logit_epsilon: None,
            a: f(4, d, 1.0),
            q: QParams::Sites {
                mu: f(4, 2, 1e-3),
                rho: f(4, 2, -2.0),
            },
            phi: f(3, 2, 0.7),
            bias: vec![-1.0, f64::MIN_POSITIVE, 3.5],
            kernel: KernelParams::new(0.1, -1.0 / 3.0),
            amortiser: None,
        };
        let mut config = serde_json::json!({"kernel": "linear", "seed": 5});
        if free {
            config["inducing_inputs"] = "free".into();
        }
        ModelFile {
            config,
            dataset: DatasetFacts {
                name: "toy".into(),
                format: "libsvm".into(),
                index_base: 1,
                n_features: 5,
                n_labels: 3,
                label_kind: Task::Multiclass,
                class_map: Some(ClassMap::new(vec![-1, 2, 7], None).unwrap()),
                first_label: false,
                transform: "standardize".into(),
                transform_reason: Some("dense".into()),
            },
            provenance: Provenance {
                dataset_checksum: "0123456789abcdef".into(),
                train_run: 3,
                checkpoint_step: 96,
                checkpoint_checksum: "fedcba9876543210".into(),
                svd_run: 2,
                fsgp_version: "0.1.0".into(),
            },
            params,
            basis: (!free)
                .then(|| Array2::from_shape_fn((3, 5), |(i, j)| i as f32 - j as f32 / 3.0)),
            scaling: Some(StoredScaling {
                transform: "standardize".into(),
                reason: "dense".into(),
                training_rows: 40,
                ids: vec![0, 2, 4],
                shift: vec![0.5, -1e-300, 3.0],
                scale: vec![1.0 / 3.0, 2.0, 1.0],
            }),
        }
    }

    #[test]
    fn round_trips_and_the_same_model_gives_the_same_bytes() {
        let dir = tempfile::tempdir().unwrap();
        for free in [false, true] {
            let m = sample(free);
            let (a, b) = (dir.path().join("a.fsgp"), dir.path().join("b.fsgp"));
            let wa = m.write(&a, true).unwrap();
            let wb = m.write(&b, true).unwrap();
            assert_eq!(wa, wb);
            assert_eq!(ModelFile::read(&a).unwrap(), m);
            let map = m.basis_map(&a).unwrap();
            assert_eq!(
                map.view2::<f32>().unwrap().nrows(),
                if free { 0 } else { 3 }
            );
        }
        // Nothing is left beside the files.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }

    #[test]
    fn an_existing_file_is_kept_unless_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.fsgp");
        std::fs::write(&path, b"mine").unwrap();
        let e = sample(false).write(&path, false).unwrap_err().to_string();
        assert!(e.contains("exists; give --force"), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), b"mine");
        sample(false).write(&path, true).unwrap();
        assert!(ModelFile::read(&path).is_ok());
    }

    /// A file re-encoded with `edit` applied to its tensors and metadata, checksums kept.
    fn rewritten(m: &ModelFile, path: &Path, edit: impl FnOnce(&mut Encoded)) {
        let mut e = m.encode().unwrap();
        edit(&mut e);
        write_tensors(path, &e.tensors, &e.meta).unwrap();
    }

    #[test]
    fn missing_parts_damage_and_other_formats_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.fsgp");
        let m = sample(false);
        let err = |path: &Path| format!("{:#}", ModelFile::read(path).unwrap_err());

        rewritten(&m, &path, |e| e.tensors.retain(|t| t.name != BASIS));
        let e = err(&path);
        assert!(e.contains("m.fsgp: missing part 'basis'"), "{e}");

        rewritten(&m, &path, |e| {
            e.meta.retain(|(k, _)| k != "fsgp.provenance")
        });
        let e = err(&path);
        assert!(e.contains("m.fsgp: missing part 'provenance'"), "{e}");

        rewritten(&m, &path, |e| e.tensors[0].values.to_mut()[1] += 1e-9);
        let e = err(&path);
        assert!(
            e.contains("m.fsgp: damaged: part 'params' does not match"),
            "{e}"
        );

        rewritten(&m, &path, |e| {
            let parts = e.meta.iter_mut().find(|(k, _)| k == "fsgp.parts").unwrap();
            parts.1 = parts.1.replace("\"basis\"", "\"basis2\"");
        });
        let e = err(&path);
        assert!(e.contains("m.fsgp: damaged: its list of parts"), "{e}");

        rewritten(&m, &path, |e| e.meta[0].1 = "fsgp-model/2".into());
        let e = err(&path);
        assert!(
            e.contains(
                "m.fsgp: fsgp-model/2: written by a newer fsgp; this one reads fsgp-model/1"
            ),
            "{e}"
        );
        rewritten(&m, &path, |e| e.meta[0].1 = "fsgp-checkpoint/1".into());
        let e = err(&path);
        assert!(
            e.contains("format 'fsgp-checkpoint/1' is not an fsgp model file"),
            "{e}"
        );

        std::fs::write(&path, b"PAR1 not really").unwrap();
        let e = err(&path);
        assert!(e.contains("m.fsgp: not a readable model file"), "{e}");
    }
}
