//! `pipeline report --run RUN`: charts (PNG and SVG) of a training run's ELBO per epoch and
//! of the held-out metrics and coverage@k it recorded per epoch (`pipeline train
//! --eval-every`), a reliability diagram per evaluation of its predictions that measured
//! calibration (from the bins its `metrics.json` stores), for a binary run on 2-D inputs
//! its decision boundary with the inducing inputs over the data ([`boundary`]), and a
//! Markdown summary of the run (data, parameters, timings, metrics) beside them.
//!
//! Everything comes from the catalog; the report is a view, rebuilt on every call: drawn
//! into a staging directory, then its files moved into place by name
//! (`store::user_file::OwnFiles`), so nothing else in the directory is touched.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, ensure, Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

pub mod boundary;
mod chart;

use crate::metrics::calibration::Calibration;
use crate::metrics::evaluation::Evaluation;
use crate::metrics::names::{is_at_k, split_at_k, AtK, Figure};
use crate::store::catalog::{ArtifactKind, MetricRow, RunRow, RunStatus, Split, StageKind};
use crate::store::user_file::{lies_within, OwnFiles};
use crate::store::workspace::Workspace;
use chart::{draw_both, ChartArea, PALETTE};

/// Where `pipeline report` put its files.
#[derive(Debug, Clone)]
pub struct ReportOutcome {
    pub dir: PathBuf,
    pub files: Vec<String>,
}

/// A named series of (x, y) points.
type Series = (String, Vec<(f64, f64)>);

/// Files this report writes a chart to, without extension.
const ELBO_CHART: &str = "elbo";
const METRICS_CHART: &str = "metrics";
const COVERAGE_CHART: &str = "coverage";

/// The held-out measures the metrics chart draws, in legend order.
const METRICS_CHART_SERIES: [(AtK, usize); 7] = [
    (AtK::P, 1),
    (AtK::P, 3),
    (AtK::P, 5),
    (AtK::Ndcg, 3),
    (AtK::Ndcg, 5),
    (AtK::Psp, 1),
    (AtK::Psp, 5),
];
/// The measures the coverage chart draws.
const COVERAGE_CHART_SERIES: [(AtK, usize); 3] =
    [(AtK::Coverage, 1), (AtK::Coverage, 3), (AtK::Coverage, 5)];

/// Width in pixels of the legend column right of the plotting area.
const LEGEND_WIDTH: u32 = 150;

/// The workspace's directory of reports; the only one inside the workspace a report
/// is written to.
const REPORTS_DIR: &str = "reports";

/// Runs `pipeline report`.
/// `out` defaults to `<workspace>/reports/train-run<RUN>`, where an earlier report's files
/// are replaced; in a directory the user names, a file of the report's names is replaced
/// only when `force` (`store::user_file::OwnFiles`). No other file is touched either way.
pub fn run(ws: &Workspace, run: i64, out: Option<&Path>, force: bool) -> Result<ReportOutcome> {
    let train = ws.run_numbered(run, StageKind::Train)?;
    ensure!(
        train.stage == StageKind::Train,
        "run {run} is a {} run; reports are of training runs",
        train.stage
    );
    let (dir, replace) = match out {
        Some(dir) => {
            check_outside_stages(ws, dir)?;
            (dir.to_path_buf(), force)
        }
        None => (
            ws.resolve(&format!("{REPORTS_DIR}/train-run{}", train.id)),
            true,
        ),
    };
    let output = OwnFiles::prepare(&dir, report_file_names(ws, &train)?, replace)?;
    let files = write_report(ws, &train, output.staging())?;
    output.publish(&files)?;
    crate::progress::note(format!("report of run {} in {}", train.id, dir.display()));
    Ok(ReportOutcome { dir, files })
}

/// Refuses an `--out` in the workspace but under its `reports/`: the stages' directories
/// are the catalog's (a file it does not know there is an orphan `verify --repair`
/// removes), and the catalog beside them is no place for charts either.
fn check_outside_stages(ws: &Workspace, dir: &Path) -> Result<()> {
    let reports = ws.resolve(REPORTS_DIR);
    if lies_within(dir, ws.root())? && !lies_within(dir, &reports)? {
        bail!(
            "--out {}: inside the workspace {}, whose directories are its runs'; give a              directory outside it, or under {} (nothing was written)",
            dir.display(),
            ws.root().display(),
            reports.display()
        );
    }
    Ok(())
}

/// Every file name a report of `train` may write, known before anything is drawn: the
/// charts it draws when their data is there, and the summary.
fn report_file_names(ws: &Workspace, train: &RunRow) -> Result<Vec<String>> {
    let mut stems = vec![
        ELBO_CHART.to_string(),
        METRICS_CHART.to_string(),
        COVERAGE_CHART.to_string(),
        boundary::STEM.to_string(),
    ];
    for (eval_run, ..) in linked_evaluations(ws, train.id)? {
        stems.push(reliability_stem(eval_run));
    }
    let mut names: Vec<String> = stems.iter().flat_map(|s| chart_files(s)).collect();
    names.push(SUMMARY_FILE.to_string());
    Ok(names)
}

/// The two files a chart is drawn to ([`draw_both`]).
fn chart_files(stem: &str) -> [String; 2] {
    [format!("{stem}.png"), format!("{stem}.svg")]
}

/// The Markdown summary beside the charts.
const SUMMARY_FILE: &str = "README.md";

