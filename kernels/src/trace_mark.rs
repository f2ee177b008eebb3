//! Where a layer's backward pass starts and ends, for step traces: an identity op whose
//! backward reports a [`titan_profiling`] marker when the gradient passes through it. Placed at
//! a block's output (the gradient arrives: its backward begins) and input (the gradient leaves:
//! it ends). Only on the CPU and only while the rank is recording; elsewhere the tensor passes
//! untouched, so training graphs are unchanged when not profiling.

use burn::backend::autodiff::{
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
    Autodiff,
};
use burn::backend::{backend_extension, tensor::FloatTensor, Backend, Dispatch, Flex};
use burn::prelude::*;
use titan_profiling::Boundary;

#[backend_extension(Flex, Autodiff)]
pub trait TraceOps: Backend {
    /// Identity; under autodiff the backward reports `marker`.
    fn trace_mark(x: FloatTensor<Self>, marker: u64) -> FloatTensor<Self>;
}

impl TraceOps for Flex {
    fn trace_mark(x: FloatTensor<Self>, _marker: u64) -> FloatTensor<Self> {
        x
    }
}

#[derive(Debug)]
struct MarkBackward;

impl<B: Backend> Backward<B, 1> for MarkBackward {
    type State = u64;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _c: &mut Checkpointer) {
        let [parent] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        titan_profiling::on_marker(ops.state, "backward");
        if let Some(node) = parent {
            grads.register::<B>(node.id, grad);
        }
    }
}

impl<B: Backend + TraceOps, C: CheckpointStrategy> TraceOps for Autodiff<B, C> {
    fn trace_mark(x: FloatTensor<Self>, marker: u64) -> FloatTensor<Self> {
        let guard = x.node();
        let out = B::trace_mark(x.into_primitive(), marker);
        match MarkBackward.prepare::<C>([guard]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish(marker, out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }
}

/// `x` unchanged; while this thread records a trace on the CPU, the gradient passing back
/// through it opens (`Boundary::Begin`) or closes (`Boundary::End`) the span `name`.
pub fn backward_boundary<const D: usize>(x: Tensor<D>, name: &str, boundary: Boundary) -> Tensor<D> {
    if !titan_profiling::is_active() || crate::on_cube(&x.device()) {
        return x;
    }
    let Some(marker) = titan_profiling::marker(name, boundary) else {
        return x;
    };
    Tensor::from_dispatch(Dispatch::trace_mark(x.into_dispatch(), marker))
}
