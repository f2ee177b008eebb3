//! titan-rs: LLM pre-training on Burn. This crate is the trainer; the binary is `titan-rs`.
//!
//! * [`config`]: the TOML schema, loading with overrides, validation.
//! * [`train`] (the loop, top to bottom), [`trainer`] (one rank's state and step),
//!   [`elastic`] (`--max-restarts`: restarting a failed job from its checkpoint),
//!   [`pipeline`] (the schedule runner), [`parallelize`] (applying the parallelisms),
//!   [`rank`] (this rank's mesh place and model stages), [`optim`] (AdamW, LR schedule,
//!   gradients), [`state`] (parameters ↔ host tensors), [`checkpoint`] (sharded save, async
//!   writer, resharding resume), [`plan`] (`titan-rs plan`), [`memory`] (will it fit?).
//! * [`metrics`]: console, `metrics.jsonl`, MFU peak, TensorBoard, plots, step traces.
//! * [`bench`]: `titan-rs bench train | kernels | comm`.
//! * [`hf`]: Hugging Face `LlamaForCausalLM` weights in and out.
//! * [`generate`], [`device`], [`paths`], [`alloc`].

pub mod alloc;
pub mod bench;
pub mod checkpoint;
pub mod config;
pub mod device;
pub mod elastic;
pub mod generate;
pub mod hf;
pub mod memory;
pub mod metrics;
pub mod optim;
pub mod parallelize;
pub mod paths;
pub mod pipeline;
pub mod plan;
pub mod rank;
pub mod state;
pub mod train;
pub mod trainer;
