//! `titan-rs train`: the loop, top to bottom.

use crate::config::{to_toml, JobConfig};
use crate::metrics::{measure_matmul_tflops, MetricsLogger};
use crate::trainer::{RankContext, Trainer};
use std::time::Duration;
use titan_parallel::{run_ranks_or_exit, Communicator};
use anyhow::Result;
use std::path::PathBuf;

/// What a finished run reports.
#[derive(Debug)]
pub struct Summary {
    pub last_step: u64,
    pub final_loss: Option<f64>,
    pub final_val_loss: Option<f64>,
}

/// Trains with the configured layout: one rank, or `data_parallel_replicate_degree` data-parallel
/// ranks as threads of this process (rank 0 logs and checkpoints).
pub fn run(cfg: JobConfig) -> Result<Summary> {
    if cfg.job.print_config {
        println!("{}", to_toml(&cfg));
    }
    let world = cfg.parallelism.data_parallel_replicate_degree as usize;
    if world == 1 {
        return run_rank(cfg, RankContext::single());
    }
    let timeout = Duration::from_secs_f64(cfg.comm.timeout_seconds);
    let summaries = run_ranks_or_exit(world, timeout, Duration::from_secs(10), |comm| {
        let ctx = RankContext { dp_rank: comm.rank(), dp_degree: world, dp: Some(Box::new(comm)) };
        run_rank(cfg.clone(), ctx)
    })?;
    Ok(summaries.into_iter().next().expect("rank 0"))
}

fn run_rank(cfg: JobConfig, rank: RankContext) -> Result<Summary> {
    let dump = PathBuf::from(&cfg.job.dump_folder);
    let steps = cfg.training.steps as u64;
    let logs = rank.dp_rank == 0;
    let mut t = Trainer::new(cfg, rank)?;
    let cfg = t.cfg.clone();
    if !logs {
        while t.step < steps {
            t.train_step()?;
            if cfg.debug.stop_at_step == t.step as i64 {
                break;
            }
        }
        return Ok(Summary { last_step: t.step, final_loss: None, final_val_loss: None });
    }

    let n_params = t.args.num_params();
    println!(
        "model llama3/{}: {} parameters ({:.2} M), {} layers, dim {}, vocab {}",
        cfg.model.flavor, n_params, n_params as f64 / 1e6, t.args.n_layers, t.args.dim, t.args.vocab_size
    );
    if cfg.debug.print_param_specs {
        for s in t.model.param_specs() {
            println!("  {s}");
        }
    }
    if t.step >= steps {
        println!("already trained to step {} (training.steps = {steps}); raise --training.steps to continue", t.step);
        return Ok(Summary { last_step: t.step, final_loss: None, final_val_loss: None });
    }

    let peak = if cfg.metrics.peak_tflops > 0.0 {
        cfg.metrics.peak_tflops
    } else {
        measure_matmul_tflops(&t.device.clone().without_autodiff())
    };
    let flops_per_token = t.args.flops_per_token(cfg.training.seq_len as usize);
    let dp = t.rank.dp_degree;
    println!(
        "training steps {}..={steps}: {} tokens/step on {dp} data-parallel rank(s), {} microbatch(es) of {}×{} per rank, peak {peak:.3} TFLOP/s for MFU",
        t.step + 1,
        t.tokens_per_step(),
        cfg.global_batch_size(dp) / (cfg.training.local_batch_size as usize * dp),
        cfg.training.local_batch_size,
        cfg.training.seq_len
    );
    let mut log = MetricsLogger::new(&dump, cfg.metrics.log_freq as u64, t.step, steps, flops_per_token, peak)?;
    let mut final_val = None;

    while t.step < steps {
        let s = t.train_step()?;
        log.step(&s)?;
        let step = s.step;
        if t.validation_enabled() && (step % cfg.validation.freq as u64 == 0 || step == steps) {
            let (v, n) = t.validate()?;
            log.validation(step, v, n)?;
            final_val = Some(v);
        }
        if cfg.checkpoint.enable && (step % cfg.checkpoint.interval as u64 == 0 || step == steps) {
            if let Some(dir) = t.save_checkpoint()? {
                log.note(&format!("saved checkpoint {}", dir.display()));
            }
        }
        if cfg.debug.stop_at_step == step as i64 {
            log.note(&format!("stopping after step {step} (debug.stop_at_step)"));
            break;
        }
    }
    log.finish();
    if cfg.metrics.save_loss_curve {
        let png = dump.join("loss_curve.png");
        let ranges = crate::plot::loss_curve(&png, &log.history, &log.val_history)?;
        println!("loss curve: {} ({ranges})", png.display());
    }
    Ok(Summary { last_step: t.step, final_loss: log.history.last().map(|h| h.1), final_val_loss: final_val })
}
