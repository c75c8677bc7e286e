//! Minibatches streamed from disk: a producer thread gathers rows of the memory-mapped
//! K_XX̃ (`kxx.npy`), their squared norms and their positive labels (Parquet chunks) into a
//! bounded queue that the trainer consumes.
//!
//! With inducing inputs in input space (`--inducing-inputs free|fixed-rows`, the identity
//! basis) the rows' sparse features are read with their labels, from the same group of
//! chunks, and carried sparse instead ([`RowView::Features`]: nnz values per minibatch,
//! never B·D; the kernel works on them sparse, `kernel/input_space.rs`). A group's chunks
//! are then held whole (features and labels) instead of their label columns: memory is
//! still the queue plus one group, whatever N is. ARD over the input features (`--ard
//! features`) reads the same whole chunks and carries the rows sparse the same way
//! ([`RowView::SparseFeatures`]).
//!
//! Epoch order (seeded, reproducible): the chunks are permuted, consecutive chunks of that
//! order form groups of `window` chunks, and the rows of each group are shuffled and cut
//! into minibatches of B rows (the last minibatch of a group may be smaller). Reads stay
//! sequential at the scale of a group: before a group is used its K_XX̃ rows are announced
//! to the kernel (`madvise(WILLNEED)`), as are the next group's, so the disk streams while
//! the trainer computes. Memory: the queue's minibatches plus one group's labels, whatever
//! N is; the K_XX̃ rows live in the page cache, not in the process.
//!
//! Every random choice derives from (seed, epoch, group) through [`stream_seed`], so a
//! resumed run can skip to any minibatch without replaying the random stream.

use std::ops::Range;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use crossbeam_channel::{bounded, Receiver};
use faer::Mat;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::model::kernel::feature_ard::FeatureRows;
use crate::model::kernel::Rows;
use crate::store::chunks::{
    read_registered_chunk, read_registered_chunk_labels, ChunkLabels, CsrChunk,
};
use crate::store::integrity::Registered;
use crate::store::npy::NpyMap;

/// Stream tags of [`stream_seed`], one per use of randomness.
pub mod streams {
    pub const CHUNK_ORDER: u64 = 1;
    pub const ROW_SHUFFLE: u64 = 2;
    pub const NEGATIVES: u64 = 3;
    pub const INIT: u64 = 4;
    /// The multi-class likelihoods' Monte Carlo noise (`classes.rs`).
    pub const CLASSES: u64 = 5;
}

/// A 64-bit seed for one independent random stream: xxh3 of (seed, tag, indices…).
pub fn stream_seed(seed: u64, tag: u64, indices: &[u64]) -> u64 {
    let mut bytes = Vec::with_capacity(8 * (2 + indices.len()));
    for v in [seed, tag].iter().chain(indices) {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    xxhash_rust::xxh3::xxh3_64(&bytes)
}

/// One chunk file of the training split and the rows it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkSpan {
    pub file: Registered,
    pub first_row: u64,
    pub n_rows: u64,
}

/// How an epoch visits the rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Permuted chunks, rows shuffled within groups of `window` chunks.
    Shuffled { seed: u64, window: usize },
    /// File order (for full passes such as the exact bound).
    Sequential,
}

/// The largest `--epochs` (and `--release-hyper-after`) a run may ask for. An epoch is a
/// full pass over the training rows; the shipped pipelines train 10–50 and nothing here
/// converges slower than a few hundred, so a million is far beyond any run that is meant,
/// while 2⁶³ − 1 (a typo, or a "train forever") would make every step count a sum over
/// that many epochs. It also bounds the epoch-by-epoch sum of [`Planner::steps_in`] where
/// the shuffle changes an epoch's count: at most a million draws of the chunk order.
pub const MAX_EPOCHS: u64 = 1_000_000;

