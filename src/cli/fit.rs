//! `pipeline fit`: its arguments as a [`FitRequest`], the fit's events printed as its
//! progress lines and tables on standard error, and its outcome on standard output (the
//! final model's metrics, or with `--json` the whole [`FitOutcome`]).

use anyhow::{Context, Result};
use clap::Parser;

use super::args::{Cli, Command, FitArgs, Setting};
use crate::fit::{
    CandidateOutcome, CandidateResult, Figures, FitEvent, FitObserver, FitOutcome, FitRequest,
    FoldTable, InputFormat, Weight,
};
use crate::store::workspace::Workspace;
use crate::train::{TrainFlag, TrainOptions};

/// Runs `pipeline fit` and prints the final model's metrics (`--json`: the whole
/// [`FitOutcome`]) on standard output.
pub fn run_command(ws: &Workspace, args: &FitArgs) -> Result<()> {
    let outcome = crate::fit::run(ws, &request(args)?, &mut Printer)?;
    if args.json {
        println!("{}", json(&outcome));
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

/// `--json`'s text of an outcome.
fn json(outcome: &FitOutcome) -> String {
    serde_json::to_string_pretty(outcome).expect("a fit outcome is JSON")
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
        rows: None,
    })
}

/// The train options `--set` gives, typed by train's own command line (which refuses a
/// value train would refuse, before anything runs); `given` names them.
pub fn overrides(sets: &[Setting]) -> Result<TrainOptions> {
    let mut argv = vec!["pipeline".to_string(), "train".into()];
    // The parser asks for a dataset; each of fit's runs names its own.
    argv.extend(["--dataset".to_string(), "-".into()]);
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
    options.dataset = None;
    options.given.remove(&TrainFlag::Dataset);
    Ok(options)
}

/// A line of fit's progress, through the progress sink the command line installed: printed
/// as it is in text, a note event in JSON lines, dropped by `--quiet` (fit's tables and
/// metrics, the results, are printed whatever the format).
macro_rules! say {
    ($($arg:tt)*) => {
        crate::progress::note(format!($($arg)*))
    };
}

/// Prints a fit's events as `pipeline fit`'s progress (its tables on standard error): the
/// events' own lines ([`FitEvent::describe`]) as progress, warnings or results, and the
/// tables from their values.
struct Printer;

impl FitObserver for Printer {
    fn event(&mut self, event: FitEvent<'_>) {
        match &event {
            // The table shows each candidate once all are done.
            FitEvent::CandidateDone(_) => return,
            FitEvent::FoldTable(table) => return print_fold_table(table),
            FitEvent::Table {
                candidates,
                baseline,
            } => return print_table(candidates, baseline),
            // A stage's header, as the stage run alone prints it.
            FitEvent::FinalStageStarted { stage } => return say!("== {stage}"),
            FitEvent::FinalStages(stages) => return super::spec::print_stages(stages),
            _ => {}
        }
        let Some((weight, line)) = event.describe() else {
            return;
        };
        match weight {
            Weight::Progress => say!("== fit: {line}"),
            Weight::Warning => crate::progress::warning(line),
            // Results, printed whatever the format.
            Weight::Result => eprintln!("== fit: {line}"),
        }
    }
}

/// The width of a table's name column: the longest of `names`, and at least 44, so that
/// the figures stay in their columns when a name is long (a `--set`, the axes' weak prior).
fn name_width<'a>(names: impl Iterator<Item = &'a str>) -> usize {
    names.map(|n| n.chars().count()).max().unwrap_or(0).max(44)
}

