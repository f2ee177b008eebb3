//! Grouped GEMM: the routed experts of a mixture-of-experts layer as one op.
//!
//! The rows of `x: [M, K]` are sorted by group (expert): the first `sizes[0]` rows belong to
//! group 0, the next `sizes[1]` to group 1, …; `w: [G, K, N]` holds one matrix per group and
//! `y[rows of g] = x[rows of g] · w[g]`. Backward: `dx[rows of g] = dy[rows of g] · w[g]ᵀ` and
//! `dw[g] = x[rows of g]ᵀ · dy[rows of g]`.
//!
//! On the CPU each group's panel is one rayon task running a single-threaded GEMM
//! ([`crate::host::gemm::matmul`]), forward and backward, so the experts run in parallel with no
//! loop of small Burn ops and no copy of the sorted rows. On CubeCL devices one kernel
//! (`crate::cube::grouped`) runs all three products, 64 × 64 output tiles of one group per cube,
//! the inner dimension staged through shared memory, each cube finding its group from the sizes
//! on the device. With `fused = false`, [`reference`] loops over the groups with Burn's matmul (on CubeCL
//! devices cubek's tuned matmul, one per expert). On CubeCL devices with
//! [`crate::choice::measuring`] on (`model.attention = "auto"`, the default) "fused" means the
//! faster of the two, measured once per device and shape (rows rounded up to a power of two):
//! on the H200 Burn's per-expert matmuls took 10 ms where the first kernel (one thread per
//! output element) took 85 ms.

use crate::host::gemm::{matmul_into, View};
use std::mem::MaybeUninit;
use crate::host::{floats, ints, tensor_like};
use burn::backend::autodiff::{
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
    Autodiff, NodeId,
};
use burn::backend::{backend_extension, tensor::FloatTensor, tensor::IntTensor, Backend, Dispatch, Flex};
use burn::backend::{AutodiffBackend, TensorMetadata};
use burn::prelude::*;
use rayon::prelude::*;

/// The output spec `[M, N]` of `x: [M, K]` times `w: [G, K, N]`.
#[cfg(feature = "cube")]
fn out_spec(
    x: &burn::backend::fusion::custom::TensorSpec,
    w: &burn::backend::fusion::custom::TensorSpec,
) -> burn::backend::fusion::custom::TensorSpec {
    burn::backend::fusion::custom::TensorSpec::new(Shape::new([x.shape[0], w.shape[2]]), x.dtype)
}

#[backend_extension(Flex, Autodiff, Cube: cfg(feature = "cube"), Fusion: cfg(feature = "cube"))]
pub trait GroupedOps: Backend {
    /// `y: [M, N]` of `x: [M, K]` (rows sorted by group), `w: [G, K, N]`, `sizes: [G]`.
    #[fusion(meta = |x, w, _sizes| out_spec(x, w))]
    fn grouped_mm_fwd(x: FloatTensor<Self>, w: FloatTensor<Self>, sizes: IntTensor<Self>) -> FloatTensor<Self>;

    /// `(dx, dw)`.
    #[fusion(meta = |x, w, _sizes, _dy| (x.clone(), w.clone()))]
    fn grouped_mm_bwd(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        sizes: IntTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// The differentiable grouped product.
    #[fusion(default)]
    fn grouped_mm(x: FloatTensor<Self>, w: FloatTensor<Self>, sizes: IntTensor<Self>) -> FloatTensor<Self> {
        Self::grouped_mm_fwd(x, w, sizes)
    }
}

/// Row offsets of the groups (`sizes.len() + 1` entries), checked against `m`.
fn offsets(sizes: &[i64], m: usize) -> Vec<usize> {
    let mut off = vec![0usize];
    for &s in sizes {
        off.push(off.last().unwrap() + usize::try_from(s).expect("group sizes are non-negative"));
    }
    assert_eq!(*off.last().unwrap(), m, "grouped GEMM: group sizes {sizes:?} do not add up to the {m} rows");
    off
}

/// Splits the first `len` elements of `out`'s spare capacity into panels of `sizes[i]` each.
fn panels<'a>(out: &'a mut Vec<f32>, sizes: impl Iterator<Item = usize>) -> Vec<&'a mut [MaybeUninit<f32>]> {
    let mut rest = out.spare_capacity_mut();
    let mut v = Vec::new();
    for s in sizes {
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(s);
        v.push(head);
        rest = tail;
    }
    v
}

