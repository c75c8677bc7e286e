//! The parallel parse pipeline: a reader thread cuts the input into blocks of lines, worker
//! threads parse them, and the caller receives the parsed blocks in file order.
//!
//! Memory is bounded: the reader must take a credit before reading a block, and a credit is
//! returned only when the caller has consumed a block, so at most `in_flight` blocks (text or
//! parsed) exist at any time, whatever the file size.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{anyhow, bail, Result};
use crossbeam_channel::{bounded, unbounded};

use super::rows::MemoryRows;
use crate::error::LineError;
use crate::progress::Progress;
use crate::stop::StopToken;
use crate::text::parse::{parse_block, parse_bow_block, LineSyntax, RowRules};
use crate::text::source::{LineSource, SourceInfo, TextBlock};

/// Target size of one text block handed to a parser thread.
const BLOCK_BYTES: usize = 4 << 20;

/// What is streamed: one file of rows, or a BoW pair read in lockstep.
pub enum RowInput {
    Lines {
        source: LineSource,
        syntax: LineSyntax,
    },
    Bow {
        features: LineSource,
        labels: LineSource,
    },
    /// Rows in memory: read block by block on the calling thread, no text.
    Rows(MemoryRows),
}

pub use crate::text::parse::Parsed;

enum Work {
    Lines(u64, LineSyntax, TextBlock),
    Bow(u64, TextBlock, TextBlock),
}

/// Streams `input` (whose header was already read) through `threads` parser threads and
/// calls `on_block` with each parsed block in order. Returns the sources read through.
pub fn stream_rows(
    input: RowInput,
    rules: &RowRules,
    threads: usize,
    progress: &Progress,
    stop: &StopToken,
    on_block: &mut dyn FnMut(Parsed) -> Result<()>,
) -> Result<Vec<SourceInfo>> {
    let input = match input {
        // No file is read through: no source to record.
        RowInput::Rows(rows) => {
            return rows
                .stream(rules, progress, stop, on_block)
                .map(|()| Vec::new())
        }
        input => input,
    };
    let threads = threads.max(1);
    let in_flight = 2 * threads + 2;
    let paths: Vec<PathBuf> = match &input {
        RowInput::Lines { source, .. } => vec![source.path().to_path_buf()],
        RowInput::Bow { features, labels } => {
            vec![features.path().to_path_buf(), labels.path().to_path_buf()]
        }
        // Returned above; an error rather than a panic should that ever change.
        RowInput::Rows(_) => bail!("internal: rows in memory reached the text reader"),
    };
    let locate = |(source, e): (usize, LineError)| anyhow!(e.in_file(&paths[source]));

    std::thread::scope(|scope| {
        let (work_tx, work_rx) = bounded::<Work>(threads);
        let (done_tx, done_rx) = unbounded::<(u64, Result<Parsed, (usize, LineError)>)>();
        let (credit_tx, credit_rx) = bounded::<()>(in_flight);
        for _ in 0..in_flight {
            credit_tx.send(()).expect("fresh channel");
        }

        // Parsed-out text buffers go back to the reader for reuse.
        let (free_tx, free_rx) = bounded::<Vec<u8>>(in_flight);
        let reader = scope.spawn(move || read_blocks(input, work_tx, credit_rx, free_rx, progress));

        for _ in 0..threads {
            let work_rx = work_rx.clone();
            let done_tx = done_tx.clone();
            let free_tx = free_tx.clone();
            scope.spawn(move || {
                for work in work_rx {
                    let (seq, result, text) = parse_work(work, rules);
                    let _ = free_tx.try_send(text);
                    if done_tx.send((seq, result)).is_err() {
                        break;
                    }
                }
            });
        }
        drop((work_rx, done_tx, free_tx));

        let mut pending = BTreeMap::new();
        let mut next = 0u64;
        let consumed: Result<()> = (|| {
            for (seq, result) in done_rx.iter() {
                pending.insert(seq, result);
                while let Some(result) = pending.remove(&next) {
                    // Between blocks: the run keeps nothing yet, so it ends here whole.
                    stop.check(|| {
                        format!(
                            "while reading {}; an unfinished ingest keeps nothing, the same \
                             command starts it again",
                            paths[0].display()
                        )
                    })?;
                    on_block(result.map_err(locate)?)?;
                    next += 1;
                    // The reader may have exited already; a lost credit is harmless then.
                    let _ = credit_tx.send(());
                }
            }
            Ok(())
        })();
        // Unblock the reader and the workers before joining them.
        drop((done_rx, credit_tx));
        let sources = reader
            .join()
            .map_err(|_| anyhow!("reader thread panicked"))?;
        consumed?;
        let sources = sources?;
        if !pending.is_empty() {
            return Err(anyhow!(
                "internal error: parsed blocks were left unconsumed"
            ));
        }
        Ok(sources)
    })
}

