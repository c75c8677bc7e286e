//! A fit: the rule's steps in order, the final spec and the final model's runs.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};

use super::budget::{self, candidate_outcome};
use super::folds;
use super::inputs::{InputFormat, Inputs};
use super::names::{self, ReservedSpec};
use super::observe::{FinalStage, FitEvent, FitObserver};
use super::options::spec_pairs;
use super::outcome::{Figures, FinalRun, FitOutcome, ModelFile};
use super::plan::Plan;
use super::request::FitRequest;
use super::rule::*;
use super::sizes;
use crate::export::ExportOptions;
use crate::store::catalog::{LabelKind, Split};
use crate::store::user_file::{check_file_output, refuse_same_file, UserFile};
use crate::store::workspace::Workspace;
use crate::svd::SvdOptions;
use crate::train::{TrainFlag, TrainOptions};

/// Runs the fit `args` asks for in `ws`, telling `observer` each step; returns what it did.
/// The stages it runs print their own progress on standard error.
pub fn run(
    ws: &Workspace,
    args: &FitRequest,
    observer: &mut dyn FitObserver,
) -> Result<FitOutcome> {
    let started = Instant::now();
    args.check()?;
    let budget = args.budget_seconds;
    let format = match (args.format, &args.rows) {
        (Some(f), _) => f,
        // Rows in memory are LIBSVM's rows without the text.
        (None, Some(_)) => InputFormat::Libsvm,
        (None, None) => sniff_format(&args.train)?,
    };
    let inputs = Inputs {
        train: args.train.clone(),
        test: args.test.clone(),
        format,
        features: args.features,
        rows: args.rows.clone(),
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
    observer.event(FitEvent::Ingesting {
        train: &args.train,
        dataset: &select,
    });
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
    let list = with_settings(candidates(kind, sizes), &args.overrides);
    // The final model ingests the whole file again: that time, as this ingest measured it,
    // is set aside before the selection's share is taken.
    let ingest_seconds = started.elapsed().as_secs_f64();
    let left = (budget - 2.0 * ingest_seconds).max(0.0);
    let batch = batch_of(&list);
    let cap = step_cap(sizes.n, batch);
    // Ten epochs of steps, or the cap when that is fewer (small data).
    let needed = (MIN_EPOCHS * sizes.n.div_ceil(batch)).min(cap);
    observer.event(FitEvent::Planned {
        task: kind,
        rows: sizes.n,
        features: sizes.d,
        labels: sizes.l,
        dense: sizes.dense,
        candidates: list.len(),
        budget_seconds: budget,
        left_seconds: left,
    });
    let ranking = kind == LabelKind::Multilabel;
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
        observer,
    )?;
    let folds = match &folded {
        Some(_) => folds::fold_count(args.validation_fraction),
        None => 1,
    };
    let (rows, floor) = match folded {
        Some(folded) => folded,
        None => {
            let spent = || started.elapsed().as_secs_f64();
            let mut selection = budget::select(ws, list, &plan, &spent, ingest_seconds, observer)?;
            if !plan.fixed {
                budget::train_on(
                    ws,
                    &mut selection.rows,
                    &plan,
                    &spent,
                    ingest_seconds,
                    observer,
                )?;
                budget::run_dropped(ws, &mut selection, &plan, &spent, ingest_seconds, observer)?;
            }
            let rows = selection.rows;
            let floor = frequency_floor(ws, &dataset, kind)?;
            let candidates: Vec<_> = rows.iter().map(|r| candidate_outcome(r, ranking)).collect();
            observer.event(FitEvent::Table {
                candidates: &candidates,
                baseline: &Figures::of_key(floor, ranking),
            });
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
        observer.event(FitEvent::NoBetterThanBaseline);
    }
    observer.event(FitEvent::Chosen {
        name: &chosen.candidate.name,
        steps: chosen.final_steps(),
    });
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
    let final_runs = final_model.run(ws, chosen, &spec_path, observer)?;
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
        let file = ModelFile {
            path: exported.path.clone(),
            train_run: first.train_run,
            checkpoint_step: exported.checkpoint_step,
        };
        observer.event(FitEvent::ModelWritten(&file));
        model = Some(file);
    }
    let seconds = started.elapsed().as_secs_f64();
    observer.event(FitEvent::Done {
        seconds,
        budget_seconds: budget,
        spec: &spec_path,
    });
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
        final_steps: chosen.final_steps(),
        final_runs,
        evaluated_split: if args.test.is_some() { "test" } else { "train" },
        spec: spec_path,
        model,
    })
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
    // Rows in memory are no file an output could overwrite.
    let mut inputs = Vec::new();
    if args.rows.is_none() {
        inputs.push(("--train", args.train.as_path()));
    }
    inputs.extend(args.test.as_deref().map(|t| ("--test", t)));
    refuse_same_file(&outputs, &inputs)
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
            steps: Some(chosen.final_steps()),
            given: [TrainFlag::Task, TrainFlag::Steps].into(),
            ..TrainOptions::default()
        };
        super::options::apply_given(&mut options, &run_options(&chosen.candidate, self.seed));
        options
    }

    /// Runs the final model as `pipeline run` runs its spec (at `spec`, named in errors):
    /// ingest, the chosen candidate's svd, train, predict and evaluate; tells `observer`
    /// each stage.
    fn run(
        &self,
        ws: &Workspace,
        chosen: &Scored,
        spec: &Path,
        observer: &mut dyn FitObserver,
    ) -> Result<Vec<FinalRun>> {
        let mut stages: Vec<FinalStage> = Vec::new();
        let mut timed =
            |stage: &str, f: &mut dyn FnMut() -> Result<(Option<i64>, bool)>| -> Result<()> {
                observer.event(FitEvent::FinalStageStarted { stage });
                let started = Instant::now();
                let (run, cached) =
                    f().with_context(|| format!("stage {stage} of {}", spec.display()))?;
                stages.push(FinalStage {
                    stage: stage.to_string(),
                    run,
                    cached,
                    seconds: started.elapsed().as_secs_f64(),
                });
                Ok(())
            };
        timed("ingest", &mut || {
            let out = crate::ingest::run(ws, &self.inputs.config(self.name, None)?)?;
            Ok((out.run_id, !out.ingested))
        })?;
        let mut svd_run = 0;
        timed("svd", &mut || {
            let options = SvdOptions {
                dataset: self.name.to_string(),
                seed: self.seed,
                ..chosen.candidate.svd.clone()
            };
            let out = crate::svd::run(ws, &options)?;
            svd_run = out.run_id;
            Ok((Some(out.run_id), !out.computed))
        })?;
        let mut train_run = 0;
        timed("train", &mut || {
            let mut options = self.train_options(chosen);
            (options.dataset, options.svd) = (Some(self.name.to_string()), Some(svd_run));
            options.given.extend([TrainFlag::Dataset, TrainFlag::Svd]);
            let out = crate::train::run(ws, &options)?;
            train_run = out.run_id;
            Ok((Some(out.run_id), !out.computed))
        })?;
        let mut predictions = String::new();
        timed("predict", &mut || {
            let options = predict_options(self.kind, train_run, self.split);
            let out = crate::predict::run(ws, &options)?;
            predictions = out.value.path.clone();
            Ok((Some(out.run_id), !out.computed))
        })?;
        let mut evaluated = None;
        timed("evaluate", &mut || {
            let options = evaluate_options(self.kind, predictions.clone());
            let out = crate::evaluate::run(ws, &options)?;
            evaluated = Some((out.run_id, out.value));
            Ok((Some(out.run_id), !out.computed))
        })?;
        observer.event(FitEvent::FinalStages(&stages));
        let (evaluate_run, metrics) = evaluated.expect("evaluate ran");
        Ok(vec![FinalRun {
            seed: self.seed,
            train_run,
            evaluate_run,
            metrics,
        }])
    }
}

