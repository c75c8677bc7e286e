//! `pipeline run SPEC.toml`: a whole run, text files to metrics, from one TOML file.
//!
//! Each table of the spec holds one stage's options under the names of its command-line
//! flags (`top_k = 5` is `--top-k 5`, `freeze_a = true` is `--freeze-a`), so a spec means
//! exactly what the same flags mean on the command line and is checked by the same parser:
//!
//! ```toml
//! [synth]      # optional: generate the input files first
//! [ingest]     # required: name and input files (paths relative to the spec file)
//! [svd]        # optional: R and M from the data when absent (`pipeline svd`'s defaults)
//! [train]      # required
//! [predict]    # required
//! [evaluate]   # optional; default options when absent
//! ```
//!
//! The runner links the stages itself (`--dataset`, `--svd`, `--run`, `--predictions`), so
//! a spec must not set those. One key is the runner's own: `[train] seeds = [0, 1, 2]`
//! (instead of `seed`) runs train → predict → evaluate once per seed, with `--seed S`
//! linked in, and ends with each metric's mean ± sample standard deviation over the seeds
//! (`report::SeedSummary`). `[ingest] validation_fraction` carves the `validation` split
//! that `[train] eval_split` and `[predict] split` may then name. Every stage skips work whose inputs and parameters match a
//! completed catalog entry, and an interrupted training run with the same configuration is
//! resumed, so re-invoking a spec after a crash or a kill finishes the job.
//!
//! A spec is checked whole when it is read, before any stage runs: every table and key
//! (unknown keys with the closest valid one), every value's type, and the ranges each
//! stage's options `validate()` (the same checks the stage itself makes). The linked
//! options get placeholders for the check and their real values when the stage runs. All
//! problems are reported together, one line each:
//!
//! ```text
//! spec.toml: [train] unknown key 'lerning_rate' (did you mean 'lr'?)
//! spec.toml: [train] epochs: expected an integer, found a string "ten"
//! spec.toml: [svd] rank must be at least 1
//! ```

mod check;

use std::path::{Path, PathBuf};
use std::time::Instant;

use std::fmt;

use anyhow::{bail, Context, Result};
use clap::Parser;

use super::args::{Cli, Command, RunArgs, SynthArgs};
use crate::fit::FinalStage;
use crate::metrics::evaluation::Evaluation;
use crate::report::SeedSummary;
use crate::store::catalog::{MetricRow, StageKind};
use crate::store::workspace::Workspace;

/// A stage a spec may hold (its table, its subcommand). Synth is a stage of specs only: the
/// catalog records no synth run, so it is no [`StageKind`] (whose variants each have runs,
/// an output directory and a row in `status`); the others are the recorded stages, named as
/// the catalog names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecStage {
    Synth,
    Ingest,
    Svd,
    Train,
    Predict,
    Evaluate,
}

impl SpecStage {
    /// Every stage, in execution order.
    pub const ALL: [SpecStage; 6] = [
        SpecStage::Synth,
        SpecStage::Ingest,
        SpecStage::Svd,
        SpecStage::Train,
        SpecStage::Predict,
        SpecStage::Evaluate,
    ];

    /// The stage the catalog records, for all but synth.
    pub fn kind(self) -> Option<StageKind> {
        match self {
            SpecStage::Synth => None,
            SpecStage::Ingest => Some(StageKind::Ingest),
            SpecStage::Svd => Some(StageKind::Svd),
            SpecStage::Train => Some(StageKind::Train),
            SpecStage::Predict => Some(StageKind::Predict),
            SpecStage::Evaluate => Some(StageKind::Evaluate),
        }
    }

    /// The name of its table and of its subcommand.
    pub fn name(self) -> &'static str {
        self.kind().map_or("synth", StageKind::as_str)
    }

    /// The stage whose table is named `table`.
    fn of(table: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == table)
    }

    /// Whether a spec must hold its table (synth, svd and evaluate are optional: svd's
    /// options all have defaults, its R and M decided from the data).
    fn required(self) -> bool {
        !matches!(
            self,
            SpecStage::Synth | SpecStage::Svd | SpecStage::Evaluate
        )
    }
}

impl fmt::Display for SpecStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

