//! Checkpoint storage for titan-rs (no model or framework types: named float32 tensors).
//!
//! * [`folder`]: `{dump_folder}/checkpoint/step-N/` written atomically (temporary folder,
//!   manifest of sizes and CRC32s, rename) and verified on load.
//! * [`sharded`]: every rank writes its own pieces; metadata maps each tensor to its chunks;
//!   loading reads only the chunks a rank needs, into any layout.
//! * [`region`]: boxes of tensors and the copies between them (resharding).
//! * [`tensors`]: named host tensors ↔ safetensors bytes (the consolidated format).

pub mod folder;
pub mod region;
pub mod sharded;
pub mod tensors;

pub use folder::{CheckpointFolder, CheckpointReader, PendingCheckpoint};
pub use region::{Elem, Region};
pub use sharded::read::{FileReader, FolderReader, ShardedReader, TensorSource};
pub use sharded::Piece;
pub use tensors::{load_tensors, save_tensors, HostTensor, TensorMap};
