//! The points of the forward pass where a parallelism may move activations — where TorchTitan's
//! `parallelize_module` installs its input/output hooks. The model calls them; it never
//! communicates itself. Without hooks (the default) each point is the identity (the embedding a
//! plain lookup).

use burn::prelude::*;
use std::fmt::Debug;
use std::sync::Arc;

pub trait ActivationHooks: Debug + Send + Sync {
    /// The token embedding: `weight` as this rank stores it, full token ids `[B, T]` → the
    /// residual stream as the blocks expect it.
    fn embed(&self, weight: Tensor<2>, ids: Tensor<2, Int>) -> Tensor<3>;
    /// Before a projection whose output dimension is split over ranks (wq/wk/wv, w1/w3, output).
    fn column_input(&self, x: Tensor<3>) -> Tensor<3>;
    /// After a projection whose input dimension is split over ranks (wo, w2): partial sums in,
    /// the residual stream's layout out.
    fn row_output(&self, y: Tensor<3>) -> Tensor<3>;
    /// Attention of `q: [B, H, T, D]` over `k, v: [B, KV, T, D]`, causal (within documents when
    /// `starts` is given): the local kernel, unless the sequence is split over ranks (context
    /// parallelism).
    fn attention(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, starts: Option<Tensor<2, Int>>, fused: bool) -> Tensor<4> {
        titan_kernels::attention(q, k, v, starts, fused)
    }
}

/// The hooks a model carries (none by default).
#[derive(Debug, Clone, Default)]
pub struct Hooks(pub Option<Arc<dyn ActivationHooks>>);

impl Hooks {
    pub fn embed(&self, weight: Tensor<2>, ids: Tensor<2, Int>) -> Tensor<3> {
        match &self.0 {
            Some(h) => h.embed(weight, ids),
            None => burn::tensor::module::embedding(weight, ids),
        }
    }

    pub fn column_input(&self, x: Tensor<3>) -> Tensor<3> {
        match &self.0 {
            Some(h) => h.column_input(x),
            None => x,
        }
    }

    pub fn attention(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, starts: Option<Tensor<2, Int>>, fused: bool) -> Tensor<4> {
        match &self.0 {
            Some(h) => h.attention(q, k, v, starts, fused),
            None => titan_kernels::attention(q, k, v, starts, fused),
        }
    }

    pub fn row_output(&self, y: Tensor<3>) -> Tensor<3> {
        match &self.0 {
            Some(h) => h.row_output(y),
            None => y,
        }
    }
}
