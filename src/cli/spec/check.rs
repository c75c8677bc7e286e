//! Checking a spec whole before any stage runs: its tables, every key (unknown keys with
//! the closest valid one), every value's type, what the command-line parser finds in the
//! keys together, and the ranges each stage's options `validate()`: the same checks the
//! stage itself makes, so a spec cannot pass here and fail on its options later.

use std::any::TypeId;

use anyhow::Result;
use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{CommandFactory, Parser};

use super::{command_line_only, linked_options, spec_only_keys, Spec, SpecStage, SEEDS};
use crate::cli::args::{Cli, Command};
use crate::error::{closest, InvalidOptions};
use crate::store::catalog::Split;
use crate::synth::SynthConfig;

/// Stand-ins for the linked options while the spec is checked, before any stage has run
/// (run ids count from 1, as their parser checks).
fn placeholder_links(stage: SpecStage) -> Vec<(&'static str, String)> {
    match stage {
        SpecStage::Svd => vec![("dataset", "spec-check".into())],
        SpecStage::Train => vec![("dataset", "spec-check".into()), ("svd", "1".into())],
        SpecStage::Predict => vec![("run", "1".into())],
        SpecStage::Evaluate => vec![("predictions", "spec-check".into())],
        SpecStage::Synth | SpecStage::Ingest => Vec::new(),
    }
}

/// Names other tools give some options (spec key → ours), so that a key spelt after them
/// is pointed to the option it means.
const KNOWN_AS: [(&str, &str); 6] = [
    ("learning_rate", "lr"),
    ("batch_size", "batch"),
    ("num_epochs", "epochs"),
    ("n_epochs", "epochs"),
    ("num_inducing", "inducing"),
    ("num_factors", "factors"),
];

impl Spec {
    /// Every problem of the spec, each prefixed by its table.
    pub(super) fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let names = SpecStage::ALL.map(SpecStage::name);
        for (key, value) in &self.tables {
            if SpecStage::of(key).is_none() {
                let hint =
                    closest(key, names).map_or(String::new(), |t| format!("did you mean [{t}]? "));
                problems.push(format!(
                    "unknown table [{key}] ({hint}expected some of: {})",
                    names.join(", ")
                ));
            } else if !value.is_table() {
                problems.push(format!("`{key}` must be a table ([{key}])"));
            }
        }
        for required in SpecStage::ALL.into_iter().filter(|s| s.required()) {
            if !self.has(required) {
                problems.push(format!("missing table [{required}]"));
            }
        }
        for stage in SpecStage::ALL {
            if let Some(toml::Value::Table(table)) = self.tables.get(stage.name()) {
                problems.extend(self.stage_problems(stage, table));
            }
        }
        problems.extend(self.cross_table_problems());
        problems
    }

    /// What the tables' keys say together: `seeds` with `seed`, and the validation split
    /// asked of a dataset whose ingest does not carve one.
    fn cross_table_problems(&self) -> Vec<String> {
        let key =
            |stage: SpecStage, key: &str| self.tables.get(stage.name()).and_then(|t| t.get(key));
        let mut problems = Vec::new();
        if key(SpecStage::Train, SEEDS).is_some() && key(SpecStage::Train, "seed").is_some() {
            problems.push(
                "[train] seeds and seed: give one (seeds = [0, 1, 2] runs train → predict → \
                 evaluate once per seed)"
                    .into(),
            );
        }
        let carved = ["validation_fraction", "validation_folds"];
        if carved.iter().any(|k| key(SpecStage::Ingest, k).is_some()) {
            return problems;
        }
        for (stage, option) in [
            (SpecStage::Train, "eval_split"),
            (SpecStage::Predict, "split"),
        ] {
            let validation = Split::Validation.name();
            if key(stage, option).and_then(|v| v.as_str()) == Some(validation) {
                problems.push(format!(
                    "[{stage}] {option} = \"{validation}\": the dataset has no validation \
                     split; carve one from the training rows with [ingest] \
                     validation_fraction = 0.2 (and optionally validation_seed)"
                ));
            }
        }
        if key(SpecStage::Train, "early_stopping").and_then(|v| v.as_bool()) == Some(true) {
            problems.push(
                "[train] early_stopping = true scores the validation split, and the dataset \
                 has none; carve one from the training rows with [ingest] \
                 validation_fraction = 0.2 (and optionally validation_seed)"
                    .into(),
            );
        }
        problems
    }

    /// The problems of one stage's table: its keys one by one, then what the command-line
    /// parser finds in them together, then the ranges the stage's options check.
    fn stage_problems(&self, stage: SpecStage, table: &toml::Table) -> Vec<String> {
        let command = stage_command(stage);
        let mut problems = Vec::new();
        let mut parsed_keys = Vec::new();
        for (key, value) in table {
            match key_problem(stage, &command, key, value) {
                Some(problem) => problems.push(format!("[{stage}] {problem}")),
                None => parsed_keys.push(key.clone()),
            }
        }
        let (parsed, parse_problems) = self.parse_keys(stage, parsed_keys);
        problems.extend(parse_problems);
        if let Some(parsed) = parsed {
            problems.extend(range_problems(stage, &parsed));
        }
        problems
    }

    /// Parses `keys` of a stage's table with placeholder links. The parser stops at its
    /// first error, so the key it names is set aside and the rest parsed again, until they
    /// parse or the error names no key of the table.
    fn parse_keys(
        &self,
        stage: SpecStage,
        mut keys: Vec<String>,
    ) -> (Option<Command>, Vec<String>) {
        let links = placeholder_links(stage);
        let mut problems = Vec::new();
        let mut set_aside = Vec::new();
        loop {
            let argv = match self.argv_of(stage, &|k| keys.contains(&k.to_string()), &links) {
                Ok(argv) => argv,
                Err(e) => {
                    problems.push(format!("[{stage}] {e:#}"));
                    return (None, problems);
                }
            };
            let e = match Cli::try_parse_from(&argv) {
                Ok(cli) => return (Some(cli.command), problems),
                Err(e) => e,
            };
            // A key set aside for its value is not also reported missing by the keys that
            // need it (`validation_seed` needs `validation_fraction`).
            let missing = missing_keys(&e);
            let explained =
                |alternatives: &Vec<String>| alternatives.iter().any(|k| set_aside.contains(k));
            if !missing.is_empty() && missing.iter().all(explained) {
                return (None, problems);
            }
            let (problem, key) = parse_problem(&e);
            problems.push(format!("[{stage}] {problem}"));
            let before = keys.len();
            keys.retain(|k| Some(k.replace('-', "_")) != key);
            if keys.len() == before {
                return (None, problems);
            }
            set_aside.extend(key);
        }
    }
}

