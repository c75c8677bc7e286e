//! The scorer: one thread that owns the opened model and scores the queued requests in
//! blocks.
//!
//! Batching policy: the scorer takes the first queued request, then every request queued
//! behind it, in arrival order, until the block holds `max_block_rows` rows (a request is
//! never split; one larger than the block is scored alone). It adds no wait of its own:
//! under light load a request is scored as soon as it arrives (the latency of one row),
//! and under heavy load the requests that arrived while the previous block was being
//! scored form the next block (the throughput of the file path's blocks). Requests in a
//! block that ask for the same top-k and probabilities are scored as one chunk: one
//! projection and one GEMM for all their rows, on the scorer's rayon pool.
//!
//! A row's predictions do not depend on the rows beside it: every kernel works row by
//! row, and Monte Carlo noise is drawn from each row's id within its own request. So a
//! served row is the row `predict --input` writes for the same text at the same position.

use anyhow::Result;
use crossbeam_channel::{Receiver, TryRecvError};
use tokio::sync::oneshot;

use crate::failpoint;
use crate::scoring::ranking::Ranking;
use crate::store::chunks::CsrChunk;
use crate::store::predictions::PredictionBlock;

/// One request's rows waiting to be scored, and where its answer goes.
pub struct Job {
    /// Row ids 0..n within the request.
    pub rows: CsrChunk,
    pub top_k: usize,
    pub probabilities: bool,
    /// The request's predictions (one block, row ids as in `rows`), or why it failed. A
    /// closed receiver (the client went away, or the request timed out) is not an error.
    pub reply: oneshot::Sender<Result<PredictionBlock, String>>,
}

/// Scores jobs from `queue` until every sender is gone, `max_block_rows` rows at a time at
/// most (a larger job alone). Returns the number of blocks scored.
pub fn score_queue(
    ranking: &Ranking<'_>,
    queue: &Receiver<Box<Job>>,
    max_block_rows: usize,
) -> u64 {
    let mut blocks = 0;
    let mut held: Option<Box<Job>> = None;
    loop {
        let first = match held.take() {
            Some(job) => job,
            None => match queue.recv() {
                Ok(job) => job,
                Err(_) => return blocks,
            },
        };
        let mut rows = first.rows.len();
        let mut block = vec![*first];
        loop {
            match queue.try_recv() {
                Ok(job) if rows + job.rows.len() <= max_block_rows => {
                    rows += job.rows.len();
                    block.push(*job);
                }
                Ok(job) => {
                    held = Some(job);
                    break;
                }
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        score_block(ranking, block);
        blocks += 1;
    }
}

/// Scores the jobs of one block, grouped by what they ask for, and answers each.
fn score_block(ranking: &Ranking<'_>, mut jobs: Vec<Job>) {
    // The tests of a full queue and of a request timed out while waiting need a scorer
    // known to be busy: `FSGP_FAILPOINT=serve-slow-block:1s` makes every block take 1 s.
    if failpoint::fires("serve-slow-block", "1s") {
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
    while !jobs.is_empty() {
        let key = (jobs[0].top_k, jobs[0].probabilities);
        let (group, rest): (Vec<Job>, Vec<Job>) = jobs
            .into_iter()
            .partition(|j| (j.top_k, j.probabilities) == key);
        jobs = rest;
        // Jobs whose client is gone are not scored.
        let group: Vec<Job> = group.into_iter().filter(|j| !j.reply.is_closed()).collect();
        if group.is_empty() {
            continue;
        }
        let (chunk, group) = concatenated(group);
        let scored = ranking
            .rank_as(&chunk, key.0, key.1)
            .map_err(|e| format!("{e:#}"));
        answer(group, scored);
    }
}

/// The jobs' rows in order, each keeping its id within its request (a lone job's rows
/// are moved, not copied); the jobs keep their row counts for [`answer`].
fn concatenated(jobs: Vec<Job>) -> (CsrChunk, Vec<(usize, Job)>) {
    let mut counted: Vec<(usize, Job)> = jobs.into_iter().map(|j| (j.rows.len(), j)).collect();
    let chunk = match counted.as_mut_slice() {
        [(_, one)] => std::mem::take(&mut one.rows),
        many => {
            let mut chunk = CsrChunk::default();
            for (_, job) in many.iter() {
                for row in job.rows.rows() {
                    chunk.push_row(row);
                }
            }
            chunk
        }
    };
    (chunk, counted)
}

/// Cuts the scored blocks back into one block per job and sends each.
fn answer(jobs: Vec<(usize, Job)>, scored: Result<Vec<PredictionBlock>, String>) {
    let blocks = match scored {
        Ok(blocks) => blocks,
        Err(e) => {
            for (_, job) in jobs {
                let _ = job.reply.send(Err(e.clone()));
            }
            return;
        }
    };
    let mut rows = blocks
        .iter()
        .flat_map(|b| (0..b.len()).map(move |i| (b, i)));
    for (n_rows, job) in jobs {
        let mut out = PredictionBlock::like(&blocks[0]);
        for _ in 0..n_rows {
            let (block, i) = rows.next().expect("one scored row per row");
            out.push_row_of(block, i);
        }
        let _ = job.reply.send(Ok(out));
    }
}
