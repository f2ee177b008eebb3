//! Context parallelism (TorchTitan's `context_parallel_degree`): every sequence is split over
//! the `C` ranks of the `cp` group, and attention — the one place positions meet — runs as a
//! ring.
//!
//! * **Load-balanced sharding** (head-tail): a row of `T` tokens is cut into `2C` chunks of
//!   `L = T / 2C`; rank `r` holds chunks `r` and `2C − 1 − r`, so under a causal mask every rank
//!   has the same work. Everything outside attention is per-token and runs on the local `2L`
//!   tokens unchanged (RoPE with their global positions).
//! * **Ring attention** (`rotate_method = "ring"`): the K/V block of each rank travels the ring by
//!   send/recv; at each of the `C` steps the local queries attend to the block they hold, with
//!   each query's visible keys a window of it (global positions: causal, and within the
//!   query's document under block-causal masking), and the partial outputs are merged by their
//!   log-sum-exp. The backward recomputes the same steps from the merged output and
//!   log-sum-exp (FlashAttention-2's backward needs nothing else), and each block's `dK, dV`
//!   travel the ring with it back to their owner. No rank ever holds more than two K/V blocks.
//! * `rotate_method = "allgather"`: the K/V blocks are all-gathered into the whole sequence,
//!   one attention call, and the `dK, dV` of every position reduce-scattered back.
//!
//! The attention kernels are the fused CPU ones of `titan_kernels` (per-row key windows), on the
//! host where the communicators are; on a GPU device the blocks are staged through host memory.

use crate::comm::Communicator;
use crate::registry::{with_group, GroupHandle};
use crate::CommExt;
use burn::backend::autodiff::{
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
    Autodiff,
};
use burn::backend::{
    backend_extension,
    tensor::{FloatTensor, IntTensor},
    AutodiffBackend, Backend, Dispatch, Flex, TensorMetadata,
};
use burn::prelude::*;
use burn::tensor::DType;
use titan_kernels::attention::cpu::{self, Dims, Windows};
use titan_models::hooks::{ActivationHooks, Hooks};

/// How K/V reach every rank of the ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rotate {
    /// Block by block around the ring (send/recv), two blocks in memory at a time.
    Ring,
    /// All blocks gathered at once, gradients reduce-scattered back.
    AllGather,
}

/// The split an attention call runs under.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CpSpec {
    /// The registry id of the `cp` group.
    pub group: u64,
    pub degree: usize,
    pub rank: usize,
    pub rotate: Rotate,
}

impl CpSpec {
    pub fn new(group: &GroupHandle, rotate: Rotate) -> Self {
        Self { group: group.id(), degree: group.size(), rank: group.rank(), rotate }
    }

    /// The two chunks (of `2C`) that `rank` holds, in order.
    pub fn chunks(&self, rank: usize) -> [usize; 2] {
        [rank, 2 * self.degree - 1 - rank]
    }

    /// The columns of a `seq_len` row this rank holds (their global positions), ascending.
    pub fn columns(&self, seq_len: usize) -> Vec<usize> {
        let l = seq_len / (2 * self.degree);
        self.chunks(self.rank).iter().flat_map(|&c| c * l..(c + 1) * l).collect()
    }

    /// This rank's columns of row-major `[rows, seq_len]` values.
    pub fn shard<T: Copy>(&self, values: &[T], seq_len: usize) -> Vec<T> {
        let cols = self.columns(seq_len);
        values.chunks(seq_len).flat_map(|row| cols.iter().map(move |&c| row[c])).collect()
    }

    /// Positions below `x` among the `2L` keys rank `src` holds (its two chunks, ascending).
    fn below(&self, src: usize, x: usize, l: usize) -> usize {
        self.chunks(src).iter().map(|&c| x.saturating_sub(c * l).min(l)).sum()
    }

