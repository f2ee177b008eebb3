//! Will it fit? A lower bound of each rank's memory, computed from the config before anything is
//! allocated, and the check `titan-rs train` runs with it (`training.memory_check`).
//!
//! The bound counts what training certainly holds: this rank's parameters (its pipeline stages,
//! its TP slice, its FSDP rows), their gradients, AdamW's two moments, and under FSDP the
//! gathered full parameters, which stay alive from forward to backward
//! (`fsdp_reshard_after_forward = "never"`), all float32. Activations, communication buffers and
//! kernel workspace come on top, so a job refused here cannot run; one accepted may still need
//! more. Thread ranks share one host's memory, so their bounds add up.

use crate::config::JobConfig;
use crate::parallelize::tp_split_dim;
use crate::pipeline::RankLayout;
use anyhow::{anyhow, bail, Result};
use burn::prelude::*;
use titan_models::ModelArgs;
use titan_parallel::ParallelDims;

/// Bytes one rank certainly holds during a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StaticBytes {
    pub params: u64,
    pub grads: u64,
    pub optimizer: u64,
    /// FSDP: full parameters gathered for forward and kept for backward.
    pub gathered: u64,
}

impl StaticBytes {
    pub fn total(&self) -> u64 {
        self.params + self.grads + self.optimizer + self.gathered
    }
}

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

/// The lower bound for pipeline rank `pp_rank` of the mesh `dims` (every rank of a pipeline
/// stage group holds the same amount: TP slices and FSDP rows are even up to padding).
pub fn rank_static_bytes(cfg: &JobConfig, args: &ModelArgs, dims: &ParallelDims, pp_rank: usize) -> Result<StaticBytes> {
    let layout = RankLayout::new(&cfg.parallelism, args, cfg.training.local_batch_size.max(1) as usize, pp_rank)
        .map_err(|e| anyhow!(e))?;
    // Lazily initialised: building the stages allocates nothing, it only knows their shapes.
    let stages = layout.build(args, 0, (true, true), &Device::flex());
    let (tp, shard) = (dims.tp.max(1) as u64, dims.dp_shard.max(1) as u64);
    let (mut local, mut gathered) = (0u64, 0u64);
    for spec in stages.chunks.iter().flat_map(|c| c.param_specs()) {
        let mut shape: Vec<u64> = spec.shape.iter().map(|&d| d as u64).collect();
        if let Some(d) = tp_split_dim(&spec.path).filter(|_| tp > 1) {
            shape[d] = shape[d].div_ceil(tp);
        }
        let full: u64 = shape.iter().product();
        if shard > 1 {
            gathered += full;
            shape[0] = shape[0].div_ceil(shard);
        }
        local += shape.iter().product::<u64>();
    }
    Ok(StaticBytes { params: 4 * local, grads: 4 * local, optimizer: 8 * local, gathered: 4 * gathered })
}

