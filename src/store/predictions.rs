//! Top-k predictions: one zstd Parquet file, one row group per block of rows, written in
//! row order (`docs/formats.md`, "Predictions").
//!
//! | column | type      | meaning                                              |
//! |--------|-----------|------------------------------------------------------|
//! | row_id | u64       | row of the split                                     |
//! | labels | list<u32> | the k best labels by mean f̄, best first (ties: smaller id first) |
//! | scores | list<f32> | their means f̄, same order                            |
//! | probabilities | list<f32> | optional: E_q[σ(f)] of the same labels, same order (`--probabilities`) |
//! | true_class_probability | f32, nullable | multi-class runs only: p(c_i \| x_i) of the row's true class c_i, listed or not; null when the row has no single class |
//!
//! The order is the mean's even when probabilities are stored, so probabilities need not
//! decrease along a row (`docs/formats.md`, "Predictions", has the measurement behind it).
//! A multi-class run ranks by the class probabilities instead, and its `scores` are those
//! probabilities; the `true_class_probability` column marks such a file.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, ensure, Context, Result};
use arrow::array::{Array, Float32Array, ListArray, RecordBatch, UInt32Array, UInt64Array};
use arrow::buffer::OffsetBuffer;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use parquet::file::reader::ChunkReader;

use super::chunks::{synced_and_summed, WrittenFile};
use super::classes::ClassMap;
use super::integrity::Registered;
use crate::failpoint;

/// Value of `fsgp.format` in every predictions file.
pub const PREDICTIONS_FORMAT: &str = "fsgp-predictions/1";

/// The optional columns of a predictions file. A file without either has the three
/// columns every version of the format had, so its bytes are those older binaries wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OptionalColumns {
    /// `probabilities`: a list parallel to `labels` (`predict --probabilities`).
    pub probabilities: bool,
    /// `true_class_probability`: one nullable value per row (multi-class runs).
    pub true_class: bool,
}

impl OptionalColumns {
    /// Every combination, the one without optional columns first.
    const ALL: [OptionalColumns; 4] = [
        OptionalColumns::with(false, false),
        OptionalColumns::with(true, false),
        OptionalColumns::with(false, true),
        OptionalColumns::with(true, true),
    ];

    /// `probabilities` and `true_class`, in that order.
    pub const fn with(probabilities: bool, true_class: bool) -> Self {
        OptionalColumns {
            probabilities,
            true_class,
        }
    }
}

/// The schema with the optional columns `columns`: row_id, labels, scores, then
/// probabilities and true_class_probability when present.
pub fn predictions_schema(columns: OptionalColumns) -> SchemaRef {
    let item = |t| Arc::new(Field::new("item", t, false));
    let mut fields = vec![
        Field::new("row_id", DataType::UInt64, false),
        Field::new("labels", DataType::List(item(DataType::UInt32)), false),
        Field::new("scores", DataType::List(item(DataType::Float32)), false),
    ];
    if columns.probabilities {
        fields.push(Field::new(
            "probabilities",
            DataType::List(item(DataType::Float32)),
            false,
        ));
    }
    if columns.true_class {
        // Null for a row without exactly one class (a class unseen in training, or a
        // malformed row that evaluate then refuses, naming it).
        fields.push(Field::new(
            "true_class_probability",
            DataType::Float32,
            true,
        ));
    }
    Arc::new(Schema::new(fields))
}

/// A block of predicted rows: row i has labels[offsets[i]..offsets[i+1]] (and scores, and
/// probabilities when the block carries them).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PredictionBlock {
    pub row_ids: Vec<u64>,
    pub offsets: Vec<i32>,
    pub labels: Vec<u32>,
    pub scores: Vec<f32>,
    /// Parallel to `labels` when present.
    pub probabilities: Option<Vec<f32>>,
    /// Parallel to `row_ids` when present (multi-class predictions): the predictive
    /// probability of each row's true class, None for a row without exactly one class.
    pub true_class: Option<Vec<Option<f32>>>,
}

impl PredictionBlock {
    pub fn new() -> Self {
        PredictionBlock {
            offsets: vec![0],
            ..Default::default()
        }
    }

    /// An empty block whose rows carry probabilities.
    pub fn with_probabilities() -> Self {
        PredictionBlock {
            offsets: vec![0],
            probabilities: Some(Vec::new()),
            ..Default::default()
        }
    }