/// The most optimiser steps a budget, a step count or a step interval may name (`--steps`,
/// `--max-steps`, `--checkpoint-every`, `--validate-every`, a checkpoint's step): ten
/// billion steps run for months at the fastest step rate, and stay far from overflowing
/// the step arithmetic.
pub const MAX_STEPS: u64 = 10_000_000_000;

/// The deterministic schedule of minibatches.
#[derive(Debug, Clone)]
pub struct Planner {
    pub chunks: Vec<ChunkSpan>,
    pub batch: usize,
    pub order: Order,
}

impl Planner {
    /// Groups of chunk indices, in the order epoch `epoch` visits them.
    pub fn groups(&self, epoch: u64) -> Vec<Vec<usize>> {
        let mut order: Vec<usize> = (0..self.chunks.len()).collect();
        match self.order {
            Order::Sequential => order.into_iter().map(|c| vec![c]).collect(),
            Order::Shuffled { seed, window } => {
                let mut rng =
                    ChaCha8Rng::seed_from_u64(stream_seed(seed, streams::CHUNK_ORDER, &[epoch]));
                order.shuffle(&mut rng);
                order.chunks(window.max(1)).map(<[usize]>::to_vec).collect()
            }
        }
    }

    fn group_len(&self, group: &[usize]) -> u64 {
        group.iter().map(|&c| self.chunks[c].n_rows).sum()
    }

    fn batches_of(&self, rows: u64) -> u64 {
        rows.div_ceil(self.batch as u64)
    }

    /// Minibatches in epoch `epoch`.
    pub fn batches_in_epoch(&self, epoch: u64) -> u64 {
        self.groups(epoch)
            .iter()
            .map(|g| self.batches_of(self.group_len(g)))
            .sum()
    }

    /// Minibatches in epochs `0..epochs`, at most `cap` (`--max-steps`, or `u64::MAX`).
    /// Closed form when every epoch cuts the same number ([`Self::fixed_epoch_batches`]);
    /// otherwise summed epoch by epoch, stopping at `cap`, and None when that would take
    /// more than [`MAX_EPOCHS`] epochs (a limit `--epochs` is held to, so only a run
    /// recorded before it meets it).
    pub fn steps_in(&self, epochs: u64, cap: u64) -> Option<u64> {
        if let Some(per_epoch) = self.fixed_epoch_batches() {
            return Some(epochs.saturating_mul(per_epoch).min(cap));
        }
        let mut total = 0u64;
        for e in 0..epochs {
            if e == MAX_EPOCHS {
                return None;
            }
            total = total.saturating_add(self.batches_in_epoch(e));
            if total >= cap {
                return Some(cap);
            }
        }
        Some(total)
    }

    /// Minibatches per epoch when the plan makes that count the same in every epoch, found
    /// from the chunk sizes alone (O(chunks), no shuffle drawn); None when the place
    /// the shuffle gives chunks of different lengths changes it.
    ///
    /// An epoch cuts each group of chunks into ⌈rows/B⌉ minibatches. File order, one chunk
    /// per group or one group of every chunk fix the groups' lengths. Otherwise the groups
    /// are ⌊C/w⌋ of w chunks and one of C mod w, and their lengths are fixed when every
    /// chunk has the same length, or — ingest's layout: chunks of `chunk_rows`, the last one
    /// shorter — when the odd chunk yields the same count wherever it falls.
    pub fn fixed_epoch_batches(&self) -> Option<u64> {
        let per_chunk = || self.chunks.iter().map(|c| self.batches_of(c.n_rows)).sum();
        let window = match self.order {
            Order::Sequential => return Some(per_chunk()),
            Order::Shuffled { window, .. } => window.max(1),
        };
        let n_chunks = self.chunks.len();
        if window == 1 {
            return Some(per_chunk());
        }
        if window >= n_chunks {
            return Some(self.batches_of(self.chunks.iter().map(|c| c.n_rows).sum()));
        }
        let (full, rest) = ((n_chunks / window) as u64, (n_chunks % window) as u64);
        let (common, odd) = self.chunk_lengths()?;
        // A group of `k` chunks, all of the common length or one of them the odd one.
        let group = |k: u64, odd: Option<u64>| {
            self.batches_of(match odd {
                None => common * k,
                Some(o) => common * (k - 1) + o,
            })
        };
        let (w, rest_group) = (window as u64, (rest > 0).then_some(rest));
        let Some(odd) = odd else {
            return Some(full * group(w, None) + rest_group.map_or(0, |k| group(k, None)));
        };
        let in_full = (full - 1) * group(w, None)
            + group(w, Some(odd))
            + rest_group.map_or(0, |k| group(k, None));
        let in_rest = rest_group.map(|k| full * group(w, None) + group(k, Some(odd)));
        match in_rest {
            Some(n) if n != in_full => None,
            _ => Some(in_full),
        }
    }

