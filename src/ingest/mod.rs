//! `pipeline ingest`: Extreme Classification Repository text files → zstd Parquet CSR chunks,
//! registered in the catalog.
//!
//! Three input layouts are read (formats in `docs/formats.md`):
//! - single files `N D L` + rows `l1,l2 f:v ...`, one for train and optionally one for test;
//! - the older layout: one `*_data.txt` plus `*_trSplit.txt` / `*_tstSplit.txt` files of
//!   1-based row numbers, one column per split;
//! - the BoW layout: separate feature (`N D`) and label (`N L`) files of `id:value` rows.
//!
//! Nothing is visible until the whole dataset is written: chunks go to the run's scratch
//! directory, which is renamed into `datasets/` only after every file is complete, and the
//! catalog rows are committed last.

pub mod parse;
pub mod sink;
pub mod source;
pub mod stream;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, bail, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use crate::error::InputError;
use crate::stage::{self, Staged};
use crate::store::catalog::StageKind;
use crate::store::catalog::{ArtifactKind, ArtifactRow, NewDataset, SourceRow, SplitRow};
use crate::store::workspace::Workspace;
use parse::{parse_header, parse_u64, LineSyntax, RowRules};
use sink::{Encoder, SplitSink, WrittenChunk};
use source::{checksum_source, LineSource, SourceInfo};
use stream::{stream_rows, Parsed, RowInput};

/// Arguments of `pipeline ingest`.
#[derive(clap::Args, Debug, Clone)]
pub struct IngestArgs {
    /// Name of the dataset in the workspace.
    #[arg(long)]
    pub name: String,
    /// Single-file layout: training file (`N D L` header, rows `l1,l2 f:v ...`).
    #[arg(long, conflicts_with_all = ["data", "train_features"])]
    pub train: Option<PathBuf>,
    /// Single-file layout: test file with the same D and L.
    #[arg(long, requires = "train")]
    pub test: Option<PathBuf>,
    /// Split layout: the `*_data.txt` file holding all rows.
    #[arg(long, requires = "train_split", conflicts_with = "train_features")]
    pub data: Option<PathBuf>,
    /// Split layout: file of 1-based row numbers of the training rows, one column per split.
    #[arg(long, requires = "data")]
    pub train_split: Option<PathBuf>,
    /// Split layout: file of 1-based row numbers of the test rows.
    #[arg(long, requires = "data")]
    pub test_split: Option<PathBuf>,
    /// Split layout: which column of the split files to use (0 = the first).
    #[arg(long, default_value_t = 0)]
    pub split_column: usize,
    /// BoW layout: training feature file (`N D` header, rows `f:v ...`).
    #[arg(long, requires = "train_labels")]
    pub train_features: Option<PathBuf>,
    /// BoW layout: training label file (`N L` header, rows `l:v ...`).
    #[arg(long, requires = "train_features")]
    pub train_labels: Option<PathBuf>,
    /// BoW layout: test feature file.
    #[arg(long, requires_all = ["test_labels", "train_features"])]
    pub test_features: Option<PathBuf>,
    /// BoW layout: test label file.
    #[arg(long, requires = "test_features")]
    pub test_labels: Option<PathBuf>,
    /// Keep feature values as given instead of scaling each row to unit L2 norm.
    #[arg(long)]
    pub no_normalize: bool,
    /// Smallest feature and label id used in the files (0 or 1).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1))]
    pub index_base: u32,
    /// Drop rows without labels (they are always counted).
    #[arg(long)]
    pub drop_unlabeled: bool,
    /// Skip malformed rows (counting them) and accept CRLF line ends and a missing final
    /// newline; file-level problems (headers, row counts, split files) stay errors.
    #[arg(long)]
    pub lenient: bool,
    /// Rows per chunk file (default: sized so a chunk holds about --chunk-mb of data).
    #[arg(long)]
    pub chunk_rows: Option<usize>,
    /// Target uncompressed size of a chunk in MiB when --chunk-rows is not given.
    #[arg(long, default_value_t = 32)]
    pub chunk_mb: usize,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Replace an existing dataset of this name whose inputs or options differ.
    #[arg(long)]
    pub replace: bool,
}