    /// Appends a row with probabilities (the block must have been made by
    /// [`PredictionBlock::with_probabilities`]).
    pub fn push_with_probabilities(
        &mut self,
        row_id: u64,
        labels: &[u32],
        scores: &[f32],
        probabilities: &[f32],
    ) {
        debug_assert_eq!(labels.len(), probabilities.len());
        self.probabilities
            .as_mut()
            .expect("block without probabilities")
            .extend_from_slice(probabilities);
        self.push(row_id, labels, scores);
    }

    /// Probabilities of the block's i-th row, when it carries them.
    pub fn probabilities(&self, i: usize) -> Option<&[f32]> {
        self.probabilities
            .as_ref()
            .map(|p| &p[self.offsets[i] as usize..self.offsets[i + 1] as usize])
    }

    pub fn len(&self) -> usize {
        self.row_ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.row_ids.is_empty()
    }

    pub fn push(&mut self, row_id: u64, labels: &[u32], scores: &[f32]) {
        debug_assert_eq!(labels.len(), scores.len());
        self.row_ids.push(row_id);
        self.labels.extend_from_slice(labels);
        self.scores.extend_from_slice(scores);
        self.offsets.push(self.labels.len() as i32);
    }

    /// An empty block carrying the optional columns `other` carries.
    pub fn like(other: &PredictionBlock) -> Self {
        PredictionBlock {
            offsets: vec![0],
            probabilities: other.probabilities.as_ref().map(|_| Vec::new()),
            true_class: other.true_class.as_ref().map(|_| Vec::new()),
            ..Default::default()
        }
    }

    /// Appends row `i` of `other`, a block with the same optional columns.
    pub fn push_row_of(&mut self, other: &PredictionBlock, i: usize) {
        if let (Some(to), Some(from)) = (self.probabilities.as_mut(), other.probabilities(i)) {
            to.extend_from_slice(from);
        }
        if let (Some(to), Some(from)) = (self.true_class.as_mut(), &other.true_class) {
            to.push(from[i]);
        }
        self.push(other.row_ids[i], other.labels(i), other.scores(i));
    }

    /// Labels of the block's i-th row, best first.
    pub fn labels(&self, i: usize) -> &[u32] {
        &self.labels[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }

    pub fn scores(&self, i: usize) -> &[f32] {
        &self.scores[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }

    /// The optional columns the block carries.
    pub fn columns(&self) -> OptionalColumns {
        OptionalColumns::with(self.probabilities.is_some(), self.true_class.is_some())
    }

    /// The class probabilities of the block's i-th row, when it has them: its
    /// `probabilities`, or else, in a multi-class block (one carrying the true class's
    /// probability), its `scores`, which are the same probabilities.
    pub fn class_probabilities(&self, i: usize) -> Option<&[f32]> {
        match (self.probabilities(i), &self.true_class) {
            (Some(p), _) => Some(p),
            (None, Some(_)) => Some(self.scores(i)),
            (None, None) => None,
        }
    }

    /// The i-th row's probability of its true class: None when the block does not carry
    /// the column (predictions written before it existed), Some(None) when the row has no
    /// single class.
    pub fn true_class_probability(&self, i: usize) -> Option<Option<f32>> {
        self.true_class.as_ref().map(|t| t[i])
    }

    fn to_batch(&self) -> Result<RecordBatch> {
        let list = |t, values: Arc<dyn Array>| {
            ListArray::new(
                Arc::new(Field::new("item", t, false)),
                OffsetBuffer::new(self.offsets.clone().into()),
                values,
                None,
            )
        };
        let mut columns: Vec<Arc<dyn Array>> = vec![
            Arc::new(UInt64Array::from(self.row_ids.clone())),
            Arc::new(list(
                DataType::UInt32,
                Arc::new(UInt32Array::from(self.labels.clone())),
            )),
            Arc::new(list(
                DataType::Float32,
                Arc::new(Float32Array::from(self.scores.clone())),
            )),
        ];
        if let Some(p) = &self.probabilities {
            columns.push(Arc::new(list(
                DataType::Float32,
                Arc::new(Float32Array::from(p.clone())),
            )));
        }
        if let Some(t) = &self.true_class {
            ensure!(
                t.len() == self.row_ids.len(),
                "{} true-class probabilities for {} rows",
                t.len(),
                self.row_ids.len()
            );
            columns.push(Arc::new(Float32Array::from(t.clone())));
        }
        Ok(RecordBatch::try_new(
            predictions_schema(self.columns()),
            columns,
        )?)
    }
}

/// Bytes of the predictions of `rows` rows with `top_k` labels each, as Arrow holds them
/// before Parquet encodes them (row id u64; labels u32 and scores f32, probabilities f32
/// when written, each list with an i32 offset; the true class's probability f32 and a
/// validity bit, counted as a byte, when written): zstd Parquet of these is no larger, but
/// for its footer, which this allows for. The free-space check before predicting uses it.
pub fn uncompressed_bytes(rows: u64, top_k: usize, columns: OptionalColumns) -> u64 {
    const FOOTER: u64 = 4096;
    let lists = if columns.probabilities { 3 } else { 2 };
    let true_class = if columns.true_class { 4 + 1 } else { 0 };
    let per_row = 8 + lists * (4 + 4 * top_k as u64) + true_class;
    rows * per_row + FOOTER
}

/// Streams blocks into one Parquet file; each block becomes a row group.
pub struct PredictionWriter {
    writer: ArrowWriter<File>,
    path: std::path::PathBuf,
    columns: OptionalColumns,
    /// Blocks written so far.
    blocks: u64,
}

impl PredictionWriter {
    /// Every block written must carry exactly the optional `columns`.
    pub fn create(
        path: &Path,
        metadata: &[(String, String)],
        columns: OptionalColumns,
    ) -> Result<Self> {
        let mut kv = vec![KeyValue::new(
            "fsgp.format".into(),
            PREDICTIONS_FORMAT.to_string(),
        )];
        kv.extend(
            metadata
                .iter()
                .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
        );
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?))
            .set_key_value_metadata(Some(kv))
            .build();
        let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
        Ok(PredictionWriter {
            writer: ArrowWriter::try_new(file, predictions_schema(columns), Some(props))?,
            path: path.to_path_buf(),
            columns,
            blocks: 0,
        })
    }

