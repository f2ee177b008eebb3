//! The `titan-rs` command line.

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use titan_rs::config::{load_config, parse_overrides, to_toml, JobConfig};
use titan_rs::bench::{comm as bench_comm, kernels as bench_kernels, train as bench_train};
use titan_rs::{elastic, generate, train};

#[derive(Parser)]
#[command(name = "titan-rs", version, about = "LLM pre-training on Burn, configured like TorchTitan")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Args)]
struct ConfigArgs {
    /// The job's TOML file (also accepted as `--job.config_file`).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Overrides of any config key: `--training.steps 20`, `--checkpoint.enable=true`.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "--SECTION.KEY VALUE")]
    overrides: Vec<String>,
}

impl ConfigArgs {
    fn load(&self) -> Result<JobConfig> {
        Ok(self.load_with_flags(&[])?.0)
    }

    /// Loads the config; the command's own `flags` may also appear among the overrides
    /// (`bench --config F --training.seq_len 256 --steps 5`) and are returned separately.
    fn load_with_flags(&self, flags: &[&str]) -> Result<(JobConfig, Vec<(String, String)>)> {
        let mut overrides = parse_overrides(&self.overrides)?;
        let (own, rest): (Vec<_>, Vec<_>) = overrides.into_iter().partition(|(k, _)| flags.contains(&k.as_str()));
        overrides = rest;
        let mut path = self.config.clone();
        if let Some(i) = overrides.iter().position(|(k, _)| k == "job.config_file" || k == "config") {
            path = Some(PathBuf::from(overrides.remove(i).1));
        }
        Ok((load_config(path.as_deref(), &overrides)?, own))
    }
}

#[derive(Subcommand)]
enum Command {
    /// Train a model. `--nproc N`: the world size (checked against the mesh; -1 degrees take the
    /// remaining ranks); `--log-rank N`: the rank that logs (default 0); `--max-restarts N`:
    /// restart the job from its latest checkpoint after a failure, up to N times (torchrun's
    /// flag), with `--launcher "mpirun -np 4 --hostfile H"` in front of the job for MPI.
    Train(ConfigArgs),
    /// Print the effective config (defaults < file < overrides) as TOML.
    Config(ConfigArgs),
    /// Show the pipeline plan without training: the stage split, each rank's forward/backward
    /// order in time, the bubble, and the other schedules on the same mesh.
    Plan(ConfigArgs),
    /// Tokenizer tools.
    Tokenizer {
        #[command(subcommand)]
        command: TokenizerCommand,
    },
    /// Sample text from a checkpoint.
    Generate {
        /// A `step-N` checkpoint folder, or a folder holding them (the latest is used).
        #[arg(long)]
        checkpoint: PathBuf,
        #[arg(long, default_value = "")]
        prompt: String,
        #[arg(long, default_value_t = 200)]
        max_new_tokens: usize,
        #[arg(long, default_value_t = 0.8)]
        temperature: f64,
        #[arg(long, default_value_t = 40)]
        top_k: usize,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Tokens of context the model sees.
        #[arg(long, default_value_t = 256)]
        context: usize,
    },
    /// Conversion between Hugging Face `LlamaForCausalLM` folders and titan-rs checkpoints.
    Convert {
        #[command(subcommand)]
        command: ConvertCommand,
    },
    /// Checkpoint tools (`DIR`: a `step-N` folder, or a folder holding them: the latest).
    Checkpoint {
        #[command(subcommand)]
        command: CheckpointCommand,
    },
    /// The GPU adapters this build sees (wgpu): name, kind, backend, driver, float16/bfloat16
    /// support, and which one `training.device = "wgpu"` trains on.
    Devices {
        /// Also write them as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        kind: BenchKind,
    },
    /// Step traces (`--profiling.enable_profiling`).
    Trace {
        #[command(subcommand)]
        command: TraceCommand,
    },
}

#[derive(Subcommand)]
enum ConvertCommand {
    /// An HF folder (config.json + safetensors, bf16/fp16/fp32) → `OUT/step-0`, a model-only
    /// titan-rs checkpoint (train from it with `checkpoint.initial_load_path`).
    FromHf { hf_dir: PathBuf, out: PathBuf },
    /// A titan-rs checkpoint (step folder or a folder of them: the latest) → an HF folder that
    /// transformers loads.
    ToHf {
        checkpoint: PathBuf,
        out: PathBuf,
        /// float32 | bfloat16
        #[arg(long, default_value = "float32")]
        dtype: String,
        /// Cut the weights into files of at most this many MB (transformers: 5000).
        #[arg(long, default_value_t = 5000)]
        max_shard_mb: u64,
    },
}

