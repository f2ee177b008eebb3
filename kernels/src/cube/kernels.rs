//! The element-wise CubeCL kernels (SwiGLU, RoPE, the cross-entropy's backward), computing in
//! the tensor's float type; the row reductions are in [`super::rows`], the tiled flash attention
//! in [`super::flash`], the grouped expert GEMM in [`super::grouped`], AdamW in
//! [`super::adamw`], the launch side in [`super::launch`].

use cubecl::prelude::*;

/// `silu(gate) · up`, element-wise.
#[cube(launch)]
pub fn silu_mul_fwd<F: Float>(
    gate: &Tensor<F>,
    up: &Tensor<F>,
    y: &mut Tensor<F>,
    n: u32,
    #[define(F)] _dtype: ElemType,
) {
    let i = ABSOLUTE_POS as usize;
    if i >= n as usize {
        terminate!();
    }
    let g = gate[i];
    y[i] = g / (F::new(1.0) + (-g).exp()) * up[i];
}

/// Gradients of `silu(gate) · up`: `dgate = dy · up · σ(g)(1 + g(1 − σ(g)))`, `dup = dy · silu(g)`.
#[cube(launch)]
pub fn silu_mul_bwd<F: Float>(
    gate: &Tensor<F>,
    up: &Tensor<F>,
    dy: &Tensor<F>,
    dgate: &mut Tensor<F>,
    dup: &mut Tensor<F>,
    n: u32,
    #[define(F)] _dtype: ElemType,
) {
    let i = ABSOLUTE_POS as usize;
    if i >= n as usize {
        terminate!();
    }
    let g = gate[i];
    let s = F::new(1.0) / (F::new(1.0) + (-g).exp());
    let d = dy[i];
    dup[i] = d * g * s;
    dgate[i] = d * up[i] * s * (F::new(1.0) + g * (F::new(1.0) - s));
}

/// Rotate-half RoPE on `x: [.., T, D]` with tables `[T, D]`: `y = x · cos + rot(x) · sin`,
/// `rot(x) = [−x₂, x₁]`. The backward is the same kernel with `−sin`.
#[cube(launch)]
pub fn rope<F: Float>(
    x: &Tensor<F>,
    cos: &Tensor<F>,
    sin: &Tensor<F>,
    y: &mut Tensor<F>,
    n: u32,
    seq: u32,
    dim: u32,
    #[define(F)] _dtype: ElemType,
) {
    let idx = ABSOLUTE_POS as usize;
    if idx >= n as usize {
        terminate!();
    }
    let d = dim as usize;
    let half = d / 2;
    let i = idx % d;
    let pos = (idx / d) % (seq as usize);
    let tab = pos * d + i;
    let rot = if i < half { -x[idx + half] } else { x[idx - half] };
    y[idx] = x[idx] * cos[tab] + rot * sin[tab];
}

/// `dlogits = dloss · (softmax(logits) − onehot(target))`, element-wise from the saved
/// float32 log-sum-exp (the probabilities are never stored), computed in float32.
#[cube(launch)]
pub fn cross_entropy_bwd<F: Float, I: Numeric>(
    logits: &Tensor<F>,
    targets: &Tensor<I>,
    lse: &Tensor<f32>,
    dloss: &Tensor<F>,
    dlogits: &mut Tensor<F>,
    n: u32,
    vocab: u32,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    let idx = ABSOLUTE_POS as usize;
    if idx >= n as usize {
        terminate!();
    }
    let v = vocab as usize;
    let row = idx / v;
    let c = idx % v;
    let mut g = (f32::cast_from(logits[idx]) - lse[row]).exp();
    if c == u32::cast_from(targets[row]) as usize {
        g -= 1.0;
    }
    dlogits[idx] = F::cast_from(g * f32::cast_from(dloss[row]));
}