/// Options the runner supplies itself, per stage.
fn linked_options(stage: SpecStage) -> &'static [&'static str] {
    match stage {
        SpecStage::Svd => &["dataset"],
        SpecStage::Train => &["dataset", "svd", "resume"],
        SpecStage::Predict => &["run"],
        SpecStage::Evaluate => &["run", "predictions", "json"],
        SpecStage::Synth | SpecStage::Ingest => &[],
    }
}

/// Options holding file paths, resolved against the spec's directory.
fn path_options(stage: SpecStage) -> &'static [&'static str] {
    match stage {
        SpecStage::Synth => &["out"],
        SpecStage::Ingest => &[
            "train",
            "test",
            "data",
            "train_split",
            "test_split",
            "train_features",
            "train_labels",
            "test_features",
            "test_labels",
        ],
        SpecStage::Svd | SpecStage::Train | SpecStage::Predict | SpecStage::Evaluate => &[],
    }
}

/// A parsed spec: one table of options per stage.
#[derive(Debug, Clone)]
pub struct Spec {
    pub path: PathBuf,
    tables: toml::Table,
}

impl Spec {
    /// Reads a spec and checks it whole (tables, keys, types, ranges): the error lists
    /// every problem found, one per line.
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading spec {}", path.display()))?;
        let tables: toml::Table =
            toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let spec = Spec {
            path: path.to_path_buf(),
            tables,
        };
        let problems = spec.problems();
        match problems.len() {
            0 => Ok(spec),
            1 => bail!("{}: {}", path.display(), problems[0]),
            n => bail!(
                "{}\n{n} problems in {}; no stage was run",
                problems
                    .iter()
                    .map(|p| format!("{}: {p}", path.display()))
                    .collect::<Vec<_>>()
                    .join("\n"),
                path.display()
            ),
        }
    }

    /// The command line `pipeline STAGE --flag value ...` for one stage, with `linked`
    /// (flag, value) pairs appended by the runner.
    pub fn argv(&self, stage: SpecStage, linked: &[(&str, String)]) -> Result<Vec<String>> {
        self.argv_of(stage, &|_| true, linked)
    }

    /// [`Spec::argv`] of the keys of the stage's table that `keep` selects.
    fn argv_of(
        &self,
        stage: SpecStage,
        keep: &dyn Fn(&str) -> bool,
        linked: &[(&str, String)],
    ) -> Result<Vec<String>> {
        let mut argv = vec!["pipeline".to_string(), stage.to_string()];
        let empty = toml::Table::new();
        let table = match self.tables.get(stage.name()) {
            Some(t) => t.as_table().expect("checked in read"),
            None => &empty,
        };
        let base = self.path.parent().unwrap_or(Path::new("."));
        let runner_keys = spec_only_keys(stage);
        for (key, value) in table
            .iter()
            .filter(|(key, _)| keep(key) && !runner_keys.contains(&key.as_str()))
        {
            let at = || format!("{}: [{stage}] {key}", self.path.display());
            if linked_options(stage).contains(&key.as_str()) {
                bail!(
                    "{}: set by the runner from the previous stage; remove it",
                    at()
                );
            }
            let flag = format!("--{}", key.replace('_', "-"));
            match value {
                toml::Value::Boolean(true) => argv.push(flag),
                toml::Value::Boolean(false) => {}
                toml::Value::String(s) if path_options(stage).contains(&key.as_str()) => {
                    argv.push(flag);
                    argv.push(base.join(s).display().to_string());
                }
                toml::Value::String(s) => push_option(&mut argv, flag, s.clone()),
                toml::Value::Integer(i) => push_option(&mut argv, flag, i.to_string()),
                toml::Value::Float(f) => push_option(&mut argv, flag, f.to_string()),
                // A list option (`lr_decay_at = [40, 50]`) as its comma-separated flag.
                toml::Value::Array(items) if items.iter().all(toml::Value::is_integer) => {
                    let values: Vec<String> = items.iter().map(|v| v.to_string()).collect();
                    push_option(&mut argv, flag, values.join(","))
                }
                other => bail!(
                    "{}: expected a string, number, boolean or array of integers, found {}",
                    at(),
                    other.type_str()
                ),
            }
        }
        for (flag, value) in linked {
            argv.push(format!("--{flag}"));
            argv.push(value.clone());
        }
        Ok(argv)
    }

    /// Parses one stage's options with the command-line parser.
    pub fn command(&self, stage: SpecStage, linked: &[(&str, String)]) -> Result<Command> {
        let argv = self.argv(stage, linked)?;
        let cli = Cli::try_parse_from(&argv).map_err(|e| {
            anyhow::anyhow!(
                "{}: [{stage}]: {}",
                self.path.display(),
                e.render().to_string().trim_end()
            )
        })?;
        Ok(cli.command)
    }

    pub fn has(&self, stage: SpecStage) -> bool {
        self.tables.contains_key(stage.name())
    }

    /// `[train] seeds`, when the spec sweeps seeds (checked in [`Spec::read`]: a non-empty
    /// array of distinct non-negative integers).
    pub fn seeds(&self) -> Option<Vec<u64>> {
        let seeds = self
            .tables
            .get(SpecStage::Train.name())?
            .get(SEEDS)?
            .as_array()?;
        Some(
            seeds
                .iter()
                .filter_map(|s| s.as_integer().and_then(|i| u64::try_from(i).ok()))
                .collect(),
        )
    }
}

