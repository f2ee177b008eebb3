//! CPU kernels of the fused row ops on row-major `f32` slices: one pass over the data per
//! forward and per backward (the composed Burn ops make one pass, and one allocation, per
//! elementary op). Rows are split across rayon's threads; every row is computed by one thread
//! in a fixed order, so results do not depend on the thread count.

use super::math::{dot, exp_nonpositive, max, sigmoid, simd, sum};
use super::{assume_written, written};
use rayon::prelude::*;

/// Elements per parallel task of the element-wise kernels.
const CHUNK: usize = 16 * 1024;

/// Rows per parallel task for rows of `width` elements (at least one row).
fn rows_per_task(width: usize) -> usize {
    (CHUNK / width.max(1)).max(1)
}

/// `1 / sqrt(mean(x²) + eps)` of a row.
#[inline]
fn inv_rms(x: &[f32], eps: f32) -> f32 {
    1.0 / (dot(x, x) / x.len() as f32 + eps).sqrt()
}

/// RMSNorm of the rows of `x` (`[rows, d]`, `d = w.len()`).
pub fn rms_norm_fwd(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let d = w.len();
    let per = rows_per_task(d);
    let [y] = written(x.len(), |[y]| {
        y.par_chunks_mut(per * d).zip(x.par_chunks(per * d)).for_each(|(y, x)| {
            simd(
                #[inline(always)]
                || {
                    for (y, x) in y.chunks_exact_mut(d).zip(x.chunks_exact(d)) {
                        let r = inv_rms(x, eps);
                        for ((y, &x), &w) in y.iter_mut().zip(x).zip(w) {
                            y.write(x * r * w);
                        }
                    }
                },
            )
        })
    });
    y
}

/// `(dx, dy ∘ x̂)` of RMSNorm (the caller sums the second over rows for `dw`):
/// `dx = r · (g − x̂ · mean(g ∘ x̂))` with `g = dy ∘ w`, `x̂ = x · r`.
pub fn rms_norm_bwd(x: &[f32], w: &[f32], dy: &[f32], eps: f32) -> (Vec<f32>, Vec<f32>) {
    let d = w.len();
    let per = rows_per_task(d) * d;
    let [dx, dw_rows] = written(x.len(), |[dx, dw_rows]| {
        dx.par_chunks_mut(per).zip(dw_rows.par_chunks_mut(per)).zip(x.par_chunks(per).zip(dy.par_chunks(per))).for_each(
            |((dx, dw), (x, dy))| {
                simd(
                    #[inline(always)]
                    || {
                        for ((dx, dw), (x, dy)) in dx
                            .chunks_exact_mut(d)
                            .zip(dw.chunks_exact_mut(d))
                            .zip(x.chunks_exact(d).zip(dy.chunks_exact(d)))
                        {
                            let r = inv_rms(x, eps);
                            for ((dw, &x), &dy) in dw.iter_mut().zip(x).zip(dy) {
                                dw.write(dy * x * r);
                            }
                            // Σ g ∘ x̂ = Σ w ∘ (dy ∘ x̂).
                            // SAFETY: the loop above wrote every element of the row.
                            let mean = dot(unsafe { assume_written(dw) }, w) / d as f32;
                            for (((dx, &x), &dy), &w) in dx.iter_mut().zip(x).zip(dy).zip(w) {
                                dx.write(r * (dy * w - x * r * mean));
                            }
                        }
                    },
                )
            },
        )
    });
    (dx, dw_rows)
}

/// `silu(g) · u` element-wise.
pub fn silu_mul_fwd(g: &[f32], u: &[f32]) -> Vec<f32> {
    let [y] = written(g.len(), |[y]| {
        y.par_chunks_mut(CHUNK).zip(g.par_chunks(CHUNK).zip(u.par_chunks(CHUNK))).for_each(|(y, (g, u))| {
            simd(
                #[inline(always)]
                || {
                    for ((y, &g), &u) in y.iter_mut().zip(g).zip(u) {
                        y.write(g * sigmoid(g) * u);
                    }
                },
            )
        })
    });
    y
}

