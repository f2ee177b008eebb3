//! `titan-rs plan`: what a config's pipeline does before anything runs — the stage split, each
//! rank's order of forward and backward microbatches in (simulated) time, the bubble, and how
//! the other schedules would do on the same mesh.

use crate::config::JobConfig;
use crate::rank::pipeline::RankLayout;
use anyhow::{anyhow, Result};
use std::fmt::Write;
use titan_models::ModelArgs;
use titan_parallel::pp::schedule::{peak_in_flight, rank_actions, simulate};
use titan_parallel::pp::{Schedule, StageSplit};

/// The plan of `cfg` as text.
pub fn plan(cfg: &JobConfig) -> Result<String> {
    let p = &cfg.parallelism;
    let args = cfg.model_args().map_err(|e| anyhow!(e))?;
    let dims = p.dims(None).map_err(|e| anyhow!(e))?;
    let local_batch = cfg.training.local_batch_size;
    let layout = RankLayout::new(p, &args, local_batch, 0).map_err(|e| anyhow!(e))?;
    let (pp, v, n) = (layout.split.pp, layout.split.virtual_stages, layout.microbatches);
    let mut out = String::new();
    let _ = writeln!(out, "mesh: {} rank(s) = {}", dims.world_size, dims.describe());
    if dims.cp > 1 {
        let (t, c) = (cfg.training.seq_len, dims.cp);
        let mut one = cfg.clone();
        one.parallelism.context_parallel_degree = 1;
        let without = titan_parallel::ParallelDims { cp: 1, world_size: dims.world_size / c, ..dims };
        let act = |cfg: &JobConfig, d: &titan_parallel::ParallelDims| -> Result<u64> {
            Ok(crate::memory::rank_memory(cfg, &args, d, 0)?.activations)
        };
        let _ = writeln!(
            out,
            "context parallel {c} ({}): each {t}-token sequence in 2·{c} chunks of {}, rank r holding chunks r and {}−r ({} positions); activations per rank {:.3} GiB vs {:.3} GiB without CP; weights sharded over shard × cp = {}",
            p.context_parallel_rotate_method,
            t / (2 * c),
            2 * c - 1,
            t / c,
            crate::memory::gib(act(cfg, &dims)?),
            crate::memory::gib(act(&one, &without)?),
            dims.fsdp_size()
        );
    }
    if dims.ep > 1 {
        let m = args.moe.as_ref().expect("validated: expert parallelism needs an MoE model");
        let _ = writeln!(
            out,
            "expert parallel {}: {} routed experts per rank of each MoE layer (of {}), tokens dispatched and combined by all-to-all; expert weights sharded over dp_shard × cp × tp / ep = {}",
            dims.ep,
            m.num_experts / dims.ep,
            m.num_experts,
            dims.efsdp_size()
        );
    }
    let _ = match &args.moe {
        Some(m) => writeln!(
            out,
            "model {}/{}: {} layers ({} dense), {:.1} M parameters, {:.1} M active per token (top {} of {} experts + {} shared)",
            args.family,
            cfg.model.flavor,
            args.n_layers,
            m.n_dense_layers,
            args.num_params() as f64 / 1e6,
            args.num_active_params() as f64 / 1e6,
            m.top_k,
            m.num_experts,
            m.num_shared_experts
        ),
        None => writeln!(
            out,
            "model {}/{}: {} layers, {:.1} M parameters, {} heads ({} kv) of {}{}",
            args.family,
            cfg.model.flavor,
            args.n_layers,
            args.num_params() as f64 / 1e6,
            args.n_heads,
            args.n_kv_heads,
            args.head_dim(),
            if args.qk_norm { ", QK-norm" } else { "" }
        ),
    };
    let last = layout.split.num_stages() - 1;
    for (s, layers) in layout.split.layers.iter().enumerate() {
        let mut what = vec![format!("layers {}..{}", layers.start, layers.end)];
        if s == 0 {
            what.insert(0, "embedding".into());
        }
        if s == last {
            what.push("norm + head + loss".into());
        }
        let _ = writeln!(out, "  stage {s} on pp rank {}: {}", layout.split.rank_of_stage(s), what.join(" + "));
    }
    let ac = cfg.activation_checkpoint.policy().map_err(|e| anyhow!(e))?;
    let _ = writeln!(
        out,
        "memory per rank at the peak of a step ({}, {} × {} tokens per microbatch, {}):",
        crate::memory::plan::describe(ac),
        local_batch / layout.microbatches,
        cfg.training.seq_len,
        cfg.training.mixed_precision_param
    );
    for r in 0..pp {
        let m = crate::memory::rank_memory(cfg, &args, &dims, r)?;
        let _ =
            writeln!(out, "  pp rank {r}: {:.3} GiB = {}", crate::memory::gib(m.total()), crate::memory::breakdown(&m));
    }
    let (host, _) = crate::memory::host_bytes(cfg, &dims, None)?;
    let _ = writeln!(
        out,
        "all {} rank(s) as threads of one process: {:.3} GiB (plus the process's runtime)",
        dims.world_size,
        crate::memory::gib(host)
    );
    if pp == 1 {
        let _ =
            writeln!(out, "no pipeline parallelism (`parallelism.pipeline_parallel_degree` = 1): one stage, no bubble");
        return Ok(out);
    }
    let _ = writeln!(
        out,
        "schedule {} with {n} microbatches of {}×{} per data-parallel rank (a stage's forward = 1 time cell, backward = 2):",
        layout.schedule.name(),
        local_batch / n,
        cfg.training.seq_len
    );
    let t = simulate(layout.schedule, pp, v, n).map_err(|e| anyhow!(e))?;
    out += &t.render();
    let peaks: Vec<String> = peaks(layout.schedule, pp, v, n).iter().map(usize::to_string).collect();
    let _ = writeln!(
        out,
        "bubble: {:.1}% of rank time idle; activations held at most (microbatch-stages per rank): {}",
        100.0 * t.bubble,
        peaks.join(", ")
    );
    let _ = writeln!(
        out,
        "the same mesh and microbatches under each schedule (a unit = the forward of one rank's layers):"
    );
    for s in [Schedule::GPipe, Schedule::OneFOneB, Schedule::Interleaved1F1B] {
        let _ = writeln!(out, "  {:<16} {}", s.name(), compare(s, &args, pp, n));
    }
    Ok(out)
}

