//! Step traces (`[profiling]`, TorchTitan's keys): every `profile_freq`-th step each rank
//! records spans — the step, data loading, each pipeline stage's forward and backward per
//! microbatch, each layer's forward and backward, every collective with its bytes and peers,
//! pipeline send/recv and the waits for other stages, gradient reduction, the optimizer,
//! validation and checkpoint saves — and writes
//! `{dump}/{save_traces_folder}/iteration_{step}/rank{r}_trace.json` (Chrome trace events: open it
//! in Perfetto or `chrome://tracing`). [`timeline`] draws an iteration's files as one picture.

use crate::config::JobConfig;
use crate::rank::RankContext;
use anyhow::{anyhow, bail, Context, Result};
use plotters::prelude::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Whether `step` (1-based) is recorded.
pub fn should_profile(cfg: &JobConfig, step: u64) -> bool {
    let p = &cfg.profiling;
    p.enable_profiling && p.profile_freq > 0 && step % p.profile_freq == 0
}

/// The folder of one recorded step.
pub fn iteration_dir(cfg: &JobConfig, step: u64) -> PathBuf {
    Path::new(&cfg.job.dump_folder).join(&cfg.profiling.save_traces_folder).join(format!("iteration_{step}"))
}

/// Where rank `rank`'s trace of `step` goes.
pub fn trace_path(cfg: &JobConfig, step: u64, rank: usize) -> PathBuf {
    iteration_dir(cfg, step).join(format!("rank{rank}_trace.json"))
}

/// The lane name of a rank in the viewer: its world rank and its mesh coordinates.
pub fn rank_label(r: &RankContext) -> String {
    let mut parts = Vec::new();
    if r.pp.is_some() {
        parts.push(format!("pp {}", r.pp_rank));
    }
    if r.dp_degree > 1 {
        parts.push(format!("dp {}", r.dp_rank));
    }
    if let Some(tp) = &r.tp {
        parts.push(format!("tp {}", tp.rank()));
    }
    if parts.is_empty() {
        format!("rank {}", r.world_rank)
    } else {
        format!("rank {} ({})", r.world_rank, parts.join(", "))
    }
}

/// Stops this thread's recording and writes it for `step`, if it was recording.
pub fn write_recording(cfg: &JobConfig, step: u64) -> Result<Option<PathBuf>> {
    let Some(trace) = titan_profiling::finish() else { return Ok(None) };
    let path = trace_path(cfg, step, trace.rank);
    trace.write(&path).with_context(|| format!("writing the step trace {}", path.display()))?;
    Ok(Some(path))
}

/// Colour of a span category in the timeline.
fn category_color(cat: &str) -> RGBColor {
    match cat {
        "step" => RGBColor(200, 200, 200),
        "data" => RGBColor(140, 86, 75),
        "forward" => RGBColor(31, 119, 180),
        "backward" => RGBColor(255, 127, 14),
        "comm" => RGBColor(214, 39, 40),
        "pipeline" => RGBColor(44, 160, 44),
        "optimizer" => RGBColor(148, 103, 189),
        "checkpoint" => RGBColor(188, 189, 34),
        "validation" => RGBColor(23, 190, 207),
        _ => RGBColor(127, 127, 127),
    }
}

const CATEGORIES: [&str; 9] =
    ["step", "data", "forward", "backward", "comm", "pipeline", "optimizer", "checkpoint", "validation"];

struct Span {
    cat: String,
    start: f64,
    end: f64,
    depth: usize,
    /// Drawn on the rank's communication-stream lane (trace thread 1), below its nested spans.
    stream: bool,
}

/// A rank's spans with their nesting depth (spans contained in an earlier one sit below it).
fn read_rank(path: &Path) -> Result<(String, Vec<Span>)> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let v: Value = serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let events = v["traceEvents"].as_array().ok_or_else(|| anyhow!("{}: no traceEvents", path.display()))?;
    let label = events
        .iter()
        .find(|e| e["name"] == "process_name")
        .and_then(|e| e["args"]["name"].as_str())
        .unwrap_or("rank")
        .to_string();
    let mut spans: Vec<Span> = events
        .iter()
        .filter(|e| e["ph"] == "X")
        .map(|e| {
            let (ts, dur) = (e["ts"].as_f64().unwrap_or(0.0), e["dur"].as_f64().unwrap_or(0.0));
            let stream = e["tid"].as_u64().unwrap_or(0) != 0;
            Span { cat: e["cat"].as_str().unwrap_or("").to_string(), start: ts, end: ts + dur, depth: 0, stream }
        })
        .collect();
    spans.sort_by(|a, b| a.start.total_cmp(&b.start).then(b.end.total_cmp(&a.end)));
    let mut open: Vec<f64> = Vec::new();
    for s in spans.iter_mut().filter(|s| !s.stream) {
        while open.last().is_some_and(|&end| end <= s.start) {
            open.pop();
        }
        s.depth = open.len();
        open.push(s.end);
    }
    Ok((label, spans))
}

