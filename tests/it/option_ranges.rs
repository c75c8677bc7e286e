//! Every numeric option of every subcommand at the edges of its type — 0, 1, u64::MAX,
//! 1e300, -1 and NaN — through the real binary, with the command's other arguments filled
//! in on a small generated dataset. Each run must be refused (exit 2, naming the option)
//! or run normally (exit 0, or 1 with a message); never a panic (101), an abort (134), a
//! death by a signal, or a run past its time limit. The options are read from clap's own
//! definition of the command line, so a new option is walked without editing this file.
//! `pipeline run` specs and `fit --set` parse with the same parsers: checked at the end.

use std::any::TypeId;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use clap::CommandFactory;
use fsgp::cli::args::Cli;

use crate::common::toy::{copy_dir, prepare, Prepared};
use crate::common::{
    dataset_names, pipeline, pipeline_bin, pipeline_ok, status_json, stderr, write,
};

/// The values every numeric option is given: both ends of the small numbers, the largest
/// u64 (= usize on 64-bit), a huge float, a negative number and NaN.
const EDGES: [&str; 6] = ["0", "1", "18446744073709551615", "1e300", "-1", "NaN"];

/// Values no numeric option may take: refused at parse time, exit 2.
const NEVER_VALID: [&str; 2] = ["-1", "NaN"];

/// Values beyond every bound (u64::MAX, 1e300): refused at parse time but by the options of
/// [`UNBOUNDED`].
const BEYOND_BOUNDS: [&str; 2] = ["18446744073709551615", "1e300"];

/// Options with no upper bound: a retention count (more than the run has keeps them all)
/// and the step sizes, finite and positive (a training blown up by one stops at its last
/// finite checkpoint, naming `--lr`). Every other option refuses u64::MAX and 1e300 (seeds
/// too: a spec's integers are signed 64-bit).
const UNBOUNDED: [&str; 3] = ["keep-checkpoints", "lr", "lr-decay"];

/// A run still going after this long is taken for a hang and fails the test. Every case
/// ends in under 6 s on a quiet 2-core machine (fit's, the longest, in 2.6 s; 5.4 s beside
/// six busy loops), but a fit case writes about 180 fsynced files, and on a CI machine whose
/// disk the whole suite shares one took more than 60 s: the limit tells a hang from a slow
/// disk, not a fast run from a slow one.
const LIMIT: Duration = Duration::from_secs(300);

/// How many of a failed run's last stderr lines a problem quotes: the end of a run is what
/// says how it ended, and the whole of a training run's output would bury the verdict.
const QUOTED_LINES: usize = 12;

/// `serve` with a valid value listens until stopped: still running after this long is a
/// normal start (a few seconds: it reads the model file first, slower in a debug build on a
/// loaded machine).
const SERVE_STARTED: Duration = Duration::from_secs(3);

/// One (subcommand, option) pair: the option's long name, without `--`.
#[derive(Debug, Clone)]
struct NumericOption {
    command: String,
    long: String,
}

/// Every option of every subcommand that takes a value which is neither a name from a list,
/// a path, a text nor an address: the numbers (and `N|all`-style counts).
fn numeric_options() -> Vec<NumericOption> {
    let not_numbers = [
        TypeId::of::<PathBuf>(),
        TypeId::of::<String>(),
        TypeId::of::<SocketAddr>(),
    ];
    let cli = Cli::command();
    let mut found = Vec::new();
    for sub in cli.get_subcommands() {
        for arg in sub.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            let parser = arg.get_value_parser();
            let numeric = arg.get_action().takes_values()
                && !arg.is_global_set()
                && arg.get_possible_values().is_empty()
                && !not_numbers.iter().any(|t| parser.type_id() == *t);
            if numeric {
                found.push(NumericOption {
                    command: sub.get_name().to_string(),
                    long: long.to_string(),
                });
            }
        }
    }
    found
}

/// The fixture every case starts from: the toy dataset ingested and factorised, one short
/// training run, its model file, and the generated text files.
struct Fixture {
    /// Holds the temporary directory the fixture lives in.
    _prepared: Prepared<()>,
    base: PathBuf,
    run: i64,
    model: PathBuf,
    train_txt: PathBuf,
    test_txt: PathBuf,
}

