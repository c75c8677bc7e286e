//! A fit: the rule's steps in order, the final spec and the final model's runs.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};

use super::budget::{self, candidate_outcome, Row};
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
use crate::ingest::validation::ValidationSplit;
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
        nnz: dataset.split(Split::Train).map_or(0, |s| s.nnz),
        dense: dataset
            .split(Split::Train)
            .is_some_and(|s| 2 * s.nnz >= s.n_rows.saturating_mul(dataset.n_features).max(1)),
        memory: sizes::svd_memory()?,
        svd_seconds: sizes::svd_seconds(budget),
    };
    let list = with_settings(candidates(kind, sizes), &args.overrides);
    anyhow::ensure!(
        !list.is_empty(),
        "the options set for every candidate leave none of this task's candidates: inducing \
         inputs at the axes take only the linear kernel, M = D and their own q(u) form, and \
         no other candidate is at the axes (docs/fit.md, \"Fixing options\")"
    );
    // The final model ingests the whole file again: that time, as this ingest measured it,
    // is set aside before the selection's share is taken.
    let ingest_seconds = started.elapsed().as_secs_f64();
    let left = (budget - 2.0 * ingest_seconds).max(0.0);
    let batch = batch_of(&list);
    let cap = step_cap(sizes.n, batch);
    let floor = selection_floor(kind, sizes.l);
    let needed = super::plan::needed_steps(sizes.n, batch, cap, floor);
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
        floor,
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
    let spent = || started.elapsed().as_secs_f64();
    let (rows, floor) = match folded {
        Some(folded) => folded,
        None => {
            let at = budget::Spending {
                ws,
                plan: &plan,
                spent: &spent,
                ingest_seconds,
            };
            let mut selection = budget::select(&at, list, observer)?;
            let lone = budget::lone_takes_the_time_left(&at, &mut selection.rows, observer);
            if !plan.fixed && !lone {
                budget::spend_the_time_left(&at, &mut selection, observer)?;
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
    // The rule chooses among the scored rows whose final models fit; `chosen_row` is its
    // index among all rows.
    let now = spent();
    let Some((chosen_row, passed_over)) = budget::choice(&rows, &plan, now, ingest_seconds) else {
        anyhow::bail!("every candidate failed (the table above says why); nothing was chosen")
    };
    if let Some(Row::Scored(best)) = passed_over.map(|i| &rows[i]) {
        observer.event(FitEvent::PassedOver {
            name: &best.candidate.name,
            final_seconds: budget::final_seconds_of(best, ingest_seconds),
            left_seconds: plan.plannable() - now,
        });
    }
    let Row::Scored(chosen) = &rows[chosen_row] else {
        unreachable!("the choice is a scored row")
    };
    if chosen.key().0 <= floor.0 {
        observer.event(FitEvent::NoBetterThanBaseline);
    }
    observer.event(FitEvent::Chosen {
        name: &chosen.candidate.name,
        steps: chosen.final_steps(),
        probe: chosen.final_is_probe,
    });
    // The reserved spec is fit's own empty file: written over without --force.
    let replace = args.force || reserved.is_some();
    let split = match args.test {
        Some(_) => Split::Test,
        None => Split::Train,
    };
    // The probe that is the final model (fixed costs past the budget) is scored where it
    // was trained: the selection data, its carve, its steps.
    let (final_name, carve) = match chosen.final_is_probe {
        true => (select.as_str(), Some(names::select_carve(fraction, seed))),
        false => (name.as_str(), None),
    };
    let final_model = FinalModel {
        inputs: &inputs,
        name: final_name,
        carve,
        kind,
        seed,
        split,
        time_left: (!plan.fixed && !chosen.final_is_probe).then_some(TimeLeft {
            plan: &plan,
            spent: &spent,
            validation_rows: dataset.split(Split::Validation).map_or(0, |s| s.n_rows),
        }),
    };
    let spec_text = write_spec(
        &spec_path,
        &final_model,
        chosen,
        chosen.final_steps(),
        replace,
    )?;
    if let Some(r) = &mut reserved {
        r.keep();
    }
    let final_runs = final_model.run(ws, chosen, (&spec_path, &spec_text), observer)?;
    let final_steps = final_runs.first().map_or(chosen.final_steps(), |r| r.steps);
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
        final_steps,
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
    /// The validation carve of its ingest: the selection data's when the probe is the
    /// final model, none otherwise (every training row trains).
    carve: Option<ValidationSplit>,
    kind: LabelKind,
    seed: u64,
    split: Split,
    /// The fit's clock and plan, by which a final model trained for the time left goes on
    /// (none with fixed steps).
    time_left: Option<TimeLeft<'a>>,
}

/// What a final model trained for the time left (a candidate without a selection run) goes
/// on by when its steps ran faster than its probe's: the fit's plan and clock.
struct TimeLeft<'a> {
    plan: &'a Plan,
    /// Seconds since the fit started.
    spent: &'a dyn Fn() -> f64,
    /// Rows of the selection data's validation split, whose scoring the candidate's
    /// scoring seconds measured.
    validation_rows: u64,
}

impl FinalModel<'_> {
    /// The chosen candidate's train options for its final run of `steps` steps (its svd run
    /// is linked in). A final model trained for the time left is a run of the time left's
    /// ceiling ([`Plan::time_left_ceiling`]) cut by `--max-steps` at `steps`, which train
    /// can take on ([`FinalModel::go_on`]). Its `--steps` is never where it is cut (short
    /// of the ceiling): a run that reaches its `--steps` has finished and cannot resume.
    fn train_options(&self, chosen: &Scored, steps: u64) -> TrainOptions {
        let mut options = TrainOptions {
            task: self.kind,
            steps: Some(steps),
            given: [TrainFlag::Task, TrainFlag::Steps].into(),
            ..TrainOptions::default()
        };
        if let Some(t) = self.time_left(chosen) {
            options.steps = Some(t.plan.time_left_ceiling().max(steps));
            options.max_steps = Some(steps);
            options.given.insert(TrainFlag::MaxSteps);
        }
        super::options::apply_given(&mut options, &run_options(&chosen.candidate, self.seed));
        options
    }

    /// The fit's clock and plan when `chosen`'s final model trains for the time left.
    fn time_left(&self, chosen: &Scored) -> Option<&TimeLeft<'_>> {
        self.time_left
            .as_ref()
            .filter(|_| chosen.final_steps.is_some())
    }

    /// Trains final run `run` of `chosen` on from `steps` while the budget's plannable
    /// seconds still afford an epoch of steps or more at the run's own rate so far, after
    /// its scoring (the validation's, scaled to the rows of the final split) and a
    /// resume's setup: the steps it trained in all. Each extension is priced with the
    /// final step's margin, and the clock is read again after it, so the time the margin
    /// keeps back goes to the next one when the steps did not need it.
    fn go_on(
        &self,
        ws: &Workspace,
        chosen: &Scored,
        run: i64,
        steps: u64,
        observer: &mut dyn FitObserver,
    ) -> Result<u64> {
        let Some(t) = self.time_left(chosen) else {
            return Ok(steps);
        };
        let rows = ws
            .dataset_named(self.name)?
            .split(self.split)
            .map_or(0, |s| s.n_rows);
        let scoring = chosen.scoring_seconds * rows as f64 / t.validation_rows.max(1) as f64;
        let mut steps = steps;
        for extension in 1.. {
            let Some(measured) = probe_step_seconds(ws, run, steps)? else {
                return Ok(steps);
            };
            let step_seconds = budget::final_run_step_seconds(measured);
            let spare = t.plan.plannable() - (t.spent)() - scoring - chosen.run_seconds;
            let room = t.plan.time_left_ceiling().saturating_sub(steps);
            let more = budget::final_extension_steps(spare, step_seconds, room, t.plan.epoch_steps);
            if more == 0 {
                return Ok(steps);
            }
            let more = budget::extension_taken(more, extension);
            observer.event(FitEvent::FinalGoesOn {
                spare_seconds: spare,
                step_ms: 1e3 * step_seconds,
                probe_ms: 1e3 * chosen.step_seconds,
                more,
                from: steps,
            });
            let options = TrainOptions {
                resume: Some(run),
                max_steps: Some(steps + more),
                given: [TrainFlag::Resume, TrainFlag::MaxSteps].into(),
                ..TrainOptions::default()
            };
            crate::train::run(ws, &options)?;
            steps += more;
        }
        Ok(steps)
    }

    /// Runs the final model as `pipeline run` runs its spec (at `spec`, named in errors):
    /// ingest, the chosen candidate's svd, train, predict and evaluate; tells `observer`
    /// each stage.
    fn run(
        &self,
        ws: &Workspace,
        chosen: &Scored,
        (spec, spec_text): (&Path, &str),
        observer: &mut dyn FitObserver,
    ) -> Result<Vec<FinalRun>> {
        let mut stages: Vec<FinalStage> = Vec::new();
        // Each stage's closure is handed the observer, which the train stage tells when
        // the final model goes on.
        type Stage<'o> = dyn FnMut(&mut dyn FitObserver) -> Result<(Option<i64>, bool)> + 'o;
        let mut timed =
            |observer: &mut dyn FitObserver, stage: &str, f: &mut Stage<'_>| -> Result<()> {
                observer.event(FitEvent::FinalStageStarted { stage });
                let started = Instant::now();
                let (run, cached) =
                    f(observer).with_context(|| format!("stage {stage} of {}", spec.display()))?;
                stages.push(FinalStage {
                    stage: stage.to_string(),
                    run,
                    cached,
                    seconds: started.elapsed().as_secs_f64(),
                });
                Ok(())
            };
        timed(observer, "ingest", &mut |_| {
            let out = crate::ingest::run(ws, &self.inputs.config(self.name, self.carve)?)?;
            Ok((out.run_id, !out.ingested))
        })?;
        let mut svd_run = 0;
        timed(observer, "svd", &mut |_| {
            let options = SvdOptions {
                dataset: self.name.to_string(),
                seed: self.seed,
                ..chosen.candidate.svd.clone()
            };
            let out = crate::svd::run(ws, &options)?;
            svd_run = out.run_id;
            Ok((Some(out.run_id), !out.computed))
        })?;
        let (mut train_run, mut steps) = (0, chosen.final_steps());
        timed(observer, "train", &mut |observer| {
            // A final model trained for the time left trains its first leg, then the rest
            // at the rate its own steps ran (`go_on`).
            let leg = match self.time_left(chosen) {
                Some(t) => budget::first_leg(steps, t.plan.epoch_steps),
                None => steps,
            };
            let mut options = self.train_options(chosen, leg);
            (options.dataset, options.svd) = (Some(self.name.to_string()), Some(svd_run));
            options.given.extend([TrainFlag::Dataset, TrainFlag::Svd]);
            let out = crate::train::run(ws, &options)?;
            train_run = out.run_id;
            let trained = self.go_on(ws, chosen, train_run, leg, observer)?;
            if trained < steps {
                observer.event(FitEvent::FinalEndsShort {
                    steps: trained,
                    planned: steps,
                });
            }
            let cached = !out.computed && trained == leg;
            steps = trained;
            Ok((Some(out.run_id), cached))
        })?;
        if steps != chosen.final_steps()
            && !rewrite_spec(spec, spec_text, &write_spec_text(self, chosen, steps))?
        {
            observer.event(FitEvent::SpecKept { spec, steps });
        }
        let mut predictions = String::new();
        timed(observer, "predict", &mut |_| {
            let options = predict_options(self.kind, train_run, self.split);
            let out = crate::predict::run(ws, &options)?;
            predictions = out.value.path.clone();
            Ok((Some(out.run_id), !out.computed))
        })?;
        let mut evaluated = None;
        timed(observer, "evaluate", &mut |_| {
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
            steps,
            evaluate_run,
            metrics,
        }])
    }
}

