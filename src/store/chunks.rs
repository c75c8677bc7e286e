//! Parquet CSR chunks: the one on-disk format of an ingested split.
//!
//! A split is a directory of files `part-NNNNN.parquet`, each holding a fixed number of rows
//! (the last may hold fewer) in a single row group, zstd-compressed. Schema (see
//! `docs/formats.md`):
//!
//! | column   | type          | meaning                                             |
//! |----------|---------------|-----------------------------------------------------|
//! | row_id   | u64           | 0-based position of the row in its split            |
//! | labels   | list<u32>     | positive label ids, sorted, unique, 0-based         |
//! | indices  | list<u32>     | feature ids, sorted, unique, 0-based                |
//! | values   | list<f32>     | feature values (after normalisation), same length   |
//! | sq_norm  | f32           | Σ values², computed in f64 from the stored f32s     |

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use arrow::array::{Array, Float32Array, ListArray, RecordBatch, UInt32Array, UInt64Array};
use arrow::buffer::{OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::reader::ChunkReader;
use sprs::CsMatViewI;

use super::footer::key_values;
use super::integrity::Registered;
use crate::failpoint;

/// Value of the `fsgp.format` key in every chunk's key-value metadata.
pub const CHUNK_FORMAT: &str = "fsgp-csr-chunk/1";

/// Rows of a sparse matrix with labels, in CSR form (offsets are per-chunk, starting at 0).
///
/// Shapes: `row_ids`, `sq_norms`: n; `label_offsets`, `feature_offsets`: n + 1;
/// `labels`: label_offsets[n]; `indices`, `values`: feature_offsets[n].
#[derive(Debug, Clone, PartialEq)]
pub struct CsrChunk {
    pub row_ids: Vec<u64>,
    pub label_offsets: Vec<i32>,
    pub labels: Vec<u32>,
    pub feature_offsets: Vec<i32>,
    pub indices: Vec<u32>,
    pub values: Vec<f32>,
    pub sq_norms: Vec<f32>,
}

/// One row borrowed from a [`CsrChunk`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowRef<'a> {
    pub row_id: u64,
    pub labels: &'a [u32],
    pub indices: &'a [u32],
    pub values: &'a [f32],
    pub sq_norm: f32,
}

impl Default for CsrChunk {
    fn default() -> Self {
        CsrChunk {
            row_ids: Vec::new(),
            label_offsets: vec![0],
            labels: Vec::new(),
            feature_offsets: vec![0],
            indices: Vec::new(),
            values: Vec::new(),
            sq_norms: Vec::new(),
        }
    }
}

impl CsrChunk {
    pub fn len(&self) -> usize {
        self.row_ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.row_ids.is_empty()
    }

    /// Approximate heap bytes held, used to size chunks.
    pub fn heap_bytes(&self) -> usize {
        self.row_ids.len() * 8
            + (self.label_offsets.len() + self.feature_offsets.len()) * 4
            + (self.labels.len() + self.indices.len() + self.values.len()) * 4
            + self.sq_norms.len() * 4
    }

    pub fn push_row(&mut self, row: RowRef<'_>) {
        self.row_ids.push(row.row_id);
        self.labels.extend_from_slice(row.labels);
        self.label_offsets.push(offset(self.labels.len()));
        self.indices.extend_from_slice(row.indices);
        self.values.extend_from_slice(row.values);
        self.feature_offsets.push(offset(self.indices.len()));
        self.sq_norms.push(row.sq_norm);
    }

    pub fn row(&self, i: usize) -> RowRef<'_> {
        let (l0, l1) = (
            self.label_offsets[i] as usize,
            self.label_offsets[i + 1] as usize,
        );
        let (f0, f1) = (
            self.feature_offsets[i] as usize,
            self.feature_offsets[i + 1] as usize,
        );
        RowRef {
            row_id: self.row_ids[i],
            labels: &self.labels[l0..l1],
            indices: &self.indices[f0..f1],
            values: &self.values[f0..f1],
            sq_norm: self.sq_norms[i],
        }
    }

    pub fn rows(&self) -> impl Iterator<Item = RowRef<'_>> {
        (0..self.len()).map(move |i| self.row(i))
    }

    /// Row `i`'s features, densified: `set(feature, value)` for each stored entry (the
    /// caller's dense row starts at zero, so the result is x_i [`n_features`] exactly).
    /// Fails, naming the row, if a feature id is ≥ `n_features`.
    pub fn densify_row(
        &self,
        i: usize,
        n_features: usize,
        mut set: impl FnMut(usize, f32),
    ) -> Result<()> {
        let row = self.row(i);
        for (&j, &v) in row.indices.iter().zip(row.values) {
            if j as usize >= n_features {
                bail!(
                    "row {}: feature {j} is outside the dataset's {n_features} features",
                    row.row_id
                );
            }
            set(j as usize, v);
        }
        Ok(())
    }

    /// The chunk's features as a sprs CSR matrix [len() × `n_features`] that borrows the
    /// chunk's arrays (no copy): row offsets `i32` and feature ids `u32` as stored, values
    /// `f32`. sprs checks the structure (O(nnz)): fails if a feature id is ≥ `n_features`
    /// or a row's ids are not strictly increasing (ingest writes them sorted and unique).
    pub fn csr_view(&self, n_features: usize) -> Result<CsMatViewI<'_, f32, u32, i32>> {
        CsMatViewI::try_new(
            (self.len(), n_features),
            &self.feature_offsets[..],
            &self.indices[..],
            &self.values[..],
        )
        .map_err(|(_, _, _, e)| {
            anyhow!("chunk is not a valid CSR matrix of {n_features} columns: {e}")
        })
    }
}

