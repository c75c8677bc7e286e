//! What every chart of a report shares: the palette, the two backends (PNG and SVG) behind
//! one drawing area, and drawing a chart to both files.

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::coord::Shift;
use plotters::prelude::*;

/// Line colours: the Okabe–Ito palette (Okabe & Ito, *Color Universal Design*, 2002), told
/// apart under the common colour-vision deficiencies, without its yellow (too pale on white).
pub(super) const PALETTE: [RGBColor; 7] = [
    RGBColor(0x00, 0x72, 0xB2), // blue
    RGBColor(0xD5, 0x5E, 0x00), // vermillion
    RGBColor(0x00, 0x9E, 0x73), // bluish green
    RGBColor(0xCC, 0x79, 0xA7), // reddish purple
    RGBColor(0xE6, 0x9F, 0x00), // orange
    RGBColor(0x56, 0xB4, 0xE9), // sky blue
    RGBColor(0x00, 0x00, 0x00), // black
];

/// Draws the same chart to `<dir>/<stem>.png` (1000×600) and `<dir>/<stem>.svg`.
pub(super) fn draw_both(
    dir: &Path,
    stem: &str,
    draw: impl Fn(&ChartArea) -> Result<()>,
) -> Result<()> {
    draw_both_sized(dir, stem, (1000, 600), draw)
}

/// [`draw_both`] at `size` (width, height) in pixels.
pub(super) fn draw_both_sized(
    dir: &Path,
    stem: &str,
    size: (u32, u32),
    draw: impl Fn(&ChartArea) -> Result<()>,
) -> Result<()> {
    let png = dir.join(format!("{stem}.png"));
    {
        let root = BitMapBackend::new(&png, size).into_drawing_area();
        draw(&ChartArea::Bitmap(root.clone()))?;
        root.present()
            .map_err(|e| anyhow!("writing {}: {e}", png.display()))?;
    }
    let svg = dir.join(format!("{stem}.svg"));
    {
        let root = SVGBackend::new(&svg, size).into_drawing_area();
        draw(&ChartArea::Svg(root.clone()))?;
        root.present()
            .map_err(|e| anyhow!("writing {}: {e}", svg.display()))?;
    }
    Ok(())
}

/// A drawing area of either backend.
pub(super) enum ChartArea<'a> {
    Bitmap(DrawingArea<BitMapBackend<'a>, Shift>),
    Svg(DrawingArea<SVGBackend<'a>, Shift>),
}