/// Writes the spec of the final model of `steps` steps ([`write_spec_text`]) at `path`;
/// returns the text written.
fn write_spec(
    path: &Path,
    model: &FinalModel,
    chosen: &Scored,
    steps: u64,
    replace: bool,
) -> Result<String> {
    let text = write_spec_text(model, chosen, steps);
    publish_spec(path, &text, replace)?;
    Ok(text)
}

/// Writes `text` at `path` through a temporary file, replacing a file there only when
/// `replace`.
fn publish_spec(path: &Path, text: &str, replace: bool) -> Result<()> {
    let file = UserFile::temporary(path, replace)?;
    std::fs::File::create(file.tmp_path())
        .and_then(|mut f| f.write_all(text.as_bytes()).and_then(|()| f.sync_all()))
        .with_context(|| format!("{}: cannot write the spec", path.display()))?;
    file.publish()
}

/// Replaces the spec fit wrote at `path` (`written`) with `text`, once its final model
/// trained on: only while the file still holds what fit wrote. A file someone changed
/// since is theirs and is kept as it is: false.
fn rewrite_spec(path: &Path, written: &str, text: &str) -> Result<bool> {
    match std::fs::read_to_string(path) {
        Ok(now) if now == written => publish_spec(path, text, true).map(|()| true),
        _ => Ok(false),
    }
}

