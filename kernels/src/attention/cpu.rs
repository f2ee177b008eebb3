//! Host kernels of the fused causal attention, on row-major `[B, heads, T, D]` slices.
//!
//! Query row `i` of batch row `b` sees the keys `starts[b, i] ..= i`: `starts` all zero is
//! plain causal attention; the first position of each token's document is block-causal
//! (document-masked) attention over packed sequences.
//!
//! Flash-attention style: queries and keys are cut into tiles of [`TILE_Q`] and [`TILE_K`]
//! rows; for each query tile the key tiles from the tile's earliest visible key up to the
//! diagonal are visited with an online
//! softmax (running maximum and sum per row), so no more than one `TILE_Q × TILE_K` block of
//! scores exists at a time — the
//! `[T, T]` matrix is never formed, forward or backward. The tile products are GEMMs (`gemm`
//! crate, see [`crate::host::gemm`]). Work is split by (batch, kv head): each task owns its slices of
//! every output and runs serially, so results do not depend on the number of threads (bitwise
//! deterministic).

use crate::host::gemm::{matmul, View};
use crate::host::math::{self, dot, exp_nonpositive, simd, sum};
use rayon::prelude::*;

/// Rows of a query tile.
pub const TILE_Q: usize = 64;
/// Rows of a key tile: the scores of a query tile against one key tile (`TILE_Q × TILE_K`)
/// are all that exists at a time. Wider key tiles mean fewer, larger GEMM calls (each call has
/// a fixed cost that dominated at 64 × 64 with head dim 16).
pub const TILE_K: usize = 256;
/// Shapes: queries `[b, h, t, d]`, keys/values `[b, kv, t, d]`, `h` a multiple of `kv`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    pub b: usize,
    pub h: usize,
    pub kv: usize,
    pub t: usize,
    pub d: usize,
}

impl Dims {
    fn rep(&self) -> usize {
        self.h / self.kv
    }
    fn head(&self) -> usize {
        self.t * self.d
    }
}

/// The keys (relative to the tile) that query row `i` (absolute), whose first visible key is
/// `start`, may see inside the key tile starting at `j0` of length `bk`; empty when none.
#[inline]
fn visible(i: usize, start: usize, j0: usize, bk: usize) -> std::ops::Range<usize> {
    let end = (i + 1).saturating_sub(j0).min(bk);
    start.saturating_sub(j0).min(end)..end
}

/// `s[j] = exp(s[j] · scale − shift)` for the visible keys, `0` for the masked rest.
#[inline]
fn probabilities(s: &mut [f32], visible: std::ops::Range<usize>, scale: f32, shift: f32) {
    let (before, rest) = s.split_at_mut(visible.start);
    let (seen, after) = rest.split_at_mut(visible.len());
    for x in seen.iter_mut() {
        *x = exp_nonpositive(*x * scale - shift);
    }
    before.iter_mut().chain(after).for_each(|x| *x = 0.0);
}

/// The first visible key of each query row of one batch row (`starts[b]`), checked.
fn row_starts(starts: &[i64], n: Dims, b: usize) -> &[i64] {
    let s = &starts[b * n.t..(b + 1) * n.t];
    debug_assert!(s.iter().enumerate().all(|(i, &x)| (0..=i as i64).contains(&x)), "document starts out of range");
    s
}

/// The first key tile position for the query tile `i0 .. i0 + bq`: its earliest visible key.
fn first_key(starts: &[i64], i0: usize, bq: usize) -> usize {
    starts[i0..i0 + bq].iter().copied().min().unwrap_or(0).max(0) as usize
}

/// Output `[b, h, t, d]` and per-row log-sum-exp `[b, h, t]` of `softmax(q kᵀ · scale, mask) v`,
/// the mask letting row `i` see keys `starts[b, i] ..= i` (`starts: [b, t]`).
pub fn forward(q: &[f32], k: &[f32], v: &[f32], starts: &[i64], n: Dims, scale: f32) -> (Vec<f32>, Vec<f32>) {
    let (hs, d, t, rep) = (n.head(), n.d, n.t, n.rep());
    let mut o = vec![0f32; n.b * n.h * hs];
    let mut lse = vec![0f32; n.b * n.h * t];
    o.par_chunks_mut(rep * hs).zip(lse.par_chunks_mut(rep * t)).enumerate().for_each(|(bg, (o, lse))| {
        simd(
            #[inline(always)]
            || {
                let kv_off = bg * hs;
                let (kh, vh) = (&k[kv_off..kv_off + hs], &v[kv_off..kv_off + hs]);
                let starts = row_starts(starts, n, bg / n.kv);
                let mut s = vec![0f32; TILE_Q * TILE_K];
                let (mut max, mut total) = ([0f32; TILE_Q], [0f32; TILE_Q]);
                for r in 0..rep {
                    let q_off = (bg * rep + r) * hs;
                    for i0 in (0..t).step_by(TILE_Q) {
                        let bq = TILE_Q.min(t - i0);
                        let qi = View::rows(&q[q_off + i0 * d..q_off + (i0 + bq) * d], bq, d);
                        let oi = &mut o[r * hs + i0 * d..r * hs + (i0 + bq) * d];
                        max[..bq].fill(f32::NEG_INFINITY);
                        total[..bq].fill(0.0);
                        for j0 in (first_key(starts, i0, bq)..i0 + bq).step_by(TILE_K) {
                            let bk = TILE_K.min(i0 + bq - j0);
                            let s = &mut s[..bq * bk];
                            matmul(s, bk, false, qi, View::rows(&kh[j0 * d..(j0 + bk) * d], bk, d).t());
                            for a in 0..bq {
                                let row = &mut s[a * bk..(a + 1) * bk];
                                let seen = visible(i0 + a, starts[i0 + a] as usize, j0, bk);
                                if seen.is_empty() {
                                    // Another document's keys: nothing to add, statistics unchanged.
                                    row.fill(0.0);
                                    continue;
                                }
                                // scale > 0, so the largest scaled score is the largest score, scaled.
                                let m = max[a].max(math::max(&row[seen.clone()]) * scale);
                                probabilities(row, seen, scale, m);
                                let correction = exp_nonpositive(max[a] - m);
                                total[a] = total[a] * correction + sum(row);
                                max[a] = m;
                                oi[a * d..(a + 1) * d].iter_mut().for_each(|x| *x *= correction);
                            }
                            matmul(oi, d, true, View::rows(s, bq, bk), View::rows(&vh[j0 * d..(j0 + bk) * d], bk, d));
                        }
                        for a in 0..bq {
                            let inv = 1.0 / total[a];
                            oi[a * d..(a + 1) * d].iter_mut().for_each(|x| *x *= inv);
                            lse[r * t + i0 + a] = max[a] + total[a].ln();
                        }
                    }
                }
            },
        )
    });
    (o, lse)
}

