//! Time spent inside collectives, per thread (each rank is a thread or a process), so a step can
//! report its communication share. Includes waiting for the other ranks to arrive. While the
//! rank records a step trace, each collective is also a `comm` span with its bytes and peers.

use std::cell::Cell;
use std::time::Instant;

thread_local! {
    static SECONDS: Cell<f64> = const { Cell::new(0.0) };
}

/// Runs collective `kind` of `bytes` (this rank's contribution) over the global ranks `peers`,
/// adding its wall time to this thread's communication time.
pub fn timed<R>(kind: &'static str, bytes: usize, peers: &[usize], f: impl FnOnce() -> R) -> R {
    let _span = titan_profiling::is_active()
        .then(|| titan_profiling::span(kind, "comm").arg("bytes", bytes).arg("peers", peers.to_vec()));
    let start = Instant::now();
    let r = f();
    SECONDS.with(|s| s.set(s.get() + start.elapsed().as_secs_f64()));
    r
}

/// This thread's communication time since the last [`take_seconds`], without resetting it.
pub fn seconds() -> f64 {
    SECONDS.with(|s| s.get())
}

/// This thread's communication time since the last call, in seconds.
pub fn take_seconds() -> f64 {
    SECONDS.with(|s| s.replace(0.0))
}

/// Adds `seconds` spent waiting for a collective run elsewhere (the communication stream's
/// result) to this thread's communication time.
pub fn add_seconds(seconds: f64) {
    SECONDS.with(|s| s.set(s.get() + seconds));
}
