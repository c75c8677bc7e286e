//! `docs/options.md` against the binary: the option reference there is the `--help` of
//! `pipeline` and of each of its subcommands, written out by this module, so it cannot
//! drift from the one definition of the options (the clap structs in `src/cli/args.rs`).
//!
//! The file has two parts, split by [`MARKER`]: above it a hand-written introduction and
//! notes that `--help` does not hold (kept as it is), below it the generated reference.
//! When the help changes, regenerate the file with
//!
//! ```sh
//! FSGP_BLESS=1 cargo test --test it options_doc
//! ```

use std::path::PathBuf;
use std::process::Command;

use crate::common::pipeline_bin;

/// The line that ends the hand-written part; everything after it is generated.
const MARKER: &str = "<!-- Generated below this line from `pipeline --help` by tests/it/options_doc.rs; do not edit it by hand. Regenerate: FSGP_BLESS=1 cargo test --test it options_doc -->";

/// The command that rewrites the generated part.
const BLESS: &str = "FSGP_BLESS=1 cargo test --test it options_doc";

fn doc_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/options.md")
}

/// `pipeline ARGS... --help`, with each line's trailing blanks removed (clap pads options
/// without a help text; an editor would strip them from the Markdown).
fn help(args: &[&str]) -> String {
    let out = Command::new(pipeline_bin())
        .args(args)
        .arg("--help")
        // The help shows the variable's value when it is set, colours when forced, and
        // (were clap's `wrap_help` turned on) wraps at $COLUMNS.
        .env_remove("FSGP_WORKSPACE")
        .env_remove("CLICOLOR_FORCE")
        .env_remove("COLUMNS")
        .env("NO_COLOR", "1")
        .output()
        .expect("running pipeline --help");
    assert!(
        out.status.success(),
        "pipeline {args:?} --help failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("help is UTF-8");
    let mut lines: Vec<&str> = text.lines().map(str::trim_end).collect();
    while lines.last() == Some(&"") {
        lines.pop();
    }
    lines.join("\n")
}

/// The subcommands a help text lists under `Commands:`, but `help` itself.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| !l.is_empty())
        // A listed command starts two spaces in; a wrapped description further in.
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

/// Every command path, depth first: `[]` (the binary), then each subcommand and its own.
fn command_paths(prefix: &[String], out: &mut Vec<(Vec<String>, String)>) {
    let args: Vec<&str> = prefix.iter().map(String::as_str).collect();
    let text = help(&args);
    let subs = subcommands(&text);
    out.push((prefix.to_vec(), text));
    for sub in subs {
        let mut path = prefix.to_vec();
        path.push(sub);
        command_paths(&path, out);
    }
}

/// A heading's GitHub anchor for `## \`pipeline a b\``: lower case, spaces to hyphens,
/// punctuation dropped.
fn anchor(title: &str) -> String {
    title
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The generated part: an index, then one heading and one fenced block per command.
fn generated() -> String {
    let mut commands = Vec::new();
    command_paths(&[], &mut commands);
    let titles: Vec<String> = commands
        .iter()
        .map(|(path, _)| {
            std::iter::once("pipeline")
                .chain(path.iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let mut md = String::from("\n## Every command's `--help`\n\n");
    let index: Vec<String> = titles
        .iter()
        .map(|t| format!("[`{t}`](#{})", anchor(t)))
        .collect();
    md.push_str(&index.join(" · "));
    md.push('\n');
    for (title, (_, text)) in titles.iter().zip(&commands) {
        assert!(
            !text.contains("```"),
            "the help of `{title}` holds a code fence, which would end its block early"
        );
        md.push_str(&format!("\n### `{title}`\n\n```text\n{text}\n```\n"));
    }
    md
}

/// The hand-written part of `doc`, up to and with the marker line.
fn hand_written(doc: &str) -> Option<&str> {
    let at = doc.find(MARKER)?;
    Some(&doc[..at + MARKER.len()])
}

#[test]
fn options_doc_matches_help() {
    let path = doc_path();
    let doc = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let hand = hand_written(&doc).unwrap_or_else(|| {
        panic!(
            "{} lacks the line that starts its generated part; put it back after the \
             hand-written notes:\n{MARKER}",
            path.display()
        )
    });
    let want = format!("{hand}\n{}", generated());
    if std::env::var_os("FSGP_BLESS").is_some() {
        if doc != want {
            std::fs::write(&path, &want).expect("writing docs/options.md");
            eprintln!("rewrote {} from the binary's --help", path.display());
        }
        return;
    }
    if doc != want {
        let first = doc
            .lines()
            .zip(want.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| doc.lines().count().min(want.lines().count()));
        let line = |s: &str| s.lines().nth(first).unwrap_or("(end of file)").to_string();
        panic!(
            "docs/options.md is not the binary's current --help (first difference at line {}):\n  \
             file: {}\n  help: {}\nRegenerate it with `{BLESS}` and commit the result.",
            first + 1,
            line(&doc),
            line(&want),
        );
    }
}

#[test]
fn subcommands_are_read_from_the_commands_list() {
    let text = "Usage: pipeline [OPTIONS] <COMMAND>\n\nCommands:\n  synth     Generate\n  \
                verify    Check the workspace\n            wrapped\n  help      Print this\n\n\
                Options:\n  -h, --help  Print help";
    assert_eq!(subcommands(text), ["synth", "verify"]);
    assert_eq!(anchor("pipeline verify"), "pipeline-verify");
}
