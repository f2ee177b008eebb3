//! The per-step metrics of a rank: console lines (a progress bar on a terminal, plain lines
//! otherwise), `metrics.jsonl`, TensorBoard scalars, and the histories the plot is drawn from.

use super::console::Palette;
use super::peak::Peak;
use super::tensorboard::EventWriter;
use crate::metrics::StepStats;
use crate::optim::loss_spike::SkippedWindow;
use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use std::fs::{File, OpenOptions};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Resident and peak memory of this process in GiB (Linux `/proc/self/status`; 0 elsewhere).
pub fn memory_gib() -> (f64, f64) {
    let field = |name| crate::memory::gib(crate::memory::proc_bytes("/proc/self/status", name).unwrap_or(0));
    (field("VmRSS:"), field("VmHWM:"))
}

fn human_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// Where a rank's metrics go.
pub struct Sinks {
    /// Print lines (and a progress bar on a terminal): the logging rank.
    pub console: bool,
    /// Colour the printed lines.
    pub color: bool,
    /// Append to `{dump}/metrics.jsonl`: the logging rank.
    pub jsonl: bool,
    /// Write TensorBoard events into this folder.
    pub tensorboard: Option<PathBuf>,
    /// Ranks that share one data-parallel rank's tokens (tensor × pipeline degree): `tps` is
    /// per rank, so a step's tokens are divided by it (TorchTitan's `non_data_parallel_size`).
    pub ranks_per_batch: usize,
}

/// MFU of `tflops` against `peak`. A peak titan-rs obtained itself is raised to any
/// throughput actually achieved (it was then too low), so our own MFU never passes 100 %;
/// returns the MFU and whether the peak was raised.
pub fn mfu(tflops: f64, peak: &mut Option<Peak>) -> (Option<f64>, bool) {
    let Some(p) = peak.as_mut() else { return (None, false) };
    let raised = p.own && tflops > p.tflops;
    if raised {
        p.tflops = tflops;
        p.how = format!("raised to the {tflops:.3} TFLOP/s this run achieved");
    }
    (Some(100.0 * tflops / p.tflops), raised)
}

pub struct MetricsLogger {
    jsonl: Option<File>,
    tb: Option<EventWriter>,
    console: bool,
    palette: Palette,
    log_freq: u64,
    total_steps: u64,
    flops_per_token: f64,
    pub peak: Option<Peak>,
    started: Instant,
    steps_this_run: u64,
    window_tokens: usize,
    window_seconds: f64,
    window_comm: f64,
    ranks_per_batch: usize,
    bar: Option<ProgressBar>,
    /// (step, loss), every step.
    pub history: Vec<(u64, f64)>,
    pub val_history: Vec<(u64, f64)>,
    pub lr_history: Vec<(u64, f64)>,
    pub grad_norm_history: Vec<(u64, f64)>,
}

impl MetricsLogger {
    pub fn new(
        dump: &Path,
        sinks: Sinks,
        log_freq: u64,
        first_step: u64,
        total_steps: u64,
        flops_per_token: f64,
        peak: Option<Peak>,
    ) -> Result<Self> {
        std::fs::create_dir_all(dump).with_context(|| format!("creating {}", dump.display()))?;
        let jsonl = if sinks.jsonl {
            let path = dump.join("metrics.jsonl");
            Some(
                OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .with_context(|| format!("opening {}", path.display()))?,
            )
        } else {
            None
        };
        let tb = sinks.tensorboard.as_deref().map(EventWriter::create).transpose()?;
        let bar = (sinks.console && std::io::stderr().is_terminal()).then(|| {
            let b = ProgressBar::new(total_steps);
            b.set_style(ProgressStyle::with_template("{bar:30} {pos}/{len} steps  {msg}").unwrap());
            b.set_position(first_step);
            b
        });
        Ok(Self {
            jsonl,
            tb,
            console: sinks.console,
            palette: Palette::new(sinks.color),
            log_freq,
            total_steps,
            flops_per_token,
            peak,
            started: Instant::now(),
            steps_this_run: 0,
            window_tokens: 0,
            window_seconds: 0.0,
            window_comm: 0.0,
            ranks_per_batch: sinks.ranks_per_batch.max(1),
            bar,
            history: Vec::new(),
            val_history: Vec::new(),
            lr_history: Vec::new(),
            grad_norm_history: Vec::new(),
        })
    }

