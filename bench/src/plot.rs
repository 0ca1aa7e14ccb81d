//! PNG line charts of the report: plotters' bitmap backend, text drawn with the bundled
//! DejaVu Sans (`bench/fonts/`, plotters' `ab_glyph` feature: pure Rust, no system font
//! library). Every chart has a title, axis titles with units, a light grid with labelled
//! ticks and, with more than one series, a legend.

use std::path::Path;
use std::sync::Once;

use anyhow::{Result, anyhow};
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};

/// One line of a chart.
#[derive(Debug, Clone)]
pub struct Series {
    /// Its name in the legend.
    pub label: String,
    pub color: RGBColor,
    pub points: Vec<(f64, f64)>,
}

/// What a chart says besides its lines.
#[derive(Debug, Clone, Copy)]
pub struct Chart<'a> {
    pub title: &'a str,
    /// The x axis' title with its unit, e.g. "time since start (s)".
    pub x_title: &'a str,
    /// The y axis' title with its unit, e.g. "RSS (MiB)".
    pub y_title: &'a str,
    /// The y axis starts at 0 (or below, for negative data).
    pub y_from_zero: bool,
    /// The x range to show at least (a run's whole length, whether or not every second
    /// has a point).
    pub x_range: Option<(f64, f64)>,
}

/// Colours of a chart's series, in order.
pub const COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
];

const WIDTH: u32 = 900;
const HEIGHT: u32 = 420;
const FONT: &str = "sans-serif";
/// DejaVu Sans 2.37 (Debian's fonts-dejavu-core), licence in `bench/fonts/LICENSE`.
static DEJAVU_SANS: &[u8] = include_bytes!("../fonts/DejaVuSans.ttf");

/// Registers the bundled font as [`FONT`] once per process.
fn register() -> Result<()> {
    static ONCE: Once = Once::new();
    let mut result = Ok(());
    ONCE.call_once(|| {
        if register_font(FONT, FontStyle::Normal, DEJAVU_SANS).is_err() {
            result = Err(anyhow!("the bundled font does not load"));
        }
    });
    result
}

/// Writes `chart` with `series` to `path` (PNG, 900×420): x and y ranges from the data
/// (and `chart.x_range`), the y axis from 0 when `chart.y_from_zero`.
pub fn line_chart(path: &Path, chart: &Chart<'_>, series: &[Series]) -> Result<()> {
    register()?;
    let finite = |(x, y): &(f64, f64)| x.is_finite() && y.is_finite();
    let all = || {
        series
            .iter()
            .flat_map(|s| s.points.iter().copied())
            .filter(finite)
    };
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for (x, y) in all() {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    if let Some((from, to)) = chart.x_range {
        (x0, x1) = (x0.min(from), x1.max(to));
    }
    if chart.y_from_zero {
        y0 = y0.min(0.0);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    if y1 <= y0 {
        y1 = y0 + 1.0;
    }
    let pad = (y1 - y0) * 0.05;
    let (y0, y1) = (if chart.y_from_zero { y0 } else { y0 - pad }, y1 + pad);
    let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    let err = |e: &dyn std::fmt::Debug| anyhow!("plot {}: {e:?}", path.display());
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut plot = ChartBuilder::on(&root)
        .caption(chart.title, (FONT, 20))
        .margin(14)
        .x_label_area_size(44)
        .y_label_area_size(72)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(|e| err(&e))?;
    plot.configure_mesh()
        .x_desc(chart.x_title)
        .y_desc(chart.y_title)
        .x_labels(10)
        .y_labels(8)
        .x_label_formatter(&|v| tick_label(*v))
        .y_label_formatter(&|v| tick_label(*v))
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 14))
        .light_line_style(WHITE)
        .bold_line_style(RGBColor(220, 220, 220))
        .draw()
        .map_err(|e| err(&e))?;
    for s in series {
        let points: Vec<(f64, f64)> = s.points.iter().copied().filter(finite).collect();
        let style = s.color.stroke_width(2);
        let color = s.color;
        let drawn = if points.len() == 1 {
            plot.draw_series(points.iter().map(|p| Circle::new(*p, 3, style.filled())))
        } else {
            plot.draw_series(LineSeries::new(points, style))
        }
        .map_err(|e| err(&e))?;
        drawn
            .label(s.label.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    if series.len() > 1 {
        plot.configure_series_labels()
            .label_font((FONT, 13))
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(180, 180, 180))
            .position(SeriesLabelPosition::UpperLeft)
            .draw()
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// A tick label: whole numbers without decimals, others with at most 3 significant
/// decimals (no float noise such as `0.30000000000000004`).
fn tick_label(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        // `+ 0.0` turns -0 into 0.
        format!("{}", v.round() + 0.0)
    } else {
        let text = format!("{v:.3}");
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart(title: &str) -> Chart<'_> {
        Chart {
            title,
            x_title: "time since start (s)",
            y_title: "latency (ms)",
            y_from_zero: true,
            x_range: None,
        }
    }

    #[test]
    fn tick_labels_have_no_float_noise() {
        assert_eq!(tick_label(10.0), "10");
        assert_eq!(tick_label(-0.0), "0");
        assert_eq!(tick_label(0.30000000000000004), "0.3");
        assert_eq!(tick_label(2.5), "2.5");
        assert_eq!(tick_label(1234.0), "1234");
    }

    #[test]
    fn writes_a_png_with_text() {
        let dir = tempfile::tempdir().unwrap();
        let series = [
            Series {
                label: "p99".into(),
                color: COLORS[0],
                points: (0..100)
                    .map(|i| (i as f64, (i as f64 / 10.0).sin() + 1.0))
                    .collect(),
            },
            Series {
                label: "one point".into(),
                color: COLORS[1],
                points: vec![(5.0, 0.5)],
            },
        ];
        let path = dir.path().join("chart.png");
        line_chart(&path, &chart("A title"), &series).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        // The text is drawn: the same lines with another title give another image.
        let other = dir.path().join("other.png");
        line_chart(&other, &chart("Another title"), &series).unwrap();
        assert_ne!(bytes, std::fs::read(&other).unwrap());
        // No data still gives a chart (empty axes), never an error.
        line_chart(&dir.path().join("empty.png"), &chart("Nothing"), &[]).unwrap();
    }
}