/// The command-line grammar of one stage (a subcommand of `pipeline`).
fn stage_command(stage: SpecStage) -> clap::Command {
    Cli::command()
        .find_subcommand(stage.name())
        .expect("every spec stage is a subcommand")
        .clone()
}

/// The option a spec key names (`top_k` or `top-k` is `--top-k`).
fn option_arg<'c>(command: &'c clap::Command, key: &str) -> Option<&'c clap::Arg> {
    let flag = key.replace('_', "-");
    command
        .get_arguments()
        .find(|a| a.get_long() == Some(flag.as_str()))
}

/// The spec keys of a stage: its options' names with '_', without the linked ones.
fn stage_keys(stage: SpecStage) -> Vec<String> {
    stage_command(stage)
        .get_arguments()
        .filter_map(|a| a.get_long())
        .map(|long| long.replace('-', "_"))
        .filter(|key| !linked_options(stage).contains(&key.as_str()))
        .chain(spec_only_keys(stage).iter().map(|k| k.to_string()))
        .collect()
}

/// What is wrong with `[train] seeds`, if anything: it must be a non-empty array of
/// distinct integers ≥ 0.
fn seeds_problem(key: &str, value: &toml::Value) -> Option<String> {
    let expected = "expected a non-empty array of distinct integers ≥ 0, like [0, 1, 2]";
    let Some(items) = value.as_array() else {
        return Some(format!("{key}: {expected}, found {}", described(value)));
    };
    if items.is_empty() {
        return Some(format!("{key}: {expected}, found an empty array"));
    }
    let mut seen = Vec::new();
    for item in items {
        match item.as_integer() {
            Some(i) if i >= 0 && !seen.contains(&i) => seen.push(i),
            Some(i) if i >= 0 => return Some(format!("{key}: seed {i} is given twice")),
            _ => return Some(format!("{key}: {expected}, found {}", described(item))),
        }
    }
    None
}

