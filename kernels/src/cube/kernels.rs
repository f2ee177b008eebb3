//! The element-wise CubeCL kernels (SwiGLU, RoPE, the cross-entropy's backward), attention
//! (one thread per query or key row) and the grouped expert GEMM, accumulating in the tensor's
//! float type; the row reductions are in [`super::rows`], AdamW in [`super::adamw`], the
//! launch side in [`super::launch`].

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

/// `Σ_c a[a0 + c] · b[b0 + c]` over `d` elements.
#[cube]
fn dot<F: Float>(a: &Tensor<F>, a0: usize, b: &Tensor<F>, b0: usize, d: usize) -> F {
    let mut s = F::new(0.0);
    for c in 0..d {
        s = s + a[a0 + c] * b[b0 + c];
    }
    s
}

/// The offset of the K/V rows that query row `row` (of `[B, H, T]`) attends to, in `[B, KV, T, D]`.
#[cube]
fn kv_offset(row: usize, t: usize, d: usize, h_n: usize, kv_n: usize) -> usize {
    let bh = row / t;
    let kh = (bh % h_n) / (h_n / kv_n);
    ((bh / h_n) * kv_n + kh) * t * d
}

/// The first key query row `row` (of `q: [B, H, T, D]` flattened to rows) sees: its entry of
/// `starts: [B, T]`.
#[cube]
fn first_key<I: Numeric>(starts: &Tensor<I>, row: usize, t: usize, h_n: usize) -> usize {
    let b = row / (h_n * t);
    u32::cast_from(starts[b * t + row % t]) as usize
}

/// Causal attention, one query row per thread, online softmax: `q: [B, H, T, D]`,
/// `k, v: [B, KV, T, D]` (GQA: query head `h` reads kv head `h / (H / KV)`); query `i` of batch
/// row `b` sees keys `starts[b, i] ..= i` (block-causal over packed documents; all zero: plain
/// causal). Writes the output row and its log-sum-exp; no `T × T` matrix exists.
#[cube(launch)]
pub fn attention_fwd<F: Float, I: Numeric>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    starts: &Tensor<I>,
    o: &mut Tensor<F>,
    lse: &mut Tensor<F>,
    rows: u32,
    heads: u32,
    kv_heads: u32,
    seq: u32,
    dim: u32,
    scale: f32,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    let idx = ABSOLUTE_POS as usize;
    if idx >= rows as usize {
        terminate!();
    }
    let (t, d, h_n, kv_n) = (seq as usize, dim as usize, heads as usize, kv_heads as usize);
    let i = idx % t;
    let qb = idx * d;
    let kb = kv_offset(idx, t, d, h_n, kv_n);
    let sc = F::cast_from(scale);
    // The row's first key is always visible: start the running max and sum from it.
    let first = first_key::<I>(starts, idx, t, h_n);
    let fb = kb + first * d;
    let mut m = dot::<F>(q, qb, k, fb, d) * sc;
    let mut l = F::new(1.0);
    for c in 0..d {
        o[qb + c] = v[fb + c];
    }
    for j in first + 1..i + 1 {
        let jb = kb + j * d;
        let s = dot::<F>(q, qb, k, jb, d) * sc;
        let mut m_new = m;
        if s > m {
            m_new = s;
        }
        let corr = (m - m_new).exp();
        let p = (s - m_new).exp();
        l = l * corr + p;
        for c in 0..d {
            o[qb + c] = o[qb + c] * corr + p * v[jb + c];
        }
        m = m_new;
    }
    let inv = F::new(1.0) / l;
    for c in 0..d {
        o[qb + c] = o[qb + c] * inv;
    }
    lse[idx] = m + l.ln();
}

/// `dq` of causal attention, one query row per thread, probabilities recomputed from `lse`.
#[cube(launch)]
pub fn attention_bwd_dq<F: Float, I: Numeric>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    starts: &Tensor<I>,
    o: &Tensor<F>,
    lse: &Tensor<F>,
    d_o: &Tensor<F>,
    dq: &mut Tensor<F>,
    rows: u32,
    heads: u32,
    kv_heads: u32,
    seq: u32,
    dim: u32,
    scale: f32,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    let idx = ABSOLUTE_POS as usize;
    if idx >= rows as usize {
        terminate!();
    }
    let (t, d, h_n, kv_n) = (seq as usize, dim as usize, heads as usize, kv_heads as usize);
    let i = idx % t;
    let qb = idx * d;
    let kb = kv_offset(idx, t, d, h_n, kv_n);
    let sc = F::cast_from(scale);
    let delta = dot::<F>(d_o, qb, o, qb, d);
    for c in 0..d {
        dq[qb + c] = F::new(0.0);
    }
    let row_lse = lse[idx];
    for j in first_key::<I>(starts, idx, t, h_n)..i + 1 {
        let jb = kb + j * d;
        let dp = dot::<F>(d_o, qb, v, jb, d);
        let p = (dot::<F>(q, qb, k, jb, d) * sc - row_lse).exp();
        let ds = p * (dp - delta) * sc;
        for c in 0..d {
            dq[qb + c] = dq[qb + c] + ds * k[jb + c];
        }
    }
}

/// `dk` and `dv` of causal attention, one key row per thread (summing over the query heads
/// that share its kv head and the queries at or after it in its document).
#[cube(launch)]
pub fn attention_bwd_dkv<F: Float, I: Numeric>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    starts: &Tensor<I>,
    o: &Tensor<F>,
    lse: &Tensor<F>,
    d_o: &Tensor<F>,
    dk: &mut Tensor<F>,
    dv: &mut Tensor<F>,
    rows: u32,
    heads: u32,
    kv_heads: u32,
    seq: u32,
    dim: u32,
    scale: f32,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    let idx = ABSOLUTE_POS as usize;
    if idx >= rows as usize {
        terminate!();
    }
    let (t, d, h_n, kv_n) = (seq as usize, dim as usize, heads as usize, kv_heads as usize);
    let j = idx % t;
    let bk = idx / t;
    let kh = bk % kv_n;
    let b = bk / kv_n;
    let group = h_n / kv_n;
    let kb = idx * d;
    let sc = F::cast_from(scale);
    for c in 0..d {
        dk[kb + c] = F::new(0.0);
        dv[kb + c] = F::new(0.0);
    }
    for g in 0..group {
        let h = kh * group + g;
        for i in j..t {
            if u32::cast_from(starts[b * t + i]) as usize > j {
                // Query `i` is in a later document (starts only grow along a row): done.
                break;
            }
            let qi = (b * h_n + h) * t + i;
            let qb = qi * d;
            let dp = dot::<F>(d_o, qb, v, kb, d);
            let delta = dot::<F>(d_o, qb, o, qb, d);
            let p = (dot::<F>(q, qb, k, kb, d) * sc - lse[qi]).exp();
            let ds = p * (dp - delta) * sc;
            for c in 0..d {
                dv[kb + c] = dv[kb + c] + p * d_o[qb + c];
                dk[kb + c] = dk[kb + c] + ds * q[qb + c];
            }
        }
    }
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