#[derive(Subcommand)]
enum CheckpointCommand {
    /// Step, format, the layout it was saved under, files and sizes, every tensor's shape and
    /// chunks.
    Inspect { dir: PathBuf },
    /// Writes every tensor in full into one safetensors file, one tensor in memory at a time.
    Consolidate { dir: PathBuf, out: PathBuf },
}

#[derive(Subcommand)]
enum TraceCommand {
    /// Draw one recorded step of every rank (an `iteration_N` folder of `rankR_trace.json`
    /// files) as a timeline PNG.
    Timeline {
        /// The `iteration_N` folder.
        dir: PathBuf,
        /// The PNG to write (default: `timeline.png` in the folder).
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum BenchKind {
    /// Tokens/s and MFU of training steps; `--baseline pytorch` also measures PyTorch eager
    /// (scripts/pytorch_baseline.py, same shape and threads) in alternating `--rounds`.
    Train {
        #[arg(long, default_value_t = 2)]
        warmup: usize,
        #[arg(long, default_value_t = 5)]
        steps: usize,
        /// `pytorch` (needs python3 with torch and transformers) or a shell command that prints
        /// `N tokens/s`.
        #[arg(long)]
        baseline: Option<String>,
        /// Alternating rounds of titan-rs and the baseline (medians and ranges reported).
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Also write the result as JSON to this file (without a baseline).
        #[arg(long)]
        json: Option<PathBuf>,
        #[command(flatten)]
        config: ConfigArgs,
    },
    /// Every fused kernel on the configured device (`--training.device`), checked against its
    /// reference and timed at the config's shapes (flavor, local batch, seq_len).
    Kernels {
        #[arg(long, default_value_t = 5)]
        iters: usize,
        /// The device's memory bandwidth in GB/s (H200: 4300), for the share of it.
        #[arg(long)]
        peak_gbs: Option<f64>,
        /// The device's peak TFLOP/s (H200 bf16: 790), for the share of it.
        #[arg(long)]
        peak_tflops: Option<f64>,
        /// Also write the rows (each kernel's check and timing) as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
        #[command(flatten)]
        config: ConfigArgs,
    },
    /// Checkpoint saves on the configured mesh (ranks as threads) in alternating rounds: the
    /// gathered save (rank 0 writes full tensors), the sharded save, and the async sharded save
    /// with training steps running during the write: wall time, time training is blocked,
    /// per-rank peak memory.
    Checkpoint {
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Training steps during each async write.
        #[arg(long, default_value_t = 2)]
        steps: usize,
        #[command(flatten)]
        config: ConfigArgs,
    },
    /// All-reduce, all-gather, reduce-scatter, broadcast and send/recv from 1 KiB to 64 MiB,
    /// results checked, with times and bandwidths.
    Comm {
        /// Ranks (threads of this process).
        #[arg(long, default_value_t = 2)]
        nproc: usize,
        /// Largest message in MiB.
        #[arg(long, default_value_t = 64)]
        max_mib: usize,
        #[arg(long, default_value_t = 3)]
        iters: usize,
        #[arg(long, default_value_t = 120.0)]
        timeout_seconds: f64,
        /// Inject a fault on rank 1 first (tests that failures end every rank promptly).
        #[arg(long, value_enum, hide = true)]
        inject_fault: Option<bench_comm::Fault>,
    },
}

#[derive(Subcommand)]
enum TokenizerCommand {
    /// Train a byte-level BPE tokenizer and write tokenizer.json.
    Train {
        /// Text files to learn from.
        #[arg(long, required = true, num_args = 1..)]
        input: Vec<PathBuf>,
        #[arg(long, default_value_t = 2048)]
        vocab_size: usize,
        #[arg(long)]
        out: PathBuf,
    },
    /// Tokenize a corpus (file, folder or glob) into the token cache, streaming, and report the
    /// throughput and this process's peak memory.
    Encode {
        input: PathBuf,
        /// The tokenizer.json (default: the shipped one).
        #[arg(long)]
        tokenizer: Option<PathBuf>,
        #[arg(long, default_value = ".cache/titan-rs")]
        cache_dir: PathBuf,
        #[arg(long, default_value = "text")]
        text_column: String,
        #[arg(long, default_value = "uint16")]
        token_dtype: String,
    },
}

fn set_threads(cfg: &JobConfig) -> Result<()> {
    if cfg.training.threads > 0 {
        rayon::ThreadPoolBuilder::new()
            .num_threads(cfg.training.threads as usize)
            .build_global()
            .context("setting training.threads")?;
    }
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Train(a) => {
            let (cfg, flags) = a.load_with_flags(&["log-rank", "nproc", "max-restarts", "launcher"])?;
            let (mut log_rank, mut nproc, mut max_restarts, mut launcher) = (0, None, 0, Vec::new());
            for (k, v) in flags {
                if k == "launcher" {
                    launcher = v.split_whitespace().map(String::from).collect();
                    continue;
                }
                let n: usize = v.parse().with_context(|| format!("--{k} {v}: expected a number"))?;
                match k.as_str() {
                    "log-rank" => log_rank = n,
                    "nproc" => nproc = Some(n),
                    _ => max_restarts = n,
                }
            }
            if max_restarts > 0 || !launcher.is_empty() {
                let overrides = elastic::strip_flags(&a.overrides, &["max-restarts", "launcher"]);
                return elastic::supervise(&cfg, &elastic::Restarts { max_restarts, launcher, config: a.config.clone(), overrides });
            }
            set_threads(&cfg)?;
            let s = train::run(cfg, log_rank, nproc)?;
            match (s.logs, s.final_val_loss, s.final_loss) {
                (true, Some(v), _) => println!("done at step {}: validation loss {v:.4}", s.last_step),
                (true, None, Some(l)) => println!("done at step {}: loss {l:.4}", s.last_step),
                _ => {}
            }
        }
        Command::Config(a) => print!("{}", to_toml(&a.load()?)),
        Command::Plan(a) => print!("{}", titan_rs::plan::plan(&a.load()?)?),
        Command::Tokenizer { command: TokenizerCommand::Train { input, vocab_size, out } } => {
            let n = titan_data::train_bpe(&input, vocab_size, &out)?;
            println!("wrote {} ({n} tokens)", out.display());
        }
        Command::Tokenizer { command: TokenizerCommand::Encode { input, tokenizer, cache_dir, text_column, token_dtype } } => {
            let path = tokenizer.unwrap_or_else(|| titan_rs::config::Model::default().tokenizer_file());
            let tok = titan_data::Tokenizer::from_file(&path)?;
            let start = std::time::Instant::now();
            let o = titan_data::CorpusOptions { text_column, token_dtype };
            let f = titan_data::tokenize_corpus_with(&input, &tok, &cache_dir, &o)?;
            let secs = start.elapsed().as_secs_f64();
            let bytes: u64 = titan_data::list_corpus_files(&input)?.iter().filter_map(|p| std::fs::metadata(p).ok()).map(|m| m.len()).sum();
            let peak = titan_rs::memory::proc_bytes("/proc/self/status", "VmHWM").unwrap_or(0);
            println!(
                "{}: {} tokens from {:.1} MB in {secs:.2} s: {:.2} MB/s, {:.0} tokens/s; peak memory {:.1} MiB",
                f.path().display(),
                f.len(),
                bytes as f64 / 1e6,
                bytes as f64 / 1e6 / secs,
                f.len() as f64 / secs,
                peak as f64 / (1 << 20) as f64
            );
        }
        Command::Generate { checkpoint, prompt, max_new_tokens, temperature, top_k, seed, context } => {
            let o = generate::GenerateOptions { prompt, max_new_tokens, temperature, top_k, seed, context };
            println!("{}", generate::generate(&checkpoint, &o)?);
        }
        Command::Bench { kind: BenchKind::Comm { nproc, max_mib, iters, timeout_seconds, inject_fault } } => {
            let timeout = std::time::Duration::from_secs_f64(timeout_seconds);
            if titan_parallel::under_mpi_launcher() {
                #[cfg(feature = "mpi")]
                {
                    let (rank, size, rows) =
                        bench_comm::bench_comm_mpi(max_mib << 20, iters.max(1), timeout, inject_fault)?;
                    if rank == 0 {
                        bench_comm::print_table(&rows, size, "mpi (one rank per process)");
                    }
                    return Ok(());
                }
                #[cfg(not(feature = "mpi"))]
                anyhow::bail!("started by an MPI launcher, but this titan-rs was built without MPI; rebuild with `cargo build --release -p titan-rs --features mpi` (needs Debian's openmpi-bin libopenmpi-dev libclang-dev)");
            }
            let rows = bench_comm::bench_comm(nproc, max_mib << 20, iters.max(1), timeout, inject_fault)?;
            bench_comm::print_table(&rows, nproc, "local (threads)");
        }
        Command::Devices { json } => {
            let adapters = titan_rs::device::adapters();
            println!("| adapter | kind | index | backend | driver | float16 | bfloat16 | trains on |");
            println!("|---|---|---|---|---|---|---|---|");
            for a in &adapters {
                println!(
                    "| {} | {} | {} | {} | {} {} | {} | {} | {} |",
                    a.name, a.kind, a.index, a.backend, a.driver, a.driver_info, a.float16, a.bfloat16,
                    if a.chosen { "yes" } else { "" }
                );
            }
            if adapters.is_empty() {
                println!("no wgpu adapter (a build without `--features wgpu`, or no Vulkan/GPU driver)");
            }
            if let Some(p) = json {
                std::fs::write(&p, serde_json::to_string_pretty(&adapters)?).with_context(|| format!("writing {}", p.display()))?;
            }
        }
        Command::Bench { kind: BenchKind::Kernels { mut iters, mut peak_gbs, mut peak_tflops, mut json, config } } => {
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
            let device = titan_rs::device::select(&cfg.training.device, cfg.training.device_index as usize)?;
            let args = cfg.model_args().map_err(|e| anyhow::anyhow!(e))?;
            let t = &cfg.training;
            let shapes = bench_kernels::Shapes { batch: t.local_batch_size as usize, seq: t.seq_len as usize, args };
            let rows = bench_kernels::bench_kernels(&device, &shapes, iters.max(1))?;
            let peaks = peak_gbs.zip(peak_tflops);
            let what = format!("{} ({})", cfg.training.device, cfg.model.flavor);
            bench_kernels::print_table(&rows, &what, peaks);
            if let Some(p) = json {
                bench_kernels::write_json(&p, &rows, &what, peaks)?;
            }
        }
        Command::Bench { kind: BenchKind::Checkpoint { mut rounds, mut steps, config } } => {
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
            print!("{}", titan_rs::bench::checkpoint::bench(cfg, rounds.max(1), steps)?);
        }
        Command::Bench { kind: BenchKind::Train { mut warmup, mut steps, mut baseline, mut rounds, mut json, config } } => {
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
                let precision = cfg.training.mixed_precision_param.clone();
                let r = bench_train::bench(cfg, warmup, steps)?;
                bench_train::print_table(&label, &r, None);
                if let Some(p) = json {
                    bench_train::write_json(&p, &label, &precision, &r)?;
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
                eprintln!("round {round}: titan-rs {:.0} tokens/s, {} {:.0} tokens/s", r.tokens_per_s, b.name, b.theirs[round - 1]);
                last = Some(r);
            }
            bench_train::print_table(&label, &last.expect("at least one round"), Some(&b));
        }
        Command::Convert { command: ConvertCommand::FromHf { hf_dir, out } } => {
            let (dir, n) = titan_rs::hf::convert::from_hf(&hf_dir, &out)?;
            println!("wrote {} ({n} tensors)", dir.display());
        }
        Command::Convert { command: ConvertCommand::ToHf { checkpoint, out, dtype, max_shard_mb } } => {
            let o = titan_rs::hf::export::ExportOptions { dtype, max_shard_bytes: max_shard_mb * 1_000_000, ..Default::default() };
            let (n, bytes) = titan_rs::hf::convert::to_hf(&checkpoint, &out, &o)?;
            println!("wrote {} ({n} tensors, {bytes} bytes of weights)", out.display());
        }
        Command::Checkpoint { command: CheckpointCommand::Inspect { dir } } => {
            let r = titan_rs::checkpoint::open_step(&dir)?;
            print!("{}", titan_checkpoints::sharded::tools::inspect(r.dir())?);
        }
        Command::Checkpoint { command: CheckpointCommand::Consolidate { dir, out } } => {
            let r = titan_rs::checkpoint::open_step(&dir)?;
            let (n, bytes) = titan_checkpoints::sharded::tools::consolidate(r.dir(), &out)?;
            println!("wrote {} ({n} tensors, {bytes} bytes)", out.display());
        }
        Command::Trace { command: TraceCommand::Timeline { dir, out } } => {
            let out = out.unwrap_or_else(|| dir.join("timeline.png"));
            let n = titan_rs::metrics::trace::timeline(&dir, &out)?;
            println!("wrote {} ({n} ranks)", out.display());
        }
    }
    Ok(())
}

#[global_allocator]
static ALLOC: titan_rs::alloc::Counting = titan_rs::alloc::Counting;

fn main() -> ExitCode {
    titan_rs::alloc::keep_freed_memory();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(titan_rs::metrics::console::stderr_color())
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_target(false)
        .init();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
