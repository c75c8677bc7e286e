//! The per-feature map of a dataset's transform (`standardize`, `scale`, `tfidf`): one zstd Parquet
//! file `transform.parquet` in the dataset's directory, registered and checksummed like its
//! chunks (`docs/formats.md`, "The feature transform").
//!
//! | column  | type | meaning                                                |
//! |---------|------|--------------------------------------------------------|
//! | feature | u32  | 0-based feature id, increasing: the training rows' features |
//! | shift   | f64  | subtracted from the value (the training mean, or 0)     |
//! | scale   | f64  | multiplies the shifted value (1 / training sd, or 1)    |
//!
//! Key-value metadata: `fsgp.format`, `fsgp.transform` (its name), `fsgp.transform_reason`
//! (why `auto` chose it; empty when it was asked for by name) and `fsgp.training_rows`.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use arrow::array::{Array, Float64Array, RecordBatch, UInt32Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use parquet::file::reader::ChunkReader;

use super::chunks::{write_one_batch, WrittenFile};
use super::integrity::Registered;

/// Value of the `fsgp.format` key.
pub const SCALING_FORMAT: &str = "fsgp-feature-transform/1";

/// The file's name in the dataset directory.
pub const SCALING_FILE: &str = "transform.parquet";

/// A stored per-feature map and what is recorded with it.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredScaling {
    /// The transform's name (`standardize`, `scale` or `tfidf`).
    pub transform: String,
    /// Why `auto` chose it; empty when it was asked for by name.
    pub reason: String,
    /// Training rows the statistics come from.
    pub training_rows: u64,
    /// The features the map covers (strictly increasing); any other is left as it is.
    pub ids: Vec<u32>,
    /// Same length as `ids`.
    pub shift: Vec<f64>,
    pub scale: Vec<f64>,
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("feature", DataType::UInt32, false),
        Field::new("shift", DataType::Float64, false),
        Field::new("scale", DataType::Float64, false),
    ]))
}

/// Writes `s` to `path` (fsynced) and returns its size and checksum.
pub fn write_scaling(path: &Path, s: &StoredScaling) -> Result<WrittenFile> {
    assert!(
        s.ids.len() == s.shift.len() && s.ids.len() == s.scale.len(),
        "ids, shift and scale of one length"
    );
    let writing = || format!("writing {}", path.display());
    let kv = vec![
        KeyValue::new("fsgp.format".into(), SCALING_FORMAT.to_string()),
        KeyValue::new("fsgp.transform".into(), s.transform.clone()),
        KeyValue::new("fsgp.transform_reason".into(), s.reason.clone()),
        KeyValue::new("fsgp.training_rows".into(), s.training_rows.to_string()),
    ];
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(1)?))
        .set_key_value_metadata(Some(kv))
        .build();
    let batch = RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(UInt32Array::from(s.ids.clone())),
            Arc::new(Float64Array::from(s.shift.clone())),
            Arc::new(Float64Array::from(s.scale.clone())),
        ],
    )
    .with_context(writing)?;
    write_one_batch(path, schema(), props, &batch)
}

/// Reads a file [`write_scaling`] wrote; refuses another format or a file whose feature
/// ids do not increase.
pub fn read_scaling(path: &Path) -> Result<StoredScaling> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    decode_scaling(file, path)
}

/// Reads a dataset's registered map: the whole file, checked against the catalog, then
/// decoded as [`read_scaling`] does (`predict --input` applies it to new rows).
pub fn read_registered_scaling(file: &Registered) -> Result<StoredScaling> {
    decode_scaling(bytes::Bytes::from(file.read()?), file.path())
}

fn decode_scaling<R: ChunkReader + 'static>(reader: R, path: &Path) -> Result<StoredScaling> {
    let builder = ParquetRecordBatchReaderBuilder::try_new(reader)
        .with_context(|| format!("reading Parquet footer of {}", path.display()))?;
    let meta = |key: &str| {
        builder
            .metadata()
            .file_metadata()
            .key_value_metadata()
            .and_then(|kv| kv.iter().find(|k| k.key == key))
            .and_then(|k| k.value.clone())
    };
    let format = meta("fsgp.format").unwrap_or_default();
    if format != SCALING_FORMAT || builder.schema().fields() != schema().fields() {
        bail!(
            "{}: not an fsgp feature transform (format '{format}', expected '{SCALING_FORMAT}')",
            path.display()
        );
    }
    let mut stored = StoredScaling {
        transform: meta("fsgp.transform").unwrap_or_default(),
        reason: meta("fsgp.transform_reason").unwrap_or_default(),
        training_rows: meta("fsgp.training_rows")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        ids: Vec::new(),
        shift: Vec::new(),
        scale: Vec::new(),
    };
    for batch in builder.build()? {
        let batch = batch?;
        let column = |i: usize| batch.column(i).as_any();
        let (Some(ids), Some(shift), Some(scale)) = (
            column(0).downcast_ref::<UInt32Array>(),
            column(1).downcast_ref::<Float64Array>(),
            column(2).downcast_ref::<Float64Array>(),
        ) else {
            bail!("{}: unexpected column types", path.display());
        };
        for (i, &id) in ids.values().iter().enumerate() {
            if stored.ids.last().is_some_and(|&last| last >= id) {
                bail!(
                    "{}: found feature {id} at row {}, expected feature ids in increasing \
                     order",
                    path.display(),
                    stored.ids.len()
                );
            }
            stored.ids.push(id);
            stored.shift.push(shift.value(i));
            stored.scale.push(scale.value(i));
        }
    }
    Ok(stored)
}

/// The registered statistics of `dataset`'s fitted transform (its `transform.parquet`,
/// read through its checksum): what `export` copies and `predict --input` applies.
pub fn read_dataset_scaling(
    ws: &super::workspace::Workspace,
    dataset: &super::catalog::DatasetRow,
) -> Result<StoredScaling> {
    let file = ws
        .run_file(
            dataset.stage_run_id,
            super::catalog::ArtifactKind::FeatureTransform,
        )?
        .with_context(|| {
            format!(
                "dataset '{}' has transform '{}' but no registered statistics \
                 (transform.parquet); ingest it again",
                dataset.name, dataset.normalization
            )
        })?;
    read_registered_scaling(&file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::chunks::checksum_file;

    /// The workspace's removal rule knows this file as fsgp's own (`store::owned`).
    #[test]
    fn the_statistics_file_is_one_of_fsgps_own_names() {
        assert!(crate::store::owned::is_own_name(SCALING_FILE));
    }

    #[test]
    fn round_trips_bit_for_bit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SCALING_FILE);
        let s = StoredScaling {
            transform: "standardize".into(),
            reason: "dense".into(),
            training_rows: 17,
            ids: vec![0, 3, 4, u32::MAX - 1],
            shift: vec![0.1, -2.5e300, f64::MIN_POSITIVE, 0.0],
            scale: vec![1.0, 1.0 / 3.0, 7e-12, 1.0],
        };
        let written = write_scaling(&path, &s).unwrap();
        assert_eq!(written, checksum_file(&path).unwrap());
        let back = read_scaling(&path).unwrap();
        assert_eq!(back, s);
        for (a, b) in back.shift.iter().zip(&s.shift) {
            assert_eq!(a.to_bits(), b.to_bits());
        }
    }

    #[test]
    fn refuses_a_chunk_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("part.parquet");
        crate::store::chunks::write_chunk(&path, Default::default(), &[]).unwrap();
        let e = read_scaling(&path).unwrap_err().to_string();
        assert!(e.contains("not an fsgp feature transform"), "{e}");
    }
}
