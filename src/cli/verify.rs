//! `pipeline verify`: runs the workspace check and prints its report.

use std::path::Path;

use anyhow::{bail, Result};

use super::args::VerifyArgs;
use crate::store::verify::{check_catalog, VerifyReport};
use crate::store::workspace::Workspace;

/// Checks the catalog file first (a damaged catalog stops there: nothing else can be
/// trusted), then the workspace.
pub fn run(root: &Path, args: &VerifyArgs) -> Result<VerifyReport> {
    let catalog = root.join("catalog.sqlite");
    if !catalog.is_file() {
        bail!(
            "no workspace at {} (no catalog.sqlite); give --workspace DIR",
            root.display()
        );
    }
    let problems = check_catalog(&catalog);
    if !problems.is_empty() {
        return Ok(VerifyReport {
            problems,
            ..VerifyReport::default()
        });
    }
    let ws = Workspace::open(root)?;
    crate::store::verify::run(&ws, args.options())
}

fn human_bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 30 => format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b => format!("{b} B"),
    }
}

/// One line per problem and per repair (stderr), and a summary; or the JSON report on
/// stdout.
pub fn print(report: &VerifyReport, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
        return Ok(());
    }
    for p in &report.problems {
        eprintln!("{p}");
    }
    for r in &report.repaired {
        eprintln!("repaired: {r}");
    }
    eprintln!(
        "checked {} artifacts and {} checkpoints ({} hashed in {:.2} s): {}",
        report.artifacts,
        report.checkpoints,
        human_bytes(report.bytes_hashed),
        report.seconds,
        match report.problems.len() {
            0 => "no problems".to_string(),
            1 => "1 problem".to_string(),
            n => format!("{n} problems"),
        }
    );
    Ok(())
}

/// The exit status: an error when anything was wrong, repaired or not.
pub fn outcome(report: &VerifyReport, repaired: bool) -> Result<()> {
    let n = report.problems.len();
    if n == 0 {
        return Ok(());
    }
    if repaired {
        bail!(
            "{n} problem(s) found and repaired where possible; run the spec again ('pipeline \
             run SPEC.toml') to recompute what was removed"
        );
    }
    bail!("{n} problem(s) found; run 'pipeline verify --repair'")
}