/// Writes the charts and the summary into `dir`; returns the file names.
fn write_report(ws: &Workspace, train: &RunRow, dir: &Path) -> Result<Vec<String>> {
    let metrics = ws.catalog.metrics(train.id)?;
    let font = register_font()?;

    let mut files = Vec::new();
    let elbo = elbo_series(&metrics);
    ensure!(
        !elbo.1.is_empty(),
        "run {} recorded no epoch yet: nothing to plot",
        train.id
    );
    draw_both(dir, ELBO_CHART, |area| {
        line_chart(
            area,
            font,
            "Mean minibatch ELBO per epoch",
            "epoch",
            "ELBO",
            std::slice::from_ref(&elbo),
        )
    })?;
    files.extend(chart_files(ELBO_CHART));
    let per_epoch = metric_series(&metrics, &METRICS_CHART_SERIES);
    let split = per_epoch_split(&metrics);
    if !per_epoch.is_empty() {
        let title = format!("Held-out metrics per epoch ({split})");
        draw_both(dir, METRICS_CHART, |area| {
            line_chart(area, font, &title, "epoch", "%", &per_epoch)
        })?;
        files.extend(chart_files(METRICS_CHART));
    }
    let coverage = metric_series(&metrics, &COVERAGE_CHART_SERIES);
    if !coverage.is_empty() {
        let title = format!("Held-out coverage@k per epoch ({split})");
        draw_both(dir, COVERAGE_CHART, |area| {
            line_chart(area, font, &title, "epoch", "% of labels", &coverage)
        })?;
        files.extend(chart_files(COVERAGE_CHART));
    }
    let mut reliability = Vec::new();
    for (eval_run, split, _, _) in linked_evaluations(ws, train.id)? {
        let Some(calibration) = stored_calibration(ws, eval_run)? else {
            continue;
        };
        let stem = reliability_stem(eval_run);
        let title = format!(
            "Reliability, evaluate run {eval_run} on {split} (ECE {:.2} %, {} bins)",
            100.0 * calibration.ece,
            calibration.bins
        );
        draw_both(dir, &stem, |area| {
            reliability_chart(area, font, &title, &calibration)
        })?;
        files.extend(chart_files(&stem));
        reliability.push(eval_run);
    }
    let boundary = boundary::write_chart(ws, train, dir, font)?;
    if let boundary::Boundary::Drawn { .. } = boundary {
        files.extend(chart_files(boundary::STEM));
    }
    let charts = Charts {
        metrics: !per_epoch.is_empty(),
        coverage: !coverage.is_empty(),
        reliability,
        boundary,
    };
    let summary = summary_markdown(ws, train, &metrics, charts)?;
    std::fs::write(dir.join(SUMMARY_FILE), summary)?;
    files.push(SUMMARY_FILE.into());
    Ok(files)
}

/// The charts' font when `FSGP_FONT` is not set: Roboto Regular (Apache-2.0; the file and its
/// licence are in `assets/fonts/`), compiled into the binary so that a fresh machine needs no
/// system font to draw a report.
const BUNDLED_FONT: &[u8] = include_bytes!("../assets/fonts/Roboto-Regular.ttf");

/// Registers a TrueType font for the charts' text: the file named by `FSGP_FONT` if set, else
/// the bundled Roboto Regular. Returns the family name to ask for.
fn register_font() -> Result<&'static str> {
    let (bytes, origin): (&'static [u8], String) = match std::env::var_os("FSGP_FONT") {
        Some(path) => {
            let path = PathBuf::from(path);
            let bytes =
                std::fs::read(&path).with_context(|| format!("reading font {}", path.display()))?;
            // plotters keeps registered fonts for the life of the process.
            (
                Box::leak(bytes.into_boxed_slice()),
                path.display().to_string(),
            )
        }
        None => (BUNDLED_FONT, "the bundled Roboto Regular".to_string()),
    };
    plotters::style::register_font("fsgp", FontStyle::Normal, bytes)
        .map_err(|_| anyhow!("{origin}: not a usable TrueType font"))?;
    Ok("fsgp")
}

fn line_chart(
    area: &ChartArea,
    font: &str,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> Result<()> {
    match area {
        ChartArea::Bitmap(a) => plot_lines(a, font, title, x_label, y_label, series),
        ChartArea::Svg(a) => plot_lines(a, font, title, x_label, y_label, series),
    }
}

/// A line chart of `series` with axes fitted to the data, every point marked (short runs
/// have few epochs), and, when there are several series, a legend in a column of its own
/// right of the plotting area so that it never hides a curve.
fn plot_lines<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    font: &str,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing {title}: {e:?}");
    area.fill(&WHITE).map_err(err)?;
    let (plot_area, legend_area) = if series.len() > 1 {
        let width = area.dim_in_pixel().0;
        let (plot, legend) = area.split_horizontally(width.saturating_sub(LEGEND_WIDTH));
        (plot, Some(legend))
    } else {
        (area.clone(), None)
    };
    let points = series.iter().flat_map(|s| s.1.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in points {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    let pad = ((y1 - y0).abs() * 0.05).max(1e-9 * y1.abs().max(1.0));
    let (y0, y1) = (y0 - pad, y1 + pad);
    let mut chart = ChartBuilder::on(&plot_area)
        .caption(title, (font, 26))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(96)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .label_style((font, 15))
        .axis_desc_style((font, 17))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format_tick(*v))
        .draw()
        .map_err(err)?;
    for (i, (_, pts)) in series.iter().enumerate() {
        let color = series_color(i);
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(err)?;
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(err)?;
    }
    if let Some(legend) = legend_area {
        draw_legend(&legend, font, series).map_err(err)?;
    }
    Ok(())
}

fn series_color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// One legend entry per series (a stroke with its marker, then the name), top to bottom,
/// starting level with the top of the plotting area.
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    font: &str,
    series: &[Series],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let (top, row_height) = (72, 26);
    for (i, (name, _)) in series.iter().enumerate() {
        let color = series_color(i);
        let y = top + row_height * i as i32;
        area.draw(&PathElement::new(
            vec![(4, y), (36, y)],
            color.stroke_width(2),
        ))?;
        area.draw(&Circle::new((20, y), 3, color.filled()))?;
        area.draw(&Text::new(
            name.as_str(),
            (44, y),
            (font, 15)
                .into_font()
                .color(&BLACK)
                .pos(Pos::new(HPos::Left, VPos::Center)),
        ))?;
    }
    Ok(())
}

