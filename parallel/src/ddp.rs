//! Data parallelism (DDP): every replica holds the whole model; after backward the gradients are
//! summed over the data-parallel group in buckets (one collective per bucket, not per tensor).
//! The loss is already divided by the *global* token count, so the sum is the gradient of the
//! global-batch loss and every replica takes the same optimizer step.
//!
//! Each bucket crosses the device boundary once each way: its gradients are flattened and
//! concatenated on the device and read back with one transfer, summed by the communicator, and
//! written back with one transfer that the parameters' gradients are sliced from on the device.
//! A reader thread reads bucket k + 1 while bucket k is being reduced, so on a GPU the copy
//! hides behind the collective. On the CPU the copies are memory copies; the sums are the same
//! additions in the same order, so results are bit-identical to a per-tensor reduction.

use crate::comm::{CommExt, CommResult, Communicator, ReduceOp};
use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::prelude::*;
use std::collections::HashMap;
use std::sync::mpsc::sync_channel;

/// TorchTitan's (PyTorch DDP's) default bucket size.
pub const BUCKET_BYTES: usize = 25 << 20;

/// One gradient taken out of `GradientsParams`, flattened on its device.
struct Flat {
    id: ParamId,
    dims: Vec<usize>,
    flat: Tensor<1>,
}

/// Consecutive gradients whose float32 bytes fit `bucket_bytes` (a larger tensor is a bucket
/// alone): the ranges of `grads` reduced with one collective each.
fn buckets(lens: &[usize], bucket_bytes: usize) -> Vec<std::ops::Range<usize>> {
    let (mut out, mut start) = (Vec::new(), 0);
    while start < lens.len() {
        let (mut end, mut len) = (start, 0);
        while end < lens.len() && (end == start || (len + lens[end]) * 4 <= bucket_bytes) {
            len += lens[end];
            end += 1;
        }
        out.push(start..end);
        start = end;
    }
    out
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
        out: Vec<Flat>,
        which: &'a dyn Fn(ParamId) -> bool,
    }
    impl ModuleVisitor for Take<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            if !(self.which)(p.id) {
                return;
            }
            if let Some(g) = self.grads.remove::<D>(p.id) {
                let dims = g.dims().to_vec();
                let n: usize = dims.iter().product();
                self.out.push(Flat { id: p.id, dims, flat: g.reshape([n]) });
            }
        }
    }
    let mut take = Take { grads, out: Vec::new(), which };
    model.visit(&mut take);
    let flats = take.out;
    let Some(device) = flats.first().map(|f| f.flat.device()) else { return Ok(()) };
    let ranges = buckets(&flats.iter().map(|f| f.dims.iter().product()).collect::<Vec<_>>(), bucket_bytes);
    let mut reduced: HashMap<ParamId, (Vec<usize>, Tensor<1>)> = HashMap::with_capacity(flats.len());

    std::thread::scope(|s| -> CommResult<()> {
        // The reader: one device → host transfer per bucket, one bucket ahead of the reduction.
        let (tx, rx) = sync_channel::<Vec<f32>>(1);
        let gpu = titan_kernels::transfer::is_gpu(&device);
        let (flats_ref, ranges_ref) = (&flats, &ranges);
        s.spawn(move || {
            for r in ranges_ref {
                let parts: Vec<Tensor<1>> = flats_ref[r.clone()].iter().map(|f| f.flat.clone()).collect();
                let bucket = if parts.len() == 1 { parts.into_iter().next().unwrap() } else { Tensor::cat(parts, 0) };
                // Read here, counted on the rank's thread below (the counters are per thread).
                let data = bucket.into_data().convert::<f32>().try_into_vec::<f32>().expect("float32 gradient bucket");
                if tx.send(data).is_err() {
                    return; // the reducer stopped on an error
                }
            }
        });
        for r in &ranges {
            let mut data = rx.recv().expect("gradient reader thread ended early");
            titan_kernels::transfer::count_to_host(data.len() * 4, gpu);
            comm.all_reduce(&mut data, ReduceOp::Sum)?;
            // One host → device transfer per bucket; the gradients are slices of it.
            let n = data.len();
            let bucket = titan_kernels::transfer::to_device::<1, Float>(TensorData::new(data, [n]), &device);
            let mut off = 0;
            for f in &flats[r.clone()] {
                let len: usize = f.dims.iter().product();
                let part = if r.len() == 1 { bucket.clone() } else { bucket.clone().slice(off..off + len) };
                reduced.insert(f.id, (f.dims.clone(), part));
                off += len;
            }
        }
        Ok(())
    })?;

    struct Put<'a> {
        grads: &'a mut GradientsParams,
        reduced: HashMap<ParamId, (Vec<usize>, Tensor<1>)>,
    }
    impl ModuleVisitor for Put<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            if let Some((dims, flat)) = self.reduced.remove(&p.id) {
                let shape: [usize; D] = dims.try_into().expect("gradient rank");
                self.grads.register::<D>(p.id, flat.reshape(shape));
            }
        }
    }
    model.visit(&mut Put { grads, reduced });
    Ok(())
}

pub mod overlap;
pub(crate) mod pass_sum;

#[cfg(test)]
mod tests {
    use super::buckets;

    #[test]
    fn buckets_hold_consecutive_tensors_up_to_the_size_and_a_large_one_alone() {
        // 4-byte floats, 100-byte buckets = 25 floats.
        assert_eq!(buckets(&[10, 10, 10, 30, 5, 20], 100), vec![0..2, 2..3, 3..4, 4..6]);
        assert_eq!(buckets(&[], 100), Vec::<std::ops::Range<usize>>::new());
        assert_eq!(buckets(&[25], 100), vec![0..1]);
    }
}
