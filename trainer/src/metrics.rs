//! Metrics: console (progress bar on a terminal, plain lines otherwise), `metrics.jsonl`,
//! throughput, TFLOP/s and MFU, memory, ETA.

use crate::trainer::StepStats;
use anyhow::{Context, Result};
use burn::prelude::*;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use std::fs::{File, OpenOptions};
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::{Duration, Instant};

/// Resident and peak memory of this process in GiB (Linux `/proc/self/status`).
pub fn memory_gib() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map(|kb| kb / (1024.0 * 1024.0))
            .unwrap_or(0.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Achieved TFLOP/s of a 1024³ f32 matmul on `device` through the model's linear-layer path
/// (on the CPU: the kernels' threaded GEMM), best of a few: the CPU "peak" for MFU.
pub fn measure_matmul_tflops(device: &Device) -> f64 {
    let n = 1024;
    let a = Tensor::<2>::ones([n, n], device);
    let b = Tensor::<2>::ones([n, n], device);
    let mut best = f64::MAX;
    for _ in 0..10 {
        let t = Instant::now();
        let c: f32 = titan_kernels::linear(a.clone(), b.clone(), true).slice([0..1, 0..1]).into_scalar();
        assert_eq!(c, n as f32);
        best = best.min(t.elapsed().as_secs_f64());
    }
    2.0 * (n as f64).powi(3) / best / 1e12
}

fn human_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

pub struct MetricsLogger {
    jsonl: File,
    log_freq: u64,
    total_steps: u64,
    flops_per_token: f64,
    peak_tflops: f64,
    started: Instant,
    steps_this_run: u64,
    window_tokens: usize,
    window_seconds: f64,
    bar: Option<ProgressBar>,
    pub history: Vec<(u64, f64)>,
    pub val_history: Vec<(u64, f64)>,
}

impl MetricsLogger {
    pub fn new(
        dump: &Path,
        log_freq: u64,
        first_step: u64,
        total_steps: u64,
        flops_per_token: f64,
        peak_tflops: f64,
    ) -> Result<Self> {
        std::fs::create_dir_all(dump).with_context(|| format!("creating {}", dump.display()))?;
        let path = dump.join("metrics.jsonl");
        let jsonl = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = ProgressBar::new(total_steps);
            b.set_style(ProgressStyle::with_template("{bar:30} {pos}/{len} steps  {msg}").unwrap());
            b.set_position(first_step);
            b
        });
        Ok(Self {
            jsonl,
            log_freq,
            total_steps,
            flops_per_token,
            peak_tflops,
            started: Instant::now(),
            steps_this_run: 0,
            window_tokens: 0,
            window_seconds: 0.0,
            bar,
            history: Vec::new(),
            val_history: Vec::new(),
        })
    }

    fn say(&self, line: &str) {
        match &self.bar {
            Some(b) => b.println(line),
            None => println!("{line}"),
        }
    }

    pub fn step(&mut self, s: &StepStats) -> Result<()> {
        self.history.push((s.step, s.loss));
        self.steps_this_run += 1;
        self.window_tokens += s.tokens;
        self.window_seconds += s.seconds;
        if let Some(b) = &self.bar {
            b.set_position(s.step);
            b.set_message(format!("loss {:.4}", s.loss));
        }
        if s.step % self.log_freq != 0 && s.step != self.total_steps && s.step != 1 {
            return Ok(());
        }
        let tps = self.window_tokens as f64 / self.window_seconds.max(1e-9);
        let tflops = tps * self.flops_per_token / 1e12;
        let mfu = 100.0 * tflops / self.peak_tflops;
        let (mem, peak_mem) = memory_gib();
        let per_step = self.started.elapsed().as_secs_f64() / self.steps_this_run as f64;
        let eta = Duration::from_secs_f64(per_step * (self.total_steps - s.step) as f64);
        self.say(&format!(
            "step {:>5}  loss {:>8.4}  grad_norm {:>7.4}  lr {:.2e}  tps {:>7.0}  tflops {:.3}  mfu {:>5.2}%  mem {:.2}GiB  eta {}",
            s.step, s.loss, s.grad_norm, s.lr, tps, tflops, mfu, mem, human_duration(eta)
        ));
        let line = json!({
            "step": s.step, "loss": s.loss, "grad_norm": s.grad_norm, "lr": s.lr,
            "tokens_per_s": tps, "tflops": tflops, "mfu": mfu, "memory_gib": mem,
            "peak_memory_gib": peak_mem, "step_time_s": s.seconds, "comm_time_s": s.comm_seconds,
            "param_bytes": s.param_bytes, "optim_bytes": s.optim_bytes,
        });
        writeln!(self.jsonl, "{line}")?;
        self.window_tokens = 0;
        self.window_seconds = 0.0;
        Ok(())
    }

    pub fn validation(&mut self, step: u64, val_loss: f64, tokens: usize) -> Result<()> {
        self.val_history.push((step, val_loss));
        self.say(&format!("step {step:>5}  val_loss {val_loss:>8.4}  ({tokens} tokens)"));
        writeln!(self.jsonl, "{}", json!({"step": step, "val_loss": val_loss, "val_tokens": tokens}))?;
        Ok(())
    }

    pub fn note(&self, line: &str) {
        self.say(line);
    }

    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
