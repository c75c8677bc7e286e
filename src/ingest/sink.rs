//! Turning parsed rows into the chunk files of a split.
//!
//! A [`SplitSink`] numbers rows, cuts them into fixed-size chunks and hands full chunks to
//! the [`Encoder`], whose threads write the Parquet files in parallel (each chunk is its own
//! file, so encoding parallelises without coordination).

use std::path::{Path, PathBuf};
use std::thread::ScopedJoinHandle;

use anyhow::{anyhow, Context, Result};
use crossbeam_channel::{bounded, Receiver, Sender};

use crate::store::catalog::Split;
use crate::store::chunks::{write_chunk, CsrChunk, RowRef, WrittenFile};
use crate::store::space::ensure_free;
use crate::text::parse::UNSEEN_CLASS;

/// Smallest and largest automatic chunk sizes, in rows; the largest is also the most
/// `--chunk-rows` accepts, since a chunk is held whole in memory (`threads + 1` of them
/// waiting for the encoder) before it is written.
const MIN_CHUNK_ROWS: usize = 1024;
pub const MAX_CHUNK_ROWS: usize = 1 << 22;
/// The largest `--chunk-mb`: 4 GiB keeps a chunk's list columns far below the 2^31 entries
/// their i32 offsets can address (`docs/formats.md`, "Limits").
pub const MAX_CHUNK_MB: usize = 4096;

struct Job {
    split: usize,
    index: usize,
    path: PathBuf,
    rows: u64,
    chunk: CsrChunk,
    metadata: Vec<(String, String)>,
}

/// A chunk file that was written.
#[derive(Debug, Clone)]
pub struct WrittenChunk {
    pub split: usize,
    pub index: usize,
    pub path: PathBuf,
    pub rows: u64,
    pub file: WrittenFile,
}

/// Encoder threads writing chunk files. Sending blocks while all threads are busy, so at most
/// `threads + 1` full chunks wait in memory.
pub struct Encoder<'scope> {
    jobs: Option<Sender<Job>>,
    handles: Vec<ScopedJoinHandle<'scope, Result<Vec<WrittenChunk>>>>,
}

impl<'scope> Encoder<'scope> {
    pub fn start<'env>(scope: &'scope std::thread::Scope<'scope, 'env>, threads: usize) -> Self {
        let (tx, rx): (Sender<Job>, Receiver<Job>) = bounded(1);
        let handles = (0..threads.max(1))
            .map(|_| {
                let rx = rx.clone();
                scope.spawn(move || {
                    let mut done = Vec::new();
                    for job in rx {
                        // Every error of write_chunk names the chunk's path.
                        let file = write_chunk(&job.path, job.chunk, &job.metadata)?;
                        done.push(WrittenChunk {
                            split: job.split,
                            index: job.index,
                            path: job.path,
                            rows: job.rows,
                            file,
                        });
                    }
                    Ok(done)
                })
            })
            .collect();
        Encoder {
            jobs: Some(tx),
            handles,
        }
    }

    fn submit(&self, job: Job) -> Result<()> {
        self.jobs
            .as_ref()
            .expect("encoder already finished")
            .send(job)
            .map_err(|_| anyhow!("a chunk encoder thread failed"))
    }

    /// Waits for all chunks and returns them ordered by split and index.
    pub fn finish(mut self) -> Result<Vec<WrittenChunk>> {
        self.jobs = None;
        let mut all = Vec::new();
        let mut first_error = None;
        for h in self.handles.drain(..) {
            match h.join() {
                Ok(Ok(done)) => all.extend(done),
                Ok(Err(e)) => {
                    first_error.get_or_insert(e);
                }
                Err(_) => {
                    first_error.get_or_insert(anyhow!("a chunk encoder thread panicked"));
                }
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        all.sort_by_key(|c| (c.split, c.index));
        Ok(all)
    }
}

/// Counts of one split, as registered in the catalog.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SplitCounts {
    pub n_rows: u64,
    pub nnz: u64,
    pub label_nnz: u64,
    pub unlabeled_rows: u64,
    pub dropped_unlabeled: u64,
    pub skipped_rows: u64,
    pub crlf_lines: u64,
    pub n_chunks: u64,
    /// Rows whose class the training rows lack (`--class-map train`), stored without one.
    pub unseen_rows: u64,
}

