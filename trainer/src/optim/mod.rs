//! The optimizer step: AdamW with state keyed by parameter path ([`adamw`]), the learning-rate
//! schedule ([`lr_schedule`]), and the gradients it consumes — accumulated over microbatches,
//! their global norm and the clipping coefficient ([`grads`]) — and the MoE balancing bias
//! step that follows it ([`expert_bias`]).

pub mod adamw;
pub mod expert_bias;
pub mod grads;
pub mod lr_schedule;

pub use adamw::{AdamW, AdamWConfig};
pub use lr_schedule::LrSchedule;
