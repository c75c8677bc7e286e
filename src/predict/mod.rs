//! `pipeline predict`: top-k labels of every row of a split under a training checkpoint.
//!
//! Data flow per chunk of the split: Parquet CSR rows → projection onto the training basis
//! (X* X̃ᵀ, sparse × dense, the same f32 kernel as `pipeline svd`) → mean utilities
//! f̄ = K_*Z μ Φᵀ + b in blocks of rows → partial selection of the k best labels →
//! one row group of the predictions file. Memory: one chunk plus a block of B×K scores,
//! whatever the number of rows.

pub mod topk;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use faer::Mat;
use ndarray::Array2;
use rayon::prelude::*;
use serde_json::json;

use crate::model::kernel::BasisInputs;
use crate::model::predictive::mean_utilities;
use crate::store::catalog::ArtifactRow;
use crate::store::chunks::read_chunk;
use crate::store::npy::NpyMap;
use crate::store::predictions::{PredictionBlock, PredictionWriter};
use crate::svd::kernels::project_chunk;
use crate::train::{basis_gram, load_run_checkpoint, svd_basis_path, TrainConfig};
use crate::workspace::Workspace;

/// Arguments of `pipeline predict`.
#[derive(clap::Args, Debug, Clone)]
pub struct PredictArgs {
    /// Training run.
    #[arg(long)]
    pub run: i64,
    /// Checkpoint step (default: the run's last).
    #[arg(long)]
    pub checkpoint: Option<u64>,
    #[arg(long, default_value = "test")]
    pub split: String,
    /// Labels kept per row.
    #[arg(long, default_value_t = 5)]
    pub top_k: usize,
    /// Rows scored together (memory: rows × labels f64 scores).
    #[arg(long, default_value_t = 1024)]
    pub block_rows: usize,
    #[arg(long)]
    pub threads: Option<usize>,
}

/// What a predict run produced (or found done).
#[derive(Debug, Clone)]
pub struct PredictOutcome {
    pub run_id: i64,
    pub computed: bool,
    /// Workspace-relative path of the predictions file.
    pub path: String,
    pub rows: u64,
}

