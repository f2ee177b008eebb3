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

#[inline]
fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
    }
}

/// Output `[b, h, t, d]` and per-row log-sum-exp `[b, h, t]` of `softmax(q kᵀ · scale, causal) v`.
pub fn forward(q: &[f32], k: &[f32], v: &[f32], n: Dims, scale: f32) -> (Vec<f32>, Vec<f32>) {
    let (hs, d, t, rep) = (n.head(), n.d, n.t, n.rep());
    let mut o = vec![0f32; n.b * n.h * hs];
    let mut lse = vec![0f32; n.b * n.h * t];
    o.par_chunks_mut(rep * hs).zip(lse.par_chunks_mut(rep * t)).enumerate().for_each(|(bg, (o, lse))| {
        let kv_off = bg * hs;
        let (kh, vh) = (&k[kv_off..kv_off + hs], &v[kv_off..kv_off + hs]);
        let mut s = vec![0f32; t];
        for r in 0..rep {
            let q_off = (bg * rep + r) * hs;
            let qh = &q[q_off..q_off + hs];
            for i in 0..t {
                let qi = &qh[i * d..(i + 1) * d];
                let mut m = f32::NEG_INFINITY;
                for j in 0..=i {
                    s[j] = dot(qi, &kh[j * d..(j + 1) * d]) * scale;
                    m = m.max(s[j]);
                }
                let mut l = 0f32;
                let oi = &mut o[r * hs + i * d..r * hs + (i + 1) * d];
                for j in 0..=i {
                    let p = (s[j] - m).exp();
                    l += p;
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
pub fn backward(q: &[f32], k: &[f32], v: &[f32], o: &[f32], lse: &[f32], d_o: &[f32], n: Dims, scale: f32) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (hs, d, t, rep) = (n.head(), n.d, n.t, n.rep());
    let mut dq = vec![0f32; q.len()];
    let mut dk = vec![0f32; k.len()];
    let mut dv = vec![0f32; v.len()];
    dq.par_chunks_mut(rep * hs)
        .zip(dk.par_chunks_mut(hs).zip(dv.par_chunks_mut(hs)))
        .enumerate()
        .for_each(|(bg, (dq, (dk, dv)))| {
            let kv_off = bg * hs;
            let (kh, vh) = (&k[kv_off..kv_off + hs], &v[kv_off..kv_off + hs]);
            for r in 0..rep {
                let head = bg * rep + r;
                let (q_off, l_off) = (head * hs, head * t);
                for i in 0..t {
                    let row = q_off + i * d;
                    let (qi, doi) = (&q[row..row + d], &d_o[row..row + d]);
                    let di = dot(doi, &o[row..row + d]);
                    let li = lse[l_off + i];
                    let dqi = &mut dq[r * hs + i * d..r * hs + (i + 1) * d];
                    for j in 0..=i {
                        let (kj, vj) = (&kh[j * d..(j + 1) * d], &vh[j * d..(j + 1) * d]);
                        let p = (dot(qi, kj) * scale - li).exp();
                        let ds = p * (dot(doi, vj) - di) * scale;
                        axpy(ds, kj, dqi);
                        axpy(ds, qi, &mut dk[j * d..(j + 1) * d]);
                        axpy(p, doi, &mut dv[j * d..(j + 1) * d]);
                    }
                }
            }
        });
    (dq, dk, dv)
}
