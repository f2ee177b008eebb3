//! `titan-rs bench train`: tokens/s, MFU and the communication share of training steps,
//! measured with the real train step on the configured mesh (ranks as threads).

use crate::config::{JobConfig, Precision};
use crate::metrics::peak;
use crate::metrics::StepStats;
use crate::rank::RankContext;
use crate::train::trainer::Trainer;
use anyhow::{anyhow, bail, Context, Result};
use titan_kernels::transfer::{self, Traffic};

#[derive(serde::Serialize)]
pub struct BenchResult {
    pub ranks: usize,
    /// Tokens of the whole job (every data-parallel rank) per second.
    pub tokens_per_s: f64,
    pub step_seconds: f64,
    /// Of a step, the share spent inside collectives or waiting for the communication stream's
    /// (exposed; rank 0, median step).
    pub comm_share: f64,
    /// Collective time the communication stream hid behind compute, as a share of the step
    /// (overlap; rank 0, median step).
    pub comm_hidden_share: f64,
    /// `None`: no peak known for the device (a GPU not in the table, no `metrics.peak_tflops`).
    pub mfu: Option<f64>,
    pub peak_tflops: Option<f64>,
    /// Of the forward/backward schedule's wall time, the share ranks spent waiting for other
    /// pipeline stages (mean over ranks of each rank's median step); 0 without pipelining.
    pub bubble: f64,
    /// Bytes rank 0 moved between host memory and its GPU per step (mean of the timed steps;
    /// counted at every titan-rs transfer; 0 on the CPU): device → host and host → device.
    pub device_to_host_bytes_per_step: u64,
    pub host_to_device_bytes_per_step: u64,
}

/// Times `steps` steps after `warmup` on one rank; returns the step stats and the trainer's
/// global tokens per step.
fn time_rank(
    cfg: JobConfig,
    rank: RankContext,
    warmup: usize,
    steps: usize,
) -> Result<(Vec<StepStats>, usize, Traffic)> {
    let mut t = Trainer::new(cfg, rank)?;
    for _ in 0..warmup {
        t.train_step()?;
    }
    let before = transfer::traffic();
    let stats = (0..steps).map(|_| t.train_step()).collect::<Result<Vec<_>>>()?;
    Ok((stats, t.tokens_per_step(), transfer::traffic() - before))
}

pub fn bench(mut cfg: JobConfig, warmup: usize, steps: usize) -> Result<BenchResult> {
    cfg.checkpoint.enable = false;
    cfg.validation.enable = false;
    cfg.training.steps = cfg.training.steps.max((warmup + steps) as u64);
    let mut all = super::on_every_rank(&cfg, |rank| time_rank(cfg.clone(), rank, warmup, steps))?;
    let ranks = all.len();
    for (stats, _, _) in &mut all {
        stats.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
    }
    let bubble = all
        .iter()
        .map(|(s, _, _)| &s[s.len() / 2])
        .map(|m| 1.0 - m.busy_seconds / m.pipeline_seconds.max(f64::MIN_POSITIVE))
        .sum::<f64>()
        / ranks as f64;
    let (stats, tokens_per_step, traffic) = all.swap_remove(0);
    let median = &stats[stats.len() / 2];
    let tps = tokens_per_step as f64 / median.seconds;
    // The whole job's throughput against the whole device (all ranks share it).
    let device = crate::device::select(cfg.training.device, cfg.training.device_index(), 0)?;
    let mut peak =
        peak::resolve(cfg.metrics.peak_tflops(), cfg.training.device, &device, cfg.training.mixed_precision_param, 1);
    let args = cfg.model_args().map_err(|e| anyhow!(e))?;
    let tflops = tps * args.flops_per_token(cfg.training.seq_len) / 1e12;
    let (mfu, _) = crate::metrics::logger::mfu(tflops, &mut peak);
    Ok(BenchResult {
        ranks,
        tokens_per_s: tps,
        step_seconds: median.seconds,
        comm_share: median.comm_seconds / median.seconds,
        comm_hidden_share: median.comm_hidden_seconds / median.seconds,
        mfu,
        peak_tflops: peak.map(|p| p.tflops),
        bubble: if cfg.parallelism.pipeline_parallel_degree > 1 { bubble.max(0.0) } else { 0.0 },
        device_to_host_bytes_per_step: traffic.to_host / steps.max(1) as u64,
        host_to_device_bytes_per_step: traffic.to_device / steps.max(1) as u64,
    })
}

/// Writes one result as JSON, with what it measured (`label`) and the compute type.
pub fn write_json(path: &std::path::Path, label: &str, precision: Precision, r: &BenchResult) -> Result<()> {
    let mut v = serde_json::to_value(r)?;
    v["label"] = serde_json::json!(label);
    v["mixed_precision_param"] = serde_json::json!(precision);
    v["adapter"] = serde_json::json!(crate::device::selected_adapter());
    std::fs::write(path, serde_json::to_string_pretty(&v)?).with_context(|| format!("writing {}", path.display()))
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
        let n = p.pp_microbatches();
        layout += &format!(" × pp {} {} ({n} microbatches)", p.pipeline_parallel_degree, p.pipeline_parallel_schedule);
    }
    let t = &cfg.training;
    format!("{} | {layout} | {}×{}", cfg.model.flavor, t.local_batch_size, t.seq_len)
}

