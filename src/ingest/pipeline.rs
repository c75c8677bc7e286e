//! The ingest pipeline, one for every input layout: open the layout's files, stream each of
//! its row streams through the parallel parser ([`super::stream`]), route the parsed rows
//! into one [`SplitSink`] per split, and let the [`Encoder`] threads write the chunk files.

use std::path::{Path, PathBuf};

use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};

use super::built::Built;
use super::config::IngestConfig;
use super::header::{check_row_count, check_row_total};
use super::input::{absolute, InputLayout, OpenedInput, Route, RowStream};
use super::parse::RowRules;
use super::sink::{Encoder, SplitSink};
use super::source::SourceInfo;
use super::stream::{stream_rows, Parsed};
use crate::store::chunks::CsrChunk;

/// Skip reasons kept for the summary (the counts are always exact).
const KEPT_SKIP_REASONS: usize = 20;

/// Parses every input of `config.layout` and writes the chunk files below `tmp/dataset/`.
pub fn build(config: &IngestConfig, tmp: &Path) -> Result<Built> {
    let threads = config.worker_threads();
    let progress = progress_bar(input_bytes(config.layout.as_ref())?);
    let result = config
        .layout
        .open(config.lenient)
        .and_then(|opened| write_dataset(config, opened, threads, &progress, &tmp.join("dataset")));
    progress.finish_and_clear();
    result
}

/// Total size of the input files on disk (compressed, as the progress bar counts them).
fn input_bytes(layout: &dyn InputLayout) -> Result<u64> {
    layout
        .sources()
        .iter()
        .map(|(_, p)| absolute(p).and_then(|p| Ok(std::fs::metadata(&p)?.len())))
        .sum()
}

fn progress_bar(total_bytes: u64) -> ProgressBar {
    let progress = ProgressBar::new(total_bytes);
    progress.set_style(
        ProgressStyle::with_template(
            "ingest {bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("valid template"),
    );
    progress
}

/// What every split's sink and every stream share.
struct Shared<'a> {
    config: &'a IngestConfig,
    rules: RowRules,
    threads: usize,
    progress: ProgressBar,
    /// Chunk metadata common to all splits.
    meta: Vec<(String, String)>,
    /// The dataset directory; one subdirectory per split.
    out: PathBuf,
}

impl Shared<'_> {
    /// The sink of split `name`, whose chunks come `index`-th among the splits.
    fn sink(&self, name: &str, index: usize) -> Result<SplitSink> {
        let mut meta = self.meta.clone();
        meta.push(("fsgp.split".into(), name.into()));
        SplitSink::new(
            name,
            index,
            &self.out.join(name),
            self.config.chunk_rows,
            self.config.chunk_mb << 20,
            self.config.drop_unlabeled,
            meta,
        )
    }
}

/// Streams the opened input's streams in order, each into the sinks of its splits, with
/// one set of encoder threads for the whole dataset.
fn write_dataset(
    config: &IngestConfig,
    opened: OpenedInput,
    threads: usize,
    progress: &ProgressBar,
    out: &Path,
) -> Result<Built> {
    let OpenedInput {
        n_features: d,
        n_labels: l,
        streams,
        read_sources,
    } = opened;
    let shared = Shared {
        config,
        rules: config.row_rules(d, l),
        threads,
        progress: progress.clone(),
        meta: config.chunk_metadata(d, l),
        out: out.to_path_buf(),
    };
    std::thread::scope(|scope| {
        let encoder = Encoder::start(scope, threads);
        let mut sinks = Vec::new();
        let mut sources = Vec::new();
        let mut reasons = Vec::new();
        for stream in streams {
            let first = sinks.len();
            for split in stream.route.splits() {
                sinks.push(shared.sink(split, sinks.len())?);
            }
            let roles = stream.roles.clone();
            let infos = stream_into(stream, &shared, &mut sinks[first..], &encoder, &mut reasons)?;
            sources.extend(roles.into_iter().zip(infos));
        }
        sources.extend(read_sources);
        let chunks = encoder.finish()?;
        Ok(Built {
            n_features: u64::from(d),
            n_labels: u64::from(l),
            splits: sinks
                .into_iter()
                .map(|s| {
                    let rows = s.chunk_rows().unwrap_or(0);
                    (s.name.clone(), s.counts.clone(), rows)
                })
                .collect(),
            chunks,
            sources,
            skip_reasons: reasons,
        })
    })
}

/// Streams one row stream into `sinks` (the sinks of its splits, in route order), checks
/// its row count against the header, and closes the sinks. Returns the files read through.
fn stream_into(
    stream: RowStream,
    shared: &Shared<'_>,
    sinks: &mut [SplitSink],
    encoder: &Encoder<'_>,
    reasons: &mut Vec<String>,
) -> Result<Vec<SourceInfo>> {
    let RowStream {
        input,
        declared_rows,
        path,
        route,
        ..
    } = stream;
    let mut lines = 0u64;
    let mut unassigned = 0u64;
    let infos = stream_rows(
        input,
        &shared.rules,
        shared.threads,
        &shared.progress,
        &mut |parsed| {
            check_row_count(&path, declared_rows, &mut lines, &parsed)?;
            // Skipped rows are counted against the stream's first split (under a row
            // table: the training split).
            collect_skips(&mut sinks[0], &parsed, &path, reasons);
            route_rows(&route, &parsed.block.rows, sinks, encoder, &mut unassigned)
        },
    )?;
    check_row_total(&path, declared_rows, lines)?;
    for sink in sinks.iter_mut() {
        sink.close(encoder)?;
    }
    if unassigned > 0 {
        reasons.push(format!(
            "{unassigned} rows of {} are in neither split",
            path.display()
        ));
    }
    Ok(infos)
}

/// Hands the rows of a parsed block (row ids: source line numbers) to their sinks; counts
/// rows a row table assigns to no split in `unassigned`.
fn route_rows(
    route: &Route,
    rows: &CsrChunk,
    sinks: &mut [SplitSink],
    encoder: &Encoder<'_>,
    unassigned: &mut u64,
) -> Result<()> {
    match route {
        Route::Whole(_) => sinks[0].push_rows(rows, 0..rows.len(), encoder),
        Route::ByRow { assign, .. } => {
            let mut picked: Vec<Vec<usize>> = vec![Vec::new(); sinks.len()];
            for (i, &line) in rows.row_ids.iter().enumerate() {
                // Data rows start at line 2, after the header.
                match assign[(line - 2) as usize] {
                    0 => *unassigned += 1,
                    m => picked[usize::from(m - 1)].push(i),
                }
            }
            // Every sink sees every block, even with no rows picked: the first block fixes
            // each split's automatic chunk size.
            for (sink, which) in sinks.iter_mut().zip(picked) {
                sink.push_rows(rows, which.into_iter(), encoder)?;
            }
            Ok(())
        }
    }
}

/// Adds a block's skipped rows and CRLF lines to `sink`'s counts and keeps the first reasons.
fn collect_skips(sink: &mut SplitSink, parsed: &Parsed, path: &Path, reasons: &mut Vec<String>) {
    sink.counts.skipped_rows += parsed.block.skipped;
    sink.counts.crlf_lines += parsed.block.crlf_lines;
    for r in &parsed.block.skip_reasons {
        if reasons.len() < KEPT_SKIP_REASONS {
            reasons.push(r.clone().in_file(path).to_string());
        }
    }
}