/// What is wrong with one key of a stage's table on its own, if anything: set by the
/// runner, unknown, or a value of the wrong type.
fn key_problem(
    stage: SpecStage,
    command: &clap::Command,
    key: &str,
    value: &toml::Value,
) -> Option<String> {
    if linked_options(stage).contains(&key.replace('-', "_").as_str()) {
        return Some(format!(
            "{key}: set by the runner from the previous stage; remove it"
        ));
    }
    if command_line_only(stage).contains(&key.replace('-', "_").as_str()) {
        return Some(format!(
            "{key}: an option of 'pipeline predict --input' on the command line, which scores \
             a file of new rows; a spec's predict scores a split of its run"
        ));
    }
    if spec_only_keys(stage).contains(&key) {
        return seeds_problem(key, value);
    }
    let Some(arg) = option_arg(command, key) else {
        return Some(unknown_key(stage, key));
    };
    let kind = ValueKind::of(arg);
    if !kind.accepts(value) {
        return Some(format!(
            "{key}: expected {}, found {}",
            kind.expected(),
            described(value)
        ));
    }
    match (kind, value) {
        (ValueKind::Integer { signed: false }, toml::Value::Integer(i)) if *i < 0 => {
            Some(format!("{key} must be ≥ 0, not {i}"))
        }
        _ => None,
    }
}

/// `unknown key 'k'`, with the closest valid key of the stage when one is close (or the
/// option a well-known other name means), else the table the key belongs to if another.
fn unknown_key(stage: SpecStage, key: &str) -> String {
    let keys = stage_keys(stage);
    let mut spellings: Vec<(&str, &str)> = keys.iter().map(|k| (k.as_str(), k.as_str())).collect();
    spellings.extend(
        KNOWN_AS
            .iter()
            .filter(|(_, ours)| keys.iter().any(|k| k == ours))
            .copied(),
    );
    let normalised = key.replace('-', "_");
    let exact = spellings.iter().find(|s| s.0 == normalised).map(|s| s.0);
    let hint = exact
        .or_else(|| closest(&normalised, spellings.iter().map(|s| s.0)))
        .and_then(|spelling| spellings.iter().find(|s| s.0 == spelling))
        .map(|s| format!(" (did you mean '{}'?)", s.1));
    let elsewhere = || {
        SpecStage::ALL
            .into_iter()
            .find(|&other| other != stage && stage_keys(other).contains(&normalised))
            .map(|other| format!(" (it is an option of [{other}])"))
    };
    format!(
        "unknown key '{key}'{}",
        hint.or_else(elsewhere).unwrap_or_default()
    )
}

/// What an option takes, as a TOML value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ValueKind {
    /// A flag: true or false.
    Flag,
    Integer {
        signed: bool,
    },
    /// A real number (an integer is accepted too).
    Number,
    /// Text, parsed by the option (a name, a path; an integer is accepted too, as in
    /// `negatives = 100`).
    Text,
    /// A comma-separated list of non-negative integers on the command line
    /// (`--lr-decay-at 40,50`): an array of integers, or one integer.
    IntegerList,
}

impl ValueKind {
    fn of(arg: &clap::Arg) -> Self {
        // A switch sets its option (`--fresh`) or clears it (`--no-final-elbo`).
        if matches!(
            arg.get_action(),
            clap::ArgAction::SetTrue | clap::ArgAction::SetFalse
        ) {
            return ValueKind::Flag;
        }
        if arg.get_value_delimiter().is_some() {
            return ValueKind::IntegerList;
        }
        let parsed = arg.get_value_parser().type_id();
        let unsigned = [
            TypeId::of::<u64>(),
            TypeId::of::<u32>(),
            TypeId::of::<usize>(),
        ];
        if unsigned.iter().any(|t| parsed == *t) {
            ValueKind::Integer { signed: false }
        } else if parsed == TypeId::of::<i64>() {
            ValueKind::Integer { signed: true }
        } else if parsed == TypeId::of::<f64>() {
            ValueKind::Number
        } else {
            ValueKind::Text
        }
    }

    fn accepts(self, value: &toml::Value) -> bool {
        use toml::Value as V;
        matches!(
            (self, value),
            (ValueKind::Flag, V::Boolean(_))
                | (ValueKind::Integer { .. }, V::Integer(_))
                | (ValueKind::Number, V::Integer(_) | V::Float(_))
                | (ValueKind::Text, V::String(_) | V::Integer(_))
                | (ValueKind::IntegerList, V::Integer(_))
        ) || matches!((self, value), (ValueKind::IntegerList, V::Array(items))
                if items.iter().all(|v| matches!(v, V::Integer(i) if *i >= 0)))
    }

    fn expected(self) -> &'static str {
        match self {
            ValueKind::Flag => "true or false",
            ValueKind::Integer { .. } => "an integer",
            ValueKind::Number => "a number",
            ValueKind::Text => "a string",
            ValueKind::IntegerList => "an array of integers ≥ 0",
        }
    }
}