    /// The TensorBoard event file, if any.
    pub fn tensorboard_file(&self) -> Option<&Path> {
        self.tb.as_ref().map(EventWriter::path)
    }

    fn say(&self, line: &str) {
        if !self.console {
            return;
        }
        match &self.bar {
            Some(b) => b.println(line),
            None => println!("{line}"),
        }
    }

    pub fn step(&mut self, s: &StepStats) -> Result<()> {
        self.history.push((s.step, s.loss));
        self.lr_history.push((s.step, s.lr));
        self.grad_norm_history.push((s.step, s.grad_norm));
        self.steps_this_run += 1;
        self.window_tokens += s.tokens;
        self.window_seconds += s.seconds;
        self.window_comm += s.comm_seconds;
        if let Some(b) = &self.bar {
            b.set_position(s.step);
            b.set_message(format!("loss {:.4}", s.loss));
        }
        if s.step % self.log_freq != 0 && s.step != self.total_steps && s.step != 1 {
            return Ok(());
        }
        let tps = self.window_tokens as f64 / self.window_seconds.max(1e-9) / self.ranks_per_batch as f64;
        let tflops = tps * self.flops_per_token / 1e12;
        let (mfu, raised) = mfu(tflops, &mut self.peak);
        if raised {
            self.say(&format!(
                "note: this window reached {tflops:.3} TFLOP/s, above the peak titan-rs estimated; MFU is now measured against it"
            ));
        }
        let (mem, peak_mem) = memory_gib();
        let comm_share = self.window_comm / self.window_seconds.max(1e-9);
        let per_step = self.started.elapsed().as_secs_f64() / self.steps_this_run as f64;
        let eta = Duration::from_secs_f64(per_step * (self.total_steps - s.step) as f64);
        let p = self.palette;
        let mfu_text = mfu.map_or("n/a".to_string(), |m| format!("{m:>5.2}%"));
        self.say(&format!(
            "{}  {}  grad_norm {:>7.4}  lr {:.2e}  tps {:>7.0}  tflops {:.3}  {}  {}  eta {}",
            p.cyan(&format!("step {:>5}", s.step)),
            p.green(&format!("loss {:>8.4}", s.loss)),
            s.grad_norm,
            s.lr,
            tps,
            tflops,
            p.magenta(&format!("mfu {mfu_text}")),
            p.yellow(&format!("mem {mem:.2}GiB")),
            human_duration(eta)
        ));
        if let Some(f) = self.jsonl.as_mut() {
            let line = json!({
                "step": s.step, "loss": s.loss, "grad_norm": s.grad_norm, "lr": s.lr,
                "tokens_per_s": tps, "tflops": tflops, "mfu": mfu,
                "peak_tflops": self.peak.as_ref().map(|p| p.tflops), "memory_gib": mem,
                "peak_memory_gib": peak_mem, "runtime_memory_gib": crate::memory::runtime_gib(),
                "step_time_s": s.seconds, "comm_time_s": s.comm_seconds + s.comm_hidden_seconds,
                "comm_exposed_s": s.comm_seconds, "comm_hidden_s": s.comm_hidden_seconds,
                "param_bytes": s.param_bytes, "optim_bytes": s.optim_bytes,
            });
            let mut line = line;
            if !s.expert_load.is_empty() {
                // MoE: per layer, max/mean tokens per expert and the tokens of each expert.
                line["moe_imbalance"] =
                    s.expert_load.iter().map(|l| (format!("layers.{}", l.layer), json!(l.imbalance))).collect();
                line["moe_tokens_per_expert"] =
                    s.expert_load.iter().map(|l| (format!("layers.{}", l.layer), json!(l.tokens))).collect();
                line["moe_aux_loss"] =
                    s.expert_load.iter().map(|l| (format!("layers.{}", l.layer), json!(l.aux_loss))).collect();
                line["all_to_all_time_s"] = json!(s.all_to_all_seconds);
            }
            if let Some(scale) = s.loss_scale {
                line["loss_scale"] = json!(scale);
            }
            if let Some(suspects) = &s.sdc_suspects {
                line["sdc_suspects"] = json!(suspects);
            }
            if !s.stragglers.is_empty() {
                line["stragglers"] = json!(s.stragglers);
            }
            if s.skipped || s.loss_scale.is_some() {
                line["skipped"] = json!(s.skipped);
            }
            if !s.tokens_by_source.is_empty() {
                // Dataset mixtures: tokens seen so far from each source (the whole job).
                line["tokens_by_source"] = s.tokens_by_source.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
            }
            writeln!(f, "{line}")?;
        }
        if let Some(tb) = self.tb.as_mut() {
            let mut scalars = vec![
                ("loss_metrics/global_avg_loss", s.loss),
                ("grad_norm", s.grad_norm),
                ("lr", s.lr),
                ("throughput(tps)", tps),
                ("tflops", tflops),
                ("memory/rss(GiB)", mem),
                ("memory/max_rss(GiB)", peak_mem),
                ("time_metrics/step_time(s)", s.seconds),
                ("time_metrics/comm_share(%)", 100.0 * comm_share),
            ];
            if let Some(m) = mfu {
                scalars.push(("mfu(%)", m));
            }
            let moe: Vec<(String, f64)> =
                s.expert_load.iter().map(|l| (format!("moe/imbalance/layers.{}", l.layer), l.imbalance)).collect();
            scalars.extend(moe.iter().map(|(k, v)| (k.as_str(), *v)));
            tb.scalars(s.step, &scalars)?;
        }
        self.window_tokens = 0;
        self.window_seconds = 0.0;
        self.window_comm = 0.0;
        Ok(())
    }

