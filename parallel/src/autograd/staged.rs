//! A collective on any backend's tensor, staged through host memory: read to the host (f32),
//! the communicator's collective ([`super::host::run`]), written back to the tensor's device in
//! its own type.

use super::host::{self, Prim};
use crate::registry::with_group;
use burn::backend::{tensor::FloatTensor, Backend, TensorMetadata};
use burn::tensor::{DType, TensorData};

pub fn run<B: Backend>(x: FloatTensor<B>, prim: Prim, dim: usize, group: u64) -> FloatTensor<B> {
    if prim == Prim::Identity {
        return x;
    }
    let (dtype, device, shape) = (x.dtype(), x.device(), x.shape().to_vec());
    let data = titan_kernels::transfer::read_float::<B>(x);
    let data = data.convert_dtype(DType::F32).try_into_vec_as::<f32>().expect("f32 data");
    let (out, out_shape) = with_group(group, |c| host::run(prim, data, &shape, dim, c));
    titan_kernels::transfer::write_float::<B>(TensorData::new(out, out_shape).convert_dtype(dtype), &device)
}
