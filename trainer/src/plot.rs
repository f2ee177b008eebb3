//! The loss curve as a PNG (training loss in blue, validation loss as red dots), drawn with
//! `plotters`' bitmap backend. No fonts are needed: the axes carry tick marks, and the ranges are
//! printed next to the file name.

use anyhow::{anyhow, Result};
use plotters::prelude::*;
use std::path::Path;

pub fn loss_curve(path: &Path, train: &[(u64, f64)], val: &[(u64, f64)]) -> Result<String> {
    if train.is_empty() {
        return Ok(String::new());
    }
    let all = train.iter().chain(val);
    let (x0, x1) = (train[0].0.min(val.first().map_or(u64::MAX, |v| v.0)), all.clone().map(|p| p.0).max().unwrap());
    let (mut y0, mut y1) = all.fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.1), b.max(p.1)));
    if y1 - y0 < 1e-9 {
        y0 -= 0.5;
        y1 += 0.5;
    }
    let err = |e: &dyn std::fmt::Display| anyhow!("drawing {}: {e}", path.display());
    let root = BitMapBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let area = root.margin(20, 20, 20, 20);
    let (w, h) = area.dim_in_pixel();
    let x_range = (x1 - x0).max(1) as f64;
    let px = |s: u64, l: f64| {
        ((((s - x0) as f64 / x_range) * (w as f64 - 1.0)) as i32, (((y1 - l) / (y1 - y0)) * (h as f64 - 1.0)) as i32)
    };
    area.draw(&PathElement::new(vec![(0, 0), (0, h as i32 - 1), (w as i32 - 1, h as i32 - 1)], BLACK.stroke_width(2)))
        .map_err(|e| err(&e))?;
    for k in 0..=10 {
        let x = (k * (w as i32 - 1)) / 10;
        let y = (k * (h as i32 - 1)) / 10;
        area.draw(&PathElement::new(vec![(x, h as i32 - 1), (x, h as i32 - 9)], BLACK)).map_err(|e| err(&e))?;
        area.draw(&PathElement::new(vec![(0, y), (8, y)], BLACK)).map_err(|e| err(&e))?;
    }
    let pts: Vec<(i32, i32)> = train.iter().map(|&(s, l)| px(s, l)).collect();
    area.draw(&PathElement::new(pts, BLUE.stroke_width(2))).map_err(|e| err(&e))?;
    for &(s, l) in val {
        area.draw(&Circle::new(px(s, l), 4, RED.filled())).map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(format!("x: steps {x0}..{x1}, y: loss {y0:.3}..{y1:.3}, 10 ticks per axis"))
}