/// `(dg, du)` of `silu(g) · u`: `du = dy · silu(g)`, `dg = dy · u · σ(g) · (1 + g · (1 − σ(g)))`.
pub fn silu_mul_bwd(g: &[f32], u: &[f32], dy: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let [dg, du] = written(g.len(), |[dg, du]| {
        dg.par_chunks_mut(CHUNK)
            .zip(du.par_chunks_mut(CHUNK))
            .zip(g.par_chunks(CHUNK).zip(u.par_chunks(CHUNK).zip(dy.par_chunks(CHUNK))))
            .for_each(|((dg, du), (g, (u, dy)))| {
                simd(
                    #[inline(always)]
                    || {
                        for ((dg, du), ((&g, &u), &dy)) in dg.iter_mut().zip(du.iter_mut()).zip(g.iter().zip(u).zip(dy))
                        {
                            let s = sigmoid(g);
                            du.write(dy * g * s);
                            dg.write(dy * u * s * (1.0 + g * (1.0 - s)));
                        }
                    },
                )
            })
    });
    (dg, du)
}

/// Rotate-half RoPE of `x` (`[n, t, d]`) with `cos, sin` (`[t, d]`):
/// `y = x ∘ cos + rotate_half(x) ∘ sin`, `rotate_half([x₁, x₂]) = [−x₂, x₁]`.
pub fn rope_fwd(x: &[f32], cos: &[f32], sin: &[f32], d: usize) -> Vec<f32> {
    let (td, half) = (cos.len(), d / 2);
    let [y] = written(x.len(), |[y]| {
        y.par_chunks_mut(td).zip(x.par_chunks(td)).for_each(|(y, x)| {
            simd(
                #[inline(always)]
                || {
                    for (((y, x), c), s) in
                        y.chunks_exact_mut(d).zip(x.chunks_exact(d)).zip(cos.chunks_exact(d)).zip(sin.chunks_exact(d))
                    {
                        let (x1, x2) = x.split_at(half);
                        let (y1, y2) = y.split_at_mut(half);
                        for i in 0..half {
                            y1[i].write(x1[i] * c[i] - x2[i] * s[i]);
                            y2[i].write(x2[i] * c[half + i] + x1[i] * s[half + i]);
                        }
                    }
                },
            )
        })
    });
    y
}

/// Per row of `logits` (`[rows, vocab]`): `(−log softmax[target], log-sum-exp)`.
pub fn cross_entropy_fwd(logits: &[f32], targets: &[i64], vocab: usize) -> (Vec<f32>, Vec<f32>) {
    let rows = targets.len();
    let (mut loss, mut lse) = (vec![0f32; rows], vec![0f32; rows]);
    let per = rows_per_task(vocab);
    loss.par_chunks_mut(per).zip(lse.par_chunks_mut(per)).enumerate().for_each(|(task, (loss, lse))| {
        simd(
            #[inline(always)]
            || {
                let mut e = vec![0f32; vocab];
                for (i, (loss, lse)) in loss.iter_mut().zip(lse.iter_mut()).enumerate() {
                    let row = task * per + i;
                    let x = &logits[row * vocab..(row + 1) * vocab];
                    let m = max(x);
                    for (e, &v) in e.iter_mut().zip(x) {
                        *e = exp_nonpositive(v - m);
                    }
                    *lse = m + sum(&e).ln();
                    *loss = *lse - x[targets[row] as usize];
                }
            },
        )
    });
    (loss, lse)
}

/// `d logits = (softmax − onehot(target)) · dloss` per row, the probabilities recomputed from
/// the saved log-sum-exp (never stored).
pub fn cross_entropy_bwd(logits: &[f32], targets: &[i64], lse: &[f32], dloss: &[f32], vocab: usize) -> Vec<f32> {
    let per = rows_per_task(vocab);
    let [g] = written(logits.len(), |[g]| {
        g.par_chunks_mut(per * vocab).enumerate().for_each(|(task, g)| {
            simd(
                #[inline(always)]
                || {
                    for (i, g) in g.chunks_exact_mut(vocab).enumerate() {
                        let row = task * per + i;
                        let (x, l, dl) = (&logits[row * vocab..(row + 1) * vocab], lse[row], dloss[row]);
                        for (g, &v) in g.iter_mut().zip(x) {
                            g.write(exp_nonpositive(v - l) * dl);
                        }
                        let target = &mut g[targets[row] as usize];
                        // SAFETY: the loop above wrote every element of the row.
                        let p = unsafe { target.assume_init() };
                        target.write(p - dl);
                    }
                },
            )
        })
    });
    g
}
