//! The written, not yet published dataset: what the catalog records of it, and the summary
//! printed after an ingest.

use super::config::IngestConfig;
use super::measure::FittedTransform;
use super::sink::{SplitCounts, WrittenChunk};
use crate::store::catalog::{
    ArtifactKind, ArtifactRow, ClassMap, LabelKind, NewDataset, SourceRow, Split, SplitRow,
};
use crate::store::chunks::WrittenFile;
use crate::store::scaling::SCALING_FILE;
use crate::text::source::SourceInfo;

/// The written (not yet published) dataset.
pub struct Built {
    pub n_features: u64,
    pub n_labels: u64,
    /// (name, counts, rows per chunk) of each split, in chunk order.
    pub splits: Vec<(Split, SplitCounts, usize)>,
    /// Ordered by split and chunk index.
    pub chunks: Vec<WrittenChunk>,
    /// (role, file) of every input read.
    pub sources: Vec<(&'static str, SourceInfo)>,
    /// Skipped-row reasons (the first few) and other remarks for the summary.
    pub skip_reasons: Vec<String>,
    /// Set when the ingest assigned the label ids (LIBSVM, `--first-label`).
    pub label_kind: Option<LabelKind>,
    pub class_map: Option<ClassMap>,
    /// The transform the rows went through, and its per-feature map's file
    /// (`transform.parquet` in the dataset directory) when it has one.
    pub transform: FittedTransform,
    pub transform_file: Option<WrittenFile>,
}

impl Built {
    /// The catalog rows of this dataset once published at `rel`.
    pub fn to_new_dataset(
        &self,
        config: &IngestConfig,
        rel: &str,
        params: serde_json::Value,
    ) -> NewDataset {
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        let mut artifacts: Vec<ArtifactRow> = self
            .chunks
            .iter()
            .map(|c| {
                let split = self.splits[c.split].0;
                let file = c
                    .path
                    .file_name()
                    .expect("chunk file name")
                    .to_string_lossy();
                hasher.update(format!("{split}\t{file}\t{}\n", c.file.checksum).as_bytes());
                ArtifactRow {
                    kind: ArtifactKind::Chunk,
                    path: format!("{rel}/{split}/{file}"),
                    bytes: c.file.bytes,
                    rows: Some(c.rows),
                    checksum: c.file.checksum.clone(),
                    split: Some(split),
                }
            })
            .collect();
        if let Some(file) = &self.transform_file {
            // Part of the dataset's checksum too: the chunks' values depend on it.
            hasher.update(format!("transform\t{SCALING_FILE}\t{}\n", file.checksum).as_bytes());
            artifacts.push(ArtifactRow {
                kind: ArtifactKind::FeatureTransform,
                path: format!("{rel}/{SCALING_FILE}"),
                bytes: file.bytes,
                rows: None,
                checksum: file.checksum.clone(),
                split: None,
            });
        }
        NewDataset {
            name: config.name.clone(),
            format: config.layout.format().into(),
            normalization: self.transform.transform.choice().name().into(),
            transform_reason: Some(self.transform.reason.clone()).filter(|r| !r.is_empty()),
            index_base: config.index_base,
            n_features: self.n_features,
            n_labels: self.n_labels,
            path: rel.to_string(),
            checksum: format!("{:016x}", hasher.digest()),
            params,
            splits: self
                .splits
                .iter()
                .map(|(name, c, chunk_rows)| SplitRow {
                    split: *name,
                    n_rows: c.n_rows,
                    nnz: c.nnz,
                    label_nnz: c.label_nnz,
                    unlabeled_rows: c.unlabeled_rows,
                    dropped_unlabeled: c.dropped_unlabeled,
                    skipped_rows: c.skipped_rows,
                    chunk_rows: *chunk_rows as u64,
                    n_chunks: c.n_chunks,
                    path: format!("{rel}/{name}"),
                })
                .collect(),
            sources: self
                .sources
                .iter()
                .map(|(role, s)| SourceRow {
                    role: role.to_string(),
                    path: s.path.display().to_string(),
                    bytes: s.bytes,
                    checksum: s.checksum.clone(),
                    compression: s.compression.name().into(),
                })
                .collect(),
            artifacts,
            label_kind: self.label_kind,
            class_map: self.class_map.clone(),
        }
    }

    /// Total bytes of the input files.
    pub fn input_bytes(&self) -> u64 {
        self.sources.iter().map(|(_, s)| s.bytes).sum()
    }
}

/// Reports the per-split counts and skip reasons of an ingest, as notes (`crate::progress`).
pub fn print_summary(name: &str, built: &Built, seconds: f64) {
    let bytes = built.input_bytes();
    crate::progress::note(format!(
        "ingested '{name}': D = {}, L = {}, {:.1} MB of input in {seconds:.2} s ({:.1} MB/s)",
        built.n_features,
        built.n_labels,
        bytes as f64 / 1e6,
        bytes as f64 / 1e6 / seconds.max(1e-9)
    ));
    let width = built
        .splits
        .iter()
        .map(|s| s.0.name().len())
        .max()
        .unwrap_or(0)
        .max(6);
    crate::progress::note(format!(
        "{:<width$} {:>10} {:>12} {:>10} {:>10} {:>8} {:>8} {:>7}",
        "split", "rows", "nnz", "positives", "unlabeled", "dropped", "skipped", "chunks"
    ));
    for (split, c, _) in &built.splits {
        crate::progress::note(format!(
            "{:<width$} {:>10} {:>12} {:>10} {:>10} {:>8} {:>8} {:>7}",
            split,
            c.n_rows,
            c.nnz,
            c.label_nnz,
            c.unlabeled_rows,
            c.dropped_unlabeled,
            c.skipped_rows,
            c.n_chunks
        ));
        if c.crlf_lines > 0 {
            crate::progress::note(format!(
                "  ({} CRLF line ends accepted under --lenient)",
                c.crlf_lines
            ));
        }
    }
    if let Some(kind) = built.label_kind {
        let dropped: u64 = built.splits.iter().map(|s| s.1.dropped_unlabeled).sum();
        crate::progress::note(format!("label kind: {kind}"));
        if kind == LabelKind::Binary {
            crate::progress::note("  (binary: 'positives' counts the rows of the positive class, 'unlabeled' the negative rows)");
        } else if dropped > 0 {
            crate::progress::note(format!(
                "  {dropped} rows without a (first) label were dropped"
            ));
        }
    }
    for reason in &built.skip_reasons {
        crate::progress::note(format!("skipped: {reason}"));
    }
}
