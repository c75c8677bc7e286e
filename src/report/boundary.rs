//! The decision-boundary chart of a binary run on 2-D inputs, as in Figure 1 of Hensman,
//! Matthews & Ghahramani, *Scalable Variational Gaussian Process Classification* (banana):
//! p(y = 1 | x) over a grid covering the training rows, drawn as four shaded bands with
//! its contours at 0.25, 0.5 and 0.75, the training rows coloured by class and the
//! inducing inputs Z as black dots.
//!
//! The grid's probabilities come from the predictive `pipeline predict` writes: the grid
//! points are made into a chunk of rows and scored by [`Ranker::label_probabilities`],
//! opened from the checkpoint as predict opens it ([`probabilities_at`]), so a grid point
//! placed on a training row gets that row's predicted probability.

use std::path::Path;

use anyhow::{anyhow, ensure, Context, Result};
use faer::Mat;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::chart::{draw_both_sized, ChartArea, PALETTE};
use crate::model::params::Params;
use crate::scoring::{model_inputs, Ranker};
use crate::store::catalog::{DatasetRow, RunRow, Split, Task};
use crate::store::chunks::{read_registered_chunk, CsrChunk, RowRef};
use crate::store::npy::NpyMap;
use crate::store::workspace::Workspace;
use crate::trained::{load_run_checkpoint, SvdFiles, TrainConfig};

/// Grid points per axis (GRID² points are scored).
pub const GRID: usize = 200;
/// Share of the data's range added on each side of the grid.
const MARGIN: f64 = 0.1;
/// The most training rows drawn (every k-th row beyond that), so a large file draws fast.
const MAX_POINTS: usize = 20_000;
/// Rows scored together, as `pipeline predict`'s default `--block-rows`.
const BLOCK_ROWS: usize = 1024;
/// The contour levels of p(y = 1 | x) drawn; they also bound the shaded bands.
pub const LEVELS: [f64; 3] = [0.25, 0.5, 0.75];
/// The chart's size in pixels (width, height): the plot about square, the legend beside it.
const SIZE: (u32, u32) = (760, 600);
/// The chart file's name, without extension.
pub const STEM: &str = "decision-boundary";

/// What the report shows of a run's decision boundary.
#[derive(Debug, Clone, PartialEq)]
pub enum Boundary {
    /// Drawn to [`STEM`]`.png` and `.svg`: (checkpoint step, inducing inputs M, how the rows
    /// were normalised at ingest).
    Drawn {
        step: u64,
        inducing: usize,
        normalization: String,
    },
    /// A binary run it is not drawn for, and why.
    Skipped(String),
    /// Not a binary run: nothing is said.
    NotBinary,
}

/// The training rows a chart draws: the range of all of them (x_min, x_max, y_min, y_max)
/// and at most [`MAX_POINTS`] of them, (x, y, positive).
struct TrainingRows {
    range: (f64, f64, f64, f64),
    drawn: Vec<(f64, f64, bool)>,
}

/// p(y = 1 | x) on the lattice x_i = x_min + i·(x_max − x_min)/(n − 1) (and likewise y_j),
/// row-major with i (x) fastest: `p[j·n + i]`.
struct Grid {
    x: (f64, f64),
    y: (f64, f64),
    n: usize,
    p: Vec<f64>,
}

impl Grid {
    fn x_at(&self, i: usize) -> f64 {
        lattice(self.x, self.n, i)
    }

    fn y_at(&self, j: usize) -> f64 {
        lattice(self.y, self.n, j)
    }

    fn at(&self, i: usize, j: usize) -> f64 {
        self.p[j * self.n + i]
    }
}

/// Point `i` of `n` spread evenly over [lo, hi], rounded to f32 as the chunk stores it (so
/// the chart draws exactly where the model was evaluated).
fn lattice((lo, hi): (f64, f64), n: usize, i: usize) -> f64 {
    f64::from((lo + (hi - lo) * i as f64 / (n - 1).max(1) as f64) as f32)
}

