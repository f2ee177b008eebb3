//! An auxiliary loss attached to an activation (Megatron's `MoEAuxLossAutoScaler`): forward
//! returns the activation unchanged; backward passes its gradient through and gives the loss
//! the constant gradient `scale`, so the loss joins the training objective at the point it was
//! computed — also inside a recomputed (checkpointed) block or a pipeline stage — without
//! changing what the model returns.

use burn::backend::autodiff::{
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
    Autodiff,
};
use burn::backend::{backend_extension, tensor::FloatTensor, Backend, Dispatch, Flex, TensorMetadata};
use burn::prelude::*;

#[backend_extension(Flex, Autodiff)]
pub trait AuxLossOps: Backend {
    /// `y`, with `loss` (shape `[1]`) given the gradient `scale` in backward.
    fn attach_aux_loss(y: FloatTensor<Self>, loss: FloatTensor<Self>, scale: f32) -> FloatTensor<Self>;
}

impl AuxLossOps for Flex {
    fn attach_aux_loss(y: FloatTensor<Self>, _loss: FloatTensor<Self>, _scale: f32) -> FloatTensor<Self> {
        y
    }
}

#[derive(Debug)]
struct AttachBackward;

impl<B: Backend> Backward<B, 2> for AttachBackward {
    /// (the loss's shape, device and dtype as a template, scale)
    type State = (FloatTensor<B>, f32);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _c: &mut Checkpointer) {
        let [node_y, node_loss] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        let (like, scale) = ops.state;
        if let Some(node) = node_y {
            grads.register::<B>(node.id, dy);
        }
        if let Some(node) = node_loss {
            let ones = B::float_ones(like.shape(), &like.device(), like.dtype().into());
            grads.register::<B>(node.id, B::float_mul_scalar(ones, scale.into()));
        }
    }
}

impl<B: Backend + AuxLossOps, C: CheckpointStrategy> AuxLossOps for Autodiff<B, C> {
    fn attach_aux_loss(y: FloatTensor<Self>, loss: FloatTensor<Self>, scale: f32) -> FloatTensor<Self> {
        let like = loss.clone().into_primitive();
        let out = y.clone().into_primitive();
        match AttachBackward.prepare::<C>([y.node(), loss.node()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((like, scale), out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }
}

/// `y`, with `loss` added to the objective scaled by `scale` (its gradient is `scale`). CPU
/// tensors only: other devices have no kernel for it.
pub fn attach_aux_loss<const D: usize>(y: Tensor<D>, loss: Tensor<1>, scale: f64) -> Tensor<D> {
    assert!(
        crate::has_kernels(&y.device()) && !crate::on_cube(&y.device()),
        "auxiliary losses are attached on the CPU device only"
    );
    Tensor::from_dispatch(Dispatch::attach_aux_loss(y.into_dispatch(), loss.into_dispatch(), scale as f32))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The objective `sum(y · w) + scale · loss`: `y` gets `w`, the loss's inputs get `scale ·
    /// dloss`, and the forward value is `y`'s.
    #[test]
    fn attached_loss_gets_the_constant_gradient() {
        let dev = Device::flex().autodiff();
        let x = Tensor::<2>::from_data([[1.0f32, 2.0], [3.0, 4.0]], &dev).require_grad();
        let a = Tensor::<1>::from_data([0.5f32, -1.5], &dev).require_grad();
        let y = x.clone().mul_scalar(2.0);
        let loss = (a.clone() * a.clone()).sum();
        let out = attach_aux_loss(y, loss, 0.25);
        assert_eq!(out.to_data().try_to_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0, 8.0]);
        let g = (out * Tensor::<2>::from_data([[1.0f32, 0.0], [0.0, 1.0]], &dev)).sum().backward();
        assert_eq!(x.grad(&g).unwrap().to_data().try_to_vec::<f32>().unwrap(), vec![2.0, 0.0, 0.0, 2.0]);
        // d(0.25 · Σa²)/da = 0.5 · a
        assert_eq!(a.grad(&g).unwrap().to_data().try_to_vec::<f32>().unwrap(), vec![0.25, -0.75]);
    }
}
