//! Every spec shipped in `pipelines/` is one a user can run: it passes the same whole-spec
//! check `pipeline run` makes before any stage (tables, keys, types, ranges, the stages'
//! own `validate()`), and the input files its `[ingest]` table names exist when the shared
//! data sets sit beside the repository (as in CI). A spec written by hand for an experiment
//! and never run until hours later would otherwise fail only then.

use std::path::{Path, PathBuf};

use fsgp::cli::spec::Spec;

/// Every `*.toml` under `dir`, recursively, sorted.
fn specs_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "toml") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// The `[ingest]` input files of a spec, resolved against its directory; none for a spec
/// whose `[synth]` table generates them.
fn ingest_inputs(path: &Path) -> Vec<PathBuf> {
    let table: toml::Table = toml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    if table.contains_key("synth") {
        return Vec::new();
    }
    let Some(ingest) = table.get("ingest").and_then(|t| t.as_table()) else {
        return Vec::new();
    };
    let base = path.parent().unwrap();
    ["train", "test", "data"]
        .iter()
        .filter_map(|key| ingest.get(*key).and_then(|v| v.as_str()))
        .map(|file| base.join(file))
        .collect()
}

#[test]
fn every_shipped_spec_passes_the_run_check() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let specs = specs_under(&root.join("pipelines"));
    assert!(specs.len() >= 20, "found only {} specs", specs.len());
    let failures: Vec<String> = specs
        .iter()
        .filter_map(|spec| Spec::read(spec).err().map(|e| format!("{e:#}")))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_shipped_spec_names_input_files_that_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    if !root.join("../shared/data").is_dir() {
        eprintln!("skipped: ../shared/data is not beside the repository");
        return;
    }
    let specs = specs_under(&root.join("pipelines"));
    let missing: Vec<String> = specs
        .iter()
        .flat_map(|spec| {
            ingest_inputs(spec)
                .into_iter()
                .filter(|file| !file.exists())
                .map(move |file| format!("{}: {}", spec.display(), file.display()))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "missing inputs:\n{}",
        missing.join("\n")
    );
}
