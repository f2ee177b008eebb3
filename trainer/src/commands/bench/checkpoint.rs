//! `titan-rs bench checkpoint`: what a checkpoint save costs on the configured mesh (ranks as
//! threads), in alternating rounds of three ways to save the same state:
//!
//! * **gathered** — the previous format: every parameter and AdamW moment all-gathered into
//!   full tensors, serialized and written by rank 0 alone (kept here as the baseline);
//! * **sharded** — every rank writes its own pieces, rank 0 commits (synchronous);
//! * **sharded async** — the same staged on the host and written by a background thread while
//!   `--steps` training steps run; committed when every writer is done.
//!
//! Per save: the wall time, the time training was blocked, and each rank thread's peak of
//! newly allocated bytes during the save (the counting allocator in `alloc`).

use crate::alloc;
use crate::config::{AsyncMode, JobConfig};
use crate::rank::params;
use crate::rank::pipeline::gather_stages;
use crate::rank::RankContext;
use crate::train::trainer::Trainer;
use anyhow::Result;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;
use titan_checkpoints::{save_tensors, CheckpointFolder};

pub const MODES: [&str; 3] = ["gathered (rank 0 writes)", "sharded", "sharded async"];

/// One save on one rank.
#[derive(Debug, Clone, Copy)]
struct Sample {
    wall: f64,
    blocked: f64,
    peak_bytes: f64,
}

/// The previous save: full tensors gathered, rank 0 serializes and writes them.
fn gathered_save(t: &Trainer, folder: &CheckpointFolder) -> Result<()> {
    let model_t = t.placement.gather_full(params::model_to_tensors(&t.model), &t.rank)?;
    let optim_t = t.placement.gather_full(t.optim.state_dict(&t.model), &t.rank)?;
    let (Some(model), Some(optim)) =
        (gather_stages(model_t, &t.layout, &t.rank)?, gather_stages(optim_t, &t.layout, &t.rank)?)
    else {
        return Ok(());
    };
    let meta = HashMap::from([("step".to_string(), t.step.to_string())]);
    let mut p = folder.begin(t.step)?;
    p.write("model.safetensors", &save_tensors(&model, meta.clone())?)?;
    p.write("optimizer.safetensors", &save_tensors(&optim, meta)?)?;
    p.commit()?;
    folder.prune(1)
}

fn barrier(t: &Trainer) -> Result<()> {
    if let Some(w) = &t.rank.world {
        w.barrier()?;
    }
    Ok(())
}

fn rank_bench(cfg: JobConfig, rank: RankContext, rounds: usize, steps: usize) -> Result<Vec<Sample>> {
    let gathered = CheckpointFolder::new(PathBuf::from(&cfg.job.dump_folder).join("gathered"));
    let mut t = Trainer::new(cfg, rank)?;
    t.train_step()?; // the optimizer state exists from here on
    let mut out = Vec::new();
    for _ in 0..rounds {
        for mode in 0..MODES.len() {
            // Each save gets its own step folder (the state is the same; only its number moves),
            // as in training, where a save never replaces one of the same step.
            t.step += 1;
            barrier(&t)?;
            let base = alloc::reset_thread_peak();
            let blocked_before = t.checkpointer.blocked_seconds();
            let start = Instant::now();
            let (blocked, peak) = match mode {
                0 => {
                    gathered_save(&t, &gathered)?;
                    barrier(&t)?;
                    (start.elapsed().as_secs_f64(), alloc::thread_peak() - base)
                }
                1 => {
                    t.cfg.checkpoint.async_mode = AsyncMode::Disabled;
                    t.save_checkpoint()?;
                    barrier(&t)?;
                    (start.elapsed().as_secs_f64(), alloc::thread_peak() - base)
                }
                _ => {
                    t.cfg.checkpoint.async_mode = AsyncMode::Async;
                    t.save_checkpoint()?;
                    // The staging copy is this thread's; the training steps after it are not the save's.
                    let peak = alloc::thread_peak() - base;
                    for _ in 0..steps {
                        t.train_step()?;
                        t.poll_pending_save()?;
                    }
                    t.wait_for_pending_save()?;
                    barrier(&t)?;
                    (t.checkpointer.blocked_seconds() - blocked_before, peak)
                }
            };
            out.push(Sample { wall: start.elapsed().as_secs_f64(), blocked, peak_bytes: peak as f64 });
        }
    }
    Ok(out)
}

