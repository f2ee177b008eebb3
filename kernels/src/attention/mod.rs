//! Fused causal attention as a Burn custom op (backend extension) with autodiff.
//!
//! `causal_attention(q, k, v)` with `q: [B, H, T, D]`, `k, v: [B, KV, T, D]` (`H` a multiple of
//! `KV`: grouped-query attention without repeating K/V) equals
//! `softmax(q kᵀ / √D + causal mask) v`. `block_causal_attention(q, k, v, starts)` masks
//! packed documents: query `i` of batch row `b` sees keys `starts[b, i] ..= i`, `starts: [B, T]`
//! the first position of each token's document (TorchTitan's `attn_mask_type = "block_causal"`);
//! the kernels skip key tiles wholly before a query tile's documents. The forward saves the inputs, the output and one
//! log-sum-exp per row — `O(T·D)` per head instead of Burn's autodiff fallback, which keeps
//! several `[B, H, T, T]` tensors — and the backward recomputes probabilities row by row.

mod autodiff;
pub mod cpu;
mod flex;

use burn::backend::{backend_extension, tensor::{FloatTensor, IntTensor}, Backend, Dispatch};
use burn::prelude::*;

/// The output specs `(o, lse)` of the forward: `o` like `q`, `lse: [B, H, T]` in float32
/// (whatever `q`'s type: the backward recomputes probabilities from it).
#[cfg(feature = "cube")]
fn fwd_specs(
    q: &burn::backend::fusion::custom::TensorSpec,
) -> (burn::backend::fusion::custom::TensorSpec, burn::backend::fusion::custom::TensorSpec) {
    let lse = Shape::new([q.shape[0], q.shape[1], q.shape[2]]);
    (q.clone(), burn::backend::fusion::custom::TensorSpec::new(lse, burn::tensor::DType::F32))
}

#[backend_extension(Flex, Autodiff, Cube: cfg(feature = "cube"), Fusion: cfg(feature = "cube"))]
pub trait FusedAttentionOps: Backend {
    /// Output and per-row log-sum-exp `[B, H, T]`.
    #[fusion(meta = |q, _k, _v, _starts, _scale| fwd_specs(q))]
    fn fused_attention_fwd(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        starts: IntTensor<Self>,
        scale: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// `(dq, dk, dv)` from the forward's inputs, output and log-sum-exp, and the output gradient.
    #[allow(clippy::too_many_arguments)]
    #[fusion(meta = |q, k, v, _starts, _o, _lse, _d_o, _scale| (q.clone(), k.clone(), v.clone()))]
    fn fused_attention_bwd(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        starts: IntTensor<Self>,
        o: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        d_o: FloatTensor<Self>,
        scale: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);

    /// The differentiable op.
    #[fusion(dtype = q, shape = q)]
    fn fused_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        starts: IntTensor<Self>,
        scale: f64,
    ) -> FloatTensor<Self>;
}

/// Causal attention with the fused kernel. `q: [B, H, T, D]`, `k, v: [B, KV, T, D]`.
pub fn causal_attention(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>) -> Tensor<4> {
    let [b, _, t, _] = q.dims();
    let starts = Tensor::zeros([b, t], &q.device());
    block_causal_attention(q, k, v, starts)
}

/// Document-masked (block-causal) attention with the fused kernel: query `i` of batch row `b`
/// sees keys `starts[b, i] ..= i` (`starts: [B, T]`, each `≤` its position).
pub fn block_causal_attention(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, starts: Tensor<2, Int>) -> Tensor<4> {
    let [b, h, t, d] = q.dims();
    let kv = k.dims()[1];
    assert!(kv > 0 && h % kv == 0, "fused attention: {h} query heads are not a multiple of {kv} kv heads");
    assert_eq!(starts.dims(), [b, t], "fused attention: document starts must be [batch, seq]");
    let scale = 1.0 / (d as f64).sqrt();
    Tensor::from_dispatch(Dispatch::fused_attention(
        q.into_dispatch(),
        k.into_dispatch(),
        v.into_dispatch(),
        starts.into_dispatch(),
        scale,
    ))
}

#[cfg(test)]
mod tests;
