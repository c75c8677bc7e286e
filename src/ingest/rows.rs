//! Rows a caller holds in memory (the Python package's NumPy and SciPy arrays) as the input
//! of an ingest, instead of a text file: no file is written or parsed, and memory grows by
//! one block of rows at a time, not by a copy of the whole matrix.
//!
//! A [`RowSource`] hands over its rows block by block as (class values, feature pairs), the
//! fields of a LIBSVM line; [`MemoryRows`] reads them through the checks and transform a
//! parsed line goes through ([`PairRows`]), so the same rows give the same chunks, bit for
//! bit, as their LIBSVM text would. The dataset's identity is a checksum of the rows'
//! bytes ([`MemoryRows::checksum`]): fitting the same rows again reuses the dataset, rows
//! that differ in one value do not.
//!
//! A refused row names its row and feature counted from 0, as NumPy counts them
//! ([`RowError`]).

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use anyhow::{ensure, Result};
use xxhash_rust::xxh3::Xxh3;

use crate::progress::Progress;
use crate::stop::StopToken;
use crate::text::parse::{PairRows, Parsed, RowRules};

/// Rows read from a source at a time: what one block of parsed text holds, about.
const BLOCK_ROWS: u64 = 8192;

/// The bytes a (feature, value) pair and a class value count for in ingest's progress.
const PAIR_BYTES: u64 = 16;
const LABEL_BYTES: u64 = 8;

/// Rows handed over by a [`RowSource`]: each row's class values and its (feature, value)
/// pairs, in the order pushed.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct RowBlock {
    labels: Vec<i64>,
    label_ends: Vec<usize>,
    pairs: Vec<(u64, f64)>,
    pair_ends: Vec<usize>,
}

impl RowBlock {
    /// Appends a row: its class values (LIBSVM's label field) and its pairs (0-based
    /// feature ids; a zero value is stored as given).
    pub fn push_row(
        &mut self,
        labels: impl IntoIterator<Item = i64>,
        pairs: impl IntoIterator<Item = (u64, f64)>,
    ) {
        self.labels.extend(labels);
        self.label_ends.push(self.labels.len());
        self.pairs.extend(pairs);
        self.pair_ends.push(self.pairs.len());
    }

    /// The rows pushed.
    pub fn len(&self) -> usize {
        self.pair_ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pair_ends.is_empty()
    }

    /// Row `i`'s class values and pairs.
    pub fn row(&self, i: usize) -> (&[i64], &[(u64, f64)]) {
        let start = |ends: &[usize]| if i == 0 { 0 } else { ends[i - 1] };
        (
            &self.labels[start(&self.label_ends)..self.label_ends[i]],
            &self.pairs[start(&self.pair_ends)..self.pair_ends[i]],
        )
    }

    fn clear(&mut self) {
        self.labels.clear();
        self.label_ends.clear();
        self.pairs.clear();
        self.pair_ends.clear();
    }
}

/// Rows held in memory by the caller, read block by block (from any thread: ingest reads
/// them on its own).
pub trait RowSource: Send + Sync {
    /// N: the rows.
    fn n_rows(&self) -> u64;
    /// D: every feature id is below it.
    fn n_features(&self) -> u32;
    /// Appends rows `rows` (0-based, within `0..n_rows()`) to `out`, one
    /// [`RowBlock::push_row`] each: the class values of a row (one for a binary or
    /// multi-class row, the labels of a multi-label one) and its nonzero (feature, value)
    /// pairs.
    fn read(&self, rows: Range<u64>, out: &mut RowBlock) -> Result<()>;
}

/// A row refused, located as NumPy counts: row and feature from 0.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct RowError {
    /// The row, from 0.
    pub row: u64,
    /// The feature at fault (a column from 0), when one is.
    pub feature: Option<u64>,
    /// What was found and what was expected.
    pub msg: String,
}

impl fmt::Display for RowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "row {} (rows and features counted from 0): {}",
            self.row, self.msg
        )
    }
}

/// A [`RowSource`] with its checksum: the input of an ingest from memory.
#[derive(Clone)]
pub struct MemoryRows {
    source: Arc<dyn RowSource>,
    checksum: String,
    /// Pairs and class values over all rows, for ingest's progress.
    pairs: u64,
    labels: u64,
}

