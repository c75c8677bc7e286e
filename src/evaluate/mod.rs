//! `pipeline evaluate`: ranking metrics of a predictions file against the true labels of
//! its split (`docs/metrics.md`).
//!
//! Data flow: the split's chunks (label columns only) and the predictions file are both in
//! row order, so they are merge-joined on `row_id` a block at a time; the training split's
//! label counts give the inverse propensities. Memory: one chunk's labels plus one block of
//! predictions, whatever the number of rows. The results go to the catalog (one metric row
//! per measure and k) and print as a table or JSON.

pub mod metrics;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use serde_json::json;

use crate::store::catalog::{ArtifactRow, MetricRow};
use crate::store::chunks::{checksum_file, label_counts, read_chunk_labels};
use crate::store::predictions::PredictionReader;
use crate::workspace::Workspace;
use metrics::{LabellessRows, Metrics, MetricsAccumulator, PropensityParams};

/// Arguments of `pipeline evaluate`.
#[derive(clap::Args, Debug, Clone)]
pub struct EvaluateArgs {
    /// A predictions file (workspace-relative or absolute), as written by `pipeline predict`.
    #[arg(long, required_unless_present = "run", conflicts_with = "run")]
    pub predictions: Option<String>,
    /// A training run: evaluates its predictions on --split (predicting first if needed).
    #[arg(long)]
    pub run: Option<i64>,
    /// With --run: the checkpoint step (default: the run's last).
    #[arg(long, requires = "run")]
    pub checkpoint: Option<u64>,
    /// With --run: the split to predict and evaluate.
    #[arg(long, default_value = "test", requires = "run")]
    pub split: String,
    /// Metrics at k = 1..K.
    #[arg(long, default_value_t = 5)]
    pub k: usize,
    /// Propensity model parameter A (0.55 generic, 0.6 Amazon, 0.5 Wikipedia).
    #[arg(long, default_value_t = PropensityParams::GENERIC.a)]
    pub propensity_a: f64,
    /// Propensity model parameter B (1.5 generic, 2.6 Amazon, 0.4 Wikipedia).
    #[arg(long, default_value_t = PropensityParams::GENERIC.b)]
    pub propensity_b: f64,
    /// Test rows without labels: count them (every metric 0 on them, as pyxclib does) or
    /// leave them out.
    #[arg(long, value_enum, default_value_t = LabellessArg::CountAsZero)]
    pub labelless: LabellessArg,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabellessArg {
    CountAsZero,
    Skip,
}

impl From<LabellessArg> for LabellessRows {
    fn from(a: LabellessArg) -> Self {
        match a {
            LabellessArg::CountAsZero => LabellessRows::CountAsZero,
            LabellessArg::Skip => LabellessRows::Skip,
        }
    }
}

/// What an evaluate run produced (or found done).
#[derive(Debug, Clone)]
pub struct EvaluateOutcome {
    pub run_id: i64,
    pub computed: bool,
    pub metrics: Metrics,
}

/// Runs `pipeline evaluate` and prints the result.
pub fn run(workspace: &Path, args: &EvaluateArgs) -> Result<EvaluateOutcome> {
    let out = evaluate_stage(workspace, args)?;
    if args.json {
        println!("{}", out.metrics.to_json());
    } else {
        println!("{}", out.metrics.to_table());
    }
    Ok(out)
}

/// The metric rows recorded for `m` (names like `P@1`, values as fractions).
pub fn metric_rows(m: &Metrics, step: Option<i64>, split: &str) -> Vec<MetricRow> {
    let mut rows = Vec::new();
    for k in 1..=m.k_max {
        for (name, values) in [
            ("P", &m.p_at),
            ("nDCG", &m.ndcg_at),
            ("PSP", &m.psp_at),
            ("PSnDCG", &m.psndcg_at),
            ("coverage", &m.coverage_at),
        ] {
            rows.push(MetricRow {
                name: format!("{name}@{k}"),
                value: values[k - 1],
                step,
                split: Some(split.to_string()),
            });
        }
    }
    rows
}

/// Computes (or finds) the metrics without printing them.
pub fn evaluate_stage(workspace: &Path, args: &EvaluateArgs) -> Result<EvaluateOutcome> {
    ensure!((1..=254).contains(&args.k), "--k must be between 1 and 254");
    let predictions_rel = match (&args.predictions, args.run) {
        (Some(p), _) => p.clone(),
        (None, Some(run)) => {
            let predicted = crate::predict::run(
                workspace,
                &crate::predict::PredictArgs {
                    run,
                    checkpoint: args.checkpoint,
                    split: args.split.clone(),
                    top_k: args.k,
                    block_rows: 1024,
                    probabilities: false,
                    threads: None,
                },
            )?;
            predicted.path
        }
        (None, None) => bail!("give --predictions FILE or --run RUN"),
    };
    let ws = Workspace::open(workspace)?;
    let path = resolve_predictions(&ws, &predictions_rel);
    let reader = PredictionReader::open(&path)?;
    let meta = |key: &str| {
        reader
            .metadata
            .get(key)
            .cloned()
            .with_context(|| format!("{}: no `{key}` in the file's metadata", path.display()))
    };
    let (dataset_name, split) = (meta("fsgp.dataset")?, meta("fsgp.split")?);
    let step: Option<i64> = meta("fsgp.checkpoint_step")
        .ok()
        .and_then(|s| s.parse().ok());
    let dataset = ws.catalog.dataset(&dataset_name)?.with_context(|| {
        format!(
            "{}: dataset '{dataset_name}' is not in the workspace",
            path.display()
        )
    })?;
    let checksum = checksum_file(&path)?.checksum;
    let policy: LabellessRows = args.labelless.into();
    let params = json!({
        "predictions_checksum": checksum,
        "dataset": dataset.name,
        "dataset_checksum": dataset.checksum,
        "split": split,
        "k": args.k,
        "propensity_a": args.propensity_a,
        "propensity_b": args.propensity_b,
        "labelless": format!("{policy:?}"),
    });
    let train_chunks: Vec<PathBuf> = ws
        .split_chunks(&dataset, "train")?
        .into_iter()
        .map(|c| c.0)
        .collect();
    let n_train: u64 = dataset.split("train").map_or(0, |s| s.n_rows);
    let truth_chunks: Vec<PathBuf> = ws
        .split_chunks(&dataset, &split)?
        .into_iter()
        .map(|c| c.0)
        .collect();
    let split_rows = dataset.split(&split).map_or(0, |s| s.n_rows);

    if let Some(done) = ws.catalog.find_ok_run("evaluate", &params)? {
        let metrics = load_metrics(&ws, done.id)?;
        eprintln!(
            "metrics of {} are already computed (run {}); nothing to do",
            predictions_rel, done.id
        );
        return Ok(EvaluateOutcome {
            run_id: done.id,
            computed: false,
            metrics,
        });
    }

    let run = ws.start_run("evaluate", &params)?;
    let result = (|| -> Result<Metrics> {
        let counts = label_counts(&train_chunks, dataset.n_labels as usize)?;
        let inv_prop =
            metrics::inverse_propensity(&counts, n_train, args.propensity_a, args.propensity_b);
        let mut acc = MetricsAccumulator::new(args.k, inv_prop, policy)?;
        let mut truth = TruthRows::new(truth_chunks);
        let mut rows = 0u64;
        for block in reader {
            let block = block?;
            for i in 0..block.len() {
                let labels = truth
                    .labels_of(block.row_ids[i])
                    .with_context(|| format!("{}: row {}", path.display(), block.row_ids[i]))?;
                acc.add_row(block.labels(i), &labels)?;
                rows += 1;
            }
        }
        ensure!(
            rows == split_rows,
            "{}: {rows} predicted rows, but split '{split}' holds {split_rows}",
            path.display()
        );
        Ok(acc.finish())
    })();
    let metrics = match result {
        Ok(m) => m,
        Err(e) => {
            run.failed(&e);
            return Err(e);
        }
    };
    let run_id = run.id;
    let rel = run.output_rel("evaluations", &format!("{}-{split}", dataset.name));
    let staged = run.tmp_dir().join("evaluation");
    std::fs::create_dir_all(&staged)?;
    let json_path = staged.join("metrics.json");
    std::fs::write(&json_path, metrics.to_json())
        .with_context(|| format!("writing {}", json_path.display()))?;
    let written = checksum_file(&json_path)?;
    let artifact = ArtifactRow {
        kind: "metrics".into(),
        path: format!("{rel}/metrics.json"),
        bytes: written.bytes,
        rows: None,
        checksum: written.checksum,
        split: Some(split.clone()),
    };
    run.publish_and_commit("evaluation", &rel, || {
        ws.catalog
            .record_metrics(run_id, &metric_rows(&metrics, step, &split))?;
        ws.catalog
            .commit_artifacts(run_id, Some(dataset.id), &[artifact])
    })?;
    Ok(EvaluateOutcome {
        run_id,
        computed: true,
        metrics,
    })
}

fn resolve_predictions(ws: &Workspace, p: &str) -> PathBuf {
    let as_given = Path::new(p);
    if as_given.is_absolute() || as_given.exists() {
        as_given.to_path_buf()
    } else {
        ws.resolve(p)
    }
}

/// The metrics of a completed evaluate run, from the JSON file it registered.
fn load_metrics(ws: &Workspace, run_id: i64) -> Result<Metrics> {
    let art = ws
        .catalog
        .run_artifacts(run_id)?
        .into_iter()
        .find(|a| a.kind == "metrics")
        .with_context(|| format!("evaluate run {run_id} registered no metrics"))?;
    let path = ws.resolve(&art.path);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// The true labels of a split's rows, read chunk by chunk as the row ids advance.
struct TruthRows {
    chunks: VecDeque<PathBuf>,
    /// (row id, labels) of the current chunk not yet consumed.
    pending: VecDeque<(u64, Vec<u32>)>,
}

impl TruthRows {
    fn new(chunks: Vec<PathBuf>) -> Self {
        TruthRows {
            chunks: chunks.into(),
            pending: VecDeque::new(),
        }
    }

    /// The labels of `row_id`; rows must be asked for in increasing order (rows skipped on
    /// the way are an error: the predictions must cover the split).
    fn labels_of(&mut self, row_id: u64) -> Result<Vec<u32>> {
        loop {
            if let Some((id, _)) = self.pending.front() {
                let id = *id;
                ensure!(
                    id == row_id,
                    "expected row {id} of the split next, found row {row_id} (predictions \
                     must hold every row of the split, in order)"
                );
                return Ok(self.pending.pop_front().expect("non-empty").1);
            }
            let Some(next) = self.chunks.pop_front() else {
                bail!("row {row_id} is beyond the split's last row");
            };
            let c = read_chunk_labels(&next)?;
            for (i, &id) in c.row_ids.iter().enumerate() {
                let labels = c.labels[c.offsets[i] as usize..c.offsets[i + 1] as usize].to_vec();
                self.pending.push_back((id, labels));
            }
        }
    }
}