/// Writes the spec of the final model: the whole training file, the winner's options and
/// steps, predictions of the test split (when there is one) and their evaluation.
fn write_spec(path: &Path, model: &FinalModel, chosen: &Scored, replace: bool) -> Result<()> {
    let mut text = String::new();
    text += &match chosen.final_steps {
        None => format!(
            "# Written by `pipeline fit` (docs/fit.md): the candidate chosen on validation, {},\n\
             # trained on every training row for the {} steps its selection run took (of {}\n\
             # planned).\n\n",
            chosen.candidate.name, chosen.steps, chosen.planned
        ),
        Some(steps) => format!(
            "# Written by `pipeline fit` (docs/fit.md): the one candidate the budget kept, {},\n\
             # scored on validation after its {}-step probe, with no selection run; trained on\n\
             # every training row for the {} steps the time left afforded.\n\n",
            chosen.candidate.name, chosen.steps, steps
        ),
    };
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
    // The runner links the train run in: the table holds the rest.
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
    // `pipeline run`'s spec reader (the command line's), to check the spec asks for what
    // fit ran.
    use crate::cli::args::Command;
    use crate::cli::spec::{Spec, SpecStage};
    use crate::metrics::binary::BinaryAccumulator;
    use crate::metrics::evaluation::Evaluation;

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
            rows: None,
        };
        let sizes = Sizes::unbounded(1000, 20, 1, true);
        let overridden = TrainOptions {
            batch: 200,
            ard: crate::trained::ArdChoice::BasisDirections,
            freeze_hyper: true,
            given: [TrainFlag::Batch, TrainFlag::Ard, TrainFlag::FreezeHyper].into(),
            ..TrainOptions::default()
        };
        let list = with_settings(candidates(LabelKind::Binary, sizes), &overridden);
        let mut acc = BinaryAccumulator::new();
        acc.add_row(0.9, true).unwrap();
        let chosen = Scored {
            candidate: list[0].clone(),
            step_seconds: 0.01,
            planned: 900,
            steps: 700,
            final_steps: None,
            seconds: 1.0,
            metrics: Evaluation::Binary(acc.finish()),
            run: 1,
            every: 0,
            converged: true,
            open: false,
            svd_seconds: 0.0,
            scoring_seconds: 0.0,
            run_seconds: 0.0,
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