    pub fn write(&mut self, block: &PredictionBlock) -> Result<()> {
        if block.columns() != self.columns {
            bail!(
                "{}: block and file disagree on the optional columns (block {:?}, file {:?})",
                self.path.display(),
                block.columns(),
                self.columns
            );
        }
        let writing = || format!("writing {}", self.path.display());
        let batch = block.to_batch()?;
        self.writer.write(&batch).with_context(writing)?;
        // One row group per block keeps the writer's buffers bounded by a block.
        self.writer.flush().with_context(writing)?;
        self.blocks += 1;
        // Where a test's full disk strikes (`predictions-write-enospc:BLOCK`, counted from
        // 1): that block is in the file, the footer is not.
        failpoint::enospc_at("predictions-write-enospc", self.blocks).with_context(writing)?;
        Ok(())
    }

    /// Closes and fsyncs the file; returns its size and checksum.
    pub fn finish(self) -> Result<WrittenFile> {
        let file = self
            .writer
            .into_inner()
            .with_context(|| format!("writing {}", self.path.display()))?;
        synced_and_summed(file, &self.path)
    }
}

/// Label id → the name printed: the original label (the class map's value) when ingest
/// assigned the ids, else the id itself.
pub fn label_name(classes: Option<&ClassMap>, id: u32) -> i64 {
    classes
        .and_then(|map| map.value_of(id))
        .unwrap_or(i64::from(id))
}

/// One row of predictions as JSON, labels by their original names: a line of `predict
/// --input --format jsonl` and a row of `serve`'s answer (one definition, so a served row
/// is the file's line).
#[derive(Debug, serde::Serialize)]
pub struct JsonRow<'a> {
    /// The row's id: its position among the input's rows (or the request's).
    pub row: u64,
    pub labels: Vec<i64>,
    pub scores: &'a [f32],
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probabilities: Option<&'a [f32]>,
    /// Multi-class runs only; null for a row without a (known) class.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub true_class_probability: Option<Option<f32>>,
}

impl<'a> JsonRow<'a> {
    /// Row `i` of `block`, its labels named through `classes`.
    pub fn of(block: &'a PredictionBlock, i: usize, classes: Option<&ClassMap>) -> Self {
        JsonRow {
            row: block.row_ids[i],
            labels: block
                .labels(i)
                .iter()
                .map(|&id| label_name(classes, id))
                .collect(),
            scores: block.scores(i),
            probabilities: block.probabilities(i),
            true_class_probability: block.true_class_probability(i),
        }
    }
}

/// Reads a predictions file block by block (bounded memory).
pub struct PredictionReader {
    inner: ParquetRecordBatchReader,
    path: std::path::PathBuf,
    /// The optional columns the file has.
    pub columns: OptionalColumns,
    /// The file's key-value metadata (`fsgp.format`, `fsgp.dataset`, `fsgp.split`, ...).
    pub metadata: BTreeMap<String, String>,
}

