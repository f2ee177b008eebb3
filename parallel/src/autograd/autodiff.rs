//! Autodiff: forward runs the forward primitive on the inner backend; backward runs the paired
//! primitive on the output gradient. Marked compute-bound so a checkpointing strategy never
//! re-runs a collective — except FSDP's unshard under reshard-after-forward, which is marked
//! memory-bound (recomputable) whatever the device's strategy: the ops reading the gathered
//! parameter then keep the recipe (the shard, which is alive anyway) instead of the value, and
//! their backward runs the all-gather again. Burn's autodiff keeps a recomputed value until its
//! last reader's backward, so the parameter is gathered twice per step, as FSDP2 does.

use super::host::Prim;
use super::{staged, CollectiveOps};
use burn::backend::autodiff::{
    checkpoint::{
        base::Checkpointer,
        retro_forward::RetroForward,
        state::BackwardStates,
        strategy::{BalancedCheckpointing, CheckpointStrategy},
    },
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
    Autodiff, NodeId,
};
use burn::backend::{tensor::FloatTensor, Backend, TensorMetadata};
use std::marker::PhantomData;

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

#[derive(Debug)]
struct UnshardBackward;

impl<B: Backend + CollectiveOps> Backward<B, 1> for UnshardBackward {
    /// (group, rows per shard, parameter key)
    type State = (u64, usize, u64);

    /// Under overlap the reduce-scatter is queued on the communication stream and its result
    /// joins the parameter's gradient after backward (`fsdp::overlap::end_step`).
    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [parent] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let (group, chunk, key) = ops.state;
        if let (Some(grad), Some(node)) = (staged::reshard_grad::<B>(grad, group, chunk, key), parent) {
            grads.register::<B>(node.id, grad);
        }
    }
}

#[derive(Debug)]
struct GradReady;

impl<B: Backend + CollectiveOps> Backward<B, 1> for GradReady {
    /// The parameter's key.
    type State = u64;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [parent] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        if grad.dtype() == burn::tensor::DType::F32 {
            let g = grad.clone();
            crate::ddp::overlap::on_grad(ops.state, || staged::host_f32::<B>(g));
        }
        if let Some(node) = parent {
            grads.register::<B>(node.id, grad);
        }
    }
}

/// The unshard again, in backward, from the saved shard.
#[derive(Debug)]
struct RetroUnshard<B: Backend> {
    shard: NodeId,
    group: u64,
    rows: usize,
    key: u64,
    _b: PhantomData<B>,
}

impl<B: Backend + CollectiveOps> RetroForward for RetroUnshard<B> {
    fn forward(&self, states: &mut BackwardStates, out: NodeId) {
        let shard = states.get_state::<FloatTensor<B>>(&self.shard);
        states.save(out, B::fsdp_unshard(shard, self.group, self.rows, false, self.key));
    }
}

impl<B: Backend + CollectiveOps, C: CheckpointStrategy> CollectiveOps for Autodiff<B, C> {
    fn fsdp_unshard(x: FloatTensor<Self>, group: u64, rows: usize, reshard: bool, key: u64) -> FloatTensor<Self> {
        let chunk = x.shape()[0];
        let out = B::fsdp_unshard(x.clone().into_primitive(), group, rows, false, key);
        let state = (group, chunk, key);
        if !reshard {
            return match UnshardBackward.prepare::<C>([x.node()]).compute_bound().stateful() {
                OpsKind::Tracked(prep) => prep.finish(state, out),
                OpsKind::UnTracked(prep) => prep.finish(out),
            };
        }
        let retro = RetroUnshard::<B> { shard: x.node().id(), group, rows, key, _b: PhantomData };
        let prep = UnshardBackward.prepare::<BalancedCheckpointing>([x.node()]);
        match prep.memory_bound().retro_forward(retro).parents([&x]).stateful() {
            OpsKind::Tracked(prep) => prep.finish(state, out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }

    fn grad_ready(x: FloatTensor<Self>, key: u64) -> FloatTensor<Self> {
        let out = B::grad_ready(x.clone().into_primitive(), key);
        match GradReady.prepare::<C>([x.node()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish(key, out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }

    fn dist_collective(x: FloatTensor<Self>, fwd: u32, bwd: u32, dim: usize, group: u64) -> FloatTensor<Self> {
        let guard = x.node();
        let out = B::dist_collective(x.into_primitive(), fwd, Prim::Identity as u32, dim, group);
        match CollectiveBackward.prepare::<C>([guard]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((bwd, dim, group), out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }
}
