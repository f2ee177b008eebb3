//! `titan-rs bench …`: measurements of the real code paths, each checked as it is timed.
//!
//! * [`train`]: tokens/s, MFU, communication share and pipeline bubble of training steps on the
//!   configured mesh, optionally beside a baseline measured in the same run.
//! * [`kernels`]: every fused kernel against its reference, timed on the device.
//! * [`comm`]: every collective of the communicator, 1 KiB to 64 MiB.
//! * [`checkpoint`]: save time, blocked time and per-rank memory: gathered vs sharded vs async.

pub mod checkpoint;
pub mod comm;
pub mod kernels;
pub mod train;

use crate::config::JobConfig;
use crate::rank::RankContext;
use anyhow::{anyhow, Result};
use std::time::Duration;
use titan_parallel::{run_ranks_or_exit, MeshGroups};

/// Runs `f` on every rank of the config's mesh (threads of this process); the results in rank
/// order.
pub fn on_every_rank<T: Send>(cfg: &JobConfig, f: impl Fn(RankContext) -> Result<T> + Sync) -> Result<Vec<T>> {
    let dims = cfg.parallelism.dims(None).map_err(|e| anyhow!(e))?;
    if dims.world_size == 1 {
        return Ok(vec![f(RankContext::single())?]);
    }
    let timeout = Duration::from_secs_f64(cfg.comm.init_timeout_seconds);
    run_ranks_or_exit(dims.world_size, timeout, Duration::from_secs(10), |comm| {
        let groups = MeshGroups::new(&comm, &dims)?;
        f(RankContext::new(groups))
    })
}