/// Gradients `(dq, dk, dv)` from the forward's inputs, output, log-sum-exp and `d_o`
/// (FlashAttention-2's backward: probabilities recomputed tile by tile from the log-sum-exp).
#[allow(clippy::too_many_arguments)]
pub fn backward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    starts: &[i64],
    o: &[f32],
    lse: &[f32],
    d_o: &[f32],
    n: Dims,
    scale: f32,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (hs, d, t, rep) = (n.head(), n.d, n.t, n.rep());
    let mut dq = vec![0f32; q.len()];
    let mut dk = vec![0f32; k.len()];
    let mut dv = vec![0f32; v.len()];
    dq.par_chunks_mut(rep * hs).zip(dk.par_chunks_mut(hs).zip(dv.par_chunks_mut(hs))).enumerate().for_each(
        |(bg, (dq, (dk, dv)))| {
            simd(
                #[inline(always)]
                || {
                    let kv_off = bg * hs;
                    let (kh, vh) = (&k[kv_off..kv_off + hs], &v[kv_off..kv_off + hs]);
                    let starts = row_starts(starts, n, bg / n.kv);
                    let (mut p, mut ds) = (vec![0f32; TILE_Q * TILE_K], vec![0f32; TILE_Q * TILE_K]);
                    let mut delta = [0f32; TILE_Q];
                    for r in 0..rep {
                        let head = bg * rep + r;
                        let (q_off, l_off) = (head * hs, head * t);
                        for i0 in (0..t).step_by(TILE_Q) {
                            let bq = TILE_Q.min(t - i0);
                            let rows = q_off + i0 * d..q_off + (i0 + bq) * d;
                            let (qi, doi) =
                                (View::rows(&q[rows.clone()], bq, d), View::rows(&d_o[rows.clone()], bq, d));
                            for (a, di) in delta[..bq].iter_mut().enumerate() {
                                let row = rows.start + a * d..rows.start + (a + 1) * d;
                                *di = dot(&d_o[row.clone()], &o[row]);
                            }
                            let dqi = &mut dq[r * hs + i0 * d..r * hs + (i0 + bq) * d];
                            for j0 in (first_key(starts, i0, bq)..i0 + bq).step_by(TILE_K) {
                                let bk = TILE_K.min(i0 + bq - j0);
                                let (p, ds) = (&mut p[..bq * bk], &mut ds[..bq * bk]);
                                let (kj, vj) = (&kh[j0 * d..(j0 + bk) * d], &vh[j0 * d..(j0 + bk) * d]);
                                matmul(p, bk, false, qi, View::rows(kj, bk, d).t());
                                matmul(ds, bk, false, doi, View::rows(vj, bk, d).t());
                                for a in 0..bq {
                                    let row = a * bk..(a + 1) * bk;
                                    probabilities(
                                        &mut p[row.clone()],
                                        visible(i0 + a, starts[i0 + a] as usize, j0, bk),
                                        scale,
                                        lse[l_off + i0 + a],
                                    );
                                    for (g, &pj) in ds[row.clone()].iter_mut().zip(&p[row]) {
                                        *g = pj * (*g - delta[a]) * scale;
                                    }
                                }
                                let (p, ds) = (View::rows(p, bq, bk), View::rows(ds, bq, bk));
                                matmul(&mut dv[j0 * d..(j0 + bk) * d], d, true, p.t(), doi);
                                matmul(dqi, d, true, ds, View::rows(kj, bk, d));
                                matmul(&mut dk[j0 * d..(j0 + bk) * d], d, true, ds.t(), qi);
                            }
                        }
                    }
                },
            )
        },
    );
    (dq, dk, dv)
}
