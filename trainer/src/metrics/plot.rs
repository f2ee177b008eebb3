//! Training curves as one PNG: loss and validation loss against the step (title, axis labels,
//! legend), with learning-rate and gradient-norm panels below. Text is drawn with the bundled
//! DejaVu Sans (`assets/fonts/`, licence beside it) through plotters' `ab_glyph` backend, so no
//! system font is needed and the picture is the same on every machine.

use anyhow::{anyhow, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};
use std::path::Path;
use std::sync::Once;

static FONT: &[u8] = include_bytes!("../../../assets/fonts/DejaVuSans.ttf");

/// Registers the bundled font as plotters' `sans-serif` (once per process).
pub(crate) fn register_bundled_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if register_font("sans-serif", FontStyle::Normal, FONT).is_err() {
            tracing::warn!("the bundled font could not be loaded; plots will have no text");
        }
    });
}

/// What a run's curves show. Series are `(step, value)`.
pub struct Curves<'a> {
    pub title: &'a str,
    pub loss: &'a [(u64, f64)],
    pub val_loss: &'a [(u64, f64)],
    pub lr: &'a [(u64, f64)],
    pub grad_norm: &'a [(u64, f64)],
}

/// The plot's size in pixels.
pub const SIZE: (u32, u32) = (1000, 720);
/// Rows of the loss panel (the top one, under the title).
pub const LOSS_PANEL_ROWS: u32 = 430;
/// Width of each panel's y-label area and height of its x-label area.
pub const Y_LABEL_AREA: u32 = 70;
pub const X_LABEL_AREA: u32 = 45;

fn range(points: impl Iterator<Item = f64> + Clone) -> (f64, f64) {
    let (lo, hi) = points.fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)));
    if lo > hi {
        return (0.0, 1.0);
    }
    let pad = ((hi - lo) * 0.05).max(1e-9);
    (lo - pad, hi + pad)
}

fn steps_range(series: &[&[(u64, f64)]]) -> (f64, f64) {
    let steps = series.iter().flat_map(|s| s.iter().map(|p| p.0 as f64));
    let (lo, hi) = steps.fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)));
    if lo > hi {
        (0.0, 1.0)
    } else {
        (lo, hi.max(lo + 1.0))
    }
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;

/// One panel: `series` as (label, colour, points, as_dots).
fn panel(
    area: &Area,
    caption: &str,
    y_desc: &str,
    x: (f64, f64),
    series: &[(&str, RGBColor, &[(u64, f64)], bool)],
) -> Result<()> {
    let err = |e: &dyn std::fmt::Display| anyhow!("drawing the {caption} panel: {e}");
    let (y0, y1) = range(series.iter().flat_map(|s| s.2.iter().map(|p| p.1)).collect::<Vec<_>>().into_iter());
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(X_LABEL_AREA)
        .y_label_area_size(Y_LABEL_AREA)
        .build_cartesian_2d(x.0..x.1, y0..y1)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc(y_desc)
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 16))
        .y_label_formatter(&|v| match v.abs() {
            a if a >= 100.0 => format!("{v:.0}"),
            a if a >= 1.0 || a == 0.0 => format!("{v:.2}"),
            a if a >= 1e-2 => format!("{v:.3}"),
            _ => format!("{v:.1e}"),
        })
        .x_label_formatter(&|v| format!("{v:.0}"))
        .draw()
        .map_err(|e| err(&e))?;
    for &(label, color, points, dots) in series {
        if points.is_empty() {
            continue;
        }
        let data = points.iter().map(|&(s, v)| (s as f64, v));
        let drawn = if dots {
            chart.draw_series(data.map(|p| Circle::new(p, 4, color.filled()))).map_err(|e| err(&e))?
        } else {
            chart.draw_series(LineSeries::new(data, color.stroke_width(2))).map_err(|e| err(&e))?
        };
        drawn.label(label).legend(move |(x, y)| Rectangle::new([(x, y - 4), (x + 16, y + 4)], color.filled()));
    }
    if series.len() > 1 {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font(("sans-serif", 14))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(&e))?;
    }
    Ok(())
}

