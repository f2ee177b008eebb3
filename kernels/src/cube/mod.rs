//! CubeCL kernels for GPUs (and Mesa's software Vulkan on CPU-only machines): RMSNorm, SwiGLU's
//! `silu · mul`, rotate-half RoPE, the fused softmax cross-entropy, AdamW, the causal flash
//! attention and the grouped expert GEMM, implementing [`crate::ops::KernelOps`] and [`crate::attention::FusedAttentionOps`]
//! for burn's CubeCL backend. Built with the `wgpu` or `cuda` feature; `CubeBackend` is one type
//! for every CubeCL runtime, so the same code runs on both.

mod adamw;
pub mod flash;
mod grouped;
mod kernels;
mod launch;
pub mod offline;
#[cfg(feature = "cuda")]
pub mod ptx;
mod reduce;
mod rows;
mod rows_serial;
pub mod tune;

use burn::tensor::{DType, Shape};
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;

/// The shape of `t` as a vector.
fn dims(t: &CubeTensor) -> Vec<usize> {
    t.meta.shape().iter().copied().collect()
}

/// An uninitialised `[shape]` tensor of `dtype` on `like`'s device.
fn empty(like: &CubeTensor, shape: Vec<usize>, dtype: DType) -> CubeTensor {
    empty_device_dtype(like.client.clone(), like.device.clone(), Shape::from(shape), dtype)
}

/// Whether kernels unroll their loops over compile-time sizes on `like`'s device: on a GPU,
/// not on a software adapter (no physical device), whose compiler splits every barrier into
/// coroutines and ran for over 15 minutes on the unrolled attention kernels.
fn unroll_loops(like: &CubeTensor) -> bool {
    like.client.properties().identity.physical.is_some()
}