impl MemoryRows {
    /// Reads every row of `source` once to checksum it.
    pub fn new(source: Arc<dyn RowSource>) -> Result<Self> {
        let mut hasher = Xxh3::new();
        hasher.update(&source.n_rows().to_le_bytes());
        hasher.update(&source.n_features().to_le_bytes());
        let (mut pairs, mut labels) = (0u64, 0u64);
        let mut block = RowBlock::default();
        for range in blocks(source.n_rows()) {
            read_block(source.as_ref(), range, &mut block)?;
            for i in 0..block.len() {
                let (row_labels, row_pairs) = block.row(i);
                hash_row(&mut hasher, row_labels, row_pairs);
                labels += row_labels.len() as u64;
                pairs += row_pairs.len() as u64;
            }
        }
        Ok(MemoryRows {
            source,
            checksum: format!("{:016x}", hasher.digest()),
            pairs,
            labels,
        })
    }

    /// xxh3-64 of N, D and every row's class values, feature ids and value bits, 16 hex
    /// digits.
    pub fn checksum(&self) -> &str {
        &self.checksum
    }

    pub fn n_rows(&self) -> u64 {
        self.source.n_rows()
    }

    pub fn n_features(&self) -> u32 {
        self.source.n_features()
    }

    /// The rows' size as ingest's progress counts it.
    pub fn bytes(&self) -> u64 {
        self.pairs * PAIR_BYTES + self.labels * LABEL_BYTES
    }

    /// How the catalog and messages name the rows: their sizes and checksum.
    pub fn describe(&self) -> String {
        format!(
            "rows in memory ({} x {}, xxh3 {})",
            self.n_rows(),
            self.n_features(),
            self.checksum
        )
    }

    /// Reads the rows through `rules` as a parsed LIBSVM file's lines (row i is line i + 1)
    /// and calls `on_block` with each block in order; `progress` counts
    /// [`MemoryRows::bytes`]. A stop request is honoured between blocks.
    pub(crate) fn stream(
        &self,
        rules: &RowRules,
        progress: &Progress,
        stop: &StopToken,
        on_block: &mut dyn FnMut(Parsed) -> Result<()>,
    ) -> Result<()> {
        let mut parser = PairRows::new(rules);
        let mut block = RowBlock::default();
        let base = progress.done();
        let mut read = 0u64;
        for range in blocks(self.n_rows()) {
            stop.check(|| {
                "while reading rows in memory; an unfinished ingest keeps nothing, the same \
                 fit starts it again"
                    .into()
            })?;
            read_block(self.source.as_ref(), range.clone(), &mut block)?;
            for (i, row) in range.clone().enumerate() {
                let (labels, pairs) = block.row(i);
                read += pairs.len() as u64 * PAIR_BYTES + labels.len() as u64 * LABEL_BYTES;
                parser
                    .push_labeled(row + 1, labels, pairs.iter().copied())
                    .map_err(|e| RowError {
                        row,
                        feature: e.feature,
                        msg: e.msg,
                    })?;
            }
            on_block(Parsed {
                first_line: range.start + 1,
                n_lines: range.end - range.start,
                block: parser.take(),
            })?;
            progress.set(base + read);
        }
        Ok(())
    }
}

/// The row ranges of `n` rows, [`BLOCK_ROWS`] at a time.
fn blocks(n: u64) -> impl Iterator<Item = Range<u64>> {
    (0..n)
        .step_by(BLOCK_ROWS as usize)
        .map(move |start| start..(start + BLOCK_ROWS).min(n))
}

/// `rows` of `source` into `block` (cleared first), checked to be one entry per row.
fn read_block(source: &dyn RowSource, rows: Range<u64>, block: &mut RowBlock) -> Result<()> {
    block.clear();
    source.read(rows.clone(), block)?;
    ensure!(
        block.len() as u64 == rows.end - rows.start,
        "the row source gave {} rows for rows {}..{}, expected {}",
        block.len(),
        rows.start,
        rows.end,
        rows.end - rows.start
    );
    Ok(())
}

/// Adds a row to the checksum: its counts first, so rows cannot run into each other.
fn hash_row(hasher: &mut Xxh3, labels: &[i64], pairs: &[(u64, f64)]) {
    hasher.update(&(labels.len() as u64).to_le_bytes());
    for label in labels {
        hasher.update(&label.to_le_bytes());
    }
    hasher.update(&(pairs.len() as u64).to_le_bytes());
    for (id, value) in pairs {
        hasher.update(&id.to_le_bytes());
        hasher.update(&value.to_bits().to_le_bytes());
    }
}

