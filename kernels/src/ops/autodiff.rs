//! Backward passes of the fused ops. Each op names its inputs to Burn's checkpointer instead of
//! holding them, so under `device.gradient_checkpointing()` (Burn's balanced strategy,
//! `activation_checkpoint.selective_ac_option = "op"`) the cheap element-wise ops — RMSNorm,
//! SwiGLU's `silu · mul`, RoPE — are *memory-bound*: their outputs are dropped after forward and
//! recomputed from their inputs (`RetroForward`) when a backward needs them, while the matmuls
//! and attention are *compute-bound*: their outputs are kept. Without the strategy every input
//! is kept, exactly as before.

use super::{AdamWStep, KernelOps};
use burn::backend::autodiff::{
    checkpoint::{base::Checkpointer, retro_forward::RetroForward, state::BackwardStates, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
    Autodiff, NodeId,
};
use burn::backend::{tensor::FloatTensor, tensor::IntTensor, AutodiffBackend, Backend, TensorMetadata};
use burn::tensor::Shape;

#[derive(Debug)]
struct RmsNormBackward;

impl<B: Backend + KernelOps> Backward<B, 2> for RmsNormBackward {
    type State = (NodeId, NodeId, f32);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, c: &mut Checkpointer) {
        let [node_x, node_w] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        let (x, w, eps) = ops.state;
        let (x, w): (FloatTensor<B>, FloatTensor<B>) = (c.retrieve_node_output(x), c.retrieve_node_output(w));
        let (dx, dw) = B::rms_norm_bwd(x, w, dy, eps);
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
    type State = (NodeId, NodeId);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, c: &mut Checkpointer) {
        let [node_g, node_u] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        let (g, u) = ops.state;
        let (g, u): (FloatTensor<B>, FloatTensor<B>) = (c.retrieve_node_output(g), c.retrieve_node_output(u));
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
    type State = (NodeId, IntTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, c: &mut Checkpointer) {
        let [node_logits] = ops.parents;
        let dloss = grads.consume::<B>(&ops.node);
        let (logits, targets, lse) = ops.state;
        let logits: FloatTensor<B> = c.retrieve_node_output(logits);
        let dlogits = B::cross_entropy_bwd(logits, targets, lse, dloss);
        if let Some(node) = node_logits {
            grads.register::<B>(node.id, dlogits);
        }
    }
}

#[derive(Debug)]
struct SumAllBackward;

impl<B: Backend + KernelOps> Backward<B, 1> for SumAllBackward {
    type State = Shape;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _c: &mut Checkpointer) {
        let [node_x] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        if let Some(node) = node_x {
            let rank1 = B::float_reshape(dy, Shape::from(vec![1usize; ops.state.num_dims()]));
            grads.register::<B>(node.id, B::float_expand(rank1, ops.state));
        }
    }
}

#[derive(Debug)]
struct LinearBackward;

impl<B: Backend + KernelOps> Backward<B, 2> for LinearBackward {
    type State = (NodeId, NodeId);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, c: &mut Checkpointer) {
        let [node_x, node_w] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        let (x, w) = ops.state;
        let (x, w): (FloatTensor<B>, FloatTensor<B>) = (c.retrieve_node_output(x), c.retrieve_node_output(w));
        // dx = dy · wᵀ, dw = xᵀ · dy; the transposes are views, the products read them strided.
        if let Some(node) = node_w {
            grads.register::<B>(node.id, B::matmul(B::float_transpose(x), dy.clone()));
        }
        if let Some(node) = node_x {
            grads.register::<B>(node.id, B::matmul(dy, B::float_transpose(w)));
        }
    }
}

/// Recomputes an RMSNorm output from its checkpointed input and weight.
#[derive(Debug)]
struct RetroRmsNorm<B: Backend> {
    x: NodeId,
    w: NodeId,
    eps: f32,
    _b: std::marker::PhantomData<B>,
}

impl<B: Backend + KernelOps> RetroForward for RetroRmsNorm<B> {
    fn forward(&self, states: &mut BackwardStates, out: NodeId) {
        let (x, w) = (states.get_state::<FloatTensor<B>>(&self.x), states.get_state::<FloatTensor<B>>(&self.w));
        states.save(out, B::rms_norm_fwd(x, w, self.eps));
    }
}

