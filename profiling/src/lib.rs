//! Step traces: what each rank did during a profiled step, as spans on one timeline, written in
//! Chrome's trace-event JSON (opens in Perfetto and `chrome://tracing`).
//!
//! A rank is a thread (or a process), so the recorder is thread-local: [`start`] on the rank's
//! thread turns recording on, every [`span`] opened on that thread while it is on becomes one
//! event, and [`finish`] hands the [`Trace`] back. With recording off a span costs one
//! thread-local check and no allocation, so the instrumentation stays in the code.
//!
//! Spans are scoped ([`span`], closed when the guard drops) or opened and closed by key from two
//! different places ([`begin`] / [`end`]): a layer's backward starts when the gradient reaches
//! its output and ends when it reaches its input, two autodiff callbacks apart.
//!
//! Timestamps are microseconds since the Unix epoch (read once per process, then advanced by the
//! monotonic clock), so traces of ranks in different processes line up.

mod chrome;

pub use chrome::{read_span_names, Trace};

use serde_json::Value;
use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// One finished span.
#[derive(Debug, Clone)]
pub struct Event {
    pub name: String,
    /// The category: `step`, `data`, `forward`, `backward`, `comm`, `pipeline`, `optimizer`,
    /// `checkpoint`, `validation`.
    pub cat: &'static str,
    /// Start, microseconds since the Unix epoch.
    pub ts_us: f64,
    pub dur_us: f64,
    pub args: Vec<(&'static str, Value)>,
    /// The lane (trace thread) it is drawn on: 0 for the rank's own thread, [`COMM_LANE`] for
    /// its background communication stream.
    pub lane: u32,
}

/// The lane of collectives run by the rank's communication stream (overlapped with compute).
pub const COMM_LANE: u32 = 1;

struct Recorder {
    rank: usize,
    label: String,
    events: Vec<Event>,
    /// Spans opened by [`begin`], by key: (start, category).
    open: HashMap<String, (f64, &'static str)>,
    /// Keys handed out by [`marker`]: what [`on_marker`] opens or closes.
    markers: Vec<(String, Boundary)>,
}

thread_local! {
    static RECORDER: RefCell<Option<Recorder>> = const { RefCell::new(None) };
}

/// Now, in microseconds since the Unix epoch.
pub fn now_us() -> f64 {
    static BASE: OnceLock<(Instant, f64)> = OnceLock::new();
    let (t0, wall0) = BASE.get_or_init(|| {
        let wall = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64() * 1e6).unwrap_or(0.0);
        (Instant::now(), wall)
    });
    wall0 + t0.elapsed().as_secs_f64() * 1e6
}

/// Starts recording on this thread for `rank` (`label` names its lane, for example
/// `rank 3 (pp 1, tp 1)`); a recording already running is dropped.
pub fn start(rank: usize, label: impl Into<String>) {
    RECORDER.with(|r| {
        *r.borrow_mut() = Some(Recorder {
            rank,
            label: label.into(),
            events: Vec::new(),
            open: HashMap::new(),
            markers: Vec::new(),
        })
    });
}

/// Whether this thread is recording.
pub fn is_active() -> bool {
    RECORDER.with(|r| r.borrow().is_some())
}

/// Stops recording on this thread and returns what was recorded (`None` if nothing was).
/// Spans still open by key are closed now.
pub fn finish() -> Option<Trace> {
    let mut rec = RECORDER.with(|r| r.borrow_mut().take())?;
    let end = now_us();
    let mut open: Vec<_> = rec.open.drain().collect();
    open.sort_by(|a, b| a.1 .0.total_cmp(&b.1 .0));
    for (name, (ts_us, cat)) in open {
        rec.events.push(Event { name, cat, ts_us, dur_us: end - ts_us, args: vec![("unclosed", Value::Bool(true))], lane: 0 });
    }
    rec.events.sort_by(|a, b| a.ts_us.total_cmp(&b.ts_us));
    Some(Trace { rank: rec.rank, label: rec.label, events: rec.events })
}

fn with<R>(f: impl FnOnce(&mut Recorder) -> R) -> Option<R> {
    RECORDER.with(|r| r.borrow_mut().as_mut().map(f))
}

/// A scoped span: recorded when dropped, if this thread was recording when it was opened.
#[must_use = "a span measures until it is dropped"]
pub struct Span {
    inner: Option<(Cow<'static, str>, &'static str, f64, Vec<(&'static str, Value)>)>,
}

/// Opens a span named `name` in category `cat`.
pub fn span(name: impl Into<Cow<'static, str>>, cat: &'static str) -> Span {
    if !is_active() {
        return Span { inner: None };
    }
    Span { inner: Some((name.into(), cat, now_us(), Vec::new())) }
}

/// [`span`] whose name is only built when recording (for names that need formatting).
pub fn span_with(name: impl FnOnce() -> String, cat: &'static str) -> Span {
    if !is_active() {
        return Span { inner: None };
    }
    span(name(), cat)
}

impl Span {
    /// Attaches `key = value` (shown in the viewer's details pane).
    pub fn arg(mut self, key: &'static str, value: impl Into<Value>) -> Self {
        if let Some((.., args)) = &mut self.inner {
            args.push((key, value.into()));
        }
        self
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        if let Some((name, cat, ts_us, args)) = self.inner.take() {
            let dur_us = now_us() - ts_us;
            with(|r| r.events.push(Event { name: name.into_owned(), cat, ts_us, dur_us, args, lane: 0 }));
        }
    }
}

/// Adds `event`, measured elsewhere (on another thread working for this rank), to this thread's
/// recording; nothing when not recording.
pub fn add_event(event: Event) {
    with(|r| r.events.push(event));
}

/// Opens the span `key` (closed by [`end`] with the same key).
pub fn begin(key: &str, cat: &'static str) {
    with(|r| r.open.insert(key.to_string(), (now_us(), cat)));
}

/// Closes the span `key` opened by [`begin`]; nothing if it is not open.
pub fn end(key: &str) {
    let t = now_us();
    with(|r| {
        if let Some((ts_us, cat)) = r.open.remove(key) {
            r.events.push(Event { name: key.to_string(), cat, ts_us, dur_us: t - ts_us, args: Vec::new(), lane: 0 });
        }
    });
}

/// Which end of a keyed span a marker is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Boundary {
    Begin,
    End,
}

/// A number standing for "open (or close) span `name`", for code that can carry a number but
/// not a string (an autodiff op's state); [`on_marker`] acts on it. `None` when not recording.
pub fn marker(name: &str, boundary: Boundary) -> Option<u64> {
    with(|r| {
        r.markers.push((name.to_string(), boundary));
        (r.markers.len() - 1) as u64
    })
}

/// Opens or closes the span that `marker` stands for, in category `cat`.
pub fn on_marker(marker: u64, cat: &'static str) {
    let Some(Some((name, boundary))) = with(|r| r.markers.get(marker as usize).cloned()) else {
        return;
    };
    match boundary {
        Boundary::Begin => begin(&name, cat),
        Boundary::End => end(&name),
    }
}

#[cfg(test)]
mod tests;
