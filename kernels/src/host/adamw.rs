//! AdamW's update on the CPU in one pass: each element of the parameter, its gradient and both
//! moments is read once and the three results written once (the composed ops make about a dozen
//! passes, each with its own allocation). The arithmetic is the reference's
//! ([`crate::reference::adamw`]), operation for operation in `f32`, so the results are the same.

use super::math::{simd, CHUNK};
use crate::ops::AdamWStep;
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// The first `n` (allocated, unwritten) elements of `v`.
fn spare(v: &mut Vec<f32>, n: usize) -> &mut [MaybeUninit<f32>] {
    &mut v.spare_capacity_mut()[..n]
}

/// `(p', m', v')` from the parameter `p`, gradient `g` and moments `m`, `v` (all the same length).
pub fn adamw(p: &[f32], g: &[f32], m: &[f32], v: &[f32], h: AdamWStep) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let n = p.len();
    assert!(g.len() == n && m.len() == n && v.len() == n, "adamw: lengths differ");
    let (mut p2, mut m2, mut v2) = (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
    // Written once each below, so not zeroed first (that would be a fourth and fifth stream).
    let outputs = spare(&mut p2, n).par_chunks_mut(CHUNK).zip(spare(&mut m2, n).par_chunks_mut(CHUNK));
    outputs.zip(spare(&mut v2, n).par_chunks_mut(CHUNK)).enumerate().for_each(|(c, ((po, mo), vo))| {
        let r = c * CHUNK..(c * CHUNK + po.len());
        let (p, g, m, v) = (&p[r.clone()], &g[r.clone()], &m[r.clone()], &v[r]);
        simd(
            #[inline(always)]
            || {
                // Zipped iterators (no bounds checks), so the loop vectorises.
                let outs = po.iter_mut().zip(mo.iter_mut()).zip(vo.iter_mut());
                let ins = p.iter().zip(g).zip(m.iter().zip(v));
                for (((po, mo), vo), ((&p, &g), (&m, &v))) in outs.zip(ins) {
                    let g = if h.grad_scale != 1.0 { g * h.grad_scale } else { g };
                    let m = m + (g - m) * h.one_minus_beta1;
                    let v = v * h.beta2 + (g * g) * h.one_minus_beta2;
                    let denom = v.sqrt() / h.bias2_sqrt + h.eps;
                    po.write(p * h.decay - (m / denom) * h.step_size);
                    mo.write(m);
                    vo.write(v);
                }
            },
        )
    });
    // SAFETY: the chunks above cover all `n` elements of each output and wrote every one.
    unsafe {
        p2.set_len(n);
        m2.set_len(n);
        v2.set_len(n);
    }
    (p2, m2, v2)
}