#[derive(Debug)]
struct RetroSiluMul<B: Backend> {
    g: NodeId,
    u: NodeId,
    _b: std::marker::PhantomData<B>,
}

impl<B: Backend + KernelOps> RetroForward for RetroSiluMul<B> {
    fn forward(&self, states: &mut BackwardStates, out: NodeId) {
        let (g, u) = (states.get_state::<FloatTensor<B>>(&self.g), states.get_state::<FloatTensor<B>>(&self.u));
        states.save(out, B::silu_mul_fwd(g, u));
    }
}

#[derive(Debug)]
struct RetroRope<B: Backend> {
    x: NodeId,
    cos: FloatTensor<B>,
    sin: FloatTensor<B>,
}

impl<B: Backend + KernelOps> RetroForward for RetroRope<B> {
    fn forward(&self, states: &mut BackwardStates, out: NodeId) {
        let x = states.get_state::<FloatTensor<B>>(&self.x);
        states.save(out, B::rope_fwd(x, self.cos.clone(), self.sin.clone()));
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
        let y = B::rms_norm_fwd(x.clone().into_primitive(), w.clone().into_primitive(), eps);
        let retro = RetroRmsNorm::<B> { x: x.node().id(), w: w.node().id(), eps, _b: Default::default() };
        match RmsNormBackward.prepare::<C>([x.node(), w.node()]).memory_bound().retro_forward(retro).parents([&x, &w]).stateful() {
            OpsKind::Tracked(mut prep) => {
                let state = (prep.checkpoint(&x), prep.checkpoint(&w), eps);
                prep.finish(state, y)
            }
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
        let y = B::silu_mul_fwd(gate.clone().into_primitive(), up.clone().into_primitive());
        let retro = RetroSiluMul::<B> { g: gate.node().id(), u: up.node().id(), _b: Default::default() };
        let prep = SiluMulBackward.prepare::<C>([gate.node(), up.node()]).memory_bound().retro_forward(retro);
        match prep.parents([&gate, &up]).stateful() {
            OpsKind::Tracked(mut prep) => {
                let state = (prep.checkpoint(&gate), prep.checkpoint(&up));
                prep.finish(state, y)
            }
            OpsKind::UnTracked(prep) => prep.finish(y),
        }
    }

    fn rope_fwd(x: FloatTensor<Self>, cos: FloatTensor<Self>, sin: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::from_inner(B::rope_fwd(x.into_primitive(), cos.into_primitive(), sin.into_primitive()))
    }

    fn rope(x: FloatTensor<Self>, cos: FloatTensor<Self>, sin: FloatTensor<Self>) -> FloatTensor<Self> {
        let (cos, sin) = (cos.into_primitive(), sin.into_primitive());
        let y = B::rope_fwd(x.clone().into_primitive(), cos.clone(), sin.clone());
        let retro = RetroRope::<B> { x: x.node().id(), cos: cos.clone(), sin: sin.clone() };
        // The backward needs only the tables (a rotation's transpose), not `x`.
        match RopeBackward.prepare::<C>([x.node()]).memory_bound().retro_forward(retro).parents([&x]).stateful() {
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
        let (loss, lse) = B::cross_entropy_fwd(logits.clone().into_primitive(), targets.clone());
        match CrossEntropyBackward.prepare::<C>([logits.node()]).compute_bound().stateful() {
            OpsKind::Tracked(mut prep) => {
                let state = (prep.checkpoint(&logits), targets, lse);
                prep.finish(state, loss)
            }
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

    fn sum_squares(x: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::from_inner(B::sum_squares(x.into_primitive()))
    }

    fn sum_all_fwd(x: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::from_inner(B::sum_all_fwd(x.into_primitive()))
    }

    fn sum_all(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let shape = x.shape();
        let y = B::sum_all_fwd(x.clone().into_primitive());
        match SumAllBackward.prepare::<C>([x.node()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish(shape, y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        }
    }

    fn linear(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        let y = B::matmul(x.clone().into_primitive(), w.clone().into_primitive());
        match LinearBackward.prepare::<C>([x.node(), w.node()]).compute_bound().stateful() {
            OpsKind::Tracked(mut prep) => {
                let state = (prep.checkpoint(&x), prep.checkpoint(&w));
                prep.finish(state, y)
            }
            OpsKind::UnTracked(prep) => prep.finish(y),
        }
    }
}