    /// The key windows of this rank's queries (`[b, 2L]`, their documents' global starts in
    /// `starts`) in the block of rank `src`: keys at or after the document start and at or
    /// before the query.
    fn windows(&self, src: usize, starts: &[i64], b: usize, t: usize) -> (Vec<i64>, Vec<i64>) {
        let l = t / 2;
        let pos = self.columns(2 * self.degree * l);
        let (mut lo, mut hi) = (Vec::with_capacity(b * t), Vec::with_capacity(b * t));
        for row in 0..b {
            for (i, &p) in pos.iter().enumerate() {
                lo.push(self.below(src, starts[row * t + i].max(0) as usize, l) as i64);
                hi.push(self.below(src, p + 1, l) as i64);
            }
        }
        (lo, hi)
    }
}

/// A tag range of its own (the `cp` group's pairs are not the pipeline's, but keep them apart).
const TAG: u32 = 1 << 22;

/// Sends `bufs` to the next rank of the ring and returns what the previous one sent.
fn shift(bufs: Vec<Vec<f32>>, c: &dyn Communicator, tag: u32) -> Vec<Vec<f32>> {
    let (n, r) = (c.size(), c.rank());
    let flat: Vec<f32> = bufs.concat();
    c.send(&flat, (r + 1) % n, TAG + tag).expect("context parallel: ring send");
    let mut got = vec![0f32; flat.len()];
    c.recv(&mut got, (r + n - 1) % n, TAG + tag).expect("context parallel: ring receive");
    let mut out = Vec::with_capacity(bufs.len());
    let mut at = 0;
    for b in &bufs {
        out.push(got[at..at + b.len()].to_vec());
        at += b.len();
    }
    out
}

/// Folds a partial result `(o2, lse2)` into `(o, lse)` (both normalised over their keys).
fn merge(o: &mut [f32], lse: &mut [f32], o2: &[f32], lse2: &[f32], d: usize) {
    for (row, (l, &l2)) in lse.iter_mut().zip(lse2).enumerate() {
        if l2 == f32::NEG_INFINITY {
            continue;
        }
        let m = l.max(l2);
        let (w1, w2) = ((*l - m).exp(), (l2 - m).exp());
        let total = w1 + w2;
        for (x, &y) in o[row * d..(row + 1) * d].iter_mut().zip(&o2[row * d..(row + 1) * d]) {
            *x = (*x * w1 + y * w2) / total;
        }
        *l = m + total.ln();
    }
}

/// `[b, kv, 2L, d]` blocks of every rank (gathered in rank order) → `[b, kv, T, d]` in global
/// position order (`to_global`), or back.
fn reorder(x: &[f32], s: &CpSpec, n: Dims, to_global: bool) -> Vec<f32> {
    let (l, d, c) = (n.tk / 2, n.d, s.degree);
    let per_rank = n.b * n.kv * n.tk * d;
    let mut out = vec![0f32; x.len()];
    let t = 2 * c * l;
    for r in 0..c {
        for (half, &chunk) in s.chunks(r).iter().enumerate() {
            for bh in 0..n.b * n.kv {
                let blocked = r * per_rank + (bh * n.tk + half * l) * d;
                let global = (bh * t + chunk * l) * d;
                let (from, to) = if to_global { (blocked, global) } else { (global, blocked) };
                out[to..to + l * d].copy_from_slice(&x[from..from + l * d]);
            }
        }
    }
    out
}

/// The whole sequence's K and V on every rank, in global order (`allgather`).
fn gather_kv(k: &[f32], v: &[f32], s: &CpSpec, n: Dims, c: &dyn Communicator) -> (Vec<f32>, Vec<f32>, Dims) {
    let all = |x: &[f32]| {
        let mut g = vec![0f32; x.len() * s.degree];
        c.all_gather(x, &mut g).expect("context parallel: all-gather K/V");
        reorder(&g, s, n, true)
    };
    let (kf, vf) = (all(k), all(v));
    (kf, vf, Dims { tk: n.tk * s.degree, ..n })
}

/// The global-order windows of this rank's queries: `start ..= position`.
fn global_windows(s: &CpSpec, starts: &[i64], b: usize, t: usize) -> (Vec<i64>, Vec<i64>) {
    let pos = s.columns(s.degree * t);
    let lo = starts.to_vec();
    let hi = (0..b).flat_map(|_| pos.iter().map(|&p| p as i64 + 1)).collect();
    (lo, hi)
}