impl fmt::Debug for MemoryRows {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

/// The same rows: the same sizes and checksum.
impl PartialEq for MemoryRows {
    fn eq(&self, other: &Self) -> bool {
        (self.n_rows(), self.n_features(), &self.checksum)
            == (other.n_rows(), other.n_features(), &other.checksum)
    }
}

/// Rows as CSR arrays (0-based, zeros left out): the simplest [`RowSource`], for Rust
/// callers and the tests.
#[derive(Debug, Clone, PartialEq)]
pub struct CsrRows {
    pub n_features: u32,
    /// Row i's pairs are `pairs[indptr[i]..indptr[i + 1]]`, its class values
    /// `labels[label_indptr[i]..label_indptr[i + 1]]`.
    pub indptr: Vec<usize>,
    pub pairs: Vec<(u64, f64)>,
    pub label_indptr: Vec<usize>,
    pub labels: Vec<i64>,
}

impl CsrRows {
    /// Rows of one class value each and their pairs.
    pub fn new(n_features: u32, rows: &[(i64, Vec<(u64, f64)>)]) -> Self {
        let mut out = CsrRows {
            n_features,
            indptr: vec![0],
            pairs: Vec::new(),
            label_indptr: vec![0],
            labels: Vec::new(),
        };
        for (label, pairs) in rows {
            out.labels.push(*label);
            out.label_indptr.push(out.labels.len());
            out.pairs.extend_from_slice(pairs);
            out.indptr.push(out.pairs.len());
        }
        out
    }
}

impl RowSource for CsrRows {
    fn n_rows(&self) -> u64 {
        self.indptr.len() as u64 - 1
    }

    fn n_features(&self) -> u32 {
        self.n_features
    }