/// Compact tick labels for values from 0.01 to 10⁹ (ELBOs are large and negative).
fn format_tick(v: f64) -> String {
    let a = v.abs();
    if a >= 1e5 {
        format!("{v:.3e}")
    } else if a >= 100.0 || a == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// (epoch, mean minibatch ELBO) in epoch order.
fn elbo_series(metrics: &[MetricRow]) -> Series {
    let mut pts: Vec<(f64, f64)> = metrics
        .iter()
        .filter(|m| m.name == Figure::EpochElbo.name())
        .filter_map(|m| Some((m.step? as f64, m.value)))
        .collect();
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    ("mean minibatch ELBO".into(), pts)
}

/// The held-out measures train recorded per epoch among `wanted`, in percent, in the order
/// of `wanted` (measures never recorded are left out).
fn metric_series(metrics: &[MetricRow], wanted: &[(AtK, usize)]) -> Vec<Series> {
    let wanted: Vec<String> = wanted.iter().map(|&(measure, k)| measure.at(k)).collect();
    let mut by_name: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
    for m in metrics {
        if wanted.contains(&m.name) {
            if let Some(step) = m.step {
                by_name
                    .entry(m.name.as_str())
                    .or_default()
                    .push((step as f64, 100.0 * m.value));
            }
        }
    }
    wanted
        .iter()
        .filter_map(|name| {
            let mut pts = by_name.remove(name.as_str())?;
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            Some((name.to_string(), pts))
        })
        .collect()
}

fn per_epoch_split(metrics: &[MetricRow]) -> String {
    metrics
        .iter()
        .find(|m| m.name == AtK::P.at(1))
        .and_then(|m| m.split)
        .map_or_else(|| "held-out".into(), |s| s.to_string())
}

fn value_of(metrics: &[MetricRow], name: &str) -> Option<f64> {
    metrics
        .iter()
        .rev()
        .find(|m| m.name == name)
        .map(|m| m.value)
}

/// Which charts a report has.
#[derive(Debug, Clone)]
struct Charts {
    metrics: bool,
    coverage: bool,
    /// Evaluate runs with a reliability diagram.
    reliability: Vec<i64>,
    /// The decision-boundary chart of a binary run, or why there is none.
    boundary: boundary::Boundary,
}

/// The Markdown summary: data, parameters, timings, metrics.
fn summary_markdown(
    ws: &Workspace,
    train: &RunRow,
    metrics: &[MetricRow],
    charts: Charts,
) -> Result<String> {
    let mut md = String::new();
    let p = &train.params;
    let dataset_name = p["dataset"].as_str().unwrap_or("?");
    writeln!(md, "# Training run {} on `{dataset_name}`\n", train.id)?;
    writeln!(
        md,
        "Status **{}**, started {}, ended {}.\n",
        train.status,
        train.started_at,
        train.ended_at.as_deref().unwrap_or("-")
    )?;
    writeln!(md, "## Data\n")?;
    match ws.catalog.dataset(dataset_name)? {
        Some(d) => {
            writeln!(md, "| split | rows | nnz |\n|---|---:|---:|")?;
            for s in &d.splits {
                writeln!(md, "| {} | {} | {} |", s.split, s.n_rows, s.nnz)?;
            }
            writeln!(
                md,
                "\nD = {} features, L = {} labels.\n",
                d.n_features, d.n_labels
            )?;
        }
        None => writeln!(md, "(dataset no longer in the workspace)\n")?,
    }
    writeln!(md, "## Parameters\n\n| parameter | value |\n|---|---|")?;
    if let Some(obj) = p.as_object() {
        for (k, v) in obj {
            writeln!(md, "| {k} | {v} |")?;
        }
    }
    writeln!(md, "\n## Timings\n")?;
    let epoch_secs: Vec<f64> = metrics
        .iter()
        .filter(|m| m.name == Figure::EpochSeconds.name())
        .map(|m| m.value)
        .collect();
    let waits: f64 = metrics
        .iter()
        .filter(|m| m.name == Figure::EpochQueueWait.name())
        .map(|m| m.value)
        .sum();
    let total: f64 = epoch_secs.iter().sum();
    writeln!(md, "| measure | value |\n|---|---:|")?;
    writeln!(md, "| epochs recorded | {} |", epoch_secs.len())?;
    if let Some(t) = value_of(metrics, Figure::TrainSeconds.name()) {
        writeln!(md, "| training wall time | {t:.1} s |")?;
    }
    if !epoch_secs.is_empty() {
        writeln!(
            md,
            "| mean epoch | {:.2} s |",
            total / epoch_secs.len() as f64
        )?;
        writeln!(
            md,
            "| trainer waiting on the prefetch queue | {:.2} % |",
            100.0 * waits / total.max(1e-12)
        )?;
    }
    writeln!(md, "\n## Objective\n")?;
    let elbo = elbo_series(metrics).1;
    if let (Some(first), Some(last)) = (elbo.first(), elbo.last()) {
        writeln!(
            md,
            "Mean minibatch ELBO: {:.6e} after epoch {}, {:.6e} after epoch {}.",
            first.1, first.0, last.1, last.0
        )?;
    }
    if let Some(v) = value_of(metrics, Figure::ElboExact.name()) {
        writeln!(md, "Exact full-data bound at the end: {v:.6e}.")?;
    }
    writeln!(md, "\n![ELBO per epoch]({ELBO_CHART}.png)\n")?;
    writeln!(md, "## Metrics\n")?;
    if charts.metrics {
        writeln!(md, "![metrics per epoch]({METRICS_CHART}.png)\n")?;
        if charts.coverage {
            writeln!(md, "![coverage per epoch]({COVERAGE_CHART}.png)\n")?;
        }
    } else {
        writeln!(
            md,
            "No per-epoch metrics (train with `--eval-every N` to record them).\n"
        )?;
    }
    evaluations_markdown(&mut md, ws, train, &charts)?;
    boundary_markdown(&mut md, &charts.boundary)?;
    md.push_str(&seeds_markdown(ws, train)?);
    Ok(md)
}

/// The evaluations of the run's predictions: ranking metrics by k, or the classification
/// metrics, and the reliability diagram when there is one.
fn evaluations_markdown(
    md: &mut String,
    ws: &Workspace,
    train: &RunRow,
    charts: &Charts,
) -> Result<()> {
    let evaluations = linked_evaluations(ws, train.id)?;
    if evaluations.is_empty() {
        writeln!(md, "No `pipeline evaluate` run of this model yet.")?;
    }
    for (eval_run, split, step, rows) in evaluations {
        let ranking = value_of(&rows, &AtK::P.at(1)).is_some();
        let unit = if ranking { ", in percent" } else { "" };
        writeln!(
            md,
            "Evaluate run {eval_run} on split `{split}` (checkpoint step {step}){unit}:\n"
        )?;
        if ranking {
            ranking_markdown(md, &rows)?;
        }
        if !ranking || charts.reliability.contains(&eval_run) {
            classification_markdown(md, &rows)?;
        }
        if charts.reliability.contains(&eval_run) {
            reliability_markdown(md, eval_run)?;
        }
    }
    Ok(())
}

/// The "Decision boundary" section of a binary run: the chart, or one line saying why
/// there is none; nothing for other tasks.
fn boundary_markdown(md: &mut String, chart: &boundary::Boundary) -> Result<()> {
    match chart {
        boundary::Boundary::NotBinary => {}
        boundary::Boundary::Skipped(why) => {
            writeln!(
                md,
                "## Decision boundary

Not drawn: {why}.
"
            )?;
        }
        boundary::Boundary::Drawn {
            step,
            inducing,
            normalization,
        } => {
            writeln!(
                md,
                "## Decision boundary

![decision boundary]({}.png)

p(y = 1 | x) at                  checkpoint step {step} on a {n}×{n} grid over the training rows (shades                  change at 0.25, 0.5 and 0.75; lines: those contours), the training rows by                  class and the M = {inducing} inducing inputs Z as black dots (Hensman,                  Matthews & Ghahramani, *Scalable Variational Gaussian Process                  Classification*, Figure 1).",
                boundary::STEM,
                n = boundary::GRID
            )?;
            if normalization != "none" {
                writeln!(
                    md,
                    "The rows were normalised at ingest ({normalization}): the axes are the                      normalised features the model sees."
                )?;
            }
            writeln!(md)?;
        }
    }
    Ok(())
}

/// P@k, nDCG@k, PSP@k, PSnDCG@k and coverage@k for k = 1..5, in percent.
fn ranking_markdown(md: &mut String, rows: &[MetricRow]) -> Result<()> {
    writeln!(
        md,
        "| k | P@k | nDCG@k | PSP@k | PSnDCG@k | coverage@k |\n\
         |---:|---:|---:|---:|---:|---:|"
    )?;
    for k in 1..=5 {
        let get = |measure: AtK| value_of(rows, &measure.at(k)).map(|v| 100.0 * v);
        if let (Some(p), Some(n), Some(ps), Some(psn)) =
            (get(AtK::P), get(AtK::Ndcg), get(AtK::Psp), get(AtK::Psndcg))
        {
            let cov = get(AtK::Coverage).map_or("-".to_string(), |c| format!("{c:.2}"));
            writeln!(md, "| {k} | {p:.2} | {n:.2} | {ps:.2} | {psn:.2} | {cov} |")?;
        }
    }
    writeln!(md)?;
    Ok(())
}

/// The classification and calibration metrics among an evaluation's rows (names without
/// `@k`), one table row each, in the order recorded; nothing when there are none.
fn classification_markdown(md: &mut String, rows: &[MetricRow]) -> Result<()> {
    let named: Vec<&MetricRow> = rows.iter().filter(|r| !is_at_k(&r.name)).collect();
    if named.is_empty() {
        return Ok(());
    }
    writeln!(md, "| metric | value |\n|---|---:|")?;
    for r in named {
        let value = if unitless(&r.name) {
            format!("{:.5}", r.value)
        } else {
            format!("{:.2} %", 100.0 * r.value)
        };
        writeln!(md, "| {} | {value} |", r.name)?;
    }
    writeln!(md)?;
    Ok(())
}

fn reliability_markdown(md: &mut String, eval_run: i64) -> Result<()> {
    writeln!(
        md,
        "![reliability diagram]({}.png)\n\nBars: the observed frequency in each confidence \
         bin, its count above it; dots: the bin's mean confidence; the diagonal is perfect \
         calibration (`docs/metrics.md`, \"Calibration\").\n",
        reliability_stem(eval_run)
    )?;
    Ok(())
}

/// The chart files of evaluate run `eval_run`'s reliability diagram, without extension.
fn reliability_stem(eval_run: i64) -> String {
    format!("reliability-run{eval_run}")
}

/// The calibration bins an evaluate run stored in its `metrics.json`, if it measured them.
fn stored_calibration(ws: &Workspace, eval_run: i64) -> Result<Option<Calibration>> {
    let Some(file) = ws.run_file(eval_run, ArtifactKind::Metrics)? else {
        return Ok(None);
    };
    let evaluation =
        Evaluation::from_json(&file.read()?).with_context(|| format!("parsing {}", file.name()))?;
    Ok(evaluation.calibration().cloned())
}

fn reliability_chart(
    area: &ChartArea,
    font: &str,
    title: &str,
    calibration: &Calibration,
) -> Result<()> {
    match area {
        ChartArea::Bitmap(a) => plot_reliability(a, font, title, calibration),
        ChartArea::Svg(a) => plot_reliability(a, font, title, calibration),
    }
}

/// A reliability diagram (Guo et al. 2017, Figure 1): for each confidence bin a bar up to
/// the observed frequency of the outcome with the bin's count above it, a dot at (mean
/// confidence, observed frequency), and the diagonal of perfect calibration.
fn plot_reliability<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    font: &str,
    title: &str,
    calibration: &Calibration,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing {title}: {e:?}");
    area.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(area)
        .caption(title, (font, 24))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(0.0..1.0, 0.0..1.1)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("confidence")
        .y_desc("observed frequency")
        .label_style((font, 15))
        .axis_desc_style((font, 17))
        .x_label_formatter(&|v| format!("{v:.1}"))
        .y_label_formatter(&|v| format!("{v:.1}"))
        .draw()
        .map_err(err)?;
    let width = 1.0 / calibration.bins as f64;
    // (lower edge, mean confidence, observed frequency, count) of the non-empty bins.
    let filled: Vec<(f64, f64, f64, u64)> = calibration
        .reliability
        .iter()
        .enumerate()
        .filter_map(|(b, bin)| {
            Some((
                b as f64 * width,
                bin.mean_confidence?,
                bin.accuracy?,
                bin.count,
            ))
        })
        .collect();
    let bar = PALETTE[0].mix(0.55).filled();
    chart
        .draw_series(filled.iter().map(|&(x0, _, freq, _)| {
            // A gap of 4 % of a bin each side tells adjacent bars apart.
            let gap = 0.04 * width;
            Rectangle::new([(x0 + gap, 0.0), (x0 + width - gap, freq)], bar)
        }))
        .map_err(err)?;
    chart
        .draw_series(LineSeries::new(
            [(0.0, 0.0), (1.0, 1.0)],
            BLACK.stroke_width(1),
        ))
        .map_err(err)?;
    chart
        .draw_series(
            filled
                .iter()
                .map(|&(_, conf, freq, _)| Circle::new((conf, freq), 4, PALETTE[1].filled())),
        )
        .map_err(err)?;
    let count_style = (font, 12)
        .into_font()
        .color(&BLACK)
        .pos(Pos::new(HPos::Center, VPos::Bottom));
    chart
        .draw_series(filled.iter().map(|&(x0, _, freq, count)| {
            Text::new(
                count.to_string(),
                (x0 + width / 2.0, freq + 0.01),
                count_style.clone(),
            )
        }))
        .map_err(err)?;
    Ok(())
}