fn offset(n: usize) -> i32 {
    // A chunk is tens of MB; 2^31 entries would be 8 GiB of one column.
    i32::try_from(n).expect("chunk exceeds 2^31 entries in one list column")
}

/// The Arrow schema every chunk file has.
pub fn chunk_schema() -> SchemaRef {
    let item = |t: DataType| Arc::new(Field::new("item", t, false));
    Arc::new(Schema::new(vec![
        Field::new("row_id", DataType::UInt64, false),
        Field::new("labels", DataType::List(item(DataType::UInt32)), false),
        Field::new("indices", DataType::List(item(DataType::UInt32)), false),
        Field::new("values", DataType::List(item(DataType::Float32)), false),
        Field::new("sq_norm", DataType::Float32, false),
    ]))
}

fn list_array<T: Array + 'static>(offsets: Vec<i32>, values: T, item_type: DataType) -> ListArray {
    ListArray::new(
        Arc::new(Field::new("item", item_type, false)),
        OffsetBuffer::new(ScalarBuffer::from(offsets)),
        Arc::new(values),
        None,
    )
}

/// Converts a chunk to an Arrow record batch with [`chunk_schema`], moving (not copying)
/// its vectors into Arrow buffers.
pub fn into_record_batch(chunk: CsrChunk) -> Result<RecordBatch> {
    let feature_offsets = chunk.feature_offsets;
    let columns: Vec<Arc<dyn Array>> = vec![
        Arc::new(UInt64Array::from(chunk.row_ids)),
        Arc::new(list_array(
            chunk.label_offsets,
            UInt32Array::from(chunk.labels),
            DataType::UInt32,
        )),
        Arc::new(list_array(
            feature_offsets.clone(),
            UInt32Array::from(chunk.indices),
            DataType::UInt32,
        )),
        Arc::new(list_array(
            feature_offsets,
            Float32Array::from(chunk.values),
            DataType::Float32,
        )),
        Arc::new(Float32Array::from(chunk.sq_norms)),
    ];
    Ok(RecordBatch::try_new(chunk_schema(), columns)?)
}

/// Bytes and checksum of a file that was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenFile {
    pub bytes: u64,
    /// xxh3-64 of the file's bytes, as 16 hex digits.
    pub checksum: String,
}

/// Writes one chunk as a zstd Parquet file with a single row group, fsyncs it, and returns
/// its size and checksum. `metadata` goes into the file's key-value metadata next to
/// `fsgp.format`.
pub fn write_chunk(
    path: &Path,
    chunk: CsrChunk,
    metadata: &[(String, String)],
) -> Result<WrittenFile> {
    let mut kv = vec![KeyValue::new(
        "fsgp.format".into(),
        CHUNK_FORMAT.to_string(),
    )];
    kv.extend(
        metadata
            .iter()
            .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
    );
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(1)?))
        .set_max_row_group_row_count(Some(chunk.len().max(1)))
        // Feature ids and values are high-entropy; dictionary pages only cost time here.
        .set_dictionary_enabled(false)
        .set_statistics_enabled(EnabledStatistics::Chunk)
        .set_key_value_metadata(Some(kv))
        .build();
    let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let writing = || format!("writing {}", path.display());
    let mut writer =
        ArrowWriter::try_new(file, chunk_schema(), Some(props)).with_context(writing)?;
    let batch = into_record_batch(chunk).with_context(writing)?;
    writer.write(&batch).with_context(writing)?;
    // Where a test's full disk strikes (`chunk-write-enospc:SPLIT/FILE`): the row group is
    // written, the footer is not, so the file in scratch is a torn one.
    failpoint::enospc_at("chunk-write-enospc", split_and_file(path)).with_context(writing)?;
    let file = writer.into_inner().with_context(writing)?;
    synced_and_summed(file, path)
}