    fn read(&self, rows: Range<u64>, out: &mut RowBlock) -> Result<()> {
        for i in rows.start as usize..rows.end as usize {
            out.push_row(
                self.labels[self.label_indptr[i]..self.label_indptr[i + 1]]
                    .iter()
                    .copied(),
                self.pairs[self.indptr[i]..self.indptr[i + 1]]
                    .iter()
                    .copied(),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::ingest::config::IngestConfig;
    use crate::ingest::layouts::{Libsvm, Rows};
    use crate::ingest::validation::ValidationSplit;
    use crate::store::catalog::Split;
    use crate::store::chunks::{read_registered_chunk, CsrChunk};
    use crate::store::workspace::Workspace;
    use crate::transform::TransformChoice;

    /// `n` rows of `d` features of mixed scales with some zeros left out, classes ±1.
    fn rows(n: usize, d: u32, seed: u64) -> CsrRows {
        let mut state = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        let list: Vec<(i64, Vec<(u64, f64)>)> = (0..n)
            .map(|_| {
                let label = if next() < 0.5 { -1 } else { 1 };
                let pairs = (0..u64::from(d))
                    .filter_map(|j| {
                        let v = (next() - 0.5) * 10f64.powi(j as i32 % 4);
                        (next() > 0.2).then_some((j, v))
                    })
                    .collect();
                (label, pairs)
            })
            .collect();
        CsrRows::new(d, &list)
    }

    /// The same rows as LIBSVM text: 1-based ids, values in shortest round-trip form.
    fn libsvm_text(rows: &CsrRows, path: &std::path::Path) {
        let mut out = Vec::new();
        for i in 0..rows.indptr.len() - 1 {
            let labels = &rows.labels[rows.label_indptr[i]..rows.label_indptr[i + 1]];
            let pairs = &rows.pairs[rows.indptr[i]..rows.indptr[i + 1]];
            crate::text::write::libsvm_row(&mut out, labels, pairs).unwrap();
        }
        std::fs::File::create(path)
            .unwrap()
            .write_all(&out)
            .unwrap();
    }

    fn config(name: &str, layout: Box<dyn crate::ingest::input::InputLayout>) -> IngestConfig {
        IngestConfig {
            name: name.into(),
            layout,
            transform: TransformChoice::Auto,
            index_base: 1,
            drop_unlabeled: false,
            lenient: false,
            chunk_rows: Some(3000),
            chunk_mb: 32,
            threads: Some(2),
            replace: false,
            validation: Some(ValidationSplit::fraction(0.2, 7)),
            label_kind: None,
            first_label: false,
            features: Some(7),
            class_map_from_train: false,
        }
    }

    fn memory(rows: CsrRows) -> MemoryRows {
        MemoryRows::new(Arc::new(rows)).unwrap()
    }

    fn chunks(ws: &Workspace, name: &str, split: Split) -> Vec<CsrChunk> {
        let d = ws.dataset_named(name).unwrap();
        let files = ws.split_chunks(&d, split).unwrap();
        files
            .iter()
            .map(|(f, _)| read_registered_chunk(f).unwrap())
            .collect()
    }

    /// Rows in memory and their LIBSVM text give the same dataset: the same splits (the
    /// same carve), chunk for chunk the same row ids, labels, feature ids and value bits,
    /// the same transform, D, L and classes. 20 000 rows span several blocks and chunks.
    #[test]
    fn rows_and_their_libsvm_text_ingest_to_the_same_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(&dir.path().join("ws")).unwrap();
        let source = rows(20_000, 7, 1);
        let text = dir.path().join("rows.svm");
        libsvm_text(&source, &text);
        let from_text = Libsvm {
            train: text,
            test: None,
        };
        crate::ingest::run(&ws, &config("text", Box::new(from_text))).unwrap();
        let from_rows = Rows {
            rows: memory(source),
        };
        crate::ingest::run(&ws, &config("rows", Box::new(from_rows))).unwrap();
        let (a, b) = (
            ws.dataset_named("text").unwrap(),
            ws.dataset_named("rows").unwrap(),
        );
        assert_eq!(
            (a.n_features, a.n_labels, &a.normalization, &a.class_map),
            (b.n_features, b.n_labels, &b.normalization, &b.class_map)
        );
        // New rows of either are LIBSVM text (`predict --input`, a model file's users).
        assert_eq!((&a.format, a.index_base), (&b.format, b.index_base));
        let source = b.params["sources"]["train"].as_str().unwrap();
        assert!(
            source.starts_with("rows in memory (20000 x 7, xxh3 "),
            "{source}"
        );
        assert_ne!(
            a.normalization, "none",
            "the transform is one fitted to the rows"
        );
        for split in [Split::Train, Split::Validation] {
            let (a, b) = (chunks(&ws, "text", split), chunks(&ws, "rows", split));
            assert!(a.len() > 1, "{split:?}: several chunks");
            assert_eq!(a.len(), b.len(), "{split:?}");
            for (x, y) in a.iter().zip(&b) {
                let bits = |c: &CsrChunk| c.values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(x), bits(y), "{split:?}: values bit for bit");
                assert_eq!(x, y, "{split:?}");
            }
        }
    }

    /// The checksum is of the rows' bytes: the same rows give the same one (an ingest of
    /// them again does nothing), rows that differ in one value another.
    #[test]
    fn the_checksum_tells_rows_that_differ_in_one_value_apart() {
        let source = rows(500, 4, 2);
        let mut changed = source.clone();
        changed.pairs[777].1 = f64::from_bits(changed.pairs[777].1.to_bits() ^ 1);
        let (same, other) = (memory(source.clone()), memory(changed));
        assert_eq!(memory(source.clone()).checksum(), same.checksum());
        assert_ne!(same.checksum(), other.checksum());
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(dir.path()).unwrap();
        let ingest = |rows: &MemoryRows| {
            crate::ingest::run(&ws, &config("d", Box::new(Rows { rows: rows.clone() })))
        };
        assert!(ingest(&same).unwrap().ingested);
        assert!(!ingest(&memory(source)).unwrap().ingested, "reused");
        let e = format!("{:#}", ingest(&other).unwrap_err());
        assert!(e.contains("already exists with other inputs"), "{e}");
    }

    /// A non-finite value or a feature beyond D is refused naming its row and feature as
    /// NumPy counts them (from 0), before any dataset is registered.
    #[test]
    fn a_bad_value_is_refused_at_its_row_and_feature() {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(dir.path()).unwrap();
        for (row, feature, value, found) in [
            (2, 1, f64::NAN, "found non-finite value 'NaN' for feature 1"),
            (3, 9, 1.0, "found feature id 9, expected < 7"),
        ] {
            let mut list: Vec<(i64, Vec<(u64, f64)>)> =
                (0..6).map(|i| (i % 2, vec![(0, 1.0), (2, 0.5)])).collect();
            list[row].1.push((feature, value));
            let rows = memory(CsrRows::new(7, &list));
            let e = crate::ingest::run(&ws, &config("bad", Box::new(Rows { rows }))).unwrap_err();
            let located = e.downcast_ref::<RowError>().expect("a row error");
            assert_eq!((located.row, located.feature), (row as u64, Some(feature)));
            let shown = format!("{e:#}");
            assert!(
                shown.contains(&format!(
                    "row {row} (rows and features counted from 0): {found}"
                )),
                "{shown}"
            );
        }
        assert!(ws.catalog.dataset("bad").unwrap().is_none());
    }
}
