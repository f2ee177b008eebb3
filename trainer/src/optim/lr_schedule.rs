//! Warmup → stable → decay learning-rate schedule (TorchTitan's `linear_warmup_stable_decay`).
//!
//! Steps are 1-based as logged. Warmup rises linearly to the peak; after `warmup + stable` the LR
//! decays (linear, sqrt or cosine) towards `min_lr_factor · lr` and stays there after the end:
//! it never rises again.

use crate::config::{DecayType, LrScheduler};

#[derive(Debug, Clone, PartialEq)]
pub struct LrSchedule {
    pub lr: f64,
    pub warmup_steps: u64,
    pub stable_steps: u64,
    pub decay_steps: u64,
    pub decay: DecayType,
    pub min_lr_factor: f64,
}

impl LrSchedule {
    /// The schedule of `[lr_scheduler]` for a peak `lr` over `steps` steps.
    pub fn new(c: &LrScheduler, lr: f64, steps: u64) -> Self {
        let warmup = c.warmup_steps.min(steps);
        let decay_steps = match c.decay_ratio() {
            None => steps - warmup,
            Some(r) => ((steps as f64 * r).round() as u64).min(steps - warmup),
        };
        let decay = c.decay_type;
        Self {
            lr,
            warmup_steps: warmup,
            stable_steps: steps - warmup - decay_steps,
            decay_steps,
            decay,
            min_lr_factor: c.min_lr_factor,
        }
    }

    /// The multiplier of the peak LR at 1-based `step`.
    pub fn factor(&self, step: u64) -> f64 {
        let s = step.saturating_sub(1); // TorchTitan's 0-based current_step
        if s < self.warmup_steps {
            return (s + 1) as f64 / (self.warmup_steps + 1) as f64;
        }
        if s < self.warmup_steps + self.stable_steps {
            return 1.0;
        }
        let progress =
            ((s + 1 - self.warmup_steps - self.stable_steps) as f64 / (self.decay_steps + 1) as f64).min(1.0);
        let f = match self.decay {
            DecayType::Linear => 1.0 - progress,
            DecayType::Sqrt => 1.0 - progress.sqrt(),
            DecayType::Cosine => 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()),
        };
        self.min_lr_factor + (1.0 - self.min_lr_factor) * f
    }

    pub fn lr(&self, step: u64) -> f64 {
        self.lr * self.factor(step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched(steps: u64, warmup: u64, ratio: f64, kind: DecayType, min: f64) -> LrSchedule {
        let c = LrScheduler { warmup_steps: warmup, decay_ratio: ratio, decay_type: kind, min_lr_factor: min };
        LrSchedule::new(&c, 1.0, steps)
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn linear_warmup_then_linear_decay_values() {
        let s = sched(10, 2, -1.0, DecayType::Linear, 0.0);
        let got: Vec<f64> = (1..=10).map(|t| s.lr(t)).collect();
        // warmup: 1/3, 2/3; decay over 8 steps: 1 - k/9
        let want = [
            1.0 / 3.0,
            2.0 / 3.0,
            8.0 / 9.0,
            7.0 / 9.0,
            6.0 / 9.0,
            5.0 / 9.0,
            4.0 / 9.0,
            3.0 / 9.0,
            2.0 / 9.0,
            1.0 / 9.0,
        ];
        for (g, w) in got.iter().zip(want) {
            assert!(close(*g, w), "{got:?}");
        }
    }

    #[test]
    fn stable_phase_and_decay_ratio() {
        let s = sched(10, 2, 0.4, DecayType::Linear, 0.0);
        assert_eq!((s.warmup_steps, s.stable_steps, s.decay_steps), (2, 4, 4));
        assert!((3..=6).all(|t| close(s.lr(t), 1.0)));
        assert!(close(s.lr(7), 0.8) && close(s.lr(10), 0.2));
    }

    #[test]
    fn cosine_sqrt_and_min_factor() {
        let c = sched(5, 0, -1.0, DecayType::Cosine, 0.1);
        // progress k/6: 0.1 + 0.9 * 0.5 (1 + cos(pi k/6))
        for k in 1..=5u64 {
            let want = 0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * k as f64 / 6.0).cos());
            assert!(close(c.lr(k), want));
        }
        let q = sched(3, 0, -1.0, DecayType::Sqrt, 0.0);
        assert!(close(q.lr(1), 1.0 - 0.25f64.sqrt()));
    }

    #[test]
    fn never_rises_after_the_end() {
        for &kind in DecayType::ALL {
            let s = sched(20, 3, -1.0, kind, 0.05);
            let lrs: Vec<f64> = (4..=60).map(|t| s.lr(t)).collect();
            assert!(lrs.windows(2).all(|w| w[1] <= w[0] + 1e-15), "{kind}: {lrs:?}");
            assert!(lrs.iter().all(|&x| x >= 0.05 - 1e-15));
        }
    }
}