/// The validation table: one line per candidate (a failed one with its reason), and the
/// label frequencies' line (`baseline`: its two figures as the outcome gives them, NLP
/// positive). `converged`: early stopping ended the run (its score stopped improving), not
/// its planned steps or the cap.
fn print_table(candidates: &[CandidateOutcome], baseline: &Figures) {
    let width = name_width(candidates.iter().map(|c| c.name.as_str()));
    eprintln!();
    eprintln!(
        "{:<width$} {:>8} {:>7} {:>7} {:>8} {:>9} {:>10} {:>10}",
        "candidate (validation)",
        "ms/step",
        "planned",
        "trained",
        "seconds",
        "converged",
        "primary",
        "second"
    );
    // The task's figures, from the baseline: every candidate may have failed.
    let ranking = baseline.primary.name == "P@1";
    let shown = |(a, b): (f64, f64)| match ranking {
        true => (
            format!("P@1 {:.2}", 100.0 * a),
            format!("P@3 {:.2}", 100.0 * b),
        ),
        false => (format!("acc {:.2}", 100.0 * a), format!("nlp {b:.4}")),
    };
    for c in candidates {
        let CandidateResult::Scored {
            step_ms,
            planned_steps,
            trained_steps,
            seconds,
            converged,
            validation,
            ..
        } = &c.result
        else {
            if let CandidateResult::Failed { reason } = &c.result {
                eprintln!("{:<width$} failed: {reason}", c.name);
            }
            continue;
        };
        let (pa, pb) = shown((validation.primary.value, validation.secondary.value));
        eprintln!(
            "{:<width$} {:>8.1} {:>7} {:>7} {:>8.1} {:>9} {:>10} {:>10}",
            c.name,
            step_ms,
            planned_steps,
            trained_steps,
            seconds,
            if *converged { "yes" } else { "no" },
            pa,
            pb
        );
    }
    let (fa, fb) = shown((baseline.primary.value, baseline.secondary.value));
    eprintln!(
        "{:<width$} {:>8} {:>7} {:>7} {:>8} {:>9} {:>10} {:>10}",
        "(label frequencies, no model)", "", "", "", "", "", fa, fb
    );
    eprintln!();
}

/// The fold table: per candidate the mean and standard deviation over the folds of the
/// rule's two figures, the steps its runs trained, and the label frequencies' line.
fn print_fold_table(table: &FoldTable) {
    let ranking = table.ranking;
    let (first, second) = match ranking {
        true => ("P@1", "P@3"),
        false => ("acc", "nlp"),
    };
    // Accuracy and P@ in points; NLP as it is, positive (the table's keys hold −NLP).
    let shown = |v: f64, primary: bool| match (ranking, primary) {
        (false, false) => format!("{:.4}", -v),
        _ => format!("{:.2}", 100.0 * v),
    };
    let width = name_width(table.rows.iter().map(|r| r.name.as_str()));
    let scale = |primary: bool| if !ranking && !primary { 1.0 } else { 100.0 };
    eprintln!();
    eprintln!(
        "{:<width$} {:>8} {:>13} {:>8} {:>15} {:>15}",
        format!("candidate (mean ± sd of {} folds)", table.folds),
        "ms/step",
        "trained",
        "seconds",
        first,
        second
    );
    for row in &table.rows {
        let steps: Vec<String> = row.steps.iter().map(u64::to_string).collect();
        eprintln!(
            "{:<width$} {:>8.1} {:>13} {:>8.1} {:>15} {:>15}",
            row.name,
            row.step_ms,
            format!("median {}", row.median_steps),
            row.seconds,
            format!(
                "{} ± {:.2}",
                shown(row.primary.0, true),
                scale(true) * row.primary.1
            ),
            format!(
                "{} ± {:.4}",
                shown(row.secondary.0, false),
                scale(false) * row.secondary.1
            ),
        );
        eprintln!("{:<width$} steps by fold: {}", "", steps.join(", "));
    }
    eprintln!(
        "{:<width$} {:>8} {:>13} {:>8} {:>15} {:>15}",
        "(label frequencies, no model)",
        "",
        "",
        "",
        shown(table.baseline.0, true),
        shown(table.baseline.1, false)
    );
    eprintln!(
        "(chosen by the mean: the highest {first}{})",
        match ranking {
            true => String::new(),
            false => format!(
                ", and within {} points of it the lowest NLP",
                crate::fit::ACCURACY_TIE
            ),
        }
    );
    eprintln!();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::args::{parse_budget, parse_setting};

    #[test]
    fn budgets_parse_with_units() {
        assert_eq!(parse_budget("90s"), Ok(90.0));
        assert_eq!(parse_budget("5m"), Ok(300.0));
        assert_eq!(parse_budget("1.5h"), Ok(5400.0));
        assert_eq!(parse_budget("300"), Ok(300.0));
        assert!(parse_budget("0s").unwrap_err().contains("positive"));
        assert!(parse_budget("5d").unwrap_err().contains("unknown unit 'd'"));
        assert!(parse_budget("-3m").is_err());
    }

    #[test]
    fn the_requests_defaults_are_the_command_lines() {
        let cli = Cli::try_parse_from(["pipeline", "fit", "--train", "t.svm"]).unwrap();
        let Command::Fit(args) = cli.command else {
            unreachable!("a fit command line")
        };
        assert_eq!(request(&args).unwrap(), FitRequest::new("t.svm"));
    }

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
}
