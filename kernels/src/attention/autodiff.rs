//! Autodiff: the forward saves `(q, k, v, o, lse)`; the backward calls the inner backend's
//! fused backward kernel.

use super::FusedAttentionOps;
use burn::backend::autodiff::{
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
    Autodiff, NodeId,
};
use burn::backend::{
    tensor::{FloatTensor, IntTensor},
    AutodiffBackend, Backend,
};

#[derive(Debug)]
struct FusedAttentionBackward;

impl<B: Backend + FusedAttentionOps> Backward<B, 3> for FusedAttentionBackward {
    /// The inputs by checkpoint id (recomputed under the balanced strategy when they come from
    /// cheap ops, e.g. RoPE), the output and log-sum-exp kept.
    type State = (NodeId, NodeId, NodeId, IntTensor<B>, FloatTensor<B>, FloatTensor<B>, f64);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, c: &mut Checkpointer) {
        let [node_q, node_k, node_v] = ops.parents;
        let d_o = grads.consume::<B>(&ops.node);
        let (q, k, v, starts, o, lse, scale) = ops.state;
        let (q, k, v): (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) =
            (c.retrieve_node_output(q), c.retrieve_node_output(k), c.retrieve_node_output(v));
        let (dq, dk, dv) = B::fused_attention_bwd(q, k, v, starts, o, lse, d_o, scale);
        for (node, grad) in [(node_q, dq), (node_k, dk), (node_v, dv)] {
            if let Some(node) = node {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

impl<B: Backend + FusedAttentionOps, C: CheckpointStrategy> FusedAttentionOps for Autodiff<B, C> {
    fn fused_attention_fwd(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        starts: IntTensor<Self>,
        scale: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (o, lse) =
            B::fused_attention_fwd(q.into_primitive(), k.into_primitive(), v.into_primitive(), starts, scale);
        (Self::from_inner(o), Self::from_inner(lse))
    }

    fn fused_attention_bwd(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        starts: IntTensor<Self>,
        o: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        d_o: FloatTensor<Self>,
        scale: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let (dq, dk, dv) = B::fused_attention_bwd(
            q.into_primitive(),
            k.into_primitive(),
            v.into_primitive(),
            starts,
            o.into_primitive(),
            lse.into_primitive(),
            d_o.into_primitive(),
            scale,
        );
        (Self::from_inner(dq), Self::from_inner(dk), Self::from_inner(dv))
    }

    fn fused_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        starts: IntTensor<Self>,
        scale: f64,
    ) -> FloatTensor<Self> {
        let (o, lse) = B::fused_attention_fwd(
            q.clone().into_primitive(),
            k.clone().into_primitive(),
            v.clone().into_primitive(),
            starts.clone(),
            scale,
        );
        match FusedAttentionBackward.prepare::<C>([q.node(), k.node(), v.node()]).compute_bound().stateful() {
            OpsKind::Tracked(mut prep) => {
                let ids = (prep.checkpoint(&q), prep.checkpoint(&k), prep.checkpoint(&v));
                prep.finish((ids.0, ids.1, ids.2, starts, o.clone(), lse, scale), o)
            }
            OpsKind::UnTracked(prep) => prep.finish(o),
        }
    }
}