/// Draws the decision-boundary chart of training run `train` into `dir` when it is a
/// binary run on 2-D inputs with a checkpoint; says why not otherwise.
pub(super) fn write_chart(
    ws: &Workspace,
    train: &RunRow,
    dir: &Path,
    font: &str,
) -> Result<Boundary> {
    let config = TrainConfig::of_run(ws, train.id)?;
    if config.task != Task::Binary {
        return Ok(Boundary::NotBinary);
    }
    let dataset = config.dataset_row(ws)?;
    if dataset.n_features != 2 {
        return Ok(Boundary::Skipped(format!(
            "the inputs have D = {} features; the decision boundary is drawn for D = 2 only",
            dataset.n_features
        )));
    }
    if ws.catalog.checkpoints(train.id)?.is_empty() {
        return Ok(Boundary::Skipped("the run has no checkpoint yet".into()));
    }
    let (config, ckpt_row, ckpt) = load_run_checkpoint(ws, train.id, None)?;
    let rows = training_rows(ws, &dataset)?;
    let z = inducing_inputs(ws, &config, &ckpt.params)?;
    let range = padded_range(rows.range, &z);
    let points = grid_points(range, GRID);
    let p = model_probabilities(
        ws,
        &config,
        &ckpt.params,
        &dataset,
        &points_chunk(&points, 2)?,
    )?;
    let grid = Grid {
        x: (range.0, range.1),
        y: (range.2, range.3),
        n: GRID,
        p,
    };
    let title = format!(
        "Run {}: p(y = 1 | x), M = {}, {} link, step {}",
        train.id,
        z.len(),
        config.likelihood.name(),
        ckpt_row.step
    );
    let chart = BoundaryChart {
        title: &title,
        font,
        grid: &grid,
        rows: &rows,
        z: &z,
    };
    draw_both_sized(dir, STEM, SIZE, |area| chart.draw(area))?;
    Ok(Boundary::Drawn {
        step: ckpt_row.step,
        inducing: z.len(),
        normalization: dataset.normalization.clone(),
    })
}

/// p(y = 1 | x) of binary training run `run` at `points` (row-major, D per row, D the
/// dataset's feature count), under checkpoint `step` (None: the last): the probabilities
/// `pipeline predict --probabilities` writes, before their rounding to f32, for rows with
/// these features.
pub fn probabilities_at(
    ws: &Workspace,
    run: i64,
    step: Option<u64>,
    points: &[f32],
) -> Result<Vec<f64>> {
    let (config, _, ckpt) = load_run_checkpoint(ws, run, step)?;
    ensure!(
        config.task == Task::Binary,
        "run {run} is a {} run; probabilities at points are of binary runs",
        config.task.name()
    );
    let dataset = config.dataset_row(ws)?;
    let d = usize::try_from(dataset.n_features).context("feature count")?;
    let chunk = points_chunk(points, d)?;
    model_probabilities(ws, &config, &ckpt.params, &dataset, &chunk)
}

/// p(y = 1) of every row of `chunk` under `params`, by the ranker predict opens for the run
/// (its inputs' view, K_X̃, the feature weights set aside, its probability rule).
fn model_probabilities(
    ws: &Workspace,
    config: &TrainConfig,
    params: &Params,
    dataset: &DatasetRow,
    chunk: &CsrChunk,
) -> Result<Vec<f64>> {
    let basis = NpyMap::open_registered(&SvdFiles::of_run(ws, config.svd_run)?.basis)?;
    let (inputs, k_tilde, unweighted) = model_inputs(
        &basis,
        dataset.n_features,
        config.inducing_inputs.in_features(),
        params,
    )?;
    let ranker = Ranker::open(
        inputs,
        k_tilde,
        config.kernel.kind(),
        unweighted.as_ref().unwrap_or(params),
        true,
    )?
    .with_probability_rule(config.probability_rule()?);
    ranker.label_probabilities(chunk, 0, BLOCK_ROWS)
}