impl PredictionReader {
    /// Opens a predictions file that is not registered (given by path).
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        Self::decode_from(file, path)
    }

    /// Opens a registered predictions file: read whole, checked against the catalog (the
    /// file is one row group per chunk of the split, a few MB per million rows at k = 5).
    pub fn open_registered(file: &Registered) -> Result<Self> {
        Self::decode_from(bytes::Bytes::from(file.read()?), file.path())
    }

    fn decode_from<R: ChunkReader + 'static>(reader: R, path: &Path) -> Result<Self> {
        let builder = ParquetRecordBatchReaderBuilder::try_new(reader)
            .with_context(|| format!("reading Parquet footer of {}", path.display()))?;
        let metadata: BTreeMap<String, String> = builder
            .metadata()
            .file_metadata()
            .key_value_metadata()
            .into_iter()
            .flatten()
            .filter_map(|kv| Some((kv.key.clone(), kv.value.clone()?)))
            .collect();
        if metadata.get("fsgp.format").map(String::as_str) != Some(PREDICTIONS_FORMAT) {
            bail!(
                "{}: not an fsgp predictions file (fsgp.format is not {PREDICTIONS_FORMAT})",
                path.display()
            );
        }
        let fields = builder.schema().fields();
        let Some(columns) = OptionalColumns::ALL
            .into_iter()
            .find(|&c| predictions_schema(c).fields() == fields)
        else {
            bail!(
                "{}: not an fsgp predictions file (expected columns row_id, labels, scores[, \
                 probabilities][, true_class_probability])",
                path.display()
            );
        };
        Ok(PredictionReader {
            inner: builder.with_batch_size(1 << 14).build()?,
            path: path.to_path_buf(),
            columns,
            metadata,
        })
    }
}

impl Iterator for PredictionReader {
    type Item = Result<PredictionBlock>;

    fn next(&mut self) -> Option<Self::Item> {
        let batch = self.inner.next()?;
        Some(
            batch
                .with_context(|| format!("decoding {}", self.path.display()))
                .and_then(|batch| self.decode(&batch))
                .with_context(|| format!("{}: malformed predictions", self.path.display())),
        )
    }
}

impl PredictionReader {
    fn decode(&self, batch: &RecordBatch) -> Result<PredictionBlock> {
        let rows = batch
            .column(0)
            .as_any()
            .downcast_ref::<UInt64Array>()
            .context("row_id is not u64")?;
        let (lo, labels) = list_column::<UInt32Array>(batch, 1, "labels")?;
        let (so, scores) = list_column::<Float32Array>(batch, 2, "scores")?;
        let probabilities = if self.columns.probabilities {
            Some(list_column::<Float32Array>(batch, 3, "probabilities")?)
        } else {
            None
        };
        let mut block = match probabilities {
            Some(_) => PredictionBlock::with_probabilities(),
            None => PredictionBlock::new(),
        };

        let slice = |offsets: &[i32], i: usize| offsets[i] as usize..offsets[i + 1] as usize;
        for i in 0..batch.num_rows() {
            let l = &labels.values()[slice(lo, i)];
            let s = &scores.values()[slice(so, i)];
            ensure!(
                l.len() == s.len(),
                "row {i}: labels and scores differ in length"
            );
            match probabilities {
                Some((po, pv)) => {
                    let p = &pv.values()[slice(po, i)];
                    ensure!(
                        p.len() == l.len(),
                        "row {i}: labels and probabilities differ in length"
                    );
                    block.push_with_probabilities(rows.value(i), l, s, p);
                }
                None => block.push(rows.value(i), l, s),
            }
        }
        if self.columns.true_class {
            // The last column: after probabilities when the file has them.
            let at = 3 + usize::from(self.columns.probabilities);
            let values = batch
                .column(at)
                .as_any()
                .downcast_ref::<Float32Array>()
                .context("true_class_probability is not f32")?;
            block.true_class = Some(values.iter().collect());
        }
        Ok(block)
    }
}

