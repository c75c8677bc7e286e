//! `pipeline fit`'s command: the rule's steps in order, its table and the final spec.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Parser;

use super::budget::{self, Row};
use super::folds;
use super::inputs::{InputFormat, Inputs};
use super::names::{self, ReservedSpec};
use super::options::spec_pairs;
use super::outcome::{candidate_outcome, Figures, FinalRun, FitOutcome, ModelFile};
use super::plan::Plan;
use super::request::FitRequest;
use super::rule::*;
use super::sizes;
use crate::cli::args::{Cli, Command, FitArgs, Setting};
use crate::cli::spec::{self, Spec};
use crate::export::ExportOptions;
use crate::metrics::evaluation::Evaluation;
use crate::store::catalog::{LabelKind, Split};
use crate::store::user_file::{check_file_output, refuse_same_file, UserFile};
use crate::store::workspace::Workspace;
use crate::train::{TrainFlag, TrainOptions};

/// Runs a fit: its progress and table go to standard error; returns what it did.
pub fn run(ws: &Workspace, args: &FitRequest) -> Result<FitOutcome> {
    let started = Instant::now();
    args.check()?;
    let budget = args.budget_seconds;
    let format = match args.format {
        Some(f) => f,
        None => sniff_format(&args.train)?,
    };
    let inputs = Inputs {
        train: args.train.clone(),
        test: args.test.clone(),
        format,
        features: args.features,
    };
    check_outputs(args)?;
    if let Some(spec) = &args.spec_out {
        ws.refuse_output_inside("--spec-out", spec)?;
    }
    if let Some(model) = &args.model_out {
        ws.refuse_output_inside("--model-out", model)?;
    }
    let (fraction, seed) = (args.validation_fraction, args.seed);
    let name = match &args.name {
        Some(name) => name.clone(),
        None => names::free_name(ws, &inputs, fraction, seed)?,
    };
    let select = names::select_name(&name);
    // Checked (the name among it) before the spec's file is made from the name.
    let select_config = names::select_config(&inputs, &name, fraction, seed)?;
    // Without --spec-out, a new file of fit's own inside the workspace: it cannot clash
    // with another fit's.
    let mut reserved = match &args.spec_out {
        Some(_) => None,
        None => Some(ReservedSpec::create(ws, &name)?),
    };
    let spec_path = match (&reserved, &args.spec_out) {
        (Some(r), _) => r.path.clone(),
        (None, Some(p)) => p.clone(),
        (None, None) => unreachable!("a spec path is given or reserved"),
    };
    eprintln!(
        "== fit: ingest {} as '{select}' (with a validation split)",
        args.train.display()
    );
    crate::ingest::run(ws, &select_config)?;
    let dataset = ws.dataset_named(&select)?;
    let kind = match args.task {
        Some(k) => k,
        None => dataset.label_kind(),
    };
    let train_rows = dataset.split(Split::Train).map_or(0, |s| s.n_rows);
    let sizes = Sizes {
        n: train_rows,
        d: dataset.n_features,
        l: dataset.n_labels,
        dense: dataset
            .split(Split::Train)
            .is_some_and(|s| 2 * s.nnz >= s.n_rows.saturating_mul(dataset.n_features).max(1)),
        memory: sizes::svd_memory()?,
        svd_seconds: sizes::svd_seconds(budget),
    };
    let mut list = with_settings(candidates(kind, sizes), &args.overrides);
    // The final model ingests the whole file again: that time, as this ingest measured it,
    // is set aside before the selection's share is taken.
    let ingest_seconds = started.elapsed().as_secs_f64();
    let left = (budget - 2.0 * ingest_seconds).max(0.0);
    let batch = batch_of(&list);
    let cap = step_cap(sizes.n, batch);
    // Ten epochs of steps, or the cap when that is fewer (small data).
    let needed = (MIN_EPOCHS * sizes.n.div_ceil(batch)).min(cap);
    eprintln!(
        "== fit: task {}, N = {}, D = {}, L = {}, {} rows; {} candidates (budget {:.0} s, {:.0} s \
         left after this ingest and the final one)",
        kind.as_str(),
        sizes.n,
        sizes.d,
        sizes.l,
        if sizes.dense { "dense" } else { "sparse" },
        list.len(),
        budget,
        left
    );
    let plan = Plan {
        dataset: select.clone(),
        kind,
        seed: args.seed,
        budget,
        left,
        cap,
        needed,
        epoch_steps: sizes.n.div_ceil(batch),
        fixed: !args.early_stopping,
    };
    // Small data: each candidate on k folds instead of the one carve (docs/fit.md).
    let folded = folds::select(
        ws,
        &folds::Selection {
            inputs: &inputs,
            folds: args.folds,
            fraction,
            name: &name,
            select: &select,
            validation_rows: dataset.split(Split::Validation).map_or(0, |s| s.n_rows),
            plan: &plan,
        },
        &list,
    )?;
    let folds = match &folded {
        Some(_) => folds::fold_count(args.validation_fraction),
        None => 1,
    };
    let (rows, floor) = match folded {
        Some(folded) => folded,
        None => {
            let mut rows = budget::select(ws, &mut list, &plan)?;
            if !plan.fixed {
                let spent = || started.elapsed().as_secs_f64();
                budget::train_on(ws, &mut rows, &plan, spent, ingest_seconds)?;
            }
            let floor = frequency_floor(ws, &dataset, kind)?;
            print_table(&rows, floor);
            (rows, floor)
        }
    };
    // The rule chooses among the scored rows; `chosen` is its index among all rows.
    let scored: Vec<(usize, &Scored)> = rows
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.scored().map(|s| (i, s)))
        .collect();
    anyhow::ensure!(
        !scored.is_empty(),
        "every candidate failed (the table above says why); nothing was chosen"
    );
    let refs: Vec<&Scored> = scored.iter().map(|(_, s)| *s).collect();
    let winner = choose(&refs).expect("a scored row");
    let (chosen_row, chosen) = scored[winner];
    if chosen.key().0 <= floor.0 {
        eprintln!(
            "warning: the chosen model does not beat the label frequencies on validation: \
             its features taught it nothing it could show there (features on the wrong \
             scale, no signal, or too small a budget)"
        );
    }
    eprintln!(
        "== fit: chosen {} ({} steps); training it on every training row",
        chosen.candidate.name, chosen.steps
    );
    // The reserved spec is fit's own empty file: written over without --force.
    let replace = args.force || reserved.is_some();
    let split = match args.test {
        Some(_) => Split::Test,
        None => Split::Train,
    };
    let final_model = FinalModel {
        inputs: &inputs,
        name: &name,
        kind,
        seed,
        split,
    };
    write_spec(&spec_path, &final_model, chosen, replace)?;
    if let Some(r) = &mut reserved {
        r.keep();
    }
    let spec = Spec::read(&spec_path)?;
    let final_runs = spec::execute(ws, &spec)?;
    let mut model = None;
    if let (Some(out), Some(first)) = (&args.model_out, final_runs.first()) {
        let exported = crate::export::run(
            ws,
            &ExportOptions {
                run: first.train_run,
                checkpoint: None,
                out: out.clone(),
                force: args.force,
            },
        )?;
        eprintln!(
            "== fit: the final model (train run {}, step {}) is in {}",
            first.train_run,
            exported.checkpoint_step,
            exported.path.display()
        );
        model = Some(ModelFile {
            path: exported.path.clone(),
            train_run: first.train_run,
            checkpoint_step: exported.checkpoint_step,
        });
    }
    let seconds = started.elapsed().as_secs_f64();
    eprintln!(
        "== fit: {seconds:.0} s of a {budget:.0} s budget; `pipeline run {}` reproduces the \
         final model",
        spec_path.display()
    );
    let ranking = kind == LabelKind::Multilabel;
    Ok(FitOutcome {
        dataset: name,
        task: kind.as_str(),
        selection_rows: sizes.n,
        features: sizes.d,
        labels: sizes.l,
        dense: sizes.dense,
        budget_seconds: budget,
        seconds,
        folds,
        candidates: rows.iter().map(|r| candidate_outcome(r, ranking)).collect(),
        chosen: chosen_row,
        baseline: Figures::of_key(floor, ranking),
        final_steps: chosen.steps,
        final_runs: final_runs
            .into_iter()
            .map(|e| FinalRun {
                seed: e.seed,
                train_run: e.train_run,
                evaluate_run: e.evaluate_run,
                metrics: e.metrics,
            })
            .collect(),
        evaluated_split: if args.test.is_some() { "test" } else { "train" },
        spec: spec_path,
        model,
    })
}

