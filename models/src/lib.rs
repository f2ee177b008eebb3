//! Llama-3 style decoder-only transformer for titan-rs.
//!
//! The model holds no communication code. Every parameter declares its *logical axes*
//! ([`axes::LogicalAxis`]) so that parallelisms can shard it from the outside.

pub mod args;
pub mod axes;
pub mod checkpoint;
pub mod hf_config;
pub mod hooks;
pub mod init;
pub mod layers;
pub mod llama;
pub mod loss;
pub mod moe;
pub mod positions;
pub mod rope;

pub use args::{ModelArgs, MoeArgs, ScoreFunc, FLAVORS};
pub use axes::{LogicalAxis, ParamSpec};
pub use checkpoint::{Checkpointing, Tape};
pub use hooks::{ActivationHooks, Hooks};
pub use llama::Transformer;
pub use positions::{DocumentMask, Documents};
pub use rope::RopeScaling;

#[cfg(test)]
mod tests;
