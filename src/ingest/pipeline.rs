//! The ingest pipeline, one for every input layout: open the layout's files, stream each of
//! its row streams through the parallel parser ([`super::stream`]), route the parsed rows
//! into one [`SplitSink`] per split, and let the [`Encoder`] threads write the chunk files.
//! When the ingest assigns the label ids (LIBSVM, `--first-label`), a scan pass over the
//! same files decides them first ([`super::labels`]).

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

use super::built::Built;
use super::config::IngestConfig;
use super::input::{OpenedInput, Route, RowStream};
use super::labels::{self, LabelPlan};
use super::measure::{fit_transform, pass_rules, FittedTransform};
use super::sink::{Encoder, SplitSink};
use super::stream::{stream_rows, Parsed};
use super::validation::{ValidationSplit, CARVED_FROM};
use crate::progress::Progress;
use crate::stop::StopToken;
use crate::store::catalog::{ClassMap, LabelKind, Split};
use crate::store::chunks::CsrChunk;
use crate::store::scaling::{write_scaling, StoredScaling, SCALING_FILE};
use crate::text::header::{check_row_count, check_row_total};
use crate::text::parse::RowRules;
use crate::text::source::SourceInfo;

/// Skip reasons kept for the summary (the counts are always exact).
const KEPT_SKIP_REASONS: usize = 20;

/// Parses every input of `config.layout` and writes the chunk files below `tmp/dataset/`.
pub fn build(config: &IngestConfig, tmp: &Path, stop: &StopToken) -> Result<Built> {
    let threads = config.worker_threads();
    let total = config.layout.input_bytes()?;
    let plan = match config.assigns_labels() {
        true => {
            let scanning = bytes_read(total, "label scan");
            Some(labels::scan(config, threads, &scanning, stop)?)
        }
        false => None,
    };
    let measuring = bytes_read(total, "statistics");
    let fitted = fit_transform(config, plan.as_ref(), threads, &measuring, stop)?;
    drop(measuring);
    let progress = bytes_read(total, "chunks");
    let out = tmp.join("dataset");
    let result = config.layout.open(config.lenient).and_then(|opened| {
        write_dataset(
            config,
            opened,
            plan.as_ref(),
            &fitted,
            threads,
            (&progress, stop),
            &out,
        )
    });
    drop(progress);
    let mut built = result?;
    built.transform_file = write_transform_file(&fitted, &out)?;
    built.transform = fitted;
    Ok(built)
}

/// Writes the fitted per-feature map (for the transforms that have one) next to the splits.
fn write_transform_file(
    fitted: &FittedTransform,
    out: &Path,
) -> Result<Option<crate::store::chunks::WrittenFile>> {
    let Some(scaling) = fitted.transform.scaling() else {
        return Ok(None);
    };
    let stored = StoredScaling {
        transform: fitted.transform.choice().name().into(),
        reason: fitted.reason.clone(),
        training_rows: fitted.training_rows,
        ids: scaling.ids.clone(),
        shift: scaling.shift.clone(),
        scale: scaling.scale.clone(),
    };
    std::fs::create_dir_all(out)?;
    Ok(Some(write_scaling(&out.join(SCALING_FILE), &stored)?))
}

/// The progress of one pass of ingest (`what`) over the input bytes.
fn bytes_read(total_bytes: u64, what: &str) -> Progress {
    Progress::start("ingest", what, Some(total_bytes), "bytes", 0)
}

/// What every split's sink and every stream share.
struct Shared<'a> {
    config: &'a IngestConfig,
    rules: RowRules,
    threads: usize,
    progress: &'a Progress,
    /// Chunk metadata common to all splits.
    meta: Vec<(String, String)>,
    /// The dataset directory; one subdirectory per split.
    out: PathBuf,
    /// Drop rows without a label: `--drop-unlabeled`, or `--first-label` (whose rows
    /// without a first label have no class); never for binary datasets, whose negative
    /// rows have no label id.
    drop_unlabeled: bool,
    stop: &'a StopToken,
}

impl Shared<'_> {
    /// The sink of `split`, whose chunks come `index`-th among the splits.
    fn sink(&self, split: Split, index: usize) -> Result<SplitSink> {
        let mut meta = self.meta.clone();
        meta.push(("fsgp.split".into(), split.name().into()));
        SplitSink::new(
            split,
            index,
            &self.out.join(split.name()),
            self.config.chunk_rows,
            self.config.chunk_mb << 20,
            self.drop_unlabeled,
            meta,
        )
    }
}

