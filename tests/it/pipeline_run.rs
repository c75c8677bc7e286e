//! `pipeline run SPEC.toml` end to end on a generated dataset (synth → ingest → svd → train
//! → predict → evaluate), then: every stage cached on a second invocation; predictions equal
//! a brute-force full scoring and full sort; `pipeline evaluate` equal to an independent
//! computation of the metrics; `pipeline report` writing real charts; and a run killed
//! during training and re-invoked ending with the same metrics as an uninterrupted one.

use crate::common;
use common::toy::{catalog, newest_run};
use common::*;
use fsgp::store::checkpoint::read_checkpoint;
use fsgp::store::chunks::read_chunk;
use fsgp::store::npy::NpyMap;
use fsgp::store::predictions::PredictionReader;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A spec for a small generated dataset; `epochs` sets the length of training.
fn spec(dir: &Path, epochs: u32) -> PathBuf {
    let text = toy_spec(
        epochs.into(),
        "eval_every = 2\n",
        "top_k = 7\nprobabilities = true\n",
    );
    let path = dir.join("toy.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn run_spec(ws: &Path, spec: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["run", spec.to_str().unwrap()];
    args.extend(extra);
    pipeline(ws, &args)
}

fn one_path(ws: &Path, sql: &str, run: i64) -> PathBuf {
    let rel: String = catalog(ws).query_row(sql, [run], |r| r.get(0)).unwrap();
    ws.join(rel)
}

/// Scores of every label for one test row by plain loops in f64 (linear kernel):
/// f_k = Σ_p Φ_kp Σ_m σ_f² (x·X̃ᵀ A ᵀ)_m μ_mp + b_k.
fn brute_force_scores(
    params: &fsgp::model::params::Params,
    basis: &ndarray::ArrayView2<'_, f32>,
    indices: &[u32],
    values: &[f32],
) -> Vec<f64> {
    let r = basis.nrows();
    let kxx: Vec<f64> = (0..r)
        .map(|q| {
            indices
                .iter()
                .zip(values)
                .map(|(&j, &v)| v as f64 * basis[(q, j as usize)] as f64)
                .sum()
        })
        .collect();
    let sf2 = params.kernel.log_sf2.exp();
    let (m, p_count) = (params.q.mu().nrows(), params.q.mu().ncols());
    let k_z: Vec<f64> = (0..m)
        .map(|mm| sf2 * (0..r).map(|q| kxx[q] * params.a[(mm, q)]).sum::<f64>())
        .collect();
    let mean: Vec<f64> = (0..p_count)
        .map(|p| (0..m).map(|mm| k_z[mm] * params.q.mu()[(mm, p)]).sum())
        .collect();
    (0..params.phi.nrows())
        .map(|k| {
            params.bias[k]
                + (0..p_count)
                    .map(|p| params.phi[(k, p)] * mean[p])
                    .sum::<f64>()
        })
        .collect()
}

/// P@k and nDCG@k of one ranked list against a truth set, straight from the definitions.
fn row_metrics(ranked: &[u32], truth: &[u32], k: usize) -> (f64, f64) {
    let hit = |l: &u32| truth.contains(l);
    let p = ranked.iter().take(k).filter(|l| hit(l)).count() as f64 / k as f64;
    let dcg: f64 = ranked
        .iter()
        .take(k)
        .enumerate()
        .filter(|(_, l)| hit(l))
        .map(|(i, _)| 1.0 / ((i + 2) as f64).log2())
        .sum();
    let idcg: f64 = (0..truth.len().min(k))
        .map(|i| 1.0 / ((i + 2) as f64).log2())
        .sum();
    (p, if idcg > 0.0 { dcg / idcg } else { 0.0 })
}

#[test]
fn spec_runs_end_to_end_then_is_cached_and_checks_out() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let spec = spec(dir.path(), 6);
    let first = run_spec(&ws, &spec, &[]);
    assert!(first.status.success(), "{}", stderr(&first));
    let table = stdout(&first);
    for row in ["P ", "nDCG ", "PSP ", "PSnDCG ", "coverage "] {
        assert!(
            table.lines().any(|l| l.starts_with(row)),
            "no {row}row: {table}"
        );
    }

    // Second invocation: every stage cached, same table, quickly.
    let t = Instant::now();
    let second = run_spec(&ws, &spec, &[]);
    assert!(second.status.success(), "{}", stderr(&second));
    let log = stderr(&second);
    for stage in ["synth", "ingest", "svd", "train", "predict", "evaluate"] {
        let line = log
            .lines()
            .find(|l| l.starts_with(stage) && l.contains("cached"))
            .unwrap_or_else(|| panic!("{stage} not cached:\n{log}"));
        assert!(!line.is_empty());
    }
    assert_eq!(stdout(&second), table);
    assert!(t.elapsed() < Duration::from_secs(20));

    // Predictions against a brute-force full scoring and full sort by the mean (the order
    // also with probabilities, as docs/formats.md says).
    let train_run = newest_run(&ws, "train");
    let predict_run = newest_run(&ws, "predict");
    let ckpt_path = one_path(
        &ws,
        "SELECT path FROM checkpoints WHERE stage_run_id = ?1 ORDER BY step DESC LIMIT 1",
        train_run,
    );
    let params = read_checkpoint(&ckpt_path).unwrap().params;
    let svd_run = newest_run(&ws, "svd");
    let basis_map = NpyMap::open(&one_path(
        &ws,
        "SELECT path FROM artifacts WHERE stage_run_id = ?1 AND kind = 'basis'",
        svd_run,
    ))
    .unwrap();
    let basis = basis_map.view2::<f32>().unwrap();
    let pred_path = one_path(
        &ws,
        "SELECT path FROM artifacts WHERE stage_run_id = ?1 AND kind = 'predictions'",
        predict_run,
    );
    let reader = PredictionReader::open(&pred_path).unwrap();
    assert!(reader.columns.probabilities);
    let predicted: Vec<_> = reader.map(|b| b.unwrap()).collect();
    let conn = catalog(&ws);
    let mut stmt = conn
        .prepare(
            "SELECT a.path FROM artifacts a JOIN datasets d ON a.dataset_id = d.id \
             WHERE a.kind = 'chunk' AND a.split = 'test' ORDER BY a.id",
        )
        .unwrap();
    let chunk_paths: Vec<String> = stmt
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    let mut truth_rows = Vec::new();
    for p in &chunk_paths {
        let c = read_chunk(&ws.join(p)).unwrap();
        for i in 0..c.len() {
            let row = c.row(i);
            truth_rows.push((
                row.row_id,
                row.labels.to_vec(),
                brute_force_scores(&params, &basis, row.indices, row.values),
            ));
        }
    }
    let mut rows_seen = 0;
    let (mut p_sum, mut ndcg_sum) = ([0.0f64; 5], [0.0f64; 5]);
    for block in &predicted {
        for i in 0..block.len() {
            let (row_id, truth, scores) = &truth_rows[rows_seen];
            rows_seen += 1;
            assert_eq!(block.row_ids[i], *row_id);
            let mut order: Vec<u32> = (0..scores.len() as u32).collect();
            order.sort_by(|&a, &b| {
                scores[b as usize]
                    .total_cmp(&scores[a as usize])
                    .then(a.cmp(&b))
            });
            let got = block.labels(i);
            assert_eq!(got.len(), 7);
            let spread = scores.iter().fold(0.0f64, |m, s| m.max(s.abs())).max(1.0);
            for (r, (&g, &want)) in got.iter().zip(&order).enumerate() {
                // Only a near-tie (f32 projection vs f64 here) may swap two labels.
                let (sg, sw) = (scores[g as usize], scores[want as usize]);
                assert!(
                    g == want || (sg - sw).abs() <= 1e-5 * spread,
                    "row {row_id} rank {r}: predicted {g} ({sg}), brute force {want} ({sw})"
                );
                let stored = block.scores(i)[r] as f64;
                assert!((stored - sg).abs() <= 1e-4 * spread, "{stored} vs {sg}");
            }
            for &pr in block.probabilities(i).unwrap() {
                assert!(pr > 0.0 && pr < 1.0, "probability {pr}");
            }
            for k in 1..=5 {
                let (p, n) = row_metrics(got, truth, k);
                p_sum[k - 1] += p;
                ndcg_sum[k - 1] += n;
            }
        }
    }
    assert_eq!(rows_seen, truth_rows.len());

    // `pipeline evaluate` (cached from the run) against the same metrics computed here.
    let out = pipeline(
        &ws,
        &[
            "evaluate",
            "--predictions",
            pred_path.to_str().unwrap(),
            "--json",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("already computed"),
        "{}",
        stderr(&out)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let n = rows_seen as f64;
    for k in 1..=5 {
        let p = json["p_at"][k - 1].as_f64().unwrap();
        let nd = json["ndcg_at"][k - 1].as_f64().unwrap();
        assert!(
            (p - p_sum[k - 1] / n).abs() < 1e-12,
            "P@{k}: {p} vs {}",
            p_sum[k - 1] / n
        );
        assert!((nd - ndcg_sum[k - 1] / n).abs() < 1e-12, "nDCG@{k}");
    }
    assert!(json["p_at"][0].as_f64().unwrap() > 0.0);

    // Per-epoch held-out metrics were recorded (every 2 epochs: 2, 4, 6).
    let epochs: Vec<i64> = conn
        .prepare("SELECT step FROM metrics WHERE stage_run_id = ?1 AND name = 'P@1' ORDER BY step")
        .unwrap()
        .query_map([train_run], |r| r.get(0))
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(epochs, vec![2, 4, 6]);

    // The report: real PNG and SVG charts and a summary naming the evaluation.
    let out = pipeline(&ws, &["report", "--run", &train_run.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report = ws.join(format!("reports/train-run{train_run}"));
    for chart in ["elbo", "metrics", "coverage"] {
        let png = std::fs::read(report.join(format!("{chart}.png"))).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        assert!(png.len() > 5_000, "{chart}.png is only {} bytes", png.len());
        let svg = std::fs::read_to_string(report.join(format!("{chart}.svg"))).unwrap();
        assert!(
            svg.contains("<svg") && svg.contains("<polyline"),
            "{chart}.svg"
        );
    }
    let svg = |chart: &str| std::fs::read_to_string(report.join(format!("{chart}.svg"))).unwrap();
    legend_beside_curves_in_safe_colours(&svg("metrics"), &["P@1", "P@5", "nDCG@5", "PSP@5"]);
    legend_beside_curves_in_safe_colours(&svg("coverage"), &["coverage@1", "coverage@5"]);
    let md = std::fs::read_to_string(report.join("README.md")).unwrap();
    assert!(md.contains("| 1 |") && md.contains("elbo.png"), "{md}");
    assert!(
        md.contains("coverage.png") && md.contains("coverage@k |"),
        "{md}"
    );
}

/// The Okabe–Ito colours the charts draw their series in.
const OKABE_ITO: [&str; 8] = [
    "#000000", "#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7",
];

/// In a chart's SVG: every curve (a 2-px polyline of more than 2 points) is drawn in an
/// Okabe–Ito colour other than its pale yellow, and the legend entries `names` stand right
/// of every point of every curve, so the legend hides none of them.
fn legend_beside_curves_in_safe_colours(svg: &str, names: &[&str]) {
    let attr = |line: &str, key: &str| -> Option<String> {
        let at = line.find(&format!(" {key}=\""))? + key.len() + 3;
        let len = line[at..].find('"')?;
        Some(line[at..at + len].to_string())
    };
    let lines: Vec<&str> = svg.lines().collect();
    let mut rightmost = f64::MIN;
    let mut curves = 0;
    for l in lines.iter().filter(|l| l.starts_with("<polyline")) {
        if attr(l, "stroke-width").as_deref() != Some("2") {
            continue;
        }
        let xs: Vec<f64> = attr(l, "points")
            .unwrap()
            .split_whitespace()
            .map(|p| p.split(',').next().unwrap().parse().unwrap())
            .collect();
        if xs.len() > 2 {
            curves += 1;
            let colour = attr(l, "stroke").unwrap();
            assert!(
                OKABE_ITO.contains(&colour.as_str()) && colour != "#F0E442",
                "curve colour {colour}"
            );
            rightmost = xs.iter().fold(rightmost, |m, &x| m.max(x));
        }
    }
    assert!(curves >= names.len(), "{curves} curves");
    for name in names {
        let at = lines
            .iter()
            .position(|l| l.trim() == *name)
            .unwrap_or_else(|| panic!("no legend entry {name}"));
        let x: f64 = attr(lines[at - 1], "x").unwrap().parse().unwrap();
        assert!(
            x > rightmost,
            "legend entry {name} at x = {x}, a curve reaches {rightmost}"
        );
    }
}

/// Kills `pipeline run` once training has written a checkpoint, re-invokes it, and compares
/// the final metrics with an uninterrupted run in another workspace.
#[test]
fn killed_run_resumes_and_ends_with_the_same_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(dir.path(), 40);
    let reference = dir.path().join("reference");
    let out = run_spec(&reference, &spec, &["--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let expected = stdout(&out);

    let ws = dir.path().join("ws");
    let mut child = Command::new(pipeline_bin())
        .arg("--workspace")
        .arg(&ws)
        .args(["run", spec.to_str().unwrap(), "--json"])
        .env_remove("FSGP_WORKSPACE")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let killed_in_training = loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("finished ({status}) before training wrote a checkpoint");
        }
        let checkpoints: i64 = rusqlite::Connection::open(ws.join("catalog.sqlite"))
            .ok()
            .and_then(|c| {
                c.query_row("SELECT count(*) FROM checkpoints", [], |r| r.get(0))
                    .ok()
            })
            .unwrap_or(0);
        if checkpoints >= 2 {
            child.kill().unwrap();
            child.wait().unwrap();
            break true;
        }
        assert!(Instant::now() < deadline, "training never checkpointed");
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(killed_in_training);
    let out = run_spec(&ws, &spec, &["--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("interrupted; resuming"),
        "{}",
        stderr(&out)
    );
    assert_eq!(stdout(&out), expected);
}