/// Each rank's peak of microbatch-stages whose activations it holds.
fn peaks(s: Schedule, pp: usize, v: usize, n: usize) -> Vec<usize> {
    (0..pp).map(|r| peak_in_flight(&rank_actions(s, pp, v, n, r))).collect()
}

/// One schedule's bubble and peak activations on `pp` ranks with `n` microbatches (the
/// interleaved one with two stages per rank), or why it does not apply.
fn compare(s: Schedule, args: &ModelArgs, pp: usize, n: usize) -> String {
    let split = StageSplit::new(args.n_layers, pp, s, None);
    let checked = split.and_then(|split| {
        titan_parallel::pp::schedule::check_microbatches(s, pp, n)?;
        Ok(split.virtual_stages)
    });
    let v = match checked {
        Ok(v) => v,
        Err(e) => return format!("n/a: {e}"),
    };
    match simulate(s, pp, v, n) {
        Ok(t) => {
            let peak = peaks(s, pp, v, n).into_iter().max().unwrap_or(0);
            // A stage is 1/v of a rank's layers: time in forwards of a rank's whole share.
            let time = t.makespan as f64 / v as f64;
            format!(
                "bubble {:5.1}%, step time {time:5.1} units, peak activations {peak} microbatch-stages",
                100.0 * t.bubble
            )
        }
        Err(e) => format!("n/a: {e}"),
    }
}
