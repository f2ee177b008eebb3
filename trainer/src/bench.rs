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
    /// Of the forward/backward schedule's wall time, the share ranks spent waiting for other
    /// pipeline stages (mean over ranks of each rank's median step); 0 without pipelining.
    pub bubble: f64,
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
    let mut all = if ranks == 1 {
        vec![time_rank(cfg.clone(), RankContext::single(), warmup, steps)?]
    } else {
        let timeout = Duration::from_secs_f64(cfg.comm.timeout_seconds);
        run_ranks_or_exit(ranks, timeout, Duration::from_secs(10), |comm| {
            let groups = MeshGroups::new(&comm, &dims)?;
            time_rank(cfg.clone(), RankContext::new(groups), warmup, steps)
        })?
    };
    for (stats, _) in &mut all {
        stats.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
    }
    let bubble = all
        .iter()
        .map(|(s, _)| &s[s.len() / 2])
        .map(|m| 1.0 - m.busy_seconds / m.pipeline_seconds.max(f64::MIN_POSITIVE))
        .sum::<f64>()
        / ranks as f64;
    let (stats, tokens_per_step) = all.swap_remove(0);
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
        bubble: if cfg.parallelism.pipeline_parallel_degree > 1 { bubble.max(0.0) } else { 0.0 },
    })
}

/// What a bench row describes: the model, the layout and the shape per rank.
pub fn label(cfg: &JobConfig) -> String {
    let p = &cfg.parallelism;
    let mut layout = format!(
        "replicate {} × shard {} × tp {}{}",
        p.data_parallel_replicate_degree,
        p.dims(None).map(|d| d.dp_shard).unwrap_or(1),
        p.tensor_parallel_degree,
        if p.tensor_parallel_degree > 1 && !p.enable_sequence_parallel { " (no SP)" } else { "" }
    );
    if p.pipeline_parallel_degree > 1 {
        let n = if p.num_pp_microbatches > 0 { p.num_pp_microbatches } else { p.pipeline_parallel_degree };
        layout += &format!(" × pp {} {} ({n} microbatches)", p.pipeline_parallel_degree, p.pipeline_parallel_schedule);
    }
    let t = &cfg.training;
    format!("{} | {layout} | {}×{}", cfg.model.flavor, t.local_batch_size, t.seq_len)
}

/// Prints the result as a Markdown table row under its header.
pub fn print_table(label: &str, r: &BenchResult) {
    println!(
        "| model | layout | batch×seq per rank | ranks | step (s) | tokens/s (all ranks) | comm share | pipeline bubble | MFU | peak TFLOP/s | vs PyTorch eager ≈{PYTORCH_REFERENCE_TPS} tok/s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    println!(
        "| {label} | {} | {:.3} | {:.0} | {:.1}% | {:.1}% | {:.2}% | {:.3} | {:.2}× |",
        r.ranks,
        r.step_seconds,
        r.tokens_per_s,
        100.0 * r.comm_share,
        100.0 * r.bubble,
        r.mfu,
        r.peak_tflops,
        r.tokens_per_s / PYTORCH_REFERENCE_TPS
    );
}