/// A completed evaluate run of a training run's predictions: (evaluate run, split,
/// checkpoint step, metric rows).
type LinkedEvaluation = (i64, String, u64, Vec<MetricRow>);

/// Completed evaluate runs of this training run's predictions, oldest first.
fn linked_evaluations(ws: &Workspace, train_run: i64) -> Result<Vec<LinkedEvaluation>> {
    let mut checksums: BTreeMap<String, u64> = BTreeMap::new();
    let predict_runs =
        ws.catalog
            .runs_with_param(StageKind::Predict, RunStatus::Ok, "train_run", train_run)?;
    for r in predict_runs {
        if let Some(a) = ws.catalog.run_artifact(r.id, ArtifactKind::Predictions)? {
            let step = r.params["checkpoint_step"].as_u64().unwrap_or(0);
            checksums.insert(a.checksum, step);
        }
    }
    let mut out = Vec::new();
    for r in ws
        .catalog
        .runs_of(StageKind::Evaluate, RunStatus::Ok)?
        .iter()
        .rev()
    {
        let Some(sum) = r.params["predictions_checksum"].as_str() else {
            continue;
        };
        if let Some(&step) = checksums.get(sum) {
            let split = r.params["split"].as_str().unwrap_or("?").to_string();
            out.push((r.id, split, step, ws.catalog.metrics(r.id)?));
        }
    }
    Ok(out)
}