/// Rows with the features `points` (row-major, `d` per row) as ingest stores them: zeros
/// left out, ‖x‖² summed in f64 from the f32 values, then rounded to f32; no labels, row
/// ids 0, 1, ….
pub fn points_chunk(points: &[f32], d: usize) -> Result<CsrChunk> {
    ensure!(
        d > 0 && points.len() % d == 0,
        "{} coordinates are not rows of {d} features",
        points.len()
    );
    let mut chunk = CsrChunk::default();
    let (mut indices, mut values) = (Vec::with_capacity(d), Vec::with_capacity(d));
    for (id, row) in points.chunks(d).enumerate() {
        indices.clear();
        values.clear();
        for (j, &v) in row.iter().enumerate().filter(|(_, v)| **v != 0.0) {
            indices.push(j as u32);
            values.push(v);
        }
        let sq_norm: f64 = values.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        chunk.push_row(RowRef {
            row_id: id as u64,
            labels: &[],
            indices: &indices,
            values: &values,
            sq_norm: sq_norm as f32,
        });
    }
    Ok(chunk)
}

/// The inducing inputs in input space, Z = A X̃ [M×2]: A itself with inputs in feature
/// space (X̃ = I), else A [M×R] times the svd basis X̃ [R×2].
fn inducing_inputs(
    ws: &Workspace,
    config: &TrainConfig,
    params: &Params,
) -> Result<Vec<(f64, f64)>> {
    let z = if config.inducing_inputs.in_features() {
        params.a.clone()
    } else {
        let map = NpyMap::open_registered(&SvdFiles::of_run(ws, config.svd_run)?.basis)?;
        let basis = map.view2::<f32>()?;
        ensure!(
            basis.nrows() == params.a.ncols() && basis.ncols() == 2,
            "basis [{}×{}] does not fit A [{}×{}] of 2-D inputs",
            basis.nrows(),
            basis.ncols(),
            params.a.nrows(),
            params.a.ncols()
        );
        let x_tilde = Mat::<f64>::from_fn(basis.nrows(), 2, |r, d| f64::from(basis[(r, d)]));
        &params.a * &x_tilde
    };
    ensure!(
        z.ncols() == 2,
        "inducing inputs with {} columns, not 2",
        z.ncols()
    );
    Ok((0..z.nrows()).map(|m| (z[(m, 0)], z[(m, 1)])).collect())
}

/// One pass over the training split: the range of its rows and every k-th row (k the
/// smallest that keeps at most [`MAX_POINTS`]), with its class (label 0 present).
fn training_rows(ws: &Workspace, dataset: &DatasetRow) -> Result<TrainingRows> {
    let n_rows = dataset.split(Split::Train).map_or(0, |s| s.n_rows) as usize;
    let stride = n_rows.div_ceil(MAX_POINTS).max(1);
    let mut range = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    let mut drawn = Vec::new();
    let mut seen = 0usize;
    for (file, _) in ws.split_chunks(dataset, Split::Train)? {
        let chunk = read_registered_chunk(&file)?;
        for r in 0..chunk.len() {
            let mut x = [0.0f64; 2];
            chunk.densify_row(r, 2, |j, v| x[j] = f64::from(v))?;
            range = (
                range.0.min(x[0]),
                range.1.max(x[0]),
                range.2.min(x[1]),
                range.3.max(x[1]),
            );
            if seen % stride == 0 {
                let positive = chunk.label_offsets[r + 1] > chunk.label_offsets[r];
                drawn.push((x[0], x[1], positive));
            }
            seen += 1;
        }
    }
    ensure!(
        seen > 0,
        "dataset '{}' has no training rows to draw",
        dataset.name
    );
    Ok(TrainingRows { range, drawn })
}