/// Where the rows come from.
#[derive(Debug, Clone)]
enum Layout {
    Single {
        train: PathBuf,
        test: Option<PathBuf>,
    },
    Split {
        data: PathBuf,
        train_split: PathBuf,
        test_split: Option<PathBuf>,
        column: usize,
    },
    Bow {
        train: (PathBuf, PathBuf),
        test: Option<(PathBuf, PathBuf)>,
    },
}

impl Layout {
    fn from_args(a: &IngestArgs) -> Result<Self> {
        if let Some(train) = &a.train {
            return Ok(Layout::Single {
                train: train.clone(),
                test: a.test.clone(),
            });
        }
        if let (Some(data), Some(train_split)) = (&a.data, &a.train_split) {
            return Ok(Layout::Split {
                data: data.clone(),
                train_split: train_split.clone(),
                test_split: a.test_split.clone(),
                column: a.split_column,
            });
        }
        if let (Some(f), Some(l)) = (&a.train_features, &a.train_labels) {
            return Ok(Layout::Bow {
                train: (f.clone(), l.clone()),
                test: a.test_features.clone().zip(a.test_labels.clone()),
            });
        }
        bail!(
            "no input given: pass --train FILE [--test FILE], or --data FILE --train-split FILE \
             [--test-split FILE], or --train-features FILE --train-labels FILE \
             [--test-features FILE --test-labels FILE]"
        )
    }

    fn format(&self) -> &'static str {
        match self {
            Layout::Single { .. } => "xc",
            Layout::Split { .. } => "xc-split",
            Layout::Bow { .. } => "bow",
        }
    }

    /// (role, path) of every input file.
    fn sources(&self) -> Vec<(&'static str, PathBuf)> {
        let mut v = Vec::new();
        match self {
            Layout::Single { train, test } => {
                v.push(("train", train.clone()));
                v.extend(test.clone().map(|t| ("test", t)));
            }
            Layout::Split {
                data,
                train_split,
                test_split,
                ..
            } => {
                v.push(("data", data.clone()));
                v.push(("train-split", train_split.clone()));
                v.extend(test_split.clone().map(|t| ("test-split", t)));
            }
            Layout::Bow { train, test } => {
                v.push(("train-features", train.0.clone()));
                v.push(("train-labels", train.1.clone()));
                if let Some((f, l)) = test {
                    v.push(("test-features", f.clone()));
                    v.push(("test-labels", l.clone()));
                }
            }
        }
        v
    }
}

/// Absolute form of an input path, so the catalog records where data came from.
fn absolute(path: &Path) -> Result<PathBuf> {
    std::fs::canonicalize(path).map_err(|e| {
        anyhow!(InputError::new(
            path,
            0,
            format!("cannot open ({e}), expected an existing readable file")
        ))
    })
}

/// Everything that decides the output, recorded with the run and the dataset.
fn params_json(layout: &Layout, a: &IngestArgs) -> Result<serde_json::Value> {
    let mut sources = serde_json::Map::new();
    for (role, path) in layout.sources() {
        sources.insert(role.into(), json!(absolute(&path)?.display().to_string()));
    }
    Ok(json!({
        "format": layout.format(),
        "sources": sources,
        "split_column": matches!(layout, Layout::Split { .. }).then_some(a.split_column),
        "normalization": if a.no_normalize { "none" } else { "l2" },
        "index_base": a.index_base,
        "drop_unlabeled": a.drop_unlabeled,
        "lenient": a.lenient,
        "chunk_rows": a.chunk_rows,
        "chunk_mb": a.chunk_mb,
    }))
}

/// What an ingest did, for the report and the tests.
#[derive(Debug, Clone)]
pub struct IngestOutcome {
    pub dataset: String,
    /// False when an identical dataset was already registered and nothing was done.
    pub ingested: bool,
    pub run_id: Option<i64>,
    pub seconds: f64,
    pub input_bytes: u64,
}

