//! A checkpoint being written on a background thread (`checkpoint.async_mode = "async"`).

use std::thread::JoinHandle;
use titan_checkpoints::sharded::commit::WrittenSave;

pub struct PendingSave {
    pub step: u64,
    pub writer: JoinHandle<WrittenSave>,
}
