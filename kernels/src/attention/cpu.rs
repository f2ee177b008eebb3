//! Host kernels of the fused causal attention, on row-major `[B, heads, T, D]` slices.
//!
//! Each query row sees a contiguous window of keys ([`Visible`]): [`Starts`] is self-attention,
//! causal within documents (`starts[b, i] ..= i`; all zero: plain causal), [`Windows`] any
//! windows over another block of keys (ring attention under context parallelism).
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
use std::ops::Range;

/// Rows of a query tile.
pub const TILE_Q: usize = 64;
/// Rows of a key tile: the scores of a query tile against one key tile (`TILE_Q × TILE_K`)
/// are all that exists at a time. Wider key tiles mean fewer, larger GEMM calls (each call has
/// a fixed cost that dominated at 64 × 64 with head dim 16).
pub const TILE_K: usize = 256;
/// Shapes: queries `[b, h, t, d]`, keys/values `[b, kv, tk, d]`, `h` a multiple of `kv`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    pub b: usize,
    pub h: usize,
    pub kv: usize,
    pub t: usize,
    /// Keys per head (`t` for self-attention over one sequence).
    pub tk: usize,
    pub d: usize,
}

impl Dims {
    /// The shapes of `q: [b, h, t, d]` and `k: [b, kv, tk, d]`.
    pub fn of(q: &[usize], k: &[usize]) -> Self {
        Self { b: q[0], h: q[1], kv: k[1], t: q[2], tk: k[2], d: q[3] }
    }

    /// Self-attention shapes: as many keys as queries.
    pub fn square(b: usize, h: usize, kv: usize, t: usize, d: usize) -> Self {
        Self { b, h, kv, t, tk: t, d }
    }
    fn rep(&self) -> usize {
        self.h / self.kv
    }
    fn head(&self) -> usize {
        self.t * self.d
    }
    fn key_head(&self) -> usize {
        self.tk * self.d
    }
}

/// Which keys each query row sees: a contiguous window `lo..hi` of key indices (possibly empty).
pub trait Visible: Sync {
    fn window(&self, b: usize, i: usize) -> Range<usize>;
}

/// Self-attention, causal within documents: row `i` of batch row `b` sees keys
/// `starts[b·t + i] ..= i` (all zero: plain causal).
pub struct Starts<'a> {
    pub starts: &'a [i64],
    pub t: usize,
}

impl Visible for Starts<'_> {
    #[inline]
    fn window(&self, b: usize, i: usize) -> Range<usize> {
        let lo = self.starts[b * self.t + i];
        debug_assert!((0..=i as i64).contains(&lo), "document start {lo} of position {i} out of range");
        lo as usize..i + 1
    }
}

/// Explicit windows `lo[b·t + i] .. hi[b·t + i]` (e.g. one block of keys of a ring attention).
pub struct Windows<'a> {
    pub lo: &'a [i64],
    pub hi: &'a [i64],
    pub t: usize,
}

impl Visible for Windows<'_> {
    #[inline]
    fn window(&self, b: usize, i: usize) -> Range<usize> {
        let k = b * self.t + i;
        self.lo[k].max(0) as usize..self.hi[k].max(self.lo[k]).max(0) as usize
    }
}

/// The part of `w` inside the key tile starting at `j0` of length `bk`, relative to the tile.
#[inline]
fn in_tile(w: &Range<usize>, j0: usize, bk: usize) -> Range<usize> {
    let end = w.end.saturating_sub(j0).min(bk);
    w.start.saturating_sub(j0).min(end)..end
}

/// `s[j] = exp(s[j] · scale − shift)` for the visible keys, `0` for the masked rest.
#[inline]
fn probabilities(s: &mut [f32], visible: Range<usize>, scale: f32, shift: f32) {
    let (before, rest) = s.split_at_mut(visible.start);
    let (seen, after) = rest.split_at_mut(visible.len());
    for x in seen.iter_mut() {
        *x = exp_nonpositive(*x * scale - shift);
    }
    before.iter_mut().chain(after).for_each(|x| *x = 0.0);
}

/// The windows of the query tile `i0 .. i0 + bq` of batch row `b`, and the key range the tile
/// must visit (empty when no row sees a key).
fn tile_windows(vis: &impl Visible, b: usize, i0: usize, bq: usize, w: &mut [Range<usize>; TILE_Q]) -> Range<usize> {
    let (mut lo, mut hi) = (usize::MAX, 0);
    for a in 0..bq {
        w[a] = vis.window(b, i0 + a);
        if !w[a].is_empty() {
            lo = lo.min(w[a].start);
            hi = hi.max(w[a].end);
        }
    }
    lo.min(hi)..hi
}