    /// The length every chunk has but at most one, and that one's (None when the lengths
    /// take three values or more, or two values each held by several chunks).
    fn chunk_lengths(&self) -> Option<(u64, Option<u64>)> {
        let common = self.chunks[0].n_rows;
        let mut odd: Vec<u64> = Vec::new();
        for c in &self.chunks {
            if c.n_rows != common {
                odd.push(c.n_rows);
            }
        }
        match odd.as_slice() {
            [] => Some((common, None)),
            [one] => Some((common, Some(*one))),
            // The first chunk may be the odd one out.
            rest if rest.iter().all(|&n| n == rest[0]) && self.chunks.len() == rest.len() + 1 => {
                Some((rest[0], Some(common)))
            }
            _ => None,
        }
    }

    /// Global row ids of group `g` of epoch `epoch`, in the order they are used.
    pub fn group_rows(&self, epoch: u64, g: usize, group: &[usize]) -> Vec<u64> {
        let mut rows: Vec<u64> = group
            .iter()
            .flat_map(|&c| {
                let s = &self.chunks[c];
                s.first_row..s.first_row + s.n_rows
            })
            .collect();
        if let Order::Shuffled { seed, .. } = self.order {
            let mut rng = ChaCha8Rng::seed_from_u64(stream_seed(
                seed,
                streams::ROW_SHUFFLE,
                &[epoch, g as u64],
            ));
            rows.shuffle(&mut rng);
        }
        rows
    }
}

/// What the model reads of each training row (`docs/model.md`, "Free inducing inputs").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowView {
    /// Its coordinates in the svd basis: a row of K_XX̃ [R].
    Basis,
    /// Its raw features x_i [D] (the identity basis X̃ = I_D), kept sparse
    /// ([`Batch::features`]) and read by the kernel as they are ([`Source::rows_of`]);
    /// [`Batch::kxx`] is empty [B×0].
    Features { n_features: usize },
    /// Its raw features kept sparse ([`Batch::features`]), for ARD over the features; the
    /// model computes the rows' basis coordinates itself, so [`Batch::kxx`] is empty [B×0].
    SparseFeatures { n_features: usize },
}

/// The training split's stored inputs: K_XX̃ [N×R] and ‖x_i‖² [N], memory-mapped, and which
/// view of a row the minibatches carry.
pub struct Source {
    pub kxx: NpyMap,
    pub sq_norms: NpyMap,
    pub n_rows: usize,
    pub rank: usize,
    pub view: RowView,
}

impl Source {
    /// From the mapped (and checked) `kxx.npy` and `sq_norms.npy` of an svd run.
    pub fn new(kxx: NpyMap, sq_norms: NpyMap, view: RowView) -> Result<Self> {
        let (n_rows, rank) = kxx.view2::<f32>()?.dim();
        let n_norms = sq_norms.view1::<f32>()?.len();
        ensure!(
            n_norms == n_rows,
            "sq_norms.npy holds {n_norms} rows but kxx.npy holds {n_rows}"
        );
        Ok(Source {
            kxx,
            sq_norms,
            n_rows,
            rank,
            view,
        })
    }