/// The data's range widened to hold the inducing inputs too, then by [`MARGIN`] of its
/// extent on each side (at least 1e-3, so a constant coordinate still spans a range).
fn padded_range(data: (f64, f64, f64, f64), z: &[(f64, f64)]) -> (f64, f64, f64, f64) {
    let (mut x0, mut x1, mut y0, mut y1) = data;
    for &(x, y) in z.iter().filter(|(x, y)| x.is_finite() && y.is_finite()) {
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
    }
    let pad_x = ((x1 - x0) * MARGIN).max(1e-3);
    let pad_y = ((y1 - y0) * MARGIN).max(1e-3);
    (x0 - pad_x, x1 + pad_x, y0 - pad_y, y1 + pad_y)
}

/// The n×n lattice over `range` as rows (x, y) in f32, y outer, x inner.
fn grid_points(range: (f64, f64, f64, f64), n: usize) -> Vec<f32> {
    let mut points = Vec::with_capacity(2 * n * n);
    for j in 0..n {
        for i in 0..n {
            points.push(lattice((range.0, range.1), n, i) as f32);
            points.push(lattice((range.2, range.3), n, j) as f32);
        }
    }
    points
}

/// A line segment of a contour, ((x, y), (x, y)).
type Segment = ((f64, f64), (f64, f64));

/// The contour p = `level` of `grid` by marching squares: in each cell, the points where p
/// crosses the level on its edges (linear interpolation between the corners), joined in
/// pairs; a saddle cell (two opposite corners above) is split by the mean of its corners.
///
/// Why not the `contour` crate (a port of d3-contour): it returns closed rings around the
/// region p ≥ level, which run along the grid's border wherever that region touches it;
/// a decision boundary is the open level line only, which is what this draws.
fn contour(grid: &Grid, level: f64) -> Vec<Segment> {
    let mut segments = Vec::new();
    for j in 0..grid.n - 1 {
        for i in 0..grid.n - 1 {
            // Corners counter-clockwise from (i, j): (x, y, p).
            let c = [(i, j), (i + 1, j), (i + 1, j + 1), (i, j + 1)]
                .map(|(a, b)| (grid.x_at(a), grid.y_at(b), grid.at(a, b)));
            // Edge e joins corner e and corner e + 1: bottom, right, top, left.
            let cross = |e: usize| -> Option<(f64, f64)> {
                let (a, b) = (c[e], c[(e + 1) % 4]);
                if (a.2 >= level) == (b.2 >= level) {
                    return None;
                }
                let t = (level - a.2) / (b.2 - a.2);
                Some((a.0 + t * (b.0 - a.0), a.1 + t * (b.1 - a.1)))
            };
            let edges: Vec<(usize, (f64, f64))> =
                (0..4).filter_map(|e| Some((e, cross(e)?))).collect();
            match edges.as_slice() {
                [(_, a), (_, b)] => segments.push((*a, *b)),
                [(_, bottom), (_, right), (_, top), (_, left)] => {
                    let centre = c.iter().map(|v| v.2).sum::<f64>() / 4.0;
                    // Corners 0 and 2 on the same side as the centre: their region joins
                    // through it, so the segments cut off corners 1 and 3.
                    if (c[0].2 >= level) == (centre >= level) {
                        segments.extend([(*bottom, *right), (*top, *left)]);
                    } else {
                        segments.extend([(*left, *bottom), (*right, *top)]);
                    }
                }
                _ => {}
            }
        }
    }
    segments
}

/// `color` at strength `t` over white, opaque (flat colours keep the PNG small).
fn tint(color: RGBColor, t: f64) -> RGBColor {
    let mix = |c: u8| (255.0 - t * (255.0 - f64::from(c))).round() as u8;
    RGBColor(mix(color.0), mix(color.1), mix(color.2))
}

/// The shade of p: the negative class's colour below ½, the positive's above, stronger
/// beyond 0.25 / 0.75.
fn band_color(p: f64) -> RGBColor {
    let (negative, positive) = (PALETTE[0], PALETTE[1]);
    match LEVELS.iter().filter(|&&l| p >= l).count() {
        0 => tint(negative, 0.32),
        1 => tint(negative, 0.12),
        2 => tint(positive, 0.12),
        _ => tint(positive, 0.32),
    }
}

