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
    /// Of `seconds`, the time spent inside collectives (including waiting for other ranks) or
    /// waiting for the communication stream's: the exposed communication time.
    pub comm_seconds: f64,
    /// Collective time on the communication stream while this rank computed (FSDP overlap):
    /// hidden, not part of `seconds`' critical path.
    pub comm_hidden_seconds: f64,
    /// Of `seconds`, the time spent computing forward and backward passes (the rest is
    /// communication, pipeline bubbles and the optimizer).
    pub busy_seconds: f64,
    /// Of the forward/backward schedule, the time outside every collective (FSDP/TP/CP/EP
    /// collectives and pipeline transfers excluded): what the straggler detector compares, so a
    /// slow link, which every rank waits on, is not taken for slow compute.
    pub compute_seconds: f64,
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
    /// The silent-data-corruption check ran this step: the ranks it found at fault.
    pub sdc_suspects: Option<Vec<Suspect>>,
    /// Ranks named as stragglers at the end of this logging window.
    pub stragglers: Vec<super::straggler::Straggler>,
}

/// A rank the silent-data-corruption check found at fault.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct Suspect {
    pub rank: usize,
    pub host: String,
    /// "re-execution" (its two runs differ) or "replica" (its replicas computed other bits).
    pub check: String,
}

impl std::fmt::Display for Suspect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.check.as_str() {
            "re-execution" => "gave different gradients when the same step ran twice",
            _ => "computed gradients that differ from its replicas' for the same input",
        };
        write!(f, "rank {} (host {}) {what}", self.rank, self.host)
    }
}
