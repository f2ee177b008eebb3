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

pub(crate) fn host_f32<B: Backend>(x: FloatTensor<B>) -> Vec<f32> {
    let data = titan_kernels::transfer::read_float::<B>(x);
    data.convert_dtype(DType::F32).try_into_vec_as::<f32>().expect("f32 data")
}

/// FSDP's unshard: the dim-0 shards of `group` gathered and cut to the parameter's `rows` (on
/// the communication stream, perhaps prefetched, while a step is armed for overlap).
pub fn unshard<B: Backend>(x: FloatTensor<B>, group: u64, rows: usize, key: u64) -> FloatTensor<B> {
    let (dtype, device, shape) = (x.dtype(), x.device(), x.shape().to_vec());
    let mut out_shape = shape.clone();
    out_shape[0] = rows;
    let overlapped = match crate::fsdp::overlap::armed() {
        true => crate::fsdp::overlap::gather(key, || host_f32::<B>(x.clone())),
        false => None,
    };
    let out = match overlapped {
        Some(r) => r.unwrap_or_else(|e| panic!("{e}")),
        None => {
            let mut out = with_group(group, |c| host::run(Prim::AllGather, host_f32::<B>(x), &shape, 0, c)).0;
            out.truncate(rows * shape[1..].iter().product::<usize>());
            out
        }
    };
    titan_kernels::transfer::write_float::<B>(TensorData::new(out, out_shape).convert_dtype(dtype), &device)
}

/// The gradient of [`unshard`]: `grad` (`rows` rows) zero-padded to `chunk` rows per rank of
/// `group` and reduce-scattered, so each rank gets the summed gradient of its shard. `None`
/// when a step armed for overlap queued it on the communication stream instead.
pub fn reshard_grad<B: Backend>(grad: FloatTensor<B>, group: u64, chunk: usize, key: u64) -> Option<FloatTensor<B>> {
    let (dtype, device, shape) = (grad.dtype(), grad.device(), grad.shape().to_vec());
    if crate::fsdp::overlap::armed() {
        let g = grad.clone();
        if crate::fsdp::overlap::reduce_scatter(key, || host_f32::<B>(g), &shape, chunk, dtype) {
            return None;
        }
    }
    let mut data = host_f32::<B>(grad);
    let (out, out_shape) = with_group(group, |c| {
        let mut padded = shape.clone();
        padded[0] = chunk * c.size();
        data.resize(padded.iter().product(), 0.0);
        host::run(Prim::ReduceScatter, data, &padded, 0, c)
    });
    Some(titan_kernels::transfer::write_float::<B>(TensorData::new(out, out_shape).convert_dtype(dtype), &device))
}
