//! Launching the kernels of [`super::kernels`] on burn's CubeCL tensors.

use super::kernels as kern;
use super::{adamw as adamw_kernel, dims, empty, flash, grouped, reduce, rows, rows_serial, tune};
use crate::attention::FusedAttentionOps;
use crate::grouped::GroupedOps;
use crate::ops::{AdamWStep, KernelOps};
use burn::backend::cubecl::dtype_to_storage_type;
use burn::tensor::DType;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeBackend;
use cubecl::{calculate_cube_count_elemwise, server::CubeCountSelection, CubeCount, CubeDim};

/// An uninitialised tensor of `shape` on `like`'s device, with its float type.
fn empty_like(like: &CubeTensor, shape: Vec<usize>) -> CubeTensor {
    empty(like, shape, like.dtype)
}

/// One thread per item of `n`.
fn grid(like: &CubeTensor, n: usize) -> (CubeCount, CubeDim) {
    let dim = CubeDim::new(&like.client, n);
    (calculate_cube_count_elemwise(&like.client, n, dim), dim)
}

/// One cube per row for the row reductions of [`super::rows`]: `(count, cube, units)` with
/// `units` threads a cube, the largest power of two up to 256 the device allows (256 threads
/// keep 8 warps busy on a 768-wide row; the tree reduction needs a power of two).
fn row_grid(like: &CubeTensor, rows: usize) -> (CubeCount, CubeDim, usize) {
    let units = reduce::launch::units(like);
    let count = CubeCountSelection::new(&like.client, rows as u32).cube_count();
    (count, CubeDim::new_1d(units as u32), units)
}

/// `(rows, last dim)` of a tensor seen as a matrix over its last dimension.
fn rows_cols(t: &CubeTensor) -> (usize, usize) {
    let d = dims(t);
    let cols = *d.last().expect("a tensor with at least one dimension");
    (d.iter().product::<usize>() / cols.max(1), cols)
}

impl KernelOps for CubeBackend {
    fn rms_norm_fwd(x: CubeTensor, w: CubeTensor, eps: f32) -> CubeTensor {
        let (x, w) = (into_contiguous(x), into_contiguous(w));
        let (rows, dim) = rows_cols(&x);
        let dtype = dtype_to_storage_type(x.dtype);
        let launch = |per_cube: bool, y: &CubeTensor| {
            let args = (x.clone().into_tensor_arg(), w.clone().into_tensor_arg(), y.clone().into_tensor_arg());
            let (r, d) = (rows as u32, dim as u32);
            if per_cube {
                let (count, cube, units) = row_grid(&x, rows);
                rows::rms_norm_fwd::launch(&x.client, count, cube, args.0, args.1, args.2, r, d, eps, units, dtype);
            } else {
                let (count, cube) = grid(&x, rows);
                rows_serial::rms_norm_fwd::launch(&x.client, count, cube, args.0, args.1, args.2, r, d, eps, dtype);
            }
        };
        let per_cube = tune::per_cube("rms_norm", &x, rows, dim, |v| launch(v, &empty_like(&x, dims(&x))));
        let y = empty_like(&x, dims(&x));
        launch(per_cube, &y);
        y
    }

    fn rms_norm_bwd(x: CubeTensor, w: CubeTensor, dy: CubeTensor, eps: f32) -> (CubeTensor, CubeTensor) {
        let (x, w, dy) = (into_contiguous(x), into_contiguous(w), into_contiguous(dy));
        let (rows, dim) = rows_cols(&x);
        let dtype = dtype_to_storage_type(x.dtype);
        let launch = |per_cube: bool, dx: &CubeTensor, dw_rows: &CubeTensor| {
            let (xa, wa, dya) = (x.clone().into_tensor_arg(), w.clone().into_tensor_arg(), dy.clone().into_tensor_arg());
            let (dxa, dwa) = (dx.clone().into_tensor_arg(), dw_rows.clone().into_tensor_arg());
            let (r, d) = (rows as u32, dim as u32);
            if per_cube {
                let (count, cube, units) = row_grid(&x, rows);
                rows::rms_norm_bwd::launch(&x.client, count, cube, xa, wa, dya, dxa, dwa, r, d, eps, units, dtype);
            } else {
                let (count, cube) = grid(&x, rows);
                rows_serial::rms_norm_bwd::launch(&x.client, count, cube, xa, wa, dya, dxa, dwa, r, d, eps, dtype);
            }
        };
        let scratch = || empty_like(&x, dims(&x));
        let per_cube = tune::per_cube("rms_norm backward", &x, rows, dim, |v| launch(v, &scratch(), &scratch()));
        let (dx, dw_rows) = (scratch(), scratch());
        launch(per_cube, &dx, &dw_rows);
        (dx, reduce::launch::column_sum(dw_rows))
    }