/// A vector of `len` floats every element of which `fill` writes (through its panels).
fn written(len: usize, fill: impl FnOnce(&mut Vec<f32>)) -> Vec<f32> {
    let mut v = Vec::with_capacity(len);
    fill(&mut v);
    // SAFETY: `fill` wrote the first `len` elements (each panel is a whole product; the
    // panels cover `len`, checked by `offsets`).
    unsafe { v.set_len(len) };
    v
}

/// Host forward: `[M, N]`.
pub fn forward_host(x: &[f32], w: &[f32], sizes: &[i64], k: usize, n: usize) -> Vec<f32> {
    let m = x.len() / k.max(1);
    let off = offsets(sizes, m);
    written(m * n, |y| {
        let rows = off.windows(2).map(|r| (r[1] - r[0]) * n);
        panels(y, rows).into_par_iter().enumerate().for_each(|(g, c)| {
            let a = View::rows(&x[off[g] * k..off[g + 1] * k], off[g + 1] - off[g], k);
            matmul_into(c, a, View::rows(&w[g * k * n..(g + 1) * k * n], k, n));
        })
    })
}

/// Host backward: `(dx [M, K], dw [G, K, N])`.
pub fn backward_host(x: &[f32], w: &[f32], sizes: &[i64], dy: &[f32], k: usize, n: usize) -> (Vec<f32>, Vec<f32>) {
    let m = x.len() / k.max(1);
    let off = offsets(sizes, m);
    let groups = sizes.len();
    let mut dw = Vec::with_capacity(groups * k * n);
    let dx = written(m * k, |dx| {
        let dw_panels = panels(&mut dw, (0..groups).map(|_| k * n));
        let rows = off.windows(2).map(|r| (r[1] - r[0]) * k);
        panels(dx, rows).into_par_iter().zip(dw_panels).enumerate().for_each(|(g, (dxg, dwg))| {
            let rows = off[g + 1] - off[g];
            let xg = View::rows(&x[off[g] * k..off[g + 1] * k], rows, k);
            let dyg = View::rows(&dy[off[g] * n..off[g + 1] * n], rows, n);
            let wg = View::rows(&w[g * k * n..(g + 1) * k * n], k, n);
            matmul_into(dxg, dyg, wg.t());
            // An empty group's inner dimension is 0: its gradient is written as zeros.
            matmul_into(dwg, xg.t(), dyg);
        });
    });
    // SAFETY: every group's `[k, n]` panel of `dw` was written above.
    unsafe { dw.set_len(groups * k * n) };
    (dx, dw)
}

impl GroupedOps for Flex {
    fn grouped_mm_fwd(x: FloatTensor<Self>, w: FloatTensor<Self>, sizes: IntTensor<Self>) -> FloatTensor<Self> {
        let (ws, xs) = (w.shape().to_vec(), x.shape().to_vec());
        let y = forward_host(&floats(&x), &floats(&w), &ints(&sizes), ws[1], ws[2]);
        tensor_like(y, vec![xs[0], ws[2]], &x)
    }

    fn grouped_mm_bwd(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        sizes: IntTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (ws, xs) = (w.shape().to_vec(), x.shape().to_vec());
        let (dx, dw) = backward_host(&floats(&x), &floats(&w), &ints(&sizes), &floats(&dy), ws[1], ws[2]);
        (tensor_like(dx, xs, &x), tensor_like(dw, ws, &w))
    }
}

