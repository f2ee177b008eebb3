//! `titan-rs bench …`: each benchmark's flags read, the benchmark run, its table printed.

use super::args::BenchKind;
use super::set_threads;
use anyhow::{Context, Result};
use std::path::PathBuf;
use titan_rs::commands::bench::{comm as bench_comm, kernels as bench_kernels, train as bench_train};

/// Runs the benchmark `kind` names.
pub(crate) fn run(kind: BenchKind) -> Result<()> {
    match kind {
        BenchKind::Comm { nproc, max_mib, iters, timeout_seconds, device, inject_fault } => {
            let timeout = std::time::Duration::from_secs_f64(timeout_seconds);
            if titan_parallel::under_mpi_launcher() {
                #[cfg(feature = "mpi")]
                {
                    let (rank, size, rows) =
                        bench_comm::bench_comm_mpi(max_mib << 20, iters.max(1), timeout, inject_fault, device)?;
                    if rank == 0 {
                        bench_comm::print_table(&rows, size, "mpi (one rank per process)", device);
                    }
                    return Ok(());
                }
                #[cfg(not(feature = "mpi"))]
                anyhow::bail!("started by an MPI launcher, but this titan-rs was built without MPI; rebuild with `cargo build --release -p titan-rs --features mpi` (needs Debian's openmpi-bin libopenmpi-dev libclang-dev)");
            }
            let rows = bench_comm::bench_comm(nproc, max_mib << 20, iters.max(1), timeout, inject_fault, device)?;
            bench_comm::print_table(&rows, nproc, "local (threads)", device);
        }
        BenchKind::Kernels { mut iters, mut peak_gbs, mut peak_tflops, mut json, config } => {
            let (cfg, flags) = config.load_with_flags(&["iters", "peak-gbs", "peak-tflops", "json"])?;
            for (k, v) in flags {
                if k == "json" {
                    json = Some(PathBuf::from(v));
                    continue;
                }
                let x: f64 = v.parse().with_context(|| format!("--{k} {v}: expected a number"))?;
                match k.as_str() {
                    "iters" => iters = x as usize,
                    "peak-gbs" => peak_gbs = Some(x),
                    _ => peak_tflops = Some(x),
                }
            }
            set_threads(&cfg)?;
            let device = titan_rs::device::select(cfg.training.device, cfg.training.device_index(), 0)?;
            let args = cfg.model_args().map_err(|e| anyhow::anyhow!(e))?;
            let t = &cfg.training;
            let shapes = bench_kernels::Shapes { batch: t.local_batch_size, seq: t.seq_len, args };
            let rows = bench_kernels::bench_kernels(&device, &shapes, iters.max(1))?;
            let peaks = peak_gbs.zip(peak_tflops);
            let what = format!("{} ({})", cfg.training.device, cfg.model.flavor);
            bench_kernels::print_table(&rows, &what, peaks);
            if let Some(p) = json {
                bench_kernels::write_json(&p, &rows, &what, peaks)?;
            }
        }
        BenchKind::Checkpoint { mut rounds, mut steps, config } => {
            let (cfg, flags) = config.load_with_flags(&["rounds", "steps"])?;
            for (k, v) in flags {
                let n: usize = v.parse().with_context(|| format!("--{k} {v}: expected a number"))?;
                if k == "rounds" {
                    rounds = n
                } else {
                    steps = n
                }
            }
            set_threads(&cfg)?;
            print!("{}", titan_rs::commands::bench::checkpoint::bench(cfg, rounds.max(1), steps)?);
        }
        BenchKind::Train { mut warmup, mut steps, mut baseline, mut rounds, mut json, config } => {
            let (cfg, flags) = config.load_with_flags(&["warmup", "steps", "baseline", "rounds", "json"])?;
            for (k, v) in flags {
                if k == "baseline" {
                    baseline = Some(v);
                    continue;
                }
                if k == "json" {
                    json = Some(PathBuf::from(v));
                    continue;
                }
                let n: usize = v.parse().with_context(|| format!("--{k} {v}: expected a number"))?;
                match k.as_str() {
                    "warmup" => warmup = n,
                    "rounds" => rounds = n,
                    _ => steps = n,
                }
            }
            set_threads(&cfg)?;
            let label = bench_train::label(&cfg);
            let steps = steps.max(1);
            let Some(baseline) = baseline else {
                let precision = cfg.training.mixed_precision_param;
                let r = bench_train::bench(cfg, warmup, steps)?;
                bench_train::print_table(&label, &r, None);
                if let Some(p) = json {
                    bench_train::write_json(&p, &label, precision, &r)?;
                }
                return Ok(());
            };
            let (name, cmd) = match baseline.as_str() {
                "pytorch" => ("PyTorch eager".to_string(), bench_train::pytorch_command(&cfg, warmup, steps)),
                other => (other.to_string(), vec!["sh".into(), "-c".into(), other.to_string()]),
            };
            let mut b = bench_train::Baseline { name, ours: Vec::new(), theirs: Vec::new() };
            let mut last = None;
            for round in 1..=rounds.max(1) {
                let r = bench_train::bench(cfg.clone(), warmup, steps)?;
                b.ours.push(r.tokens_per_s);
                b.theirs.push(bench_train::run_baseline(&cmd)?);
                eprintln!(
                    "round {round}: titan-rs {:.0} tokens/s, {} {:.0} tokens/s",
                    r.tokens_per_s,
                    b.name,
                    b.theirs[round - 1]
                );
                last = Some(r);
            }
            bench_train::print_table(&label, &last.expect("at least one round"), Some(&b));
        }
    }
    Ok(())
}