/// Median and range of `xs`.
fn stats(mut xs: Vec<f64>) -> (f64, f64, f64) {
    xs.sort_by(f64::total_cmp);
    (xs[xs.len() / 2], xs[0], xs[xs.len() - 1])
}

/// Runs the rounds and prints the table; returns it.
pub fn bench(mut cfg: JobConfig, rounds: usize, steps: usize) -> Result<String> {
    let dump = tempfile_dir()?;
    cfg.job.dump_folder = dump.display().to_string();
    cfg.checkpoint.enable = true;
    cfg.checkpoint.keep_latest_k = 1;
    cfg.validation.enable = false;
    cfg.training.steps = u64::MAX / 2;
    let all = super::on_every_rank(&cfg, |rank| rank_bench(cfg.clone(), rank, rounds, steps))?;
    let ranks = all.len();
    let _ = std::fs::remove_dir_all(&dump);
    let gib = |b: f64| b / (1u64 << 30) as f64;
    let mut s = format!(
        "bench checkpoint: {} on {ranks} rank(s) ({}), {rounds} alternating rounds, {steps} training step(s) during each async write; medians [ranges]\n",
        cfg.model.flavor,
        crate::commands::bench::train::label(&cfg)
    );
    s += "| save | wall s | training blocked s | peak new bytes, rank 0 GiB | peak new bytes, largest rank GiB |\n|---|---|---|---|---|\n";
    for (m, name) in MODES.iter().enumerate() {
        let of = |f: &dyn Fn(&Sample) -> f64, rank: Option<usize>| -> Vec<f64> {
            (0..rounds)
                .map(|r| {
                    let per_rank = all.iter().map(|samples| f(&samples[r * MODES.len() + m]));
                    match rank {
                        Some(i) => per_rank.clone().nth(i).unwrap(),
                        None => per_rank.fold(f64::MIN, f64::max),
                    }
                })
                .collect()
        };
        let (w, w0, w1) = stats(of(&|x| x.wall, Some(0)));
        let (b, b0, b1) = stats(of(&|x| x.blocked, Some(0)));
        let (p0, _, _) = stats(of(&|x| gib(x.peak_bytes), Some(0)));
        let (pm, _, _) = stats(of(&|x| gib(x.peak_bytes), None));
        s += &format!("| {name} | {w:.2} [{w0:.2}–{w1:.2}] | {b:.2} [{b0:.2}–{b1:.2}] | {p0:.3} | {pm:.3} |\n");
    }
    // Same-round ratios (rank 0): each round's modes ran back to back.
    let ratio = |num: usize, den: usize, f: &dyn Fn(&Sample) -> f64| {
        stats((0..rounds).map(|r| f(&all[0][r * MODES.len() + num]) / f(&all[0][r * MODES.len() + den])).collect())
    };
    let (a, a0, a1) = ratio(2, 1, &|x| x.blocked);
    let (w, w0, w1) = ratio(0, 1, &|x| x.wall);
    let (m, m0, m1) = ratio(0, 1, &|x| x.peak_bytes);
    s += &format!(
        "same-round ratios: gathered / sharded wall {w:.1}× [{w0:.1}–{w1:.1}], rank-0 peak {m:.1}× [{m0:.1}–{m1:.1}]; async blocked / sync save {:.0}% [{:.0}–{:.0}%]\n",
        a * 100.0, a0 * 100.0, a1 * 100.0
    );
    Ok(s)
}

/// A scratch dump folder for the bench's checkpoints (removed afterwards).
fn tempfile_dir() -> Result<PathBuf> {
    let d = std::env::temp_dir().join(format!("titan-rs-bench-checkpoint-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}