/// `SPLIT/FILE` of a chunk's path `…/SPLIT/FILE`: how a failpoint names one chunk.
fn split_and_file(path: &Path) -> String {
    let name = |p: Option<&Path>| {
        p.and_then(Path::file_name)
            .map_or(String::new(), |n| n.to_string_lossy().into_owned())
    };
    format!("{}/{}", name(path.parent()), name(Some(path)))
}

/// Writes `batch` as the one row group of a new Parquet file at `path` with `props`, syncs
/// it and returns its size and checksum: the whole life of the small single-batch files
/// (transform statistics). Checkpoints and model files hold lists too long for Arrow's
/// writer to level cheaply and have their own (`tensors::write_tensors`).
pub fn write_one_batch(
    path: &Path,
    schema: SchemaRef,
    props: WriterProperties,
    batch: &RecordBatch,
) -> Result<WrittenFile> {
    let writing = || format!("writing {}", path.display());
    let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut writer = ArrowWriter::try_new(file, schema, Some(props)).with_context(writing)?;
    writer.write(batch).with_context(writing)?;
    let file = writer.into_inner().with_context(writing)?;
    synced_and_summed(file, path)
}

/// Syncs `file`, just written at `path`, closes it, and returns its size and checksum: how
/// every written artifact ends before its rename.
pub fn synced_and_summed(file: File, path: &Path) -> Result<WrittenFile> {
    file.sync_all()
        .with_context(|| format!("syncing {}", path.display()))?;
    drop(file);
    checksum_file(path)
}

/// xxh3-64 checksum and size of a file.
pub fn checksum_file(path: &Path) -> Result<WrittenFile> {
    let mut file = BufReader::with_capacity(
        1 << 20,
        File::open(path).with_context(|| format!("opening {}", path.display()))?,
    );
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        bytes += n as u64;
    }
    Ok(WrittenFile {
        bytes,
        checksum: format!("{:016x}", hasher.digest()),
    })
}

/// Reads a whole chunk file back, checking its schema (an unregistered file: tests, tools).
pub fn read_chunk(path: &Path) -> Result<CsrChunk> {
    let file = File::open(path).with_context(|| format!("opening chunk {}", path.display()))?;
    decode_chunk(file, path)
}

/// Reads a registered chunk: the whole file, checked against the catalog, then decoded.
pub fn read_registered_chunk(file: &Registered) -> Result<CsrChunk> {
    decode_chunk(bytes::Bytes::from(file.read()?), file.path())
}

fn decode_chunk<R: ChunkReader + 'static>(reader: R, path: &Path) -> Result<CsrChunk> {
    let builder = ParquetRecordBatchReaderBuilder::try_new(reader)
        .with_context(|| format!("reading Parquet footer of {}", path.display()))?;
    if builder.schema().fields() != chunk_schema().fields() {
        bail!(
            "{}: not an fsgp CSR chunk (schema {:?})",
            path.display(),
            builder.schema()
        );
    }
    let mut chunk = CsrChunk::default();
    for batch in builder.with_batch_size(1 << 16).build()? {
        append_batch(&mut chunk, &batch?)?;
    }
    Ok(chunk)
}

/// The row ids and positive labels of a chunk, read without its feature columns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChunkLabels {
    /// Global row ids [n].
    pub row_ids: Vec<u64>,
    /// Offsets into `labels` [n + 1].
    pub offsets: Vec<i32>,
    /// Label ids, sorted within each row.
    pub labels: Vec<u32>,
}

impl ChunkLabels {
    pub fn len(&self) -> usize {
        self.row_ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.row_ids.is_empty()
    }

