//! One optimizer step's statistics: what the trainer reports and every sink writes.

use serde::Serialize;

/// What one optimizer step did.
#[derive(Debug, Clone, Serialize)]
pub struct StepStats {
    pub step: u64,
    pub loss: f64,
    pub grad_norm: f64,
    pub lr: f64,
    pub tokens: usize,
    pub seconds: f64,
    /// Of `seconds`, the time spent inside collectives (including waiting for other ranks).
    pub comm_seconds: f64,
    /// Of `seconds`, the time spent computing forward and backward passes (the rest is
    /// communication, pipeline bubbles and the optimizer).
    pub busy_seconds: f64,
    /// Of `seconds`, the wall time of the forward/backward schedule (`busy_seconds` plus the
    /// waits for other pipeline stages): `1 − busy / pipeline` is the measured bubble.
    pub pipeline_seconds: f64,
    /// This rank's parameter and optimizer-state bytes (shards under FSDP).
    pub param_bytes: usize,
    pub optim_bytes: usize,
    /// Dataset mixtures: tokens of the whole job seen so far from each source.
    pub tokens_by_source: Vec<(String, u64)>,
    /// MoE models: each layer's tokens per expert in this step (the whole job's).
    pub expert_load: Vec<crate::optim::expert_bias::ExpertLoad>,
    /// Of `comm_seconds`, the expert-parallel all-to-alls (dispatch, combine, their gradients).
    pub all_to_all_seconds: f64,
    /// The update was skipped (float16 gradients overflowed at the loss scale).
    pub skipped: bool,
    /// float16 with dynamic loss scaling: the scale this step ran with.
    pub loss_scale: Option<f64>,
}
