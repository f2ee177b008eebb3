//! `titan-rs train`: the loop, top to bottom.

use crate::config::{to_toml, JobConfig};
use crate::metrics::{measure_matmul_tflops, MetricsLogger};
use crate::trainer::{RankContext, Trainer};
use anyhow::{bail, Result};
use std::path::PathBuf;
use std::time::Duration;
use titan_parallel::{run_ranks_or_exit, Communicator};

/// What a finished run reports.
#[derive(Debug)]
pub struct Summary {
    pub last_step: u64,
    pub final_loss: Option<f64>,
    pub final_val_loss: Option<f64>,
}

/// Trains with the configured layout: one rank, or `data_parallel_replicate_degree` data-parallel
/// ranks — threads of this process, or one per process under `mpirun`. Rank `log_rank` prints and
/// writes metrics; rank 0 writes checkpoints.
pub fn run(cfg: JobConfig, log_rank: usize, nproc: Option<usize>) -> Result<Summary> {
    if cfg.job.print_config {
        println!("{}", to_toml(&cfg));
    }
    if let Some(n) = nproc {
        check_world_size(&cfg, n)?;
    }
    let world = cfg.parallelism.data_parallel_replicate_degree as usize;
    if log_rank >= world {
        bail!("--log-rank {log_rank}: there are only {world} rank(s)");
    }
    if titan_parallel::under_mpi_launcher() {
        return run_mpi(cfg, log_rank);
    }
    if world == 1 {
        return run_rank(cfg, RankContext::single(), log_rank);
    }
    let timeout = Duration::from_secs_f64(cfg.comm.timeout_seconds);
    let summaries = run_ranks_or_exit(world, timeout, Duration::from_secs(10), |comm| {
        let ctx = RankContext { dp_rank: comm.rank(), dp_degree: world, dp: Some(Box::new(comm)) };
        run_rank(cfg.clone(), ctx, log_rank)
    })?;
    Ok(summaries.into_iter().nth(log_rank).expect("the logging rank"))
}

/// `--nproc N`: the mesh rules with world size N (`data_parallel_shard_degree = -1` takes the
/// remaining ranks); the layout must be one this build trains.
fn check_world_size(cfg: &JobConfig, n: usize) -> Result<()> {
    let dims = cfg.parallelism.dims(Some(n)).map_err(|e| anyhow::anyhow!("--nproc {n}: {e}"))?;
    if dims.dp_shard > 1 {
        bail!(
            "--nproc {n} gives `parallelism.data_parallel_shard_degree` = {} (FSDP), which is not supported yet; set `parallelism.data_parallel_replicate_degree` = {n} and `data_parallel_shard_degree` = 1 for data parallelism",
            dims.dp_shard
        );
    }
    Ok(())
}

/// One rank per MPI process; the MPI world must be the data-parallel degree.
#[cfg(feature = "mpi")]
fn run_mpi(cfg: JobConfig, log_rank: usize) -> Result<Summary> {
    let timeout = Duration::from_secs_f64(cfg.comm.timeout_seconds);
    titan_parallel::launcher::run_mpi_rank(timeout, |comm| {
        let (world, want) = (comm.size(), cfg.parallelism.data_parallel_replicate_degree as usize);
        if world != want {
            bail!("mpirun started {world} processes but `parallelism.data_parallel_replicate_degree` = {want}; set it to {world} or run mpirun -np {want}");
        }
        let rank = comm.rank();
        let dp: Option<Box<dyn Communicator>> = if world > 1 { Some(Box::new(comm)) } else { None };
        run_rank(cfg, RankContext { dp_rank: rank, dp_degree: world, dp }, log_rank)
    })
}

#[cfg(not(feature = "mpi"))]
fn run_mpi(_cfg: JobConfig, _log_rank: usize) -> Result<Summary> {
    bail!("started by an MPI launcher, but this titan-rs was built without MPI; rebuild with `cargo build --release -p titan-rs --features mpi` (needs Debian's openmpi-bin libopenmpi-dev libclang-dev)")
}