/// Mean, sample standard deviation and count of one metric over the seeds of a
/// configuration.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MetricOverSeeds {
    pub name: String,
    pub mean: f64,
    /// Sample standard deviation √(Σ (xᵢ − x̄)² / (n − 1)); None for a single value.
    pub sd: Option<f64>,
    pub n: usize,
}

/// The metrics of the runs of one configuration that differ only in their seed
/// (`[train] seeds = [...]` in a spec), summarised metric by metric.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SeedSummary {
    /// The seeds summarised, in the order given.
    pub seeds: Vec<u64>,
    /// One entry per metric name, in the order the first run recorded them.
    pub metrics: Vec<MetricOverSeeds>,
}

impl SeedSummary {
    /// Summarises `(seed, metric rows of its evaluation)` pairs: every metric any run
    /// recorded, over the runs that recorded it (its `n`).
    pub fn of(runs: &[(u64, Vec<MetricRow>)]) -> Self {
        let mut names: Vec<&str> = Vec::new();
        for (_, rows) in runs {
            for r in rows {
                if !names.contains(&r.name.as_str()) {
                    names.push(&r.name);
                }
            }
        }
        let metrics = names
            .into_iter()
            .map(|name| {
                let values: Vec<f64> = runs
                    .iter()
                    .filter_map(|(_, rows)| value_of(rows, name))
                    .collect();
                over_values(name, &values)
            })
            .collect();
        SeedSummary {
            seeds: runs.iter().map(|r| r.0).collect(),
            metrics,
        }
    }

