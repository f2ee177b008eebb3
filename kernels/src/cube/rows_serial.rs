//! The row reductions of [`super::rows`] as one thread per row, each thread walking its own row
//! (f32 accumulation). On a GPU a warp's loads are then a row apart and do not coalesce (4 % of
//! the H200's HBM bandwidth for RMSNorm, measured); on adapters that run on CPUs (Mesa's
//! lavapipe), where a cube's barriers are costly and a thread's row stays in cache, they are the
//! faster variant (measured: RMSNorm 2.3 ms against 13.3 ms at 512 × 256). Which one runs is
//! measured per device and shape ([`super::tune`]).

use cubecl::prelude::*;

/// `y = x · rsqrt(mean(x²) + eps) · w`, rows of `x: [rows, dim]`.
#[cube(launch)]
pub fn rms_norm_fwd<F: Float>(
    x: &Tensor<F>,
    w: &Tensor<F>,
    y: &mut Tensor<F>,
    rows: u32,
    dim: u32,
    eps: f32,
    #[define(F)] _dtype: ElemType,
) {
    let row = ABSOLUTE_POS as usize;
    if row >= rows as usize {
        terminate!();
    }
    let d = dim as usize;
    let base = row * d;
    let rstd = inverse_rms::<F>(x, base, d, eps);
    for i in 0..d {
        y[base + i] = F::cast_from(f32::cast_from(x[base + i]) * rstd * f32::cast_from(w[i]));
    }
}

/// `1 / √(mean(x²) + eps)` of row `base..base + d` of `x`.
#[cube]
fn inverse_rms<F: Float>(x: &Tensor<F>, base: usize, d: usize, eps: f32) -> f32 {
    let mut ss = 0.0f32;
    for i in 0..d {
        let v = f32::cast_from(x[base + i]);
        ss += v * v;
    }
    1.0f32 / (ss / f32::cast_from(d) + eps).sqrt()
}

/// `dx` and the per-row contributions to `dw` (`dy · x̂`, summed over rows by
/// [`super::reduce`]'s column sums).
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
    #[define(F)] _dtype: ElemType,
) {
    let row = ABSOLUTE_POS as usize;
    if row >= rows as usize {
        terminate!();
    }
    let d = dim as usize;
    let base = row * d;
    let rstd = inverse_rms::<F>(x, base, d, eps);
    let mut dot = 0.0f32;
    for i in 0..d {
        dot += f32::cast_from(dy[base + i]) * f32::cast_from(w[i]) * f32::cast_from(x[base + i]);
    }
    let mean = dot * rstd / f32::cast_from(d);
    for i in 0..d {
        let xh = f32::cast_from(x[base + i]) * rstd;
        let g = f32::cast_from(dy[base + i]);
        dx[base + i] = F::cast_from(rstd * (g * f32::cast_from(w[i]) - xh * mean));
        dw_rows[base + i] = F::cast_from(g * xh);
    }
}

/// Per-row cross-entropy of `logits: [rows, vocab]` against integer targets, and the row's
/// log-sum-exp: the maximum, then the sum of exponentials, in f32.
#[cube(launch)]
pub fn cross_entropy_fwd<F: Float, I: Numeric>(
    logits: &Tensor<F>,
    targets: &Tensor<I>,
    loss: &mut Tensor<F>,
    lse: &mut Tensor<f32>,
    rows: u32,
    vocab: u32,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    let row = ABSOLUTE_POS as usize;
    if row >= rows as usize {
        terminate!();
    }
    let n = vocab as usize;
    let base = row * n;
    let mut m = f32::cast_from(logits[base]);
    for c in 1..n {
        let x = f32::cast_from(logits[base + c]);
        if x > m {
            m = x;
        }
    }
    let mut sum = 0.0f32;
    for c in 0..n {
        sum += (f32::cast_from(logits[base + c]) - m).exp();
    }
    let row_lse = m + sum.ln();
    let target = u32::cast_from(targets[row]) as usize;
    loss[row] = F::cast_from(row_lse - f32::cast_from(logits[base + target]));
    lse[row] = row_lse;
}
