//! The CPU (flex) side of the fused kernels: the row kernels ([`rows`]), their scalar helpers
//! ([`math`]), and moving flex tensors in and out of `f32` slices without copies where the
//! tensor is already contiguous `f32`.

pub mod gemm;
pub mod math;
pub mod rows;

use burn::backend::ops::{FloatTensorOps, IntTensorOps};
use burn::backend::{tensor::FloatTensor, tensor::IntTensor, Flex, TensorMetadata};
use burn::tensor::{read_sync, DType, TensorData};
use std::borrow::Cow;

/// The values of a float tensor as `f32`: borrowed when it is contiguous `f32` (the usual
/// case), converted otherwise (strided views, half precision).
pub(crate) fn floats(t: &FloatTensor<Flex>) -> Cow<'_, [f32]> {
    match t.as_slice::<f32>() {
        Some(s) => Cow::Borrowed(s),
        None => {
            let data = read_sync(Flex::float_into_data(t.clone())).expect("reading a flex tensor");
            Cow::Owned(data.convert_dtype(DType::F32).try_into_vec::<f32>().expect("f32 data"))
        }
    }
}

/// The values of an integer tensor (targets) as `i64`.
pub(crate) fn ints(t: &IntTensor<Flex>) -> Cow<'_, [i64]> {
    match t.as_slice::<i64>() {
        Some(s) => Cow::Borrowed(s),
        None => {
            let data = read_sync(Flex::int_into_data(t.clone())).expect("reading a flex tensor");
            Cow::Owned(data.convert_dtype(DType::I64).try_into_vec::<i64>().expect("i64 data"))
        }
    }
}

/// A flex tensor of `shape` holding `v`, in the dtype and on the device of `like`.
pub(crate) fn tensor_like(v: Vec<f32>, shape: Vec<usize>, like: &FloatTensor<Flex>) -> FloatTensor<Flex> {
    let mut data = TensorData::new(v, shape);
    if like.dtype() != DType::F32 {
        data = data.convert_dtype(like.dtype());
    }
    Flex::float_from_data(data, &like.device())
}
