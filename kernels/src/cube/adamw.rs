//! AdamW as one CubeCL kernel: each thread reads its element of the parameter, the gradient
//! and both moments once and writes the new parameter and moments once (7 × 4 bytes per
//! element, the least an AdamW step can move), with the step's scalars in the launch — nothing
//! comes back to the host. The operations and their order are those of the composed reference
//! ([`crate::ops::AdamWStep`]).

use cubecl::prelude::*;

/// One AdamW step of `n` elements; see [`crate::ops::AdamWStep`] for the scalars.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn adamw<F: Float>(
    p: &Tensor<F>,
    g: &Tensor<F>,
    m: &Tensor<F>,
    v: &Tensor<F>,
    p_out: &mut Tensor<F>,
    m_out: &mut Tensor<F>,
    v_out: &mut Tensor<F>,
    n: u32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    bias2_sqrt: f32,
    eps: f32,
    decay: f32,
    step_size: f32,
    grad_scale: f32,
    #[define(F)] _dtype: ElemType,
) {
    let i = ABSOLUTE_POS as usize;
    if i >= n as usize {
        terminate!();
    }
    let gi = f32::cast_from(g[i]) * grad_scale;
    let mi = f32::cast_from(m[i]);
    let m2 = mi + (gi - mi) * one_minus_beta1;
    let v2 = f32::cast_from(v[i]) * beta2 + gi * gi * one_minus_beta2;
    let denom = v2.sqrt() / bias2_sqrt + eps;
    p_out[i] = F::cast_from(f32::cast_from(p[i]) * decay - m2 / denom * step_size);
    m_out[i] = F::cast_from(m2);
    v_out[i] = F::cast_from(v2);
}
