//! Kernel choice by measurement on GPU devices (`model.attention = "auto"`, the default): the
//! first time an attention shape is seen on a device, titan-rs's fused kernel and Burn's
//! attention (cubek's flash attention on CubeCL backends) each run forward and backward on random
//! inputs of that shape, alternated, and the faster median is used from then on for that device
//! and shape — like Burn's autotune, cached for the process and logged once. On the CPU the fused
//! kernel is always used (measured faster there: no `T × T` scores).

use burn::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

static MEASURE: AtomicBool = AtomicBool::new(false);

/// A measured choice: which kernel, for which shape, on which device.
struct Choice {
    kernel: &'static str,
    shape: Vec<usize>,
    device: Device,
    fused: bool,
}

static CHOICES: Mutex<Vec<Choice>> = Mutex::new(Vec::new());

/// Turns measuring on (`auto`) or off (`fused`: always titan-rs's kernels) for this process.
pub fn set_measure_on_gpu(on: bool) {
    MEASURE.store(on, Ordering::Relaxed);
}

/// Whether measuring is on.
pub fn measuring() -> bool {
    MEASURE.load(Ordering::Relaxed)
}

/// The choices made so far: `(kernel, shape, fused)`, for reports.
pub fn choices() -> Vec<(&'static str, Vec<usize>, bool)> {
    CHOICES.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|c| (c.kernel, c.shape.clone(), c.fused)).collect()
}

/// Whether `kernel` at `shape` on `device` should use the fused path: the cached choice, or
/// measured now by running `run(fused)` (one forward and backward of that path on fresh inputs;
/// it must wait for the device) once each to warm up, then three times each, alternated.
pub fn prefer_fused(kernel: &'static str, shape: Vec<usize>, device: &Device, run: impl Fn(bool)) -> bool {
    // Held while measuring: ranks sharing a device measure one after another, not over each other.
    let mut cache = CHOICES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(c) = cache.iter().find(|c| c.kernel == kernel && c.shape == shape && c.device == *device) {
        return c.fused;
    }
    let (ours, burn) = medians(|fused| {
        let t = Instant::now();
        run(fused);
        t.elapsed().as_secs_f64()
    });
    let fused = ours <= burn;
    tracing::info!(
        "kernel choice: {kernel} {shape:?}: titan-rs fused {:.3} ms, Burn {:.3} ms (median of 3, forward + backward) → {}",
        ours * 1e3,
        burn * 1e3,
        if fused { "fused" } else { "Burn" }
    );
    cache.push(Choice { kernel, shape, device: device.clone(), fused });
    fused
}

/// The medians of `time(true)` and `time(false)` (seconds): each run once to warm up (compile,
/// allocate), then three times each, alternated.
pub fn medians(time: impl Fn(bool) -> f64) -> (f64, f64) {
    time(true);
    time(false);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        a.push(time(true));
        b.push(time(false));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    (median(&mut a), median(&mut b))
}
