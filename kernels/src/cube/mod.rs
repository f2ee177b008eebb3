//! CubeCL kernels for GPUs (and Mesa's software Vulkan on CPU-only machines): RMSNorm, SwiGLU's
//! `silu · mul`, rotate-half RoPE, the fused softmax cross-entropy, AdamW, the causal flash
//! attention and the grouped expert GEMM, implementing [`crate::ops::KernelOps`] and [`crate::attention::FusedAttentionOps`]
//! for burn's CubeCL backend. Built with the `wgpu` or `cuda` feature; `CubeBackend` is one type
//! for every CubeCL runtime, so the same code runs on both.

mod adamw;
mod flash;
mod grouped;
mod kernels;
mod launch;
mod reduce;
mod rows;
mod rows_serial;
pub mod tune;
