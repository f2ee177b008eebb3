//! The fused row kernels as one Burn backend extension: RMSNorm, SwiGLU's `silu · mul`,
//! rotate-half RoPE and the softmax cross-entropy, each with a hand-written backward
//! ([`autodiff`]). Implemented for the CPU (flex: [`crate::host`], multithreaded Rust) and for
//! CubeCL devices ([`crate::cube`], with the `wgpu`/`cuda` features).

mod autodiff;
mod flex;

#[cfg(feature = "cube")]
use burn::backend::fusion::custom::TensorSpec;
use burn::backend::{backend_extension, tensor::FloatTensor, tensor::IntTensor, Backend, Dispatch};
use burn::prelude::*;

#[cfg(feature = "cube")]
/// The per-row output spec `[rows]` of a `[rows, cols]` input, in `dtype`.
fn row_spec(x: &TensorSpec, dtype: burn::tensor::DType) -> TensorSpec {
    TensorSpec::new(Shape::new([x.shape[0]]), dtype)
}

/// The scalars of one AdamW step, as `f32` (the values the composed ops use):
/// `m' = m + (g·grad_scale − m)·(1 − β1)`, `v' = v·β2 + g²·(1 − β2)`,
/// `p' = p·decay − m' / (√v' / bias2_sqrt + eps) · step_size`, with `decay = 1 − lr·wd`,
/// `step_size = lr / (1 − β1ᵗ)`, `bias2_sqrt = √(1 − β2ᵗ)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWStep {
    pub one_minus_beta1: f32,
    pub beta2: f32,
    pub one_minus_beta2: f32,
    pub bias2_sqrt: f32,
    pub eps: f32,
    pub decay: f32,
    pub step_size: f32,
    /// Multiplies the gradient first (global-norm clipping); 1 leaves it as it is.
    pub grad_scale: f32,
}

#[backend_extension(Flex, Autodiff, Cube: cfg(feature = "cube"), Fusion: cfg(feature = "cube"))]
pub trait KernelOps: Backend {
    /// RMSNorm over the last dim of `x: [rows, dim]` with weight `w: [dim]`.
    #[fusion(dtype = x, shape = x)]
    fn rms_norm_fwd(x: FloatTensor<Self>, w: FloatTensor<Self>, eps: f32) -> FloatTensor<Self>;