/// What one decision-boundary chart draws.
struct BoundaryChart<'a> {
    title: &'a str,
    font: &'a str,
    grid: &'a Grid,
    rows: &'a TrainingRows,
    z: &'a [(f64, f64)],
}

impl BoundaryChart<'_> {
    fn draw(&self, area: &ChartArea) -> Result<()> {
        match area {
            ChartArea::Bitmap(a) => self.plot(a),
            ChartArea::Svg(a) => self.plot(a),
        }
    }

    /// The bands (one rectangle per run of equal shade along a grid row, so the SVG stays
    /// small), the contours, the rows, Z on top, and the legend in a column at the right.
    fn plot<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<()>
    where
        DB::ErrorType: 'static,
    {
        let title = self.title;
        let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing {title}: {e:?}");
        area.fill(&WHITE).map_err(err)?;
        let width = area.dim_in_pixel().0;
        let (plot_area, legend) = area.split_horizontally(width.saturating_sub(150));
        let g = self.grid;
        let mut chart = ChartBuilder::on(&plot_area)
            .caption(title, (self.font, 20))
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(52)
            .build_cartesian_2d(g.x.0..g.x.1, g.y.0..g.y.1)
            .map_err(err)?;
        chart.draw_series(band_rectangles(g)).map_err(err)?;
        chart
            .configure_mesh()
            .disable_mesh()
            .x_desc("feature 1")
            .y_desc("feature 2")
            .label_style((self.font, 14))
            .axis_desc_style((self.font, 16))
            .draw()
            .map_err(err)?;
        for level in LEVELS {
            let style = contour_style(level);
            let lines = contour(g, level)
                .into_iter()
                .map(move |(a, b)| PathElement::new(vec![a, b], style));
            chart.draw_series(lines).map_err(err)?;
        }
        let rows = self
            .rows
            .drawn
            .iter()
            .map(|&(x, y, positive)| Circle::new((x, y), 3, class_color(positive).filled()));
        chart.draw_series(rows).map_err(err)?;
        let z = self.z.iter().map(|&p| Circle::new(p, 5, BLACK.filled()));
        chart.draw_series(z).map_err(err)?;
        self.legend(&legend).map_err(err)?;
        Ok(())
    }

    /// One entry per mark: the two classes, Z, and the contours.
    fn legend<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, Shift>,
    ) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
        let text = |s: String, y: i32| {
            Text::new(
                s,
                (40, y),
                (self.font, 14)
                    .into_font()
                    .color(&BLACK)
                    .pos(Pos::new(HPos::Left, VPos::Center)),
            )
        };
        let (top, step) = (80, 26);
        let entries = [
            (class_color(true), 3, "y = 1 (label 0)".to_string()),
            (class_color(false), 3, "y = −1".to_string()),
            (BLACK, 5, format!("Z (M = {})", self.z.len())),
        ];
        for (k, (color, radius, name)) in entries.into_iter().enumerate() {
            let y = top + step * k as i32;
            area.draw(&Circle::new((20, y), radius, color.filled()))?;
            area.draw(&text(name, y))?;
        }
        for (k, level) in [0.5, 0.25].into_iter().enumerate() {
            let y = top + step * (3 + k as i32);
            area.draw(&PathElement::new(
                vec![(6, y), (34, y)],
                contour_style(level),
            ))?;
            let name = match k {
                0 => "p = 0.5".to_string(),
                _ => "p = 0.25, 0.75".to_string(),
            };
            area.draw(&text(name, y))?;
        }
        Ok(())
    }
}

