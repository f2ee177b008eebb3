//! Data parallelism (DDP): every replica holds the whole model; after backward the gradients are
//! summed over the data-parallel group in buckets (one collective per bucket, not per tensor).
//! The loss is already divided by the *global* token count, so the sum is the gradient of the
//! global-batch loss and every replica takes the same optimizer step.

use crate::comm::{CommExt, CommResult, Communicator, ReduceOp};
use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::prelude::*;
use std::collections::HashMap;

/// TorchTitan's (PyTorch DDP's) default bucket size.
pub const BUCKET_BYTES: usize = 25 << 20;

struct HostGrad {
    id: ParamId,
    dims: Vec<usize>,
    data: Vec<f32>,
}

/// Sums the gradients in `grads` of the parameters of `model` that `which` selects over `comm`, in
/// buckets of about `bucket_bytes`.
pub fn all_reduce_gradients<M: Module>(
    model: &M,
    grads: &mut GradientsParams,
    comm: &dyn Communicator,
    bucket_bytes: usize,
    which: &dyn Fn(ParamId) -> bool,
) -> CommResult<()> {
    if comm.size() == 1 {
        return Ok(());
    }
    struct Take<'a> {
        grads: &'a mut GradientsParams,
        out: Vec<HostGrad>,
        device: Option<Device>,
        which: &'a dyn Fn(ParamId) -> bool,
    }
    impl ModuleVisitor for Take<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            if !(self.which)(p.id) {
                return;
            }
            if let Some(g) = self.grads.remove::<D>(p.id) {
                self.device.get_or_insert_with(|| g.device());
                let dims = g.dims().to_vec();
                let data = g.into_data().convert::<f32>().try_into_vec::<f32>().expect("f32 gradient");
                self.out.push(HostGrad { id: p.id, dims, data });
            }
        }
    }
    let mut take = Take { grads, out: Vec::new(), device: None, which };
    model.visit(&mut take);
    let (mut host, device) = (take.out, take.device);
    let Some(device) = device else { return Ok(()) };

    // Buckets of consecutive parameters, each reduced with one collective.
    let mut start = 0;
    while start < host.len() {
        let mut end = start;
        let mut len = 0;
        while end < host.len() && (end == start || (len + host[end].data.len()) * 4 <= bucket_bytes) {
            len += host[end].data.len();
            end += 1;
        }
        let mut flat = Vec::with_capacity(len);
        for h in &host[start..end] {
            flat.extend_from_slice(&h.data);
        }
        comm.all_reduce(&mut flat, ReduceOp::Sum)?;
        let mut off = 0;
        for h in &mut host[start..end] {
            let n = h.data.len();
            h.data.copy_from_slice(&flat[off..off + n]);
            off += n;
        }
        start = end;
    }

    struct Put<'a> {
        grads: &'a mut GradientsParams,
        host: HashMap<ParamId, HostGrad>,
        device: Device,
    }
    impl ModuleVisitor for Put<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            if let Some(h) = self.host.remove(&p.id) {
                let t = Tensor::<D>::from_data(TensorData::new(h.data, h.dims), &self.device);
                self.grads.register::<D>(h.id, t);
            }
        }
    }
    let host = host.into_iter().map(|h| (h.id, h)).collect();
    model.visit(&mut Put { grads, host, device });
    Ok(())
}