    /// A minibatch's rows as the kernel reads them: its K_XX̃ rows, or with the identity
    /// basis its sparse features [B×D]. (With `--ard features` the rows' basis coordinates
    /// are computed by the model from the sparse features, and this is the empty [B×0].)
    pub fn rows_of<'b>(&self, batch: &'b Batch) -> Rows<'b> {
        match (self.view, &batch.features) {
            (RowView::Features { n_features }, Some(rows)) => Rows::Sparse {
                rows,
                width: n_features,
            },
            _ => Rows::Dense(batch.kxx.as_ref()),
        }
    }

    /// Columns of a minibatch's rows: R, or D for the features.
    pub fn width(&self) -> usize {
        match self.view {
            RowView::Basis => self.rank,
            RowView::Features { n_features } | RowView::SparseFeatures { n_features } => n_features,
        }
    }

    /// Announces the K_XX̃ rows of `spans` to the kernel (asynchronous read-ahead); nothing
    /// when the features are streamed (the chunks are read whole).
    fn will_need(&self, spans: &[&ChunkSpan]) -> Result<()> {
        if self.view != RowView::Basis {
            return Ok(());
        }
        let row_bytes = self.rank * 4;
        for s in spans {
            self.kxx.will_need(
                self.n_rows * row_bytes,
                s.first_row as usize * row_bytes,
                s.n_rows as usize * row_bytes,
            )?;
        }
        Ok(())
    }

    /// Gathers rows into f64: their view [B×R] (K_XX̃ rows), or [B×0] with their sparse
    /// features from `group` (which holds them), and their squared norms [B].
    fn gather(&self, rows: &[u64], group: &GroupRows) -> Result<Gathered> {
        let norms = self.sq_norms.view1::<f32>()?;
        for &r in rows {
            ensure!(
                (r as usize) < self.n_rows,
                "row {r} outside kxx.npy ({} rows)",
                self.n_rows
            );
        }
        let out = match self.view {
            RowView::Basis => self.gather_basis(rows)?,
            RowView::Features { n_features } | RowView::SparseFeatures { n_features } => {
                let mut features = FeatureRows::new();
                for &r in rows {
                    group.sparse_row(r, n_features, &mut features)?;
                }
                let sq = rows.iter().map(|&r| norms[r as usize] as f64).collect();
                return Ok((Mat::zeros(rows.len(), 0), sq, Some(features)));
            }
        };
        let sq = rows.iter().map(|&r| norms[r as usize] as f64).collect();
        Ok((out, sq, None))
    }

    /// K_XX̃ rows [B×R] in f64.
    fn gather_basis(&self, rows: &[u64]) -> Result<Mat<f64>> {
        let kxx = self.kxx.view2::<f32>()?;
        let mut out = Mat::<f64>::zeros(rows.len(), self.rank);
        for (i, &r) in rows.iter().enumerate() {
            for (j, &v) in kxx.row(r as usize).iter().enumerate() {
                out[(i, j)] = v as f64;
            }
        }
        Ok(out)
    }
}

/// A minibatch's rows as [`Source::gather`] reads them: the view, the squared norms and,
/// for [`RowView::Features`] and [`RowView::SparseFeatures`], the sparse rows.
type Gathered = (Mat<f64>, Vec<f64>, Option<FeatureRows>);

/// Which rows of every global minibatch this process takes. One process takes them all;
/// over K MPI ranks, rank r takes the contiguous rows [r·B/K, (r+1)·B/K) of each minibatch
/// of B rows (`docs/scale-out.md`, "train"), so the ranks cover it exactly, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    pub rank: usize,
    pub ranks: usize,
}

impl Share {
    /// Every row: one process.
    pub const WHOLE: Share = Share { rank: 0, ranks: 1 };

    /// Positions of this share's rows in a minibatch of `rows` rows.
    pub fn range(&self, rows: usize) -> Range<usize> {
        self.rank * rows / self.ranks..(self.rank + 1) * rows / self.ranks
    }
}

