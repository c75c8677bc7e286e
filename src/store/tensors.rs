//! Files of named tensors: one zstd Parquet file, one row per tensor, with key-value
//! metadata for everything that is not a tensor. The container of training checkpoints
//! (`checkpoint`) and of exported model files (`model_file`), so both are written and read by
//! this one code (`docs/formats.md`, "Training checkpoints", "Model files").
//!
//! | column | type      | meaning                              |
//! |--------|-----------|--------------------------------------|
//! | name   | utf8      | the tensor's name                    |
//! | rows   | u64       | first dimension                      |
//! | cols   | u64       | second dimension                     |
//! | values | list<f64> | the rows × cols entries, row-major   |
//!
//! The bytes depend only on the tensors and the metadata (no time, no statistics), so the
//! same content always gives the same file.

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, ensure, Context, Result};
use arrow::array::{Array, Float64Array, ListArray, RecordBatch, StringArray, UInt64Array};
use arrow::buffer::OffsetBuffer;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use faer::Mat;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::reader::ChunkReader;

use super::chunks::{write_one_batch, WrittenFile};
use super::footer::key_values;

/// A named rows × cols matrix, its entries row-major (a vector is one row).
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub name: String,
    pub rows: usize,
    pub cols: usize,
    /// rows × cols entries, row-major.
    pub values: Vec<f64>,
}

impl Tensor {
    /// `m` [rows×cols] row-major.
    pub fn matrix(name: &str, m: &Mat<f64>) -> Tensor {
        let (rows, cols) = (m.nrows(), m.ncols());
        let mut values = Vec::with_capacity(rows * cols);
        for i in 0..rows {
            values.extend((0..cols).map(|j| m[(i, j)]));
        }
        Tensor {
            name: name.to_string(),
            rows,
            cols,
            values,
        }
    }

    /// `v` as one row [1×len].
    pub fn vector(name: &str, v: &[f64]) -> Tensor {
        Tensor {
            name: name.to_string(),
            rows: 1,
            cols: v.len(),
            values: v.to_vec(),
        }
    }

    /// The entries as a matrix [rows×cols].
    pub fn to_mat(&self) -> Mat<f64> {
        Mat::from_fn(self.rows, self.cols, |i, j| self.values[i * self.cols + j])
    }
}

/// The tensors of a file, looked up by name; a missing one is an error naming the file.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensors<'p> {
    pub found: Vec<Tensor>,
    /// The file, for messages.
    pub path: &'p Path,
    /// What the file is, for messages (`checkpoint`, `model file`).
    pub what: &'static str,
}

impl Tensors<'_> {
    pub fn has(&self, name: &str) -> bool {
        self.found.iter().any(|t| t.name == name)
    }

    pub fn get(&self, name: &str) -> Result<&Tensor> {
        self.found
            .iter()
            .find(|t| t.name == name)
            .with_context(|| format!("{}: {} lacks tensor {name}", self.path.display(), self.what))
    }

    pub fn mat(&self, name: &str) -> Result<Mat<f64>> {
        Ok(self.get(name)?.to_mat())
    }

    pub fn vector(&self, name: &str) -> Result<Vec<f64>> {
        Ok(self.get(name)?.values.clone())
    }
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("name", DataType::Utf8, false),
        Field::new("rows", DataType::UInt64, false),
        Field::new("cols", DataType::UInt64, false),
        Field::new(
            "values",
            DataType::List(Arc::new(Field::new("item", DataType::Float64, false))),
            false,
        ),
    ]))
}

/// Writes `tensors` (in order) with `metadata` (in order) to `path`, fsynced; returns its
/// size and checksum. Callers write to a temporary name and rename.
pub fn write_tensors(
    path: &Path,
    tensors: &[Tensor],
    metadata: &[(String, String)],
) -> Result<WrittenFile> {
    let names = StringArray::from_iter_values(tensors.iter().map(|t| t.name.as_str()));
    let rows = UInt64Array::from_iter_values(tensors.iter().map(|t| t.rows as u64));
    let cols = UInt64Array::from_iter_values(tensors.iter().map(|t| t.cols as u64));
    let lengths = tensors.iter().map(|t| t.values.len());
    let flat: Vec<f64> = tensors
        .iter()
        .flat_map(|t| t.values.iter().copied())
        .collect();
    let values = ListArray::new(
        Arc::new(Field::new("item", DataType::Float64, false)),
        OffsetBuffer::from_lengths(lengths),
        Arc::new(Float64Array::from(flat)),
        None,
    );
    let batch = RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(names),
            Arc::new(rows),
            Arc::new(cols),
            Arc::new(values),
        ],
    )?;
    let kv = metadata
        .iter()
        .map(|(k, v)| KeyValue::new(k.clone(), v.clone()))
        .collect();
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?))
        .set_dictionary_enabled(false)
        .set_statistics_enabled(EnabledStatistics::None)
        .set_key_value_metadata(Some(kv))
        .build();
    write_one_batch(path, schema(), props, &batch)
}