/// Runs `pipeline fit` and prints the final model's metrics (`--json`: the whole
/// [`FitOutcome`]) on standard output.
pub fn run_command(ws: &Workspace, args: &FitArgs) -> Result<()> {
    let outcome = run(ws, &request(args)?)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&outcome).expect("a fit outcome is JSON")
        );
        return Ok(());
    }
    for f in &outcome.final_runs {
        if outcome.final_runs.len() > 1 {
            println!("seed {}:", f.seed);
        }
        println!("{}", f.metrics.to_table());
    }
    Ok(())
}

/// The fit `pipeline fit`'s arguments ask for.
fn request(args: &FitArgs) -> Result<FitRequest> {
    let format = args.format.as_deref().map(str::parse::<InputFormat>);
    Ok(FitRequest {
        train: args.train.clone(),
        test: args.test.clone(),
        format: format.transpose().map_err(anyhow::Error::msg)?,
        features: args.features,
        task: args.task,
        budget_seconds: args.budget,
        name: args.name.clone(),
        seed: args.seed,
        validation_fraction: args.validation_fraction,
        overrides: overrides(&args.set).context("fit --set")?,
        early_stopping: !args.no_early_stopping,
        folds: !args.no_folds,
        spec_out: args.spec_out.clone(),
        model_out: args.model_out.clone(),
        force: args.force,
    })
}