#[derive(Debug)]
struct GroupedBackward;

impl<B: Backend + GroupedOps> Backward<B, 2> for GroupedBackward {
    type State = (NodeId, NodeId, IntTensor<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, c: &mut Checkpointer) {
        let [node_x, node_w] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        let (x, w, sizes) = ops.state;
        let (x, w): (FloatTensor<B>, FloatTensor<B>) = (c.retrieve_node_output(x), c.retrieve_node_output(w));
        let (dx, dw) = B::grouped_mm_bwd(x, w, sizes, dy);
        for (node, grad) in [(node_x, dx), (node_w, dw)] {
            if let Some(node) = node {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

impl<B: Backend + GroupedOps, C: CheckpointStrategy> GroupedOps for Autodiff<B, C> {
    fn grouped_mm_fwd(x: FloatTensor<Self>, w: FloatTensor<Self>, sizes: IntTensor<Self>) -> FloatTensor<Self> {
        Self::from_inner(B::grouped_mm_fwd(x.into_primitive(), w.into_primitive(), sizes))
    }

    fn grouped_mm_bwd(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        sizes: IntTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (dx, dw) = B::grouped_mm_bwd(x.into_primitive(), w.into_primitive(), sizes, dy.into_primitive());
        (Self::from_inner(dx), Self::from_inner(dw))
    }

    fn grouped_mm(x: FloatTensor<Self>, w: FloatTensor<Self>, sizes: IntTensor<Self>) -> FloatTensor<Self> {
        let y = B::grouped_mm_fwd(x.clone().into_primitive(), w.clone().into_primitive(), sizes.clone());
        match GroupedBackward.prepare::<C>([x.node(), w.node()]).compute_bound().stateful() {
            OpsKind::Tracked(mut prep) => {
                let state = (prep.checkpoint(&x), prep.checkpoint(&w), sizes);
                prep.finish(state, y)
            }
            OpsKind::UnTracked(prep) => prep.finish(y),
        }
    }
}

/// `y[rows of g] = x[rows of g] · w[g]` for rows sorted by group (`sizes[g]` rows each): the
/// CPU or CubeCL kernel where the device has one, else [`reference`].
pub fn grouped_matmul(x: Tensor<2>, w: Tensor<3>, sizes: &[usize], fused: bool) -> Tensor<2> {
    let device = x.device();
    let fused = fused
        && crate::has_kernels(&device)
        && (!crate::on_cube(&device) || !crate::choice::measuring() || prefer_fused_grouped(&x, &w));
    if fused {
        return kernel(x, w, sizes);
    }
    reference(x, w, sizes)
}

/// The device's grouped kernel (the group sizes copied to the device).
fn kernel(x: Tensor<2>, w: Tensor<3>, sizes: &[usize]) -> Tensor<2> {
    let s = crate::transfer::to_device::<1, Int>(TensorData::new(sizes.iter().map(|&v| v as i64).collect(), [sizes.len()]), &x.device());
    Tensor::from_dispatch(Dispatch::grouped_mm(x.into_dispatch(), w.into_dispatch(), s.into_dispatch()))
}

/// Times one forward and backward of each path ([`crate::choice::prefer_fused`]) at `w`'s shape
/// and `x`'s rows rounded up to a power of two (the rows an expert layer receives change every
/// step), split evenly over the groups.
fn prefer_fused_grouped(x: &Tensor<2>, w: &Tensor<3>) -> bool {
    let ([rows, _], [groups, k, n], dtype) = (x.dims(), w.dims(), x.dtype());
    let rows = rows.max(1).next_power_of_two();
    let device = x.device().without_autodiff();
    crate::choice::prefer_fused("grouped expert GEMM", vec![rows, groups, k, n], &device, |fused| {
        let train = device.clone().autodiff();
        let normal = burn::tensor::Distribution::Normal(0.0, 1.0);
        let xr = Tensor::<2>::random([rows, k], normal, &train).cast(dtype).detach().require_grad();
        let wr = Tensor::<3>::random([groups, k, n], normal, &train).cast(dtype).detach().require_grad();
        let sizes: Vec<usize> = (0..groups).map(|g| rows / groups + usize::from(g < rows % groups)).collect();
        let y = if fused { kernel(xr.clone(), wr.clone(), &sizes) } else { reference(xr.clone(), wr.clone(), &sizes) };
        let g = y.sum().backward();
        let _ = wr.grad(&g).map(|g| g.sum().into_scalar::<f32>());
    })
}

/// The composed grouped product: one Burn matmul per non-empty group, concatenated (on CubeCL
/// devices each is Burn's CubeCL matmul kernel).
pub fn reference(x: Tensor<2>, w: Tensor<3>, sizes: &[usize]) -> Tensor<2> {
    let [_, k, n] = w.dims();
    let mut parts = Vec::new();
    let mut start = 0;
    for (g, &s) in sizes.iter().enumerate() {
        if s > 0 {
            let wg = w.clone().narrow(0, g, 1).reshape([k, n]);
            parts.push(x.clone().narrow(0, start, s).matmul(wg));
        }
        start += s;
    }
    if parts.is_empty() {
        return Tensor::<2>::zeros([0, n], &x.device()).cast(x.dtype());
    }
    Tensor::cat(parts, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;

    /// Largest |a − b|, `a` brought to `b`'s device.
    fn max_diff<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> f32 {
        (a.to_device(&b.device()) - b).abs().max().into_scalar()
    }

    /// The fused kernels (the CPU's and, with `wgpu`, the CubeCL ones on the software adapter)
    /// equal the per-group reference on the CPU in value and in both gradients, with empty
    /// groups first, in the middle and last, groups of sizes that are not multiples of 16, and
    /// products spanning several of the GPU kernel's tiles.
    #[test]
    fn grouped_kernel_matches_the_per_group_reference() {
        let cpu = Device::flex().autodiff();
        let cases = [
            (vec![3usize, 0, 5, 1], 12, 10),
            (vec![0, 7, 0], 12, 10),
            (vec![4], 12, 10),
            (vec![2, 2, 0], 12, 10),
            (vec![17, 0, 40, 9, 0], 20, 33),
            // More rows, columns and inner depth than one 64 × 64 tile and 16-deep slice.
            (vec![70, 0, 130, 1], 80, 100),
        ];
        for dev in crate::ops::tests::devices() {
            for (sizes, k, n) in &cases {
                let (m, k, n) = (sizes.iter().sum::<usize>(), *k, *n);
                let x0 = Tensor::<2>::random([m, k], Distribution::Normal(0.0, 1.0), &cpu);
                let w0 = Tensor::<3>::random([sizes.len(), k, n], Distribution::Normal(0.0, 1.0), &cpu);
                let dy = Tensor::<2>::random([m, n], Distribution::Normal(0.0, 1.0), &cpu);
                let run = |dev: &Device, fused: bool| {
                    let x = x0.clone().to_device(dev).require_grad();
                    let w = w0.clone().to_device(dev).require_grad();
                    let y = grouped_matmul(x.clone(), w.clone(), sizes, fused);
                    let g = (y.clone() * dy.clone().to_device(dev)).sum().backward();
                    (y, x.grad(&g).unwrap(), w.grad(&g).unwrap())
                };
                let (y1, dx1, dw1) = run(&dev, true);
                let (y2, dx2, dw2) = run(&cpu, false);
                assert!(max_diff(y1, y2) < 1e-4, "{dev:?} {sizes:?}");
                assert!(max_diff(dx1, dx2) < 1e-4, "{dev:?} {sizes:?}");
                assert!(max_diff(dw1, dw2) < 1e-4, "{dev:?} {sizes:?}");
            }
        }
    }
}
