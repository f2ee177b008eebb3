//! Fused kernels for titan-rs, each a Burn custom op with forward and backward, used by the
//! model where the device supports it; the composed Burn ops ([`reference`]) are the reference
//! path and the fallback.
//!
//! * [`attention`]: causal (GQA-aware) attention that never stores the `T × T` probabilities:
//!   forward keeps the output and the per-row log-sum-exp, backward recomputes the
//!   probabilities. On the CPU (flex) a tiled Rust kernel, multithreaded with rayon; on CubeCL
//!   devices a `#[cube]` kernel.
//! * [`ops`]: RMSNorm, SwiGLU's `silu · mul`, RoPE and the fused softmax cross-entropy, one
//!   pass per forward and per backward: on the CPU Rust kernels ([`host`]), on CubeCL devices
//!   (features `wgpu` / `cuda`) `#[cube]` kernels. Also the linear layer, whose CPU products are
//!   split over the threads by output panels ([`host::gemm`]).
//!
//! Each routing function below takes `fused`: `false` forces the reference path.

pub mod attention;
pub mod aux_loss;
pub mod choice;
#[cfg(feature = "cube")]
pub mod cube;
pub mod grouped;
pub mod host;
pub mod ops;
pub mod reference;
pub mod trace_mark;
pub mod transfer;

pub use attention::{block_causal_attention, causal_attention};
pub use aux_loss::attach_aux_loss;
pub use grouped::grouped_matmul;
pub use trace_mark::backward_boundary;
use burn::prelude::*;

/// Whether `device` has the fused kernels: the CPU (flex) or a CubeCL device, with or without
/// autodiff.
pub fn has_kernels(device: &Device) -> bool {
    device.clone().without_autodiff() == Device::flex() || on_cube(device)
}

/// Whether `device` runs the CubeCL kernels (a wgpu or CUDA device, with or without autodiff).
pub fn on_cube(device: &Device) -> bool {
    #[cfg(feature = "cube")]
    {
        device.clone().without_autodiff() != Device::flex()
    }
    #[cfg(not(feature = "cube"))]
    {
        let _ = device;
        false
    }
}

/// Pins the CubeCL row reductions (RMSNorm, the cross-entropy's forward) to one cube per row
/// (`Some(true)`) or one thread per row (`Some(false)`) for this process, or lets them be chosen
/// again (`None`: measured under `model.attention = "auto"`, else one cube per row). For
/// benchmarks and tests; nothing without CubeCL.
pub fn force_row_variant(per_cube: Option<bool>) {
    #[cfg(feature = "cube")]
    cube::tune::force_row_variant(per_cube);
    #[cfg(not(feature = "cube"))]
    let _ = per_cube;
}

/// Forces the CubeCL attention kernels to share each row among several threads through plane
/// shuffles (`Some(true)`, also where the device does not advertise shuffles: Mesa's software
/// adapter has them but cubecl does not offer them there) or not (`Some(false)`), or leaves it
/// to the device (`None`). For tests and benchmarks; nothing without CubeCL.
pub fn force_attention_shuffles(on: Option<bool>) {
    #[cfg(feature = "cube")]
    cube::flash::launch::force_shuffles(on);
    #[cfg(not(feature = "cube"))]
    let _ = on;
}

/// RMSNorm of `x: [B, T, D]` with weight `[D]`.
pub fn rms_norm(x: Tensor<3>, w: Tensor<1>, eps: f64, fused: bool) -> Tensor<3> {
    if fused && has_kernels(&x.device()) {
        return ops::rms_norm(x, w, eps);
    }
    reference::rms_norm(x, w, eps)
}

/// `silu(gate) · up` (SwiGLU's gate).
pub fn silu_mul<const D: usize>(gate: Tensor<D>, up: Tensor<D>, fused: bool) -> Tensor<D> {
    if fused && has_kernels(&gate.device()) {
        return ops::silu_mul(gate, up);
    }
    reference::silu_mul(gate, up)
}

/// Causal attention (`starts: None`) or block-causal attention over packed documents (query `i`
/// of batch row `b` sees keys `starts[b, i] ..= i`), `q: [B, H, T, D]`, `k, v: [B, KV, T, D]`:
/// the fused kernel where the device has one, else Burn's composed ops.
///
/// On GPU devices with [`choice::measuring`] on, "fused" means "the faster of the two", measured
/// once per shape and device ([`choice::prefer_fused`]).
pub fn attention(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, starts: Option<Tensor<2, Int>>, fused: bool) -> Tensor<4> {
    let device = q.device();
    let fused = fused
        && has_kernels(&device)
        && (!on_cube(&device) || !choice::measuring() || prefer_fused_attention(&q, &k, starts.as_ref()));
    if fused {
        return match starts {
            Some(s) => block_causal_attention(q, k, v, s),
            None => causal_attention(q, k, v),
        };
    }
    reference::attention(q, k, v, starts)
}

/// Times one forward and backward of each attention path at the shapes of `q`, `k` (and
/// `starts`' mask) on fresh random inputs; see [`choice::prefer_fused`]. Forward-only calls (a
/// checkpointed block's first pass) share the choice of the training pass, so a recomputation
/// always runs the kernel its forward ran.
fn prefer_fused_attention(q: &Tensor<4>, k: &Tensor<4>, starts: Option<&Tensor<2, Int>>) -> bool {
    let (qd, kd, dtype) = (q.dims(), k.dims(), q.dtype());
    let device = q.device().without_autodiff();
    let kernel = if starts.is_some() { "block-causal attention" } else { "causal attention" };
    let shape = [qd.to_vec(), kd.to_vec()].concat();
    choice::prefer_fused(kernel, shape, &device, |fused| {
        let train = device.clone().autodiff();
        let normal = burn::tensor::Distribution::Normal(0.0, 1.0);
        let make = |d: [usize; 4]| Tensor::<4>::random(d, normal, &train).cast(dtype).detach().require_grad();
        let (q, k, v) = (make(qd), make(kd), make(kd));
        let s = starts.map(|s| s.clone().to_device(&train));
        let o = match (fused, s) {
            (true, Some(s)) => block_causal_attention(q.clone(), k, v, s),
            (true, None) => causal_attention(q.clone(), k, v),
            (false, s) => reference::attention(q.clone(), k, v, s),
        };
        let g = o.sum().backward();
        let _ = q.grad(&g).map(|g| g.sum().into_scalar::<f32>());
    })
}

