//! Cross-entropy summed over tokens (the caller divides by the step's global token count, so
//! gradient accumulation and data parallelism do not change the gradient).

use burn::prelude::*;

/// Sum over all positions of `-log softmax(logits)[target]`. `logits: [B, T, V]`, `targets: [B, T]`.
/// The fused kernel where the device has one (GPU), else the composed reference.
pub fn cross_entropy_sum(logits: Tensor<3>, targets: Tensor<2, Int>) -> Tensor<1> {
    titan_kernels::cross_entropy_sum(logits, targets, true)
}