    /// The metrics as a grid like `pipeline evaluate`'s table: one line per measure
    /// (`P`, `nDCG`, ...), one column per k, each cell `mean ± sd` in percent (metrics are
    /// fractions), then the number of seeds the line's values come from.
    pub fn to_table(&self) -> String {
        let seeds: Vec<String> = self.seeds.iter().map(u64::to_string).collect();
        let mut s = format!(
            "over {} seeds ({}): mean ± sample standard deviation, in percent\n",
            self.seeds.len(),
            seeds.join(", ")
        );
        let (measures, k_max) = self.grid();
        if !measures.is_empty() {
            let _ = write!(s, "{:<10}", "metric");
            for k in 1..=k_max {
                let _ = write!(s, "{:>15}", format!("@{k}"));
            }
            let _ = writeln!(s, "    n");
        }
        for (measure, cells) in &measures {
            let _ = write!(s, "{measure:<10}");
            for cell in cells {
                let _ = write!(s, "{:>15}", cell.map_or("-".into(), cell_text));
            }
            let _ = writeln!(s, "    {}", counts(cells));
        }
        for m in self.ungridded() {
            let _ = writeln!(s, "{:<16}{:>24}    {}", m.name, plain_cell_text(m), m.n);
        }
        s
    }

    /// The metrics without `@k` (classification and calibration: `accuracy`, `nlp`, ...).
    fn ungridded(&self) -> impl Iterator<Item = &MetricOverSeeds> {
        self.metrics.iter().filter(|m| !is_at_k(&m.name))
    }

    /// The same grid as a Markdown table.
    pub fn to_markdown(&self) -> String {
        let (measures, k_max) = self.grid();
        let mut s = String::new();
        if !measures.is_empty() {
            s.push_str("| metric (%) |");
            for k in 1..=k_max {
                let _ = write!(s, " @{k} |");
            }
            s.push_str(" n |\n|---|");
            s.push_str(&"---:|".repeat(k_max + 1));
            s.push('\n');
        }
        for (measure, cells) in &measures {
            let _ = write!(s, "| {measure} |");
            for cell in cells {
                let _ = write!(s, " {} |", cell.map_or("-".into(), cell_text));
            }
            let _ = writeln!(s, " {} |", counts(cells));
        }
        let mut plain = self.ungridded().peekable();
        if plain.peek().is_some() {
            if !measures.is_empty() {
                s.push('\n');
            }
            s.push_str("| metric | mean ± sd | n |\n|---|---:|---:|\n");
        }
        for m in plain {
            let _ = writeln!(s, "| {} | {} | {} |", m.name, plain_cell_text(m), m.n);
        }
        s
    }

    /// The metrics `NAME@k` by measure (in first-recorded order) and k (index k − 1), with
    /// the largest k; other names are left out.
    fn grid(&self) -> (Vec<GridLine<'_>>, usize) {
        let parsed: Vec<(&str, usize, &MetricOverSeeds)> = self
            .metrics
            .iter()
            .filter_map(|m| {
                let (measure, k) = split_at_k(&m.name)?;
                Some((measure, k, m))
            })
            .collect();
        let k_max = parsed.iter().map(|p| p.1).max().unwrap_or(0);
        let mut measures: Vec<GridLine<'_>> = Vec::new();
        for (measure, k, m) in parsed {
            let at = match measures.iter().position(|(name, _)| *name == measure) {
                Some(at) => at,
                None => {
                    measures.push((measure, vec![None; k_max]));
                    measures.len() - 1
                }
            };
            measures[at].1[k - 1] = Some(m);
        }
        (measures, k_max)
    }
}