/// Collects the rows of one split into chunk files under `dir`.
pub struct SplitSink {
    pub split: Split,
    index: usize,
    dir: PathBuf,
    /// Rows per chunk; fixed from the first rows seen unless given.
    chunk_rows: Option<usize>,
    target_bytes: usize,
    drop_unlabeled: bool,
    metadata: Vec<(String, String)>,
    current: CsrChunk,
    pub counts: SplitCounts,
}

impl SplitSink {
    /// `index` orders this split's chunks among all splits of the dataset.
    pub fn new(
        split: Split,
        index: usize,
        dir: &Path,
        chunk_rows: Option<usize>,
        target_bytes: usize,
        drop_unlabeled: bool,
        metadata: Vec<(String, String)>,
    ) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(SplitSink {
            split,
            index,
            dir: dir.to_path_buf(),
            chunk_rows,
            target_bytes,
            drop_unlabeled,
            metadata,
            current: CsrChunk::default(),
            counts: SplitCounts::default(),
        })
    }

    pub fn chunk_rows(&self) -> Option<usize> {
        self.chunk_rows
    }

    /// Fixes the chunk size from the average size of the first rows: the target bytes divided
    /// by bytes per row, rounded down to a multiple of 1024 rows.
    fn decide_chunk_rows(&mut self, sample: &CsrChunk) {
        if self.chunk_rows.is_some() || sample.is_empty() {
            return;
        }
        let per_row = (sample.heap_bytes() / sample.len()).max(1);
        let rows = (self.target_bytes / per_row) / MIN_CHUNK_ROWS * MIN_CHUNK_ROWS;
        self.chunk_rows = Some(rows.clamp(MIN_CHUNK_ROWS, MAX_CHUNK_ROWS));
    }

    /// Adds rows `which` of a parsed block (whose row ids are source line numbers).
    pub fn push_rows(
        &mut self,
        block: &CsrChunk,
        which: impl Iterator<Item = usize>,
        encoder: &Encoder<'_>,
    ) -> Result<()> {
        self.decide_chunk_rows(block);
        for i in which {
            let mut row = block.row(i);
            if row.labels == [UNSEEN_CLASS] {
                self.counts.unseen_rows += 1;
                row.labels = &[];
            } else if row.labels.is_empty() {
                self.counts.unlabeled_rows += 1;
                if self.drop_unlabeled {
                    self.counts.dropped_unlabeled += 1;
                    continue;
                }
            }
            self.counts.nnz += row.indices.len() as u64;
            self.counts.label_nnz += row.labels.len() as u64;
            self.current.push_row(RowRef {
                row_id: self.counts.n_rows,
                ..row
            });
            self.counts.n_rows += 1;
            if Some(self.current.len()) == self.chunk_rows {
                self.flush(encoder)?;
            }
        }
        Ok(())
    }

    fn flush(&mut self, encoder: &Encoder<'_>) -> Result<()> {
        if self.current.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::take(&mut self.current);
        let index = self.counts.n_chunks as usize;
        let first_row = chunk.row_ids[0];
        let mut metadata = self.metadata.clone();
        metadata.extend([
            ("fsgp.chunk_index".to_string(), index.to_string()),
            ("fsgp.first_row".to_string(), first_row.to_string()),
            (
                "fsgp.chunk_rows".to_string(),
                self.chunk_rows.unwrap_or(chunk.len()).to_string(),
            ),
        ]);
        // The chunk's CSR arrays as they are in memory: zstd Parquet of them is no larger
        // (but for tiny chunks' footers). Refused before the file is started, not halfway.
        let name = format!("part-{index:05}.parquet");
        ensure_free(
            &self.dir,
            chunk.heap_bytes() as u64,
            &format!("chunk {name} of split '{}'", self.split),
        )?;
        encoder.submit(Job {
            split: self.index,
            index,
            path: self.dir.join(name),
            rows: chunk.len() as u64,
            chunk,
            metadata,
        })?;
        self.counts.n_chunks += 1;
        Ok(())
    }

    /// Writes the last, partial chunk.
    pub fn close(&mut self, encoder: &Encoder<'_>) -> Result<()> {
        self.flush(encoder)
    }
}
