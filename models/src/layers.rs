//! The three leaf layers: bias-free linear, token embedding, RMSNorm.
//!
//! Own small modules instead of `burn::nn` ones so parameter paths read like TorchTitan's
//! (`….wq.weight`, `….attention_norm.weight`) and are created lazily with path-seeded init.

use crate::init::{lazy_param, Init};
use burn::module::Param;
use burn::prelude::*;

/// `y = x · W` with `W` stored `[d_in, d_out]` (Burn's layout; PyTorch's transposed).
#[derive(Module, Debug)]
pub struct Linear {
    pub weight: Param<Tensor<2>>,
    /// Use the kernels' linear (on the CPU: products split by output panels) where the device
    /// has it.
    pub fused: bool,
}

impl Linear {
    pub fn new(seed: u64, path: &str, d_in: usize, d_out: usize, std: f64, device: &Device) -> Self {
        let path = format!("{path}.weight");
        Self { weight: lazy_param(seed, &path, [d_in, d_out], Init::TruncNormal { std }, device), fused: true }
    }

    /// Computes in `x`'s float type: under mixed precision the (float32 master) weight is cast
    /// to it, and the cast's backward returns a float32 gradient.
    ///
    /// The leading dims are folded into the rows first, so the product (and the weight gradient
    /// `xᵀ · dy` in backward) is one `[rows, d_in] · [d_in, d_out]` GEMM rather than a batched
    /// matmul over a broadcast weight.
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let w = self.weight.val().cast(x.dtype());
        let mut dims = x.dims();
        let d_in = dims[D - 1];
        let rows = dims[..D - 1].iter().product::<usize>();
        let y = titan_kernels::linear(x.reshape([rows, d_in]), w, self.fused);
        dims[D - 1] = y.dims()[1];
        y.reshape(dims)
    }
}

/// Token embedding table `[vocab, dim]`.
#[derive(Module, Debug)]
pub struct Embedding {
    pub weight: Param<Tensor<2>>,
}

impl Embedding {
    pub fn new(seed: u64, path: &str, vocab: usize, dim: usize, device: &Device) -> Self {
        let path = format!("{path}.weight");
        Self { weight: lazy_param(seed, &path, [vocab, dim], Init::Normal { std: 1.0 }, device) }
    }

    pub fn forward(&self, ids: Tensor<2, Int>) -> Tensor<3> {
        burn::tensor::module::embedding(self.weight.val(), ids)
    }
}

/// RMSNorm: `x / sqrt(mean(x²) + eps) · w`.
#[derive(Module, Debug)]
pub struct RmsNorm {
    pub weight: Param<Tensor<1>>,
    pub eps: f64,
    /// Use the fused kernel (`titan_kernels`) where the device has one.
    pub fused: bool,
}

impl RmsNorm {
    pub fn new(seed: u64, path: &str, dim: usize, eps: f64, device: &Device) -> Self {
        let path = format!("{path}.weight");
        Self { weight: lazy_param(seed, &path, [dim], Init::Ones, device), eps, fused: true }
    }

    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let w = self.weight.val().cast(x.dtype());
        titan_kernels::rms_norm(x, w, self.eps, self.fused)
    }
}
