//! A rank's communication stream: one background thread that runs collectives in the order
//! they were submitted (a CUDA stream for NCCL, here a thread for host collectives), so the
//! rank's thread computes while they run. Jobs use their own duplicated communicators
//! ([`super::Communicator::duplicate`]), so they never interleave with the rank's synchronous
//! collectives; every rank submits the same jobs in the same order, so every group sees the
//! same collective order on every rank.
//!
//! The stream measures itself: the time it spent running jobs (`busy`), the time the rank's
//! thread spent waiting for a result (`exposed`: that much of the communication was not hidden
//! behind compute), and one trace event per job for the step trace's communication lane.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

type Job = Box<dyn FnOnce() + Send>;

/// One job as it ran on the stream, for the step trace.
#[derive(Debug, Clone)]
pub struct StreamEvent {
    pub name: String,
    /// Microseconds since the Unix epoch ([`titan_profiling::now_us`]).
    pub ts_us: f64,
    pub dur_us: f64,
    pub bytes: usize,
}

#[derive(Default)]
struct Log {
    busy: f64,
    events: Vec<StreamEvent>,
    record: bool,
}

/// What the stream did since the last [`CommStream::take_stats`].
#[derive(Debug, Clone, Default)]
pub struct StreamStats {
    /// Seconds the stream spent running collectives.
    pub busy_seconds: f64,
    /// Seconds the rank's thread waited for one of their results.
    pub exposed_seconds: f64,
    pub events: Vec<StreamEvent>,
}

impl StreamStats {
    /// Stream time that overlapped the rank's compute. Whenever the rank's thread waits, the
    /// stream is running the awaited job or one before it, so the waits are part of `busy`.
    pub fn hidden_seconds(&self) -> f64 {
        (self.busy_seconds - self.exposed_seconds).max(0.0)
    }

    /// Adds another stream's.
    pub fn absorb(&mut self, other: StreamStats) {
        self.busy_seconds += other.busy_seconds;
        self.exposed_seconds += other.exposed_seconds;
        self.events.extend(other.events);
    }
}

/// The background thread and its job queue.
pub struct CommStream {
    tx: Option<Sender<Job>>,
    worker: Option<JoinHandle<()>>,
    log: Arc<Mutex<Log>>,
    exposed: Mutex<f64>,
}

/// The result of a submitted job; [`Pending::wait`] blocks until the stream ran it.
pub struct Pending<T> {
    rx: Receiver<T>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl CommStream {
    pub fn new(name: &str) -> Self {
        let (tx, rx) = channel::<Job>();
        let worker = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                for job in rx {
                    job();
                }
            })
            .expect("spawning the communication stream thread");
        Self { tx: Some(tx), worker: Some(worker), log: Arc::default(), exposed: Mutex::new(0.0) }
    }

    /// Records one trace event per job from now on (or stops).
    pub fn record_events(&self, on: bool) {
        lock(&self.log).record = on;
    }

    /// Queues `f` (named `name`, moving `bytes`) behind every job submitted before it.
    pub fn submit<T: Send + 'static>(
        &self,
        name: impl Into<String>,
        bytes: usize,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Pending<T> {
        let (tx, rx) = channel();
        let (log, name) = (self.log.clone(), name.into());
        let job: Job = Box::new(move || {
            let (ts_us, start) = (titan_profiling::now_us(), Instant::now());
            let out = f();
            let secs = start.elapsed().as_secs_f64();
            {
                let mut log = lock(&log);
                log.busy += secs;
                if log.record {
                    log.events.push(StreamEvent { name, ts_us, dur_us: secs * 1e6, bytes });
                }
            }
            // The receiver may be gone (a prefetch nobody used); the collective still ran.
            let _ = tx.send(out);
        });
        self.tx.as_ref().expect("stream is running").send(job).expect("communication stream thread ended");
        Pending { rx }
    }

    /// The job's result; the wait counts as exposed communication time (here and in the
    /// calling thread's [`super::timing`]).
    pub fn wait<T>(&self, p: Pending<T>) -> T {
        let start = Instant::now();
        let out = p.rx.recv().expect("communication stream thread ended (a collective panicked)");
        let waited = start.elapsed().as_secs_f64();
        *lock(&self.exposed) += waited;
        super::timing::add_seconds(waited);
        out
    }

    /// Busy and exposed time and the trace events since the last call.
    pub fn take_stats(&self) -> StreamStats {
        let mut log = lock(&self.log);
        StreamStats {
            busy_seconds: std::mem::take(&mut log.busy),
            exposed_seconds: std::mem::take(&mut *lock(&self.exposed)),
            events: std::mem::take(&mut log.events),
        }
    }
}

impl Drop for CommStream {
    /// Runs what is queued, then ends the thread.
    fn drop(&mut self) {
        self.tx.take();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_run_in_submission_order_and_waits_count_as_exposed() {
        let s = CommStream::new("test stream");
        let order = Arc::new(Mutex::new(Vec::new()));
        let pending: Vec<_> = (0..5)
            .map(|i| {
                let order = order.clone();
                s.submit(format!("job {i}"), 4, move || {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                    order.lock().unwrap().push(i);
                    i * 10
                })
            })
            .collect();
        let got: Vec<i32> = pending.into_iter().map(|p| s.wait(p)).collect();
        assert_eq!(got, vec![0, 10, 20, 30, 40]);
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
        let stats = s.take_stats();
        assert!(stats.busy_seconds >= 0.01, "{stats:?}");
        assert!(stats.exposed_seconds > 0.0 && stats.exposed_seconds <= stats.busy_seconds + 0.01, "{stats:?}");
        assert!(stats.events.is_empty(), "events are recorded only when asked");
        assert_eq!(s.take_stats().busy_seconds, 0.0);
    }

    #[test]
    fn work_done_while_the_stream_runs_is_hidden() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let s = CommStream::new("test stream");
        s.record_events(true);
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        let p = s.submit("slow", 8, move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            flag.store(true, Ordering::SeqCst);
        });
        // "Compute" until the collective has finished: waiting for it then exposes nothing.
        while !done.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        s.wait(p);
        let stats = s.take_stats();
        assert!(stats.busy_seconds >= 0.05, "{stats:?}");
        assert!(stats.exposed_seconds < 0.5 * stats.busy_seconds, "{stats:?}");
        assert_eq!(stats.hidden_seconds(), stats.busy_seconds - stats.exposed_seconds);
        assert_eq!(stats.events.len(), 1);
        assert_eq!((stats.events[0].name.as_str(), stats.events[0].bytes), ("slow", 8));
    }
}