    pub fn validation(&mut self, step: u64, val_loss: f64, tokens: usize) -> Result<()> {
        self.val_history.push((step, val_loss));
        let p = self.palette;
        self.say(&format!(
            "{}  {}  ({tokens} tokens)",
            p.cyan(&format!("step {step:>5}")),
            p.blue(&format!("val_loss {val_loss:>8.4}"))
        ));
        if let Some(f) = self.jsonl.as_mut() {
            writeln!(f, "{}", json!({"step": step, "val_loss": val_loss, "val_tokens": tokens}))?;
        }
        if let Some(tb) = self.tb.as_mut() {
            tb.scalars(step, &[("validation_metrics/loss", val_loss)])?;
        }
        Ok(())
    }

    pub fn note(&self, line: &str) {
        self.say(line);
    }

    /// A loss-spike rollback: the console line and a `{"step", "rollback": {...}}` line in
    /// `metrics.jsonl`. The history keeps only steps before the one rolled back to (they run
    /// again).
    pub fn rollback(&mut self, step: u64, window: &SkippedWindow, zscore: f64) -> Result<()> {
        self.say(&format!(
            "step {step}: loss spike (robust z-score {zscore:.1}): rolled back to step {}, skipping samples [{}, {}) (`fault.loss_spike_zscore`)",
            window.resumed_from_step, window.first_sample, window.end_sample
        ));
        let back = window.resumed_from_step;
        self.history.retain(|&(s, _)| s <= back);
        self.lr_history.retain(|&(s, _)| s <= back);
        self.grad_norm_history.retain(|&(s, _)| s <= back);
        if let Some(f) = self.jsonl.as_mut() {
            writeln!(f, "{}", json!({"step": step, "rollback": window, "zscore": zscore}))?;
        }
        Ok(())
    }

    /// Draws the training curves into `path`; returns the console summary.
    pub fn plot(&self, path: &Path, title: &str) -> Result<String> {
        let c = super::plot::Curves {
            title,
            loss: &self.history,
            val_loss: &self.val_history,
            lr: &self.lr_history,
            grad_norm: &self.grad_norm_history,
        };
        super::plot::training_curves(path, &c)
    }

    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_peak_is_raised_so_mfu_never_passes_100() {
        let own = || Some(Peak { tflops: 0.1, how: "measured".into(), own: true });
        let mut p = own();
        assert_eq!(mfu(0.05, &mut p), (Some(50.0), false));
        let (m, raised) = mfu(0.12, &mut p);
        assert!(raised && (m.unwrap() - 100.0).abs() < 1e-9);
        assert_eq!(p.as_ref().unwrap().tflops, 0.12);
        assert!(mfu(0.06, &mut p).0.unwrap() <= 50.0 + 1e-9);
        let mut user = Some(Peak { tflops: 0.1, how: "metrics.peak_tflops".into(), own: false });
        assert_eq!(mfu(0.2, &mut user), (Some(200.0), false), "the user's peak is used as given");
        assert_eq!(mfu(0.2, &mut None), (None, false));
    }
}