/// Appends `--flag value`, or `--flag=value` when the value starts with '-' (a negative
/// number), which the parser would otherwise take for a flag.
fn push_option(argv: &mut Vec<String>, flag: String, value: String) {
    if value.starts_with('-') {
        argv.push(format!("{flag}={value}"));
    } else {
        argv.push(flag);
        argv.push(value);
    }
}

/// `[train] seeds = [0, 1, 2]`: train → predict → evaluate once per seed (`--seed S`).
const SEEDS: &str = "seeds";

/// Options of the command line that a spec does not take, per stage: `predict --input`
/// scores a file outside the workspace, not a split of the spec's run.
fn command_line_only(stage: SpecStage) -> &'static [&'static str] {
    match stage {
        SpecStage::Predict => &["input", "output", "format", "unknown_features"],
        _ => &[],
    }
}

/// Keys of a spec that are not flags of their stage but tell the runner what to do.
fn spec_only_keys(stage: SpecStage) -> &'static [&'static str] {
    match stage {
        SpecStage::Train => &[SEEDS],
        _ => &[],
    }
}

/// One stage's line in the run summary.
type StageLine = FinalStage;

/// The stage lines of a run so far, and the spec they come from.
struct Runner<'a> {
    ws: &'a Workspace,
    spec: &'a Spec,
    lines: Vec<StageLine>,
}

impl Runner<'_> {
    /// Runs one stage (`f` returns its run id and whether it was cached) and records its line.
    fn timed(
        &mut self,
        stage: String,
        f: &mut dyn FnMut() -> Result<(Option<i64>, bool)>,
    ) -> Result<()> {
        eprintln!("== {stage}");
        let started = Instant::now();
        let (run, cached) =
            f().with_context(|| format!("stage {stage} of {}", self.spec.path.display()))?;
        self.lines.push(StageLine {
            stage,
            run,
            cached,
            seconds: started.elapsed().as_secs_f64(),
        });
        Ok(())
    }

    /// Synth (when the spec has it) and ingest; returns the dataset's name.
    fn ingest(&mut self) -> Result<String> {
        let spec = self.spec;
        if spec.has(SpecStage::Synth) {
            let Command::Synth(synth) = spec.command(SpecStage::Synth, &[])? else {
                unreachable!()
            };
            self.timed(SpecStage::Synth.to_string(), &mut || synth_once(&synth))?;
        }
        let Command::Ingest(ingest) = spec.command(SpecStage::Ingest, &[])? else {
            unreachable!()
        };
        let ws = self.ws;
        self.timed(SpecStage::Ingest.to_string(), &mut || {
            let out = crate::ingest::run(ws, &ingest.config()?)?;
            Ok((out.run_id, !out.ingested))
        })?;
        Ok(ingest.name.clone())
    }

    /// The svd of the dataset; returns its run id.
    fn svd(&mut self, dataset: &str) -> Result<i64> {
        let Command::Svd(svd) = self
            .spec
            .command(SpecStage::Svd, &[("dataset", dataset.into())])?
        else {
            unreachable!()
        };
        let (ws, mut svd_run) = (self.ws, 0);
        self.timed(SpecStage::Svd.to_string(), &mut || {
            let out = crate::svd::run(ws, &svd.options())?;
            svd_run = out.run_id;
            Ok((Some(out.run_id), !out.computed))
        })?;
        Ok(svd_run)
    }

    /// Train → predict → evaluate, with `seed` linked in when the spec sweeps seeds.
    fn model(&mut self, dataset: &str, svd_run: i64, seed: Option<u64>) -> Result<Evaluated> {
        let spec = self.spec;
        let mut linked = vec![
            ("dataset", dataset.to_string()),
            ("svd", svd_run.to_string()),
        ];
        linked.extend(seed.map(|s| ("seed", s.to_string())));
        let tag = seed.map_or(String::new(), |s| format!(" (seed {s})"));
        let Command::Train(train) = spec.command(SpecStage::Train, &linked)? else {
            unreachable!()
        };
        let ws = self.ws;
        let mut train_run = 0;
        self.timed(format!("{}{tag}", SpecStage::Train), &mut || {
            let out = crate::train::run(ws, &train.options())?;
            train_run = out.run_id;
            Ok((Some(out.run_id), !out.computed))
        })?;
        let Command::Predict(predict) =
            spec.command(SpecStage::Predict, &[("run", train_run.to_string())])?
        else {
            unreachable!()
        };
        let mut predictions = String::new();
        self.timed(format!("{}{tag}", SpecStage::Predict), &mut || {
            let out = crate::predict::run(ws, &predict.options())?;
            predictions = out.value.path.clone();
            Ok((Some(out.run_id), !out.computed))
        })?;
        let Command::Evaluate(evaluate) =
            spec.command(SpecStage::Evaluate, &[("predictions", predictions.clone())])?
        else {
            unreachable!()
        };
        let mut done = None;
        self.timed(format!("{}{tag}", SpecStage::Evaluate), &mut || {
            let out = crate::evaluate::run(ws, &evaluate.options(predictions.clone()))?;
            done = Some((out.run_id, out.value));
            Ok((Some(out.run_id), !out.computed))
        })?;
        let (evaluate_run, metrics) = done.expect("evaluate ran");
        Ok(Evaluated {
            seed: seed.unwrap_or(train.flags.seed),
            train_run,
            evaluate_run,
            metrics,
        })
    }
}