/// A tensor file whose footer has been read: its key-value metadata, the tensors not yet
/// decoded (so a reader can refuse a format it does not know before decoding anything).
pub struct TensorFile<R: ChunkReader + 'static> {
    /// Key-value pairs in the order written; a key without a value reads as "".
    pub meta: Vec<(String, String)>,
    builder: ParquetRecordBatchReaderBuilder<R>,
}

impl<R: ChunkReader + 'static> TensorFile<R> {
    /// Reads the footer of `reader` (the file at `path`, for messages).
    pub fn open(reader: R, path: &Path) -> Result<Self> {
        let builder = ParquetRecordBatchReaderBuilder::try_new(reader)
            .with_context(|| format!("reading Parquet footer of {}", path.display()))?;
        let meta = key_values(builder.metadata().file_metadata());
        Ok(TensorFile { meta, builder })
    }

    /// The value of `key`, if the file has it.
    pub fn key(&self, key: &str) -> Option<&str> {
        self.meta
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Decodes every tensor row, each checked to hold rows × cols values; `what` names the
    /// kind of file in messages.
    pub fn tensors<'p>(self, path: &'p Path, what: &'static str) -> Result<Tensors<'p>> {
        let mut found = Vec::new();
        for batch in self.builder.build()? {
            let batch = batch.with_context(|| format!("decoding {}", path.display()))?;
            let col = |i: usize| batch.column(i).as_any();
            let (Some(names), Some(rows), Some(cols), Some(values)) = (
                col(0).downcast_ref::<StringArray>(),
                col(1).downcast_ref::<UInt64Array>(),
                col(2).downcast_ref::<UInt64Array>(),
                col(3).downcast_ref::<ListArray>(),
            ) else {
                bail!("{}: not an fsgp {what} (schema)", path.display());
            };
            for i in 0..batch.num_rows() {
                let v = values.value(i);
                let v = v
                    .as_any()
                    .downcast_ref::<Float64Array>()
                    .with_context(|| format!("{}: values are not f64", path.display()))?;
                let (r, c) = (rows.value(i) as usize, cols.value(i) as usize);
                ensure!(
                    Some(v.len()) == r.checked_mul(c),
                    "{}: tensor {} holds {} values, expected {r}×{c}",
                    path.display(),
                    names.value(i),
                    v.len()
                );
                found.push(Tensor {
                    name: names.value(i).to_string(),
                    rows: r,
                    cols: c,
                    values: v.values().to_vec(),
                });
            }
        }
        Ok(Tensors { found, path, what })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;

    #[test]
    fn tensors_and_metadata_round_trip_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let m = Mat::from_fn(2, 3, |i, j| i as f64 - 0.5 * j as f64);
        let written = vec![
            Tensor::matrix("m", &m),
            Tensor::vector("v", &[1e300, -0.0, f64::MIN_POSITIVE]),
            Tensor::vector("empty", &[]),
        ];
        let meta = vec![
            ("fsgp.format".to_string(), "x/1".to_string()),
            ("b".to_string(), "2".to_string()),
        ];
        let w1 = write_tensors(&path, &written, &meta).unwrap();
        let w2 = write_tensors(&path, &written, &meta).unwrap();
        assert_eq!(w1, w2, "same content, same bytes");
        let file = TensorFile::open(File::open(&path).unwrap(), &path).unwrap();
        assert_eq!(file.key("fsgp.format"), Some("x/1"));
        assert_eq!(file.key("c"), None);
        let back = file.tensors(&path, "test file").unwrap();
        assert_eq!(back.found, written);
        assert_eq!(back.mat("m").unwrap(), m);
        let e = back.get("w").unwrap_err().to_string();
        assert!(e.contains("t.parquet: test file lacks tensor w"), "{e}");
    }
}
