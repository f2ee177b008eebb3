//! titan-rs: LLM pre-training on Burn. This crate is the trainer; the binary is `titan-rs`.
//!
//! From the bottom floor up:
//! * [`config`]: the TOML schema (typed: enumerated keys are enums, sentinels resolved in one
//!   view), loading with overrides, value checks. [`device`], [`paths`], [`alloc`]: utilities.
//! * [`rank`]: this rank's mesh place and model stages, the parallelisms applied to them, the
//!   pipeline runner, parameters ↔ host tensors, gradients.
//! * [`optim`] (AdamW, LR schedule, MoE bias step), [`memory`] (the plan, the fit check and the
//!   model × mesh checks), [`hf`] (Hugging Face weights of every family in and out),
//!   [`metrics`] (step statistics, console, `metrics.jsonl`, MFU peak, TensorBoard, plots, traces),
//!   [`checkpoint`] (the `Checkpointer`: sharded save, async writer, resharding resume).
//! * [`train`]: the loop, top to bottom, one rank's `Trainer`, and `--max-restarts`.
//! * [`commands`]: `plan`, `generate`, `convert`, `bench`.

pub mod alloc;
pub mod checkpoint;
pub mod commands;
pub mod config;
pub mod device;
pub mod hf;
pub mod memory;
pub mod metrics;
pub mod optim;
pub mod paths;
pub mod rank;
pub mod train;

#[cfg(test)]
mod test_list;