/// The table of stages: run id, cached or ran, seconds (a spec's, and a fit's final model's).
pub fn print_stages(lines: &[StageLine]) {
    eprintln!();
    let width = lines
        .iter()
        .map(|l| l.stage.len())
        .max()
        .unwrap_or(0)
        .max(9);
    eprintln!(
        "{:<width$} {:>6} {:>7} {:>10}",
        "stage", "run", "", "seconds"
    );
    for l in lines {
        eprintln!(
            "{:<width$} {:>6} {:>7} {:>10.1}",
            l.stage,
            l.run.map_or("-".to_string(), |r| format!("#{r}")),
            if l.cached { "cached" } else { "ran" },
            l.seconds
        );
    }
}

/// One train → predict → evaluate of a spec.
pub struct Evaluated {
    pub seed: u64,
    pub train_run: i64,
    pub evaluate_run: i64,
    pub metrics: Evaluation,
}

/// Runs a spec [`Spec::read`] has checked: its stages' table goes to standard error, and
/// each seed's train → predict → evaluate is returned (one, when the spec sweeps none).
pub fn execute(ws: &Workspace, spec: &Spec) -> Result<Vec<Evaluated>> {
    let mut runner = Runner {
        ws,
        spec,
        lines: Vec::new(),
    };
    let dataset = runner.ingest()?;
    let svd_run = runner.svd(&dataset)?;
    let mut sweep = Vec::new();
    match spec.seeds() {
        None => sweep.push(runner.model(&dataset, svd_run, None)?),
        Some(seeds) => {
            for seed in seeds {
                sweep.push(runner.model(&dataset, svd_run, Some(seed))?);
            }
        }
    }
    print_stages(&runner.lines);
    Ok(sweep)
}

/// Runs `pipeline run` of a spec [`Spec::read`] has checked and prints its metrics;
/// returns its training runs, one per seed.
pub fn run(ws: &Workspace, spec: &Spec, args: &RunArgs) -> Result<Vec<i64>> {
    let sweep = execute(ws, spec)?;
    match (spec.seeds(), sweep.as_slice()) {
        (None, [one]) if args.json => println!("{}", one.metrics.to_json()),
        (None, [one]) => println!("{}", one.metrics.to_table()),
        _ => print_sweep(&sweep, args.json),
    }
    Ok(sweep.iter().map(|e| e.train_run).collect())
}