/// The train options `--set` gives, typed by train's own command line (which refuses a
/// value train would refuse, before anything runs); `given` names them.
fn overrides(sets: &[Setting]) -> Result<TrainOptions> {
    let mut argv = vec![
        "pipeline".to_string(),
        "train".into(),
        "--dataset".into(),
        "-".into(),
    ];
    for s in sets {
        argv.push(format!("--{}", s.flag));
        if !s.value.is_empty() {
            argv.push(s.value.clone());
        }
    }
    let cli = Cli::try_parse_from(&argv)
        .map_err(|e| anyhow::anyhow!("{}", e.render().to_string().trim_end()))?;
    let Command::Train(train) = cli.command else {
        unreachable!("the command line is train's")
    };
    let mut options = train.options();
    // The dataset was only there for the parser: each run names its own.
    options.dataset = None;
    options.given.remove(&TrainFlag::Dataset);
    Ok(options)
}

/// Refuses, before anything runs, outputs fit may not write (`store::user_file`):
/// `--spec-out` or `--model-out` taken by anything but a regular file, or by one without
/// `--force`, in a missing directory, or the two naming the same file or an input.
fn check_outputs(args: &FitRequest) -> Result<()> {
    let mut outputs = Vec::new();
    if let Some(spec) = &args.spec_out {
        check_file_output(spec, args.force).context("--spec-out")?;
        outputs.push(("--spec-out", spec.as_path()));
    }
    if let Some(model) = &args.model_out {
        check_file_output(model, args.force).context("--model-out")?;
        outputs.push(("--model-out", model));
    }
    let mut inputs = vec![("--train", args.train.as_path())];
    inputs.extend(args.test.as_deref().map(|t| ("--test", t)));
    refuse_same_file(&outputs, &inputs)
}