/// One line of [`SeedSummary`]'s grid: a measure (`P`) and its metric at each k.
type GridLine<'a> = (&'a str, Vec<Option<&'a MetricOverSeeds>>);

/// One evaluated run of a seed sweep: (seed, training run, evaluate run, metric rows).
type SeedEvaluation = (u64, i64, i64, Vec<MetricRow>);

/// Whether a metric is printed as it is rather than in percent ([`Figure::unitless`]).
fn unitless(name: &str) -> bool {
    Figure::of(name).is_some_and(Figure::unitless)
}

/// A cell of an ungridded metric: `0.06900 ± 0.00120`, or `97.80 ± 0.05 %`.
fn plain_cell_text(m: &MetricOverSeeds) -> String {
    if unitless(&m.name) {
        let sd = m.sd.map_or("-".into(), |sd| format!("{sd:.5}"));
        format!("{:.5} ± {sd}", m.mean)
    } else {
        format!("{} %", cell_text(m))
    }
}

/// A grid cell: `66.81 ± 0.12` in percent (`66.81 ± -` for a single value).
fn cell_text(m: &MetricOverSeeds) -> String {
    let sd = m.sd.map_or("-".into(), |sd| format!("{:.2}", 100.0 * sd));
    format!("{:.2} ± {sd}", 100.0 * m.mean)
}

/// The seed counts of a grid line: `3`, or `2–3` when its metrics differ in theirs.
fn counts(cells: &[Option<&MetricOverSeeds>]) -> String {
    let ns = cells.iter().flatten().map(|m| m.n);
    match (ns.clone().min(), ns.max()) {
        (Some(lo), Some(hi)) if lo < hi => format!("{lo}–{hi}"),
        (Some(n), _) => n.to_string(),
        _ => "0".into(),
    }
}

/// Mean and sample standard deviation of `values` (two passes: the mean first, then the
/// squared deviations from it, which loses less than Σx² − n x̄²).
fn over_values(name: &str, values: &[f64]) -> MetricOverSeeds {
    let n = values.len();
    let mean = values.iter().sum::<f64>() / n.max(1) as f64;
    let sd = (n > 1).then(|| {
        let ss: f64 = values.iter().map(|v| (v - mean) * (v - mean)).sum();
        (ss / (n - 1) as f64).sqrt()
    });
    MetricOverSeeds {
        name: name.to_string(),
        mean,
        sd,
        n,
    }
}

/// The report's "Over seeds" section: for each split, the metrics of the newest evaluation
/// at the last evaluated checkpoint of every completed training run whose configuration
/// equals this run's but for the seed, summarised when there are at least two.
fn seeds_markdown(ws: &Workspace, train: &RunRow) -> Result<String> {
    let siblings = seed_siblings(ws, train)?;
    // split → (seed, training run, evaluate run, metric rows).
    // By the split's name, the order the section has always listed them in.
    let mut by_split: BTreeMap<&str, Vec<SeedEvaluation>> = BTreeMap::new();
    for run in &siblings {
        let seed = run.params["seed"].as_u64().unwrap_or(0);
        let mut newest: BTreeMap<&str, (u64, i64)> = BTreeMap::new();
        for link in ws.catalog.evaluations_of_train_run(run.id)? {
            let key = (link.checkpoint_step.unwrap_or(0), link.evaluate_run);
            let slot = newest
                .entry(link.split.map_or("", Split::name))
                .or_insert(key);
            *slot = (*slot).max(key);
        }
        for (split, (_, eval_run)) in newest {
            let rows = ws.catalog.metrics(eval_run)?;
            by_split
                .entry(split)
                .or_default()
                .push((seed, run.id, eval_run, rows));
        }
    }
    let mut md = String::new();
    for (split, runs) in by_split.into_iter().filter(|(_, r)| r.len() > 1) {
        if md.is_empty() {
            writeln!(
                md,
                "## Over seeds\n\nCompleted training runs with this configuration but for \
                 the seed, each at its last evaluated checkpoint.\n"
            )?;
        }
        let listed: Vec<String> = runs
            .iter()
            .map(|(seed, run, eval, _)| format!("run {run} (seed {seed}, evaluate run {eval})"))
            .collect();
        writeln!(md, "Split `{split}`: {}.\n", listed.join(", "))?;
        let pairs: Vec<(u64, Vec<MetricRow>)> = runs
            .into_iter()
            .map(|(seed, _, _, rows)| (seed, rows))
            .collect();
        writeln!(md, "{}", SeedSummary::of(&pairs).to_markdown())?;
    }
    Ok(md)
}

