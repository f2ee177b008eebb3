//! Cross-entropy summed over tokens (the caller divides by the step's global token count, so
//! gradient accumulation and data parallelism do not change the gradient).

use burn::prelude::*;

/// Sum over all positions of `-log softmax(logits)[target]`. `logits: [B, T, V]`, `targets: [B, T]`.
pub fn cross_entropy_sum(logits: Tensor<3>, targets: Tensor<2, Int>) -> Tensor<1> {
    let [b, t, v] = logits.dims();
    let logp = burn::tensor::activation::log_softmax(logits.reshape([b * t, v]), 1);
    let picked = logp.gather(1, targets.reshape([b * t, 1]));
    picked.sum().neg()
}
