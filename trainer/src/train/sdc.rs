//! Silent-data-corruption check (`fault.sdc_check_interval`): titan-rs's steps are bit-exact, so
//! a step computed twice must give the same bits. Every N steps each rank runs forward and
//! backward twice more on a probe batch — tokens drawn from the step number, identical on every
//! rank — and hashes its gradients (after FSDP's reduce-scatter, before the data-parallel
//! reduction; the probe's gradients are then dropped):
//!
//! * **re-execution**: the two hashes of a rank differ → that rank computes non-deterministically;
//! * **across replicas**: ranks holding the same parameters (the `replicate` group: DDP, HSDP
//!   across shard groups) must get the same hash for the same input; a rank outside the majority
//!   is named (with two replicas that disagree there is no majority: both are named).
//!
//! Every rank learns every verdict (one exchange over the world), so all stop together under
//! `fault.sdc_action = "stop"` or all log it under `"warn"`. The training step itself is
//! untouched: parameters, optimizer state, data position and MoE load counts are as without the
//! check (the step costs about two more forward/backward passes).

use super::trainer::Trainer;
use crate::metrics::Suspect;
use crate::config::SdcFlip;
use crate::rank::grads;
use crate::rank::pipeline::{run_schedule, StepInputs};
use anyhow::{anyhow, Result};
use burn::optim::GradientsParams;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use titan_data::Batch;
use titan_parallel::CommExt;

/// One probe run's gradients as a hash (what the replicas compare).
#[derive(Serialize, Deserialize)]
struct ProbeHash {
    rank: usize,
    host: String,
    hash: u64,
}

/// The probe batch of `step`: `rows × seq_len` tokens from a generator seeded by the step.
fn probe_batch(step: u64, rows: usize, seq_len: usize, vocab: usize) -> Batch {
    let mut state = step.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    let tokens: Vec<i64> = (0..rows * (seq_len + 1))
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % vocab as u64) as i64
        })
        .collect();
    let (mut inputs, mut targets) = (Vec::new(), Vec::new());
    for row in tokens.chunks(seq_len + 1) {
        inputs.extend_from_slice(&row[..seq_len]);
        targets.extend_from_slice(&row[1..]);
    }
    Batch { inputs, targets, batch: rows, seq_len }
}

impl Trainer {
    /// Whether `step` runs the check.
    pub(super) fn sdc_due(&self, step: u64) -> bool {
        let every = self.cfg.fault.sdc_check_interval;
        every > 0 && step % every == 0
    }

    /// Runs the check at `step` on a probe shaped like `shape` (a microbatch of this step); the
    /// ranks found at fault, the same list on every rank.
    pub(super) fn sdc_check(&self, step: u64, shape: &Batch) -> Result<Vec<Suspect>> {
        let probe = probe_batch(step, shape.batch, shape.seq_len, self.args.vocab_size);
        let loads = self.take_moe_loads();
        let flip = self.cfg.debug.sdc_flip_rank == self.rank.world_rank as i64;
        let first = self.probe_hash(&probe, flip && self.cfg.debug.sdc_flip == SdcFlip::Persistent)?;
        let second = self.probe_hash(&probe, flip)?;
        self.restore_moe_loads(loads);
        let host = titan_parallel::comm::watchdog::hostname();
        let me = self.rank.world_rank;
        let mut suspects = Vec::new();
        if first != second {
            suspects.push(Suspect { rank: me, host: host.clone(), check: "re-execution".into() });
        }
        if let Some(replicas) = &self.rank.replicate {
            let mine = ProbeHash { rank: me, host: host.clone(), hash: second };
            let all: Vec<ProbeHash> = replicas
                .all_gather_varlen(&serde_json::to_vec(&mine)?)?
                .iter()
                .map(|p| serde_json::from_slice(p).map_err(|e| anyhow!("SDC hash exchange: {e}")))
                .collect::<Result<_>>()?;
            let mut votes: BTreeMap<u64, usize> = BTreeMap::new();
            for p in &all {
                *votes.entry(p.hash).or_default() += 1;
            }
            let majority = votes.iter().find(|(_, &n)| 2 * n > all.len()).map(|(&h, _)| h);
            // Each replica group's members name their group's outliers; the lowest rank of the
            // group reports them (so each appears once).
            if all.iter().map(|p| p.rank).min() == Some(me) {
                for p in all.iter().filter(|p| Some(p.hash) != majority) {
                    suspects.push(Suspect { rank: p.rank, host: p.host.clone(), check: "replica".into() });
                }
            }
        }
        let Some(world) = &self.rank.world else { return Ok(suspects) };
        let mut every: Vec<Suspect> = Vec::new();
        for part in world.all_gather_varlen(&serde_json::to_vec(&suspects)?)? {
            let theirs: Vec<Suspect> = serde_json::from_slice(&part).map_err(|e| anyhow!("SDC verdict exchange: {e}"))?;
            every.extend(theirs);
        }
        every.sort();
        every.dedup();
        Ok(every)
    }

    /// Forward and backward of the probe; the hash of this rank's gradients (one bit of the first
    /// flipped when `flip`: `debug.sdc_flip_rank`).
    fn probe_hash(&self, probe: &Batch, flip: bool) -> Result<u64> {
        let (batch, docs) = self.local_batch(probe);
        let io = StepInputs {
            batch: &batch,
            total_tokens: batch.num_tokens() * self.rank.dp_degree * self.rank.cp_degree(),
            loss_scale: 1.0,
            inject_nan: false,
            hidden_positions: self.hidden_positions(),
            dim: self.args.dim,
            checkpointing: self.checkpointing,
            documents: docs.as_ref(),
        };
        let mut acc = GradientsParams::new();
        run_schedule(&self.model, &self.layout, &self.placement, self.rank.pp.as_deref(), &io, &self.device, &mut acc)?;
        Ok(grads::hash(&self.model, &acc, flip))
    }

    fn take_moe_loads(&self) -> Vec<titan_models::moe::Load> {
        self.model.chunks.iter().flat_map(|c| c.moe_layers()).map(|(_, m)| m.take_load()).collect()
    }

    fn restore_moe_loads(&self, loads: Vec<titan_models::moe::Load>) {
        let layers = self.model.chunks.iter().flat_map(|c| c.moe_layers());
        for ((_, m), load) in layers.zip(loads) {
            m.restore_load(load);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_is_a_function_of_the_step() {
        let a = probe_batch(10, 2, 8, 100);
        assert_eq!(a.inputs, probe_batch(10, 2, 8, 100).inputs);
        assert_ne!(a.inputs, probe_batch(20, 2, 8, 100).inputs);
        assert_eq!(&a.inputs[1..8], &a.targets[..7], "targets are the inputs shifted by one");
        assert!(a.inputs.iter().chain(&a.targets).all(|&t| (0..100).contains(&t)));
    }
}
