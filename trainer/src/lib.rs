//! titan-rs: LLM pre-training on Burn. This crate is the trainer: config, train loop, metrics,
//! checkpoint glue, text generation and benchmarks. The binary is `titan-rs`.

pub mod alloc;
pub mod bench;
pub mod config;
pub mod device;
pub mod generate;
pub mod grads;
pub mod lr_schedule;
pub mod metrics;
pub mod optim;
pub mod parallelize;
pub mod paths;
pub mod pipeline;
pub mod plan;
pub mod state;
pub mod train;
pub mod trainer;