/// Output and log-sum-exp of this rank's queries against the whole sequence's keys.
fn forward_host(q: &[f32], k: &[f32], v: &[f32], starts: &[i64], n: Dims, s: &CpSpec, scale: f32) -> (Vec<f32>, Vec<f32>) {
    with_group(s.group, |c| match s.rotate {
        Rotate::AllGather => {
            let (kf, vf, nf) = gather_kv(k, v, s, n, c);
            let (lo, hi) = global_windows(s, starts, n.b, n.t);
            cpu::forward(q, &kf, &vf, &Windows { lo: &lo, hi: &hi, t: n.t }, nf, scale)
        }
        Rotate::Ring => {
            let mut o = vec![0f32; q.len()];
            let mut lse = vec![f32::NEG_INFINITY; n.b * n.h * n.t];
            let mut kv = vec![k.to_vec(), v.to_vec()];
            for step in 0..s.degree {
                let src = (s.rank + s.degree - step) % s.degree;
                let (lo, hi) = s.windows(src, starts, n.b, n.t);
                let (o2, l2) = cpu::forward(q, &kv[0], &kv[1], &Windows { lo: &lo, hi: &hi, t: n.t }, n, scale);
                merge(&mut o, &mut lse, &o2, &l2, n.d);
                if step + 1 < s.degree {
                    kv = shift(kv, c, step as u32);
                }
            }
            (o, lse)
        }
    })
}

/// `(dq, dk, dv)` of this rank's queries and keys.
#[allow(clippy::too_many_arguments)]
fn backward_host(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    starts: &[i64],
    o: &[f32],
    lse: &[f32],
    d_o: &[f32],
    n: Dims,
    s: &CpSpec,
    scale: f32,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    with_group(s.group, |c| match s.rotate {
        Rotate::AllGather => {
            let (kf, vf, nf) = gather_kv(k, v, s, n, c);
            let (lo, hi) = global_windows(s, starts, n.b, n.t);
            let (dq, dkf, dvf) = cpu::backward(q, &kf, &vf, &Windows { lo: &lo, hi: &hi, t: n.t }, o, lse, d_o, nf, scale);
            // Every rank's partial dK/dV for every position, summed back onto the owners.
            let scatter = |full: &[f32]| {
                let blocks = reorder(full, s, n, false);
                let mut mine = vec![0f32; k.len()];
                c.reduce_scatter(&blocks, &mut mine, crate::ReduceOp::Sum).expect("context parallel: reduce-scatter dK/dV");
                mine
            };
            (dq, scatter(&dkf), scatter(&dvf))
        }
        Rotate::Ring => {
            let mut dq = vec![0f32; q.len()];
            let mut kv = vec![k.to_vec(), v.to_vec()];
            let mut dkv = vec![vec![0f32; k.len()], vec![0f32; v.len()]];
            for step in 0..s.degree {
                let src = (s.rank + s.degree - step) % s.degree;
                let (lo, hi) = s.windows(src, starts, n.b, n.t);
                let w = Windows { lo: &lo, hi: &hi, t: n.t };
                let (dq2, dk2, dv2) = cpu::backward(q, &kv[0], &kv[1], &w, o, lse, d_o, n, scale);
                add(&mut dq, &dq2);
                add(&mut dkv[0], &dk2);
                add(&mut dkv[1], &dv2);
                // The block moves on with its gradient; after C moves the gradient is home.
                let tag = (s.degree + step) as u32;
                if step + 1 < s.degree {
                    let mut both = shift([std::mem::take(&mut kv), std::mem::take(&mut dkv)].concat(), c, tag);
                    dkv = both.split_off(2);
                    kv = both;
                } else {
                    dkv = shift(dkv, c, tag);
                }
            }
            let dv = dkv.pop().expect("dv");
            (dq, dkv.pop().expect("dk"), dv)
        }
    })
}

