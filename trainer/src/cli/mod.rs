//! The `titan-rs` command line: [`args`] is its shape, [`bench`] the benchmarks; [`run`] carries
//! out the other commands.

pub(crate) mod args;
mod bench;

use anyhow::{Context, Result};
use args::{CheckpointCommand, Cli, Command, ConvertCommand, TokenizerCommand, TraceCommand};
use titan_rs::commands::generate;
use titan_rs::config::{to_toml, JobConfig};
use titan_rs::train::{self, elastic};

pub(crate) fn set_threads(cfg: &JobConfig) -> Result<()> {
    if cfg.training.threads > 0 {
        rayon::ThreadPoolBuilder::new()
            .num_threads(cfg.training.threads)
            .build_global()
            .context("setting training.threads")?;
    }
    Ok(())
}

/// Carries out the command `cli` names.
pub(crate) fn run(cli: Cli) -> Result<()> {
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
                return elastic::supervise(
                    &cfg,
                    &elastic::Restarts { max_restarts, launcher, config: a.config.clone(), overrides },
                );
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
        Command::Plan(a) => print!("{}", titan_rs::commands::plan::plan(&a.load()?)?),
        Command::Tokenizer { command: TokenizerCommand::Train { input, vocab_size, out } } => {
            let n = titan_data::train_bpe(&input, vocab_size, &out)?;
            println!("wrote {} ({n} tokens)", out.display());
        }
        Command::Tokenizer {
            command: TokenizerCommand::Encode { input, tokenizer, cache_dir, text_column, token_dtype },
        } => {
            let path = tokenizer.unwrap_or_else(|| titan_rs::config::Model::default().tokenizer_file());
            let tok = titan_data::Tokenizer::from_file(&path)?;
            let start = std::time::Instant::now();
            let o = titan_data::CorpusOptions { text_column, token_dtype };
            let f = titan_data::tokenize_corpus_with(&input, &tok, &cache_dir, &o)?;
            let secs = start.elapsed().as_secs_f64();
            let bytes: u64 = titan_data::list_corpus_files(&input)?
                .iter()
                .filter_map(|p| std::fs::metadata(p).ok())
                .map(|m| m.len())
                .sum();
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
        Command::Bench { kind } => bench::run(kind)?,
        Command::Ptx { out, sm, driver, head_dim } => {
            let (ok, total) = titan_rs::commands::ptx::write(&out, sm, driver, &head_dim)?;
            println!("{ok} of {total} kernels compiled to PTX for sm_{sm} in {}", out.display());
            if ok < total {
                anyhow::bail!("{} kernels did not compile (see {})", total - ok, out.join("kernels.tsv").display());
            }
        }
        Command::Devices { json } => {
            let adapters = titan_rs::device::adapters();
            println!("| adapter | kind | index | backend | driver | float16 | bfloat16 | trains on |");
            println!("|---|---|---|---|---|---|---|---|");
            for a in &adapters {
                println!(
                    "| {} | {} | {} | {} | {} {} | {} | {} | {} |",
                    a.name,
                    a.kind,
                    a.index,
                    a.backend,
                    a.driver,
                    a.driver_info,
                    a.float16,
                    a.bfloat16,
                    if a.chosen { "yes" } else { "" }
                );
            }
            if adapters.is_empty() {
                println!("no wgpu adapter (a build without `--features wgpu`, or no Vulkan/GPU driver)");
            }
            if let Some(p) = json {
                std::fs::write(&p, serde_json::to_string_pretty(&adapters)?)
                    .with_context(|| format!("writing {}", p.display()))?;
            }
        }
        Command::Convert { command: ConvertCommand::FromHf { hf_dir, out } } => {
            let (dir, n) = titan_rs::commands::convert::from_hf(&hf_dir, &out)?;
            println!("wrote {} ({n} tensors)", dir.display());
        }
        Command::Convert { command: ConvertCommand::ToHf { checkpoint, out, dtype, max_shard_mb } } => {
            let o = titan_rs::hf::export::ExportOptions {
                dtype,
                max_shard_bytes: max_shard_mb * 1_000_000,
                ..Default::default()
            };
            let (n, bytes) = titan_rs::commands::convert::to_hf(&checkpoint, &out, &o)?;
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
