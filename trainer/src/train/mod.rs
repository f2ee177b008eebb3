//! `titan-rs train`: the loop, top to bottom.

pub mod elastic;
mod sdc;
pub mod trainer;

use crate::config::{to_toml, JobConfig};
use crate::metrics::straggler::StragglerMonitor;
use crate::optim::loss_spike::{SpikeRule, SpikeVerdict};
use crate::metrics::{console, peak, trace, MetricsLogger, Sinks};
use crate::rank::RankContext;
use crate::train::trainer::Trainer;
use anyhow::{anyhow, bail, Result};
use std::path::PathBuf;
use std::time::Duration;
use titan_parallel::{run_ranks_or_exit, MeshGroups, ParallelDims};

/// What a finished run reports.
#[derive(Debug)]
pub struct Summary {
    /// This rank is the one that logs (under MPI every process returns its own summary; only
    /// the logging rank's is printed).
    pub logs: bool,
    pub last_step: u64,
    pub final_loss: Option<f64>,
    pub final_val_loss: Option<f64>,
}

/// Trains with the configured mesh: one rank, or `dp_replicate × dp_shard × tp` ranks (DDP,
/// FSDP or HSDP, with tensor parallelism) — threads of this process, or one per process under
/// `mpirun`. Rank
/// `log_rank` prints and writes metrics; every rank writes its pieces of the checkpoints.
pub fn run(cfg: JobConfig, log_rank: usize, nproc: Option<usize>) -> Result<Summary> {
    crate::memory::record_runtime();
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
    crate::memory::check_fits(&cfg, &dims, None)?;
    if world == 1 {
        return run_rank(cfg, RankContext::single(), log_rank);
    }
    let timeout = Duration::from_secs_f64(cfg.comm.init_timeout_seconds);
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
    let timeout = Duration::from_secs_f64(cfg.comm.init_timeout_seconds);
    titan_parallel::launcher::run_mpi_rank(timeout, |comm| {
        let dims = mesh(&cfg, Some(comm.size()), "mpirun -np")?;
        if log_rank >= dims.world_size {
            bail!("--log-rank {log_rank}: there are only {} rank(s)", dims.world_size);
        }
        crate::memory::check_fits(&cfg, &dims, Some(ranks_on_this_host()))?;
        let groups = MeshGroups::new(&comm, &dims)?;
        run_rank(cfg, RankContext::new(groups), log_rank)
    })
}

#[cfg(not(feature = "mpi"))]
fn run_mpi(_cfg: JobConfig, _log_rank: usize) -> Result<Summary> {
    bail!("started by an MPI launcher, but this titan-rs was built without MPI; rebuild with `cargo build --release -p titan-rs --features mpi` (needs Debian's openmpi-bin libopenmpi-dev libclang-dev)")
}

/// Under an MPI launcher, the ranks it placed on this host (1 if it does not say).
fn ranks_on_this_host() -> usize {
    ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"]
        .iter()
        .find_map(|k| std::env::var(k).ok()?.parse::<usize>().ok())
        .unwrap_or(1)
}

/// Ranks that compute on this rank's device: thread ranks share this process's cores (or its
/// GPU); under MPI, the ranks the launcher placed on this host.
fn ranks_sharing_device(t: &Trainer) -> usize {
    if titan_parallel::under_mpi_launcher() {
        ranks_on_this_host()
    } else {
        // The world this run has (`dims(None)` would miss ranks that `--nproc` gave a -1 degree).
        t.rank.dp_degree * t.rank.tp.as_ref().map_or(1, |g| g.size()) * t.layout.split.pp
    }
}

/// The TensorBoard folder of this run: `{dump}/{save_tb_folder}/{UTC yyyymmdd-hhmm}` (as
/// TorchTitan), with a `rank_N` folder per rank under `save_for_all_ranks`. The time is read
/// once per process, so the thread ranks of a run share it.
fn tensorboard_dir(cfg: &JobConfig, dump: &std::path::Path, rank: usize) -> Option<PathBuf> {
    static STAMP: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    if !cfg.metrics.enable_tensorboard {
        return None;
    }
    let stamp = STAMP.get_or_init(|| {
        let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        utc_stamp(secs)
    });
    let dir = dump.join(&cfg.metrics.save_tb_folder).join(stamp);
    Some(if cfg.metrics.save_for_all_ranks { dir.join(format!("rank_{rank}")) } else { dir })
}

