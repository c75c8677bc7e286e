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

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, ensure, Context, Result};
use arrow::array::{Array, Float64Array, ListArray, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use faer::Mat;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::{add_encoded_arrow_schema_to_metadata, ArrowSchemaConverter};
use parquet::basic::{Compression, ZstdLevel};
use parquet::data_type::{ByteArray, ByteArrayType, DataType as Physical, DoubleType, Int64Type};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::reader::ChunkReader;
use parquet::file::writer::{SerializedFileWriter, SerializedRowGroupWriter};

use super::chunks::{synced_and_summed, WrittenFile};
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

    /// Name, shape and the values' bit patterns: equal exactly when the tensors are equal
    /// bit for bit (a NaN equal to itself, −0 unequal to 0), as round trips are checked.
    pub fn bits(&self) -> (String, usize, usize, Vec<u64>) {
        let bits = self.values.iter().map(|v| v.to_bits()).collect();
        (self.name.clone(), self.rows, self.cols, bits)
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
///
/// The file is the one Arrow's writer makes of a record batch of [`schema`] (its Parquet
/// schema and the embedded Arrow schema alike, so any Parquet reader sees the same
/// columns), but the `values` column is written through Parquet's column writer from each
/// tensor's own slice, with its list levels spelled out. Arrow's writer first copies every
/// value into one array, then computes two levels and an index for each value before
/// encoding: a checkpoint of 56 million values (D = 500 000 features, 56 latent functions,
/// the weights' means and variances) spent 23–29 s of a 28–39 s run of 3 steps outside
/// its steps and 3.3 GB more peak memory that way, 6–7 s this way (BENCHMARKS.md,
/// "Checkpoints of many weights").
pub fn write_tensors(
    path: &Path,
    tensors: &[Tensor],
    metadata: &[(String, String)],
) -> Result<WrittenFile> {
    let writing = || format!("writing {}", path.display());
    let arrow_schema = schema();
    let parquet_schema = ArrowSchemaConverter::new()
        .convert(&arrow_schema)
        .with_context(writing)?;
    let mut props = writer_properties(metadata)?;
    add_encoded_arrow_schema_to_metadata(&arrow_schema, &mut props);
    let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut writer =
        SerializedFileWriter::new(file, parquet_schema.root_schema_ptr(), Arc::new(props))
            .with_context(writing)?;
    let mut group = writer.next_row_group().with_context(writing)?;
    let names: Vec<ByteArray> = tensors.iter().map(|t| t.name.as_str().into()).collect();
    write_column::<ByteArrayType>(&mut group, &names).with_context(writing)?;
    // u64 is stored as Parquet's INT64 (annotated unsigned), bit for bit, as Arrow does.
    let rows: Vec<i64> = tensors.iter().map(|t| t.rows as u64 as i64).collect();
    write_column::<Int64Type>(&mut group, &rows).with_context(writing)?;
    let cols: Vec<i64> = tensors.iter().map(|t| t.cols as u64 as i64).collect();
    write_column::<Int64Type>(&mut group, &cols).with_context(writing)?;
    write_values(&mut group, tensors).with_context(writing)?;
    group.close().with_context(writing)?;
    let file = writer.into_inner().with_context(writing)?;
    synced_and_summed(file, path)
}

fn writer_properties(metadata: &[(String, String)]) -> Result<WriterProperties> {
    let kv = metadata
        .iter()
        .map(|(k, v)| KeyValue::new(k.clone(), v.clone()))
        .collect();
    Ok(WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?))
        .set_dictionary_enabled(false)
        .set_statistics_enabled(EnabledStatistics::None)
        .set_key_value_metadata(Some(kv))
        .build())
}

/// The next column of `group`, a required flat one, holding `values`.
fn write_column<T: Physical>(
    group: &mut SerializedRowGroupWriter<'_, File>,
    values: &[T::T],
) -> Result<()> {
    let mut column = group.next_column()?.context("internal: a column too few")?;
    column.typed::<T>().write_batch(values, None, None)?;
    column.close()?;
    Ok(())
}

