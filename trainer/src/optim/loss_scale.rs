//! Dynamic loss scaling for float16 compute (`training.mixed_precision_param = "float16"`),
//! the rule of PyTorch's `torch.amp.GradScaler`: the loss is multiplied by the scale S before
//! backward, so gradients too small for float16 survive; the gradients are divided by S again
//! before the norm, clipping and the update (folded into the update's gradient factor, no extra
//! pass). A step whose gradients overflowed (a non-finite norm) is skipped — parameters and
//! optimizer state untouched, its batch dropped, the step and learning-rate schedule advance —
//! and S is halved; after `loss_scale_growth_interval` clean steps in a row S doubles. bfloat16
//! and float32 have float32's range and need none (S = 1, and nothing changes bit for bit).

use serde::{Deserialize, Serialize};

/// Too many overflowing steps in a row: the loss itself is not finite, not the scale's fault.
pub const MAX_CONSECUTIVE_SKIPS: u32 = 24;

/// The scaler's state (checkpointed with the training state).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LossScaleState {
    pub scale: f64,
    /// Clean steps since the last change of the scale.
    pub clean_steps: u64,
}

#[derive(Debug, Clone)]
pub struct LossScaler {
    /// `None`: no scaling (S = 1).
    state: Option<LossScaleState>,
    growth_interval: u64,
}

/// What the scaler decided about a step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    /// Apply the update.
    Apply,
    /// Skip it: the gradients overflowed at this scale.
    Skip,
}

impl LossScaler {
    /// Scaling from `init` when `enabled`, else none.
    pub fn new(enabled: bool, init: f64, growth_interval: u64) -> Self {
        let state = enabled.then_some(LossScaleState { scale: init, clean_steps: 0 });
        Self { state, growth_interval: growth_interval.max(1) }
    }

    /// The factor the loss is multiplied by (1 without scaling).
    pub fn scale(&self) -> f64 {
        self.state.map_or(1.0, |s| s.scale)
    }

    pub fn enabled(&self) -> bool {
        self.state.is_some()
    }

    /// Decides a step from its (scaled) loss and gradient norm and moves the scale. Without
    /// scaling every step is applied (a non-finite step is the trainer's to refuse).
    pub fn update(&mut self, finite: bool) -> Verdict {
        let Some(s) = self.state.as_mut() else { return Verdict::Apply };
        if finite {
            s.clean_steps += 1;
            if s.clean_steps >= self.growth_interval {
                s.scale *= 2.0;
                s.clean_steps = 0;
            }
            Verdict::Apply
        } else {
            s.scale *= 0.5;
            s.clean_steps = 0;
            Verdict::Skip
        }
    }

    pub fn state(&self) -> Option<LossScaleState> {
        self.state
    }

    /// Restores a checkpointed state (ignored when this run does not scale).
    pub fn load(&mut self, saved: Option<LossScaleState>) {
        if let (Some(s), Some(saved)) = (self.state.as_mut(), saved) {
            *s = saved;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflow_halves_clean_steps_double_and_no_scaling_is_one() {
        let mut s = LossScaler::new(true, 65536.0, 3);
        assert_eq!(s.update(false), Verdict::Skip);
        assert_eq!(s.scale(), 32768.0);
        for _ in 0..2 {
            assert_eq!(s.update(true), Verdict::Apply);
        }
        assert_eq!(s.scale(), 32768.0);
        s.update(true);
        assert_eq!(s.scale(), 65536.0);
        let mut off = LossScaler::new(false, 65536.0, 3);
        assert_eq!((off.update(false), off.scale()), (Verdict::Apply, 1.0));
        let mut resumed = LossScaler::new(true, 65536.0, 3);
        resumed.load(s.state());
        assert_eq!(resumed.state(), s.state());
    }
}
