//! `titan-rs train`: the loop, top to bottom.

use crate::config::{to_toml, JobConfig};
use crate::metrics::{measure_matmul_tflops, MetricsLogger};
use crate::trainer::{RankContext, Trainer};
use anyhow::{anyhow, bail, Result};
use std::path::PathBuf;
use std::time::Duration;
use titan_parallel::{run_ranks_or_exit, MeshGroups, ParallelDims};

/// What a finished run reports.
#[derive(Debug)]
pub struct Summary {
    pub last_step: u64,
    pub final_loss: Option<f64>,
    pub final_val_loss: Option<f64>,
}

/// Trains with the configured mesh: one rank, or `dp_replicate × dp_shard × tp` ranks (DDP,
/// FSDP or HSDP, with tensor parallelism) — threads of this process, or one per process under
/// `mpirun`. Rank
/// `log_rank` prints and writes metrics; rank 0 writes checkpoints.
pub fn run(cfg: JobConfig, log_rank: usize, nproc: Option<usize>) -> Result<Summary> {
    if cfg.job.print_config {
        println!("{}", to_toml(&cfg));
    }
    if titan_parallel::under_mpi_launcher() {
        return run_mpi(cfg, log_rank);
    }
    let dims = mesh(&cfg, nproc, "--nproc")?;
    let world = dims.world_size;
    if log_rank >= world {
        bail!("--log-rank {log_rank}: there are only {world} rank(s)");
    }
    if world == 1 {
        return run_rank(cfg, RankContext::single(), log_rank);
    }
    let timeout = Duration::from_secs_f64(cfg.comm.timeout_seconds);
    let summaries = run_ranks_or_exit(world, timeout, Duration::from_secs(10), |comm| {
        let groups = MeshGroups::new(&comm, &dims)?;
        run_rank(cfg.clone(), RankContext::new(groups), log_rank)
    })?;
    Ok(summaries.into_iter().nth(log_rank).expect("the logging rank"))
}

/// The mesh for `world` ranks (`None`: the product of the configured degrees); `what` names
/// where the world size came from. `data_parallel_shard_degree = -1` takes the remaining ranks.
fn mesh(cfg: &JobConfig, world: Option<usize>, what: &str) -> Result<ParallelDims> {
    cfg.parallelism.dims(world).map_err(|e| match world {
        Some(n) => anyhow!("{what} {n}: {e}"),
        None => anyhow!("{e}"),
    })
}

/// One rank per MPI process; the MPI world must fit the mesh.
#[cfg(feature = "mpi")]
fn run_mpi(cfg: JobConfig, log_rank: usize) -> Result<Summary> {
    use titan_parallel::Communicator;
    let timeout = Duration::from_secs_f64(cfg.comm.timeout_seconds);
    titan_parallel::launcher::run_mpi_rank(timeout, |comm| {
        let dims = mesh(&cfg, Some(comm.size()), "mpirun -np")?;
        if log_rank >= dims.world_size {
            bail!("--log-rank {log_rank}: there are only {} rank(s)", dims.world_size);
        }
        let groups = MeshGroups::new(&comm, &dims)?;
        run_rank(cfg, RankContext::new(groups), log_rank)
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
    let shard = t.rank.fsdp.as_ref().map_or(1, |g| g.size());
    let tp = match &t.rank.tp {
        Some(g) if cfg.parallelism.enable_sequence_parallel => {
            format!(", tensor parallel {} with sequence parallel", g.size())
        }
        Some(g) => format!(", tensor parallel {}", g.size()),
        None => String::new(),
    };
    let l = &t.layout;
    let pp = if l.split.pp > 1 {
        format!(
            ", pipeline {} {} ({} stages of layers {:?}, {} microbatches)",
            l.split.pp,
            l.schedule.name(),
            l.split.num_stages(),
            l.split.layers,
            l.microbatches
        )
    } else {
        String::new()
    };
    println!(
        "training steps {}..={steps}: {} tokens/step on {dp} data-parallel rank(s) (replicate {} × shard {shard}){tp}{pp}, {} microbatch(es) of {}×{} per rank, peak {peak:.3} TFLOP/s for MFU",
        t.step + 1,
        t.tokens_per_step(),
        dp / shard,
        cfg.global_batch_size(dp) / (cfg.training.local_batch_size as usize * dp),
        cfg.training.local_batch_size,
        cfg.training.seq_len
    );
    let flops_per_token = t.args.flops_per_token(cfg.training.seq_len as usize);
    MetricsLogger::new(dump, cfg.metrics.log_freq as u64, t.step, steps, flops_per_token, peak)
}

/// One rank's training loop. Every rank runs the same steps, validation and checkpoint calls
/// (under FSDP they gather parameters together); the logging rank prints and writes metrics;
/// data-parallel rank 0 writes the checkpoints.
fn run_rank(cfg: JobConfig, rank: RankContext, log_rank: usize) -> Result<Summary> {
    let dump = PathBuf::from(&cfg.job.dump_folder);
    let steps = cfg.training.steps as u64;
    let logs = rank.world_rank == log_rank;
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
            for s in t.model.chunks.iter().flat_map(|c| c.param_specs()) {
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
        }
        if t.validation_enabled() && (step % cfg.validation.freq as u64 == 0 || step == steps) {
            let (v, n) = t.validate()?;
            if let Some(log) = log.as_mut() {
                log.validation(step, v, n)?;
            }
            final_val = Some(v);
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