/// One minibatch, ready for the model: this process's [`Share`] of it (all of it in one
/// process).
#[derive(Debug, Clone)]
pub struct Batch {
    pub epoch: u64,
    /// Position of the minibatch within its epoch (0-based).
    pub index: u64,
    pub last_in_epoch: bool,
    /// Global row ids [B].
    pub rows: Vec<u64>,
    /// The rows' K_XX̃ rows [B×R] (`Kxx_b`); empty [B×0] when they are carried sparse
    /// ([`Batch::features`]).
    pub kxx: Mat<f64>,
    /// ‖x_i‖² [B].
    pub sq_norms: Vec<f64>,
    /// Positive labels of each row, sorted.
    pub positives: Vec<Vec<u32>>,
    /// The rows' sparse features [B×D], with [`RowView::Features`] and
    /// [`RowView::SparseFeatures`] only.
    pub features: Option<FeatureRows>,
    /// Rows in the global minibatch, B (the N/B scaling uses it); `rows.len()` in one
    /// process.
    pub global_len: usize,
    /// Position of this share's first row in the global minibatch (0 in one process).
    pub first: usize,
    /// Positive labels of the global minibatch's rows before this share ([0, `first`)):
    /// sampled negatives are drawn row by row from one stream per step, so a share draws
    /// for these rows too to reach its own rows' draws. Empty in one process.
    pub lead_positives: Vec<Vec<u32>>,
}

/// Where streaming starts and ends.
#[derive(Debug, Clone, Copy)]
pub struct Span {
    pub epoch: u64,
    /// Minibatches of `epoch` to skip (already consumed before a resume).
    pub skip: u64,
    /// First epoch not produced.
    pub end_epoch: u64,
    /// Minibatches produced at most (`u64::MAX`: to the end of `end_epoch - 1`); the
    /// producer stops there without reading further chunks.
    pub max_batches: u64,
}

/// One chunk of a group: its label columns, or the whole chunk when features are streamed.
enum GroupChunk {
    Labels(ChunkLabels),
    Whole(CsrChunk),
}

impl GroupChunk {
    fn len(&self) -> usize {
        match self {
            GroupChunk::Labels(l) => l.len(),
            GroupChunk::Whole(c) => c.len(),
        }
    }

    fn first_row_id(&self) -> Option<u64> {
        match self {
            GroupChunk::Labels(l) => l.row_ids.first().copied(),
            GroupChunk::Whole(c) => c.row_ids.first().copied(),
        }
    }
}

/// One group's chunks (labels, and features when streamed), addressable by global row id.
struct GroupRows {
    chunks: Vec<(u64, GroupChunk)>,
}

impl GroupRows {
    fn load(planner: &Planner, group: &[usize], view: RowView) -> Result<Self> {
        let mut chunks = Vec::with_capacity(group.len());
        for &c in group {
            let span = &planner.chunks[c];
            let chunk = match view {
                RowView::Basis => GroupChunk::Labels(read_registered_chunk_labels(&span.file)?),
                RowView::Features { .. } | RowView::SparseFeatures { .. } => {
                    GroupChunk::Whole(read_registered_chunk(&span.file)?)
                }
            };
            ensure!(
                chunk.len() as u64 == span.n_rows
                    && chunk.first_row_id().unwrap_or(span.first_row) == span.first_row,
                "{}: holds {} rows starting at {:?}, the catalog says {} from {}",
                span.file.name(),
                chunk.len(),
                chunk.first_row_id(),
                span.n_rows,
                span.first_row
            );
            chunks.push((span.first_row, chunk));
        }
        Ok(GroupRows { chunks })
    }

    /// The chunk holding global row `row` and the row's position in it.
    fn locate(&self, row: u64) -> (&GroupChunk, usize) {
        for (first, chunk) in &self.chunks {
            if row >= *first && row < first + chunk.len() as u64 {
                return (chunk, (row - first) as usize);
            }
        }
        unreachable!("row {row} is not in this group")
    }