/// Parses one unit of work; also returns the main text buffer for reuse.
fn parse_work(work: Work, rules: &RowRules) -> (u64, Result<Parsed, (usize, LineError)>, Vec<u8>) {
    match work {
        Work::Lines(seq, syntax, text) => {
            let result = parse_block(&text.bytes, text.first_line, text.terminated, syntax, rules)
                .map(|block| Parsed {
                    first_line: text.first_line,
                    n_lines: text.n_lines,
                    block,
                });
            (seq, result, text.bytes)
        }
        Work::Bow(seq, feats, labels) => {
            let result = parse_bow_block(
                &feats.bytes,
                &labels.bytes,
                feats.first_line,
                (feats.terminated, labels.terminated),
                rules,
            )
            .map(|block| Parsed {
                first_line: feats.first_line,
                n_lines: feats.n_lines,
                block,
            });
            (seq, result, feats.bytes)
        }
    }
}

/// The reader thread: takes a credit, reads a block, hands it on; stops at end of input or
/// when the other side hangs up (an error elsewhere).
fn read_blocks(
    input: RowInput,
    work_tx: crossbeam_channel::Sender<Work>,
    credit_rx: crossbeam_channel::Receiver<()>,
    free_rx: crossbeam_channel::Receiver<Vec<u8>>,
    progress: &Progress,
) -> Result<Vec<SourceInfo>> {
    let mut seq = 0u64;
    match input {
        RowInput::Lines { mut source, syntax } => {
            let base = progress.done();
            loop {
                if credit_rx.recv().is_err() {
                    return Ok(Vec::new()); // the consumer stopped on an error
                }
                let Some(block) =
                    source.read_block_into(BLOCK_BYTES, free_rx.try_recv().unwrap_or_default())?
                else {
                    break;
                };
                progress.set(base + source.raw_bytes_read());
                if work_tx.send(Work::Lines(seq, syntax, block)).is_err() {
                    return Ok(Vec::new());
                }
                seq += 1;
            }
            Ok(vec![source.finish()?])
        }
        RowInput::Rows(_) => bail!("internal: rows in memory reached the text reader"),
        RowInput::Bow {
            mut features,
            mut labels,
        } => {
            let base = progress.done();
            loop {
                if credit_rx.recv().is_err() {
                    return Ok(Vec::new());
                }
                let Some(feats) = features
                    .read_block_into(BLOCK_BYTES, free_rx.try_recv().unwrap_or_default())?
                else {
                    break;
                };
                let label_block = labels.read_lines(feats.n_lines)?;
                progress.set(base + features.raw_bytes_read() + labels.raw_bytes_read());
                if work_tx.send(Work::Bow(seq, feats, label_block)).is_err() {
                    return Ok(Vec::new());
                }
                seq += 1;
            }
            let mut extra = Vec::new();
            if labels.read_line(&mut extra)?.is_some() {
                return Err(anyhow!(LineError::new(
                    labels.lines_read(),
                    format!(
                        "found a label row after the last feature row (line {} of {}), \
                         expected both files to have the same number of rows",
                        features.lines_read(),
                        features.path().display()
                    ),
                )
                .in_file(labels.path())));
            }
            Ok(vec![features.finish()?, labels.finish()?])
        }
    }
}