/// Draws every `rank*_trace.json` of one iteration folder as a timeline (a band per rank,
/// nested spans stacked, the communication stream's collectives on a row of their own below them,
/// coloured by category) into `out`; returns the number of ranks.
pub fn timeline(dir: &Path, out: &Path) -> Result<usize> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("rank") && n.ends_with("_trace.json"))
        })
        .collect();
    let rank_of = |p: &PathBuf| -> usize {
        let n = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        n.trim_start_matches("rank").trim_end_matches("_trace.json").parse().unwrap_or(usize::MAX)
    };
    files.sort_by_key(rank_of);
    if files.is_empty() {
        bail!("{} holds no rank*_trace.json files; record some with --profiling.enable_profiling", dir.display());
    }
    let ranks: Vec<(String, Vec<Span>)> = files.iter().map(|p| read_rank(p)).collect::<Result<_>>()?;
    let t0 = ranks.iter().flat_map(|r| r.1.iter().map(|s| s.start)).fold(f64::MAX, f64::min);
    let t1 = ranks.iter().flat_map(|r| r.1.iter().map(|s| s.end)).fold(f64::MIN, f64::max);
    let depth =
        ranks.iter().flat_map(|r| r.1.iter().filter(|s| !s.stream).map(|s| s.depth + 1)).max().unwrap_or(1).min(6);
    // With overlapped collectives, each band gets one more row: the communication stream's.
    let lane = ranks.iter().any(|r| r.1.iter().any(|s| s.stream));
    let band_rows = depth + 1 + usize::from(lane);
    super::plot::register_bundled_font();
    let rows = (ranks.len() * band_rows) as f64;
    let height = (140 + ranks.len() * band_rows * 18).min(2000) as u32;
    let err = |e: &dyn std::fmt::Display| anyhow!("drawing {}: {e}", out.display());
    let root = BitMapBackend::new(out, (1400, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let ms = ((t1 - t0) / 1e3).max(1e-3);
    let legend_width = 150;
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("step trace: {}", dir.display()), ("sans-serif", 20))
        .margin(10)
        .margin_right(legend_width + 10)
        .x_label_area_size(40)
        .y_label_area_size(190)
        .build_cartesian_2d(0.0..ms, rows..0.0)
        .map_err(|e| err(&e))?;
    let band = band_rows as f64;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .disable_y_axis()
        .x_desc("milliseconds since the first span")
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(|e| err(&e))?;
    for (i, (label, spans)) in ranks.iter().enumerate() {
        let base = i as f64 * band;
        chart
            .draw_series(spans.iter().filter(|s| s.stream || s.depth < depth).map(|s| {
                let y = base + if s.stream { depth } else { s.depth } as f64;
                let (x0, x1) = ((s.start - t0) / 1e3, (s.end - t0) / 1e3);
                Rectangle::new([(x0, y + 0.08), (x1.max(x0 + ms * 5e-4), y + 0.92)], category_color(&s.cat).filled())
            }))
            .map_err(|e| err(&e))?;
        let (_, py) = chart.backend_coord(&(0.0, base + band / 2.0 - 0.5));
        root.draw(&Text::new(label.clone(), (12, py - 7), ("sans-serif", 14))).map_err(|e| err(&e))?;
    }
    let x = 1400 - legend_width as i32;
    for (i, cat) in CATEGORIES.iter().enumerate() {
        let y = 60 + 20 * i as i32;
        root.draw(&Rectangle::new([(x, y), (x + 14, y + 12)], category_color(cat).filled())).map_err(|e| err(&e))?;
        root.draw(&Text::new(cat.to_string(), (x + 20, y - 1), ("sans-serif", 13))).map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(ranks.len())
}