    /// Positive labels of the chunk's i-th row.
    pub fn row(&self, i: usize) -> &[u32] {
        &self.labels[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }
}

/// How many rows of the given chunks carry each label (`n_labels` slots), reading only the
/// label columns; a label id ≥ `n_labels` is an error naming the chunk.
pub fn label_counts(files: &[Registered], n_labels: usize) -> Result<Vec<u64>> {
    let mut counts = vec![0u64; n_labels];
    for file in files {
        for &l in &read_registered_chunk_labels(file)?.labels {
            let slot = counts
                .get_mut(l as usize)
                .with_context(|| format!("{}: label {l} ≥ L = {n_labels}", file.name()))?;
            *slot += 1;
        }
    }
    Ok(counts)
}

/// Reads only the `row_id` and `labels` columns of a chunk (Parquet column projection), so
/// the trainer's label pass costs a fraction of a full read (an unregistered file).
pub fn read_chunk_labels(path: &Path) -> Result<ChunkLabels> {
    let file = File::open(path).with_context(|| format!("opening chunk {}", path.display()))?;
    decode_chunk_labels(file, path)
}

/// The labels of a registered chunk: the whole file is read and checked against the
/// catalog, only the label columns are decoded.
pub fn read_registered_chunk_labels(file: &Registered) -> Result<ChunkLabels> {
    decode_chunk_labels(bytes::Bytes::from(file.read()?), file.path())
}

fn decode_chunk_labels<R: ChunkReader + 'static>(reader: R, path: &Path) -> Result<ChunkLabels> {
    let builder = ParquetRecordBatchReaderBuilder::try_new(reader)
        .with_context(|| format!("reading Parquet footer of {}", path.display()))?;
    if builder.schema().fields() != chunk_schema().fields() {
        bail!(
            "{}: not an fsgp CSR chunk (schema {:?})",
            path.display(),
            builder.schema()
        );
    }
    let mask = parquet::arrow::ProjectionMask::roots(builder.parquet_schema(), [0, 1]);
    let mut out = ChunkLabels {
        offsets: vec![0],
        ..Default::default()
    };
    for batch in builder
        .with_projection(mask)
        .with_batch_size(1 << 16)
        .build()?
    {
        let batch = batch.with_context(|| format!("decoding {}", path.display()))?;
        out.row_ids
            .extend_from_slice(downcast::<UInt64Array>(&batch, 0)?.values());
        append_list::<UInt32Array, u32>(
            downcast::<ListArray>(&batch, 1)?,
            |a| a.values(),
            &mut out.offsets,
            &mut out.labels,
        )?;
    }
    Ok(out)
}

/// Key-value metadata of a chunk file.
pub fn read_chunk_metadata(path: &Path) -> Result<Vec<(String, String)>> {
    let file = File::open(path).with_context(|| format!("opening chunk {}", path.display()))?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file)?;
    Ok(key_values(builder.metadata().file_metadata()))
}

fn downcast<T: 'static>(batch: &RecordBatch, i: usize) -> Result<&T> {
    batch
        .column(i)
        .as_any()
        .downcast_ref::<T>()
        .with_context(|| {
            format!(
                "column {} has an unexpected type",
                batch.schema().field(i).name()
            )
        })
}

fn append_list<T: Array + 'static, V: Copy>(
    list: &ListArray,
    values_of: impl Fn(&T) -> &[V],
    offsets: &mut Vec<i32>,
    out: &mut Vec<V>,
) -> Result<()> {
    let inner = list
        .values()
        .as_any()
        .downcast_ref::<T>()
        .context("list column has an unexpected item type")?;
    let all = values_of(inner);
    let offs = list.value_offsets();
    let (start, end) = (offs[0] as usize, offs[offs.len() - 1] as usize);
    let base = out.len() as i64 - start as i64;
    out.extend_from_slice(&all[start..end]);
    offsets.extend(offs[1..].iter().map(|&o| (o as i64 + base) as i32));
    Ok(())
}