    fn silu_mul_fwd(gate: CubeTensor, up: CubeTensor) -> CubeTensor {
        let (gate, up) = (into_contiguous(gate), into_contiguous(up));
        let n = gate.meta.num_elements();
        let y = empty_like(&gate, dims(&gate));
        let (count, cube) = grid(&gate, n);
        let dtype = dtype_to_storage_type(gate.dtype);
        kern::silu_mul_fwd::launch(
            &gate.client.clone(),
            count,
            cube,
            gate.into_tensor_arg(),
            up.into_tensor_arg(),
            y.clone().into_tensor_arg(),
            n as u32,
            dtype,
        );
        y
    }

    fn silu_mul_bwd(gate: CubeTensor, up: CubeTensor, dy: CubeTensor) -> (CubeTensor, CubeTensor) {
        let (gate, up, dy) = (into_contiguous(gate), into_contiguous(up), into_contiguous(dy));
        let n = gate.meta.num_elements();
        let (dg, du) = (empty_like(&gate, dims(&gate)), empty_like(&gate, dims(&gate)));
        let (count, cube) = grid(&gate, n);
        let dtype = dtype_to_storage_type(gate.dtype);
        kern::silu_mul_bwd::launch(
            &gate.client.clone(),
            count,
            cube,
            gate.into_tensor_arg(),
            up.into_tensor_arg(),
            dy.into_tensor_arg(),
            dg.clone().into_tensor_arg(),
            du.clone().into_tensor_arg(),
            n as u32,
            dtype,
        );
        (dg, du)
    }

    fn rope_fwd(x: CubeTensor, cos: CubeTensor, sin: CubeTensor) -> CubeTensor {
        let (x, cos, sin) = (into_contiguous(x), into_contiguous(cos), into_contiguous(sin));
        let d = dims(&x);
        let (n, seq, dim) = (x.meta.num_elements(), d[d.len() - 2], d[d.len() - 1]);
        let y = empty_like(&x, d);
        let (count, cube) = grid(&x, n);
        let dtype = dtype_to_storage_type(x.dtype);
        kern::rope::launch(
            &x.client.clone(),
            count,
            cube,
            x.into_tensor_arg(),
            cos.into_tensor_arg(),
            sin.into_tensor_arg(),
            y.clone().into_tensor_arg(),
            n as u32,
            seq as u32,
            dim as u32,
            dtype,
        );
        y
    }

    fn cross_entropy_fwd(logits: CubeTensor, targets: CubeTensor) -> (CubeTensor, CubeTensor) {
        let (logits, targets) = (into_contiguous(logits), into_contiguous(targets));
        let (rows, vocab) = rows_cols(&logits);
        let dtypes = [dtype_to_storage_type(logits.dtype), dtype_to_storage_type(targets.dtype)];
        let launch = |per_cube: bool, loss: &CubeTensor, lse: &CubeTensor| {
            let (la, ta) = (logits.clone().into_tensor_arg(), targets.clone().into_tensor_arg());
            let (lossa, lsea) = (loss.clone().into_tensor_arg(), lse.clone().into_tensor_arg());
            let (r, v) = (rows as u32, vocab as u32);
            if per_cube {
                let (count, cube, units) = row_grid(&logits, rows);
                rows::cross_entropy_fwd::launch(&logits.client, count, cube, la, ta, lossa, lsea, r, v, units, dtypes);
            } else {
                let (count, cube) = grid(&logits, rows);
                rows_serial::cross_entropy_fwd::launch(&logits.client, count, cube, la, ta, lossa, lsea, r, v, dtypes);
            }
        };
        let scratch = || (empty_like(&logits, vec![rows]), empty(&logits, vec![rows], DType::F32));
        let per_cube = tune::per_cube("cross_entropy", &logits, rows, vocab, |v| {
            let (loss, lse) = scratch();
            launch(v, &loss, &lse)
        });
        let (loss, lse) = scratch();
        launch(per_cube, &loss, &lse);
        (loss, lse)
    }