/// A comparison measured in the same run: the median and range of each side's tokens/s over
/// alternating rounds.
pub struct Baseline {
    pub name: String,
    pub ours: Vec<f64>,
    pub theirs: Vec<f64>,
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

fn range(v: &[f64]) -> (f64, f64) {
    (v.iter().copied().fold(f64::MAX, f64::min), v.iter().copied().fold(f64::MIN, f64::max))
}

/// The command that measures PyTorch eager (Hugging Face's Llama, sdpa) on the same model
/// shape, tokens per step and threads (`scripts/pytorch_baseline.py`).
pub fn pytorch_command(cfg: &JobConfig, warmup: usize, steps: usize) -> Vec<String> {
    let a = cfg.model_args().expect("validated model");
    let dp = cfg.parallelism.dims(None).map(|d| d.dp_replicate * d.dp_shard).unwrap_or(1);
    let threads = if cfg.training.threads > 0 { cfg.training.threads } else { rayon::current_num_threads() };
    let script = crate::paths::resolve("scripts/pytorch_baseline.py");
    let mut cmd = vec!["python3".to_string(), script.display().to_string()];
    for (k, v) in [
        ("--batch", cfg.global_batch_size(dp)),
        ("--seq", cfg.training.seq_len),
        ("--warmup", warmup),
        ("--steps", steps),
        ("--threads", threads),
        ("--dim", a.dim),
        ("--layers", a.n_layers),
        ("--heads", a.n_heads),
        ("--kv-heads", a.n_kv_heads),
        ("--ffn", a.ffn_hidden_dim()),
        ("--vocab", a.vocab_size),
    ] {
        cmd.push(k.into());
        cmd.push(v.to_string());
    }
    // The same device kind (a GPU is CUDA to PyTorch) and compute type.
    let device = if cfg.training.device.is_gpu() { "cuda" } else { "cpu" };
    let dtype = cfg.training.mixed_precision_param.as_str();
    for (k, v) in [("--device", device), ("--dtype", dtype)] {
        cmd.push(k.into());
        cmd.push(v.into());
    }
    cmd.push("--rope-theta".into());
    cmd.push(a.rope_theta.to_string());
    cmd
}

/// Runs a baseline command and reads the number before `tokens/s` in its last line that has one.
pub fn run_baseline(cmd: &[String]) -> Result<f64> {
    let out = std::process::Command::new(&cmd[0])
        .args(&cmd[1..])
        .output()
        .with_context(|| format!("running the baseline `{}`", cmd.join(" ")))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "the baseline `{}` failed ({}): {}",
            cmd.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("")
        );
    }
    parse_tokens_per_s(&text).ok_or_else(|| anyhow!("the baseline printed no `N tokens/s` line:\n{text}"))
}

/// The number right before `tokens/s` on the last line that has one.
pub fn parse_tokens_per_s(text: &str) -> Option<f64> {
    text.lines().rev().find_map(|l| {
        let i = l.find("tokens/s")?;
        l[..i].split_whitespace().last()?.trim_matches(',').parse().ok()
    })
}

/// Prints the result as a Markdown table row under its header; with a baseline measured in the
/// same run, its median and range and the ratio of the medians.
pub fn print_table(label: &str, r: &BenchResult, baseline: Option<&Baseline>) {
    let opt = |x: Option<f64>, f: &dyn Fn(f64) -> String| x.map_or("n/a".to_string(), f);
    let mut header = "| model | layout | batch×seq per rank | ranks | step (s) | tokens/s (all ranks) | comm share (exposed / hidden) | pipeline bubble | MFU | peak TFLOP/s |".to_string();
    let mut row = format!(
        "| {label} | {} | {:.3} | {:.0} | {:.1}% / {:.1}% | {:.1}% | {} | {} |",
        r.ranks,
        r.step_seconds,
        r.tokens_per_s,
        100.0 * r.comm_share,
        100.0 * r.comm_hidden_share,
        100.0 * r.bubble,
        opt(r.mfu, &|m| format!("{m:.2}%")),
        opt(r.peak_tflops, &|p| format!("{p:.3}")),
    );
    if let Some(b) = baseline {
        let (ours, theirs) = (median(&b.ours), median(&b.theirs));
        let ((o0, o1), (t0, t1)) = (range(&b.ours), range(&b.theirs));
        header += &format!(
            " titan-rs tokens/s, median of {} (range) | {} tokens/s, same run | ratio |",
            b.ours.len(),
            b.name
        );
        row += &format!(" {ours:.0} ({o0:.0}–{o1:.0}) | {theirs:.0} ({t0:.0}–{t1:.0}) | {:.2}× |", ours / theirs);
    }
    println!("{header}");
    println!("{}", "|---".repeat(header.matches('|').count() - 1) + "|");
    println!("{row}");
    if r.device_to_host_bytes_per_step + r.host_to_device_bytes_per_step > 0 {
        println!(
            "host ↔ device per step (rank 0): {} B device → host, {} B host → device",
            r.device_to_host_bytes_per_step, r.host_to_device_bytes_per_step
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn baseline_output_is_parsed_and_the_pytorch_command_carries_the_shape() {
        let out = "loading\npytorch 2.15 eager, HF Llama sdpa: step 0.612 s, 3346 tokens/s\n";
        assert_eq!(parse_tokens_per_s(out), Some(3346.0));
        assert_eq!(parse_tokens_per_s("no numbers"), None);
        let mut cfg = JobConfig::default();
        cfg.model.flavor = "small".into();
        let cmd = pytorch_command(&cfg, 1, 3).join(" ");
        let a = titan_models::ModelArgs::flavor("small").unwrap();
        assert!(cmd.contains(&format!("--dim {} --layers {}", a.dim, a.n_layers)), "{cmd}");
        assert!(cmd.contains("--batch 8 --seq 256 --warmup 1 --steps 3"), "{cmd}");
    }
}