/// A TOML value's type with the value, for messages (`a string "ten"`).
fn described(value: &toml::Value) -> String {
    match value {
        toml::Value::String(s) => format!("a string {s:?}"),
        toml::Value::Integer(i) => format!("an integer {i}"),
        toml::Value::Float(f) => format!("a number {f}"),
        toml::Value::Boolean(b) => format!("a boolean {b}"),
        toml::Value::Datetime(d) => format!("a date {d}"),
        toml::Value::Array(_) => "an array".into(),
        toml::Value::Table(_) => "a table".into(),
    }
}

/// The spec key of a flag as the parser shows it (`--top-k <TOP_K>` → `top_k`).
fn key_of_flag(shown: &str) -> String {
    let flag = shown.split_whitespace().next().unwrap_or(shown);
    flag.trim_start_matches('-').replace('-', "_")
}

/// The parser's error in the spec's terms, and the key it is about when it names one.
fn parse_problem(e: &clap::Error) -> (String, Option<String>) {
    let key = match e.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(shown)) => Some(key_of_flag(shown)),
        _ => None,
    };
    match (e.kind(), key) {
        (ErrorKind::InvalidValue | ErrorKind::ValueValidation, Some(key)) => {
            let value = match e.get(ContextKind::InvalidValue) {
                Some(ContextValue::String(v)) => v.clone(),
                _ => String::new(),
            };
            let mut problem = format!("{key}: invalid value '{value}'");
            if let Some(ContextValue::Strings(valid)) = e.get(ContextKind::ValidValue) {
                problem += &format!(" (expected one of: {})", valid.join(", "));
            }
            if let Some(source) = std::error::Error::source(e) {
                problem += &format!(": {source}");
            }
            (problem, Some(key))
        }
        (ErrorKind::MissingRequiredArgument, _) => {
            let missing: Vec<String> = missing_keys(e).iter().map(|a| a.join(" or ")).collect();
            (format!("missing key: {}", missing.join(", ")), None)
        }
        (_, key) => (in_spec_terms(&e.to_string()), key),
    }
}

/// The keys a parser error says are missing (none for another error), each as its
/// alternatives: one key, or those of a group of which one is needed (clap shows
/// `<--validation-fraction <F>|--validation-folds <K>>`).
fn missing_keys(e: &clap::Error) -> Vec<Vec<String>> {
    let alternatives = |shown: &String| -> Vec<String> {
        let inner = match shown.starts_with("<-") {
            true => shown.trim_start_matches('<').trim_end_matches('>'),
            false => shown.as_str(),
        };
        inner.split('|').map(key_of_flag).collect()
    };
    match (e.kind(), e.get(ContextKind::InvalidArg)) {
        (ErrorKind::MissingRequiredArgument, Some(ContextValue::Strings(shown))) => {
            shown.iter().map(alternatives).collect()
        }
        _ => Vec::new(),
    }
}

/// The first line of a parser message with `'--flag <VALUE>'` written as `'flag'`.
fn in_spec_terms(message: &str) -> String {
    let line = message.lines().next().unwrap_or_default();
    let mut rest = line.strip_prefix("error: ").unwrap_or(line);
    let mut out = String::new();
    while let Some(start) = rest.find("'--") {
        out.push_str(&rest[..start]);
        let quoted = &rest[start + 1..];
        let Some(end) = quoted.find('\'') else {
            rest = &rest[start..];
            break;
        };
        out.push_str(&format!("'{}'", key_of_flag(&quoted[..end])));
        rest = &quoted[end + 1..];
    }
    out.push_str(rest);
    out
}

/// The ranges a parsed stage's options check (the same `validate` the stage calls),
/// each problem as `[stage] key problem`.
fn range_problems(stage: SpecStage, parsed: &Command) -> Vec<String> {
    let checked: Result<()> = match parsed {
        Command::Synth(a) => SynthConfig::from_options(&a.options()).map(drop),
        Command::Ingest(a) => a.config().map(drop),
        Command::Svd(a) => a.options().validate().map_err(Into::into),
        Command::Train(a) => a.options().validate().map_err(Into::into),
        Command::Predict(a) => a.options().validate().map_err(Into::into),
        Command::Evaluate(a) => a.options(String::new()).validate().map_err(Into::into),
        _ => Ok(()),
    };
    let Err(e) = checked else {
        return Vec::new();
    };
    match e.downcast_ref::<InvalidOptions>() {
        Some(invalid) => invalid
            .problems
            .iter()
            .map(|p| format!("[{stage}] {} {}", p.option.replace('-', "_"), p.problem))
            .collect(),
        None => vec![format!("[{stage}] {e:#}")],
    }
}
