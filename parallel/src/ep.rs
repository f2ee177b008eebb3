//! Expert parallelism (TorchTitan's `ExpertParallel`, DeepSeek-V3's EP): the routed experts of
//! every MoE layer are split over the EP group — rank `r` of `E` holds experts
//! `[r·n/E, (r+1)·n/E)` — and each rank's routed tokens travel to their experts and back:
//!
//! 1. *counts*: every rank's tokens per expert are all-gathered (a few integers), so each rank
//!    knows how many rows it sends to and receives from every other;
//! 2. *dispatch*: the rows, sorted by expert and so grouped by destination, go out in one
//!    all-to-all ([`all_to_all_rows`], differentiable: its gradient is the all-to-all back);
//! 3. the received rows are regrouped by local expert and run through the local experts (the
//!    grouped GEMM), then put back in arrival order;
//! 4. *combine*: the all-to-all back returns every row to the rank that routed it.
//!
//! Capacity-free: no token is dropped, so the result equals the single-rank model.

use crate::comm::CommExt;
use crate::registry::{with_group, GroupHandle};
use burn::backend::autodiff::{
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
    Autodiff,
};
use burn::backend::{backend_extension, tensor::FloatTensor, tensor::IntTensor, Backend, Dispatch, Flex, TensorMetadata};
use burn::prelude::*;
use burn::tensor::DType;
use std::cell::Cell;
use std::time::Instant;
use titan_models::hooks::{ActivationHooks, Hooks};

thread_local! {
    static A2A_SECONDS: Cell<f64> = const { Cell::new(0.0) };
}

/// This thread's time in the expert all-to-alls (dispatch, combine and their gradients, with
/// the waits for other ranks) since the last call, in seconds.
pub fn take_all_to_all_seconds() -> f64 {
    A2A_SECONDS.with(|s| s.replace(0.0))
}

/// On every device the rows are staged through host memory (read, the communicator's
/// all-to-all, written back to the tensor's device in its own type); the Fusion backend runs it
/// eagerly (the default body), in program order with the other collectives.
#[backend_extension(Flex, Autodiff, Cube: cfg(feature = "cube"), Fusion: cfg(feature = "cube"))]
pub trait ExpertAllToAllOps: Backend {
    /// Rows of `x: [Σ send, D]` to the group's ranks (`send[j]` rows to rank `j`, in order);
    /// returns the `recv[i]` rows from each rank `i`, in rank order. The gradient is the same
    /// exchange back (`recv` and `send` swapped).
    #[fusion(default)]
    fn expert_all_to_all(x: FloatTensor<Self>, send: IntTensor<Self>, recv: IntTensor<Self>, group: u64) -> FloatTensor<Self> {
        staged_all_to_all::<Self>(x, send, recv, group)
    }
}

impl ExpertAllToAllOps for Flex {}

#[cfg(feature = "cube")]
impl ExpertAllToAllOps for burn_cubecl::CubeBackend {}

fn host_ints<B: Backend>(t: IntTensor<B>) -> Vec<usize> {
    let data = titan_kernels::transfer::read_int::<B>(t);
    data.convert_dtype(DType::I64).try_into_vec_as::<i64>().expect("i64 data").into_iter().map(|v| v as usize).collect()
}

fn staged_all_to_all<B: Backend>(x: FloatTensor<B>, send: IntTensor<B>, recv: IntTensor<B>, group: u64) -> FloatTensor<B> {
    let (dtype, device, shape) = (x.dtype(), x.device(), x.shape().to_vec());
    let d = shape[1];
    let data = titan_kernels::transfer::read_float::<B>(x);
    let data = data.convert_dtype(DType::F32).try_into_vec_as::<f32>().expect("f32 data");
    let (send, recv) = (host_ints::<B>(send), host_ints::<B>(recv));
    let mut parts = Vec::with_capacity(send.len());
    let mut at = 0;
    for &s in &send {
        parts.push(data[at * d..(at + s) * d].to_vec());
        at += s;
    }
    let start = Instant::now();
    let got = with_group(group, |c| c.all_to_all(&parts)).unwrap_or_else(|e| panic!("{e}"));
    A2A_SECONDS.with(|s| s.set(s.get() + start.elapsed().as_secs_f64()));
    for (i, (g, &r)) in got.iter().zip(&recv).enumerate() {
        assert_eq!(g.len(), r * d, "expert all-to-all: rank {i} sent {} rows, the counts said {r}", g.len() / d.max(1));
    }
    let rows: usize = recv.iter().sum();
    titan_kernels::transfer::write_float::<B>(TensorData::new(got.concat(), [rows, d]).convert_dtype(dtype), &device)
}

#[derive(Debug)]
struct AllToAllBackward;

impl<B: Backend + ExpertAllToAllOps> Backward<B, 1> for AllToAllBackward {
    /// (send, recv, group) of the forward exchange.
    type State = (IntTensor<B>, IntTensor<B>, u64);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _c: &mut Checkpointer) {
        let [parent] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let (send, recv, group) = ops.state;
        let back = B::expert_all_to_all(grad, recv, send, group);
        if let Some(node) = parent {
            grads.register::<B>(node.id, back);
        }
    }
}

