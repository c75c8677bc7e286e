//! `pipeline verify`: runs the workspace check and prints its report.

use std::fs;
use std::path::Path;

use anyhow::{bail, Result};

use super::args::VerifyArgs;
use crate::store::identity::{writable_dir, Refusal};
use crate::store::rebuild::rebuild_catalog;
use crate::store::verify::{check_catalog, Problem, VerifyReport};
use crate::store::workspace::{Workspace, CATALOG_FILE};

/// Checks the catalog file first (a damaged catalog stops there: nothing else can be
/// trusted), then the workspace: read-only, unless `--repair`. A catalog that cannot vouch
/// for the workspace's files (missing, empty, another workspace's, older than the files:
/// `store::identity`) is reported as the one problem, and nothing is touched.
pub fn run(root: &Path, args: &VerifyArgs) -> Result<VerifyReport> {
    let catalog = root.join(CATALOG_FILE);
    if args.rebuild_catalog {
        let rebuilt = rebuild_catalog(root)?;
        for (run, rel) in &rebuilt.restored {
            eprintln!("rebuilt: run {run} from {rel}");
        }
        for line in &rebuilt.not_restored {
            eprintln!("not rebuilt: {line}");
        }
        eprintln!(
            "rebuilt {} with {} runs; checking the workspace against it",
            catalog.display(),
            rebuilt.restored.len()
        );
    }
    let problems = match fs::metadata(&catalog) {
        Ok(m) if m.is_file() && m.len() > 0 => check_catalog(&catalog, writable_dir(root)),
        // Missing or empty: opening says whether that is a new workspace or lost outputs.
        _ => Vec::new(),
    };
    if !problems.is_empty() {
        return Ok(VerifyReport {
            problems,
            ..VerifyReport::default()
        });
    }
    // Only an existing catalog is opened to repair: a missing or empty one is a new
    // workspace or lost outputs, which the read-only open tells apart and refuses.
    let present = fs::metadata(&catalog).is_ok_and(|m| m.len() > 0);
    let opened = if args.repair && present {
        Workspace::open(root)
    } else {
        Workspace::open_read_only(root)
    };
    let ws = match opened {
        Ok(ws) => ws,
        Err(e) => match e.downcast::<Refusal>() {
            Ok(refusal) => {
                return Ok(VerifyReport {
                    problems: vec![Problem {
                        subject: format!("catalog ({})", catalog.display()),
                        run: None,
                        path: None,
                        problem: refusal.to_string(),
                    }],
                    ..VerifyReport::default()
                })
            }
            Err(e) => return Err(e),
        },
    };
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
    if report.problems.iter().all(Problem::concerns_catalog) {
        bail!(
            "the catalog cannot be used as it is (above); 'pipeline verify --repair' cannot \
             rebuild it, and changed nothing"
        );
    }
    if repaired {
        bail!(
            "{n} problem(s) found and repaired where possible; run the spec again ('pipeline \
             run SPEC.toml') to recompute what was removed"
        );
    }
    bail!("{n} problem(s) found; run 'pipeline verify --repair'")
}
