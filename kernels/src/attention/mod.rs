//! Fused causal attention as a Burn custom op (backend extension) with autodiff.
//!
//! `causal_attention(q, k, v)` with `q: [B, H, T, D]`, `k, v: [B, KV, T, D]` (`H` a multiple of
//! `KV`: grouped-query attention without repeating K/V) equals
//! `softmax(q kᵀ / √D + causal mask) v`. The forward saves the inputs, the output and one
//! log-sum-exp per row — `O(T·D)` per head instead of Burn's autodiff fallback, which keeps
//! several `[B, H, T, T]` tensors — and the backward recomputes probabilities row by row.

mod autodiff;
pub mod cpu;
mod flex;

use burn::backend::{backend_extension, tensor::FloatTensor, Backend, Dispatch};
use burn::prelude::*;

#[backend_extension(Flex, Autodiff)]
pub trait FusedAttentionOps: Backend {
    /// Output and per-row log-sum-exp `[B, H, T]`.
    fn fused_causal_attention_fwd(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        scale: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// `(dq, dk, dv)` from the forward's inputs, output and log-sum-exp, and the output gradient.
    #[allow(clippy::too_many_arguments)]
    fn fused_causal_attention_bwd(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        o: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        d_o: FloatTensor<Self>,
        scale: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);

    /// The differentiable op.
    fn fused_causal_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        scale: f64,
    ) -> FloatTensor<Self>;
}

/// Whether [`causal_attention`] runs on this device (the CPU flex backend, with or without
/// autodiff).
pub fn supports_fused_attention(device: &Device) -> bool {
    device.clone().without_autodiff() == Device::flex()
}

/// Causal attention with the fused kernel. `q: [B, H, T, D]`, `k, v: [B, KV, T, D]`.
pub fn causal_attention(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>) -> Tensor<4> {
    let [_, h, _, d] = q.dims();
    let kv = k.dims()[1];
    assert!(kv > 0 && h % kv == 0, "fused attention: {h} query heads are not a multiple of {kv} kv heads");
    let scale = 1.0 / (d as f64).sqrt();
    Tensor::from_dispatch(Dispatch::fused_causal_attention(
        q.into_dispatch(),
        k.into_dispatch(),
        v.into_dispatch(),
        scale,
    ))
}

#[cfg(test)]
mod tests;
