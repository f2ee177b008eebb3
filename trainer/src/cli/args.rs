//! The command line's shape: subcommands, their flags, and the config arguments every job
//! command takes (a TOML file plus `--section.key value` overrides).

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use titan_rs::config::{load_config, parse_overrides, JobConfig};

#[derive(Parser)]
#[command(name = "titan-rs", version, about = "LLM pre-training on Burn, configured like TorchTitan")]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Args)]
pub(crate) struct ConfigArgs {
    /// The job's TOML file (also accepted as `--job.config_file`).
    #[arg(long)]
    pub(crate) config: Option<PathBuf>,
    /// Overrides of any config key: `--training.steps 20`, `--checkpoint.enable=true`.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "--SECTION.KEY VALUE")]
    pub(crate) overrides: Vec<String>,
}

impl ConfigArgs {
    pub(crate) fn load(&self) -> Result<JobConfig> {
        Ok(self.load_with_flags(&[])?.0)
    }

    /// Loads the config; the command's own `flags` may also appear among the overrides
    /// (`bench --config F --training.seq_len 256 --steps 5`) and are returned separately.
    pub(crate) fn load_with_flags(&self, flags: &[&str]) -> Result<(JobConfig, Vec<(String, String)>)> {
        let mut overrides = parse_overrides(&self.overrides)?;
        let (own, rest): (Vec<_>, Vec<_>) = overrides.into_iter().partition(|(k, _)| flags.contains(&k.as_str()));
        overrides = rest;
        let mut path = self.config.clone();
        if let Some(i) = overrides.iter().position(|(k, _)| k == "job.config_file" || k == "config") {
            path = Some(PathBuf::from(overrides.remove(i).1));
        }
        let cfg = load_config(path.as_deref(), &overrides)?;
        titan_rs::memory::checks::check(&cfg)?;
        Ok((cfg, own))
    }
}

#[derive(Subcommand)]
pub(crate) enum Command {
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
    /// Conversion between Hugging Face model folders (Llama, Qwen3, Qwen3-MoE, DeepSeek-V3) and titan-rs checkpoints.
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
    /// Compile every CubeCL kernel to PTX without a GPU, through cubecl-cuda's own compiler, for
    /// float32 and bfloat16 and each head size: `OUT/NNN_<entry>.ptx` and `OUT/kernels.tsv` (kernel,
    /// entry point, threads, shared memory, file, `ok` or the error). A CUDA build only (`--features cuda`);
    /// `scripts/gpu/ptx_report.py` runs it and NVIDIA's `ptxas` on the result.
    Ptx {
        /// The folder to write.
        #[arg(long)]
        out: PathBuf,
        /// The SM architecture (90: H100/H200).
        #[arg(long, default_value_t = 90)]
        sm: u32,
        /// The CUDA driver version whose PTX to emit (12090: 12.9).
        #[arg(long, default_value_t = 12090)]
        driver: i32,
        /// Head sizes of the attention kernels (64: `small`, `1B`; 128: `3B`, `8B`).
        #[arg(long, num_args = 1.., default_values_t = [64, 128])]
        head_dim: Vec<usize>,
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
pub(crate) enum ConvertCommand {
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
        dtype: titan_rs::config::ExportDtype,
        /// Cut the weights into files of at most this many MB (transformers: 5000).
        #[arg(long, default_value_t = 5000)]
        max_shard_mb: u64,
    },
}

#[derive(Subcommand)]
pub(crate) enum CheckpointCommand {
    /// Step, format, the layout it was saved under, files and sizes, every tensor's shape and
    /// chunks.
    Inspect { dir: PathBuf },
    /// Writes every tensor in full into one safetensors file, one tensor in memory at a time.
    Consolidate { dir: PathBuf, out: PathBuf },
}

#[derive(Subcommand)]
pub(crate) enum TraceCommand {
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
pub(crate) enum BenchKind {
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
        /// Where each rank's buffers live: `cpu`, or a GPU device (`wgpu`, `vulkan`, `cuda`),
        /// one GPU per rank, each call staged through host memory as training stages it.
        #[arg(long = "training.device", default_value = "cpu")]
        device: titan_rs::config::DeviceKind,
        /// Inject a fault on rank 1 first (tests that failures end every rank promptly).
        #[arg(long, value_enum, hide = true)]
        inject_fault: Option<titan_rs::commands::bench::comm::Fault>,
    },
}

#[derive(Subcommand)]
pub(crate) enum TokenizerCommand {
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
        token_dtype: titan_data::TokenDtype,
    },
}