/// Streams the opened input's streams in order, each into the sinks of its splits, with
/// one set of encoder threads for the whole dataset.
fn write_dataset(
    config: &IngestConfig,
    opened: OpenedInput,
    plan: Option<&LabelPlan>,
    fitted: &FittedTransform,
    threads: usize,
    (progress, stop): (&Progress, &StopToken),
    out: &Path,
) -> Result<Built> {
    let OpenedInput {
        n_features: d,
        n_labels: l,
        streams,
        read_sources,
    } = opened;
    // With assigned ids: rows are checked against D and L as declared (or D as decided),
    // and the dataset has the plan's D and one label per class.
    let (rules, d, l) = pass_rules(config, plan, d, l, fitted.transform.clone());
    let kind = plan.map(|p| p.kind);
    let shared = Shared {
        config,
        rules,
        threads,
        progress,
        meta: config.chunk_metadata(d, l, kind, fitted.transform.choice()),
        out: out.to_path_buf(),
        drop_unlabeled: kind != Some(LabelKind::Binary)
            && (config.drop_unlabeled || config.first_label),
        stop,
    };
    std::thread::scope(|scope| {
        let encoder = Encoder::start(scope, threads);
        let mut sinks = Vec::new();
        let mut sources = Vec::new();
        let mut reasons = Vec::new();
        for stream in streams {
            let first = sinks.len();
            let mut targets = Vec::new();
            for split in stream.route.splits() {
                let sink = sinks.len() - first;
                sinks.push(shared.sink(split, sinks.len())?);
                // The validation split's chunks come right after the split it is carved from.
                let carve = match config.validation {
                    Some(v) if split == CARVED_FROM => {
                        sinks.push(shared.sink(Split::Validation, sinks.len())?);
                        Some((sink + 1, v))
                    }
                    _ => None,
                };
                targets.push(Target { sink, carve });
            }
            let roles = stream.roles.clone();
            let infos = stream_into(
                stream,
                &shared,
                &targets,
                &mut sinks[first..],
                &encoder,
                &mut reasons,
            )?;
            sources.extend(roles.into_iter().zip(infos));
        }
        sources.extend(read_sources);
        let chunks = encoder.finish()?;
        if let Some(v) = &config.validation {
            check_carved(&sinks, v)?;
        }
        let class_map = plan.map(|p| counted_unseen(&p.classes, &sinks));
        Ok(Built {
            n_features: u64::from(d),
            n_labels: u64::from(l),
            splits: sinks
                .into_iter()
                .map(|s| {
                    let rows = s.chunk_rows().unwrap_or(0);
                    (s.split, s.counts.clone(), rows)
                })
                .collect(),
            chunks,
            sources,
            skip_reasons: reasons,
            label_kind: kind,
            class_map,
            transform: fitted.clone(),
            transform_file: None,
        })
    })
}

/// The class map with the rows of each split's unseen classes counted by its sinks.
fn counted_unseen(classes: &ClassMap, sinks: &[SplitSink]) -> ClassMap {
    let mut map = classes.clone();
    for u in &mut map.unseen {
        u.rows = sinks
            .iter()
            .filter(|s| s.split == u.split)
            .map(|s| s.counts.unseen_rows)
            .sum();
    }
    map
}

/// Where the rows a stream's route sends to one of its splits are written: the split's
/// sink (an index into the stream's sinks) or, for the rows the carve selects, the
/// validation sink.
struct Target {
    sink: usize,
    carve: Option<(usize, ValidationSplit)>,
}

/// Refuses a carve that left the validation or the training split without rows (known only
/// once every row has streamed: `--drop-unlabeled` and `--lenient` remove rows too).
fn check_carved(sinks: &[SplitSink], v: &ValidationSplit) -> Result<()> {
    let rows = |split: Split| {
        sinks
            .iter()
            .filter(|s| s.split == split)
            .map(|s| s.counts.n_rows)
            .sum::<u64>()
    };
    let (train, validation) = (rows(CARVED_FROM), rows(Split::Validation));
    if validation == 0 {
        bail!(
            "{}: the validation split would be empty (none of the {train} training rows was \
             selected); pass a larger fraction or fewer folds",
            v.options()
        );
    }
    if train == 0 {
        bail!(
            "{}: the train split would be empty (all {validation} training rows were \
             selected); pass a smaller fraction",
            v.options()
        );
    }
    Ok(())
}

/// Streams one row stream into `sinks` (the sinks of its splits, in route order, each
/// followed by its validation sink when carved; `targets` says which is which), checks its
/// row count against the header, and closes the sinks. Returns the files read through.
fn stream_into(
    stream: RowStream,
    shared: &Shared<'_>,
    targets: &[Target],
    sinks: &mut [SplitSink],
    encoder: &Encoder<'_>,
    reasons: &mut Vec<String>,
) -> Result<Vec<SourceInfo>> {
    let RowStream {
        input,
        declared_rows,
        first_data_line,
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
        shared.progress,
        shared.stop,
        &mut |parsed| {
            if let Some(declared) = declared_rows {
                check_row_count(&path, declared, &mut lines, parsed.n_lines)?;
            }
            // Skipped rows are counted against the stream's first split (under a row
            // table: the training split).
            collect_skips(&mut sinks[0], &parsed, &path, reasons);
            route_rows(
                &route,
                first_data_line,
                targets,
                &parsed.block.rows,
                sinks,
                encoder,
                &mut unassigned,
            )
        },
    )?;
    if let Some(declared) = declared_rows {
        check_row_total(&path, declared, lines)?;
    }
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
    first_data_line: u64,
    targets: &[Target],
    rows: &CsrChunk,
    sinks: &mut [SplitSink],
    encoder: &Encoder<'_>,
    unassigned: &mut u64,
) -> Result<()> {
    if let (Route::Whole(_), [Target { carve: None, .. }]) = (route, targets) {
        return sinks[0].push_rows(rows, 0..rows.len(), encoder);
    }
    let mut picked: Vec<Vec<usize>> = vec![Vec::new(); sinks.len()];
    for (i, &line) in rows.row_ids.iter().enumerate() {
        // Data rows start at line 2 after a header, else at line 1.
        let index = line - first_data_line;
        let position = match route {
            Route::Whole(_) => 0,
            Route::ByRow { assign, .. } => match assign[index as usize] {
                0 => {
                    *unassigned += 1;
                    continue;
                }
                m => usize::from(m - 1),
            },
        };
        let target = &targets[position];
        let sink = match target.carve {
            Some((validation, carve)) if carve.selects(index) => validation,
            _ => target.sink,
        };
        picked[sink].push(i);
    }
    // Every sink sees every block, even with no rows picked: the first block fixes each
    // split's automatic chunk size.
    for (sink, which) in sinks.iter_mut().zip(picked) {
        sink.push_rows(rows, which.into_iter(), encoder)?;
    }
    Ok(())
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
