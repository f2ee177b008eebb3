//! Will it run, will it fit? The model × mesh rules ([`checks`]), each rank's memory planned
//! from the config before anything is allocated ([`plan`]), the check `titan-rs train` runs
//! with it (`training.memory_check`), and the host totals `titan-rs plan` prints. Thread ranks
//! share one host's memory, so their plans add up.

pub mod checks;
pub mod plan;

use crate::config::JobConfig;
use anyhow::{bail, Result};
pub use plan::{rank_memory, RankMemory};
use titan_parallel::ParallelDims;

pub fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

/// The value in kB of the line `name` (e.g. `"VmRSS:"`) of a `/proc` file, in bytes.
pub fn proc_bytes(file: &str, name: &str) -> Option<u64> {
    let text = std::fs::read_to_string(file).ok()?;
    let kb: u64 = text.lines().find(|l| l.starts_with(name))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Memory the OS can give this process now (`MemAvailable` of `/proc/meminfo`), in bytes.
pub fn available_bytes() -> Option<u64> {
    proc_bytes("/proc/meminfo", "MemAvailable:")
}

static RUNTIME: std::sync::OnceLock<u64> = std::sync::OnceLock::new();

/// Records this process's resident memory before any rank builds its model (the process's
/// runtime, which the plan does not count); the first call wins.
pub fn record_runtime() {
    RUNTIME.get_or_init(|| proc_bytes("/proc/self/status", "VmRSS:").unwrap_or(0));
}

/// The runtime recorded by [`record_runtime`], in GiB (0 if none was).
pub fn runtime_gib() -> f64 {
    gib(RUNTIME.get().copied().unwrap_or(0))
}

/// The plan of every rank this host runs, and (ranks, plan) per pipeline stage: all ranks when
/// they are threads (`ranks_here = None`); under MPI, `ranks_here` processes on this host, each
/// counted at the largest stage's plan (which stages they hold is not known here).
pub fn host_bytes(
    cfg: &JobConfig,
    dims: &ParallelDims,
    ranks_here: Option<usize>,
) -> Result<(u64, Vec<(usize, RankMemory)>)> {
    let args = cfg.model_args().map_err(|e| anyhow::anyhow!(e))?;
    let pp = dims.pp.max(1);
    let per_stage: Vec<RankMemory> = (0..pp).map(|r| rank_memory(cfg, &args, dims, r)).collect::<Result<_>>()?;
    let ranks_per_stage = dims.world_size / pp;
    Ok(match ranks_here {
        Some(local) => {
            let most = *per_stage.iter().max_by_key(|s| s.total()).expect("at least one stage");
            (most.total() * local as u64, vec![(local, most)])
        }
        None => (
            per_stage.iter().map(|s| s.total() * ranks_per_stage as u64).sum(),
            per_stage.iter().map(|s| (ranks_per_stage, *s)).collect(),
        ),
    })
}

/// One line per term of a rank's plan.
pub fn breakdown(m: &RankMemory) -> String {
    format!(
        "parameters {:.3} + gradients {:.3} + optimizer state (AdamW moments, Muon momentum) {:.3} + max(FSDP-gathered/compute-type weights {:.3} + activations {:.3} ({} microbatch(es) alive × {:.3} per block without checkpointing) + backward working set {:.3} + communication buffers {:.3} + kernel workspace {:.3}, gradient reduction buffers {:.3}) GiB",
        gib(m.params),
        gib(m.grads),
        gib(m.optimizer),
        gib(m.gathered),
        gib(m.activations),
        m.microbatches_alive,
        gib(m.per_layer),
        gib(m.backward_working_set),
        gib(m.comm_buffers),
        gib(m.workspace),
        gib(m.reduction_buffers),
    )
}

/// Refuses a job whose planned peak exceeds the memory available on this host, with the
/// breakdown and the levers. `training.memory_check = false` skips it.
pub fn check_fits(cfg: &JobConfig, dims: &ParallelDims, ranks_here: Option<usize>) -> Result<()> {
    if !cfg.training.memory_check {
        return Ok(());
    }
    let gpu = cfg.training.device.is_gpu();
    let (available, source) = if gpu {
        match device_memory(cfg) {
            Some(m) => m,
            None => {
                tracing::warn!(
                    "cannot tell the memory of `training.device` = \"{}\" (no nvidia-smi, no amdgpu sysfs entry): the fit check is skipped; set `training.device_memory_gib` to check",
                    cfg.training.device
                );
                return Ok(());
            }
        }
    } else {
        match available_bytes() {
            Some(a) => (a, "MemAvailable".to_string()),
            None => return Ok(()),
        }
    };
    let (need, per_stage) = host_bytes(cfg, dims, ranks_here)?;
    if need <= available {
        return Ok(());
    }
    let lines: Vec<String> = per_stage
        .iter()
        .enumerate()
        .map(|(stage, (n, m))| {
            format!(
                "    {n} rank(s){} × {:.1} GiB = {}",
                if per_stage.len() > 1 { format!(" of pipeline stage {stage}") } else { String::new() },
                gib(m.total()),
                breakdown(m)
            )
        })
        .collect();
    let state: u64 = per_stage.iter().map(|(n, m)| *n as u64 * m.state()).sum();
    let hint = if state > available {
        "float32 parameters, gradients and AdamW moments alone take 16 bytes per parameter wherever they live; ranks that share a host (threads of one process, or one device) share its memory, so sharding them (FSDP, TP, PP) moves memory between ranks but not off the host or device. To fit: run the ranks on more hosts or devices (`mpirun` with `parallelism.data_parallel_shard_degree`, `tensor_parallel_degree` or `pipeline_parallel_degree` across them), or choose a smaller `model.flavor`"
    } else {
        "to fit: checkpoint activations (`activation_checkpoint.mode` = \"full\", or \"selective\" with `selective_ac_option` = \"2\" or \"op\"), lower `training.local_batch_size` or `training.seq_len`, compute in `training.mixed_precision_param` = \"bfloat16\", use more pipeline microbatches (`parallelism.num_pp_microbatches`, schedule \"1F1B\"), or spread the ranks over more hosts"
    };
    let place = if gpu {
        match cfg.training.device_index() {
            Some(i) => format!("the {} device {i}", cfg.training.device),
            None => format!("each rank's {} device", cfg.training.device),
        }
    } else {
        "this host".into()
    };
    bail!(
        "`model.flavor` = {:?} does not fit: {place}'s ranks need about {:.1} GiB at the peak of a step and {:.1} GiB is available ({source}):\n{}\n{hint}; `training.memory_check = false` skips this check.",
        cfg.model.flavor,
        gib(need),
        gib(available),
        lines.join("\n")
    )
}

/// The memory of the configured GPU and where the number came from: `training.device_memory_gib`
/// when set, else `nvidia-smi`, else the amdgpu driver's sysfs entry; `None` when none tells.
pub fn device_memory(cfg: &JobConfig) -> Option<(u64, String)> {
    let t = &cfg.training;
    if t.device_memory_gib > 0.0 {
        return Some(((t.device_memory_gib * (1u64 << 30) as f64) as u64, "`training.device_memory_gib`".into()));
    }
    let i = t.device_index.max(0);
    let smi = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", &i.to_string()])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse::<u64>().ok());
    if let Some(mib) = smi {
        return Some((mib << 20, "nvidia-smi".into()));
    }
    let sysfs = format!("/sys/class/drm/card{i}/device/mem_info_vram_total");
    let bytes = std::fs::read_to_string(&sysfs).ok()?.trim().parse::<u64>().ok()?;
    Some((bytes, sysfs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(flavor: &str, shard: i64, tp: usize, pp: usize) -> (JobConfig, ParallelDims) {
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
        let args = titan_models::ModelArgs::flavor("debugmodel").unwrap();
        let s = rank_memory(&c, &args, &d, 0).unwrap();
        let n = args.num_params() as u64;
        assert_eq!((s.params, s.grads, s.optimizer, s.gathered), (4 * n, 4 * n, 8 * n, 0));
    }

    /// Muon keeps one buffer (4 bytes) per element of the matrices it takes, AdamW two (8) for
    /// the rest (embedding, output head, norms).
    #[test]
    fn muon_state_is_one_buffer_per_matrix_element() {
        let (mut c, d) = cfg("debugmodel", 1, 1, 1);
        c.optimizer.name = crate::config::OptimizerName::Muon;
        let args = titan_models::ModelArgs::flavor("debugmodel").unwrap();
        let s = rank_memory(&c, &args, &d, 0).unwrap();
        let specs = titan_models::Transformer::new(&args, 0, &burn::prelude::Device::flex()).param_specs();
        let muon: u64 = specs
            .iter()
            .filter(|p| crate::optim::groups::muon_by_default(&p.path, p.shape.len()))
            .map(|p| p.shape.iter().product::<usize>() as u64)
            .sum();
        let n = args.num_params() as u64;
        assert!(muon > n / 2, "the hidden matrices are most of debugmodel: {muon} of {n}");
        assert_eq!(s.optimizer, 8 * n - 4 * muon);
    }

    #[test]
    fn sharding_splits_the_state_and_the_host_total_counts_every_rank() {
        let args = titan_models::ModelArgs::flavor("debugmodel").unwrap();
        let n = args.num_params() as u64;
        let (c, d) = cfg("debugmodel", 2, 2, 2);
        let stages: Vec<RankMemory> = (0..2).map(|r| rank_memory(&c, &args, &d, r).unwrap()).collect();
        // 8 ranks, 4 per stage: every parameter is split 4 ways (TP 2 × FSDP 2) except the
        // norm weights, split by FSDP only (2 copies over TP). Every dimension divides evenly.
        let norms = ((2 * args.n_layers + 1) * args.dim) as u64;
        let held: u64 = stages.iter().map(|s| s.params / 4 * 4).sum();
        assert_eq!(held, n + norms, "{stages:?}");
        for s in &stages {
            assert_eq!(s.gathered, 2 * s.params, "FSDP 2: the gathered copy is twice the shard");
            assert!(
                s.activations > 0 && s.backward_working_set > 0 && s.comm_buffers > 0 && s.reduction_buffers > 0,
                "{s:?}"
            );
        }
        let (total, _) = host_bytes(&c, &d, None).unwrap();
        assert_eq!(total, 4 * stages.iter().map(RankMemory::total).sum::<u64>());
    }

    #[test]
    fn the_8b_flavor_is_refused_on_a_host_without_128_gib() {
        let (c, d) = cfg("8B", 1, 1, 1);
        let (need, _) = host_bytes(&c, &d, None).unwrap();
        assert!(need > 110 << 30, "8B: {need} bytes");
        if available_bytes().is_some_and(|a| a < need) {
            let e = check_fits(&c, &d, None).unwrap_err().to_string();
            assert!(
                e.contains("\"8B\" does not fit") && e.contains("AdamW moments") && e.contains("training.memory_check"),
                "{e}"
            );
        }
    }
}
