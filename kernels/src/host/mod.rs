//! The CPU (flex) side of the fused kernels: the row kernels ([`rows`]), their scalar helpers
//! ([`math`]), and moving flex tensors in and out of `f32` slices without copies where the
//! tensor is already contiguous `f32`.

pub mod adamw;
pub mod gemm;
pub mod math;
pub mod rows;

use burn::backend::ops::{FloatTensorOps, IntTensorOps};
use burn::backend::{tensor::FloatTensor, tensor::IntTensor, Flex, TensorMetadata};
use burn::tensor::{read_sync, DType, TensorData};
use std::borrow::Cow;
use std::mem::MaybeUninit;

/// `K` vectors of `n` floats that `fill` writes, every element of each, without zeroing them
/// first (on the 2-core VM zeroing a kernel's outputs cost as much as the kernel's own writes).
/// The kernels hand `fill`'s buffers to rayon in chunks that cover them and write every element
/// of each chunk.
pub(crate) fn written<const K: usize>(n: usize, fill: impl FnOnce([&mut [MaybeUninit<f32>]; K])) -> [Vec<f32>; K] {
    let mut out: [Vec<f32>; K] = std::array::from_fn(|_| Vec::with_capacity(n));
    fill(out.each_mut().map(|v| &mut v.spare_capacity_mut()[..n]));
    for v in &mut out {
        // SAFETY: `fill` wrote all `n` elements (the contract above), within the capacity.
        unsafe { v.set_len(n) };
    }
    out
}

/// The values of elements already written.
///
/// # Safety
/// Every element of `s` must have been written.
pub(crate) unsafe fn assume_written(s: &[MaybeUninit<f32>]) -> &[f32] {
    // SAFETY: `MaybeUninit<f32>` has `f32`'s layout, and the caller guarantees initialisation.
    unsafe { &*(s as *const [MaybeUninit<f32>] as *const [f32]) }
}

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

/// `v` as a float32 flex tensor of `shape` on `like`'s device (the saved log-sum-exps).
pub(crate) fn f32_tensor(v: Vec<f32>, shape: Vec<usize>, like: &FloatTensor<Flex>) -> FloatTensor<Flex> {
    Flex::float_from_data(TensorData::new(v, shape), &like.device())
}

/// A flex tensor of `shape` holding `v`, in the dtype and on the device of `like`.
pub(crate) fn tensor_like(v: Vec<f32>, shape: Vec<usize>, like: &FloatTensor<Flex>) -> FloatTensor<Flex> {
    let mut data = TensorData::new(v, shape);
    if like.dtype() != DType::F32 {
        data = data.convert_dtype(like.dtype());
    }
    Flex::float_from_data(data, &like.device())
}