/// The `values` column: a required list of required f64, one list per tensor. Its levels
/// (max definition 1, max repetition 1): a value is defined (1), and repeats its row's
/// list (1) except the list's first (0); an empty list is one entry of level 0 for both
/// and no value. Parquet's writer takes a list whole (a call starts at a row's first
/// value), so one pair of level buffers as long as the longest tensor serves them all.
fn write_values(group: &mut SerializedRowGroupWriter<'_, File>, tensors: &[Tensor]) -> Result<()> {
    let mut column = group.next_column()?.context("internal: a column too few")?;
    let writer = column.typed::<DoubleType>();
    let longest = tensors.iter().map(|t| t.values.len()).max().unwrap_or(0);
    let defined = vec![1i16; longest.max(1)];
    let mut repeated = vec![1i16; longest.max(1)];
    repeated[0] = 0;
    for t in tensors {
        let n = t.values.len();
        let levels = match n {
            0 => (&[0i16][..], &[0i16][..]),
            n => (&defined[..n], &repeated[..n]),
        };
        writer.write_batch(&t.values, Some(levels.0), Some(levels.1))?;
    }
    column.close()?;
    Ok(())
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

    /// The file Arrow's writer makes of the same tensors: a record batch of [`schema`],
    /// the list column built from one flat array (the writer `write_tensors` replaced).
    fn arrow_written(path: &Path, tensors: &[Tensor], metadata: &[(String, String)]) {
        use arrow::array::RecordBatch;
        use arrow::buffer::OffsetBuffer;
        use parquet::arrow::ArrowWriter;
        let flat: Vec<f64> = tensors.iter().flat_map(|t| t.values.clone()).collect();
        let values = ListArray::new(
            Arc::new(Field::new(
                "item",
                arrow::datatypes::DataType::Float64,
                false,
            )),
            OffsetBuffer::from_lengths(tensors.iter().map(|t| t.values.len())),
            Arc::new(Float64Array::from(flat)),
            None,
        );
        let batch = RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(StringArray::from_iter_values(
                    tensors.iter().map(|t| &t.name),
                )),
                Arc::new(UInt64Array::from_iter_values(
                    tensors.iter().map(|t| t.rows as u64),
                )),
                Arc::new(UInt64Array::from_iter_values(
                    tensors.iter().map(|t| t.cols as u64),
                )),
                Arc::new(values),
            ],
        )
        .unwrap();
        let props = writer_properties(metadata).unwrap();
        let mut w =
            ArrowWriter::try_new(File::create(path).unwrap(), schema(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    }

    #[test]
    fn the_column_writer_makes_the_file_arrows_writer_makes() {
        let dir = tempfile::tempdir().unwrap();
        let (ours, arrows) = (
            dir.path().join("ours.parquet"),
            dir.path().join("arrow.parquet"),
        );
        // Several pages (a long tensor), lists of every length around the edges (empty
        // first, between and last), signed zeros, NaN payloads and the extremes.
        let long: Vec<f64> = (0..300_001)
            .map(|i| (i as f64 * 0.37).sin() * 1e3)
            .collect();
        let odd = [
            f64::NAN,
            -f64::NAN,
            -0.0,
            f64::INFINITY,
            f64::MIN,
            f64::from_bits(1),
        ];
        let written = vec![
            Tensor::vector("empty-first", &[]),
            Tensor::vector("one", &[2.5]),
            Tensor::matrix("m", &Mat::from_fn(3, 2, |i, j| i as f64 * 10.0 + j as f64)),
            Tensor::vector("empty-between", &[]),
            Tensor::vector("long", &long),
            Tensor::vector("odd", &odd),
            Tensor::vector("empty-last", &[]),
        ];
        let meta = vec![("fsgp.format".to_string(), "x/1".to_string())];
        write_tensors(&ours, &written, &meta).unwrap();
        arrow_written(&arrows, &written, &meta);
        let read = |path: &Path| {
            let file = TensorFile::open(File::open(path).unwrap(), path).unwrap();
            let meta = file.meta.clone();
            let found = file.tensors(path, "test file").unwrap().found;
            let bits: Vec<_> = found.iter().map(Tensor::bits).collect();
            (meta, bits)
        };
        let (ours_read, arrows_read) = (read(&ours), read(&arrows));
        assert_eq!(
            ours_read, arrows_read,
            "the same metadata and tensors, bit for bit"
        );
        let want: Vec<_> = written.iter().map(Tensor::bits).collect();
        assert_eq!(ours_read.1, want, "what was written, bit for bit");
        // The same Parquet schema, so that any reader sees the same columns.
        let schema_of = |path: &Path| {
            let reader = parquet::file::serialized_reader::SerializedFileReader::new(
                File::open(path).unwrap(),
            )
            .unwrap();
            use parquet::file::reader::FileReader;
            let md = reader.metadata();
            (
                md.file_metadata().schema_descr().root_schema().clone(),
                md.file_metadata().num_rows(),
            )
        };
        assert_eq!(schema_of(&ours), schema_of(&arrows));
    }
}
