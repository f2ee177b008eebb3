//! Autodiff: forward runs the forward primitive on the inner backend; backward runs the paired
//! primitive on the output gradient. Marked compute-bound so a checkpointing strategy never
//! re-runs a collective.

use super::host::Prim;
use super::CollectiveOps;
use burn::backend::autodiff::{
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
    Autodiff,
};
use burn::backend::{tensor::FloatTensor, Backend};

#[derive(Debug)]
struct CollectiveBackward;

impl<B: Backend + CollectiveOps> Backward<B, 1> for CollectiveBackward {
    /// (backward primitive, dim, group)
    type State = (u32, usize, u64);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [parent] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let (bwd, dim, group) = ops.state;
        let grad = B::dist_collective(grad, bwd, Prim::Identity as u32, dim, group);
        if let Some(node) = parent {
            grads.register::<B>(node.id, grad);
        }
    }
}

impl<B: Backend + CollectiveOps, C: CheckpointStrategy> CollectiveOps for Autodiff<B, C> {
    fn dist_collective(x: FloatTensor<Self>, fwd: u32, bwd: u32, dim: usize, group: u64) -> FloatTensor<Self> {
        let guard = x.node();
        let out = B::dist_collective(x.into_primitive(), fwd, Prim::Identity as u32, dim, group);
        match CollectiveBackward.prepare::<C>([guard]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((bwd, dim, group), out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }
}