    fn positives(&self, row: u64) -> Vec<u32> {
        match self.locate(row) {
            (GroupChunk::Labels(labels), i) => labels.row(i).to_vec(),
            (GroupChunk::Whole(chunk), i) => chunk.row(i).labels.to_vec(),
        }
    }
}

impl GroupRows {
    /// Appends row `row`'s sparse features to `out`, checking every id against
    /// `n_features`.
    fn sparse_row(&self, row: u64, n_features: usize, out: &mut FeatureRows) -> Result<()> {
        let (GroupChunk::Whole(chunk), i) = self.locate(row) else {
            unreachable!("features are read whole whenever they are streamed")
        };
        let r = chunk.row(i);
        out.push_checked(r.row_id, r.indices, r.values, n_features)
    }
}

/// Produces this `share` of the minibatches of `span` into `send`; stops early when the
/// receiver is gone.
fn produce(
    source: &Source,
    planner: &Planner,
    span: Span,
    share: Share,
    send: &crossbeam_channel::Sender<Result<Batch>>,
) -> Result<()> {
    let mut left = span.max_batches;
    for epoch in span.epoch..span.end_epoch {
        let groups = planner.groups(epoch);
        let n_batches = planner.batches_in_epoch(epoch);
        let skip = if epoch == span.epoch { span.skip } else { 0 };
        let mut index = 0u64;
        for (g, group) in groups.iter().enumerate() {
            let in_group = planner.batches_of(planner.group_len(group));
            if index + in_group <= skip {
                index += in_group;
                continue;
            }
            if left == 0 {
                return Ok(());
            }
            let spans: Vec<&ChunkSpan> = groups[g..(g + 2).min(groups.len())]
                .iter()
                .flatten()
                .map(|&c| &planner.chunks[c])
                .collect();
            source.will_need(&spans)?;
            let group_rows = GroupRows::load(planner, group, source.view)?;
            let rows = planner.group_rows(epoch, g, group);
            for batch_rows in rows.chunks(planner.batch) {
                if index < skip {
                    index += 1;
                    continue;
                }
                if left == 0 {
                    return Ok(());
                }
                let mine = share.range(batch_rows.len());
                let (lead, own) = (&batch_rows[..mine.start], &batch_rows[mine.clone()]);
                let (kxx, sq_norms, features) = source.gather(own, &group_rows)?;
                let batch = Batch {
                    epoch,
                    index,
                    last_in_epoch: index + 1 == n_batches,
                    rows: own.to_vec(),
                    kxx,
                    sq_norms,
                    positives: own.iter().map(|&r| group_rows.positives(r)).collect(),
                    features,
                    global_len: batch_rows.len(),
                    first: mine.start,
                    lead_positives: lead.iter().map(|&r| group_rows.positives(r)).collect(),
                };
                if send.send(Ok(batch)).is_err() {
                    return Ok(());
                }
                left -= 1;
                index += 1;
            }
        }
    }
    Ok(())
}

/// The consumer's end of the queue, timing how long it waits.
pub struct Prefetcher {
    rx: Option<Receiver<Result<Batch>>>,
    handle: Option<JoinHandle<()>>,
    waited: Duration,
}

impl Prefetcher {
    /// Starts the producer thread with a queue of `capacity` minibatches.
    pub fn spawn(source: Arc<Source>, planner: Arc<Planner>, span: Span, capacity: usize) -> Self {
        Self::spawn_share(source, planner, span, Share::WHOLE, capacity)
    }

    /// [`Prefetcher::spawn`] for this process's `share` of every minibatch (MPI ranks): the
    /// queue holds only those rows, so its memory is the one process's divided by K.
    pub fn spawn_share(
        source: Arc<Source>,
        planner: Arc<Planner>,
        span: Span,
        share: Share,
        capacity: usize,
    ) -> Self {
        let (tx, rx) = bounded(capacity.max(1));
        let handle = std::thread::Builder::new()
            .name("fsgp-prefetch".into())
            .spawn(move || {
                if let Err(e) = produce(&source, &planner, span, share, &tx) {
                    let _ = tx.send(Err(e.context("reading minibatches")));
                }
            })
            .expect("spawning the prefetch thread");
        Prefetcher {
            rx: Some(rx),
            handle: Some(handle),
            waited: Duration::ZERO,
        }
    }