fn fixture() -> Fixture {
    let prepared = Prepared::new(|dir| {
        let base = dir.join("base");
        prepare(&base);
        (base, ())
    });
    let base = prepared.copy("fixture");
    let train = argv("train", &owned(&TRAIN_BASELINE), "");
    pipeline_ok(&base, &train.iter().map(String::as_str).collect::<Vec<_>>());
    let run = status_json(&base)["train_runs"][0]["id"].as_i64().unwrap();
    let model = base.parent().unwrap().join("toy.model.parquet");
    let (run_text, model_text) = (run.to_string(), model.display().to_string());
    pipeline_ok(&base, &["export", "--run", &run_text, "--out", &model_text]);
    let src = base.join("src");
    Fixture {
        run,
        model,
        train_txt: src.join("train.txt"),
        test_txt: src.join("test.txt"),
        _prepared: prepared,
        base,
    }
}

/// A short training run on the fixture's factors (two steps, one thread), as (flag,
/// value) pairs; an empty value is a switch.
const TRAIN_BASELINE: [(&str, &str); 8] = [
    ("dataset", "toy"),
    ("factors", "2"),
    ("batch", "64"),
    ("inducing", "8"),
    ("max-steps", "2"),
    ("threads", "1"),
    ("no-final-elbo", ""),
    ("seed", "1"),
];

/// `pipeline COMMAND --flag value ...` of `pairs`, without the option `leave_out`.
fn argv(command: &str, pairs: &[(String, String)], leave_out: &str) -> Vec<String> {
    let mut args = vec![command.to_string()];
    for (flag, value) in pairs.iter().filter(|(flag, _)| flag != leave_out) {
        args.push(format!("--{flag}"));
        if !value.is_empty() {
            args.push(value.clone());
        }
    }
    args
}

fn owned(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(flag, value)| (flag.to_string(), value.to_string()))
        .collect()
}

/// The arguments a command needs besides the option under test, as (flag, value) pairs
/// (an empty value: a switch), and whether it needs a copy of the fixture's workspace.
fn baseline(command: &str, f: &Fixture, case_dir: &Path) -> (Vec<(String, String)>, bool) {
    let path = |p: &Path| p.display().to_string();
    let run = f.run.to_string();
    let pairs: Vec<(&str, String)> = match command {
        "synth" => vec![
            ("out", path(&case_dir.join("synth"))),
            ("rows", "40".into()),
            ("test-rows", "10".into()),
            ("features", "20".into()),
            ("labels", "6".into()),
            ("nnz-per-row", "4".into()),
            ("labels-per-row", "2".into()),
            ("threads", "1".into()),
        ],
        "ingest" => vec![
            ("name", "t".into()),
            ("train", path(&f.train_txt)),
            ("test", path(&f.test_txt)),
            ("validation-fraction", "0.2".into()),
            ("threads", "1".into()),
        ],
        "svd" => vec![
            ("dataset", "toy".into()),
            ("rank", "4".into()),
            ("inducing", "8".into()),
            ("power-iters", "1".into()),
            ("threads", "1".into()),
        ],
        "train" => TRAIN_BASELINE
            .iter()
            .map(|&(flag, value)| (flag, value.to_string()))
            .collect(),
        "elbo" => vec![("run", run), ("threads", "1".into())],
        "predict" | "evaluate" => vec![("run", run)],
        "export" => vec![("run", run), ("out", path(&case_dir.join("m.parquet")))],
        "report" => vec![("run", run), ("out", path(&case_dir.join("report")))],
        // The 100 test rows alone: fit trains at least 50 steps whatever its budget.
        "fit" => vec![
            ("train", path(&f.test_txt)),
            ("budget", "2s".into()),
            ("name", "f".into()),
            ("spec-out", path(&case_dir.join("f-fit.toml"))),
        ],
        "serve" => vec![
            ("model", path(&f.model)),
            ("addr", "127.0.0.1:0".into()),
            ("threads", "1".into()),
        ],
        _ => vec![],
    };
    let needs_workspace = !matches!(command, "synth" | "ingest" | "fit" | "serve");
    let pairs = pairs
        .into_iter()
        .map(|(flag, value)| (flag.to_string(), value))
        .collect();
    (pairs, needs_workspace)
}

