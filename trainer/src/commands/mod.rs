//! The commands besides `train`: `plan` (the mesh, stages and memory of a config, nothing
//! allocated), `generate` (sampling from a checkpoint), `convert` (Hugging Face folders ↔
//! titan-rs checkpoints), `bench` (train, kernels, comm, checkpoint) and `ptx` (the GPU kernels as
//! PTX, compiled without a GPU).

pub mod bench;
pub mod convert;
pub mod generate;
pub mod plan;
pub mod ptx;
