//! The collective watchdog of one world: how long a wait may take (TorchTitan's
//! `init_timeout_seconds` until the first training step is done, `train_timeout_seconds` after),
//! and the hang report a timed-out wait writes: one readable file (appended, one block per
//! timed-out rank) saying what each rank was waiting for, on which group, who had arrived and
//! who never did.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[derive(Debug)]
pub struct Watchdog {
    timeout_ns: AtomicU64,
    report: Mutex<Option<PathBuf>>,
}

impl Watchdog {
    pub fn new(timeout: Duration) -> Self {
        Self { timeout_ns: AtomicU64::new(nanos(timeout)), report: Mutex::new(None) }
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_nanos(self.timeout_ns.load(Ordering::Relaxed))
    }

    pub fn set_timeout(&self, timeout: Duration) {
        self.timeout_ns.store(nanos(timeout), Ordering::Relaxed);
    }

    /// Whether a wait that began at `start` has run out.
    pub fn expired(&self, start: Instant) -> bool {
        start.elapsed() > self.timeout()
    }

    pub fn set_report(&self, path: PathBuf) {
        *self.report.lock().unwrap_or_else(|p| p.into_inner()) = Some(path);
    }

    pub fn report_path(&self) -> Option<PathBuf> {
        self.report.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Appends `block` to the hang report (one write, so blocks of processes sharing the file do
    /// not interleave); returns the file's path, if a report is set and the write worked.
    pub fn write(&self, block: &str) -> Option<PathBuf> {
        let path = self.report_path()?;
        append(&path, block).ok()?;
        Some(path)
    }
}

fn nanos(d: Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128) as u64
}

fn append(path: &Path, block: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let text = format!("--- unix time {secs}\n{}\n", block.trim_end());
    std::fs::OpenOptions::new().create(true).append(true).open(path)?.write_all(text.as_bytes())
}

/// The first line of a rank's block: `rank R (host H) waited …s in WHAT on group G`. Ranks that
/// time out in the same collective write the same `what`, so the blocks say who arrived.
pub fn waiting_line(rank: usize, host: &str, waited: Duration, what: &str, group: &[usize]) -> String {
    format!("rank {rank} (host {host}) waited {:.1}s in {what} on group {group:?}", waited.as_secs_f64())
}

/// The ranks of `group` with no block waiting in `what` on `group` in the report at `path`.
pub fn absent_from_report(path: &Path, what: &str, group: &[usize]) -> Vec<usize> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let suffix = format!(" in {what} on group {group:?}");
    group
        .iter()
        .copied()
        .filter(|r| {
            let prefix = format!("rank {r} (host ");
            !text.lines().any(|l| l.starts_with(&prefix) && l.ends_with(&suffix))
        })
        .collect()
}

/// This host's name (as the kernel knows it in this process's UTS namespace).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map_or_else(|_| "?".into(), |h| h.trim().to_string())
}