/// `yyyymmdd-hhmm` (UTC) of Unix time `secs` (Howard Hinnant's civil-from-days).
fn utc_stamp(secs: u64) -> String {
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}{m:02}{d:02}-{:02}{:02}", rem / 3600, (rem % 3600) / 60)
}

/// Opens this rank's metrics sinks: the logging rank prints what is being trained and writes
/// the console lines and `metrics.jsonl`; TensorBoard files come from it, or from every rank
/// under `metrics.save_for_all_ranks`. `None` for a rank with nothing to write.
fn start_logging(t: &Trainer, dump: &std::path::Path, steps: u64, logs: bool) -> Result<Option<MetricsLogger>> {
    let cfg = &t.cfg;
    let tensorboard =
        (logs || cfg.metrics.save_for_all_ranks).then(|| tensorboard_dir(cfg, dump, t.rank.world_rank)).flatten();
    if !logs && tensorboard.is_none() {
        return Ok(None);
    }
    let device = t.device.clone().without_autodiff();
    let peak = peak::resolve(
        cfg.metrics.peak_tflops(),
        cfg.training.device,
        &device,
        cfg.training.mixed_precision_param,
        ranks_sharing_device(t),
    );
    let flops_per_token = t.args.flops_per_token(cfg.training.seq_len);
    let sinks = Sinks {
        console: logs,
        color: console::stdout_color(cfg.metrics.disable_color_printing),
        jsonl: logs,
        tensorboard,
        ranks_per_batch: t.rank.tp.as_ref().map_or(1, |g| g.size()) * t.layout.split.pp,
    };
    let log = MetricsLogger::new(dump, sinks, cfg.metrics.log_freq, t.step, steps, flops_per_token, peak)?;
    if !logs {
        return Ok(Some(log));
    }
    let dims = &t.rank.dims;
    let sp = if t.placement.sequence_parallel() { " (sequence parallel)" } else { "" };
    let l = &t.layout;
    let pp = if l.split.pp > 1 {
        format!(
            "; pipeline {} ({} stages of layers {:?}, {} microbatches)",
            l.schedule.name(),
            l.split.num_stages(),
            l.split.layers,
            l.microbatches
        )
    } else {
        String::new()
    };
    let dp = dims.dp();
    println!(
        "training steps {}..={steps}: {} tokens/step on {dp} data-parallel rank(s); mesh {} rank(s) = {}{sp}{pp}; {} microbatch(es) of {}×{} per rank",
        t.step + 1,
        t.tokens_per_step(),
        dims.world_size,
        dims.describe(),
        cfg.global_batch_size(dp) / (cfg.training.local_batch_size * dp),
        cfg.training.local_batch_size,
        cfg.training.seq_len
    );
    match &log.peak {
        Some(p) => println!("MFU per rank against {:.3} TFLOP/s: {}", p.tflops, p.how),
        None => println!(
            "MFU not reported: {:?} is not in the GPU peak table; set `metrics.peak_tflops`",
            crate::device::selected_adapter().unwrap_or_default()
        ),
    }
    if let Some(f) = log.tensorboard_file() {
        println!(
            "TensorBoard: {} (tensorboard --logdir {})",
            f.display(),
            dump.join(&cfg.metrics.save_tb_folder).display()
        );
    }
    Ok(Some(log))
}

/// Draws the training curves next to the metrics (the logging rank, when enabled).
fn save_plot(cfg: &JobConfig, log: &MetricsLogger, dump: &std::path::Path) -> Result<Option<String>> {
    if !cfg.metrics.save_loss_curve || log.history.is_empty() {
        return Ok(None);
    }
    let png = dump.join("loss_curve.png");
    let title = format!("titan-rs · {}/{} · {}", cfg.model.name, cfg.model.flavor, cfg.job.description);
    let summary = log.plot(&png, title.trim_end_matches(" · "))?;
    Ok(Some(format!("{} ({summary})", png.display())))
}

