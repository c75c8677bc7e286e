//! The `pipeline` command line: one subcommand per stage plus workspace inspection.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};

use crate::evaluate::EvaluateArgs;
use crate::ingest::IngestArgs;
use crate::predict::PredictArgs;
use crate::report::ReportArgs;
use crate::runner::RunArgs;
use crate::svd::SvdArgs;
use crate::synth::SynthArgs;
use crate::train::{ElboArgs, TrainArgs};
use crate::workspace::Workspace;

#[derive(Parser, Debug)]
#[command(
    name = "pipeline",
    version,
    about = "fsgp: fully scalable Gaussian processes for extreme multi-label classification"
)]
pub struct Cli {
    /// Workspace directory holding the catalog and every stage's output.
    #[arg(
        long,
        global = true,
        env = "FSGP_WORKSPACE",
        default_value = "fsgp-workspace"
    )]
    pub workspace: PathBuf,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Generate Extreme Classification Repository text files with a planted structure.
    Synth(SynthArgs),
    /// Read XML-repository text files into Parquet CSR chunks and register the dataset.
    Ingest(IngestArgs),
    /// Out-of-core truncated SVD of a dataset's training matrix, K_XX̃ and A's initialisation.
    Svd(SvdArgs),
    /// Fit MLGPF by stochastic variational inference on a dataset's SVD factors.
    Train(TrainArgs),
    /// Exact full-data evidence lower bound of a training checkpoint.
    Elbo(ElboArgs),
    /// Top-k labels of every row of a split under a training checkpoint (Parquet).
    Predict(PredictArgs),
    /// P@k, nDCG@k, PSP@k, PSnDCG@k and coverage@k of predictions against the true labels.
    Evaluate(EvaluateArgs),
    /// A whole run from a TOML spec: (synth →) ingest → svd → train → predict → evaluate.
    Run(RunArgs),
    /// Charts (PNG, SVG) and a Markdown summary of a training run.
    Report(ReportArgs),
    /// Show what the workspace holds: datasets, artifacts, stage runs.
    Status(StatusArgs),
}

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// Print JSON for machines instead of tables.
    #[arg(long)]
    pub json: bool,
    /// How many recent stage runs to list.
    #[arg(long, default_value_t = 20)]
    pub runs: usize,
}

pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Synth(args) => crate::synth::run(&args),
        Command::Ingest(args) => crate::ingest::run(&cli.workspace, &args).map(|_| ()),
        Command::Svd(args) => crate::svd::run(&cli.workspace, &args).map(|_| ()),
        Command::Train(args) => crate::train::run(&cli.workspace, &args).map(|_| ()),
        Command::Elbo(args) => crate::train::elbo(&cli.workspace, &args).map(|_| ()),
        Command::Predict(args) => crate::predict::run(&cli.workspace, &args).map(|_| ()),
        Command::Evaluate(args) => crate::evaluate::run(&cli.workspace, &args).map(|_| ()),
        Command::Run(args) => crate::runner::run(&cli.workspace, &args),
        Command::Report(args) => crate::report::run(&cli.workspace, &args).map(|_| ()),
        Command::Status(args) => status(&cli.workspace, &args),
    }
}

fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn status(workspace: &std::path::Path, args: &StatusArgs) -> Result<()> {
    let ws = Workspace::open(workspace)?;
    let datasets = ws.catalog.datasets()?;
    let runs = ws.catalog.runs(args.runs)?;
    let artifacts = ws.catalog.artifacts(None)?;
    if args.json {
        let doc = serde_json::json!({
            "workspace": ws.root().display().to_string(),
            "datasets": datasets,
            "runs": runs,
            "artifacts": { "count": artifacts.len(), "bytes": artifacts.iter().map(|a| a.bytes).sum::<u64>() },
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!("workspace {}", ws.root().display());
    println!();
    println!("datasets ({})", datasets.len());
    if !datasets.is_empty() {
        println!(
            "  {:<20} {:<8} {:>6} {:>8} {:<6} {:>10} {:>12} {:>7} {:>10}",
            "name", "format", "D", "L", "split", "rows", "nnz", "chunks", "size"
        );
    }
    for d in &datasets {
        for (i, s) in d.splits.iter().enumerate() {
            let bytes: u64 = artifacts
                .iter()
                .filter(|a| a.path.starts_with(&format!("{}/", s.path)))
                .map(|a| a.bytes)
                .sum();
            let (name, format, dd, ll) = if i == 0 {
                (
                    d.name.as_str(),
                    d.format.as_str(),
                    d.n_features.to_string(),
                    d.n_labels.to_string(),
                )
            } else {
                ("", "", String::new(), String::new())
            };
            println!(
                "  {:<20} {:<8} {:>6} {:>8} {:<6} {:>10} {:>12} {:>7} {:>10}",
                name,
                format,
                dd,
                ll,
                s.split,
                s.n_rows,
                s.nnz,
                s.n_chunks,
                human_bytes(bytes)
            );
        }
    }
    // Derived artifacts grouped by the directory (one stage run) holding them.
    let mut groups: Vec<(String, Vec<&str>, u64)> = Vec::new();
    for a in artifacts.iter().filter(|a| a.kind != "chunk") {
        let dir = a.path.rsplit_once('/').map_or("", |(d, _)| d).to_string();
        match groups.iter_mut().find(|g| g.0 == dir) {
            Some(g) => {
                g.1.push(&a.kind);
                g.2 += a.bytes;
            }
            None => groups.push((dir, vec![&a.kind], a.bytes)),
        }
    }
    if !groups.is_empty() {
        println!();
        println!("derived artifacts ({} sets)", groups.len());
        for (dir, kinds, bytes) in &groups {
            println!(
                "  {:<36} {:>10}  {}",
                dir,
                human_bytes(*bytes),
                kinds.join(", ")
            );
        }
    }
    println!();
    println!("recent stage runs ({})", runs.len());
    for r in &runs {
        let err = r
            .error
            .as_deref()
            .map(|e| format!("  {}", e.lines().next().unwrap_or("")))
            .unwrap_or_default();
        println!(
            "  #{:<5} {:<8} {:<11} {}{}",
            r.id, r.stage, r.status, r.started_at, err
        );
    }
    Ok(())
}