/// Each seed's metrics, then their summary over the seeds (`--json`: one object).
fn print_sweep(sweep: &[Evaluated], json: bool) {
    let pairs: Vec<(u64, Vec<MetricRow>)> = sweep
        .iter()
        .map(|e| (e.seed, e.metrics.metric_rows(None, None)))
        .collect();
    let summary = SeedSummary::of(&pairs);
    if json {
        let runs: Vec<serde_json::Value> = sweep
            .iter()
            .map(|e| {
                serde_json::json!({
                    "seed": e.seed,
                    "train_run": e.train_run,
                    "evaluate_run": e.evaluate_run,
                    "metrics": e.metrics,
                })
            })
            .collect();
        let out = serde_json::json!({ "runs": runs, "summary": summary });
        println!("{}", serde_json::to_string_pretty(&out).expect("JSON"));
        return;
    }
    for e in sweep {
        println!(
            "seed {} (train run #{}, evaluate run #{}):\n{}",
            e.seed,
            e.train_run,
            e.evaluate_run,
            e.metrics.to_table()
        );
    }
    print!("{}", summary.to_table());
}

/// Runs synth unless its output files exist and were made with the same options (a stamp
/// file beside them records those options).
fn synth_once(args: &SynthArgs) -> Result<(Option<i64>, bool)> {
    let stamp = args.out.join("synth-options.txt");
    let wanted = format!("{args:?}");
    let present = ["train.txt", "test.txt"]
        .iter()
        .all(|f| args.out.join(f).is_file());
    if present && std::fs::read_to_string(&stamp).ok().as_deref() == Some(wanted.as_str()) {
        eprintln!("synth: {} is up to date", args.out.display());
        return Ok((None, true));
    }
    // The stamp says synth made the files there: regenerating them replaces its own.
    let options = crate::synth::SynthOptions {
        force: args.force || stamp.is_file(),
        ..args.options()
    };
    crate::synth::run(&options)?;
    std::fs::write(&stamp, &wanted).with_context(|| format!("writing {}", stamp.display()))?;
    Ok((None, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(text: &str) -> Result<Spec> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.toml");
        std::fs::write(&path, text).unwrap();
        Spec::read(&path)
    }

    const MINIMAL: &str = "[ingest]\nname = \"d\"\ntrain = \"a/train.txt\"\n[svd]\nrank = 4\n\
                           [train]\nepochs = 3\nfreeze_a = true\nfreeze_hyper = false\nlr = 0.5\n\
                           [predict]\ntop_k = 7\n";

    #[test]
    fn options_become_flags_and_paths_resolve_against_the_spec() {
        let s = spec(MINIMAL).unwrap();
        let base = s.path.parent().unwrap().to_path_buf();
        let argv = s.argv(SpecStage::Ingest, &[]).unwrap();
        assert_eq!(argv[..4], ["pipeline", "ingest", "--name", "d"]);
        assert_eq!(argv[4], "--train");
        assert_eq!(PathBuf::from(&argv[5]), base.join("a/train.txt"));
        let argv = s
            .argv(SpecStage::Train, &[("dataset", "d".into())])
            .unwrap();
        assert_eq!(
            argv,
            [
                "pipeline",
                "train",
                "--epochs",
                "3",
                "--freeze-a",
                "--lr",
                "0.5",
                "--dataset",
                "d"
            ]
        );
        let Command::Predict(p) = s
            .command(SpecStage::Predict, &[("run", "9".into())])
            .unwrap()
        else {
            panic!("not predict")
        };
        assert_eq!((p.run, p.top_k), (Some(9), Some(7)));
    }

    #[test]
    fn budgets_and_early_stopping_are_checked_with_the_spec() {
        let s = spec(&MINIMAL.replace("epochs = 3", "steps = 300")).unwrap();
        let argv = s.argv(SpecStage::Train, &[]).unwrap();
        assert!(argv.windows(2).any(|w| w == ["--steps", "300"]), "{argv:?}");
        let e = spec(&MINIMAL.replace("epochs = 3", "epochs = 3\nsteps = 300"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("[train] the argument 'epochs' cannot be used with 'steps'"),
            "{e}"
        );
        let asks = MINIMAL.replace(
            "epochs = 3",
            "epochs = 3\nearly_stopping = true\npatience = 4",
        );
        let e = spec(&asks).unwrap_err().to_string();
        assert!(
            e.contains(
                "[train] early_stopping = true scores the validation split, and the dataset \
                 has none; carve one from the training rows with [ingest] validation_fraction"
            ),
            "{e}"
        );
        let carved = asks.replace(
            "train = \"a/train.txt\"",
            "train = \"a/train.txt\"\nvalidation_fraction = 0.2",
        );
        let argv = spec(&carved).unwrap().argv(SpecStage::Train, &[]).unwrap();
        assert!(argv.contains(&"--early-stopping".to_string()), "{argv:?}");
        let e = spec(&carved.replace("early_stopping = true\n", ""))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "[train] patience is an option of early stopping: give --early-stopping too"
            ),
            "{e}"
        );
        let e = spec(&carved.replace("patience = 4", "stop_metric = 'nlp'"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "[train] stop_metric nlp is not measured for --task multilabel: give \
                 P@1, P@3 or P@5"
            ),
            "{e}"
        );
    }

    #[test]
    fn every_spec_stage_is_a_subcommand_and_a_recorded_one_has_the_catalog_s_name() {
        use clap::CommandFactory;
        let cli = Cli::command();
        for stage in SpecStage::ALL {
            assert!(cli.find_subcommand(stage.name()).is_some(), "{stage}");
            assert_eq!(SpecStage::of(stage.name()), Some(stage));
            if let Some(kind) = stage.kind() {
                assert_eq!(stage.name(), kind.as_str());
            }
        }
        for &kind in StageKind::ALL {
            assert!(
                SpecStage::ALL.iter().any(|s| s.kind() == Some(kind)),
                "{kind}"
            );
        }
        assert_eq!(SpecStage::Synth.kind(), None);
        assert_eq!(SpecStage::of("trian"), None);
    }

    #[test]
    fn bad_specs_are_named() {
        let e = spec("[ingest]\nname='x'\n[svd]\n[train]\n").unwrap_err();
        assert!(e.to_string().contains("missing table [predict]"), "{e}");
        let e = spec(&format!("{MINIMAL}[trian]\nx = 1\n")).unwrap_err();
        assert!(e.to_string().contains("unknown table [trian]"), "{e}");
        let e = spec("[ingest\n").unwrap_err();
        assert!(e.to_string().contains("s.toml"), "{e}");
        // Keys, types and ranges are checked when the spec is read, before any stage.
        let e = spec(&MINIMAL.replace("lr = 0.5", "lr = 'fast'")).unwrap_err();
        assert!(
            e.to_string().contains("[train]") && e.to_string().contains("fast"),
            "{e}"
        );
        let e = spec(&MINIMAL.replace("epochs = 3", "dataset = 'other'")).unwrap_err();
        assert!(e.to_string().contains("set by the runner"), "{e}");
        let e = spec(&MINIMAL.replace("top_k = 7", "top_kk = 7")).unwrap_err();
        assert!(
            e.to_string()
                .contains("[predict] unknown key 'top_kk' (did you mean 'top_k'?)"),
            "{e}"
        );
        // `predict --input` is the command line's: a spec's predict scores its split.
        let e = spec(&MINIMAL.replace("top_k = 7", "top_k = 7\ninput = 'new.txt'")).unwrap_err();
        assert!(
            e.to_string()
                .contains("[predict] input: an option of 'pipeline predict --input'"),
            "{e}"
        );
    }

    #[test]
    fn the_shipped_specs_pass_the_check() {
        for name in [
            "quickstart.toml",
            "delicious.toml",
            "delicious-validation.toml",
        ] {
            let path = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("pipelines")
                .join(name);
            Spec::read(&path).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        }
    }

    #[test]
    fn every_problem_is_reported_with_its_key() {
        let text = MINIMAL
            .replace("lr = 0.5", "lerning_rate = 0.5")
            .replace("epochs = 3", "epochs = 'ten'")
            .replace("rank = 4", "rank = 0\nseed = -1")
            .replace("top_k = 7", "top_k = 0\nkernel = 'se'\nblock_rows = 1.5");
        let e = spec(&format!("{text}[evaluate]\nlabelless = 'drop'\n"))
            .unwrap_err()
            .to_string();
        for expected in [
            "[train] unknown key 'lerning_rate' (did you mean 'lr'?)",
            "[train] epochs: expected an integer, found a string \"ten\"",
            "[svd] rank: invalid value '0': 0 is not in 1..=2147483647",
            "[svd] seed must be ≥ 0, not -1",
            "[predict] unknown key 'kernel' (it is an option of [train])",
            "[predict] block_rows: expected an integer, found a number 1.5",
            "[predict] top_k: invalid value '0': 0 is not in 1..=2147483647",
            "[evaluate] labelless: invalid value 'drop' (expected one of: count-as-zero, skip)",
            "8 problems in",
        ] {
            assert!(e.contains(expected), "missing {expected:?} in:\n{e}");
        }
    }

    #[test]
    fn ranges_are_the_stages_own_checks() {
        let e = spec(&MINIMAL.replace("lr = 0.5", "lr = -0.5\nbeta2 = 1.0"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("[train] lr: invalid value '-0.5': -0.5 is not in (0, ∞)"),
            "{e}"
        );
        assert!(
            e.contains("[train] beta2: invalid value '1': 1 is not in [0, 1)"),
            "{e}"
        );
        let e = spec(&format!(
            "[synth]\nout = 'x'\nrows = 0\nfeatures = 5\nlabels = 3\n{MINIMAL}"
        ))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("[synth] rows: invalid value '0': 0 is not in 1..=1000000000"),
            "{e}"
        );
        let e = spec(&MINIMAL.replace("name = \"d\"", "name = \"a b\"\nchunk_mb = 0"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("[ingest] name 'a b' is not allowed"), "{e}");
        assert!(
            e.contains("[ingest] chunk_mb: invalid value '0': 0 is not in 1..=4096"),
            "{e}"
        );
        let e = spec(&MINIMAL.replace("name = \"d\"\n", "")).unwrap_err();
        assert!(e.to_string().contains("[ingest] missing key: name"), "{e}");
        // svd's R and M come from the data when left out, and its table may be too.
        spec(&MINIMAL.replace("[svd]\nrank = 4\n", "[svd]\n")).unwrap();
        let s = spec(&MINIMAL.replace("[svd]\nrank = 4\n", "")).unwrap();
        let Command::Svd(svd) = s
            .command(SpecStage::Svd, &[("dataset", "d".into())])
            .unwrap()
        else {
            unreachable!()
        };
        assert_eq!(
            svd.options(),
            crate::svd::SvdOptions::new("d"),
            "no [svd]: the defaults"
        );
    }

    #[test]
    fn evaluate_task_is_checked() {
        for task in ["auto", "multilabel", "binary", "multiclass"] {
            spec(&format!("{MINIMAL}[evaluate]\ntask = '{task}'\n")).unwrap();
        }
        let e = spec(&format!("{MINIMAL}[evaluate]\ntask = 'regression'\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "[evaluate] task: invalid value 'regression' (expected one of: auto, \
                 multilabel, binary, multiclass)"
            ),
            "{e}"
        );
    }

    #[test]
    fn kernel_ard_and_schedule_keys_are_checked() {
        let ok = MINIMAL.replace(
            "lr = 0.5",
            "lr = 0.5\nkernel = 'se+linear'\nard = 'subspace'\nrelease_hyper_after = 2",
        );
        spec(&ok).unwrap();
        let e = spec(&MINIMAL.replace(
            "lr = 0.5",
            "lr = 0.5\nkernel = 'se+lin'\nard = 'feature'\nrelease_hyper_after = 0",
        ))
        .unwrap_err()
        .to_string();
        for expected in [
            "[train] kernel: invalid value 'se+lin'",
            "[train] ard: invalid value 'feature' (expected one of: none, subspace, features)",
        ] {
            assert!(e.contains(expected), "missing {expected:?} in:\n{e}");
        }
        // ARD over the features is accepted, and refused with the identity basis.
        spec(&MINIMAL.replace("lr = 0.5", "lr = 0.5\nard = 'features'")).unwrap();
        let e = spec(&MINIMAL.replace(
            "lr = 0.5",
            "lr = 0.5\nard = 'features'\ninducing_inputs = 'free'",
        ))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("[train] ard features with --inducing-inputs free")
                && e.contains("use --ard subspace"),
            "{e}"
        );
        let e = spec(&MINIMAL.replace("freeze_hyper = false", "release_hyper_after = 0"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("[train] release_hyper_after: invalid value '0': 0 is not in 1..=1000000"),
            "{e}"
        );
        let e = spec(&MINIMAL.replace(
            "freeze_hyper = false",
            "freeze_hyper = true\nrelease_hyper_after = 2",
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("cannot be combined with --freeze-hyper"), "{e}");
        // A step-size schedule: a list as an array, one epoch as an integer; not a string.
        for keys in ["lr_decay_at = [1, 2]\nlr_decay = 0.5", "lr_decay_at = 2"] {
            let s = spec(&MINIMAL.replace("lr = 0.5", &format!("lr = 0.5\n{keys}"))).unwrap();
            let argv = s.argv(SpecStage::Train, &[]).unwrap();
            assert!(
                argv.iter().any(|a| a.starts_with("--lr-decay-at")),
                "{argv:?}"
            );
        }
        let e = spec(&MINIMAL.replace("lr = 0.5", "lr = 0.5\nlr_decay_at = [2, 1]"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("[train] lr_decay_at must increase strictly, not 2,1"),
            "{e}"
        );
        let e = spec(&MINIMAL.replace("lr = 0.5", "lr = 0.5\nlr_decay_at = '1,2'"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("[train] lr_decay_at: expected an array of integers ≥ 0, found a string"),
            "{e}"
        );
    }

    #[test]
    fn seeds_and_the_validation_split_are_checked_before_any_stage() {
        let sweep = MINIMAL.replace("epochs = 3", "epochs = 3\nseeds = [0, 1, 2]");
        let s = spec(&sweep).unwrap();
        assert_eq!(s.seeds(), Some(vec![0, 1, 2]));
        // Not a flag of train: the runner links `--seed S` per seed instead.
        assert!(!s
            .argv(SpecStage::Train, &[])
            .unwrap()
            .iter()
            .any(|a| a.contains("seeds")));
        assert_eq!(spec(MINIMAL).unwrap().seeds(), None);
        let carved = MINIMAL.replace(
            "train = \"a/train.txt\"",
            "train = \"a/train.txt\"\nvalidation_fraction = 0.2\nvalidation_seed = 4",
        );
        let s = spec(&carved.replace("top_k = 7", "top_k = 7\nsplit = 'validation'")).unwrap();
        let argv = s.argv(SpecStage::Ingest, &[]).unwrap();
        assert!(argv.ends_with(&[
            "--validation-fraction".into(),
            "0.2".into(),
            "--validation-seed".into(),
            "4".into()
        ]));
        let bad = MINIMAL
            .replace("epochs = 3", "seeds = [0, 0]")
            .replace("lr = 0.5", "lr = 0.5\neval_split = 'validation'")
            .replace("top_k = 7", "top_k = 7\nsplit = 'validation'");
        let e = spec(&bad).unwrap_err().to_string();
        for expected in [
            "[train] seeds: seed 0 is given twice",
            "[train] eval_split = \"validation\": the dataset has no validation split; carve \
             one from the training rows with [ingest] validation_fraction = 0.2",
            "[predict] split = \"validation\": the dataset has no validation split",
        ] {
            assert!(e.contains(expected), "missing {expected:?} in:\n{e}");
        }
        let e = spec(&MINIMAL.replace("epochs = 3", "seeds = [1]\nseed = 2"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("[train] seeds and seed: give one"), "{e}");
        for (value, found) in [
            ("[]", "found an empty array"),
            ("3", "found an integer 3"),
            ("[1, -2]", "found an integer -2"),
            ("['a']", "found a string \"a\""),
        ] {
            let e = spec(&MINIMAL.replace("epochs = 3", &format!("seeds = {value}")))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("[train] seeds: expected a non-empty array of distinct integers ≥ 0")
                    && e.contains(found),
                "{value}: {e}"
            );
        }
        let e = spec(&MINIMAL.replace("epochs = 3", "seedz = [1]"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown key 'seedz' (did you mean 'seed"), "{e}");
        let e = spec(&carved.replace("0.2", "1.5")).unwrap_err().to_string();
        assert!(
            e.contains("[ingest] validation_fraction: invalid value '1.5': 1.5 is not in (0, 1)"),
            "{e}"
        );
        // validation_seed needs it, but it is present: not also "missing".
        assert!(!e.contains("missing key"), "{e}");
        let e = spec(&MINIMAL.replace("name = \"d\"", "name = \"d\"\nvalidation_seed = 3"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("[ingest]") && e.contains("validation_fraction"),
            "{e}"
        );
        let e = spec(&carved.replace("validation_seed = 4", "validation_sed = 4"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("(did you mean 'validation_seed'?)"), "{e}");
    }
}
