//! `titan-rs bench train`: tokens/s, MFU and the communication share of training steps,
//! measured with the real train step on the configured mesh (ranks as threads).

use crate::config::JobConfig;
use crate::metrics::measure_matmul_tflops;
use crate::trainer::{RankContext, StepStats, Trainer};
use anyhow::{anyhow, Result};
use std::time::Duration;
use titan_parallel::{run_ranks_or_exit, MeshGroups};

/// PyTorch 2.15 + HF transformers Llama (sdpa), debugmodel, 8×256, AdamW, fp32, 2 threads,
/// measured on the 2-core development machine.
pub const PYTORCH_REFERENCE_TPS: f64 = 2400.0;

pub struct BenchResult {
    pub ranks: usize,
    /// Tokens of the whole job (every data-parallel rank) per second.
    pub tokens_per_s: f64,
    pub step_seconds: f64,
    /// Of a step, the share spent inside collectives (rank 0, median step).
    pub comm_share: f64,
    pub mfu: f64,
    pub peak_tflops: f64,
}

/// Times `steps` steps after `warmup` on one rank; returns the step stats and the trainer's
/// global tokens per step.
fn time_rank(cfg: JobConfig, rank: RankContext, warmup: usize, steps: usize) -> Result<(Vec<StepStats>, usize)> {
    let mut t = Trainer::new(cfg, rank)?;
    for _ in 0..warmup {
        t.train_step()?;
    }
    let stats = (0..steps).map(|_| t.train_step()).collect::<Result<Vec<_>>>()?;
    Ok((stats, t.tokens_per_step()))
}

pub fn bench(mut cfg: JobConfig, warmup: usize, steps: usize) -> Result<BenchResult> {
    cfg.checkpoint.enable = false;
    cfg.validation.enable = false;
    cfg.training.steps = cfg.training.steps.max((warmup + steps) as i64);
    let dims = cfg.parallelism.dims(None).map_err(|e| anyhow!(e))?;
    let ranks = dims.world_size;
    let (mut stats, tokens_per_step) = if ranks == 1 {
        time_rank(cfg.clone(), RankContext::single(), warmup, steps)?
    } else {
        let timeout = Duration::from_secs_f64(cfg.comm.timeout_seconds);
        let mut all = run_ranks_or_exit(ranks, timeout, Duration::from_secs(10), |comm| {
            let groups = MeshGroups::new(&comm, &dims)?;
            time_rank(cfg.clone(), RankContext::new(groups), warmup, steps)
        })?;
        all.swap_remove(0)
    };
    stats.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
    let median = &stats[stats.len() / 2];
    let tps = tokens_per_step as f64 / median.seconds;
    let peak = if cfg.metrics.peak_tflops > 0.0 {
        cfg.metrics.peak_tflops
    } else {
        measure_matmul_tflops(&burn::prelude::Device::flex())
    };
    let args = titan_models::ModelArgs::flavor(&cfg.model.flavor).expect("validated flavor");
    let tflops = tps * args.flops_per_token(cfg.training.seq_len as usize) / 1e12;
    Ok(BenchResult {
        ranks,
        tokens_per_s: tps,
        step_seconds: median.seconds,
        comm_share: median.comm_seconds / median.seconds,
        mfu: 100.0 * tflops / peak,
        peak_tflops: peak,
    })
}