/// Runs `pipeline predict`.
pub fn run(workspace: &Path, args: &PredictArgs) -> Result<PredictOutcome> {
    let ws = Workspace::open(workspace)?;
    ensure!(args.top_k >= 1, "--top-k must be at least 1");
    ensure!(args.block_rows >= 1, "--block-rows must be at least 1");
    let (config, ckpt_row, ckpt) = load_run_checkpoint(&ws, args.run, args.checkpoint)?;
    let dataset = ws
        .catalog
        .dataset(&config.dataset)?
        .with_context(|| format!("dataset '{}' is gone from the catalog", config.dataset))?;
    ensure!(
        dataset.checksum == config.dataset_checksum,
        "dataset '{}' was re-ingested after run {} trained on it",
        dataset.name,
        args.run
    );
    let split = dataset.split(&args.split).with_context(|| {
        format!(
            "dataset '{}' has no split '{}' (it has: {})",
            dataset.name,
            args.split,
            dataset
                .splits
                .iter()
                .map(|s| s.split.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )
    })?;
    ensure!(
        args.top_k <= dataset.n_labels as usize,
        "--top-k {} exceeds the {} labels",
        args.top_k,
        dataset.n_labels
    );
    let params_json = json!({
        "train_run": args.run,
        "checkpoint_step": ckpt_row.step,
        "checkpoint_checksum": ckpt_row.checksum,
        "split": args.split,
        "top_k": args.top_k,
    });
    if let Some(done) = ws.catalog.find_ok_run("predict", &params_json)? {
        let art = ws
            .catalog
            .run_artifacts(done.id)?
            .into_iter()
            .find(|a| a.kind == "predictions")
            .context("completed predict run without predictions")?;
        eprintln!(
            "predictions of run {} step {} on '{}' are already done (run {}); nothing to do",
            args.run, ckpt_row.step, args.split, done.id
        );
        return Ok(PredictOutcome {
            run_id: done.id,
            computed: false,
            path: art.path,
            rows: art.rows.unwrap_or(0),
        });
    }
    let files: Vec<PathBuf> = ws
        .catalog
        .artifacts(Some(dataset.id))?
        .into_iter()
        .filter(|a| a.kind == "chunk" && a.split.as_deref() == Some(args.split.as_str()))
        .map(|a| ws.resolve(&a.path))
        .collect();
    ensure!(
        files.len() as u64 == split.n_chunks,
        "catalog lists {} chunks of split '{}', expected {}",
        files.len(),
        args.split,
        split.n_chunks
    );
    let basis_path = svd_basis_path(&ws, config.svd_run)?;
    let threads = args.threads.unwrap_or(config.threads);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?;
    let run = ws.start_run("predict", &params_json)?;
    let tmp = run.tmp_dir().join("predictions");
    let result = pool.install(|| -> Result<_> {
        std::fs::create_dir_all(&tmp)?;
        let metadata = vec![
            ("fsgp.dataset".to_string(), dataset.name.clone()),
            ("fsgp.split".to_string(), args.split.clone()),
            ("fsgp.train_run".to_string(), args.run.to_string()),
            (
                "fsgp.checkpoint_step".to_string(),
                ckpt_row.step.to_string(),
            ),
            ("fsgp.top_k".to_string(), args.top_k.to_string()),
        ];
        let mut writer = PredictionWriter::create(&tmp.join("predictions.parquet"), &metadata)?;
        let basis_map = NpyMap::open(&basis_path)?;
        let basis = basis_map.view2::<f32>()?;
        ensure!(
            basis.ncols() as u64 == dataset.n_features,
            "basis has {} columns, the dataset {} features",
            basis.ncols(),
            dataset.n_features
        );
        let basis_t = basis.t().as_standard_layout().into_owned();
        let k_tilde = basis_gram(&basis_path)?;
        let kind = config.kernel.kind();
        let started = Instant::now();
        let mut rows = 0u64;
        for path in &files {
            let chunk = read_chunk(path)?;
            let mut projected = Array2::<f32>::zeros((chunk.len(), basis.nrows()));
            project_chunk(&chunk, basis_t.view(), projected.view_mut());
            for start in (0..chunk.len()).step_by(args.block_rows) {
                let end = (start + args.block_rows).min(chunk.len());
                let kxx = Mat::from_fn(end - start, basis.nrows(), |i, j| {
                    projected[(start + i, j)] as f64
                });
                let sq: Vec<f64> = chunk.sq_norms[start..end]
                    .iter()
                    .map(|&v| v as f64)
                    .collect();
                let x = BasisInputs {
                    kxx_b: kxx.as_ref(),
                    sq_norms: &sq,
                    k_tilde: k_tilde.as_ref(),
                };
                let scores = mean_utilities(kind, &ckpt.params, &x);
                let best: Vec<(Vec<u32>, Vec<f32>)> = (0..end - start)
                    .into_par_iter()
                    .map(|i| {
                        let row: Vec<f64> = scores.row(i).iter().copied().collect();
                        topk::top_k(&row, args.top_k)
                    })
                    .collect();
                let mut block = PredictionBlock::new();
                for (i, (labels, s)) in best.iter().enumerate() {
                    block.push(chunk.row_ids[start + i], labels, s);
                }
                writer.write(&block)?;
                rows += (end - start) as u64;
            }
        }
        ensure!(
            rows == split.n_rows,
            "predicted {rows} rows, the split holds {}",
            split.n_rows
        );
        let written = writer.finish()?;
        let secs = started.elapsed().as_secs_f64();
        eprintln!(
            "predicted top-{} of {rows} '{}' rows in {secs:.1} s ({:.0} rows/s)",
            args.top_k,
            args.split,
            rows as f64 / secs.max(1e-9)
        );
        Ok((written, rows))
    });
    let (written, rows) = match result {
        Ok(r) => r,
        Err(e) => {
            run.failed(&e);
            return Err(e);
        }
    };
    let rel = run.output_rel("predictions", &format!("{}-{}", dataset.name, args.split));
    let path = format!("{rel}/predictions.parquet");
    let artifact = ArtifactRow {
        kind: "predictions".into(),
        path: path.clone(),
        bytes: written.bytes,
        rows: Some(rows),
        checksum: written.checksum,
        split: Some(args.split.clone()),
    };
    let run_id = run.id;
    run.publish_and_commit("predictions", &rel, || {
        ws.catalog
            .commit_artifacts(run_id, Some(dataset.id), &[artifact])
    })?;
    Ok(PredictOutcome {
        run_id,
        computed: true,
        path,
        rows,
    })
}

/// The training configuration of a predict run's model (for callers that follow links).
pub fn train_config_of(ws: &Workspace, train_run: i64) -> Result<TrainConfig> {
    let row = ws
        .catalog
        .run(train_run)?
        .with_context(|| format!("no run {train_run}"))?;
    serde_json::from_value(row.params).with_context(|| format!("run {train_run}: bad config"))
}