/// Memory the OS can give this process now (`MemAvailable` of `/proc/meminfo`), in bytes.
pub fn available_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = info.lines().find(|l| l.starts_with("MemAvailable:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The bound of every rank this host runs, and (ranks, bytes per rank) per pipeline stage: all
/// ranks when they are threads (`ranks_here = None`); under MPI, `ranks_here` processes on this
/// host, each counted at the smallest stage's bound (which stages they hold is not known here).
pub fn host_static_bytes(
    cfg: &JobConfig,
    dims: &ParallelDims,
    ranks_here: Option<usize>,
) -> Result<(u64, Vec<(usize, StaticBytes)>)> {
    let args = ModelArgs::flavor(&cfg.model.flavor).expect("validated flavor");
    let pp = dims.pp.max(1);
    let per_stage: Vec<StaticBytes> = (0..pp).map(|r| rank_static_bytes(cfg, &args, dims, r)).collect::<Result<_>>()?;
    let ranks_per_stage = dims.world_size / pp;
    let (total, listed) = match ranks_here {
        Some(local) => {
            let least = *per_stage.iter().min_by_key(|s| s.total()).expect("at least one stage");
            (least.total() * local as u64, vec![(local, least)])
        }
        None => (
            per_stage.iter().map(|s| s.total() * ranks_per_stage as u64).sum(),
            per_stage.iter().map(|s| (ranks_per_stage, *s)).collect(),
        ),
    };
    Ok((total, listed))
}

/// Refuses a job whose lower bound exceeds the memory available on this host, with the
/// breakdown and the levers. `training.memory_check = false` skips it.
pub fn check_fits(cfg: &JobConfig, dims: &ParallelDims, ranks_here: Option<usize>) -> Result<()> {
    if !cfg.training.memory_check || cfg.training.device != "cpu" {
        return Ok(());
    }
    let Some(available) = available_bytes() else { return Ok(()) };
    let (need, per_stage) = host_static_bytes(cfg, dims, ranks_here)?;
    if need <= available {
        return Ok(());
    }
    let lines: Vec<String> = per_stage
        .iter()
        .enumerate()
        .map(|(stage, (n, s))| {
            format!(
                "    {n} rank(s){} × {:.1} GiB: parameters {:.1} + gradients {:.1} + AdamW moments {:.1}{}",
                if per_stage.len() > 1 { format!(" of pipeline stage {stage}") } else { String::new() },
                gib(s.total()),
                gib(s.params),
                gib(s.grads),
                gib(s.optimizer),
                if s.gathered > 0 { format!(" + FSDP-gathered parameters {:.1}", gib(s.gathered)) } else { String::new() }
            )
        })
        .collect();
    bail!(
        "`model.flavor` = {:?} does not fit: this host's ranks need at least {:.1} GiB before any activation, and {:.1} GiB is available (MemAvailable):\n{}\nfloat32 parameters, gradients and AdamW moments take 16 bytes per parameter wherever they live; ranks that are threads of one process share its host, so sharding them (FSDP, TP, PP) moves memory between ranks but not off the host. To fit: run the ranks on more hosts (`mpirun` with `parallelism.data_parallel_shard_degree`, `tensor_parallel_degree` or `pipeline_parallel_degree` across them), or choose a smaller `model.flavor`; `training.memory_check = false` skips this check.",
        cfg.model.flavor,
        gib(need),
        gib(available),
        lines.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(flavor: &str, shard: i64, tp: i64, pp: i64) -> (JobConfig, ParallelDims) {
        let mut c = JobConfig::default();
        c.model.flavor = flavor.into();
        c.parallelism.data_parallel_shard_degree = shard;
        c.parallelism.tensor_parallel_degree = tp;
        c.parallelism.pipeline_parallel_degree = pp;
        let d = c.parallelism.dims(None).unwrap();
        (c, d)
    }

    #[test]
    fn one_rank_holds_16_bytes_per_parameter() {
        let (c, d) = cfg("debugmodel", 1, 1, 1);
        let args = ModelArgs::flavor("debugmodel").unwrap();
        let s = rank_static_bytes(&c, &args, &d, 0).unwrap();
        let n = args.num_params() as u64;
        assert_eq!(s, StaticBytes { params: 4 * n, grads: 4 * n, optimizer: 8 * n, gathered: 0 });
    }

    #[test]
    fn sharding_splits_the_state_and_the_host_total_counts_every_rank() {
        let args = ModelArgs::flavor("debugmodel").unwrap();
        let n = args.num_params() as u64;
        let (c, d) = cfg("debugmodel", 2, 2, 2);
        let stages: Vec<StaticBytes> = (0..2).map(|r| rank_static_bytes(&c, &args, &d, r).unwrap()).collect();
        // 8 ranks, 4 per stage: every parameter is split 4 ways (TP 2 × FSDP 2) except the
        // norm weights, split by FSDP only (2 copies over TP). Every dimension divides evenly.
        let norms = ((2 * args.n_layers + 1) * args.dim) as u64;
        let held: u64 = stages.iter().map(|s| s.params / 4 * 4).sum();
        assert_eq!(held, n + norms, "{stages:?}");
        for s in &stages {
            assert_eq!(s.gathered, 2 * s.params, "FSDP 2: the gathered copy is twice the shard");
        }
        let (total, _) = host_static_bytes(&c, &d, None).unwrap();
        assert_eq!(total, 4 * stages.iter().map(StaticBytes::total).sum::<u64>());
    }

    #[test]
    fn the_8b_flavor_is_refused_on_a_host_without_128_gib() {
        let (c, d) = cfg("8B", 1, 1, 1);
        let (need, _) = host_static_bytes(&c, &d, None).unwrap();
        assert!(need > 110 << 30, "8B: {need} bytes");
        if available_bytes().is_some_and(|a| a < need) {
            let e = check_fits(&c, &d, None).unwrap_err().to_string();
            assert!(e.contains("\"8B\" does not fit") && e.contains("AdamW moments") && e.contains("training.memory_check"), "{e}");
        }
    }
}