/// Prints what is being trained and opens the metrics log (the logging rank only).
fn start_logging(t: &Trainer, dump: &std::path::Path, steps: u64) -> Result<MetricsLogger> {
    let cfg = &t.cfg;
    let peak = if cfg.metrics.peak_tflops > 0.0 {
        cfg.metrics.peak_tflops
    } else {
        measure_matmul_tflops(&t.device.clone().without_autodiff())
    };
    let dp = t.rank.dp_degree;
    println!(
        "training steps {}..={steps}: {} tokens/step on {dp} data-parallel rank(s), {} microbatch(es) of {}×{} per rank, peak {peak:.3} TFLOP/s for MFU",
        t.step + 1,
        t.tokens_per_step(),
        cfg.global_batch_size(dp) / (cfg.training.local_batch_size as usize * dp),
        cfg.training.local_batch_size,
        cfg.training.seq_len
    );
    let flops_per_token = t.args.flops_per_token(cfg.training.seq_len as usize);
    MetricsLogger::new(dump, cfg.metrics.log_freq as u64, t.step, steps, flops_per_token, peak)
}

/// One rank's training loop. Every rank runs the same steps; the logging rank prints, writes
/// metrics and validates; data-parallel rank 0 writes the checkpoints.
fn run_rank(cfg: JobConfig, rank: RankContext, log_rank: usize) -> Result<Summary> {
    let dump = PathBuf::from(&cfg.job.dump_folder);
    let steps = cfg.training.steps as u64;
    let logs = rank.dp_rank == log_rank;
    let mut t = Trainer::new(cfg, rank)?;
    let cfg = t.cfg.clone();

    if logs {
        let n_params = t.args.num_params();
        println!(
            "model llama3/{}: {} parameters ({:.2} M), {} layers, dim {}, vocab {}",
            cfg.model.flavor,
            n_params,
            n_params as f64 / 1e6,
            t.args.n_layers,
            t.args.dim,
            t.args.vocab_size
        );
        if cfg.debug.print_param_specs {
            for s in t.model.param_specs() {
                println!("  {s}");
            }
        }
    }
    if t.step >= steps {
        if logs {
            println!(
                "already trained to step {} (training.steps = {steps}); raise --training.steps to continue",
                t.step
            );
        }
        return Ok(Summary { last_step: t.step, final_loss: None, final_val_loss: None });
    }
    let mut log = if logs { Some(start_logging(&t, &dump, steps)?) } else { None };
    let mut final_val = None;

    while t.step < steps {
        let s = t.train_step()?;
        let step = s.step;
        if let Some(log) = log.as_mut() {
            log.step(&s)?;
            if t.validation_enabled() && (step % cfg.validation.freq as u64 == 0 || step == steps) {
                let (v, n) = t.validate()?;
                log.validation(step, v, n)?;
                final_val = Some(v);
            }
        }
        if cfg.checkpoint.enable && (step % cfg.checkpoint.interval as u64 == 0 || step == steps) {
            if let (Some(dir), Some(log)) = (t.save_checkpoint()?, log.as_ref()) {
                log.note(&format!("saved checkpoint {}", dir.display()));
            }
        }
        if cfg.debug.stop_at_step == step as i64 {
            if let Some(log) = log.as_ref() {
                log.note(&format!("stopping after step {step} (debug.stop_at_step)"));
            }
            break;
        }
    }
    let Some(log) = log else {
        return Ok(Summary { last_step: t.step, final_loss: None, final_val_loss: None });
    };
    log.finish();
    if cfg.metrics.save_loss_curve {
        let png = dump.join("loss_curve.png");
        let ranges = crate::plot::loss_curve(&png, &log.history, &log.val_history)?;
        println!("loss curve: {} ({ranges})", png.display());
    }
    Ok(Summary { last_step: t.step, final_loss: log.history.last().map(|h| h.1), final_val_loss: final_val })
}
