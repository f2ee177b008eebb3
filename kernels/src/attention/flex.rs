//! The flex (CPU) implementation: the tensors' values (borrowed when contiguous `f32`) go
//! through the kernels of [`super::cpu`].

use super::cpu::{self, Dims};
use super::FusedAttentionOps;
use crate::host::{f32_tensor, floats, ints, tensor_like};
use burn::backend::{
    tensor::{FloatTensor, IntTensor},
    Flex, TensorMetadata,
};

fn dims(q: &FloatTensor<Flex>, k: &FloatTensor<Flex>) -> Dims {
    Dims::of(&q.shape(), &k.shape())
}

impl FusedAttentionOps for Flex {
    fn fused_attention_fwd(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        starts: IntTensor<Self>,
        scale: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let n = dims(&q, &k);
        let vis = cpu::Starts { starts: &ints(&starts), t: n.t };
        let (o, lse) = cpu::forward(&floats(&q), &floats(&k), &floats(&v), &vis, n, scale as f32);
        (tensor_like(o, vec![n.b, n.h, n.t, n.d], &q), f32_tensor(lse, vec![n.b, n.h, n.t], &q))
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
        let n = dims(&q, &k);
        let starts = ints(&starts);
        let (dq, dk, dv) = cpu::backward(
            &floats(&q),
            &floats(&k),
            &floats(&v),
            &cpu::Starts { starts: &starts, t: n.t },
            &floats(&o),
            &floats(&lse),
            &floats(&d_o),
            n,
            scale as f32,
        );
        let kv_shape = vec![n.b, n.kv, n.tk, n.d];
        (
            tensor_like(dq, vec![n.b, n.h, n.t, n.d], &q),
            tensor_like(dk, kv_shape.clone(), &k),
            tensor_like(dv, kv_shape, &k),
        )
    }

    fn fused_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        starts: IntTensor<Self>,
        scale: f64,
    ) -> FloatTensor<Self> {
        Self::fused_attention_fwd(q, k, v, starts, scale).0
    }
}