/// Draws `c` into `path` (PNG); returns a one-line summary for the console.
pub fn training_curves(path: &Path, c: &Curves) -> Result<String> {
    if c.loss.is_empty() {
        return Ok(String::new());
    }
    register_bundled_font();
    let err = |e: &dyn std::fmt::Display| anyhow!("drawing {}: {e}", path.display());
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let root = root.titled(c.title, ("sans-serif", 24)).map_err(|e| err(&e))?;
    let title_rows = SIZE.1 - root.dim_in_pixel().1;
    let (top, bottom) = root.split_vertically(LOSS_PANEL_ROWS - title_rows);
    let (left, right) = bottom.split_horizontally(SIZE.0 / 2);
    let x = steps_range(&[c.loss, c.val_loss]);
    let blue = RGBColor(31, 119, 180);
    let red = RGBColor(214, 39, 40);
    let green = RGBColor(44, 160, 44);
    let purple = RGBColor(148, 103, 189);
    panel(
        &top,
        "loss",
        "loss (nats/token)",
        x,
        &[("train loss", blue, c.loss, false), ("validation loss", red, c.val_loss, true)],
    )?;
    panel(&left, "learning rate", "lr", x, &[("lr", green, c.lr, false)])?;
    panel(&right, "gradient norm (before clipping)", "grad norm", x, &[("grad norm", purple, c.grad_norm, false)])?;
    root.present().map_err(|e| err(&e))?;
    let (first, last) = (c.loss[0], c.loss[c.loss.len() - 1]);
    let val = c.val_loss.last().map(|v| format!(", validation {:.4} at step {}", v.1, v.0)).unwrap_or_default();
    Ok(format!("loss {:.4} at step {} → {:.4} at step {}{val}", first.1, first.0, last.1, last.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Dark pixels in a rectangle of an RGB image.
    fn dark(img: &image::RgbImage, xs: std::ops::Range<u32>, ys: std::ops::Range<u32>) -> usize {
        ys.flat_map(|y| xs.clone().map(move |x| (x, y)))
            .filter(|&(x, y)| img.get_pixel(x, y).0.iter().all(|&c| c < 110))
            .count()
    }

    /// The axis regions hold text: tick numbers and labels left of the loss panel's y axis and
    /// under its x axis, and the title at the top. Without a font these strips stay white (the
    /// old plot drew tick marks only, inside the axes).
    #[test]
    fn the_plot_has_text_in_its_axis_regions() {
        let loss: Vec<(u64, f64)> = (1..=50).map(|s| (s, 8.0 - (s as f64).ln())).collect();
        let lr: Vec<(u64, f64)> = (1..=50).map(|s| (s, 1e-3 * (s as f64 / 50.0))).collect();
        let gn: Vec<(u64, f64)> = (1..=50).map(|s| (s, 1.0 / s as f64)).collect();
        let val = [(25, 5.0), (50, 4.3)];
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("curves.png");
        let c = Curves { title: "titan-rs test run", loss: &loss, val_loss: &val, lr: &lr, grad_norm: &gn };
        let summary = training_curves(&path, &c).unwrap();
        assert!(summary.contains("validation 4.3000 at step 50"), "{summary}");
        let img = image::open(&path).unwrap().to_rgb8();
        assert_eq!(img.dimensions(), SIZE);
        // The y-label strip of the loss panel: left margin to the axis, below the title.
        let y_strip = dark(&img, 12..(10 + Y_LABEL_AREA - 4), 70..(LOSS_PANEL_ROWS - X_LABEL_AREA - 10));
        // The x-label strip under the loss panel's axis.
        let x_strip = dark(
            &img,
            (10 + Y_LABEL_AREA + 5)..(SIZE.0 - 20),
            (LOSS_PANEL_ROWS - X_LABEL_AREA)..(LOSS_PANEL_ROWS - 10),
        );
        let title = dark(&img, 300..700, 0..30);
        assert!(y_strip > 150, "y-axis labels: {y_strip} dark pixels");
        assert!(x_strip > 150, "x-axis labels: {x_strip} dark pixels");
        assert!(title > 100, "title: {title} dark pixels");
    }
}