/// Completed training runs whose parameters equal `train`'s but for `seed` (`train`
/// itself included once completed), oldest first.
fn seed_siblings(ws: &Workspace, train: &RunRow) -> Result<Vec<RunRow>> {
    let without_seed = |params: &serde_json::Value| {
        let mut p = params.clone();
        if let Some(obj) = p.as_object_mut() {
            obj.remove("seed");
        }
        p
    };
    let wanted = without_seed(&train.params);
    let mut runs: Vec<RunRow> = ws
        .catalog
        .runs_of(StageKind::Train, RunStatus::Ok)?
        .into_iter()
        .filter(|r| without_seed(&r.params) == wanted)
        .collect();
    runs.sort_by_key(|r| r.id);
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_charts_and_tables_read_the_names_the_evaluations_record() {
        use crate::metrics::{metric_rows, LabellessRows, MetricsAccumulator};
        let mut acc = MetricsAccumulator::new(5, vec![1.0; 3], LabellessRows::CountAsZero).unwrap();
        acc.add_row(&[0, 1, 2], &[1]).unwrap();
        let recorded = metric_rows(&acc.finish(), Some(1), Some(Split::Validation));
        let series = metric_series(&recorded, &METRICS_CHART_SERIES);
        assert_eq!(series.len(), METRICS_CHART_SERIES.len());
        let coverage = metric_series(&recorded, &COVERAGE_CHART_SERIES);
        assert_eq!(coverage.len(), COVERAGE_CHART_SERIES.len());
        assert_eq!(per_epoch_split(&recorded), "validation");
        let mut md = String::new();
        ranking_markdown(&mut md, &recorded).unwrap();
        assert_eq!(
            md.lines().filter(|l| l.starts_with("| 5 |")).count(),
            1,
            "{md}"
        );
        for &figure in Figure::ALL {
            assert_eq!(unitless(figure.name()), figure.unitless());
        }
        assert!(unitless("nlp") && unitless("brier") && unitless("auc"));
        assert!(!unitless("accuracy") && !unitless("P@1"));
    }

    fn rows(values: &[(&str, f64)]) -> Vec<MetricRow> {
        values
            .iter()
            .map(|&(name, value)| MetricRow {
                name: name.into(),
                value,
                step: None,
                split: Some(Split::Validation),
            })
            .collect()
    }

    #[test]
    fn the_summary_is_the_mean_and_sample_sd_of_a_hand_worked_case() {
        // P@1 over three seeds: 0.60, 0.64, 0.68. Mean 0.64; deviations −0.04, 0, 0.04;
        // Σ squares 0.0032; / (n − 1) = 0.0016; sd = 0.04.
        // coverage@1 recorded by two runs only: 0.1 and 0.2, mean 0.15,
        // sd = √((0.05² + 0.05²) / 1) = 0.0707106781...
        let runs = vec![
            (0, rows(&[("P@1", 0.60), ("coverage@1", 0.1)])),
            (1, rows(&[("P@1", 0.64)])),
            (2, rows(&[("P@1", 0.68), ("coverage@1", 0.2)])),
        ];
        let s = SeedSummary::of(&runs);
        assert_eq!(s.seeds, vec![0, 1, 2]);
        let p1 = &s.metrics[0];
        assert_eq!((p1.name.as_str(), p1.n), ("P@1", 3));
        assert!((p1.mean - 0.64).abs() < 1e-15, "{}", p1.mean);
        assert!((p1.sd.unwrap() - 0.04).abs() < 1e-15, "{:?}", p1.sd);
        let cov = &s.metrics[1];
        assert_eq!((cov.name.as_str(), cov.n), ("coverage@1", 2));
        assert!((cov.mean - 0.15).abs() < 1e-15);
        assert!((cov.sd.unwrap() - 0.5f64.sqrt() / 10.0).abs() < 1e-15);
        let table = s.to_table();
        assert!(table.contains("P            64.00 ± 4.00    3"), "{table}");
        assert!(table.contains("coverage     15.00 ± 7.07    2"), "{table}");
        let md = s.to_markdown();
        assert!(md.contains("| P | 64.00 ± 4.00 | 3 |"), "{md}");
        assert!(md.contains("| coverage | 15.00 ± 7.07 | 2 |"), "{md}");
    }

    #[test]
    fn classification_metrics_are_listed_below_the_grid() {
        // accuracy 0.97 and 0.99: mean 0.98, sd √((0.01² + 0.01²)/1) = 0.01414...;
        // nlp 0.07 and 0.05: mean 0.06, same sd, printed as it is (not in percent).
        let runs = vec![
            (0, rows(&[("accuracy", 0.97), ("nlp", 0.07)])),
            (1, rows(&[("accuracy", 0.99), ("nlp", 0.05)])),
        ];
        let s = SeedSummary::of(&runs);
        let table = s.to_table();
        assert!(
            !table.contains("@"),
            "no grid without NAME@k metrics: {table}"
        );
        assert!(
            table.contains("accuracy") && table.contains("98.00 ± 1.41 %"),
            "{table}"
        );
        assert!(table.contains("0.06000 ± 0.01414"), "{table}");
        let md = s.to_markdown();
        assert!(md.starts_with("| metric | mean ± sd | n |"), "{md}");
        assert!(md.contains("| nlp | 0.06000 ± 0.01414 | 2 |"), "{md}");
        // Ranking-only summaries are as before: the grid alone.
        let ranking = SeedSummary::of(&[(4, rows(&[("P@1", 0.5)]))]);
        assert!(!ranking.to_markdown().contains("mean ± sd"));
    }

    #[test]
    fn one_seed_has_no_standard_deviation() {
        let s = SeedSummary::of(&[(4, rows(&[("P@1", 0.5)]))]);
        assert_eq!(s.metrics[0].sd, None);
        assert_eq!(s.metrics[0].n, 1);
        assert!(s.to_table().contains("50.00 ± -    1"), "{}", s.to_table());
    }
}