    /// `(dx, dw)`, `dw = Σ_rows dy · x̂`.
    #[fusion(meta = |x, w, _dy, _eps| (x.clone(), w.clone()))]
    fn rms_norm_bwd(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// The differentiable RMSNorm.
    #[fusion(default)]
    fn rms_norm(x: FloatTensor<Self>, w: FloatTensor<Self>, eps: f32) -> FloatTensor<Self> {
        Self::rms_norm_fwd(x, w, eps)
    }

    #[fusion(dtype = gate, shape = gate)]
    fn silu_mul_fwd(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self>;

    /// `(dgate, dup)`.
    #[fusion(meta = |g, _u, _dy| (g.clone(), g.clone()))]
    fn silu_mul_bwd(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// The differentiable `silu(gate) · up`.
    #[fusion(default)]
    fn silu_mul(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::silu_mul_fwd(gate, up)
    }

    /// Rotate-half RoPE of `x: [.., T, D]` with `cos, sin: [T, D]`.
    #[fusion(dtype = x, shape = x)]
    fn rope_fwd(x: FloatTensor<Self>, cos: FloatTensor<Self>, sin: FloatTensor<Self>) -> FloatTensor<Self>;

    /// The differentiable RoPE (gradient with respect to `x` only: the tables are constants).
    #[fusion(default)]
    fn rope(x: FloatTensor<Self>, cos: FloatTensor<Self>, sin: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::rope_fwd(x, cos, sin)
    }

    /// `(loss per row, log-sum-exp per row)` of `logits: [rows, vocab]`, `targets: [rows]`;
    /// the loss in the logits' float type, the log-sum-exp in float32.
    #[fusion(meta = |l, _t| (row_spec(l, l.dtype), row_spec(l, burn::tensor::DType::F32)))]
    fn cross_entropy_fwd(logits: FloatTensor<Self>, targets: IntTensor<Self>)
        -> (FloatTensor<Self>, FloatTensor<Self>);

    #[fusion(dtype = logits, shape = logits)]
    fn cross_entropy_bwd(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        lse: FloatTensor<Self>,
        dloss: FloatTensor<Self>,
    ) -> FloatTensor<Self>;

    /// The differentiable per-row cross-entropy.
    #[fusion(default)]
    fn cross_entropy(logits: FloatTensor<Self>, targets: IntTensor<Self>) -> FloatTensor<Self> {
        Self::cross_entropy_fwd(logits, targets).0
    }

    /// `a · b` of `a: [m, k]`, `b: [k, n]` (either may be a transposed view). The backend's own
    /// matmul except on the CPU, where the product is split into one panel per thread.
    #[fusion(default)]
    fn matmul(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_matmul(a, b)
    }

    /// One AdamW update `(p', m', v')` of a flattened parameter `p` with gradient `g` and moments
    /// `m`, `v` in one pass (not differentiable: optimizer tensors carry no graph).
    #[fusion(meta = |p, _g, m, v, _h| (p.clone(), m.clone(), v.clone()))]
    fn adamw(
        p: FloatTensor<Self>,
        g: FloatTensor<Self>,
        m: FloatTensor<Self>,
        v: FloatTensor<Self>,
        h: AdamWStep,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);

    /// `[Σ x²]` over every element of `x` (not differentiable: gradients' norms), in a fixed
    /// order, as float32: the CPU sums in f64 in one read, CubeCL devices in two passes of f32
    /// partial sums.
    #[fusion(meta = |_x| TensorSpec::new(Shape::new([1]), burn::tensor::DType::F32))]
    fn sum_squares(x: FloatTensor<Self>) -> FloatTensor<Self>;

    /// `[Σ x]` over every element of `x`, in `x`'s float type: Burn's sum on the CPU (the
    /// values it always gave), on CubeCL devices the two fixed passes of [`Self::sum_squares`]
    /// without the squares — Burn's sum there lost rows on Mesa's software adapter (300 001
    /// per-row losses summed to 59 136 instead of 270 640 on CI's machine).
    #[fusion(meta = |x| TensorSpec::new(Shape::new([1]), x.dtype))]
    fn sum_all_fwd(x: FloatTensor<Self>) -> FloatTensor<Self>;

    /// The differentiable [`Self::sum_all_fwd`] (its gradient: the output's, broadcast).
    #[fusion(default)]
    fn sum_all(x: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::sum_all_fwd(x)
    }

    /// The differentiable bias-free linear layer `x · w` (`x: [rows, d_in]`, `w: [d_in, d_out]`),
    /// its three products (forward, `dy · wᵀ`, `xᵀ · dy`) all through [`KernelOps::matmul`].
    #[fusion(default)]
    fn linear(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::matmul(x, w)
    }
}

/// RMSNorm of `x: [B, T, D]`.
pub fn rms_norm(x: Tensor<3>, w: Tensor<1>, eps: f64) -> Tensor<3> {
    let [b, t, d] = x.dims();
    let y: Tensor<2> =
        Tensor::from_dispatch(Dispatch::rms_norm(x.reshape([b * t, d]).into_dispatch(), w.into_dispatch(), eps as f32));
    y.reshape([b, t, d])
}

/// `silu(gate) · up`.
pub fn silu_mul<const D: usize>(gate: Tensor<D>, up: Tensor<D>) -> Tensor<D> {
    Tensor::from_dispatch(Dispatch::silu_mul(gate.into_dispatch(), up.into_dispatch()))
}

/// RoPE of `x: [B, H, T, D]` with tables `[1, 1, T, D]`.
pub fn rope(x: Tensor<4>, cos: Tensor<4>, sin: Tensor<4>) -> Tensor<4> {
    let [_, _, t, d] = x.dims();
    assert!(d % 2 == 0, "rotate-half RoPE needs an even head dim, got {d}");
    let table = |c: Tensor<4>| c.reshape([t, d]).into_dispatch();
    Tensor::from_dispatch(Dispatch::rope(x.into_dispatch(), table(cos), table(sin)))
}

/// One AdamW update `(p', m', v')` of flattened tensors, one pass over them.
pub(crate) fn adamw(
    p: Tensor<1>,
    g: Tensor<1>,
    m: Tensor<1>,
    v: Tensor<1>,
    h: AdamWStep,
) -> (Tensor<1>, Tensor<1>, Tensor<1>) {
    let (p, m, v) = Dispatch::adamw(p.into_dispatch(), g.into_dispatch(), m.into_dispatch(), v.into_dispatch(), h);
    (Tensor::from_dispatch(p), Tensor::from_dispatch(m), Tensor::from_dispatch(v))
}

/// `[Σ x²]` of every element, on `x`'s device.
pub(crate) fn sum_squares<const D: usize>(x: Tensor<D>) -> Tensor<1> {
    Tensor::from_dispatch(Dispatch::sum_squares(x.into_dispatch()))
}

/// `x · w` of `x: [rows, d_in]`, `w: [d_in, d_out]`.
pub fn linear(x: Tensor<2>, w: Tensor<2>) -> Tensor<2> {
    Tensor::from_dispatch(Dispatch::linear(x.into_dispatch(), w.into_dispatch()))
}

/// Cross-entropy summed over positions of `logits: [B, T, V]`, `targets: [B, T]`.
pub fn cross_entropy_sum(logits: Tensor<3>, targets: Tensor<2, Int>) -> Tensor<1> {
    let [b, t, v] = logits.dims();
    let rows: Tensor<1> = Tensor::from_dispatch(Dispatch::cross_entropy(
        logits.reshape([b * t, v]).into_dispatch(),
        targets.reshape([b * t]).into_dispatch(),
    ));
    sum_all(rows)
}

/// `[Σ x]` over every element, differentiable, in a fixed order on CubeCL devices
/// ([`KernelOps::sum_all_fwd`]).
pub fn sum_all<const D: usize>(x: Tensor<D>) -> Tensor<1> {
    Tensor::from_dispatch(Dispatch::sum_all(x.into_dispatch()))
}

#[cfg(test)]
pub(crate) mod tests;