/// How one run ended.
#[derive(Debug)]
enum Ending {
    Exited(Output),
    /// Still running at the time limit (killed then), with what it wrote.
    StillRunning(Output),
}

/// Runs `pipeline --workspace WS ARGS` in `dir`, killed at `limit`.
fn run_limited(dir: &Path, ws: &Path, args: &[String], limit: Duration) -> Ending {
    let mut child = Command::new(pipeline_bin())
        // Whatever a command writes beside it (fit's NAME-fit.toml) stays in the case's
        // directory.
        .current_dir(dir)
        .arg("--workspace")
        .arg(ws)
        .args(args)
        .env_remove("FSGP_WORKSPACE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting pipeline");
    let started = Instant::now();
    while child.try_wait().expect("waiting for pipeline").is_none() {
        if started.elapsed() > limit {
            child.kill().expect("killing pipeline");
            return Ending::StillRunning(child.wait_with_output().expect("reaping pipeline"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ending::Exited(
        child
            .wait_with_output()
            .expect("collecting pipeline's output"),
    )
}

/// What is wrong with `pipeline COMMAND --OPTION=VALUE`'s ending, if anything.
fn problem(opt: &NumericOption, value: &str, ending: &Ending) -> Option<String> {
    let must_refuse = NEVER_VALID.contains(&value)
        || (BEYOND_BOUNDS.contains(&value) && !UNBOUNDED.contains(&opt.long.as_str()));
    let out = match ending {
        Ending::StillRunning(_) if opt.command == "serve" && !must_refuse => return None,
        Ending::StillRunning(_) => return Some("still running at its time limit, killed".into()),
        Ending::Exited(out) => out,
    };
    let text = stderr(out);
    let flag = format!("--{}", opt.long);
    match out.status.code() {
        Some(2) if text.contains(&flag) => None,
        Some(2) => Some(format!("refused without naming {flag}")),
        _ if must_refuse => Some(format!(
            "expected a refusal at parse time (exit 2), got {:?}",
            out.status
        )),
        Some(0) => None,
        Some(1) if !text.trim().is_empty() => None,
        Some(1) => Some("exit 1 without a message".into()),
        other => Some(format!("ended by {other:?} (a panic, abort or signal)")),
    }
}

/// Runs one case in its own directory (and workspace copy where the command needs one).
fn run_case(
    f: &Fixture,
    scratch: &Path,
    index: usize,
    opt: &NumericOption,
    value: &str,
) -> Option<String> {
    let case_dir = scratch.join(format!("case{index}"));
    std::fs::create_dir_all(&case_dir).unwrap();
    let (pairs, needs_workspace) = baseline(&opt.command, f, &case_dir);
    let ws = case_dir.join("ws");
    if needs_workspace {
        copy_dir(&f.base, &ws);
    }
    let mut args = argv(&opt.command, &pairs, &opt.long);
    // `=` so that `-1` is read as the value, not as a flag.
    args.push(format!("--{}={value}", opt.long));
    let limit = if opt.command == "serve" {
        SERVE_STARTED
    } else {
        LIMIT
    };
    let started = Instant::now();
    let ending = run_limited(&case_dir, &ws, &args, limit);
    let seconds = started.elapsed().as_secs_f64();
    let found = problem(opt, value, &ending);
    let _ = std::fs::remove_dir_all(&case_dir);
    let (Ending::Exited(out) | Ending::StillRunning(out)) = &ending;
    // The verdict comes last, after the quoted output, so that the end of a cut log shows it.
    found.map(|p| {
        format!(
            "pipeline {}\n{}\n=> {p} (after {seconds:.1} s)",
            args.join(" "),
            last_lines(&stderr(out), QUOTED_LINES)
        )
    })
}

/// The last `n` lines of `text`, each indented, with a line saying how many were left out.
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let kept = &lines[lines.len().saturating_sub(n)..];
    let mut quoted = Vec::with_capacity(kept.len() + 1);
    if kept.len() < lines.len() {
        quoted.push(format!(
            "   ({} earlier lines of stderr left out)",
            lines.len() - n
        ));
    }
    quoted.extend(kept.iter().map(|line| format!("   {line}")));
    quoted.join("\n")
}

#[test]
fn every_numeric_option_is_refused_or_runs_at_its_types_edges() {
    let f = fixture();
    let options = numeric_options();
    // The walk reaches every subcommand that has numeric options.
    for command in [
        "synth", "ingest", "svd", "train", "predict", "evaluate", "fit", "serve",
    ] {
        assert!(
            options.iter().any(|o| o.command == command),
            "no numeric option of {command} found in {options:?}"
        );
    }
    let cases: Vec<(usize, &NumericOption, &str)> = options
        .iter()
        .flat_map(|o| EDGES.iter().map(move |v| (o, *v)))
        .enumerate()
        .map(|(i, (o, v))| (i, o, v))
        .collect();
    let scratch = f.prepared_dir().join("cases");
    let next = Mutex::new(cases.iter());
    let problems = Mutex::new(Vec::new());
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| loop {
                let Some(&(i, opt, value)) = next.lock().unwrap().next() else {
                    return;
                };
                if let Some(p) = run_case(&f, &scratch, i, opt, value) {
                    problems.lock().unwrap().push(p);
                }
            });
        }
    });
    let problems = problems.into_inner().unwrap();
    eprintln!(
        "{} cases of {} options in {:.0?}",
        cases.len(),
        options.len(),
        started.elapsed()
    );
    assert!(
        problems.is_empty(),
        "{}\n{} of {} cases went wrong (above)",
        problems.join("\n"),
        problems.len(),
        cases.len()
    );
}

