//! Loss parallelism: cross-entropy over logits whose vocabulary is split over the tensor-parallel
//! group (the output head is column-parallel), without ever forming the full logits.
//!
//! Per position: the global max (a constant for the gradient), the sum of exponentials summed
//! over ranks, and the target's logit taken from the rank that holds it. Both sums use Megatron's
//! g (all-reduce forward, identity backward): every rank computes the same loss, and each rank's
//! logits receive exactly their part of its gradient.

use crate::autograd::reduce_from_group;
use crate::comm::{CommExt, ReduceOp};
use crate::registry::{with_group, GroupHandle};
use burn::prelude::*;

/// Sum over all positions of `-log softmax(logits)[target]`, where `logits: [B, T, V / tp]` is
/// this rank's slice of the vocabulary (rank r holds entries `[r·V/tp, (r+1)·V/tp)`) and
/// `targets: [B, T]` holds full-vocabulary ids.
pub fn vocab_parallel_cross_entropy_sum(logits: Tensor<3>, targets: Tensor<2, Int>, g: &GroupHandle) -> Tensor<1> {
    let [b, t, v] = logits.dims();
    let n = b * t;
    let logits = logits.reshape([n, v]);
    let device = logits.device();
    let mut max: Vec<f32> =
        titan_kernels::transfer::to_host_f32(logits.clone().detach().max_dim(1));
    with_group(g.id(), |c| c.all_reduce(&mut max, ReduceOp::Max)).unwrap_or_else(|e| panic!("{e}"));
    let z = logits - titan_kernels::transfer::to_device::<2, Float>(TensorData::new(max, [n, 1]), &device);
    let sum_exp = reduce_from_group(z.clone().exp().sum_dim(1), g);
    let local = targets.reshape([n, 1]).sub_scalar((g.rank() * v) as i64);
    let mine = local.clone().greater_equal_elem(0).bool_and(local.clone().lower_elem(v as i64));
    let idx = local.mask_fill(mine.clone().bool_not(), 0);
    let target_logit = reduce_from_group(z.gather(1, idx) * mine.float(), g);
    titan_kernels::sum_all(sum_exp.log() - target_logit)
}
