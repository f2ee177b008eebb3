//! Host kernels of the fused causal attention, on row-major `[B, heads, T, D]` slices.
//!
//! Work is split by (batch, kv head): each task owns its slices of every output, so results do
//! not depend on the number of threads (bitwise deterministic). Dot products use 8 independent
//! accumulators so they vectorise.

use rayon::prelude::*;

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

#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s = acc.iter().sum::<f32>();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// Sum in a fixed order with 8 lanes (vectorises; deterministic).
#[inline]
fn sum(a: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let c = a.chunks_exact(8);
    let r = c.remainder();
    for x in c {
        for l in 0..8 {
            acc[l] += x[l];
        }
    }
    acc.iter().sum::<f32>() + r.iter().sum::<f32>()
}

#[inline]
fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
    }
}

/// `e^x` for `x <= 0` to ~1e-7 relative (Cephes' expf polynomial), branch-free so the loop
/// over a row vectorises; libm's `expf` per element was a third of the kernel's time.
#[inline]
fn exp_nonpositive(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const ROUND: f32 = 12_582_912.0; // 1.5 · 2^23: adding it rounds to an integer
    let x = x.max(-87.0);
    let n = (x * LOG2E + ROUND) - ROUND;
    let r = x - n * 0.693_359_4 + n * 2.121_944_4e-4;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 5.000_000_1e-1;
    let y = p * r * r + r + 1.0;
    f32::from_bits(((n as i32 + 127) as u32) << 23) * y
}

/// `s[j] = exp(s[j] - shift)` for the row.
#[inline]
fn exp_shifted(s: &mut [f32], shift: f32) {
    for x in s.iter_mut() {
        *x = exp_nonpositive(*x - shift);
    }
}

/// `out[j] = Σ_c x[c] · mt[c][j]` for `j < out.len()`, with `mt` the `[d, t]` transpose of a
/// head's `[t, d]` rows: the scores of one query against every key, vectorised across keys.
#[inline]
fn scores(x: &[f32], mt: &[f32], t: usize, out: &mut [f32]) {
    out.iter_mut().for_each(|o| *o = 0.0);
    let n = out.len();
    for (c, &xc) in x.iter().enumerate() {
        axpy(xc, &mt[c * t..c * t + n], out);
    }
}

fn transpose(m: &[f32], t: usize, d: usize) -> Vec<f32> {
    let mut out = vec![0f32; t * d];
    for i in 0..t {
        for c in 0..d {
            out[c * t + i] = m[i * d + c];
        }
    }
    out
}

/// Output `[b, h, t, d]` and per-row log-sum-exp `[b, h, t]` of `softmax(q kᵀ · scale, causal) v`.
pub fn forward(q: &[f32], k: &[f32], v: &[f32], n: Dims, scale: f32) -> (Vec<f32>, Vec<f32>) {
    let (hs, d, t, rep) = (n.head(), n.d, n.t, n.rep());
    let mut o = vec![0f32; n.b * n.h * hs];
    let mut lse = vec![0f32; n.b * n.h * t];
    o.par_chunks_mut(rep * hs).zip(lse.par_chunks_mut(rep * t)).enumerate().for_each(|(bg, (o, lse))| {
        let kv_off = bg * hs;
        let (kh, vh) = (&k[kv_off..kv_off + hs], &v[kv_off..kv_off + hs]);
        let kt = transpose(kh, t, d);
        let mut s = vec![0f32; t];
        for r in 0..rep {
            let q_off = (bg * rep + r) * hs;
            let qh = &q[q_off..q_off + hs];
            for i in 0..t {
                let qi = &qh[i * d..(i + 1) * d];
                let row = &mut s[..=i];
                scores(qi, &kt, t, row);
                row.iter_mut().for_each(|x| *x *= scale);
                let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                exp_shifted(row, m);
                let l = sum(row);
                let oi = &mut o[r * hs + i * d..r * hs + (i + 1) * d];
                for (j, &p) in row.iter().enumerate() {
                    axpy(p, &vh[j * d..(j + 1) * d], oi);
                }
                let inv = 1.0 / l;
                oi.iter_mut().for_each(|x| *x *= inv);
                lse[r * t + i] = m + l.ln();
            }
        }
    });
    (o, lse)
}

/// Gradients `(dq, dk, dv)` from the forward's inputs, output, log-sum-exp and `d_o`.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
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
            let kv_off = bg * hs;
            let (kh, vh) = (&k[kv_off..kv_off + hs], &v[kv_off..kv_off + hs]);
            let (kt, vt) = (transpose(kh, t, d), transpose(vh, t, d));
            let (mut p, mut dp) = (vec![0f32; t], vec![0f32; t]);
            for r in 0..rep {
                let head = bg * rep + r;
                let (q_off, l_off) = (head * hs, head * t);
                for i in 0..t {
                    let row = q_off + i * d;
                    let (qi, doi) = (&q[row..row + d], &d_o[row..row + d]);
                    let di = dot(doi, &o[row..row + d]);
                    let li = lse[l_off + i];
                    let dqi = &mut dq[r * hs + i * d..r * hs + (i + 1) * d];
                    let (p, dp) = (&mut p[..=i], &mut dp[..=i]);
                    scores(qi, &kt, t, p);
                    p.iter_mut().for_each(|x| *x *= scale);
                    exp_shifted(p, li);
                    scores(doi, &vt, t, dp);
                    for j in 0..=i {
                        let kj = &kh[j * d..(j + 1) * d];
                        let ds = p[j] * (dp[j] - di) * scale;
                        axpy(ds, kj, dqi);
                        axpy(ds, qi, &mut dk[j * d..(j + 1) * d]);
                        axpy(p[j], doi, &mut dv[j * d..(j + 1) * d]);
                    }
                }
            }
        },
    );
    (dq, dk, dv)
}

#[cfg(test)]
pub(super) fn exp_for_tests(x: f32) -> f32 {
    exp_nonpositive(x)
}