/// Runs `pipeline ingest`.
pub fn run(ws: &Workspace, args: &IngestArgs) -> Result<IngestOutcome> {
    let layout = Layout::from_args(args)?;
    if args.name.is_empty()
        || !args
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        bail!(
            "dataset name '{}' is not allowed: use letters, digits, '-', '_' and '.'",
            args.name
        );
    }
    if args.chunk_rows == Some(0) || args.chunk_mb == 0 {
        bail!("--chunk-rows and --chunk-mb must be positive");
    }
    let params = params_json(&layout, args)?;
    if let Some(existing) = ws.catalog.dataset(&args.name)? {
        if existing.params == params && sources_unchanged(&existing.sources)? {
            eprintln!(
                "dataset '{}' is already ingested from the same files with the same options \
                 (run {}); nothing to do",
                args.name, existing.stage_run_id
            );
            return Ok(IngestOutcome {
                dataset: args.name.clone(),
                ingested: false,
                run_id: None,
                seconds: 0.0,
                input_bytes: 0,
            });
        }
        if !args.replace {
            bail!(
                "dataset '{}' already exists with other inputs or options; pass --replace to \
                 re-ingest it, or choose another --name",
                args.name
            );
        }
    }

    let started = Instant::now();
    let done = stage::execute(
        ws,
        StageKind::Ingest,
        &params,
        None,
        |scratch| {
            Ok(Staged {
                dir: "dataset",
                name: args.name.clone(),
                value: ingest_into(&layout, args, scratch)?,
            })
        },
        |published, built: Built| {
            let new = built.to_new_dataset(args, &layout, &published.rel, params.clone());
            let replaced = ws
                .catalog
                .commit_dataset(published.run_id, &new, args.replace)?;
            Ok((built, replaced))
        },
    )?;
    let run_id = done.run_id;
    let (built, replaced) = done.value;
    if let Some(old) = replaced {
        // The old files are unreferenced now; failing to delete them only wastes space.
        if let Err(e) = std::fs::remove_dir_all(ws.resolve(&old)) {
            eprintln!("warning: could not remove replaced dataset files {old}: {e}");
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    print_summary(&args.name, &built, seconds);
    Ok(IngestOutcome {
        dataset: args.name.clone(),
        ingested: true,
        run_id: Some(run_id),
        seconds,
        input_bytes: built.sources.iter().map(|(_, s)| s.bytes).sum(),
    })
}

fn sources_unchanged(sources: &[SourceRow]) -> Result<bool> {
    for s in sources {
        match checksum_source(Path::new(&s.path)) {
            Ok(now) if now.checksum == s.checksum && now.bytes == s.bytes => {}
            _ => return Ok(false),
        }
    }
    Ok(true)
}

/// The written (not yet published) dataset.
struct Built {
    n_features: u64,
    n_labels: u64,
    splits: Vec<(String, sink::SplitCounts, usize)>,
    chunks: Vec<WrittenChunk>,
    sources: Vec<(&'static str, SourceInfo)>,
    skip_reasons: Vec<String>,
}

impl Built {
    fn to_new_dataset(
        &self,
        args: &IngestArgs,
        layout: &Layout,
        rel: &str,
        params: serde_json::Value,
    ) -> NewDataset {
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        let artifacts: Vec<ArtifactRow> = self
            .chunks
            .iter()
            .map(|c| {
                let split = &self.splits[c.split].0;
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
                    split: Some(split.clone()),
                }
            })
            .collect();
        NewDataset {
            name: args.name.clone(),
            format: layout.format().into(),
            normalization: if args.no_normalize { "none" } else { "l2" }.into(),
            index_base: args.index_base,
            n_features: self.n_features,
            n_labels: self.n_labels,
            path: rel.to_string(),
            checksum: format!("{:016x}", hasher.digest()),
            params,
            splits: self
                .splits
                .iter()
                .map(|(name, c, chunk_rows)| SplitRow {
                    split: name.clone(),
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
        }
    }
}

fn print_summary(name: &str, built: &Built, seconds: f64) {
    let bytes: u64 = built.sources.iter().map(|(_, s)| s.bytes).sum();
    eprintln!(
        "ingested '{name}': D = {}, L = {}, {:.1} MB of input in {seconds:.2} s ({:.1} MB/s)",
        built.n_features,
        built.n_labels,
        bytes as f64 / 1e6,
        bytes as f64 / 1e6 / seconds.max(1e-9)
    );
    eprintln!(
        "{:<6} {:>10} {:>12} {:>10} {:>10} {:>8} {:>8} {:>7}",
        "split", "rows", "nnz", "positives", "unlabeled", "dropped", "skipped", "chunks"
    );
    for (split, c, _) in &built.splits {
        eprintln!(
            "{:<6} {:>10} {:>12} {:>10} {:>10} {:>8} {:>8} {:>7}",
            split,
            c.n_rows,
            c.nnz,
            c.label_nnz,
            c.unlabeled_rows,
            c.dropped_unlabeled,
            c.skipped_rows,
            c.n_chunks
        );
        if c.crlf_lines > 0 {
            eprintln!(
                "  ({} CRLF line ends accepted under --lenient)",
                c.crlf_lines
            );
        }
    }
    for reason in &built.skip_reasons {
        eprintln!("skipped: {reason}");
    }
}

/// Reads a header line, checking it is there and well-formed.
fn read_header(source: &mut LineSource, names: &[&str]) -> Result<Vec<u64>> {
    let mut line = Vec::new();
    let path = source.path().to_path_buf();
    match source.read_line(&mut line)? {
        None => Err(anyhow!(InputError::new(
            &path,
            1,
            format!(
                "found an empty file, expected a header '{}'",
                names.join(" ")
            )
        ))),
        Some(_) => {
            parse_header(&line, names).map_err(|msg| anyhow!(InputError::new(&path, 1, msg)))
        }
    }
}

fn to_u32(value: u64, what: &str, path: &Path) -> Result<u32> {
    u32::try_from(value).map_err(|_| {
        anyhow!(InputError::new(
            path,
            1,
            format!(
                "found {what} = {value} in the header, expected at most {}",
                u32::MAX
            )
        ))
    })
}

/// Checks rows against the header's N as blocks arrive; `lines` counts data lines so far.
fn check_row_count(path: &Path, declared: u64, lines: &mut u64, parsed: &Parsed) -> Result<()> {
    *lines += parsed.n_lines;
    if *lines > declared {
        // Data lines start at line 2; the first surplus row is data line N+1.
        return Err(anyhow!(InputError::new(
            path,
            declared + 2,
            format!(
                "found more rows than the header's N = {declared}, expected the file to end \
                 after line {}",
                declared + 1
            )
        )));
    }
    Ok(())
}

fn check_row_total(path: &Path, declared: u64, lines: u64) -> Result<()> {
    if lines < declared {
        return Err(anyhow!(InputError::new(
            path,
            lines + 1,
            format!("found the end of the file after {lines} rows, expected N = {declared} rows (header)")
        )));
    }
    Ok(())
}

struct IngestCtx<'a> {
    args: &'a IngestArgs,
    rules: RowRules,
    threads: usize,
    progress: ProgressBar,
    meta: Vec<(String, String)>,
    out: PathBuf,
}

impl IngestCtx<'_> {
    fn sink(&self, name: &str, index: usize) -> Result<SplitSink> {
        let mut meta = self.meta.clone();
        meta.push(("fsgp.split".into(), name.into()));
        SplitSink::new(
            name,
            index,
            &self.out.join(name),
            self.args.chunk_rows,
            self.args.chunk_mb << 20,
            self.args.drop_unlabeled,
            meta,
        )
    }
}

/// Parses every input and writes the chunk files below `tmp/dataset/`.
fn ingest_into(layout: &Layout, args: &IngestArgs, tmp: &Path) -> Result<Built> {
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
        .max(1);
    let total_bytes: u64 = layout
        .sources()
        .iter()
        .map(|(_, p)| absolute(p).and_then(|p| Ok(std::fs::metadata(&p)?.len())))
        .sum::<Result<u64>>()?;
    let progress = ProgressBar::new(total_bytes);
    progress.set_style(
        ProgressStyle::with_template(
            "ingest {bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("valid template"),
    );
    let out = tmp.join("dataset");
    let result = match layout {
        Layout::Single { train, test } => {
            ingest_single(train, test.as_deref(), args, threads, &progress, &out)
        }
        Layout::Split {
            data,
            train_split,
            test_split,
            column,
        } => ingest_split(
            data,
            train_split,
            test_split.as_deref(),
            *column,
            args,
            threads,
            &progress,
            &out,
        ),
        Layout::Bow { train, test } => {
            ingest_bow(train, test.as_ref(), args, threads, &progress, &out)
        }
    };
    progress.finish_and_clear();
    result
}

fn base_meta(args: &IngestArgs, d: u32, l: u32) -> Vec<(String, String)> {
    vec![
        ("fsgp.dataset".into(), args.name.clone()),
        ("fsgp.n_features".into(), d.to_string()),
        ("fsgp.n_labels".into(), l.to_string()),
        (
            "fsgp.normalization".into(),
            if args.no_normalize { "none" } else { "l2" }.into(),
        ),
    ]
}

fn rules_for(args: &IngestArgs, d: u32, l: u32) -> RowRules {
    RowRules {
        n_features: d,
        n_labels: l,
        index_base: args.index_base,
        normalize: !args.no_normalize,
        lenient: args.lenient,
    }
}

fn collect_skips(sink: &mut SplitSink, parsed: &Parsed, path: &Path, reasons: &mut Vec<String>) {
    sink.counts.skipped_rows += parsed.block.skipped;
    sink.counts.crlf_lines += parsed.block.crlf_lines;
    for r in &parsed.block.skip_reasons {
        if reasons.len() < 20 {
            reasons.push(r.clone().in_file(path).to_string());
        }
    }
}

fn finish_built(
    d: u32,
    l: u32,
    sinks: Vec<SplitSink>,
    encoder: Encoder<'_>,
    sources: Vec<(&'static str, SourceInfo)>,
    skip_reasons: Vec<String>,
) -> Result<Built> {
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
        skip_reasons,
    })
}

/// Single-file layout: train file, then optionally test file.
fn ingest_single(
    train: &Path,
    test: Option<&Path>,
    args: &IngestArgs,
    threads: usize,
    progress: &ProgressBar,
    out: &Path,
) -> Result<Built> {
    let mut train_src = LineSource::open(train)?;
    let header = read_header(&mut train_src, &["N", "D", "L"])?;
    let (d, l) = (
        to_u32(header[1], "D", train)?,
        to_u32(header[2], "L", train)?,
    );
    let test_src = match test {
        Some(path) => {
            let mut src = LineSource::open(path)?;
            let h = read_header(&mut src, &["N", "D", "L"])?;
            if h[1] != header[1] || h[2] != header[2] {
                bail!(InputError::new(
                    path,
                    1,
                    format!(
                        "found D = {}, L = {} in the header, expected D = {}, L = {} as in {}",
                        h[1],
                        h[2],
                        header[1],
                        header[2],
                        train.display()
                    )
                ));
            }
            Some((src, h[0]))
        }
        None => None,
    };
    let ctx = IngestCtx {
        args,
        rules: rules_for(args, d, l),
        threads,
        progress: progress.clone(),
        meta: base_meta(args, d, l),
        out: out.to_path_buf(),
    };
    std::thread::scope(|scope| {
        let encoder = Encoder::start(scope, threads);
        let mut sinks = Vec::new();
        let mut sources = Vec::new();
        let mut reasons = Vec::new();
        let mut inputs = vec![("train", train_src, header[0])];
        inputs.extend(test_src.map(|(s, n)| ("test", s, n)));
        for (index, (split, src, declared)) in inputs.into_iter().enumerate() {
            let path = src.path().to_path_buf();
            let mut sink = ctx.sink(split, index)?;
            let mut lines = 0u64;
            let infos = stream_rows(
                RowInput::Lines {
                    source: src,
                    syntax: LineSyntax::LabelsFeatures,
                },
                &ctx.rules,
                ctx.threads,
                &ctx.progress,
                &mut |parsed| {
                    check_row_count(&path, declared, &mut lines, &parsed)?;
                    collect_skips(&mut sink, &parsed, &path, &mut reasons);
                    let n = parsed.block.rows.len();
                    sink.push_rows(&parsed.block.rows, 0..n, &encoder)
                },
            )?;
            check_row_total(&path, declared, lines)?;
            sink.close(&encoder)?;
            sinks.push(sink);
            sources.extend(infos.into_iter().map(|i| (split, i)));
        }
        finish_built(d, l, sinks, encoder, sources, reasons)
    })
}

/// Marks the rows listed in column `column` of a split file with `mark` in `assign`.
fn read_split_file(
    path: &Path,
    column: usize,
    lenient: bool,
    mark: u8,
    assign: &mut [u8],
) -> Result<SourceInfo> {
    let mut src = LineSource::open(path)?;
    let n = assign.len() as u64;
    let mut line = Vec::new();
    let mut any = false;
    let fail = |line_no: u64, msg: String| anyhow!(InputError::new(path, line_no, msg));
    while let Some(terminated) = src.read_line(&mut line)? {
        let line_no = src.lines_read();
        any = true;
        if !terminated && !lenient {
            return Err(fail(
                line_no,
                "found the last line without a '\\n' line end, expected every line to end with \
                 '\\n' (the file may be truncated; pass --lenient to accept it)"
                    .into(),
            ));
        }
        let text = match line.strip_suffix(b"\r") {
            Some(t) if lenient => t,
            Some(_) => {
                return Err(fail(
                    line_no,
                    "found a CRLF line ending (\"\\r\\n\"), expected \"\\n\" (strip the '\\r' \
                     characters, or pass --lenient to accept them)"
                        .into(),
                ))
            }
            None => &line[..],
        };
        let cols: Vec<&[u8]> = text
            .split(|&b| b == b' ' || b == b'\t')
            .filter(|t| !t.is_empty())
            .collect();
        let Some(token) = cols.get(column) else {
            return Err(fail(
                line_no,
                format!(
                    "found {} column(s), expected at least {} (--split-column {column})",
                    cols.len(),
                    column + 1
                ),
            ));
        };
        let row = parse_u64(token).filter(|r| (1..=n).contains(r)).ok_or_else(|| {
            fail(
                line_no,
                format!(
                    "found row number '{}', expected a 1-based row number in 1..={n} (N of the data file)",
                    String::from_utf8_lossy(token)
                ),
            )
        })?;
        let slot = &mut assign[(row - 1) as usize];
        if *slot == mark {
            return Err(fail(
                line_no,
                format!("found row {row} a second time, expected each row once"),
            ));
        }
        if *slot != 0 {
            return Err(fail(
                line_no,
                format!("found row {row}, which the training split already holds, expected disjoint splits"),
            ));
        }
        *slot = mark;
    }
    if !any {
        return Err(fail(
            1,
            "found an empty file, expected one line of row numbers per row".into(),
        ));
    }
    src.finish()
}

/// Split layout: one data file, rows routed by the split files.
#[allow(clippy::too_many_arguments)]
fn ingest_split(
    data: &Path,
    train_split: &Path,
    test_split: Option<&Path>,
    column: usize,
    args: &IngestArgs,
    threads: usize,
    progress: &ProgressBar,
    out: &Path,
) -> Result<Built> {
    let mut data_src = LineSource::open(data)?;
    let header = read_header(&mut data_src, &["N", "D", "L"])?;
    let (d, l) = (to_u32(header[1], "D", data)?, to_u32(header[2], "L", data)?);
    let declared = header[0];
    // One byte per data row (0: in no split, 1: train, 2: test): N bytes, far below the data.
    let mut assign = vec![0u8; usize::try_from(declared)?];
    let mut sources = vec![(
        "train-split",
        read_split_file(train_split, column, args.lenient, 1, &mut assign)?,
    )];
    if let Some(ts) = test_split {
        sources.push((
            "test-split",
            read_split_file(ts, column, args.lenient, 2, &mut assign)?,
        ));
    }
    let ctx = IngestCtx {
        args,
        rules: rules_for(args, d, l),
        threads,
        progress: progress.clone(),
        meta: base_meta(args, d, l),
        out: out.to_path_buf(),
    };
    let mut reasons = Vec::new();
    let mut unassigned = 0u64;
    std::thread::scope(|scope| {
        let encoder = Encoder::start(scope, threads);
        let mut sinks = vec![ctx.sink("train", 0)?];
        if test_split.is_some() {
            sinks.push(ctx.sink("test", 1)?);
        }
        let mut lines = 0u64;
        let infos = stream_rows(
            RowInput::Lines {
                source: data_src,
                syntax: LineSyntax::LabelsFeatures,
            },
            &ctx.rules,
            threads,
            progress,
            &mut |parsed| {
                check_row_count(data, declared, &mut lines, &parsed)?;
                let rows = &parsed.block.rows;
                let mut picked: [Vec<usize>; 2] = [Vec::new(), Vec::new()];
                for (i, &line) in rows.row_ids.iter().enumerate() {
                    match assign[(line - 2) as usize] {
                        0 => unassigned += 1,
                        m => picked[usize::from(m - 1)].push(i),
                    }
                }
                // Skipped rows are counted against the split the row was listed in.
                collect_skips(&mut sinks[0], &parsed, data, &mut reasons);
                for (sink, which) in sinks.iter_mut().zip(picked) {
                    sink.push_rows(rows, which.into_iter(), &encoder)?;
                }
                Ok(())
            },
        )?;
        check_row_total(data, declared, lines)?;
        for sink in &mut sinks {
            sink.close(&encoder)?;
        }
        if unassigned > 0 {
            reasons.push(format!(
                "{unassigned} rows of {} are in neither split",
                data.display()
            ));
        }
        sources.splice(0..0, infos.into_iter().map(|i| ("data", i)));
        finish_built(d, l, sinks, encoder, sources, reasons)
    })
}

/// Opens a BoW pair and checks that the two headers agree on N.
fn open_bow(pair: &(PathBuf, PathBuf)) -> Result<(LineSource, LineSource, u64, u32, u32)> {
    let mut features = LineSource::open(&pair.0)?;
    let fh = read_header(&mut features, &["N", "D"])?;
    let mut labels = LineSource::open(&pair.1)?;
    let lh = read_header(&mut labels, &["N", "L"])?;
    if fh[0] != lh[0] {
        bail!(InputError::new(
            &pair.1,
            1,
            format!(
                "found N = {} in the header, expected N = {} as in {}",
                lh[0],
                fh[0],
                pair.0.display()
            )
        ));
    }
    Ok((
        features,
        labels,
        fh[0],
        to_u32(fh[1], "D", &pair.0)?,
        to_u32(lh[1], "L", &pair.1)?,
    ))
}

/// BoW layout: feature and label files read in lockstep.
fn ingest_bow(
    train: &(PathBuf, PathBuf),
    test: Option<&(PathBuf, PathBuf)>,
    args: &IngestArgs,
    threads: usize,
    progress: &ProgressBar,
    out: &Path,
) -> Result<Built> {
    let (tf, tl, tn, d, l) = open_bow(train)?;
    let mut inputs = vec![("train", tf, tl, tn)];
    if let Some(pair) = test {
        let (f, lab, n, d2, l2) = open_bow(pair)?;
        if (d2, l2) != (d, l) {
            bail!(InputError::new(
                &pair.0,
                1,
                format!(
                    "found D = {d2} (and L = {l2} in {}), expected D = {d}, L = {l} as in the \
                     training files",
                    pair.1.display()
                )
            ));
        }
        inputs.push(("test", f, lab, n));
    }
    let ctx = IngestCtx {
        args,
        rules: rules_for(args, d, l),
        threads,
        progress: progress.clone(),
        meta: base_meta(args, d, l),
        out: out.to_path_buf(),
    };
    std::thread::scope(|scope| {
        let encoder = Encoder::start(scope, threads);
        let mut sinks = Vec::new();
        let mut sources = Vec::new();
        let mut reasons = Vec::new();
        for (index, (split, features, labels, declared)) in inputs.into_iter().enumerate() {
            let path = features.path().to_path_buf();
            let mut sink = ctx.sink(split, index)?;
            let mut lines = 0u64;
            let infos = stream_rows(
                RowInput::Bow { features, labels },
                &ctx.rules,
                threads,
                progress,
                &mut |parsed| {
                    check_row_count(&path, declared, &mut lines, &parsed)?;
                    collect_skips(&mut sink, &parsed, &path, &mut reasons);
                    let n = parsed.block.rows.len();
                    sink.push_rows(&parsed.block.rows, 0..n, &encoder)
                },
            )?;
            check_row_total(&path, declared, lines)?;
            sink.close(&encoder)?;
            sinks.push(sink);
            let roles: [&'static str; 2] = if split == "train" {
                ["train-features", "train-labels"]
            } else {
                ["test-features", "test-labels"]
            };
            sources.extend(roles.into_iter().zip(infos));
        }
        finish_built(d, l, sinks, encoder, sources, reasons)
    })
}
