//! The flex (CPU) implementation: a host round trip into the kernels of [`super::cpu`].

use super::cpu::{self, Dims};
use super::FusedAttentionOps;
use burn::backend::ops::FloatTensorOps;
use burn::backend::{tensor::FloatTensor, Flex, TensorMetadata};
use burn::tensor::{read_sync, DType, TensorData};

fn host(t: FloatTensor<Flex>) -> Vec<f32> {
    let data = read_sync(Flex::float_into_data(t)).expect("reading a flex tensor");
    data.convert_dtype(DType::F32).try_into_vec_as::<f32>().expect("f32 data")
}

fn device_tensor(v: Vec<f32>, shape: Vec<usize>, like: &FloatTensor<Flex>) -> FloatTensor<Flex> {
    let data = TensorData::new(v, shape).convert_dtype(like.dtype());
    Flex::float_from_data(data, &like.device())
}

fn dims(q: &FloatTensor<Flex>, k: &FloatTensor<Flex>) -> Dims {
    let (qs, ks) = (q.shape(), k.shape());
    Dims { b: qs[0], h: qs[1], kv: ks[1], t: qs[2], d: qs[3] }
}

impl FusedAttentionOps for Flex {
    fn fused_causal_attention_fwd(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        scale: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let n = dims(&q, &k);
        let like = q.clone();
        let (o, lse) = cpu::forward(&host(q), &host(k), &host(v), n, scale as f32);
        (device_tensor(o, vec![n.b, n.h, n.t, n.d], &like), device_tensor(lse, vec![n.b, n.h, n.t], &like))
    }

    fn fused_causal_attention_bwd(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        o: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        d_o: FloatTensor<Self>,
        scale: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let n = dims(&q, &k);
        let (ql, kl) = (q.clone(), k.clone());
        let (dq, dk, dv) =
            cpu::backward(&host(q), &host(k), &host(v), &host(o), &host(lse), &host(d_o), n, scale as f32);
        let kv_shape = vec![n.b, n.kv, n.t, n.d];
        (
            device_tensor(dq, vec![n.b, n.h, n.t, n.d], &ql),
            device_tensor(dk, kv_shape.clone(), &kl),
            device_tensor(dv, kv_shape, &kl),
        )
    }

    fn fused_causal_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        scale: f64,
    ) -> FloatTensor<Self> {
        Self::fused_causal_attention_fwd(q, k, v, scale).0
    }
}