impl Fixture {
    /// The temporary directory the fixture lives in.
    fn prepared_dir(&self) -> &Path {
        self.base.parent().unwrap()
    }
}

/// A spec's values go through the same parsers: an out-of-range one is refused before any
/// stage runs, naming its table, option and bound.
#[test]
fn a_spec_with_an_out_of_range_value_is_refused_before_any_stage() {
    let dir = tempfile::tempdir().unwrap();
    let spec = crate::common::toy_spec(1, "", "")
        // The first `threads = 2` is [svd]'s.
        .replacen("threads = 2\n", "threads = 2\npower_iters = 1000000\n", 1)
        .replacen("lr = 0.05", "lr = -1.0", 1);
    let path = write(dir.path(), "spec.toml", &spec);
    let ws = dir.path().join("ws");
    let out = pipeline(&ws, &["run", path.to_str().unwrap()]);
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("[svd] power_iters: invalid value '1000000': 1000000 is not in 0..=50"),
        "{text}"
    );
    assert!(
        text.contains("[train] lr: invalid value '-1': -1 is not in (0, ∞)"),
        "{text}"
    );
    assert!(text.contains("2 problems in"), "{text}");
    assert!(!dir.path().join("data").exists(), "a stage ran: {text}");
}

/// `fit --set` passes train options through train's parser: the same ranges apply.
#[test]
fn fit_set_values_out_of_range_are_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let train = write(dir.path(), "train.txt", "2 2 1\n0 0:1\n0 1:1\n");
    let ws = dir.path().join("ws");
    for (setting, named) in [
        ("lr=NaN", "--lr"),
        ("threads=1000000000", "--threads"),
        ("quadrature=18446744073709551615", "--quadrature"),
        ("batch=0", "--batch"),
    ] {
        let out = pipeline(
            &ws,
            &["fit", "--train", train.to_str().unwrap(), "--set", setting],
        );
        let text = stderr(&out);
        assert!(!out.status.success(), "{setting}: {text}");
        assert!(text.contains(named), "{setting}: {text}");
        assert!(
            dataset_names(&ws).is_empty(),
            "{setting} ran an ingest: {text}"
        );
    }
}