    /// The next minibatch, or None at the end of the span.
    pub fn next_batch(&mut self) -> Option<Result<Batch>> {
        let t = Instant::now();
        let got = self.rx.as_ref()?.recv().ok();
        self.waited += t.elapsed();
        got
    }

    /// Total time spent waiting for the producer.
    pub fn waited(&self) -> Duration {
        self.waited
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        // Dropping the receiver makes the producer's next send fail, so it stops.
        self.rx.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Checks that the chunk spans tile rows 0..n without gaps.
pub fn check_spans(chunks: &[ChunkSpan], n_rows: u64) -> Result<()> {
    let mut next = 0u64;
    for c in chunks {
        ensure!(
            c.first_row == next,
            "{}: starts at row {}, expected {next}",
            c.file.name(),
            c.first_row
        );
        next += c.n_rows;
    }
    ensure!(
        next == n_rows,
        "the chunks hold {next} rows but K_XX̃ has {n_rows}"
    );
    Ok(())
}

/// Chunk spans from the chunk files in order, each with its row count.
pub fn spans_from_rows(files: Vec<(Registered, u64)>) -> Vec<ChunkSpan> {
    let mut first = 0u64;
    files
        .into_iter()
        .map(|(file, n)| {
            let s = ChunkSpan {
                file,
                first_row: first,
                n_rows: n,
            };
            first += n;
            s
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::path::PathBuf;

    fn planner(sizes: &[u64], batch: usize, window: usize) -> Planner {
        let mut first = 0;
        let chunks = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let s = ChunkSpan {
                    file: Registered {
                        kind: "chunk",
                        owner: "a test".into(),
                        rel: format!("c{i}"),
                        path: PathBuf::from(format!("c{i}")),
                        bytes: 0,
                        checksum: String::new(),
                        artifact_id: None,
                        verified_at: None,
                    },
                    first_row: first,
                    n_rows: n,
                };
                first += n;
                s
            })
            .collect();
        Planner {
            chunks,
            batch,
            order: Order::Shuffled { seed: 9, window },
        }
    }

    #[test]
    fn every_row_is_visited_once_per_epoch() {
        let p = planner(&[10, 7, 10, 3], 4, 2);
        for epoch in 0..3 {
            let mut seen = Vec::new();
            let mut batches = 0;
            for (g, group) in p.groups(epoch).iter().enumerate() {
                let rows = p.group_rows(epoch, g, group);
                batches += rows.chunks(4).count() as u64;
                seen.extend(rows);
            }
            assert_eq!(batches, p.batches_in_epoch(epoch));
            seen.sort_unstable();
            assert_eq!(seen, (0..30).collect::<Vec<u64>>());
        }
    }

    #[test]
    fn shares_cover_a_minibatch_in_order() {
        for rows in [0, 1, 5, 64, 500, 501] {
            for ranks in 1..6 {
                let ranges: Vec<_> = (0..ranks)
                    .map(|rank| Share { rank, ranks }.range(rows))
                    .collect();
                assert_eq!(ranges[0].start, 0);
                assert_eq!(ranges[ranks - 1].end, rows);
                assert!(ranges.windows(2).all(|w| w[0].end == w[1].start));
                assert!(ranges.iter().all(|r| r.len() + 1 >= rows / ranks));
            }
        }
        assert_eq!(Share::WHOLE.range(7), 0..7);
    }

    #[test]
    fn epochs_differ_and_repeat_with_the_seed() {
        let p = planner(&[50, 50, 50], 8, 1);
        let order = |e| {
            p.groups(e)
                .iter()
                .enumerate()
                .flat_map(|(g, grp)| p.group_rows(e, g, grp))
                .collect::<Vec<_>>()
        };
        assert_eq!(order(1), order(1));
        assert_ne!(order(0), order(1));
        let q = Planner {
            order: Order::Sequential,
            ..p.clone()
        };
        let seq: Vec<u64> = q
            .groups(0)
            .iter()
            .enumerate()
            .flat_map(|(g, grp)| q.group_rows(0, g, grp))
            .collect();
        assert_eq!(seq, (0..150).collect::<Vec<u64>>());
    }

    /// The per-epoch sum the closed form replaces.
    fn summed(p: &Planner, epochs: u64, cap: u64) -> u64 {
        (0..epochs)
            .map(|e| p.batches_in_epoch(e))
            .sum::<u64>()
            .min(cap)
    }

    #[test]
    fn ingest_layouts_have_a_fixed_count_and_an_odd_chunk_may_not() {
        // The toy workspace: 900 rows in chunks of 200 (the last 100), groups of 2, B = 64.
        let toy = planner(&[200, 200, 200, 200, 100], 64, 2);
        assert_eq!(toy.fixed_epoch_batches(), Some(16));
        assert_eq!(toy.steps_in(6, u64::MAX), Some(96));
        assert_eq!(toy.steps_in(u64::MAX, u64::MAX), Some(u64::MAX));
        assert_eq!(toy.steps_in(u64::MAX, 21), Some(21));
        // The short chunk in a pair gives 3 + 3 + 2 minibatches, alone 3 + 3 + 1.
        let varying = planner(&[10, 10, 10, 10, 5], 7, 2);
        assert_eq!(varying.fixed_epoch_batches(), None);
        let counts: BTreeSet<u64> = (0..40).map(|e| varying.batches_in_epoch(e)).collect();
        assert_eq!(counts, BTreeSet::from([7, 8]));
        assert_eq!(
            varying.steps_in(40, u64::MAX),
            Some(summed(&varying, 40, u64::MAX))
        );
        assert_eq!(varying.steps_in(MAX_EPOCHS + 1, u64::MAX), None);
        assert_eq!(
            varying.steps_in(u64::MAX, 100),
            Some(100),
            "stops at the cap"
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

        /// On random plans (ingest's layout of equal chunks with a shorter last one, one odd
        /// chunk anywhere, or any lengths), the closed form equals the per-epoch sum, and a
        /// fixed count is the count of every epoch.
        #[test]
        fn steps_equal_the_per_epoch_sum(
            layout in 0usize..3,
            common in 1u64..40,
            odd in 1u64..40,
            n_chunks in 1usize..9,
            odd_at in 0usize..9,
            lengths in proptest::collection::vec(1u64..40, 1..9),
            batch in 1usize..30,
            window in 0usize..7,
            seed in 0u64..1000,
            epochs in 0u64..30,
            cap in proptest::option::of(0u64..400),
        ) {
            let sizes: Vec<u64> = match layout {
                0 => (0..n_chunks).map(|i| if i + 1 == n_chunks { odd.min(common) } else { common }).collect(),
                1 => (0..n_chunks).map(|i| if i == odd_at % n_chunks { odd } else { common }).collect(),
                _ => lengths,
            };
            let mut p = planner(&sizes, batch, window);
            p.order = Order::Shuffled { seed, window };
            let cap = cap.unwrap_or(u64::MAX);
            proptest::prop_assert_eq!(p.steps_in(epochs, cap), Some(summed(&p, epochs, cap)));
            if let Some(n) = p.fixed_epoch_batches() {
                for e in 0..30 {
                    proptest::prop_assert_eq!(p.batches_in_epoch(e), n, "epoch {}", e);
                }
            }
            let seq = Planner { order: Order::Sequential, ..p.clone() };
            proptest::prop_assert_eq!(seq.steps_in(epochs, cap), Some(summed(&seq, epochs, cap)));
        }
    }
}
