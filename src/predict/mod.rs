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

use crate::model::kernel::{BasisInputs, KernelKind};
use crate::model::params::Params;
use crate::model::predictive::{mean_utilities, probit_probability, Predictor};
use crate::store::catalog::ArtifactRow;
use crate::store::chunks::{read_chunk, CsrChunk};
use crate::store::npy::NpyMap;
use crate::store::predictions::{PredictionBlock, PredictionWriter};
use crate::svd::kernels::project_chunk;
use crate::train::{basis_gram, load_run_checkpoint, svd_basis_path};
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
    /// Also write E_q[σ(f_k)] of the kept labels (variance-aware; probit approximation).
    #[arg(long)]
    pub probabilities: bool,
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
    let files: Vec<PathBuf> = ws
        .split_chunks(&dataset, &args.split)?
        .into_iter()
        .map(|c| c.0)
        .collect();
    let split_rows = dataset.split(&args.split).map_or(0, |s| s.n_rows);
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
        "probabilities": args.probabilities,
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
        let mut writer = PredictionWriter::create(
            &tmp.join("predictions.parquet"),
            &metadata,
            args.probabilities,
        )?;
        let ranker = Ranker::open(
            &basis_path,
            basis_gram(&basis_path)?,
            dataset.n_features,
            config.kernel.kind(),
            &ckpt.params,
            args.probabilities,
        )?;
        let started = Instant::now();
        let mut rows = 0u64;
        for path in &files {
            let chunk = read_chunk(path)?;
            for (_, block) in ranker.rank_chunk(&chunk, args.top_k, args.block_rows) {
                writer.write(&block)?;
                rows += block.len() as u64;
            }
        }
        ensure!(
            rows == split_rows,
            "predicted {rows} rows, the split holds {split_rows}"
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

/// Scores rows of a split under one model and keeps each row's best labels: projection onto
/// the training basis, predictive moments, partial selection. Shared by `pipeline predict`
/// and the trainer's held-out evaluation.
pub struct Ranker<'p> {
    /// X̃ᵀ [D×R], contiguous for the sparse × dense projection.
    basis_t: Array2<f32>,
    /// K_X̃ [R×R].
    k_tilde: Mat<f64>,
    kind: KernelKind,
    params: &'p Params,
    /// Present when probabilities are wanted (it factorises K_Z + Σ_p once: P·M³/3).
    predictor: Option<Predictor<'p>>,
}

impl<'p> Ranker<'p> {
    /// `basis_path` is the svd run's `basis.npy` [R×D] the model was trained with and
    /// `k_tilde` its Gram K_X̃ [R×R] ([`basis_gram`]).
    pub fn open(
        basis_path: &Path,
        k_tilde: Mat<f64>,
        n_features: u64,
        kind: KernelKind,
        params: &'p Params,
        probabilities: bool,
    ) -> Result<Self> {
        let basis_map = NpyMap::open(basis_path)?;
        let basis = basis_map.view2::<f32>()?;
        ensure!(
            basis.ncols() as u64 == n_features,
            "{}: basis has {} columns, the dataset {n_features} features",
            basis_path.display(),
            basis.ncols()
        );
        let predictor = if probabilities {
            let p = Predictor::new(kind, params, k_tilde.as_ref())?;
            if p.jitter > 0.0 {
                eprintln!(
                    "note: K_Z + Σ needed jitter {:.3e} on the diagonal",
                    p.jitter
                );
            }
            Some(p)
        } else {
            None
        };
        Ok(Ranker {
            basis_t: basis.t().as_standard_layout().into_owned(),
            k_tilde,
            kind,
            params,
            predictor,
        })
    }

    /// The top-k labels of every row of `chunk`, in blocks of `block_rows` rows: (first row
    /// of the block within the chunk, the block's predictions). Uses the current rayon pool.
    pub fn rank_chunk(
        &self,
        chunk: &CsrChunk,
        top_k: usize,
        block_rows: usize,
    ) -> Vec<(usize, PredictionBlock)> {
        let r = self.basis_t.ncols();
        let mut projected = Array2::<f32>::zeros((chunk.len(), r));
        project_chunk(chunk, self.basis_t.view(), projected.view_mut());
        (0..chunk.len())
            .step_by(block_rows.max(1))
            .map(|start| {
                let end = (start + block_rows).min(chunk.len());
                let kxx = Mat::from_fn(end - start, r, |i, j| projected[(start + i, j)] as f64);
                let sq: Vec<f64> = chunk.sq_norms[start..end]
                    .iter()
                    .map(|&v| v as f64)
                    .collect();
                let x = BasisInputs {
                    kxx_b: kxx.as_ref(),
                    sq_norms: &sq,
                    k_tilde: self.k_tilde.as_ref(),
                };
                (
                    start,
                    self.rank_block(&x, &chunk.row_ids[start..end], top_k),
                )
            })
            .collect()
    }

    /// The top-k labels (and probabilities, if wanted) of the rows of `x`.
    fn rank_block(&self, x: &BasisInputs<'_>, row_ids: &[u64], top_k: usize) -> PredictionBlock {
        let (scores, variances) = match &self.predictor {
            Some(p) => {
                let (mean, var) = p.mean_and_variance(x);
                (mean, Some(var))
            }
            None => (mean_utilities(self.kind, self.params, x), None),
        };
        let best: Vec<(Vec<u32>, Vec<f32>)> = (0..row_ids.len())
            .into_par_iter()
            .map(|i| {
                let row: Vec<f64> = scores.row(i).iter().copied().collect();
                topk::top_k(&row, top_k)
            })
            .collect();
        let mut block = match variances {
            Some(_) => PredictionBlock::with_probabilities(),
            None => PredictionBlock::new(),
        };
        for (i, (labels, s)) in best.iter().enumerate() {
            match &variances {
                Some(var) => {
                    let probs: Vec<f32> = labels
                        .iter()
                        .map(|&k| {
                            let k = k as usize;
                            probit_probability(scores[(i, k)], var[(i, k)]) as f32
                        })
                        .collect();
                    block.push_with_probabilities(row_ids[i], labels, s, &probs);
                }
                None => block.push(row_ids[i], labels, s),
            }
        }
        block
    }
}
