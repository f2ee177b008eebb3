//! Backward passes of the fused ops: each forward saves what its backward kernel needs.

use super::{AdamWStep, KernelOps};
use burn::backend::autodiff::{
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
    Autodiff,
};
use burn::backend::{tensor::FloatTensor, tensor::IntTensor, AutodiffBackend, Backend, TensorMetadata};
use burn::tensor::Shape;

#[derive(Debug)]
struct RmsNormBackward;

impl<B: Backend + KernelOps> Backward<B, 2> for RmsNormBackward {
    type State = (FloatTensor<B>, FloatTensor<B>, f32);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _c: &mut Checkpointer) {
        let [node_x, node_w] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        let (x, w, eps) = ops.state;
        let d = w.shape()[0];
        let (dx, dw_rows) = B::rms_norm_bwd(x, w, dy, eps);
        let dw = B::float_reshape(B::float_sum_dim(dw_rows, 0), Shape::new([d]));
        for (node, grad) in [(node_x, dx), (node_w, dw)] {
            if let Some(node) = node {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

#[derive(Debug)]
struct SiluMulBackward;

impl<B: Backend + KernelOps> Backward<B, 2> for SiluMulBackward {
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _c: &mut Checkpointer) {
        let [node_g, node_u] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        let (g, u) = ops.state;
        let (dg, du) = B::silu_mul_bwd(g, u, dy);
        for (node, grad) in [(node_g, dg), (node_u, du)] {
            if let Some(node) = node {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

#[derive(Debug)]
struct RopeBackward;

impl<B: Backend + KernelOps> Backward<B, 1> for RopeBackward {
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _c: &mut Checkpointer) {
        let [node_x] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        let (cos, sin) = ops.state;
        // The rotation is orthogonal: its transpose is the rotation by −angle.
        let dx = B::rope_fwd(dy, cos, B::float_neg(sin));
        if let Some(node) = node_x {
            grads.register::<B>(node.id, dx);
        }
    }
}

#[derive(Debug)]
struct CrossEntropyBackward;

impl<B: Backend + KernelOps> Backward<B, 1> for CrossEntropyBackward {
    type State = (FloatTensor<B>, IntTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _c: &mut Checkpointer) {
        let [node_logits] = ops.parents;
        let dloss = grads.consume::<B>(&ops.node);
        let (logits, targets, lse) = ops.state;
        let dlogits = B::cross_entropy_bwd(logits, targets, lse, dloss);
        if let Some(node) = node_logits {
            grads.register::<B>(node.id, dlogits);
        }
    }
}

#[derive(Debug)]
struct LinearBackward;

impl<B: Backend + KernelOps> Backward<B, 2> for LinearBackward {
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _c: &mut Checkpointer) {
        let [node_x, node_w] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        let (x, w) = ops.state;
        // dx = dy · wᵀ, dw = xᵀ · dy; the transposes are views, the products read them strided.
        if let Some(node) = node_w {
            grads.register::<B>(node.id, B::matmul(B::float_transpose(x), dy.clone()));
        }
        if let Some(node) = node_x {
            grads.register::<B>(node.id, B::matmul(dy, B::float_transpose(w)));
        }
    }
}

impl<B: Backend + KernelOps, C: CheckpointStrategy> KernelOps for Autodiff<B, C> {
    fn rms_norm_fwd(x: FloatTensor<Self>, w: FloatTensor<Self>, eps: f32) -> FloatTensor<Self> {
        Self::from_inner(B::rms_norm_fwd(x.into_primitive(), w.into_primitive(), eps))
    }

    fn rms_norm_bwd(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (dx, dw) = B::rms_norm_bwd(x.into_primitive(), w.into_primitive(), dy.into_primitive(), eps);
        (Self::from_inner(dx), Self::from_inner(dw))
    }

    fn rms_norm(x: FloatTensor<Self>, w: FloatTensor<Self>, eps: f32) -> FloatTensor<Self> {
        let guards = [x.node(), w.node()];
        let (x, w) = (x.into_primitive(), w.into_primitive());
        let y = B::rms_norm_fwd(x.clone(), w.clone(), eps);
        match RmsNormBackward.prepare::<C>(guards).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((x, w, eps), y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        }
    }

    fn silu_mul_fwd(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::from_inner(B::silu_mul_fwd(gate.into_primitive(), up.into_primitive()))
    }

    fn silu_mul_bwd(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (dg, du) = B::silu_mul_bwd(gate.into_primitive(), up.into_primitive(), dy.into_primitive());
        (Self::from_inner(dg), Self::from_inner(du))
    }

    fn silu_mul(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        let guards = [gate.node(), up.node()];
        let (g, u) = (gate.into_primitive(), up.into_primitive());
        let y = B::silu_mul_fwd(g.clone(), u.clone());
        match SiluMulBackward.prepare::<C>(guards).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((g, u), y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        }
    }

    fn rope_fwd(x: FloatTensor<Self>, cos: FloatTensor<Self>, sin: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::from_inner(B::rope_fwd(x.into_primitive(), cos.into_primitive(), sin.into_primitive()))
    }

    fn rope(x: FloatTensor<Self>, cos: FloatTensor<Self>, sin: FloatTensor<Self>) -> FloatTensor<Self> {
        let guards = [x.node()];
        let (cos, sin) = (cos.into_primitive(), sin.into_primitive());
        let y = B::rope_fwd(x.into_primitive(), cos.clone(), sin.clone());
        match RopeBackward.prepare::<C>(guards).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((cos, sin), y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        }
    }

    fn cross_entropy_fwd(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (loss, lse) = B::cross_entropy_fwd(logits.into_primitive(), targets);
        (Self::from_inner(loss), Self::from_inner(lse))
    }

    fn cross_entropy_bwd(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        lse: FloatTensor<Self>,
        dloss: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let g = B::cross_entropy_bwd(logits.into_primitive(), targets, lse.into_primitive(), dloss.into_primitive());
        Self::from_inner(g)
    }

    fn cross_entropy(logits: FloatTensor<Self>, targets: IntTensor<Self>) -> FloatTensor<Self> {
        let guards = [logits.node()];
        let logits = logits.into_primitive();
        let (loss, lse) = B::cross_entropy_fwd(logits.clone(), targets.clone());
        match CrossEntropyBackward.prepare::<C>(guards).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((logits, targets, lse), loss),
            OpsKind::UnTracked(prep) => prep.finish(loss),
        }
    }

    fn adamw(
        p: FloatTensor<Self>,
        g: FloatTensor<Self>,
        m: FloatTensor<Self>,
        v: FloatTensor<Self>,
        h: AdamWStep,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let inner = |t: FloatTensor<Self>| t.into_primitive();
        let (p, m, v) = B::adamw(inner(p), inner(g), inner(m), inner(v), h);
        (Self::from_inner(p), Self::from_inner(m), Self::from_inner(v))
    }

    fn matmul(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::from_inner(B::matmul(a.into_primitive(), b.into_primitive()))
    }

    fn linear(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        let guards = [x.node(), w.node()];
        let (x, w) = (x.into_primitive(), w.into_primitive());
        let y = B::matmul(x.clone(), w.clone());
        match LinearBackward.prepare::<C>(guards).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((x, w), y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        }
    }
}