/// Output `[b, h, t, d]` and per-row log-sum-exp `[b, h, t]` of `softmax(q kᵀ · scale, mask) v`,
/// the mask letting each row see its window of keys (`vis`). A row that sees no key gets output
/// 0 and log-sum-exp −∞ (a block of a ring attention it has nothing in).
pub fn forward(q: &[f32], k: &[f32], v: &[f32], vis: &impl Visible, n: Dims, scale: f32) -> (Vec<f32>, Vec<f32>) {
    let (hs, ks, d, t, rep) = (n.head(), n.key_head(), n.d, n.t, n.rep());
    let mut o = vec![0f32; n.b * n.h * hs];
    let mut lse = vec![0f32; n.b * n.h * t];
    o.par_chunks_mut(rep * hs).zip(lse.par_chunks_mut(rep * t)).enumerate().for_each(|(bg, (o, lse))| {
        simd(
            #[inline(always)]
            || {
                let kv_off = bg * ks;
                let (kh, vh) = (&k[kv_off..kv_off + ks], &v[kv_off..kv_off + ks]);
                let b = bg / n.kv;
                let mut s = vec![0f32; TILE_Q * TILE_K];
                let (mut max, mut total) = ([0f32; TILE_Q], [0f32; TILE_Q]);
                let mut w: [Range<usize>; TILE_Q] = std::array::from_fn(|_| 0..0);
                for r in 0..rep {
                    let q_off = (bg * rep + r) * hs;
                    for i0 in (0..t).step_by(TILE_Q) {
                        let bq = TILE_Q.min(t - i0);
                        let qi = View::rows(&q[q_off + i0 * d..q_off + (i0 + bq) * d], bq, d);
                        let oi = &mut o[r * hs + i0 * d..r * hs + (i0 + bq) * d];
                        max[..bq].fill(f32::NEG_INFINITY);
                        total[..bq].fill(0.0);
                        let keys = tile_windows(vis, b, i0, bq, &mut w);
                        for j0 in keys.clone().step_by(TILE_K) {
                            let bk = TILE_K.min(keys.end - j0);
                            let s = &mut s[..bq * bk];
                            matmul(s, bk, false, qi, View::rows(&kh[j0 * d..(j0 + bk) * d], bk, d).t());
                            for a in 0..bq {
                                let row = &mut s[a * bk..(a + 1) * bk];
                                let seen = in_tile(&w[a], j0, bk);
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
                            if total[a] == 0.0 {
                                // No visible key: output 0 (never written), log-sum-exp −∞.
                                oi[a * d..(a + 1) * d].fill(0.0);
                                lse[r * t + i0 + a] = f32::NEG_INFINITY;
                                continue;
                            }
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
    vis: &impl Visible,
    o: &[f32],
    lse: &[f32],
    d_o: &[f32],
    n: Dims,
    scale: f32,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (hs, ks, d, t, rep) = (n.head(), n.key_head(), n.d, n.t, n.rep());
    let mut dq = vec![0f32; q.len()];
    let mut dk = vec![0f32; k.len()];
    let mut dv = vec![0f32; v.len()];
    dq.par_chunks_mut(rep * hs).zip(dk.par_chunks_mut(ks).zip(dv.par_chunks_mut(ks))).enumerate().for_each(
        |(bg, (dq, (dk, dv)))| {
            simd(
                #[inline(always)]
                || {
                    let kv_off = bg * ks;
                    let (kh, vh) = (&k[kv_off..kv_off + ks], &v[kv_off..kv_off + ks]);
                    let b = bg / n.kv;
                    let mut w: [Range<usize>; TILE_Q] = std::array::from_fn(|_| 0..0);
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
                            let keys = tile_windows(vis, b, i0, bq, &mut w);
                            for j0 in keys.clone().step_by(TILE_K) {
                                let bk = TILE_K.min(keys.end - j0);
                                let (p, ds) = (&mut p[..bq * bk], &mut ds[..bq * bk]);
                                let (kj, vj) = (&kh[j0 * d..(j0 + bk) * d], &vh[j0 * d..(j0 + bk) * d]);
                                matmul(p, bk, false, qi, View::rows(kj, bk, d).t());
                                matmul(ds, bk, false, doi, View::rows(vj, bk, d).t());
                                for a in 0..bq {
                                    let row = a * bk..(a + 1) * bk;
                                    probabilities(
                                        &mut p[row.clone()],
                                        in_tile(&w[a], j0, bk),
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
