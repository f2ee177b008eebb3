//! Straggler detection (Megatron's straggler detector, in spirit): each logging window every rank
//! shares its compute time and its time inside collectives; a rank whose compute is slower than
//! the median of its pipeline stage by `fault.straggler_threshold`× for
//! `fault.straggler_windows` windows in a row is named — rank, host and its numbers — in the log,
//! in `metrics.jsonl` and in the step trace. Every rank computes the same verdict from the same
//! gathered numbers.

use anyhow::{anyhow, Result};
use serde::{Deserialize, Serialize};
use titan_parallel::{CommExt, Communicator};

/// Below this many seconds per step, a difference from the median is timing noise.
const MIN_EXCESS_SECONDS: f64 = 0.01;

/// One rank's numbers over a logging window (seconds per step).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RankWindow {
    pub rank: usize,
    pub host: String,
    pub stage: usize,
    pub compute_s: f64,
    pub comm_s: f64,
}

/// A rank named as a straggler, with the median compute of its stage and the windows in a row.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Straggler {
    pub rank: usize,
    pub host: String,
    pub compute_s: f64,
    pub median_compute_s: f64,
    pub comm_s: f64,
    pub windows: u32,
}

impl std::fmt::Display for Straggler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "rank {} (host {}) computed {:.3} s per step against its stage's median {:.3} s ({:.1}×) and waited {:.3} s in collectives, {} logging windows in a row",
            self.rank,
            self.host,
            self.compute_s,
            self.median_compute_s,
            self.compute_s / self.median_compute_s.max(1e-12),
            self.comm_s,
            self.windows
        )
    }
}

pub struct StragglerMonitor {
    threshold: f64,
    windows: u32,
    host: String,
    stage: usize,
    /// Sums over the current window.
    compute: f64,
    comm: f64,
    steps: u32,
    /// Consecutive slow windows, by world rank.
    slow: Vec<u32>,
}

impl StragglerMonitor {
    /// `None` when off (`threshold` ≤ 0).
    pub fn new(threshold: f64, windows: u32, stage: usize) -> Option<Self> {
        (threshold > 0.0).then(|| Self {
            threshold,
            windows: windows.max(1),
            host: titan_parallel::comm::watchdog::hostname(),
            stage,
            compute: 0.0,
            comm: 0.0,
            steps: 0,
            slow: Vec::new(),
        })
    }

    /// Adds one step's compute and collective seconds to the window.
    pub fn record(&mut self, compute_s: f64, comm_s: f64) {
        self.compute += compute_s;
        self.comm += comm_s;
        self.steps += 1;
    }

    /// Ends the window (a collective over `world`: every rank calls it at the same step); the
    /// ranks named this window.
    pub fn end_window(&mut self, world: &dyn Communicator, me: usize) -> Result<Vec<Straggler>> {
        let n = self.steps.max(1) as f64;
        let mine = RankWindow {
            rank: me,
            host: self.host.clone(),
            stage: self.stage,
            compute_s: self.compute / n,
            comm_s: self.comm / n,
        };
        (self.compute, self.comm, self.steps) = (0.0, 0.0, 0);
        let parts = world.all_gather_varlen(&serde_json::to_vec(&mine)?)?;
        let all: Vec<RankWindow> = parts
            .iter()
            .map(|p| serde_json::from_slice(p).map_err(|e| anyhow!("straggler window exchange: {e}")))
            .collect::<Result<_>>()?;
        Ok(self.judge(&all))
    }

    /// The verdict on one window's numbers (pure; every rank reaches the same one).
    pub fn judge(&mut self, all: &[RankWindow]) -> Vec<Straggler> {
        self.slow.resize(all.len(), 0);
        let mut named = Vec::new();
        for w in all {
            let stage: Vec<f64> = all.iter().filter(|o| o.stage == w.stage).map(|o| o.compute_s).collect();
            let median = median(stage);
            let slow = w.compute_s > self.threshold * median && w.compute_s - median > MIN_EXCESS_SECONDS;
            let count = &mut self.slow[w.rank];
            *count = if slow { *count + 1 } else { 0 };
            if *count >= self.windows {
                named.push(Straggler {
                    rank: w.rank,
                    host: w.host.clone(),
                    compute_s: w.compute_s,
                    median_compute_s: median,
                    comm_s: w.comm_s,
                    windows: *count,
                });
            }
        }
        named
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => v[n / 2],
        _ => 0.5 * (v[n / 2 - 1] + v[n / 2]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(rank: usize, stage: usize, compute_s: f64) -> RankWindow {
        RankWindow { rank, host: format!("h{rank}"), stage, compute_s, comm_s: 0.1 }
    }

    #[test]
    fn a_rank_slow_for_enough_windows_is_named_against_its_own_stage() {
        let mut m = StragglerMonitor::new(1.5, 2, 0).unwrap();
        // Stage 1 is legitimately slower than stage 0 (the head): nobody is named for it.
        let w = |slow: f64| vec![window(0, 0, 0.2), window(1, 0, slow), window(2, 1, 0.5), window(3, 1, 0.5)];
        // With 2 ranks in a stage the median is their mean: 0.9 → median 0.55, 0.9 > 1.5 × 0.55.
        assert!(m.judge(&w(0.9)).is_empty(), "one window is not enough");
        let named = m.judge(&w(0.9));
        assert_eq!(named.len(), 1);
        assert_eq!((named[0].rank, named[0].host.as_str(), named[0].windows), (1, "h1", 2));
        assert!(named[0].to_string().contains("rank 1 (host h1) computed 0.900 s"), "{}", named[0]);
        // A fast window resets the count.
        assert!(m.judge(&w(0.2)).is_empty());
        assert!(m.judge(&w(0.9)).is_empty());
        // Differences below the noise floor are not stragglers.
        let mut m = StragglerMonitor::new(1.5, 1, 0).unwrap();
        assert!(m.judge(&[window(0, 0, 0.001), window(1, 0, 0.009)]).is_empty());
        assert!(StragglerMonitor::new(0.0, 3, 0).is_none(), "threshold 0 turns it off");
    }
}