fn add(acc: &mut [f32], x: &[f32]) {
    acc.iter_mut().zip(x).for_each(|(a, b)| *a += b);
}

/// On every device the ring runs on the host: the blocks are read (f32), the fused CPU
/// attention and the communicator's send/recv run there, and the results are written back to
/// the tensors' device in their own type — the portable path, for every vendor. The Fusion
/// backend runs it eagerly (the default bodies), in program order with the other collectives.
#[backend_extension(Flex, Autodiff, Cube: cfg(feature = "cube"), Fusion: cfg(feature = "cube"))]
pub trait ContextAttentionOps: Backend {
    /// Output and log-sum-exp `[B, H, 2L]` of this rank's queries over the whole sequence.
    #[fusion(default)]
    fn cp_attention_fwd(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        starts: IntTensor<Self>,
        spec: CpSpec,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        staged_fwd::<Self>(q, k, v, starts, spec)
    }

    /// `(dq, dk, dv)` for this rank's queries and keys.
    #[allow(clippy::too_many_arguments)]
    #[fusion(default)]
    fn cp_attention_bwd(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        starts: IntTensor<Self>,
        o: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        d_o: FloatTensor<Self>,
        spec: CpSpec,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        staged_bwd::<Self>(q, k, v, starts, o, lse, d_o, spec)
    }

    /// The differentiable op.
    #[fusion(default)]
    fn cp_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        starts: IntTensor<Self>,
        spec: CpSpec,
    ) -> FloatTensor<Self> {
        Self::cp_attention_fwd(q, k, v, starts, spec).0
    }
}

impl ContextAttentionOps for Flex {}

#[cfg(feature = "cube")]
impl ContextAttentionOps for burn_cubecl::CubeBackend {}

fn host_f32<B: Backend>(t: FloatTensor<B>) -> Vec<f32> {
    let data = titan_kernels::transfer::read_float::<B>(t);
    data.convert_dtype(DType::F32).try_into_vec_as::<f32>().expect("f32 data")
}

fn host_i64<B: Backend>(t: IntTensor<B>) -> Vec<i64> {
    let data = titan_kernels::transfer::read_int::<B>(t);
    data.convert_dtype(DType::I64).try_into_vec_as::<i64>().expect("i64 data")
}

/// `v` as a tensor of `shape` and `dtype`, on the device of `like`.
fn like<B: Backend>(v: Vec<f32>, shape: Vec<usize>, dtype: DType, like: &FloatTensor<B>) -> FloatTensor<B> {
    titan_kernels::transfer::write_float::<B>(TensorData::new(v, shape).convert_dtype(dtype), &like.device())
}

fn staged_fwd<B: Backend>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    starts: IntTensor<B>,
    spec: CpSpec,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let (n, dtype, dev) = (Dims::of(&q.shape(), &k.shape()), q.dtype(), q.clone());
    let scale = 1.0 / (n.d as f32).sqrt();
    let (o, lse) = forward_host(&host_f32::<B>(q), &host_f32::<B>(k), &host_f32::<B>(v), &host_i64::<B>(starts), n, &spec, scale);
    (like::<B>(o, vec![n.b, n.h, n.t, n.d], dtype, &dev), like::<B>(lse, vec![n.b, n.h, n.t], DType::F32, &dev))
}

#[allow(clippy::too_many_arguments)]
fn staged_bwd<B: Backend>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    starts: IntTensor<B>,
    o: FloatTensor<B>,
    lse: FloatTensor<B>,
    d_o: FloatTensor<B>,
    spec: CpSpec,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let (n, dtype, dev) = (Dims::of(&q.shape(), &k.shape()), q.dtype(), q.clone());
    let scale = 1.0 / (n.d as f32).sqrt();
    let (dq, dk, dv) = backward_host(
        &host_f32::<B>(q),
        &host_f32::<B>(k),
        &host_f32::<B>(v),
        &host_i64::<B>(starts),
        &host_f32::<B>(o),
        &host_f32::<B>(lse),
        &host_f32::<B>(d_o),
        n,
        &spec,
        scale,
    );
    let kv = vec![n.b, n.kv, n.tk, n.d];
    (like::<B>(dq, vec![n.b, n.h, n.t, n.d], dtype, &dev), like::<B>(dk, kv.clone(), dtype, &dev), like::<B>(dv, kv, dtype, &dev))
}

