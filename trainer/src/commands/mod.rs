//! The commands besides `train`: `plan` (the mesh, stages and memory of a config, nothing
//! allocated), `generate` (sampling from a checkpoint), `convert` (Hugging Face folders ↔
//! titan-rs checkpoints) and `bench` (train, kernels, comm, checkpoint).

pub mod bench;
pub mod convert;
pub mod generate;
pub mod plan;