/// The filled rectangles of the bands: per grid row, one per run of points of equal
/// shade, each point's cell reaching half a step to either side.
fn band_rectangles(g: &Grid) -> Vec<Rectangle<(f64, f64)>> {
    let half = |lo: f64, hi: f64| (hi - lo) / (g.n - 1).max(1) as f64 / 2.0;
    let (hx, hy) = (half(g.x.0, g.x.1), half(g.y.0, g.y.1));
    let mut out = Vec::new();
    for j in 0..g.n {
        let mut start = 0;
        for i in 1..=g.n {
            let color = band_color(g.at(start, j));
            if i < g.n && band_color(g.at(i, j)) == color {
                continue;
            }
            let (x0, x1) = (g.x_at(start) - hx, g.x_at(i - 1) + hx);
            let (y0, y1) = (g.y_at(j) - hy, g.y_at(j) + hy);
            out.push(Rectangle::new([(x0, y0), (x1, y1)], color.filled()));
            start = i;
        }
    }
    out
}

fn contour_style(level: f64) -> ShapeStyle {
    match level == 0.5 {
        true => BLACK.stroke_width(2),
        false => RGBColor(0x55, 0x55, 0x55).stroke_width(1),
    }
}

fn class_color(positive: bool) -> RGBColor {
    match positive {
        true => PALETTE[1],
        false => PALETTE[0],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid(n: usize, f: impl Fn(f64, f64) -> f64) -> Grid {
        let mut g = Grid {
            x: (0.0, 1.0),
            y: (0.0, 1.0),
            n,
            p: Vec::new(),
        };
        g.p = (0..n * n)
            .map(|k| f(g.x_at(k % n), g.y_at(k / n)))
            .collect();
        g
    }

    #[test]
    fn the_contour_of_a_plane_is_its_level_line() {
        // p = (x + y) / 2 on [0, 1]²: p = 0.5 is the line x + y = 1, crossed by every cell
        // on the anti-diagonal, and linear interpolation of a linear p is exact.
        let g = grid(11, |x, y| (x + y) / 2.0);
        let segments = contour(&g, 0.5);
        assert!(segments.len() >= 10, "{}", segments.len());
        for (a, b) in &segments {
            for p in [a, b] {
                assert!((p.0 + p.1 - 1.0).abs() < 1e-6, "{p:?} off the line");
            }
        }
        assert!(contour(&g, 1.5).is_empty(), "no point reaches 1.5");
    }

    #[test]
    fn a_saddle_cell_is_split_by_its_centre() {
        // One cell with corners (0,0) = 1, (1,0) = 0, (1,1) = 1, (0,1) = 0 and level 0.4:
        // the centre (mean 0.5) is above, so the two high corners connect and the segments
        // cut off the low corners (1,0) and (0,1): each segment stays near its corner.
        let g = grid(2, |x, y| if (x + y - 1.0).abs() < 1e-9 { 0.0 } else { 1.0 });
        let segments = contour(&g, 0.4);
        assert_eq!(segments.len(), 2);
        for (a, b) in segments {
            let mid = ((a.0 + b.0) / 2.0, (a.1 + b.1) / 2.0);
            let near_low = [(1.0, 0.0), (0.0, 1.0)]
                .iter()
                .any(|c: &(f64, f64)| (mid.0 - c.0).hypot(mid.1 - c.1) < 0.5);
            assert!(
                near_low,
                "segment {a:?}–{b:?} does not cut off a low corner"
            );
        }
    }

    #[test]
    fn points_are_stored_as_ingest_stores_rows() {
        let chunk = points_chunk(&[0.5, 0.0, -1.25, 2.0], 2).unwrap();
        assert_eq!(chunk.len(), 2);
        assert_eq!(chunk.row(0).indices, &[0]);
        assert_eq!(chunk.row(0).sq_norm, 0.25);
        assert_eq!(chunk.row(1).values, &[-1.25, 2.0]);
        assert_eq!(chunk.row(1).sq_norm, 5.5625);
        assert!(points_chunk(&[1.0, 2.0, 3.0], 2).is_err());
    }
}
