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

use std::borrow::Cow;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, ensure, Context, Result};
use arrow::array::{Array, BooleanArray, Float64Array, ListArray, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use faer::Mat;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder, RowSelection,
};
use parquet::arrow::{add_encoded_arrow_schema_to_metadata, ArrowSchemaConverter, ProjectionMask};
use parquet::basic::{Compression, ZstdLevel};
use parquet::data_type::{ByteArray, ByteArrayType, DataType as Physical, DoubleType, Int64Type};
use parquet::file::metadata::{KeyValue, PageIndexPolicy};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::reader::ChunkReader;
use parquet::file::writer::{SerializedFileWriter, SerializedRowGroupWriter};

use super::chunks::{synced_and_summed, WrittenFile};
use super::footer::key_values;

/// A named rows × cols matrix, its entries row-major (a vector is one row). The values are
/// borrowed where the caller's layout is already the file's (a vector), so writing a
/// checkpoint does not copy Adam's moments, and owned otherwise.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor<'a> {
    pub name: String,
    pub rows: usize,
    pub cols: usize,
    /// rows × cols entries, row-major.
    pub values: Cow<'a, [f64]>,
}

/// Rows of a matrix converted together between faer's column-major layout and the file's
/// row-major one: the block's row-major values (64 × cols) stay in cache while each column
/// is visited. Row by row, one value per column, a [500 000 × 56] matrix touched a
/// different page at every value.
const BLOCK_ROWS: usize = 64;

impl Tensor<'static> {
    /// `m` [rows×cols] row-major.
    pub fn matrix(name: &str, m: &Mat<f64>) -> Self {
        let (rows, cols) = (m.nrows(), m.ncols());
        let mut values = vec![0.0; rows * cols];
        for start in (0..rows).step_by(BLOCK_ROWS) {
            let end = (start + BLOCK_ROWS).min(rows);
            for j in 0..cols {
                for (i, &v) in (start..end).zip(m.col(j).subrows(start, end - start).iter()) {
                    values[i * cols + j] = v;
                }
            }
        }
        Tensor::owned(name, rows, cols, values)
    }

    /// `values` [rows×cols] row-major.
    pub fn owned(name: &str, rows: usize, cols: usize, values: Vec<f64>) -> Self {
        Tensor {
            name: name.to_string(),
            rows,
            cols,
            values: Cow::Owned(values),
        }
    }
}

impl<'a> Tensor<'a> {
    /// `v` as one row [1×len], borrowed.
    pub fn vector(name: &str, v: &'a [f64]) -> Self {
        Tensor {
            name: name.to_string(),
            rows: 1,
            cols: v.len(),
            values: Cow::Borrowed(v),
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
        let (rows, cols) = (self.rows, self.cols);
        let mut m = Mat::zeros(rows, cols);
        for start in (0..rows).step_by(BLOCK_ROWS) {
            let end = (start + BLOCK_ROWS).min(rows);
            for j in 0..cols {
                let mut column = m.col_mut(j);
                for i in start..end {
                    column[i] = self.values[i * cols + j];
                }
            }
        }
        m
    }
}

/// The tensors of a file, looked up by name; a missing one is an error naming the file.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensors<'p> {
    pub found: Vec<Tensor<'static>>,
    /// The file, for messages.
    pub path: &'p Path,
    /// What the file is, for messages (`checkpoint`, `model file`).
    pub what: &'static str,
}

impl Tensors<'_> {
    pub fn has(&self, name: &str) -> bool {
        self.found.iter().any(|t| t.name == name)
    }

    pub fn get(&self, name: &str) -> Result<&Tensor<'static>> {
        Ok(&self.found[self.index(name)?])
    }

    /// Where tensor `name` is among those found.
    fn index(&self, name: &str) -> Result<usize> {
        self.found
            .iter()
            .position(|t| t.name == name)
            .with_context(|| format!("{}: {} lacks tensor {name}", self.path.display(), self.what))
    }

    pub fn mat(&self, name: &str) -> Result<Mat<f64>> {
        Ok(self.get(name)?.to_mat())
    }

    pub fn vector(&self, name: &str) -> Result<Vec<f64>> {
        Ok(self.get(name)?.values.to_vec())
    }

    /// [`Tensors::vector`], moved out of the file's tensors (which then hold it empty):
    /// for the largest, read once.
    pub fn take_vector(&mut self, name: &str) -> Result<Vec<f64>> {
        let i = self.index(name)?;
        Ok(std::mem::take(&mut self.found[i].values).into_owned())
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
    reader: R,
    /// The footer, with the pages' offset index: a tensor skipped
    /// ([`TensorFile::tensors_except`]) is not decompressed.
    footer: ArrowReaderMetadata,
}