impl<B: Backend + ExpertAllToAllOps, C: CheckpointStrategy> ExpertAllToAllOps for Autodiff<B, C> {
    fn expert_all_to_all(x: FloatTensor<Self>, send: IntTensor<Self>, recv: IntTensor<Self>, group: u64) -> FloatTensor<Self> {
        let guard = x.node();
        let out = B::expert_all_to_all(x.into_primitive(), send.clone(), recv.clone(), group);
        // Compute-bound: a checkpointing strategy never re-runs a collective.
        match AllToAllBackward.prepare::<C>([guard]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((send, recv, group), out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }
}

/// [`ExpertAllToAllOps::expert_all_to_all`] on Burn tensors.
pub fn all_to_all_rows(x: Tensor<2>, send: &[usize], recv: &[usize], group: &GroupHandle) -> Tensor<2> {
    let device = x.device();
    let ints = |v: &[usize]| titan_kernels::transfer::to_device::<1, Int>(TensorData::new(v.iter().map(|&c| c as i64).collect(), [v.len()]), &device);
    Tensor::from_dispatch(Dispatch::expert_all_to_all(
        x.into_dispatch(),
        ints(send).into_dispatch(),
        ints(recv).into_dispatch(),
        group.id(),
    ))
}

/// Who sends what: `counts[i][e]` rows of rank `i` go to expert `e`.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertRoute {
    pub counts: Vec<Vec<usize>>,
    /// Experts per rank.
    pub per_rank: usize,
    pub rank: usize,
}

impl ExpertRoute {
    fn experts_of(&self, r: usize) -> std::ops::Range<usize> {
        r * self.per_rank..(r + 1) * self.per_rank
    }

    /// Rows this rank sends to each rank.
    pub fn send(&self) -> Vec<usize> {
        let mine = &self.counts[self.rank];
        (0..self.counts.len()).map(|j| mine[self.experts_of(j)].iter().sum()).collect()
    }

    /// Rows this rank receives from each rank.
    pub fn recv(&self) -> Vec<usize> {
        self.counts.iter().map(|c| c[self.experts_of(self.rank)].iter().sum()).collect()
    }

    /// Rows per local expert, over all senders.
    pub fn local_sizes(&self) -> Vec<usize> {
        self.experts_of(self.rank).map(|e| self.counts.iter().map(|c| c[e]).sum()).collect()
    }

    /// For each row in local-expert order (expert, then sender), its index in arrival order
    /// (sender, then expert).
    pub fn regroup(&self) -> Vec<usize> {
        let local = self.experts_of(self.rank);
        // Arrival offset of (sender i, local expert l).
        let mut offset = vec![vec![0; self.per_rank]; self.counts.len()];
        let mut at = 0;
        for (i, c) in self.counts.iter().enumerate() {
            for (l, e) in local.clone().enumerate() {
                offset[i][l] = at;
                at += c[e];
            }
        }
        let mut out = Vec::with_capacity(at);
        for (l, e) in local.clone().enumerate() {
            for (i, c) in self.counts.iter().enumerate() {
                out.extend(offset[i][l]..offset[i][l] + c[e]);
            }
        }
        out
    }
}

/// The inverse of a permutation.
fn inverse(p: &[usize]) -> Vec<usize> {
    let mut inv = vec![0; p.len()];
    for (i, &j) in p.iter().enumerate() {
        inv[j] = i;
    }
    inv
}

/// The activation side of expert parallelism: the other hooks (`inner`) unchanged, the routed
/// experts across the EP group.
#[derive(Debug)]
pub struct ExpertParallelHooks {
    pub inner: Hooks,
    pub group: GroupHandle,
}

impl ActivationHooks for ExpertParallelHooks {
    fn inner(&self) -> Option<&Hooks> {
        Some(&self.inner)
    }

    fn experts(&self, xs: Tensor<2>, counts: &[usize], local: &dyn Fn(Tensor<2>, &[usize]) -> Tensor<2>) -> Tensor<2> {
        let (n, rank) = (self.group.size(), self.group.rank());
        assert!(counts.len() % n == 0, "{} experts do not split over {n} expert-parallel ranks", counts.len());
        let route = ExpertRoute { counts: gather_counts(counts, &self.group), per_rank: counts.len() / n, rank };
        let device = xs.device();
        let ints = |v: Vec<usize>| titan_kernels::transfer::to_device::<1, Int>(TensorData::new(v.iter().map(|&i| i as i64).collect(), [v.len()]), &device);
        let (send, recv) = (route.send(), route.recv());
        let arrived = all_to_all_rows(xs, &send, &recv, &self.group);
        let order = route.regroup();
        let by_expert = arrived.select(0, ints(order.clone()));
        let out = local(by_expert, &route.local_sizes());
        let back = out.select(0, ints(inverse(&order)));
        all_to_all_rows(back, &recv, &send, &self.group)
    }
}

/// Every rank's tokens per expert (`[rank][expert]`), all-gathered.
fn gather_counts(counts: &[usize], group: &GroupHandle) -> Vec<Vec<usize>> {
    let mine: Vec<u8> = counts.iter().flat_map(|&c| (c as u64).to_le_bytes()).collect();
    let mut all = vec![0u8; mine.len() * group.size()];
    with_group(group.id(), |c| c.all_gather(&mine, &mut all)).unwrap_or_else(|e| panic!("{e}"));
    all.chunks(mine.len())
        .map(|r| r.chunks(8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize).collect())
        .collect()
}

#[cfg(test)]
mod tests;
