//! `pipeline status`: what the workspace holds, as tables or JSON.

use anyhow::Result;

use super::args::StatusArgs;
use crate::store::catalog::ArtifactKind;
use crate::store::workspace::Workspace;

fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Prints the workspace's datasets, derived artifacts and recent stage runs.
pub fn print(ws: &Workspace, args: &StatusArgs) -> Result<()> {
    let datasets = ws.catalog.datasets()?;
    let runs = ws.catalog.runs(args.runs)?;
    let artifacts = ws.catalog.artifacts(None)?;
    if args.json {
        let doc = serde_json::json!({
            "workspace": ws.root().display().to_string(),
            "datasets": datasets,
            "runs": runs,
            "artifacts": { "count": artifacts.len(), "bytes": artifacts.iter().map(|a| a.bytes).sum::<u64>() },
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!("workspace {}", ws.root().display());
    println!();
    println!("datasets ({})", datasets.len());
    if !datasets.is_empty() {
        println!(
            "  {:<20} {:<8} {:>6} {:>8} {:<6} {:>10} {:>12} {:>7} {:>10}",
            "name", "format", "D", "L", "split", "rows", "nnz", "chunks", "size"
        );
    }
    for d in &datasets {
        for (i, s) in d.splits.iter().enumerate() {
            let bytes: u64 = artifacts
                .iter()
                .filter(|a| a.path.starts_with(&format!("{}/", s.path)))
                .map(|a| a.bytes)
                .sum();
            let (name, format, dd, ll) = if i == 0 {
                (
                    d.name.as_str(),
                    d.format.as_str(),
                    d.n_features.to_string(),
                    d.n_labels.to_string(),
                )
            } else {
                ("", "", String::new(), String::new())
            };
            println!(
                "  {:<20} {:<8} {:>6} {:>8} {:<6} {:>10} {:>12} {:>7} {:>10}",
                name,
                format,
                dd,
                ll,
                s.split,
                s.n_rows,
                s.nnz,
                s.n_chunks,
                human_bytes(bytes)
            );
        }
    }
    // Derived artifacts grouped by the directory (one stage run) holding them.
    let mut groups: Vec<(String, Vec<&str>, u64)> = Vec::new();
    for a in artifacts.iter().filter(|a| a.kind != ArtifactKind::Chunk) {
        let dir = a.path.rsplit_once('/').map_or("", |(d, _)| d).to_string();
        match groups.iter_mut().find(|g| g.0 == dir) {
            Some(g) => {
                g.1.push(a.kind.as_str());
                g.2 += a.bytes;
            }
            None => groups.push((dir, vec![a.kind.as_str()], a.bytes)),
        }
    }
    if !groups.is_empty() {
        println!();
        println!("derived artifacts ({} sets)", groups.len());
        for (dir, kinds, bytes) in &groups {
            println!(
                "  {:<36} {:>10}  {}",
                dir,
                human_bytes(*bytes),
                kinds.join(", ")
            );
        }
    }
    println!();
    println!("recent stage runs ({})", runs.len());
    for r in &runs {
        let err = r
            .error
            .as_deref()
            .map(|e| format!("  {}", e.lines().next().unwrap_or("")))
            .unwrap_or_default();
        println!(
            "  #{:<5} {:<8} {:<11} {}{}",
            r.id, r.stage, r.status, r.started_at, err
        );
    }
    Ok(())
}
