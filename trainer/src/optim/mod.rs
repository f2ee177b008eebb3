//! The optimizer step: AdamW and Muon over parameter groups ([`container`]: which parameter
//! takes which optimizer, learning rate and weight decay; [`groups`]), AdamW with state keyed by
//! parameter path ([`adamw`]), Muon with its distributed orthogonalisation ([`muon`]), the
//! learning-rate schedule ([`lr_schedule`]), and the MoE balancing bias step that follows it
//! ([`expert_bias`]). The gradients it consumes live with the rank ([`crate::rank::grads`]).

pub mod adamw;
pub mod container;
pub mod expert_bias;
pub mod groups;
pub mod loss_scale;
pub mod loss_spike;
pub mod lr_schedule;
pub mod muon;

pub use adamw::{AdamW, AdamWConfig};
pub use container::Optimizers;
pub use lr_schedule::LrSchedule;

/// The prefixes of optimizer-state keys (`<prefix>.<parameter path>`): AdamW's two moments
/// (PyTorch's names) and Muon's momentum buffer. Each has its parameter's shape, so checkpoints
/// split and join it along the parameter's shard dimension.
pub const STATE_PREFIXES: [&str; 3] = ["exp_avg", "exp_avg_sq", "momentum_buffer"];

/// `(prefix, parameter path)` of a key: `("exp_avg.", "norm.weight")` for optimizer state,
/// `("", key)` for a parameter.
pub fn split_state_key(key: &str) -> (&str, &str) {
    for p in STATE_PREFIXES {
        if let Some(rest) = key.strip_prefix(p).and_then(|r| r.strip_prefix('.')) {
            return (&key[..p.len() + 1], rest);
        }
    }
    ("", key)
}

/// Whether a checkpoint key is optimizer state rather than a parameter.
pub fn is_state_key(key: &str) -> bool {
    !split_state_key(key).0.is_empty()
}
