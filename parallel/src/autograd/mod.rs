//! Differentiable collectives on Burn tensors, as custom autodiff ops.
//!
//! Each op is a pair (forward primitive, backward primitive):
//!
//! | op | forward | backward |
//! |---|---|---|
//! | [`copy_to_group`] (Megatron f) | identity | all-reduce |
//! | [`reduce_from_group`] (Megatron g) | all-reduce | identity |
//! | [`gather_from_group`] | all-gather along `dim` | split along `dim` |
//! | [`split_to_group`] | split along `dim` | all-gather along `dim` |
//! | [`reduce_scatter_to_group`] | reduce-scatter along `dim` | all-gather along `dim` |
//! | [`all_gather_to_group`] | all-gather along `dim` | reduce-scatter along `dim` |
//! | [`fsdp_all_gather`] | all-gather along dim 0 | reduce-scatter along dim 0 |
//! | [`fsdp_unshard`] | all-gather along dim 0, first `rows` kept | zero-pad, reduce-scatter |
//!
//! [`fsdp_unshard`] with `reshard` set is FSDP's reshard after forward: its output is marked
//! recomputable, so the ops that read it (the linears) keep a recipe instead of the gathered
//! value; their backward all-gathers the shard again (see `autodiff.rs`).
//!
//! Backward steps run in an order fixed by the graph's shape, so ranks with identical graphs
//! issue these collectives in the same order (tested).

mod autodiff;
pub mod host;
mod staged;

use crate::registry::GroupHandle;
use burn::backend::{backend_extension, tensor::FloatTensor, Backend, Dispatch};
use burn::prelude::*;
use host::Prim;

/// On every device the collective is staged through host memory (the tensor read, the
/// communicator's collective, the result written back to the tensor's device): the portable
/// path, for every vendor. The Fusion backend runs it eagerly (the default body, not a lazy
/// fused op), so collectives keep program order with the communicator's other calls.
#[backend_extension(Flex, Autodiff, Cube: cfg(feature = "cube"), Fusion: cfg(feature = "cube"))]
pub trait CollectiveOps: Backend {
    /// Runs primitive `fwd` (a [`Prim`] code) on group `group`; under autodiff the gradient is
    /// primitive `bwd` of the output gradient.
    #[fusion(default)]
    fn dist_collective(x: FloatTensor<Self>, fwd: u32, bwd: u32, dim: usize, group: u64) -> FloatTensor<Self> {
        let _ = bwd;
        staged::run::<Self>(x, Prim::from_code(fwd), dim, group)
    }

    /// FSDP's parameter read: the shards of group `group` all-gathered along dim 0 and cut to
    /// `rows`; under autodiff the gradient is zero-padded back and reduce-scattered. `reshard`:
    /// the gathered value is not kept for backward but gathered again there.
    /// `key`: the parameter's key in [`crate::fsdp::Sharding::keys`] (the overlap's handle).
    #[fusion(default)]
    fn fsdp_unshard(x: FloatTensor<Self>, group: u64, rows: usize, reshard: bool, key: u64) -> FloatTensor<Self> {
        let _ = reshard;
        staged::unshard::<Self>(x, group, rows, key)
    }

    /// DDP's gradient hook on a parameter read: identity; under autodiff the gradient passing
    /// back is also handed to `ddp::overlap` (parameter `key`), which all-reduces it as soon as
    /// it is complete.
    #[fusion(default)]
    fn grad_ready(x: FloatTensor<Self>, key: u64) -> FloatTensor<Self> {
        let _ = key;
        x
    }
}

impl CollectiveOps for burn::backend::Flex {}

#[cfg(feature = "cube")]
impl CollectiveOps for burn_cubecl::CubeBackend {}

fn op<const D: usize>(x: Tensor<D>, fwd: Prim, bwd: Prim, dim: usize, g: &GroupHandle) -> Tensor<D> {
    op_on(x, fwd, bwd, dim, g.id())
}

fn op_on<const D: usize>(x: Tensor<D>, fwd: Prim, bwd: Prim, dim: usize, group: u64) -> Tensor<D> {
    assert!(dim < D, "collective along dim {dim} of a {D}-d tensor");
    Tensor::from_dispatch(Dispatch::dist_collective(x.into_dispatch(), fwd as u32, bwd as u32, dim, group))
}

/// Megatron's f: identity forward, all-reduce of the gradient.
pub fn copy_to_group<const D: usize>(x: Tensor<D>, g: &GroupHandle) -> Tensor<D> {
    op(x, Prim::Identity, Prim::AllReduce, 0, g)
}

/// Megatron's g: all-reduce forward, identity backward.
pub fn reduce_from_group<const D: usize>(x: Tensor<D>, g: &GroupHandle) -> Tensor<D> {
    op(x, Prim::AllReduce, Prim::Identity, 0, g)
}

/// All-gather along `dim` forward; the gradient keeps this rank's part.
pub fn gather_from_group<const D: usize>(x: Tensor<D>, dim: usize, g: &GroupHandle) -> Tensor<D> {
    op(x, Prim::AllGather, Prim::Split, dim, g)
}

/// Keeps this rank's part along `dim` forward; the gradient is all-gathered.
pub fn split_to_group<const D: usize>(x: Tensor<D>, dim: usize, g: &GroupHandle) -> Tensor<D> {
    op(x, Prim::Split, Prim::AllGather, dim, g)
}

/// Reduce-scatter along `dim` forward (sequence parallelism after a row-parallel layer); the
/// gradient is all-gathered.
pub fn reduce_scatter_to_group<const D: usize>(x: Tensor<D>, dim: usize, g: &GroupHandle) -> Tensor<D> {
    op(x, Prim::ReduceScatter, Prim::AllGather, dim, g)
}

/// All-gather along `dim` forward, reduce-scatter of the gradient (Megatron's sequence-parallel
/// gather before a column-parallel layer: every rank's gradient is partial for every position).
pub fn all_gather_to_group<const D: usize>(x: Tensor<D>, dim: usize, g: &GroupHandle) -> Tensor<D> {
    op(x, Prim::AllGather, Prim::ReduceScatter, dim, g)
}

/// FSDP's parameter op: all-gather the dim-0 shards forward, reduce-scatter the gradient.
pub fn fsdp_all_gather<const D: usize>(shard: Tensor<D>, g: &GroupHandle) -> Tensor<D> {
    fsdp_all_gather_on(shard, g.id())
}

/// [`fsdp_all_gather`] on a group named by its registry id (what a parameter can store).
pub fn fsdp_all_gather_on<const D: usize>(shard: Tensor<D>, group: u64) -> Tensor<D> {
    op_on(shard, Prim::AllGather, Prim::ReduceScatter, 0, group)
}

/// `x` through DDP's gradient hook for parameter `key` (see [`CollectiveOps::grad_ready`]).
pub fn grad_ready<const D: usize>(x: Tensor<D>, key: u64) -> Tensor<D> {
    Tensor::from_dispatch(Dispatch::grad_ready(x.into_dispatch(), key))
}

/// FSDP's parameter op on a parameter of `rows` rows sharded over `group` (see
/// [`CollectiveOps::fsdp_unshard`]); `reshard`: gathered again in backward instead of kept;
/// `key`: its key in [`crate::fsdp::Sharding::keys`].
pub fn fsdp_unshard<const D: usize>(shard: Tensor<D>, group: u64, rows: usize, reshard: bool, key: u64) -> Tensor<D> {
    Tensor::from_dispatch(Dispatch::fsdp_unshard(shard.into_dispatch(), group, rows, reshard, key))
}

#[cfg(test)]
mod tests;
