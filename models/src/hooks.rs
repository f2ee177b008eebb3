//! The points of the forward pass where a parallelism may move activations — where TorchTitan's
//! `parallelize_module` installs its input/output hooks. The model calls them; it never
//! communicates itself. Without hooks (the default) each point is the identity (the embedding a
//! plain lookup).

use burn::prelude::*;
use std::fmt::Debug;
use std::sync::Arc;

pub trait ActivationHooks: Debug + Send + Sync {
    /// The hooks this one wraps (context and expert parallelism change one point each and
    /// leave the others to tensor parallelism's hooks, or none): every point not overridden
    /// goes to them.
    fn inner(&self) -> Option<&Hooks> {
        None
    }
    /// Where the points this hook does not override go: the inner hooks, or the plain model.
    fn next(&self) -> &Hooks {
        static PLAIN: Hooks = Hooks(None);
        self.inner().unwrap_or(&PLAIN)
    }
    /// The token embedding: `weight` as this rank stores it, full token ids `[B, T]` → the
    /// residual stream as the blocks expect it.
    fn embed(&self, weight: Tensor<2>, ids: Tensor<2, Int>) -> Tensor<3> {
        self.next().embed(weight, ids)
    }
    /// Before a projection whose output dimension is split over ranks (wq/wk/wv, w1/w3, output).
    fn column_input(&self, x: Tensor<3>) -> Tensor<3> {
        self.next().column_input(x)
    }
    /// After a projection whose input dimension is split over ranks (wo, w2): partial sums in,
    /// the residual stream's layout out.
    fn row_output(&self, y: Tensor<3>) -> Tensor<3> {
        self.next().row_output(y)
    }
    /// Attention of `q: [B, H, T, D]` over `k, v: [B, KV, T, D]`, causal (within documents when
    /// `starts` is given): the local kernel, unless the sequence is split over ranks (context
    /// parallelism).
    fn attention(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, starts: Option<Tensor<2, Int>>, fused: bool) -> Tensor<4> {
        self.next().attention(q, k, v, starts, fused)
    }
    /// Before a mixture-of-experts FFN: the tokens this rank routes (tensor parallelism without
    /// sequence parallelism keeps its share of the positions, as TorchTitan's token split).
    fn moe_input(&self, x: Tensor<3>) -> Tensor<3> {
        self.next().moe_input(x)
    }
    /// After a mixture-of-experts FFN: back to the residual stream's layout.
    fn moe_output(&self, y: Tensor<3>) -> Tensor<3> {
        self.next().moe_output(y)
    }
    /// The routed experts over `xs` (rows sorted by expert, `counts[e]` rows for each of the
    /// model's experts): `local` computes the experts this rank holds over rows sorted by them.
    /// Expert parallelism moves the rows to their experts' ranks and back.
    fn experts(&self, xs: Tensor<2>, counts: &[usize], local: &dyn Fn(Tensor<2>, &[usize]) -> Tensor<2>) -> Tensor<2> {
        self.next().experts(xs, counts, local)
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

    pub fn moe_input(&self, x: Tensor<3>) -> Tensor<3> {
        match &self.0 {
            Some(h) => h.moe_input(x),
            None => x,
        }
    }

    pub fn moe_output(&self, y: Tensor<3>) -> Tensor<3> {
        match &self.0 {
            Some(h) => h.moe_output(y),
            None => y,
        }
    }

    pub fn experts(&self, xs: Tensor<2>, counts: &[usize], local: &dyn Fn(Tensor<2>, &[usize]) -> Tensor<2>) -> Tensor<2> {
        match &self.0 {
            Some(h) => h.experts(xs, counts, local),
            None => local(xs, counts),
        }
    }

    pub fn row_output(&self, y: Tensor<3>) -> Tensor<3> {
        match &self.0 {
            Some(h) => h.row_output(y),
            None => y,
        }
    }
}