/// The validation table: one line per candidate (a failed one with its reason), and the
/// label frequencies' line. `converged`: early stopping ended the run (its score stopped
/// improving), not its planned steps or the cap.
fn print_table(rows: &[Row], floor: (f64, f64)) {
    eprintln!();
    eprintln!(
        "{:<44} {:>8} {:>7} {:>7} {:>8} {:>9} {:>10} {:>10}",
        "candidate (validation)",
        "ms/step",
        "planned",
        "trained",
        "seconds",
        "converged",
        "primary",
        "second"
    );
    let ranking = matches!(
        rows.iter().find_map(Row::scored).map(|s| &s.metrics),
        Some(Evaluation::Ranking(_))
    );
    let shown = |(a, b): (f64, f64)| match ranking {
        true => (
            format!("P@1 {:.2}", 100.0 * a),
            format!("P@3 {:.2}", 100.0 * b),
        ),
        false => (format!("acc {:.2}", 100.0 * a), format!("nlp {:.4}", -b)),
    };
    for row in rows {
        let s = match row {
            Row::Scored(s) => s,
            Row::Failed { candidate, reason } => {
                eprintln!("{:<44} failed: {reason}", candidate.name);
                continue;
            }
        };
        let (pa, pb) = shown(s.key());
        eprintln!(
            "{:<44} {:>8.1} {:>7} {:>7} {:>8.1} {:>9} {:>10} {:>10}",
            s.candidate.name,
            1e3 * s.step_seconds,
            s.planned,
            s.steps,
            s.seconds,
            if s.converged { "yes" } else { "no" },
            pa,
            pb
        );
    }
    let (fa, fb) = shown(floor);
    eprintln!(
        "{:<44} {:>8} {:>7} {:>7} {:>8} {:>9} {:>10} {:>10}",
        "(label frequencies, no model)", "", "", "", "", "", fa, fb
    );
    eprintln!();
}

/// The final model's runs but the chosen candidate's: the whole training file as dataset
/// `name`, the fit's task and seed, and the split its predictions score.
struct FinalModel<'a> {
    inputs: &'a Inputs,
    name: &'a str,
    kind: LabelKind,
    seed: u64,
    split: Split,
}

impl FinalModel<'_> {
    /// The chosen candidate's train options for its final run (its svd run is linked in).
    fn train_options(&self, chosen: &Scored) -> TrainOptions {
        let mut options = TrainOptions {
            task: self.kind,
            steps: Some(chosen.steps),
            given: [TrainFlag::Task, TrainFlag::Steps].into(),
            ..TrainOptions::default()
        };
        super::options::apply_given(&mut options, &run_options(&chosen.candidate, self.seed));
        options
    }
}

