//! The optimizer step: AdamW with state keyed by parameter path ([`adamw`]), the learning-rate
//! schedule ([`lr_schedule`]), and the MoE balancing bias step that follows it
//! ([`expert_bias`]). The gradients it consumes live with the rank ([`crate::rank::grads`]).

pub mod adamw;
pub mod expert_bias;
pub mod loss_scale;
pub mod loss_spike;
pub mod lr_schedule;

pub use adamw::{AdamW, AdamWConfig};
pub use lr_schedule::LrSchedule;
