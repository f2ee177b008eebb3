//! The model families of titan-rs (one folder each: `llama3/`, `qwen3/`, `deepseek_v3/`, found through
//! [`registry`]) on one decoder-only transformer ([`decoder`]).
//!
//! The model holds no communication code. Every parameter declares its *logical axes*
//! ([`axes::LogicalAxis`]) so that parallelisms can shard it from the outside.

pub mod args;
pub mod axes;
pub mod checkpoint;
pub mod decoder;
pub mod deepseek_v3;
pub mod hf_config;
pub mod hooks;
pub mod init;
pub mod layers;
pub mod llama3;
pub mod loss;
pub mod mla;
pub mod module_path;
pub mod moe;
pub mod positions;
pub mod qwen3;
pub mod registry;
pub mod rope;

pub use args::{MlaArgs, ModelArgs, MoeArgs, ScoreFunc};
pub use axes::{LogicalAxis, ParamSpec};
pub use checkpoint::{Checkpointing, Tape};
pub use decoder::Transformer;
pub use hooks::{ActivationHooks, Hooks};
pub use positions::{DocumentMask, Documents};
pub use registry::{Family, HfTensor};
pub use rope::RopeScaling;

#[cfg(test)]
mod tests;