/// Writes the spec of the final model: the whole training file, the winner's options and
/// steps, predictions of the test split (when there is one) and their evaluation.
fn write_spec(path: &Path, model: &FinalModel, chosen: &Scored, replace: bool) -> Result<()> {
    let mut text = String::new();
    text += &format!(
        "# Written by `pipeline fit` (docs/fit.md): the candidate chosen on validation, {},\n\
         # trained on every training row for the {} steps its selection run took (of {}\n\
         # planned).\n\n",
        chosen.candidate.name, chosen.steps, chosen.planned
    );
    let table = |title: &str, options: &[(&str, String)]| {
        let mut t = format!("[{title}]\n");
        for (k, v) in options {
            let key = k.replace('-', "_");
            let value = match v.as_str() {
                "" => "true".to_string(),
                v if v.parse::<f64>().is_ok() => v.to_string(),
                v => format!("{v:?}"),
            };
            t += &format!("{key} = {value}\n");
        }
        t + "\n"
    };
    text += &table("ingest", &model.inputs.spec_pairs(model.name));
    let mut svd = vec![("seed", model.seed.to_string())];
    svd.extend(chosen.candidate.svd_pairs());
    text += &table("svd", &svd);
    text += &table("train", &spec_pairs(&model.train_options(chosen)));
    let predict = predict_options(model.kind, 0, model.split);
    text += &table("predict", &predict_pairs(&predict));
    text += &table("evaluate", &[("task", model.kind.as_str().to_string())]);
    let file = UserFile::temporary(path, replace)?;
    std::fs::File::create(file.tmp_path())
        .and_then(|mut f| f.write_all(text.as_bytes()).and_then(|()| f.sync_all()))
        .with_context(|| format!("{}: cannot write the spec", path.display()))?;
    file.publish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::args::parse_setting;
    use crate::cli::spec::SpecStage;
    use crate::metrics::binary::BinaryAccumulator;
    use crate::metrics::evaluation::Evaluation;

    #[test]
    fn set_values_are_typed_by_trains_parser_and_refused_as_it_refuses_them() {
        let set = |t: &str| parse_setting(t).unwrap();
        let o = overrides(&[set("kernel=linear"), set("lr=0.02"), set("freeze-hyper")]).unwrap();
        assert_eq!(
            o.given,
            [TrainFlag::Kernel, TrainFlag::Lr, TrainFlag::FreezeHyper].into()
        );
        assert_eq!(
            (o.kernel.name(), o.lr, o.freeze_hyper),
            ("linear", 0.02, true)
        );
        assert!(o.dataset.is_none());
        let e = overrides(&[set("kernel=cubic")]).unwrap_err();
        assert!(format!("{e:#}").contains("cubic"), "{e:#}");
        // What fit decides itself is refused, naming the flag.
        let e = parse_setting("steps=10").unwrap_err();
        assert!(e.contains("fit decides --steps itself"), "{e}");
        assert!(parse_setting("no-such=1").is_err());
        let e = parse_setting("lr-decay-at=20,25").unwrap_err();
        assert!(e.contains("schedule in epochs"), "{e}");
    }

    /// The spec fit writes, run by `pipeline run`'s parser, asks for the same ingest, svd,
    /// train and predict options as the typed ones fit runs.
    #[test]
    fn the_spec_asks_for_the_options_fit_runs() {
        let dir = tempfile::tempdir().unwrap();
        let train = dir.path().join("toy.svm");
        std::fs::write(&train, "+1 1:0.5 2:1\n-1 1:-0.5 2:0.25\n").unwrap();
        let inputs = Inputs {
            train: train.clone(),
            test: Some(train),
            format: InputFormat::Libsvm,
            features: Some(3),
        };
        let sizes = Sizes {
            n: 1000,
            d: 20,
            l: 1,
            dense: true,
            memory: 4 << 30,
            svd_seconds: f64::INFINITY,
        };
        let set = |t: &str| parse_setting(t).unwrap();
        let overridden = overrides(&[set("batch=200"), set("ard=subspace"), set("freeze-hyper")]);
        let list = with_settings(candidates(LabelKind::Binary, sizes), &overridden.unwrap());
        let mut acc = BinaryAccumulator::new();
        acc.add_row(0.9, true).unwrap();
        let chosen = Scored {
            candidate: list[0].clone(),
            step_seconds: 0.01,
            planned: 900,
            steps: 700,
            seconds: 1.0,
            metrics: Evaluation::Binary(acc.finish()),
            run: 1,
            every: 0,
            converged: true,
            open: false,
            svd_seconds: 0.0,
            scoring_seconds: 0.0,
        };
        let model = FinalModel {
            inputs: &inputs,
            name: "toy",
            kind: LabelKind::Binary,
            seed: 7,
            split: Split::Test,
        };
        let path = dir.path().join("toy-fit.toml");
        write_spec(&path, &model, &chosen, false).unwrap();
        let spec = Spec::read(&path).unwrap();
        let Command::Ingest(ingest) = spec.command(SpecStage::Ingest, &[]).unwrap() else {
            unreachable!()
        };
        assert_eq!(
            ingest.config().unwrap().params_json().unwrap(),
            inputs.config("toy", None).unwrap().params_json().unwrap()
        );
        let Command::Svd(svd) = spec
            .command(SpecStage::Svd, &[("dataset", "toy".into())])
            .unwrap()
        else {
            unreachable!()
        };
        let svd_run = crate::svd::SvdOptions {
            dataset: "toy".into(),
            seed: 7,
            ..chosen.candidate.svd.clone()
        };
        assert_eq!(svd.options(), svd_run);
        let linked = [("dataset", "toy".to_string()), ("svd", "3".to_string())];
        let Command::Train(t) = spec.command(SpecStage::Train, &linked).unwrap() else {
            unreachable!()
        };
        let mut typed = model.train_options(&chosen);
        (typed.dataset, typed.svd) = (Some("toy".into()), Some(3));
        typed.given.extend([TrainFlag::Dataset, TrainFlag::Svd]);
        assert_eq!(t.options(), typed);
        assert_eq!((typed.batch, typed.steps, typed.seed), (200, Some(700), 7));
        let Command::Predict(p) = spec
            .command(SpecStage::Predict, &[("run", "9".into())])
            .unwrap()
        else {
            unreachable!()
        };
        assert_eq!(
            p.options(),
            predict_options(LabelKind::Binary, 9, Split::Test)
        );
    }
}
