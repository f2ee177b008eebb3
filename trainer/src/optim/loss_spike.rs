//! Loss-spike rollback (PaLM's restart-and-skip): a step's loss is a spike when its robust
//! z-score against the recent losses — `(loss − median) / (1.4826 · MAD)`, the MAD floored at 1 %
//! of the median so a flat curve's noise is no spike — exceeds `fault.loss_spike_zscore`.
//! `fault.loss_spike_steps` spikes in a row roll the run back to the last checkpoint before the
//! first of them and skip the data the spiking steps (and the steps since that checkpoint) read:
//! the model, optimizer and step counter come from the checkpoint, the data position stays where
//! it is. The skipped windows are recorded, checkpointed and logged, so a resume knows them.
//!
//! The state (recent losses, the current streak, the skip list) is the same on every rank (the
//! loss is all-reduced), and is checkpointed, so resume stays bit-exact.

use serde::{Deserialize, Serialize};

/// Losses needed before a spike can be judged.
const MIN_HISTORY: usize = 10;

/// One data window a rollback skipped.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SkippedWindow {
    /// The step whose spike caused the rollback.
    pub spike_step: u64,
    /// The checkpoint the run went back to.
    pub resumed_from_step: u64,
    /// The global samples skipped: `[first_sample, end_sample)`.
    pub first_sample: u64,
    pub end_sample: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct LossSpikes {
    /// The latest non-spike losses, oldest first (at most `fault.loss_spike_window`).
    pub recent: Vec<f64>,
    /// The spikes in a row so far (the first at `streak_start`).
    pub streak: u32,
    pub streak_start: u64,
    /// Every window skipped so far.
    pub skipped: Vec<SkippedWindow>,
}

/// What a step's loss means.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SpikeVerdict {
    Normal,
    /// A spike, not yet enough in a row.
    Spike { zscore: f64 },
    /// Enough spikes in a row: roll back to a checkpoint before step `first`.
    RollBack { zscore: f64, first: u64 },
}

/// The settings of `[fault]` the detector uses.
#[derive(Debug, Clone, Copy)]
pub struct SpikeRule {
    pub zscore: f64,
    pub window: usize,
    pub steps: u32,
}

impl LossSpikes {
    /// The robust z-score of `loss` against the recent losses (`None` while too few).
    pub fn zscore(&self, loss: f64) -> Option<f64> {
        if self.recent.len() < MIN_HISTORY {
            return None;
        }
        let median = median(self.recent.clone());
        let mad = median_abs(&self.recent, median);
        let sigma = (1.4826 * mad).max(0.01 * median.abs()).max(f64::MIN_POSITIVE);
        Some((loss - median) / sigma)
    }

    /// Judges step `step`'s `loss` (finite losses only: non-finite ones are the bad-step
    /// policy's) and updates the state.
    pub fn observe(&mut self, step: u64, loss: f64, rule: SpikeRule) -> SpikeVerdict {
        if !loss.is_finite() {
            return SpikeVerdict::Normal;
        }
        match self.zscore(loss) {
            Some(z) if z > rule.zscore => {
                if self.streak == 0 {
                    self.streak_start = step;
                }
                self.streak += 1;
                if self.streak >= rule.steps.max(1) {
                    let first = self.streak_start;
                    self.streak = 0;
                    SpikeVerdict::RollBack { zscore: z, first }
                } else {
                    SpikeVerdict::Spike { zscore: z }
                }
            }
            _ => {
                self.streak = 0;
                self.recent.push(loss);
                let excess = self.recent.len().saturating_sub(rule.window.max(MIN_HISTORY));
                self.recent.drain(..excess);
                SpikeVerdict::Normal
            }
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

fn median_abs(v: &[f64], m: f64) -> f64 {
    median(v.iter().map(|x| (x - m).abs()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spikes_in_a_row_roll_back_to_before_the_first() {
        let rule = SpikeRule { zscore: 6.0, window: 20, steps: 2 };
        let mut s = LossSpikes::default();
        // A slowly falling, slightly noisy curve: never a spike.
        for step in 1..=30u64 {
            let loss = 5.0 - 0.01 * step as f64 + 0.003 * ((step * 7) % 5) as f64;
            assert_eq!(s.observe(step, loss, rule), SpikeVerdict::Normal, "step {step}");
        }
        assert_eq!(s.recent.len(), 20, "the window keeps the latest 20");
        assert!(matches!(s.observe(31, 9.0, rule), SpikeVerdict::Spike { zscore } if zscore > 6.0));
        assert!(matches!(s.observe(32, 9.5, rule), SpikeVerdict::RollBack { first: 31, .. }));
        assert_eq!(s.recent.len(), 20, "spikes do not enter the window");
        // A spike followed by a normal step resets the streak.
        assert!(matches!(s.observe(33, 9.0, rule), SpikeVerdict::Spike { .. }));
        assert_eq!(s.observe(34, 4.7, rule), SpikeVerdict::Normal);
        assert!(matches!(s.observe(35, 9.0, rule), SpikeVerdict::Spike { .. }));
        // Too little history: nothing is judged; non-finite losses are not this detector's.
        let mut fresh = LossSpikes::default();
        assert_eq!(fresh.observe(1, 100.0, rule), SpikeVerdict::Normal);
        assert_eq!(fresh.observe(2, f64::NAN, rule), SpikeVerdict::Normal);
        assert_eq!(fresh.recent, [100.0]);
    }
}
