//! Row reductions, one cube per row: RMSNorm forward and backward and the cross-entropy's
//! forward. The cube's `units` threads (a power of two) stride over the row's columns — thread
//! `u` reads columns `u, u + units, …`, so neighbouring threads read neighbouring addresses and
//! the loads coalesce — accumulate in `f32` whatever the tensor's float type, and combine their
//! partial results by a tree in shared memory. (The first kernels ran one thread per row: each
//! thread walked its own row, so a warp's loads were a row apart; 4 % of the H200's HBM
//! bandwidth for RMSNorm.) Launched with [`super::launch`]'s `row_grid`: at least `rows` cubes,
//! the extra ones return at once (a whole cube, so every barrier is still reached by all).

use super::reduce::cube_reduce;
use cubecl::prelude::*;

/// `1 / √(mean(x²) + eps)` of row `base..base + d` of `x`, the mean of the squares reduced
/// over the cube.
#[cube]
fn inverse_rms<F: Float>(
    x: &Tensor<F>,
    base: usize,
    d: usize,
    eps: f32,
    shared: &mut Shared<[f32]>,
    #[comptime] units: usize,
) -> f32 {
    let mut ss = 0.0f32;
    let mut i = UNIT_POS as usize;
    while i < d {
        let v = f32::cast_from(x[base + i]);
        ss += v * v;
        i += units;
    }
    let total = cube_reduce(shared, ss, units, false);
    1.0f32 / (total / f32::cast_from(d) + eps).sqrt()
}

/// `y = x · rsqrt(mean(x²) + eps) · w`, rows of `x: [rows, dim]`.
#[cube(launch)]
pub fn rms_norm_fwd<F: Float>(
    x: &Tensor<F>,
    w: &Tensor<F>,
    y: &mut Tensor<F>,
    rows: u32,
    dim: u32,
    eps: f32,
    #[comptime] units: usize,
    #[define(F)] _dtype: ElemType,
) {
    let row = CUBE_POS;
    if row >= rows as usize {
        terminate!();
    }
    let d = dim as usize;
    let base = row * d;
    let mut shared = Shared::<[f32]>::new_slice(units);
    let rstd = inverse_rms::<F>(x, base, d, eps, &mut shared, units);
    let mut i = UNIT_POS as usize;
    while i < d {
        y[base + i] = F::cast_from(f32::cast_from(x[base + i]) * rstd * f32::cast_from(w[i]));
        i += units;
    }
}

/// `dx` and the per-row contributions to `dw` (`dy · x̂`, summed over rows by
/// [`super::reduce`]'s column sums):
/// `dx = rstd · (dy · w − x̂ · mean(dy · w · x̂))`.
#[cube(launch)]
pub fn rms_norm_bwd<F: Float>(
    x: &Tensor<F>,
    w: &Tensor<F>,
    dy: &Tensor<F>,
    dx: &mut Tensor<F>,
    dw_rows: &mut Tensor<F>,
    rows: u32,
    dim: u32,
    eps: f32,
    #[comptime] units: usize,
    #[define(F)] _dtype: ElemType,
) {
    let row = CUBE_POS;
    if row >= rows as usize {
        terminate!();
    }
    let d = dim as usize;
    let base = row * d;
    let mut shared = Shared::<[f32]>::new_slice(units);
    let rstd = inverse_rms::<F>(x, base, d, eps, &mut shared, units);
    let mut part = 0.0f32;
    let mut i = UNIT_POS as usize;
    while i < d {
        part += f32::cast_from(dy[base + i]) * f32::cast_from(w[i]) * f32::cast_from(x[base + i]);
        i += units;
    }
    let mean = cube_reduce(&mut shared, part, units, false) * rstd / f32::cast_from(d);
    let mut i = UNIT_POS as usize;
    while i < d {
        let xh = f32::cast_from(x[base + i]) * rstd;
        let g = f32::cast_from(dy[base + i]);
        dx[base + i] = F::cast_from(rstd * (g * f32::cast_from(w[i]) - xh * mean));
        dw_rows[base + i] = F::cast_from(g * xh);
        i += units;
    }
}

/// Per-row cross-entropy of `logits: [rows, vocab]` against integer targets, and the row's
/// log-sum-exp in float32 (all the backward needs besides the logits). Each thread keeps an online
/// (maximum, sum of exponentials) over its columns — one read of the logits — and the cube
/// combines them: the row maximum first, then the sums rescaled to it.
#[cube(launch)]
pub fn cross_entropy_fwd<F: Float, I: Numeric>(
    logits: &Tensor<F>,
    targets: &Tensor<I>,
    loss: &mut Tensor<F>,
    lse: &mut Tensor<f32>,
    rows: u32,
    vocab: u32,
    #[comptime] units: usize,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    let row = CUBE_POS;
    if row >= rows as usize {
        terminate!();
    }
    let n = vocab as usize;
    let base = row * n;
    // Below any finite logit, yet its exponential differences stay finite (no `inf − inf`).
    let mut m = comptime!(-3.0e38f32).runtime();
    let mut s = 0.0f32;
    let mut c = UNIT_POS as usize;
    while c < n {
        let x = f32::cast_from(logits[base + c]);
        if x > m {
            s = s * (m - x).exp() + 1.0f32;
            m = x;
        } else {
            s += (x - m).exp();
        }
        c += units;
    }
    let mut shared = Shared::<[f32]>::new_slice(units);
    let row_max = cube_reduce(&mut shared, m, units, true);
    let total = cube_reduce(&mut shared, s * (m - row_max).exp(), units, false);
    if UNIT_POS == 0 {
        let row_lse = row_max + total.ln();
        let target = u32::cast_from(targets[row]) as usize;
        loss[row] = F::cast_from(row_lse - f32::cast_from(logits[base + target]));
        lse[row] = row_lse;
    }
}