impl<R: ChunkReader + 'static> TensorFile<R> {
    /// Reads the footer of `reader` (the file at `path`, for messages).
    pub fn open(reader: R, path: &Path) -> Result<Self> {
        // The offset index alone: where each page is, by which skipped rows' pages are
        // passed over (old files without one are read as before).
        let options = ArrowReaderOptions::new().with_offset_index_policy(PageIndexPolicy::Optional);
        let footer = ArrowReaderMetadata::load(&reader, options)
            .with_context(|| format!("reading Parquet footer of {}", path.display()))?;
        let meta = key_values(footer.metadata().file_metadata());
        Ok(TensorFile {
            meta,
            reader,
            footer,
        })
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
        let builder = ParquetRecordBatchReaderBuilder::new_with_metadata(self.reader, self.footer);
        decode(builder, path, what)
    }
}

impl<R: ChunkReader + Clone + 'static> TensorFile<R> {
    /// [`TensorFile::tensors`] but those named in `skipped`, which are neither built into
    /// arrays nor copied, and whose pages the reader passes over where the offset index
    /// lets it: prediction reads a checkpoint's parameters without Adam's moments, which
    /// are twice their size (at D·P = 28 million weights the read went from 9–18 s and
    /// 4.2 GB to about 2.5 s and 1.9 GB; BENCHMARKS.md). The names are read first (their
    /// column alone).
    pub fn tensors_except<'p>(
        self,
        path: &'p Path,
        what: &'static str,
        skipped: &[&str],
    ) -> Result<Tensors<'p>> {
        let names = ParquetRecordBatchReaderBuilder::new_with_metadata(
            self.reader.clone(),
            self.footer.clone(),
        );
        let only_names = ProjectionMask::roots(names.parquet_schema(), [0]);
        let mut kept = Vec::new();
        for batch in names.with_projection(only_names).build()? {
            let batch = batch.with_context(|| format!("decoding {}", path.display()))?;
            let Some(names) = batch.column(0).as_any().downcast_ref::<StringArray>() else {
                bail!("{}: not an fsgp {what} (schema)", path.display());
            };
            kept.extend((0..names.len()).map(|i| !skipped.contains(&names.value(i))));
        }
        let selection = RowSelection::from_filters(&[BooleanArray::from(kept)]);
        let builder = ParquetRecordBatchReaderBuilder::new_with_metadata(self.reader, self.footer)
            .with_row_selection(selection);
        decode(builder, path, what)
    }
}

/// The tensor rows `builder` reads, each checked to hold rows × cols values.
fn decode<'p, R: ChunkReader + 'static>(
    builder: ParquetRecordBatchReaderBuilder<R>,
    path: &'p Path,
    what: &'static str,
) -> Result<Tensors<'p>> {
    let mut found = Vec::new();
    for batch in builder.build()? {
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
            found.push(Tensor::owned(names.value(i), r, c, v.values().to_vec()));
        }
    }
    Ok(Tensors { found, path, what })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;

    /// A matrix taller than the conversion's block goes to row-major values and back
    /// unchanged, its values in row-major order.
    #[test]
    fn matrices_convert_in_blocks_of_rows() {
        let m = Mat::from_fn(2 * BLOCK_ROWS + 5, 7, |i, j| (i * 7 + j) as f64);
        let t = Tensor::matrix("m", &m);
        let in_order: Vec<f64> = (0..m.nrows() * 7).map(|v| v as f64).collect();
        assert_eq!(&t.values[..], &in_order[..]);
        assert_eq!(t.to_mat(), m);
        assert_eq!(Tensor::matrix("e", &Mat::new()).to_mat(), Mat::<f64>::new());
    }

    /// Reading all but some tensors gives the others as written, in order, wherever the
    /// skipped ones lie (first, between, last, side by side, over a page or within one).
    #[test]
    fn tensors_but_the_skipped_ones_are_read_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        // Over a page's megabyte each, so that each ends a page, beside small ones.
        let long = |f: fn(f64) -> f64| (0..150_000).map(|i| f(i as f64)).collect::<Vec<_>>();
        let (cos, sin, sqrt) = (long(f64::cos), long(f64::sin), long(f64::sqrt));
        let written = vec![
            Tensor::vector("a", &cos),
            Tensor::vector("b", &[1.0, -2.0]),
            Tensor::vector("c", &sin),
            Tensor::vector("d", &sqrt),
            Tensor::matrix("e", &Mat::from_fn(3, 2, |i, j| (i + 10 * j) as f64)),
            Tensor::vector("f", &[]),
        ];
        write_tensors(&path, &written, &[]).unwrap();
        let bytes = bytes::Bytes::from(std::fs::read(&path).unwrap());
        for skipped in [&["c", "d"][..], &["a"], &["f"], &["b", "e"], &[], &["x"]] {
            let file = TensorFile::open(bytes.clone(), &path).unwrap();
            let back = file.tensors_except(&path, "test file", skipped).unwrap();
            let kept: Vec<Tensor> = written
                .iter()
                .filter(|t| !skipped.contains(&t.name.as_str()))
                .cloned()
                .collect();
            assert_eq!(back.found, kept, "skipping {skipped:?}");
        }
    }

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
        let flat: Vec<f64> = tensors
            .iter()
            .flat_map(|t| t.values.iter().copied())
            .collect();
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
