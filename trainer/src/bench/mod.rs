//! `titan-rs bench …`: measurements of the real code paths, each checked as it is timed.
//!
//! * [`train`]: tokens/s, MFU, communication share and pipeline bubble of training steps on the
//!   configured mesh, optionally beside a baseline measured in the same run.
//! * [`kernels`]: every fused kernel against its reference, timed on the device.
//! * [`comm`]: every collective of the communicator, 1 KiB to 64 MiB.
//! * [`checkpoint`]: save time, blocked time and per-rank memory: gathered vs sharded vs async.

pub mod checkpoint;
pub mod comm;
pub mod kernels;
pub mod train;
