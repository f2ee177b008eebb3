//! Checkpoint storage for titan-rs.
//!
//! * [`tensors`]: named host tensors ↔ safetensors files, with errors that name the file.
//! * [`folder`]: `{dump_folder}/checkpoint/step-N/` written atomically (temporary folder,
//!   manifest of sizes and CRC32s, rename) and verified on load.

pub mod folder;
pub mod tensors;

pub use folder::{CheckpointFolder, CheckpointReader, PendingCheckpoint};
pub use tensors::{load_tensors, save_tensors, HostTensor, TensorMap};
