//! PNG line charts of the report (plotters' bitmap backend, no font features: nothing
//! beyond Rust to build). Tick labels are drawn with a built-in 3×5 pixel font (digits,
//! `.` and `-`); the axes' names and units are in the report's captions.

use std::path::Path;

use anyhow::{Result, anyhow};
use plotters::prelude::*;

/// One line of a chart.
#[derive(Debug, Clone)]
pub struct Series {
    pub color: RGBColor,
    pub points: Vec<(f64, f64)>,
}

/// Colours of a chart's series, in order.
pub const COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
];

const WIDTH: u32 = 800;
const HEIGHT: u32 = 360;
const LEFT: u32 = 70;
const BOTTOM: u32 = 30;
const MARGIN: u32 = 12;
/// Pixels per font dot.
const DOT: i32 = 2;

/// 3×5 glyphs, rows top to bottom, bit 2 = left column.
fn glyph(c: char) -> Option<[u8; 5]> {
    Some(match c {
        '0' => [7, 5, 5, 5, 7],
        '1' => [2, 6, 2, 2, 7],
        '2' => [7, 1, 7, 4, 7],
        '3' => [7, 1, 7, 1, 7],
        '4' => [5, 5, 7, 1, 1],
        '5' => [7, 4, 7, 1, 7],
        '6' => [7, 4, 7, 5, 7],
        '7' => [7, 1, 1, 1, 1],
        '8' => [7, 5, 7, 5, 7],
        '9' => [7, 5, 7, 1, 7],
        '.' => [0, 0, 0, 0, 2],
        '-' => [0, 0, 7, 0, 0],
        _ => return None,
    })
}

/// Width in pixels of `text` in the pixel font.
fn text_width(text: &str) -> i32 {
    text.chars().count() as i32 * 4 * DOT
}

/// Draws `text` with its top-left corner at `at`.
fn draw_text<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    text: &str,
    at: (i32, i32),
) -> Result<()> {
    for (n, c) in text.chars().enumerate() {
        let Some(rows) = glyph(c) else { continue };
        for (y, row) in rows.iter().enumerate() {
            for x in 0..3 {
                if row & (4 >> x) != 0 {
                    let x0 = at.0 + (n as i32 * 4 + x) * DOT;
                    let y0 = at.1 + y as i32 * DOT;
                    area.draw(&Rectangle::new(
                        [(x0, y0), (x0 + DOT - 1, y0 + DOT - 1)],
                        BLACK.filled(),
                    ))
                    .map_err(|e| anyhow!("draw: {e:?}"))?;
                }
            }
        }
    }
    Ok(())
}

/// "Nice" tick positions (steps of 1, 2 or 5 × 10ⁿ) covering `lo..=hi`, about `n`.
pub fn ticks(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    if !(lo.is_finite() && hi.is_finite()) || hi <= lo {
        return vec![lo];
    }
    let raw = (hi - lo) / n.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let first = (lo / step).ceil() as i64;
    let last = (hi / step).floor() as i64;
    (first..=last).map(|i| i as f64 * step).collect()
}

/// A tick label: as few decimals as the step needs.
fn label(v: f64, step: f64) -> String {
    let decimals = if step >= 1.0 {
        0
    } else {
        (-step.log10().floor()) as usize
    };
    format!("{v:.decimals$}")
}

/// Writes a line chart of `series` to `path` (PNG, 800×360): x and y ranges from the
/// data (y from 0 when `y_from_zero`), a light grid with labelled ticks.
pub fn line_chart(path: &Path, series: &[Series], y_from_zero: bool) -> Result<()> {
    line_chart_over(path, series, y_from_zero, None)
}

/// [`line_chart`] over the x range `x` at least (a run's whole length, whether or not
/// every second has a point).
pub fn line_chart_over(
    path: &Path,
    series: &[Series],
    y_from_zero: bool,
    x: Option<(f64, f64)>,
) -> Result<()> {
    let all = || series.iter().flat_map(|s| s.points.iter().copied());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for (x, y) in all().filter(|(x, y)| x.is_finite() && y.is_finite()) {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    if let Some((from, to)) = x {
        (x0, x1) = (x0.min(from), x1.max(to));
    }
    if y_from_zero {
        y0 = y0.min(0.0);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    if y1 <= y0 {
        y1 = y0 + 1.0;
    }
    let pad = (y1 - y0) * 0.05;
    let (y0, y1) = (if y_from_zero { y0 } else { y0 - pad }, y1 + pad);
    let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    let err = |e: &dyn std::fmt::Debug| anyhow!("plot {}: {e:?}", path.display());
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .margin(MARGIN)
        .x_label_area_size(BOTTOM)
        .y_label_area_size(LEFT)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(|e| err(&e))?;
    let grid = RGBColor(220, 220, 220);
    let (xt, yt) = (ticks(x0, x1, 8), ticks(y0, y1, 6));
    let step = |t: &[f64]| match t {
        [a, b, ..] => b - a,
        _ => 1.0,
    };
    let (xs, ys) = (step(&xt), step(&yt));
    for &x in &xt {
        chart
            .draw_series(LineSeries::new([(x, y0), (x, y1)], &grid))
            .map_err(|e| err(&e))?;
    }
    for &y in &yt {
        chart
            .draw_series(LineSeries::new([(x0, y), (x1, y)], &grid))
            .map_err(|e| err(&e))?;
    }
    let axis = [(x0, y1), (x0, y0), (x1, y0)];
    chart
        .draw_series(LineSeries::new(axis, &BLACK))
        .map_err(|e| err(&e))?;
    for s in series {
        let points: Vec<(f64, f64)> = s
            .points
            .iter()
            .copied()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .collect();
        let style = s.color.stroke_width(2);
        if points.len() == 1 {
            chart
                .draw_series(points.iter().map(|p| Circle::new(*p, 3, style.filled())))
                .map_err(|e| err(&e))?;
        } else {
            chart
                .draw_series(LineSeries::new(points, style))
                .map_err(|e| err(&e))?;
        }
    }
    for &x in &xt {
        let (px, py) = chart.backend_coord(&(x, y0));
        let text = label(x, xs);
        draw_text(&root, &text, (px - text_width(&text) / 2, py + 8))?;
    }
    for &y in &yt {
        let (px, py) = chart.backend_coord(&(x0, y));
        let text = label(y, ys);
        draw_text(&root, &text, (px - text_width(&text) - 8, py - 5))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_ticks() {
        assert_eq!(ticks(0.0, 10.0, 5), [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(
            ticks(0.0, 600.0, 8),
            [0.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0]
        );
        assert_eq!(ticks(1.2, 1.9, 6).len(), 4, "{:?}", ticks(1.2, 1.9, 6));
        assert_eq!(label(0.30000000000000004, 0.1), "0.3");
        assert_eq!(label(2000.0, 500.0), "2000");
        assert!(glyph('x').is_none() && glyph('7').is_some());
    }

    #[test]
    fn writes_a_png() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chart.png");
        let series = [
            Series {
                color: COLORS[0],
                points: (0..100)
                    .map(|i| (i as f64, (i as f64 / 10.0).sin()))
                    .collect(),
            },
            Series {
                color: COLORS[1],
                points: vec![(5.0, 0.5)],
            },
        ];
        line_chart(&path, &series, false).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
    }
}
