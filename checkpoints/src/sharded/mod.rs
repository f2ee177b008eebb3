//! Sharded checkpoints (the layout of PyTorch DCP, Megatron's `dist_checkpointing` and
//! nanotron): every rank writes the pieces of tensors it owns into its own safetensors file;
//! `metadata.json` lists, for every tensor, its global shape and the chunks (file, byte range,
//! region of the global tensor, CRC32) that make it up. Loading reads, memory-mapped, only the
//! chunks that overlap the region a rank needs, so any layout loads into any other.
//!
//! * [`write`]: which rank writes which piece (replicas once, spread over their holders) and
//!   the rank files.
//! * [`commit`]: the protocol across ranks: agree on a folder, write, agree that every write
//!   succeeded, then one rank writes the metadata and renames the folder into place.
//! * [`read`]: [`TensorSource`]s over a sharded checkpoint or one full-tensor safetensors file.
//! * [`tools`]: `inspect` and streaming `consolidate`.

pub mod commit;
pub mod read;
pub mod tools;
pub mod write;

use crate::region::Region;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const FORMAT: &str = "titan-rs-sharded/1";
pub const METADATA: &str = "metadata.json";

/// `metadata.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Metadata {
    pub format: String,
    pub step: u64,
    /// The mesh the checkpoint was saved under (for `inspect`; loading does not need it).
    pub saved_under: String,
    pub world_size: usize,
    /// Only the model's tensors (no optimizer state): `checkpoint.last_save_model_only`.
    pub model_only: bool,
    pub tensors: BTreeMap<String, TensorMeta>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TensorMeta {
    pub shape: Vec<usize>,
    pub dtype: String,
    pub chunks: Vec<Chunk>,
}

/// One stored piece of a tensor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Chunk {
    pub file: String,
    /// Where its float32 little-endian values lie in `file`.
    pub byte_offset: u64,
    pub byte_len: u64,
    /// Which part of the global tensor it is.
    pub region: Region,
    pub crc32: u32,
}

/// A piece of a tensor that a rank holds, to be saved.
#[derive(Debug, Clone)]
pub struct Piece {
    pub key: String,
    /// The global tensor's shape.
    pub shape: Vec<usize>,
    pub region: Region,
    pub data: Vec<f32>,
}
