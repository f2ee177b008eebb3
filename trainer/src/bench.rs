//! `titan-rs bench`: tokens/s and MFU of training steps, measured with the real train step.

use crate::config::JobConfig;
use crate::metrics::measure_matmul_tflops;
use crate::trainer::{RankContext, Trainer};
use anyhow::Result;

/// PyTorch 2.15 + HF transformers Llama (sdpa), debugmodel, 8×256, AdamW, fp32, 2 threads,
/// measured on the 2-core development machine.
pub const PYTORCH_REFERENCE_TPS: f64 = 2400.0;

pub struct BenchResult {
    pub tokens_per_s: f64,
    pub step_seconds: f64,
    pub mfu: f64,
    pub peak_tflops: f64,
}

pub fn bench(mut cfg: JobConfig, warmup: usize, steps: usize) -> Result<BenchResult> {
    cfg.checkpoint.enable = false;
    cfg.validation.enable = false;
    cfg.training.steps = cfg.training.steps.max((warmup + steps) as i64);
    let mut t = Trainer::new(cfg, RankContext::single())?;
    for _ in 0..warmup {
        t.train_step()?;
    }
    let mut times: Vec<f64> = (0..steps).map(|_| t.train_step().map(|s| s.seconds)).collect::<Result<_>>()?;
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let tps = t.tokens_per_step() as f64 / median;
    let peak = if t.cfg.metrics.peak_tflops > 0.0 {
        t.cfg.metrics.peak_tflops
    } else {
        measure_matmul_tflops(&t.device.clone().without_autodiff())
    };
    let tflops = tps * t.args.flops_per_token(t.cfg.training.seq_len as usize) / 1e12;
    Ok(BenchResult { tokens_per_s: tps, step_seconds: median, mfu: 100.0 * tflops / peak, peak_tflops: peak })
}
