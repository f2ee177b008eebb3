//! [`KernelOps`] on the CPU: the flex tensors' values go through the kernels of
//! [`crate::host::rows`] (borrowed, not copied, when contiguous `f32`).

use super::{AdamWStep, KernelOps};
use crate::host::gemm::{par_product, View};
use crate::host::{f32_tensor, floats, ints, rows, tensor_like};
use burn::backend::ops::FloatTensorOps;
use burn::backend::{tensor::FloatTensor, tensor::IntTensor, Flex, TensorMetadata};
use burn::tensor::{DType, TensorData};

fn dims(t: &FloatTensor<Flex>) -> Vec<usize> {
    t.shape().to_vec()
}

impl KernelOps for Flex {
    fn rms_norm_fwd(x: FloatTensor<Self>, w: FloatTensor<Self>, eps: f32) -> FloatTensor<Self> {
        let y = rows::rms_norm_fwd(&floats(&x), &floats(&w), eps);
        tensor_like(y, dims(&x), &x)
    }

    fn rms_norm_bwd(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (dx, dw_rows) = rows::rms_norm_bwd(&floats(&x), &floats(&w), &floats(&dy), eps);
        let dw = Flex::float_sum_dim(tensor_like(dw_rows, dims(&x), &x), 0);
        (tensor_like(dx, dims(&x), &x), Flex::float_reshape(dw, w.shape()))
    }

    fn silu_mul_fwd(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        let y = rows::silu_mul_fwd(&floats(&gate), &floats(&up));
        tensor_like(y, dims(&gate), &gate)
    }

    fn silu_mul_bwd(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (dg, du) = rows::silu_mul_bwd(&floats(&gate), &floats(&up), &floats(&dy));
        (tensor_like(dg, dims(&gate), &gate), tensor_like(du, dims(&gate), &gate))
    }

    fn rope_fwd(x: FloatTensor<Self>, cos: FloatTensor<Self>, sin: FloatTensor<Self>) -> FloatTensor<Self> {
        let d = cos.shape()[1];
        let y = rows::rope_fwd(&floats(&x), &floats(&cos), &floats(&sin), d);
        tensor_like(y, dims(&x), &x)
    }

    fn cross_entropy_fwd(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let [rows, vocab] = [logits.shape()[0], logits.shape()[1]];
        let (loss, lse) = rows::cross_entropy_fwd(&floats(&logits), &ints(&targets), vocab);
        (tensor_like(loss, vec![rows], &logits), f32_tensor(lse, vec![rows], &logits))
    }

    fn cross_entropy_bwd(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        lse: FloatTensor<Self>,
        dloss: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let vocab = logits.shape()[1];
        let g = rows::cross_entropy_bwd(&floats(&logits), &ints(&targets), &floats(&lse), &floats(&dloss), vocab);
        tensor_like(g, dims(&logits), &logits)
    }

    fn adamw(
        p: FloatTensor<Self>,
        g: FloatTensor<Self>,
        m: FloatTensor<Self>,
        v: FloatTensor<Self>,
        h: AdamWStep,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let (p2, m2, v2) = crate::host::adamw::adamw(&floats(&p), &floats(&g), &floats(&m), &floats(&v), h);
        (tensor_like(p2, dims(&p), &p), tensor_like(m2, dims(&m), &m), tensor_like(v2, dims(&v), &v))
    }

    fn sum_squares(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let s = crate::host::math::sum_squares(&floats(&x));
        Flex::float_from_data(TensorData::new(vec![s as f32], [1]), &x.device())
    }

    fn sum_all_fwd(x: FloatTensor<Self>) -> FloatTensor<Self> {
        Flex::float_sum(x)
    }

    fn matmul(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        let (Some(av), Some(bv)) = (view(&a), view(&b)) else {
            return Flex::float_matmul(a, b);
        };
        let (m, n) = (av.dims().0, bv.dims().1);
        tensor_like(par_product(av, bv), vec![m, n], &a)
    }
}

/// A 2-D `f32` flex tensor as a strided view of its storage (transposes and slices included);
/// `None` for other dtypes, ranks or negative strides (flipped views).
fn view(t: &FloatTensor<Flex>) -> Option<View<'_>> {
    let layout = t.layout();
    let (shape, strides) = (layout.shape(), layout.strides());
    if t.dtype() != DType::F32 || shape.num_dims() != 2 || strides.iter().any(|&s| s < 0) {
        return None;
    }
    let data = &t.storage::<f32>()[layout.start_offset()..];
    View::strided(data, shape[0], shape[1], strides[0] as usize, strides[1] as usize)
}
