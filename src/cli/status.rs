//! `pipeline status`: what the workspace holds, as tables or JSON: datasets, derived
//! artifacts, training runs with their configuration, progress, bound and precision, and
//! recent stage runs. `pipeline status --run N` shows one run in full, with the key–value
//! metadata of its Parquet files.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use serde::Serialize;

use super::args::StatusArgs;
use crate::metrics::names::{AtK, Figure};
use crate::store::catalog::{
    ArtifactKind, ClassMap, DatasetRow, LabelKind, MetricRow, RunRow, RunStatus, Split, StageKind,
};
use crate::store::footer::parquet_key_values;
use crate::store::owned::checked_rel;
use crate::store::workspace::{as_seen, Workspace};
use crate::train::budget;
use crate::trained::{EarlyStopping, Stopped, TrainConfig};

/// A split as `status --json` has always shown it: its name, "" when none was recorded.
fn split_name<S: serde::Serializer>(split: &Option<Split>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(split.map_or("", Split::name))
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

/// The dataset's feature transform and, when `auto` chose it, why.
fn transform_line(d: &DatasetRow) -> String {
    match &d.transform_reason {
        Some(reason) => format!("transform {} (auto: {reason})", d.normalization),
        None => format!("transform {} (asked for)", d.normalization),
    }
}

/// Prints the workspace's datasets, derived artifacts, training runs and recent stage runs,
/// or with `--run N` that one run in full.
/// `pipeline status` of a directory that holds no workspace yet (nothing was run there):
/// the status of an empty workspace, and nothing created.
pub fn print_empty(root: &std::path::Path, args: &StatusArgs) -> Result<()> {
    if let Some(id) = args.run {
        anyhow::bail!(
            "no run {id}: there is no workspace at {} yet",
            root.display()
        );
    }
    if args.json {
        let doc = serde_json::json!({
            "workspace": root.display().to_string(),
            "datasets": [],
            "runs": [],
            "artifacts": { "count": 0, "bytes": 0 },
            "train_runs": [],
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        println!("workspace {}", root.display());
        println!();
        println!("no workspace here yet: nothing has been run in it (no catalog.sqlite)");
    }
    Ok(())
}

pub fn print(ws: &Workspace, args: &StatusArgs) -> Result<()> {
    if let Some(id) = args.run {
        return print_run(ws, id, args.json);
    }
    let datasets = ws.catalog.datasets()?;
    let runs: Vec<RunRow> = ws
        .catalog
        .runs(args.runs)?
        .into_iter()
        .map(as_seen)
        .collect();
    let artifacts = ws.catalog.artifacts(None)?;
    let train_runs = train_summaries(ws, args.runs)?;
    if args.json {
        let doc = serde_json::json!({
            "workspace": ws.root().display().to_string(),
            "datasets": datasets,
            "runs": runs,
            "artifacts": { "count": artifacts.len(), "bytes": artifacts.iter().map(|a| a.bytes).sum::<u64>() },
            "train_runs": train_runs,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!("workspace {}", ws.root().display());
    println!();
    println!("datasets ({})", datasets.len());
    // "validation" is wider than the column of "train" and "test".
    let sw = datasets
        .iter()
        .flat_map(|d| d.splits.iter().map(|s| s.split.name().len()))
        .max()
        .unwrap_or(0)
        .max(6);
    if !datasets.is_empty() {
        println!(
            "  {:<20} {:<8} {:>6} {:>8} {:<sw$} {:>10} {:>12} {:>7} {:>10}",
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
                "  {:<20} {:<8} {:>6} {:>8} {:<sw$} {:>10} {:>12} {:>7} {:>10}",
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
        let param = |key: &str| d.params.get(key).cloned().unwrap_or(serde_json::json!(0));
        let carved = match (
            d.params.get("validation_fraction"),
            d.params.get("validation_folds"),
        ) {
            (Some(f), _) => Some(format!("fraction {f}")),
            (_, Some(k)) => Some(format!("fold {} of {k}", param("validation_fold"))),
            _ => None,
        };
        if let Some(carved) = carved {
            println!(
                "  {:<20} validation carved from the training rows: {carved}, seed {}",
                "",
                param("validation_seed")
            );
        }
        if let Some(map) = &d.class_map {
            println!("  {:<20} {}", "", class_map_line(d.label_kind(), map));
        }
        println!("  {:<20} {}", "", transform_line(d));
    }
    // Derived artifacts grouped by the directory (one stage run) holding them.
    let mut groups: Vec<(String, Vec<&str>, u64)> = Vec::new();
    // (A dataset's own files, its chunks and its transform, are in the table above.)
    let dataset_file =
        |k: ArtifactKind| matches!(k, ArtifactKind::Chunk | ArtifactKind::FeatureTransform);
    for a in artifacts.iter().filter(|a| !dataset_file(a.kind)) {
        let dir = a.path.rsplit_once('/').map_or("", |(d, _)| d).to_string();
        match groups.iter_mut().find(|g| g.0 == dir) {
            Some(g) => {
                g.1.push(a.kind.as_str());
                g.2 += a.bytes;
            }
            None => groups.push((dir, vec![a.kind.as_str()], a.bytes)),
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
    print_train_table(&train_runs);
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

/// A training run as `pipeline status` summarises it.
#[derive(Debug, Serialize)]
struct TrainRunSummary {
    id: i64,
    status: RunStatus,
    dataset: String,
    kernel: &'static str,
    /// `--ard` (none, subspace).
    ard: &'static str,
    /// `--q-form` (sites, cholesky, whitened).
    q_form: &'static str,
    svd_run: i64,
    /// M: inducing inputs.
    inducing: usize,
    /// P: latent GPs.
    factors: usize,
    /// `--inducing-inputs` (subspace, free, fixed-subspace, fixed-rows).
    inducing_inputs: &'static str,
    /// R: the svd run's rank (None when that run is gone); for inducing inputs in input
    /// space (the identity basis), D, shown as `D<n>`.
    rank: Option<u64>,
    batch: usize,
    /// The budget's epochs (with `steps`, the epochs those steps reach).
    epochs: u64,
    /// The budget in optimiser steps (`--steps`, or the default's floor on small data);
    /// None for a budget in epochs.
    steps: Option<u64>,
    max_steps: Option<u64>,
    /// `--early-stopping`: its metric, patience and period.
    early_stopping: Option<EarlyStopping>,
    /// How the run ended: why, at which step, and an early-stopping run's best evaluation
    /// (None while it runs, or for runs from before this was recorded).
    stopped: Option<Stopped>,
    /// The step of the checkpoint early stopping marked best (the one predict reads).
    best_step: Option<u64>,
    /// The step of the run's last checkpoint (0 before the first).
    steps_done: u64,
    /// The steps the run plans in all (None when its dataset is gone or was re-ingested).
    steps_total: Option<u64>,
    /// Checkpoints registered (kept on disk) and their total size.
    checkpoints: usize,
    checkpoint_bytes: u64,
    /// The exact full-data bound at the end of the run (`elbo_exact`).
    final_elbo: Option<f64>,
    /// The last epoch recorded and its mean minibatch ELBO.
    last_epoch: Option<EpochElbo>,
    /// `pipeline evaluate` runs of this run's predictions, oldest first.
    evaluations: Vec<Precision>,
    /// The held-out metrics of the last `--eval-every` evaluation.
    held_out: Option<Precision>,
}

#[derive(Debug, Serialize)]
struct EpochElbo {
    /// 1-based.
    epoch: i64,
    mean_elbo: f64,
}

/// P@1, P@3 and P@5 (fractions) of one evaluation of a training run.
#[derive(Debug, Serialize)]
struct Precision {
    /// `evaluate` (a `pipeline evaluate` run of the run's predictions) or `held_out`
    /// (`pipeline train --eval-every`).
    source: &'static str,
    /// The evaluate run, for source `evaluate`.
    #[serde(skip_serializing_if = "Option::is_none")]
    evaluate_run: Option<i64>,
    /// The split's name ("" when the run recorded none).
    #[serde(serialize_with = "split_name")]
    split: Option<Split>,
    /// The training checkpoint evaluated, for source `evaluate`.
    #[serde(skip_serializing_if = "Option::is_none")]
    checkpoint_step: Option<u64>,
    /// The epoch evaluated, for source `held_out`.
    #[serde(skip_serializing_if = "Option::is_none")]
    epoch: Option<i64>,
    p_at_1: Option<f64>,
    p_at_3: Option<f64>,
    p_at_5: Option<f64>,
}

impl Precision {
    fn from_metrics(
        source: &'static str,
        split: Option<Split>,
        metrics: &[MetricRow],
        step: Option<i64>,
    ) -> Self {
        let value = |name: &str| {
            metrics
                .iter()
                .rev()
                .find(|m| m.name == name && m.step == step && split.is_some() && m.split == split)
                .map(|m| m.value)
        };
        Precision {
            source,
            evaluate_run: None,
            p_at_1: value(&AtK::P.at(1)),
            p_at_3: value(&AtK::P.at(3)),
            p_at_5: value(&AtK::P.at(5)),
            split,
            checkpoint_step: None,
            epoch: None,
        }
    }

    fn split_name(&self) -> &'static str {
        self.split.map_or("", Split::name)
    }

    /// `P@1/P@3/P@5` in percent.
    fn percentages(&self) -> String {
        let pct = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.2}", 100.0 * v));
        format!(
            "{}/{}/{}",
            pct(self.p_at_1),
            pct(self.p_at_3),
            pct(self.p_at_5)
        )
    }

    /// Where the figures come from, in a few words.
    fn origin(&self) -> String {
        match (self.evaluate_run, self.checkpoint_step, self.epoch) {
            (Some(run), step, _) => format!(
                "evaluate #{run} on {} at step {}",
                self.split_name(),
                step.map_or("?".into(), |s| s.to_string())
            ),
            (None, _, Some(epoch)) => format!("held-out {} at epoch {epoch}", self.split_name()),
            _ => self.split_name().to_string(),
        }
    }
}

/// The newest training runs, newest first.
fn train_summaries(ws: &Workspace, limit: usize) -> Result<Vec<TrainRunSummary>> {
    ws.catalog
        .runs_of_stage(StageKind::Train, limit)?
        .into_iter()
        .map(|r| train_summary(ws, &as_seen(r)))
        .collect()
}

/// A training run's summary, from its configuration in force (what it runs now: a resume
/// may have changed its budget) and how it ended.
fn train_summary(ws: &Workspace, run: &RunRow) -> Result<TrainRunSummary> {
    let options = ws.catalog.run_options(run.id)?;
    let in_force = options.as_ref().map_or(&run.params, |o| &o.params);
    let config: TrainConfig = serde_json::from_value(in_force.clone())
        .with_context(|| format!("train run {}: unreadable configuration", run.id))?;
    let stopped: Option<Stopped> = options
        .and_then(|o| o.stopped)
        .map(serde_json::from_value)
        .transpose()
        .with_context(|| format!("train run {}: unreadable stop record", run.id))?;
    let checkpoints = ws.catalog.checkpoints(run.id)?;
    let metrics = ws.catalog.metrics(run.id)?;
    let last_epoch = metrics
        .iter()
        .filter(|m| m.name == Figure::EpochElbo.name())
        .filter_map(|m| Some((m.step?, m.value)))
        .max_by_key(|&(epoch, _)| epoch)
        .map(|(epoch, mean_elbo)| EpochElbo { epoch, mean_elbo });
    let final_elbo = metrics
        .iter()
        .rev()
        .find(|m| m.name == Figure::ElboExact.name())
        .map(|m| m.value);
    let rank = match config.inducing_inputs.in_features() {
        true => ws.catalog.dataset(&config.dataset)?.map(|d| d.n_features),
        false => ws
            .catalog
            .run(config.svd_run)?
            .and_then(|svd| svd.params["rank"].as_u64()),
    };
    Ok(TrainRunSummary {
        id: run.id,
        status: run.status,
        dataset: config.dataset.clone(),
        kernel: config.kernel.name(),
        ard: config.ard.name(),
        q_form: config.q_form.name(),
        inducing_inputs: config.inducing_choice().name(),
        svd_run: config.svd_run,
        inducing: config.inducing,
        factors: config.factors,
        rank,
        batch: config.batch,
        epochs: config.epochs,
        steps: config.steps,
        max_steps: config.max_steps,
        early_stopping: config.early_stopping,
        stopped,
        best_step: checkpoints.iter().find(|c| c.best).map(|c| c.step),
        steps_done: checkpoints.last().map_or(0, |c| c.step),
        steps_total: planned_steps(ws, &config)?,
        checkpoints: checkpoints.len(),
        checkpoint_bytes: checkpoints.iter().map(|c| c.bytes).sum(),
        final_elbo,
        last_epoch,
        evaluations: evaluations(ws, run.id)?,
        held_out: held_out(&metrics),
    })
}

/// The optimiser steps a run takes in all: its budget (`--steps`, or the minibatches of its
/// epochs as the trainer's planner cuts them, chunk group by chunk group), or `max_steps` if
/// fewer — the same total as `train_loop`'s progress bar.
fn planned_steps(ws: &Workspace, config: &TrainConfig) -> Result<Option<u64>> {
    let Some(dataset) = ws.catalog.dataset(&config.dataset)? else {
        return Ok(None);
    };
    if dataset.checksum != config.dataset_checksum {
        return Ok(None);
    }
    let planner = budget::planner_of(ws, &dataset, config)?;
    // O(chunks) whatever the epoch count (None, shown "?", only for a run recorded before
    // `--epochs` was limited whose epochs the shuffle cuts differently).
    Ok(budget::planned_steps(config, &planner))
}

/// P@k of every `pipeline evaluate` run of the training run's predictions.
fn evaluations(ws: &Workspace, train_run: i64) -> Result<Vec<Precision>> {
    let mut out = Vec::new();
    for link in ws.catalog.evaluations_of_train_run(train_run)? {
        let metrics = ws.catalog.metrics(link.evaluate_run)?;
        // Evaluate records its figures at the checkpoint step (`fsgp.checkpoint_step`).
        let step = link.checkpoint_step.map(|s| s as i64);
        let mut p = Precision::from_metrics("evaluate", link.split, &metrics, step);
        p.evaluate_run = Some(link.evaluate_run);
        p.checkpoint_step = link.checkpoint_step;
        out.push(p);
    }
    Ok(out)
}

/// The held-out P@k of the last epoch `--eval-every` evaluated.
fn held_out(metrics: &[MetricRow]) -> Option<Precision> {
    let last = metrics
        .iter()
        .filter(|m| m.name == AtK::P.at(1) && m.step.is_some())
        .max_by_key(|m| m.step)?;
    let mut p = Precision::from_metrics("held_out", last.split, metrics, last.step);
    p.epoch = last.step;
    Some(p)
}

impl TrainRunSummary {
    /// The budget as `status --run` states it: `3000 steps (1000 epochs), --max-steps 50`.
    fn budget_line(&self) -> String {
        let budget = match self.steps {
            Some(steps) => format!("{steps} steps ({} epochs)", self.epochs),
            None => format!("{} epochs", self.epochs),
        };
        let cut = self
            .max_steps
            .map_or(String::new(), |s| format!(", cut at --max-steps {s}"));
        let ended = self
            .stopped
            .map_or(String::new(), |s| format!("; ended: {s}"));
        format!("{budget}{cut}{ended}")
    }

    /// Early stopping as `status --run` states it, with the checkpoint it marked best.
    fn early_stopping_line(&self) -> Option<String> {
        let es = self.early_stopping?;
        let best = match (self.best_step, self.stopped.and_then(|s| s.best)) {
            (Some(step), Some(b)) if b.step == step => format!(
                "; best {} {:.6} at step {step}, the checkpoint predict reads",
                b.metric.name(),
                b.value
            ),
            (Some(step), _) => format!("; best at step {step}, the checkpoint predict reads"),
            (None, _) => "; no score yet".to_string(),
        };
        Some(format!(
            "early stopping: {} on validation every {} steps, patience {}{best}",
            es.metric.name(),
            es.every,
            es.patience
        ))
    }

    /// The precision the table shows: the newest `pipeline evaluate` run, else the
    /// held-out figures of the last evaluated epoch.
    fn shown_precision(&self) -> Option<&Precision> {
        self.evaluations.last().or(self.held_out.as_ref())
    }

    fn table_row(&self) -> String {
        let in_features = matches!(self.inducing_inputs, "free" | "fixed-rows");
        let mpr = format!(
            "{}/{}/{}{}",
            self.inducing,
            self.factors,
            if in_features { "D" } else { "" },
            self.rank.map_or("?".into(), |r| r.to_string())
        );
        let steps = format!(
            "{}/{}",
            self.steps_done,
            self.steps_total.map_or("?".into(), |t| t.to_string())
        );
        let elbo = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.4e}"));
        let ended = self.stopped.map_or("-", |s| s.reason.name());
        let (p, origin) = self
            .shown_precision()
            .map_or(("-".to_string(), String::new()), |p| {
                (p.percentages(), p.origin())
            });
        // The kernel, with "+ard" under either ARD (`--run N` names which), and the q(u) form.
        let ard = if self.ard == "none" { "" } else { "+ard" };
        format!(
            "  #{:<5} {:<14} {:<13} {:<8} {:>12} {:>5} {:>6} {:<11} {:<14} {:>13} {:>5} {:>11} {:>11} {:>17}  {}",
            self.id,
            self.dataset,
            format!("{}{ard}", self.kernel),
            self.q_form,
            mpr,
            self.batch,
            self.epochs,
            self.status,
            ended,
            steps,
            self.checkpoints,
            elbo(self.final_elbo),
            elbo(self.last_epoch.as_ref().map(|e| e.mean_elbo)),
            p,
            origin
        )
    }
}

/// The "training runs" section of the status tables.
fn print_train_table(train_runs: &[TrainRunSummary]) {
    if train_runs.is_empty() {
        return;
    }
    println!();
    println!("training runs ({})", train_runs.len());
    println!(
        "  {:<6} {:<14} {:<13} {:<8} {:>12} {:>5} {:>6} {:<11} {:<14} {:>13} {:>5} {:>11} {:>11} {:>17}  from",
        "run",
        "dataset",
        "kernel",
        "q(u)",
        "M/P/R",
        "B",
        "epochs",
        "state",
        "ended",
        "steps",
        "ckpts",
        "final ELBO",
        "epoch ELBO",
        "P@1/3/5 (%)"
    );
    for t in train_runs {
        println!("{}", t.table_row());
    }
    println!(
        "  (ended: why the run stopped, budget, max-steps or no-improvement (early stopping); \
         final ELBO: the exact full-data bound at the end; epoch ELBO: the mean minibatch \
         bound of the last epoch)"
    );
}

/// A file of a run, with the key–value metadata of its footer when it is Parquet.
#[derive(Debug, Serialize)]
struct FileDetail {
    /// The artifact kind, or `checkpoint`.
    kind: String,
    /// Relative to the workspace.
    path: String,
    bytes: u64,
    checksum: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    rows: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    split: Option<Split>,
    /// Checkpoints: the step and epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    epoch: Option<u64>,
    /// Checkpoints: the one early stopping marked best.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    best: bool,
    /// Parquet files: the footer's key–value metadata.
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<BTreeMap<String, String>>,
    /// Parquet files whose footer could not be read (missing, damaged): why.
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata_error: Option<String>,
}

impl FileDetail {
    /// Reads the footer of a Parquet file; a file that cannot be read is reported, not
    /// fatal, so `status` still describes a damaged workspace.
    /// A path the catalog gives that leaves `stage`'s folder is not opened: its refusal is
    /// reported in its place.
    fn with_metadata(mut self, ws: &Workspace, stage: StageKind) -> Self {
        if self.path.ends_with(".parquet") {
            let read =
                checked_rel(&self.path, stage).and_then(|rel| parquet_key_values(&ws.resolve(rel)));
            match read {
                Ok(kv) => self.metadata = Some(kv.into_iter().collect()),
                Err(e) => self.metadata_error = Some(format!("{e:#}")),
            }
        }
        self
    }
}

/// One run in full.
#[derive(Debug, Serialize)]
struct RunDetail {
    run: RunRow,
    artifacts: Vec<FileDetail>,
    checkpoints: Vec<FileDetail>,
    metrics: Vec<MetricRow>,
    /// For a training run: the summary line of the status table.
    #[serde(skip_serializing_if = "Option::is_none")]
    train: Option<TrainRunSummary>,
}

fn run_detail(ws: &Workspace, id: i64) -> Result<RunDetail> {
    let run = ws.catalog.run(id)?.map(as_seen).with_context(|| {
        format!("no run {id} in the catalog ('pipeline status' lists the runs)")
    })?;
    let artifacts = ws
        .catalog
        .run_artifacts(id)?
        .into_iter()
        .map(|a| {
            FileDetail {
                kind: a.kind.as_str().to_string(),
                path: a.path,
                bytes: a.bytes,
                checksum: a.checksum,
                rows: a.rows,
                split: a.split,
                step: None,
                epoch: None,
                best: false,
                metadata: None,
                metadata_error: None,
            }
            .with_metadata(ws, run.stage)
        })
        .collect();
    let checkpoints = ws
        .catalog
        .checkpoints(id)?
        .into_iter()
        .map(|c| {
            FileDetail {
                kind: "checkpoint".into(),
                path: c.path,
                bytes: c.bytes,
                checksum: c.checksum,
                rows: None,
                split: None,
                step: Some(c.step),
                epoch: Some(c.epoch),
                best: c.best,
                metadata: None,
                metadata_error: None,
            }
            .with_metadata(ws, StageKind::Train)
        })
        .collect();
    let train = match run.stage {
        StageKind::Train => Some(train_summary(ws, &run)?),
        _ => None,
    };
    Ok(RunDetail {
        metrics: ws.catalog.metrics(id)?,
        run,
        artifacts,
        checkpoints,
        train,
    })
}

/// `pipeline status --run N`.
fn print_run(ws: &Workspace, id: i64, json: bool) -> Result<()> {
    let d = run_detail(ws, id)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&d)?);
        return Ok(());
    }
    let r = &d.run;
    println!("run #{} ({}): {}", r.id, r.stage, r.status);
    println!(
        "  started {}, ended {}, pid {}",
        r.started_at,
        r.ended_at.as_deref().unwrap_or("-"),
        r.pid
    );
    if let Some(e) = &r.error {
        println!("  error:");
        for line in e.lines() {
            println!("    {line}");
        }
    }
    if let Some(t) = &d.train {
        print_train_table(std::slice::from_ref(t));
        println!(
            "  q(u) form: {}, kernel: {}, ARD: {}, inducing inputs: {}",
            t.q_form, t.kernel, t.ard, t.inducing_inputs
        );
        println!("  budget: {}", t.budget_line());
        if let Some(line) = t.early_stopping_line() {
            println!("  {line}");
        }
        for p in &t.evaluations {
            println!("  P@1/3/5 {} % ({})", p.percentages(), p.origin());
        }
        if let Some(p) = &t.held_out {
            println!("  P@1/3/5 {} % ({})", p.percentages(), p.origin());
        }
    }
    println!();
    println!("params");
    match r.params.as_object() {
        Some(obj) => {
            for (k, v) in obj {
                println!("  {k} = {v}");
            }
        }
        None => println!("  {}", r.params),
    }
    print_files("artifacts", &d.artifacts);
    print_files("checkpoints", &d.checkpoints);
    print_metrics(&d.metrics);
    Ok(())
}

/// The footer key under which the Arrow writer stores its schema (IPC, base64).
const ARROW_SCHEMA_KEY: &str = "ARROW:schema";

fn print_files(title: &str, files: &[FileDetail]) {
    if files.is_empty() {
        return;
    }
    println!();
    println!("{title} ({})", files.len());
    for f in files {
        let mut what = f.kind.clone();
        if let (Some(step), Some(epoch)) = (f.step, f.epoch) {
            let best = if f.best { ", best" } else { "" };
            what = format!("step {step} (epoch {epoch}){best}");
        }
        let rows = f.rows.map_or(String::new(), |r| format!("  {r} rows"));
        let split = f.split.map_or(String::new(), |s| format!("  split {s}"));
        println!(
            "  {what:<18} {}  {} ({} B)  xxh3 {}{rows}{split}",
            f.path,
            human_bytes(f.bytes),
            f.bytes,
            f.checksum
        );
        if let Some(kv) = &f.metadata {
            for (k, v) in kv {
                if k == ARROW_SCHEMA_KEY {
                    // The Arrow writer's own copy of the schema: opaque, and long.
                    println!("      {k} = ({} characters of base64)", v.len());
                } else {
                    println!("      {k} = {v}");
                }
            }
        }
        if let Some(e) = &f.metadata_error {
            println!("      (metadata unreadable: {e})");
        }
    }
}

/// The run's figures grouped by (step, split) in the order first recorded, a few to a
/// line. The step is an epoch for per-epoch figures, an optimiser step for the others.
fn print_metrics(metrics: &[MetricRow]) {
    if metrics.is_empty() {
        return;
    }
    // (step, split) → the figures recorded there.
    type Group = ((Option<i64>, Option<Split>), Vec<String>);
    let mut lines: Vec<Group> = Vec::new();
    for m in metrics {
        let key = (m.step, m.split);
        let figure = format!("{}={}", m.name, format_value(m.value));
        match lines.iter_mut().find(|l| l.0 == key) {
            Some(l) => l.1.push(figure),
            None => lines.push((key, vec![figure])),
        }
    }
    println!();
    println!("metrics ({})", metrics.len());
    for ((step, split), figures) in lines {
        let at = format!(
            "{}{}",
            step.map_or("-".into(), |s| format!("at {s}")),
            split.map_or(String::new(), |s| format!(" {s}"))
        );
        for (i, group) in figures.chunks(FIGURES_PER_LINE).enumerate() {
            let label = if i == 0 { at.as_str() } else { "" };
            println!("  {label:<14} {}", group.join("  "));
        }
    }
}

/// Metric figures per line of `status --run` (the five measures of one k for held-out and
/// evaluate figures).
const FIGURES_PER_LINE: usize = 5;

/// A figure with enough digits to compare: ELBOs are large, fractions small.
fn format_value(v: f64) -> String {
    if v != 0.0 && (v.abs() >= 1e5 || v.abs() < 1e-3) {
        format!("{v:.6e}")
    } else {
        format!("{v:.6}")
    }
}

/// `labels: multiclass, id → label 0 → 0, 1 → 1, ...` (at most 10 entries shown).
fn class_map_line(kind: LabelKind, map: &ClassMap) -> String {
    let mut shown: Vec<String> = map
        .values
        .iter()
        .enumerate()
        .take(10)
        .map(|(id, v)| format!("{id} → {v}"))
        .collect();
    if map.len() > 10 {
        shown.push(format!("... ({} classes)", map.len()));
    }
    let negative = map
        .negative
        .map_or(String::new(), |n| format!("; negative class {n}"));
    format!("labels: {kind}, id → label {}{negative}", shown.join(", "))
}
