//! The grouped expert GEMM tiled in shared memory: one kernel for the forward
//! (`y[rows of g] = x[rows of g] · w[g]`) and both gradients (`dx[rows of g] = dy[rows of g] ·
//! w[g]ᵀ`, `dw[g] = x[rows of g]ᵀ · dy[rows of g]`), each a set of per-group products
//! `C_g = A_g · B_g` read through strides. A cube of 16 × 16 threads computes a 64 × 64 tile of
//! one group's output, each thread a 4 × 4 block of it in float32 registers, over 16-deep slices
//! of the inner dimension staged in shared memory (each element of `A` and `B` read from memory
//! once per tile instead of once per output element, as the first kernel did: 85 ms on the H200
//! where Burn's per-expert matmuls took 10 ms). The cubes walk the groups' sizes on the device to
//! find their group, so the sizes never come back to the host.

use cubecl::prelude::*;

/// Output tile rows and columns, and the inner-dimension slice.
const TILE: usize = 64;
const SLICE: usize = 16;

/// Element `e` (of `TILE × SLICE`) of a tile staged as `tile[p · TILE + x]`: entry
/// `(x0 + x, p0 + p)` of the matrix at `base` in `src` with strides `x_stride`, `p_stride` (zero
/// outside `x_end × p_end`). Neighbouring `e` take neighbouring addresses along whichever axis is
/// contiguous in memory.
#[cube]
#[allow(clippy::too_many_arguments)]
fn stage<F: Float>(
    src: &Tensor<F>,
    base: usize,
    e: usize,
    x0: usize,
    x_end: usize,
    x_stride: usize,
    p0: usize,
    p_end: usize,
    p_stride: usize,
    tile: &mut Shared<[f32]>,
) {
    let mut x = e % TILE;
    let mut p = e / TILE;
    if p_stride == 1 {
        x = e / SLICE;
        p = e % SLICE;
    }
    let mut v = 0.0f32;
    if x0 + x < x_end && p0 + p < p_end {
        v = f32::cast_from(src[base + (x0 + x) * x_stride + (p0 + p) * p_stride]);
    }
    tile[p * TILE + x] = v;
}

/// `C_g = A_g · B_g` for every group `g` of `sizes` (rows sorted by group; `off` = the rows of
/// the groups before `g`): `A_g[i, p] = a[off·a_step + i·a_rs + p·a_cs]`,
/// `B_g[p, j] = b[g·b_group + off·b_step + p·b_rs + j·b_cs]`,
/// `C_g[i, j] = c[g·c_group + off·c_step + i·n + j]`. With `rows_mode` group `g` has `sizes[g]`
/// output rows and an inner dimension of `fixed`; otherwise `fixed` rows and `sizes[g]` inner
/// (the weight gradient: a group without rows gets zeros). Cube `(x, y)`: column tile `x`, and
/// `y` counts the row tiles of the groups in order (cubes past the last one return at once).
#[cube(launch)]
pub fn grouped_gemm<F: Float, I: Numeric>(
    a: &Tensor<F>,
    b: &Tensor<F>,
    sizes: &Tensor<I>,
    c: &mut Tensor<F>,
    groups: u32,
    fixed: u32,
    n: u32,
    a_rs: u32,
    a_cs: u32,
    a_step: u32,
    b_rs: u32,
    b_cs: u32,
    b_step: u32,
    b_group: u32,
    c_step: u32,
    c_group: u32,
    #[comptime] rows_mode: bool,
    #[comptime] unroll: bool,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    let mut y = CUBE_POS_Y as usize;
    let mut g = 0usize;
    let mut off = 0usize;
    let mut found = false;
    let mut m = 0usize;
    let mut inner = 0usize;
    while g < groups as usize {
        let size = u32::cast_from(sizes[g]) as usize;
        let rows = if rows_mode { size } else { fixed as usize };
        let tiles = (rows + TILE - 1) / TILE;
        if y < tiles {
            found = true;
            m = rows;
            inner = if rows_mode { fixed as usize } else { size };
            break;
        }
        y -= tiles;
        off += size;
        g += 1;
    }
    if !found {
        terminate!();
    }
    let (tx, ty) = (UNIT_POS_X as usize, UNIT_POS_Y as usize);
    let tid = ty * 16 + tx;
    let (row0, col0, nn) = (y * TILE, CUBE_POS_X as usize * TILE, n as usize);
    let (a_rs, a_cs, b_rs, b_cs) = (a_rs as usize, a_cs as usize, b_rs as usize, b_cs as usize);
    let a_base = off * a_step as usize;
    let b_base = g * b_group as usize + off * b_step as usize;
    let c_base = g * c_group as usize + off * c_step as usize;
    let mut acc = Array::<f32>::new(16usize);
    let mut a_tile = Shared::<[f32]>::new_slice(comptime!(TILE * SLICE));
    let mut b_tile = Shared::<[f32]>::new_slice(comptime!(TILE * SLICE));
    let mut k0 = 0usize;
    while k0 < inner {
        // 1 024 elements of each tile, 4 a thread.
        #[unroll(unroll)]
        for r in 0..4usize {
            let e = tid + r * 256;
            stage::<F>(a, a_base, e, row0, m, a_rs, k0, inner, a_cs, &mut a_tile);
            stage::<F>(b, b_base, e, col0, nn, b_cs, k0, inner, b_rs, &mut b_tile);
        }
        sync_cube();
        for p in 0..SLICE {
            #[unroll(unroll)]
            for r in 0..4usize {
                let av = a_tile[p * TILE + ty + 16 * r];
                #[unroll(unroll)]
                for cc in 0..4usize {
                    acc[r * 4 + cc] += av * b_tile[p * TILE + tx + 16 * cc];
                }
            }
        }
        sync_cube();
        k0 += SLICE;
    }
    #[unroll(unroll)]
    for r in 0..4usize {
        #[unroll(unroll)]
        for cc in 0..4usize {
            let (i, j) = (row0 + ty + 16 * r, col0 + tx + 16 * cc);
            if i < m && j < nn {
                c[c_base + i * nn + j] = F::cast_from(acc[r * 4 + cc]);
            }
        }
    }
}

