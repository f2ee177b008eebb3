//! The element-wise CubeCL kernels (SwiGLU, RoPE, the cross-entropy's backward) and the grouped
//! expert GEMM, accumulating in the tensor's float type; the row reductions are in
//! [`super::rows`], the tiled flash attention in [`super::flash`], AdamW in [`super::adamw`],
//! the launch side in [`super::launch`].

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
/// log-sum-exp (the probabilities are never stored).
#[cube(launch)]
pub fn cross_entropy_bwd<F: Float, I: Numeric>(
    logits: &Tensor<F>,
    targets: &Tensor<I>,
    lse: &Tensor<F>,
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
    let mut g = (logits[idx] - lse[row]).exp();
    if c == u32::cast_from(targets[row]) as usize {
        g = g - F::new(1.0);
    }
    dlogits[idx] = g * dloss[row];
}

/// The group of `row` (rows sorted by group, `sizes[g]` rows each) and the group's first row.
#[cube]
fn group_of<I: Numeric>(sizes: &Tensor<I>, groups: usize, row: usize) -> (usize, usize) {
    let mut start = 0usize;
    let mut g = 0usize;
    let mut found = groups;
    let mut found_start = 0usize;
    while g < groups {
        let end = start + u32::cast_from(sizes[g]) as usize;
        if found == groups && row < end {
            found = g;
            found_start = start;
        }
        start = end;
        g += 1;
    }
    (found, found_start)
}

/// The row products of the grouped GEMM, one thread per element of `out: [m, width]`:
/// `out[r, c] = Σ_i a[r, i] · w[g(r)·group_stride + c·col_stride + i·inner_stride]` with
/// `a: [m, inner]`. Forward: `a = x`, `w[g]` read as `[k, n]` (`col_stride` 1, `inner_stride`
/// n); input gradient: `a = dy`, `w[g]` read transposed (`col_stride` n, `inner_stride` 1).
#[cube(launch)]
pub fn grouped_mm_rows<F: Float, I: Numeric>(
    a: &Tensor<F>,
    w: &Tensor<F>,
    sizes: &Tensor<I>,
    out: &mut Tensor<F>,
    m: u32,
    inner: u32,
    width: u32,
    group_stride: u32,
    col_stride: u32,
    inner_stride: u32,
    groups: u32,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    let idx = ABSOLUTE_POS as usize;
    let (ki, wd) = (inner as usize, width as usize);
    if idx >= m as usize * wd {
        terminate!();
    }
    let (r, c) = (idx / wd, idx % wd);
    let (g, _) = group_of::<I>(sizes, groups as usize, r);
    let wb = g * group_stride as usize + c * col_stride as usize;
    let mut acc = F::new(0.0);
    for i in 0..ki {
        acc = acc + a[r * ki + i] * w[wb + i * inner_stride as usize];
    }
    out[idx] = acc;
}

/// Grouped GEMM weight gradient: `dw[g, j, c] = Σ_{r of g} x[r, j] · dy[r, c]`, one thread per
/// element of `dw: [groups, k, n]` (zero for a group without rows).
#[cube(launch)]
pub fn grouped_mm_dw<F: Float, I: Numeric>(
    x: &Tensor<F>,
    sizes: &Tensor<I>,
    dy: &Tensor<F>,
    dw: &mut Tensor<F>,
    k: u32,
    n: u32,
    groups: u32,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    let idx = ABSOLUTE_POS as usize;
    let (kk, nn) = (k as usize, n as usize);
    if idx >= groups as usize * kk * nn {
        terminate!();
    }
    let g = idx / (kk * nn);
    let j = (idx / nn) % kk;
    let c = idx % nn;
    let mut start = 0usize;
    for p in 0..g {
        start += u32::cast_from(sizes[p]) as usize;
    }
    let rows = u32::cast_from(sizes[g]) as usize;
    let mut acc = F::new(0.0);
    for r in start..start + rows {
        acc = acc + x[r * kk + j] * dy[r * nn + c];
    }
    dw[idx] = acc;
}