/// The spec of the final model of `steps` steps: the whole training file, the winner's
/// options and steps, predictions of the test split (when there is one) and their
/// evaluation.
fn write_spec_text(model: &FinalModel, chosen: &Scored, steps: u64) -> String {
    let mut text = String::new();
    text += &match chosen.final_steps {
        Some(_) if chosen.final_is_probe => format!(
            "# Written by `pipeline fit` (docs/fit.md): the one candidate the budget kept, {},\n\
             # scored on validation after its {}-step probe; training it again on every row did\n\
             # not fit the budget, so the probe's run, on the training rows of the selection\n\
             # carve below, is the final model.\n\n",
            chosen.candidate.name, chosen.steps
        ),
        None => format!(
            "# Written by `pipeline fit` (docs/fit.md): the candidate chosen on validation, {},\n\
             # trained on every training row for the {} steps its selection run took (of {}\n\
             # planned).\n\n",
            chosen.candidate.name, chosen.steps, chosen.planned
        ),
        Some(_) if chosen.every == 0 => format!(
            "# Written by `pipeline fit` (docs/fit.md): the one candidate the budget kept, {},\n\
             # scored on validation after its {}-step probe, with no selection run; trained on\n\
             # every training row for the {} steps the time left afforded.\n\n",
            chosen.candidate.name, chosen.steps, steps
        ),
        Some(_) => format!(
            "# Written by `pipeline fit` (docs/fit.md): the one candidate the budget kept, {},\n\
             # whose selection run had not converged after {} steps; trained on every training\n\
             # row for the {} steps the time left afforded.\n\n",
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
    text += &table("ingest", &model.inputs.spec_pairs(model.name, model.carve));
    let mut svd = vec![("seed", model.seed.to_string())];
    svd.extend(chosen.candidate.svd_pairs());
    text += &table("svd", &svd);
    text += &table("train", &spec_pairs(&model.train_options(chosen, steps)));
    // The runner links the train run in: the table holds the rest.
    let predict = predict_options(model.kind, 0, model.split);
    text += &table("predict", &predict_pairs(&predict));
    text += &table("evaluate", &[("task", model.kind.as_str().to_string())]);
    text
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
            plateau: None,
            open: false,
            restart: None,
            unreserved: false,
            final_is_probe: false,
            svd_seconds: 0.0,
            scoring_seconds: 0.0,
            run_seconds: 0.0,
        };
        let plan = Plan {
            dataset: "toy-select".into(),
            kind: LabelKind::Binary,
            seed: 7,
            budget: 60.0,
            left: 60.0,
            cap: 3_000,
            needed: 40,
            floor: 0,
            epoch_steps: 2,
            fixed: false,
        };
        let spent = || 0.0;
        let model = FinalModel {
            inputs: &inputs,
            name: "toy",
            carve: None,
            kind: LabelKind::Binary,
            seed: 7,
            split: Split::Test,
            time_left: Some(TimeLeft {
                plan: &plan,
                spent: &spent,
                validation_rows: 200,
            }),
        };
        let path = dir.path().join("toy-fit.toml");
        write_spec(&path, &model, &chosen, chosen.final_steps(), false).unwrap();
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
        let train_of = |path: &Path| {
            let spec = Spec::read(path).unwrap();
            let Command::Train(t) = spec.command(SpecStage::Train, &linked).unwrap() else {
                unreachable!()
            };
            t.options()
        };
        let typed_of = |chosen: &Scored, steps: u64| {
            let mut typed = model.train_options(chosen, steps);
            (typed.dataset, typed.svd) = (Some("toy".into()), Some(3));
            typed.given.extend([TrainFlag::Dataset, TrainFlag::Svd]);
            typed
        };
        let typed = typed_of(&chosen, 700);
        assert_eq!(train_of(&path), typed);
        assert_eq!(
            (typed.batch, typed.steps, typed.max_steps, typed.seed),
            (200, Some(700), None, 7)
        );
        // Without a selection run, the final model is a run of the time left's ceiling
        // (four caps) cut at its steps, which goes on when the time left affords more; its
        // spec, rewritten, says where it ended.
        let lone = Scored {
            final_steps: Some(1_100),
            ..chosen
        };
        let first = write_spec(&path, &model, &lone, 1_100, true).unwrap();
        let typed = typed_of(&lone, 1_100);
        assert_eq!(train_of(&path), typed);
        assert_eq!((typed.steps, typed.max_steps), (Some(12_000), Some(1_100)));
        // Past the cap too, `--max-steps` cuts it, so that it can go on: a first leg of
        // 9 000 steps that was a run of 9 000 had finished, and its resume was refused.
        let past = typed_of(&lone, 9_000);
        assert_eq!((past.steps, past.max_steps), (Some(12_000), Some(9_000)));
        assert!(rewrite_spec(&path, &first, &write_spec_text(&model, &lone, 1_500)).unwrap());
        assert_eq!(train_of(&path), typed_of(&lone, 1_500));
        // A spec changed since fit wrote it is left as it is.
        std::fs::write(&path, "# the user's\n").unwrap();
        assert!(!rewrite_spec(&path, &first, &write_spec_text(&model, &lone, 1_900)).unwrap());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "# the user's\n");
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