/// The host side: the three products' strides and grids.
pub mod launch {
    use super::TILE;
    use crate::cube::{dims, empty, unroll_loops};
    use burn::backend::cubecl::dtype_to_storage_type;
    use burn_cubecl::tensor::CubeTensor;
    use cubecl::{CubeCount, CubeDim};

    /// Strides of one product (see [`super::grouped_gemm`]).
    struct Strides {
        a: [usize; 3],
        b: [usize; 4],
        c: [usize; 2],
    }

    /// Launches one product into a new `[shape]` tensor: `cubes_y` row tiles (an upper bound in
    /// rows mode), `n` output columns.
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        a: &CubeTensor,
        b: &CubeTensor,
        sizes: &CubeTensor,
        shape: Vec<usize>,
        fixed: usize,
        n: usize,
        s: Strides,
        rows_mode: bool,
        cubes_y: usize,
    ) -> CubeTensor {
        let out = empty(a, shape, a.dtype);
        let groups = dims(sizes)[0];
        let unroll = unroll_loops(a);
        let dtypes = [dtype_to_storage_type(a.dtype), dtype_to_storage_type(sizes.dtype)];
        super::grouped_gemm::launch(
            &a.client.clone(),
            CubeCount::new_2d(n.div_ceil(TILE).max(1) as u32, cubes_y.max(1) as u32),
            CubeDim::new_2d(16, 16),
            a.clone().into_tensor_arg(),
            b.clone().into_tensor_arg(),
            sizes.clone().into_tensor_arg(),
            out.clone().into_tensor_arg(),
            groups as u32,
            fixed as u32,
            n as u32,
            s.a[0] as u32,
            s.a[1] as u32,
            s.a[2] as u32,
            s.b[0] as u32,
            s.b[1] as u32,
            s.b[2] as u32,
            s.b[3] as u32,
            s.c[0] as u32,
            s.c[1] as u32,
            rows_mode,
            unroll,
            dtypes,
        );
        out
    }

    /// `y = x · w[g]` per group: `x: [m, k]`, `w: [G, k, n]` (contiguous).
    pub fn forward(x: &CubeTensor, w: &CubeTensor, sizes: &CubeTensor) -> CubeTensor {
        let (m, wd) = (dims(x)[0], dims(w));
        let (g, k, n) = (wd[0], wd[1], wd[2]);
        let s = Strides { a: [k, 1, k], b: [n, 1, 0, k * n], c: [n, 0] };
        gemm(x, w, sizes, vec![m, n], k, n, s, true, m.div_ceil(TILE) + g)
    }

    /// `dx = dy · w[g]ᵀ` per group: `dy: [m, n]`.
    pub fn input_grad(dy: &CubeTensor, w: &CubeTensor, sizes: &CubeTensor) -> CubeTensor {
        let (m, wd) = (dims(dy)[0], dims(w));
        let (g, k, n) = (wd[0], wd[1], wd[2]);
        let s = Strides { a: [n, 1, n], b: [1, n, 0, k * n], c: [k, 0] };
        gemm(dy, w, sizes, vec![m, k], n, k, s, true, m.div_ceil(TILE) + g)
    }

    /// `dw[g] = x[rows of g]ᵀ · dy[rows of g]`: `[G, k, n]`.
    pub fn weight_grad(x: &CubeTensor, dy: &CubeTensor, sizes: &CubeTensor) -> CubeTensor {
        let (k, n, g) = (dims(x)[1], dims(dy)[1], dims(sizes)[0]);
        let s = Strides { a: [1, k, k], b: [n, 1, n, 0], c: [0, k * n] };
        gemm(x, dy, sizes, vec![g, k, n], k, n, s, false, g * k.div_ceil(TILE))
    }
}