/// Rotate-half RoPE of `x: [B, H, T, D]` with tables `[1, 1, T, D]` (one position per column,
/// the fused kernel where the device has one) or `[B, 1, T, D]` (positions per batch row, e.g.
/// restarting at each packed document: Burn's composed ops).
pub fn rope(x: Tensor<4>, cos: Tensor<4>, sin: Tensor<4>, fused: bool) -> Tensor<4> {
    if fused && cos.dims()[0] == 1 && has_kernels(&x.device()) {
        return ops::rope(x, cos, sin);
    }
    reference::rope(x, cos, sin)
}

/// `x · w` (`x: [rows, d_in]`, `w: [d_in, d_out]`): on the CPU the three products of forward
/// and backward are split into one panel per thread ([`host::gemm::par_product`]); on CubeCL
/// devices, and with `fused = false`, Burn's matmul.
pub fn linear(x: Tensor<2>, w: Tensor<2>, fused: bool) -> Tensor<2> {
    if fused && has_kernels(&x.device()) && !on_cube(&x.device()) {
        return ops::linear(x, w);
    }
    x.matmul(w)
}

/// One AdamW update `(p', m', v')` of a flattened parameter, its gradient and moments: one
/// fused pass on the CPU ([`host::adamw`]) and on CubeCL devices (`cube::adamw`); with
/// `fused = false` the composed ops.
pub fn adamw(
    p: Tensor<1>,
    g: Tensor<1>,
    m: Tensor<1>,
    v: Tensor<1>,
    h: ops::AdamWStep,
    fused: bool,
) -> (Tensor<1>, Tensor<1>, Tensor<1>) {
    if fused && has_kernels(&p.device()) {
        return ops::adamw(p, g, m, v, h);
    }
    reference::adamw(p, g, m, v, h)
}

/// `Σ x²` over every element: in f64 on the CPU (one read, the same result for any thread
/// count; the gradient norm's squares), in two fixed passes of f32 partial sums on CubeCL
/// devices ([`start_sum_squares`]), else Burn's square and sum.
pub fn sum_squares<const D: usize>(x: Tensor<D>) -> f64 {
    match start_sum_squares(x) {
        SumSquares::Host(v) => v,
        d => resolve_sum_squares(vec![d])[0],
    }
}

/// A squared L2 norm being computed: on the CPU already summed on the host (as
/// [`sum_squares`]), on GPU devices a one-element tensor still on the device.
pub enum SumSquares {
    Host(f64),
    Device(Tensor<1>),
}

/// Starts `Σ x²` of `x` (see [`SumSquares`]); [`resolve_sum_squares`] finishes many at once.
/// On CubeCL devices titan-rs's own two-pass kernel, not Burn's `square().sum()`: on Mesa's
/// software adapter Burn's sums over more than ≈ 2¹⁸ elements came out wrong (10⁶ squares of
/// normal values: 261 303 instead of 998 623 — earlier seen as moe_debug's step-1 gradient norm
/// 1.25 instead of 1.66), and they may add partials with atomics in a varying order.
pub fn start_sum_squares<const D: usize>(x: Tensor<D>) -> SumSquares {
    if on_cube(&x.device()) {
        SumSquares::Device(ops::sum_squares(x))
    } else if has_kernels(&x.device()) {
        SumSquares::Host(ops::sum_squares(x).into_scalar::<f64>())
    } else {
        let s: f32 = x.square().sum().into_scalar();
        SumSquares::Host(s as f64)
    }
}

/// The values of `sums`, in order: the device ones read back together in one transfer of
/// `4 · n` bytes (one wait per call, not one per tensor: the gradient norm's squares).
pub fn resolve_sum_squares(sums: Vec<SumSquares>) -> Vec<f64> {
    let on_device: Vec<Tensor<1>> =
        sums.iter().filter_map(|s| if let SumSquares::Device(t) = s { Some(t.clone()) } else { None }).collect();
    let mut read = if on_device.is_empty() { Vec::new() } else { transfer::to_host_f32(Tensor::cat(on_device, 0)) }.into_iter();
    sums.into_iter()
        .map(|s| match s {
            SumSquares::Host(v) => v,
            SumSquares::Device(_) => read.next().expect("one value per device sum") as f64,
        })
        .collect()
}

/// `[Σ x]` over every element, differentiable. On CubeCL devices in two fixed passes of f32
/// partial sums ([`ops::KernelOps::sum_all_fwd`]; Burn's sum lost rows there on the software
/// adapter), elsewhere Burn's sum.
pub fn sum_all<const D: usize>(x: Tensor<D>) -> Tensor<1> {
    if has_kernels(&x.device()) {
        return ops::sum_all(x);
    }
    x.sum()
}

/// Cross-entropy summed over positions (`logits: [B, T, V]`, `targets: [B, T]`).
pub fn cross_entropy_sum(logits: Tensor<3>, targets: Tensor<2, Int>, fused: bool) -> Tensor<1> {
    if fused && has_kernels(&logits.device()) {
        return ops::cross_entropy_sum(logits, targets);
    }
    reference::cross_entropy_sum(logits, targets)
}