/// The offsets and the flat item array of list column `i`, whose items must be `A`.
fn list_column<'a, A: Array + 'static>(
    batch: &'a RecordBatch,
    i: usize,
    name: &str,
) -> Result<(&'a [i32], &'a A)> {
    let list = batch
        .column(i)
        .as_any()
        .downcast_ref::<ListArray>()
        .with_context(|| format!("{name} is not a list column"))?;
    let items = list
        .values()
        .as_any()
        .downcast_ref::<A>()
        .with_context(|| format!("{name} has the wrong item type"))?;
    Ok((list.value_offsets(), items))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn predictions_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.parquet");
        let meta = [("fsgp.split".into(), "test".into())];
        let mut w = PredictionWriter::create(&path, &meta, OptionalColumns::default()).unwrap();
        let mut a = PredictionBlock::new();
        a.push(0, &[3, 1], &[0.5, -0.25]);
        a.push(1, &[], &[]);
        let mut b = PredictionBlock::new();
        b.push(2, &[7, 8, 9], &[f32::MAX, 0.0, -1e-30]);
        w.write(&a).unwrap();
        w.write(&b).unwrap();
        w.finish().unwrap();
        let blocks: Vec<PredictionBlock> = PredictionReader::open(&path)
            .unwrap()
            .map(|b| b.unwrap())
            .collect();
        let mut all = PredictionBlock::new();
        for blk in &blocks {
            for i in 0..blk.len() {
                all.push(blk.row_ids[i], blk.labels(i), blk.scores(i));
            }
        }
        let mut expected = a.clone();
        expected.push(2, &[7, 8, 9], &[f32::MAX, 0.0, -1e-30]);
        assert_eq!(all, expected);
    }

    #[test]
    fn predictions_with_probabilities_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.parquet");
        let mut w =
            PredictionWriter::create(&path, &[], OptionalColumns::with(true, false)).unwrap();
        let mut a = PredictionBlock::with_probabilities();
        a.push_with_probabilities(5, &[2, 0], &[1.5, -0.5], &[0.75, 0.375]);
        a.push_with_probabilities(6, &[], &[], &[]);
        assert!(w.write(&PredictionBlock::new()).is_err());
        w.write(&a).unwrap();
        w.finish().unwrap();
        let reader = PredictionReader::open(&path).unwrap();
        assert_eq!(reader.columns, OptionalColumns::with(true, false));
        assert_eq!(reader.metadata["fsgp.format"], PREDICTIONS_FORMAT);
        let blocks: Vec<PredictionBlock> = reader.map(|b| b.unwrap()).collect();
        assert_eq!(blocks, vec![a]);
        assert_eq!(blocks[0].probabilities(0), Some(&[0.75f32, 0.375][..]));
        // Not a multi-class file: no true class, and the scores are not probabilities.
        assert_eq!(blocks[0].true_class_probability(0), None);
        assert_eq!(
            blocks[0].class_probabilities(0),
            Some(&[0.75f32, 0.375][..])
        );
    }

    /// A multi-class file's true-class column, with and without `probabilities`: values and
    /// nulls come back as written, and the scores stand for the class probabilities when
    /// the file has no `probabilities` column.
    #[test]
    fn true_class_probabilities_round_trip_with_their_nulls() {
        for with_probabilities in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("p.parquet");
            let columns = OptionalColumns::with(with_probabilities, true);
            let mut w = PredictionWriter::create(&path, &[], columns).unwrap();
            let mut a = match with_probabilities {
                true => PredictionBlock::with_probabilities(),
                false => PredictionBlock::new(),
            };
            for (id, labels, p) in [(0, [1u32, 0], [0.5f32, 0.25]), (1, [2, 1], [0.625, 0.25])] {
                match with_probabilities {
                    true => a.push_with_probabilities(id, &labels, &p, &p),
                    false => a.push(id, &labels, &p),
                }
            }
            // Row 0's class (2) is not listed; row 1 has no single class.
            a.true_class = Some(vec![Some(0.125), None]);
            // A block without the column is refused by a file that has it.
            let mut plain = a.clone();
            plain.true_class = None;
            assert!(w.write(&plain).is_err());
            w.write(&a).unwrap();
            w.finish().unwrap();
            let reader = PredictionReader::open(&path).unwrap();
            assert_eq!(reader.columns, columns);
            let blocks: Vec<PredictionBlock> = reader.map(|b| b.unwrap()).collect();
            assert_eq!(blocks, vec![a]);
            let b = &blocks[0];
            assert_eq!(b.true_class_probability(0), Some(Some(0.125)));
            assert_eq!(b.true_class_probability(1), Some(None));
            assert_eq!(b.class_probabilities(1), Some(&[0.625f32, 0.25][..]));
        }
    }

    #[test]
    fn a_block_with_too_few_true_class_values_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.parquet");
        let mut w =
            PredictionWriter::create(&path, &[], OptionalColumns::with(false, true)).unwrap();
        let mut a = PredictionBlock::new();
        a.push(0, &[0], &[1.0]);
        a.push(1, &[0], &[1.0]);
        a.true_class = Some(vec![Some(1.0)]);
        let err = w.write(&a).unwrap_err();
        assert!(
            format!("{err:#}").contains("1 true-class probabilities for 2 rows"),
            "{err:#}"
        );
    }
}
