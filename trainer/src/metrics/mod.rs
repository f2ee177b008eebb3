//! What a run reports and how it can be watched:
//!
//! * [`step`]: what one optimizer step did ([`StepStats`]).
//! * [`logger`]: per-step console lines, `metrics.jsonl`, TensorBoard scalars.
//! * [`peak`]: the peak TFLOP/s MFU is measured against, and how it was obtained.
//! * [`tensorboard`]: TensorBoard event files (writer and a verifying reader).
//! * [`plot`]: the training curves PNG (loss, validation loss, learning rate, grad norm).
//! * [`console`]: colour only on a terminal, `NO_COLOR` honoured.
//! * [`trace`]: step traces (`profiling.*`): when to record, where the files go, and a timeline
//!   picture of them.

pub mod console;
pub mod straggler;
pub mod logger;
pub mod peak;
pub mod plot;
pub mod step;
pub mod tensorboard;
pub mod trace;

pub use logger::{memory_gib, MetricsLogger, Sinks};
pub use step::{StepStats, Suspect};
