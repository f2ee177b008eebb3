//! Pipeline parallelism: how the layers split into stages ([`split`]) and in which order each
//! rank runs the forward and backward of each microbatch on each of its stages ([`schedule`]:
//! GPipe, 1F1B, Interleaved 1F1B). The trainer executes the schedule, moving activations
//! forward and gradients backward with point-to-point send/recv.

pub mod schedule;
pub mod split;

pub use schedule::{Action, Schedule, Timeline};
pub use split::StageSplit;
