//! Host ↔ device traffic. Every titan-rs call site that moves tensor values between host memory
//! and a GPU goes through these functions, which count the bytes each way, per thread (a rank is
//! a thread or a process, so a rank reads its own counts). On the CPU device (flex) tensors already live in host memory: the
//! same calls are copies at most and count nothing. `bench train --json` reports the counts per
//! step, so "nothing parameter-sized crosses per step" is measured, not assumed.

use burn::prelude::*;
use std::cell::Cell;

thread_local! {
    static TRAFFIC: Cell<Traffic> = const { Cell::new(Traffic { to_host: 0, to_device: 0 }) };
}

/// Bytes moved so far: `(device → host, host → device)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    pub to_host: u64,
    pub to_device: u64,
}

impl std::ops::Sub for Traffic {
    type Output = Traffic;
    fn sub(self, o: Traffic) -> Traffic {
        Traffic { to_host: self.to_host - o.to_host, to_device: self.to_device - o.to_device }
    }
}

/// This thread's counters now.
pub fn traffic() -> Traffic {
    TRAFFIC.with(|t| t.get())
}

/// Counts `bytes` read from a GPU on this thread (for reads done on a helper thread and for
/// primitive-level call sites; `gpu` false counts nothing).
pub fn count_to_host(bytes: usize, gpu: bool) {
    if gpu {
        TRAFFIC.with(|t| t.set(Traffic { to_host: t.get().to_host + bytes as u64, ..t.get() }));
    }
}

/// Counts `bytes` written to a GPU.
pub fn count_to_device(bytes: usize, gpu: bool) {
    if gpu {
        TRAFFIC.with(|t| t.set(Traffic { to_device: t.get().to_device + bytes as u64, ..t.get() }));
    }
}

/// Whether tensors on `device` live outside host memory.
pub fn is_gpu(device: &Device) -> bool {
    device.clone().without_autodiff() != Device::flex()
}

/// The values of `t`, read to the host.
pub fn to_host<const D: usize, K: burn::tensor::kind::Basic>(t: Tensor<D, K>) -> TensorData {
    let gpu = is_gpu(&t.device());
    let data = t.into_data();
    count_to_host(data.as_bytes().len(), gpu);
    data
}

/// The values of `t` as `f32` on the host (converted from the compute type if needed).
pub fn to_host_f32<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    to_host(t).convert::<f32>().try_into_vec::<f32>().expect("float tensor values")
}

/// The single value of `t` (a loss, a norm) on the host.
pub fn scalar(t: Tensor<1>) -> f32 {
    let v = to_host_f32(t);
    assert_eq!(v.len(), 1, "a scalar tensor");
    v[0]
}

/// A tensor on `device` from host values.
pub fn to_device<const D: usize, K: burn::tensor::kind::Basic>(data: TensorData, device: &Device) -> Tensor<D, K> {
    count_to_device(data.as_bytes().len(), is_gpu(device));
    Tensor::from_data(data, device)
}

/// Whether backend `B` keeps tensors outside host memory (every backend but the CPU's flex).
fn backend_is_gpu<B: burn::backend::Backend>() -> bool {
    std::any::TypeId::of::<B>() != std::any::TypeId::of::<burn::backend::Flex>()
}

/// The values of a backend's float primitive, read to the host (for custom ops' staged paths).
pub fn read_float<B: burn::backend::Backend>(x: burn::backend::tensor::FloatTensor<B>) -> TensorData {
    let data = burn::tensor::read_sync(B::float_into_data(x)).expect("reading a tensor to the host");
    count_to_host(data.as_bytes().len(), backend_is_gpu::<B>());
    data
}

/// The values of a backend's int primitive, read to the host.
pub fn read_int<B: burn::backend::Backend>(x: burn::backend::tensor::IntTensor<B>) -> TensorData {
    let data = burn::tensor::read_sync(B::int_into_data(x)).expect("reading a tensor to the host");
    count_to_host(data.as_bytes().len(), backend_is_gpu::<B>());
    data
}

/// A backend's float primitive on `device` from host values.
pub fn write_float<B: burn::backend::Backend>(data: TensorData, device: &B::Device) -> burn::backend::tensor::FloatTensor<B> {
    count_to_device(data.as_bytes().len(), backend_is_gpu::<B>());
    B::float_from_data(data, device)
}