/// The hang report a timed-out collective appends to, in the dump folder
/// ([`titan_parallel::comm::watchdog`]).
pub const HANG_REPORT: &str = "hang_report.txt";

/// One rank's training loop. Every rank runs the same steps, validation and checkpoint calls
/// (checkpoints are written by every rank, each its own pieces); the logging rank prints and
/// writes metrics.
fn run_rank(cfg: JobConfig, rank: RankContext, log_rank: usize) -> Result<Summary> {
    let dump = PathBuf::from(&cfg.job.dump_folder);
    let steps = cfg.training.steps;
    let logs = rank.world_rank == log_rank;
    if let Some(world) = &rank.world {
        world.watchdog().set_report(dump.join(HANG_REPORT));
    }
    let mut t = Trainer::new(cfg, rank)?;
    let cfg = t.cfg.clone();

    if logs {
        let n_params = t.args.num_params();
        let moe = t.args.moe.as_ref().map_or(String::new(), |m| {
            format!(
                ", {} active per token ({:.2} M); MoE after {} dense layer(s): {} experts, top {}, {} shared",
                t.args.num_active_params(),
                t.args.num_active_params() as f64 / 1e6,
                m.n_dense_layers,
                m.num_experts,
                m.top_k,
                m.num_shared_experts
            )
        });
        println!(
            "model {}/{}: {} parameters ({:.2} M){moe}, {} layers, dim {}, vocab {}",
            t.args.family,
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
        sync_device(&t, &cfg)?;
        if logs {
            println!(
                "already trained to step {} (training.steps = {steps}); raise --training.steps to continue",
                t.step
            );
        }
        return Ok(Summary { logs, last_step: t.step, final_loss: None, final_val_loss: None });
    }
    let mut log = start_logging(&t, &dump, steps, logs)?;
    let console = |log: &Option<MetricsLogger>, line: &str| {
        if let Some(l) = log.as_ref().filter(|_| logs) {
            l.note(line);
        }
    };
    let (mut final_val, mut final_loss) = (None, None);

    let first_step = t.step + 1;
    let stage = t.layout.pp_rank;
    let mut stragglers = StragglerMonitor::new(cfg.fault.straggler_threshold, cfg.fault.straggler_windows, stage);
    let f = &cfg.fault;
    let spike_rule = (f.loss_spike_zscore > 0.0).then_some(SpikeRule {
        zscore: f.loss_spike_zscore,
        window: f.loss_spike_window,
        steps: f.loss_spike_steps,
    });
    while t.step < steps {
        let step = t.step + 1;
        let profiled = trace::should_profile(&cfg, step);
        if profiled {
            titan_profiling::start(t.rank.world_rank, trace::rank_label(&t.rank));
        }
        let mut s = {
            let _span = titan_profiling::span("step", "step").arg("step", step);
            t.train_step()?
        };
        if let (Some(monitor), Some(world)) = (stragglers.as_mut(), t.rank.world.as_deref()) {
            monitor.record(s.compute_seconds, s.comm_seconds);
            if step % cfg.metrics.log_freq == 0 {
                s.stragglers = monitor.end_window(world, t.rank.world_rank)?;
                for x in &s.stragglers {
                    let _mark = titan_profiling::span_with(|| format!("straggler: rank {}", x.rank), "fault");
                    console(&log, &format!("straggler: {x}"));
                }
            }
        }
        if let (Some(world), true) = (&t.rank.world, step == first_step) {
            // Start-up is over: collectives now wait at most the training timeout.
            world.watchdog().set_timeout(Duration::from_secs_f64(cfg.comm.train_timeout_seconds));
        }
        final_loss = Some(s.loss);
        if let Some(log) = log.as_mut() {
            log.step(&s)?;
        }
        if let Some(rule) = spike_rule {
            match t.spikes.observe(step, s.loss, rule) {
                SpikeVerdict::Normal => {}
                SpikeVerdict::Spike { zscore } => console(
                    &log,
                    &format!("step {step}: loss spike (robust z-score {zscore:.1} > `fault.loss_spike_zscore`)"),
                ),
                SpikeVerdict::RollBack { zscore, first } => {
                    let done = t.spikes.skipped.len();
                    if done >= cfg.fault.max_rollbacks as usize {
                        bail!(
                            "step {step}: loss spike (robust z-score {zscore:.1}) after {done} rollbacks (`fault.max_rollbacks` = {}); training stopped. The skipped windows are in metrics.jsonl; lower `optimizer.lr` or check the data",
                            cfg.fault.max_rollbacks
                        );
                    }
                    let window = t.roll_back(step, first)?;
                    if let Some(log) = log.as_mut() {
                        log.rollback(step, &window, zscore)?;
                    }
                    continue;
                }
            }
        }
        if t.validation_enabled() && (step % cfg.validation.freq == 0 || step == steps) {
            let (v, n) = {
                let _span = titan_profiling::span("validation", "validation");
                t.validate()?
            };
            if let Some(log) = log.as_mut() {
                log.validation(step, v, n)?;
            }
            final_val = Some(v);
        }
        if let Some(dir) = t.poll_pending_save()? {
            console(&log, &format!("saved checkpoint {} (written in the background)", dir.display()));
        }
        let first = step == 1 && cfg.checkpoint.enable_first_step_checkpoint;
        if cfg.checkpoint.enable && (step % cfg.checkpoint.interval == 0 || step == steps || first) {
            let saved = {
                let _span = titan_profiling::span("checkpoint", "checkpoint");
                t.save_checkpoint()?
            };
            if let Some(dir) = saved {
                console(&log, &format!("saved checkpoint {}", dir.display()));
            }
            if let Some(s) = t.checkpointer.pending_step() {
                console(&log, &format!("checkpoint step-{s}: writing in the background"));
            }
            if let Some(png) = log.as_ref().filter(|_| logs).map(|l| save_plot(&cfg, l, &dump)).transpose()?.flatten() {
                console(&log, &format!("training curves: {png}"));
            }
        }
        if profiled {
            if let Some(path) = trace::write_recording(&cfg, step)? {
                console(&log, &format!("step trace: {}", path.display()));
            }
        }
        if cfg.debug.stop_at() == Some(step) {
            console(&log, &format!("stopping after step {step} (debug.stop_at_step)"));
            break;
        }
    }
    sync_device(&t, &cfg)?;
    if let Some(dir) = t.wait_for_pending_save()? {
        console(&log, &format!("saved checkpoint {} (written in the background)", dir.display()));
    }
    if cfg.checkpoint.enable && cfg.checkpoint.last_save_in_hf && t.step == steps {
        if let Some(dir) = t.export_hf()? {
            console(&log, &format!("exported the model for Hugging Face: {}", dir.display()));
        }
    }
    let Some(log) = log.filter(|_| logs) else {
        return Ok(Summary { logs, last_step: t.step, final_loss, final_val_loss: final_val });
    };
    log.finish();
    let plotted_at_last_checkpoint = cfg.checkpoint.enable && t.step == steps;
    if !plotted_at_last_checkpoint {
        if let Some(png) = save_plot(&cfg, &log, &dump)? {
            println!("training curves: {png}");
        }
    }
    Ok(Summary { logs, last_step: t.step, final_loss: log.history.last().map(|h| h.1), final_val_loss: final_val })
}

/// Waits for the rank's device: the last step's optimizer update (or a loaded checkpoint's upload)
/// is still queued on a GPU device when nothing reads it back, and the process must never exit
/// under running kernels (Mesa's software adapter segfaulted at exit, its LLVM torn down by exit
/// handlers while it compiled a queued shader).
fn sync_device(t: &Trainer, cfg: &JobConfig) -> Result<()> {
    t.device.sync().map_err(|e| anyhow!("`training.device` = {}: the device failed to finish its work: {e:?}", cfg.training.device))
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_stamp_is_the_calendar_date_and_time() {
        assert_eq!(super::utc_stamp(0), "19700101-0000");
        // 2026-12-04 00:16:51 UTC
        assert_eq!(super::utc_stamp(1_796_343_411), "20261204-0016");
        // 2024-02-29 23:59 UTC (leap day)
        assert_eq!(super::utc_stamp(1_709_251_140), "20240229-2359");
    }
}