#[derive(Debug)]
struct CpAttentionBackward;

impl<B: Backend + ContextAttentionOps> Backward<B, 3> for CpAttentionBackward {
    type State = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, IntTensor<B>, FloatTensor<B>, FloatTensor<B>, CpSpec);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node_q, node_k, node_v] = ops.parents;
        let d_o = grads.consume::<B>(&ops.node);
        let (q, k, v, starts, o, lse, spec) = ops.state;
        let (dq, dk, dv) = B::cp_attention_bwd(q, k, v, starts, o, lse, d_o, spec);
        for (node, grad) in [(node_q, dq), (node_k, dk), (node_v, dv)] {
            if let Some(node) = node {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

impl<B: Backend + ContextAttentionOps, C: CheckpointStrategy> ContextAttentionOps for Autodiff<B, C> {
    fn cp_attention_fwd(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        starts: IntTensor<Self>,
        spec: CpSpec,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (o, lse) = B::cp_attention_fwd(q.into_primitive(), k.into_primitive(), v.into_primitive(), starts, spec);
        (Self::from_inner(o), Self::from_inner(lse))
    }

    fn cp_attention_bwd(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        starts: IntTensor<Self>,
        o: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        d_o: FloatTensor<Self>,
        spec: CpSpec,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let (dq, dk, dv) = B::cp_attention_bwd(
            q.into_primitive(),
            k.into_primitive(),
            v.into_primitive(),
            starts,
            o.into_primitive(),
            lse.into_primitive(),
            d_o.into_primitive(),
            spec,
        );
        (Self::from_inner(dq), Self::from_inner(dk), Self::from_inner(dv))
    }

    fn cp_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        starts: IntTensor<Self>,
        spec: CpSpec,
    ) -> FloatTensor<Self> {
        let guards = [q.node(), k.node(), v.node()];
        let (q, k, v) = (q.into_primitive(), k.into_primitive(), v.into_primitive());
        let (o, lse) = B::cp_attention_fwd(q.clone(), k.clone(), v.clone(), starts.clone(), spec);
        // Compute-bound: a checkpointing strategy never re-runs it (it communicates).
        match CpAttentionBackward.prepare::<C>(guards).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((q, k, v, starts, o.clone(), lse, spec), o),
            OpsKind::UnTracked(prep) => prep.finish(o),
        }
    }
}

/// Attention of this rank's queries `[B, H, 2L, D]` (its two chunks of every row) over the
/// whole sequence's keys, whose blocks `[B, KV, 2L, D]` the `cp` ranks hold; `starts`: each
/// query's document start (global position; `None`: plain causal).
pub fn context_attention(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, starts: Option<Tensor<2, Int>>, spec: CpSpec) -> Tensor<4> {
    let [b, _, t, _] = q.dims();
    assert!(t % 2 == 0, "context parallel attention: {t} local positions are not two equal chunks");
    let starts = starts.unwrap_or_else(|| Tensor::zeros([b, t], &q.device()));
    Tensor::from_dispatch(Dispatch::cp_attention(
        q.into_dispatch(),
        k.into_dispatch(),
        v.into_dispatch(),
        starts.into_dispatch(),
        spec,
    ))
}

/// The model's activation hooks under context parallelism: attention through the ring, the
/// rest as the inner hooks (tensor parallelism's, or none) do it.
#[derive(Debug)]
pub struct ContextParallelHooks {
    pub inner: Hooks,
    pub spec: CpSpec,
}

impl ActivationHooks for ContextParallelHooks {
    fn inner(&self) -> Option<&Hooks> {
        Some(&self.inner)
    }
    fn attention(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, starts: Option<Tensor<2, Int>>, _fused: bool) -> Tensor<4> {
        context_attention(q, k, v, starts, self.spec)
    }
}

#[cfg(test)]
mod tests;