fn append_batch(chunk: &mut CsrChunk, batch: &RecordBatch) -> Result<()> {
    chunk
        .row_ids
        .extend_from_slice(downcast::<UInt64Array>(batch, 0)?.values());
    append_list::<UInt32Array, u32>(
        downcast::<ListArray>(batch, 1)?,
        |a| a.values(),
        &mut chunk.label_offsets,
        &mut chunk.labels,
    )?;
    let mut value_offsets = Vec::new();
    append_list::<UInt32Array, u32>(
        downcast::<ListArray>(batch, 2)?,
        |a| a.values(),
        &mut chunk.feature_offsets,
        &mut chunk.indices,
    )?;
    append_list::<Float32Array, f32>(
        downcast::<ListArray>(batch, 3)?,
        |a| a.values(),
        &mut value_offsets,
        &mut chunk.values,
    )?;
    if chunk.values.len() != chunk.indices.len() {
        bail!("indices and values lists differ in length");
    }
    chunk
        .sq_norms
        .extend_from_slice(downcast::<Float32Array>(batch, 4)?.values());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn densify_row_scatters_the_stored_features_and_names_a_bad_id() {
        let mut chunk = CsrChunk::default();
        chunk.push_row(RowRef {
            row_id: 7,
            labels: &[1],
            indices: &[0, 3],
            values: &[0.5, -2.0],
            sq_norm: 4.25,
        });
        chunk.push_row(RowRef {
            row_id: 8,
            labels: &[],
            indices: &[1, 5],
            values: &[1.0, 3.0],
            sq_norm: 10.0,
        });
        let mut dense = vec![0.0f64; 4];
        chunk.densify_row(0, 4, |j, v| dense[j] = v as f64).unwrap();
        assert_eq!(dense, [0.5, 0.0, 0.0, -2.0]);
        let err = chunk.densify_row(1, 4, |_, _| {}).unwrap_err().to_string();
        assert!(
            err.contains("row 8: feature 5 is outside the dataset's 4 features"),
            "{err}"
        );
    }

    fn sample() -> CsrChunk {
        let mut c = CsrChunk::default();
        c.push_row(RowRef {
            row_id: 7,
            labels: &[1, 5],
            indices: &[0, 3, 9],
            values: &[0.5, -1.25, f32::MIN_POSITIVE],
            sq_norm: 1.8125,
        });
        c.push_row(RowRef {
            row_id: 8,
            labels: &[],
            indices: &[],
            values: &[],
            sq_norm: 0.0,
        });
        c.push_row(RowRef {
            row_id: 9,
            labels: &[u32::MAX],
            indices: &[2],
            values: &[3.0e-30],
            sq_norm: 0.0,
        });
        c
    }

    #[test]
    fn csr_view_borrows_the_chunk_arrays() {
        let c = sample();
        let x = c.csr_view(10).unwrap();
        assert_eq!((x.rows(), x.cols(), x.nnz()), (3, 10, 4));
        // Zero-copy: the view's arrays are the chunk's.
        assert!(std::ptr::eq(x.indices(), &c.indices[..]));
        assert!(std::ptr::eq(x.data(), &c.values[..]));
        for (i, row) in x.outer_iterator().enumerate() {
            let expected = c.row(i);
            assert_eq!(row.indices(), expected.indices);
            assert_eq!(row.data(), expected.values);
        }
        // A feature id past the column count is refused.
        assert!(c.csr_view(9).is_err());
    }

    #[test]
    fn chunk_round_trips_bit_for_bit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("part-00000.parquet");
        let chunk = sample();
        let meta = vec![("fsgp.split".to_string(), "train".to_string())];
        let written = write_chunk(&path, chunk.clone(), &meta).unwrap();
        assert_eq!(written.bytes, std::fs::metadata(&path).unwrap().len());
        let back = read_chunk(&path).unwrap();
        assert_eq!(back.row_ids, chunk.row_ids);
        assert_eq!(back.label_offsets, chunk.label_offsets);
        assert_eq!(back.labels, chunk.labels);
        assert_eq!(back.feature_offsets, chunk.feature_offsets);
        assert_eq!(back.indices, chunk.indices);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&back.values), bits(&chunk.values));
        assert_eq!(bits(&back.sq_norms), bits(&chunk.sq_norms));
        let kv = read_chunk_metadata(&path).unwrap();
        assert!(kv.contains(&("fsgp.format".into(), CHUNK_FORMAT.into())));
        assert!(kv.contains(&("fsgp.split".into(), "train".into())));
        assert_eq!(checksum_file(&path).unwrap(), written);
        let labels = read_chunk_labels(&path).unwrap();
        assert_eq!(labels.row_ids, chunk.row_ids);
        assert_eq!(labels.offsets, chunk.label_offsets);
        assert_eq!(labels.labels, chunk.labels);
        assert_eq!(labels.row(0), &[1, 5]);
    }

    #[test]
    fn registered_chunks_read_the_same_and_refuse_other_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("part-00000.parquet");
        let written = write_chunk(&path, sample(), &[]).unwrap();
        let file = Registered {
            kind: "chunk",
            owner: "dataset 'd', ingest run 1".into(),
            rel: "datasets/d.run1/train/part-00000.parquet".into(),
            path: path.clone(),
            bytes: written.bytes,
            checksum: written.checksum,
            artifact_id: Some(1),
            verified_at: None,
        };
        assert_eq!(
            read_registered_chunk(&file).unwrap(),
            read_chunk(&path).unwrap()
        );
        assert_eq!(
            read_registered_chunk_labels(&file).unwrap(),
            read_chunk_labels(&path).unwrap()
        );
        let mut bytes = std::fs::read(&path).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        let e = format!("{:#}", read_registered_chunk_labels(&file).unwrap_err());
        assert!(
            e.starts_with("chunk (dataset 'd', ingest run 1, datasets/d.run1/train/part-00000.parquet): checksum mismatch"),
            "{e}"
        );
    }
}