    fn cross_entropy_bwd(logits: CubeTensor, targets: CubeTensor, lse: CubeTensor, dloss: CubeTensor) -> CubeTensor {
        let (logits, targets) = (into_contiguous(logits), into_contiguous(targets));
        let (lse, dloss) = (into_contiguous(lse), into_contiguous(dloss));
        let (_, vocab) = rows_cols(&logits);
        let n = logits.meta.num_elements();
        let dlogits = empty_like(&logits, dims(&logits));
        let (count, cube) = grid(&logits, n);
        let dtypes = [dtype_to_storage_type(logits.dtype), dtype_to_storage_type(targets.dtype)];
        kern::cross_entropy_bwd::launch(
            &logits.client.clone(),
            count,
            cube,
            logits.into_tensor_arg(),
            targets.into_tensor_arg(),
            lse.into_tensor_arg(),
            dloss.into_tensor_arg(),
            dlogits.clone().into_tensor_arg(),
            n as u32,
            vocab as u32,
            dtypes,
        );
        dlogits
    }

    fn adamw(
        p: CubeTensor,
        g: CubeTensor,
        m: CubeTensor,
        v: CubeTensor,
        h: AdamWStep,
    ) -> (CubeTensor, CubeTensor, CubeTensor) {
        let [p, g, m, v] = [p, g, m, v].map(into_contiguous);
        let n = p.meta.num_elements();
        let [p2, m2, v2] = [&p, &m, &v].map(|t| empty_like(t, dims(t)));
        let (count, cube) = grid(&p, n);
        let dtype = dtype_to_storage_type(p.dtype);
        adamw_kernel::adamw::launch(
            &p.client.clone(),
            count,
            cube,
            p.into_tensor_arg(),
            g.into_tensor_arg(),
            m.into_tensor_arg(),
            v.into_tensor_arg(),
            p2.clone().into_tensor_arg(),
            m2.clone().into_tensor_arg(),
            v2.clone().into_tensor_arg(),
            n as u32,
            h.one_minus_beta1,
            h.beta2,
            h.one_minus_beta2,
            h.bias2_sqrt,
            h.eps,
            h.decay,
            h.step_size,
            h.grad_scale,
            dtype,
        );
        (p2, m2, v2)
    }

    fn sum_squares(x: CubeTensor) -> CubeTensor {
        reduce::launch::sum_squares(x)
    }

    fn sum_all_fwd(x: CubeTensor) -> CubeTensor {
        reduce::launch::sum_all(x)
    }
}

impl FusedAttentionOps for CubeBackend {
    fn fused_attention_fwd(
        q: CubeTensor,
        k: CubeTensor,
        v: CubeTensor,
        starts: CubeTensor,
        scale: f64,
    ) -> (CubeTensor, CubeTensor) {
        flash::launch::forward(q, k, v, starts, scale)
    }

    fn fused_attention_bwd(
        q: CubeTensor,
        k: CubeTensor,
        v: CubeTensor,
        starts: CubeTensor,
        o: CubeTensor,
        lse: CubeTensor,
        d_o: CubeTensor,
        scale: f64,
    ) -> (CubeTensor, CubeTensor, CubeTensor) {
        flash::launch::backward(q, k, v, starts, o, lse, d_o, scale)
    }

    fn fused_attention(q: CubeTensor, k: CubeTensor, v: CubeTensor, starts: CubeTensor, scale: f64) -> CubeTensor {
        Self::fused_attention_fwd(q, k, v, starts, scale).0
    }
}

impl GroupedOps for CubeBackend {
    fn grouped_mm_fwd(x: CubeTensor, w: CubeTensor, sizes: CubeTensor) -> CubeTensor {
        let (x, w, sizes) = (into_contiguous(x), into_contiguous(w), into_contiguous(sizes));
        grouped::launch::forward(&x, &w, &sizes)
    }

    fn grouped_mm_bwd(x: CubeTensor, w: CubeTensor, sizes: CubeTensor, dy: CubeTensor) -> (CubeTensor, CubeTensor) {
        let (x, w) = (into_contiguous(x), into_contiguous(w));
        let (sizes, dy) = (into_contiguous(sizes), into_contiguous(dy));
        (grouped::launch::input_grad(&dy, &w, &sizes), grouped::launch::weight_grad(&x, &dy, &sizes))
    }
}
