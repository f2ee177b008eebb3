//! The resolved view: every sentinel of the schema (TorchTitan's `-1` = "automatic", `<= 0` =
//! "off") turned into what it means, here and nowhere else. Components ask these; none compares
//! a key with -1.

use super::schema::*;

/// `-1` (or any negative number) as `None`.
fn unless_negative(v: i64) -> Option<u64> {
    u64::try_from(v).ok()
}

impl JobConfig {
    /// Global batch in samples: `training.global_batch_size`, or (-1) one local batch per
    /// data-parallel rank, no accumulation.
    pub fn global_batch_size(&self, dp_degree: usize) -> usize {
        match unless_negative(self.training.global_batch_size) {
            Some(g) => g as usize,
            None => self.training.local_batch_size * dp_degree,
        }
    }
}

impl Training {
    /// `device_index`; `None` = one GPU per rank (-1).
    pub fn device_index(&self) -> Option<usize> {
        unless_negative(self.device_index).map(|i| i as usize)
    }
}

impl Parallelism {
    /// `data_parallel_shard_degree`; `None` = all the remaining ranks (-1).
    pub fn shard_degree(&self) -> Option<usize> {
        unless_negative(self.data_parallel_shard_degree).map(|d| d as usize)
    }

    /// `pipeline_parallel_layers_per_stage`; `None` = an even automatic split (-1).
    pub fn layers_per_stage(&self) -> Option<usize> {
        (self.pipeline_parallel_layers_per_stage > 0).then_some(self.pipeline_parallel_layers_per_stage as usize)
    }

    /// Microbatches per pipeline step: `num_pp_microbatches`, or (-1) the pipeline degree.
    pub fn pp_microbatches(&self) -> usize {
        match self.num_pp_microbatches {
            -1 => self.pipeline_parallel_degree,
            n => n.max(0) as usize,
        }
    }
}

impl Model {
    /// `moe_load_balance_coeff`; `None` keeps the flavor's (-1).
    pub fn moe_load_balance_coeff(&self) -> Option<f64> {
        (self.moe_load_balance_coeff >= 0.0).then_some(self.moe_load_balance_coeff)
    }

    /// `moe_aux_loss_alpha`; `None` keeps the flavor's (-1).
    pub fn moe_aux_loss_alpha(&self) -> Option<f64> {
        (self.moe_aux_loss_alpha >= 0.0).then_some(self.moe_aux_loss_alpha)
    }
}

impl LrScheduler {
    /// `decay_ratio`; `None` = every step after warmup decays (-1).
    pub fn decay_ratio(&self) -> Option<f64> {
        (self.decay_ratio >= 0.0).then_some(self.decay_ratio)
    }
}

impl Metrics {
    /// `peak_tflops`; `None` = titan-rs finds the peak itself (<= 0).
    pub fn peak_tflops(&self) -> Option<f64> {
        (self.peak_tflops > 0.0).then_some(self.peak_tflops)
    }
}

impl Checkpoint {
    /// `load_step`; `None` = the latest (-1).
    pub fn load_step(&self) -> Option<u64> {
        unless_negative(self.load_step)
    }
}

impl Validation {
    /// `steps`; `None` = the whole validation set (-1).
    pub fn steps(&self) -> Option<usize> {
        unless_negative(self.steps).map(|s| s as usize)
    }
}

impl Debug {
    /// `inject_nonfinite_at_step`; `None` = never.
    pub fn nonfinite_at(&self) -> Option<u64> {
        unless_negative(self.inject_nonfinite_at_step)
    }

    /// `stop_at_step`; `None` = never.
    pub fn stop_at(&self) -> Option<u64> {
        unless_negative(self.stop_at_step)
    }

    /// `kill_during_save_at_step`; `None` = never.
    pub fn kill_during_save_at(&self) -> Option<u64> {
        unless_negative(self.kill_during_save_at_step)
    }

    /// The world rank that `fail_at_steps` fails: `fail_rank`, or (-1) the last of `world`.
    pub fn fail_rank(&self, world: usize) -> usize {
        unless_negative(self.fail_rank).map_or(world - 1, |r| r as usize)
    }

    /// The step at which this attempt fails (`fail_at_steps[restart_attempt]`), if any.
    pub fn fail_at(&self) -> Option<u64> {
        self.fail_at_steps.get(self.restart_attempt).copied()
    }
}
