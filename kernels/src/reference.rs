//! The composed-Burn-ops reference path of every fused kernel: what runs where a device has no
//! kernel, and what the kernels are tested against.

use crate::ops::AdamWStep;
use burn::prelude::*;

/// RMSNorm: `x / sqrt(mean(x²) + eps) · w` over the last dim.
pub fn rms_norm(x: Tensor<3>, w: Tensor<1>, eps: f64) -> Tensor<3> {
    let rms = x.clone().square().mean_dim(2).add_scalar(eps).sqrt();
    x.div(rms).mul(w.unsqueeze::<3>())
}

/// `silu(gate) · up`.
pub fn silu_mul<const D: usize>(gate: Tensor<D>, up: Tensor<D>) -> Tensor<D> {
    burn::tensor::activation::silu(gate) * up
}

/// Rotate-half RoPE of `x: [B, H, T, D]` with tables `[1 or B, 1, T, D]`.
pub fn rope(x: Tensor<4>, cos: Tensor<4>, sin: Tensor<4>) -> Tensor<4> {
    let [b, h, t, d] = x.dims();
    let half = d / 2;
    let x1 = x.clone().slice([0..b, 0..h, 0..t, 0..half]);
    let x2 = x.clone().slice([0..b, 0..h, 0..t, half..d]);
    let rotated = Tensor::cat(vec![x2.neg(), x1], 3);
    x * cos + rotated * sin
}

/// Attention `softmax(q kᵀ / √D + mask) v` with Burn's composed op: `q: [B, H, T, D]`,
/// `k, v: [B, KV, T, D]` (each kv head repeated for its `H / KV` query heads). Causal; with
/// `starts: [B, T]`, query `i` of batch row `b` also sees no key before `starts[b, i]` (its
/// document's first position: block-causal).
pub fn attention(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, starts: Option<Tensor<2, Int>>) -> Tensor<4> {
    use burn::tensor::{module, ops::AttentionModuleOptions};
    let [b, h, t, _] = q.dims();
    let rep = h / k.dims()[1];
    let mask = starts.map(|s| {
        let keys: Tensor<4, Int> = Tensor::<1, Int>::arange(0..t as i64, &q.device()).reshape([1, 1, 1, t]);
        keys.expand([b, h, t, t]).lower(s.reshape([b, 1, t, 1]).expand([b, h, t, t]))
    });
    let opts = AttentionModuleOptions { is_causal: true, ..Default::default() };
    module::attention(q, repeat_kv(k, rep), repeat_kv(v, rep), mask, None, opts)
}

/// `[B, kv, T, d]` → `[B, kv·rep, T, d]`, each kv head shared by `rep` query heads.
fn repeat_kv(x: Tensor<4>, rep: usize) -> Tensor<4> {
    if rep == 1 {
        return x;
    }
    let [b, kv, t, d] = x.dims();
    x.unsqueeze_dim::<5>(2).expand([b, kv, rep, t, d]).reshape([b, kv * rep, t, d])
}

/// Sum over all positions of `-log softmax(logits)[target]`. `logits: [B, T, V]`, `targets: [B, T]`.
pub fn cross_entropy_sum(logits: Tensor<3>, targets: Tensor<2, Int>) -> Tensor<1> {
    let [b, t, v] = logits.dims();
    let logp = burn::tensor::activation::log_softmax(logits.reshape([b * t, v]), 1);
    let picked = logp.gather(1, targets.reshape([b * t, 1]));
    picked.sum().neg()
}

/// One AdamW update `(p', m', v')` (see [`AdamWStep`] for the formula).
pub fn adamw(
    p: Tensor<1>,
    g: Tensor<1>,
    m: Tensor<1>,
    v: Tensor<1>,
    h: AdamWStep,
) -> (Tensor<1>, Tensor<1>, Tensor<1>) {
    let g = if h.grad_scale != 1.0 { g.mul_scalar(h.grad_scale) } else { g };
    let m = m.clone() + (g.clone() - m).mul_scalar(h.one_minus_beta1);
    let v = v.mul_scalar(h.beta2) + (g.clone() * g).mul_scalar(h.one_minus_beta2);
    let denom = v.clone().sqrt().div_scalar(h.bias2_sqrt).add_scalar(h.eps);
    let p = p.mul_scalar(h.decay) - (m.clone() / denom).mul_scalar(h.step_size);
    (p, m, v)
}
