//! Deterministic sums in two passes, no atomics: `Σ x²` and `Σ x` over a whole tensor (the
//! gradient norm's squares, the summed loss) and the column sums of a `[rows, cols]` matrix (RMSNorm's weight gradient).
//! Burn's reductions gave wrong results on Mesa's software adapter once a reduced axis passed
//! ≈ 65 535 elements (sum of squares of 10⁶ normal values: 261 303 instead of 998 623;
//! `sum_dim(0)` of `[65 534, 4]` off by 2.0), and Burn's full sums may add partial results
//! with atomics, in an order that changes from run to run. Here each pass has a fixed shape:
//! the first writes one partial result per cube (each thread strides over its share, the
//! cube combines by [`cube_reduce`]), the second adds each output's partials in order.

use cubecl::prelude::*;

/// The sum (`max = false`) or the maximum (`max = true`) of `v` over the cube's `units` threads
/// (a power of two; `UNIT_POS` numbers them), returned to every thread. `shared` holds `units`
/// values; it is free again on return.
#[cube]
pub fn cube_reduce(shared: &mut Shared<[f32]>, v: f32, #[comptime] units: usize, #[comptime] max: bool) -> f32 {
    let u = UNIT_POS as usize;
    shared[u] = v;
    sync_cube();
    let mut stride = comptime!(units / 2).runtime();
    while stride > 0 {
        if u < stride {
            let a = shared[u];
            let b = shared[u + stride];
            shared[u] = if max { a.max(b) } else { a + b };
        }
        sync_cube();
        stride /= 2;
    }
    let out = shared[0];
    // Nobody may overwrite slot 0 (the next reduction) before every thread has read it.
    sync_cube();
    out
}

/// Pass 1 of `Σ x²` (`square`) or `Σ x`: cube `c` of `cubes` writes `partial[c]`, the sum of
/// the (squared) elements `i ≡ c · units + u (mod cubes · units)`.
#[cube(launch)]
pub fn sum_partial<F: Float>(
    x: &Tensor<F>,
    partial: &mut Tensor<f32>,
    n: u32,
    #[comptime] units: usize,
    #[comptime] square: bool,
    #[define(F)] _dtype: ElemType,
) {
    let stride = CUBE_COUNT * units;
    let mut i = CUBE_POS * units + UNIT_POS as usize;
    let mut s = 0.0f32;
    while i < n as usize {
        let v = f32::cast_from(x[i]);
        if square {
            s += v * v;
        } else {
            s += v;
        }
        i += stride;
    }
    let mut shared = Shared::<[f32]>::new_slice(units);
    let total = cube_reduce(&mut shared, s, units, false);
    if UNIT_POS == 0 {
        partial[CUBE_POS] = total;
    }
}

/// Pass 1 of the column sums of `x: [rows, cols]`: the cube at (column block `bx`, row chunk
/// `by`) has `32 × lanes` threads; thread (`cx`, `ry`) adds column `bx · 32 + cx` over the
/// chunk's rows `ry, ry + lanes, …` (the 32 threads of a lane read 32 neighbouring columns),
/// and the lanes' sums of each column are combined in shared memory into `partial[by, column]`.
#[cube(launch)]
pub fn column_sum_partial<F: Float>(
    x: &Tensor<F>,
    partial: &mut Tensor<f32>,
    rows: u32,
    cols: u32,
    chunk: u32,
    #[comptime] lanes: usize,
    #[define(F)] _dtype: ElemType,
) {
    let cx = UNIT_POS_X as usize;
    let ry = UNIT_POS_Y as usize;
    let col = CUBE_POS_X as usize * 32 + cx;
    let start = CUBE_POS_Y as usize * chunk as usize;
    let mut end = start + chunk as usize;
    if end > rows as usize {
        end = rows as usize;
    }
    let c = cols as usize;
    let mut s = 0.0f32;
    if col < c {
        let mut r = start + ry;
        while r < end {
            s += f32::cast_from(x[r * c + col]);
            r += lanes;
        }
    }
    let mut shared = Shared::<[f32]>::new_slice(comptime!(32 * lanes));
    shared[ry * 32 + cx] = s;
    sync_cube();
    if ry == 0 && col < c {
        let mut total = 0.0f32;
        for l in 0..lanes {
            total += shared[l * 32 + cx];
        }
        partial[CUBE_POS_Y as usize * c + col] = total;
    }
}

/// Pass 2 of both: `out[j] = Σ_k partial[k, j]` over the `parts` rows of `partial: [parts,
/// width]`, one thread per output, the partials added in order (`width` = 1 for `Σ x²`).
#[cube(launch)]
pub fn sum_partials<F: Float>(
    partial: &Tensor<f32>,
    out: &mut Tensor<F>,
    parts: u32,
    width: u32,
    #[define(F)] _dtype: ElemType,
) {
    let (j, w) = (ABSOLUTE_POS as usize, width as usize);
    if j < w {
        let mut s = 0.0f32;
        for k in 0..parts as usize {
            s += partial[k * w + j];
        }
        out[j] = F::cast_from(s);
    }
}

/// The host side: launching the two passes on burn's CubeCL tensors.
pub mod launch {
    use crate::cube::{dims, empty};
    use burn::tensor::DType;
    use burn_cubecl::kernel::into_contiguous;
    use burn_cubecl::tensor::CubeTensor;
    use cubecl::{CubeCount, CubeDim};

    /// Threads per cube: 256, or the largest power of two below that within `max_units`.
    pub(in crate::cube) fn units_for(max_units: u32) -> usize {
        256usize.min(1 << max_units.max(1).ilog2())
    }

    /// [`units_for`] the device of `like`.
    pub(in crate::cube) fn units(like: &CubeTensor) -> usize {
        units_for(like.client.properties().hardware.max_units_per_cube)
    }

    /// Adds the `parts` partial results of `partial: [parts, width]` into `[width]` of `dtype`.
    fn finish(partial: CubeTensor, like: &CubeTensor, parts: usize, width: usize, dtype: DType) -> CubeTensor {
        let out = empty(like, vec![width], dtype);
        let cube = CubeDim::new_1d(units(like) as u32);
        super::sum_partials::launch(
            &like.client.clone(),
            cubecl::calculate_cube_count_elemwise(&like.client, width, cube),
            cube,
            partial.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            parts as u32,
            width as u32,
            burn::backend::cubecl::dtype_to_storage_type(dtype),
        );
        out
    }

    /// `[Σ x²]` of every element of `x`, as float32 whatever `x`'s type (a float16 sum of
    /// squares overflows at 65 504).
    pub fn sum_squares(x: CubeTensor) -> CubeTensor {
        sum(x, true, DType::F32)
    }

    /// `[Σ x]` of every element of `x`, added in float32, returned in `x`'s float type.
    pub fn sum_all(x: CubeTensor) -> CubeTensor {
        let dtype = x.dtype;
        sum(x, false, dtype)
    }

    /// `[Σ x²]` (`square`) or `[Σ x]` as `dtype`: float32 partials of up to 1 024 cubes, then added in order.
    fn sum(x: CubeTensor, square: bool, dtype: DType) -> CubeTensor {
        let x = into_contiguous(x);
        let n = x.meta.num_elements();
        let units = units(&x);
        // Up to 16 elements a thread before more cubes are added; at most 1 024 partials.
        let cubes = n.div_ceil(units * 16).clamp(1, 1024);
        let partial = empty(&x, vec![cubes], DType::F32);
        super::sum_partial::launch(
            &x.client.clone(),
            CubeCount::new_1d(cubes as u32),
            CubeDim::new_1d(units as u32),
            x.clone().into_tensor_arg(),
            partial.clone().into_tensor_arg(),
            n as u32,
            units,
            square,
            burn::backend::cubecl::dtype_to_storage_type(x.dtype),
        );
        finish(partial, &x, cubes, 1, dtype)
    }

    /// The column sums `[cols]` of `x: [rows, cols]` (contiguous), in `x`'s float type.
    pub fn column_sum(x: CubeTensor) -> CubeTensor {
        let x = into_contiguous(x);
        let shape = dims(&x);
        let (rows, cols) = (shape[0], shape[1]);
        let lanes = (units(&x) / 32).max(1);
        // Enough row chunks to fill the device (≥ 64 rows each), at most 64 partials a column.
        let chunks = rows.div_ceil(64).clamp(1, 64);
        let chunk = rows.div_ceil(chunks).max(1);
        let chunks = rows.div_ceil(chunk).max(1);
        let partial = empty(&x, vec![chunks, cols], DType::F32);
        super::column_sum_partial::launch(
            &x.client.clone(),
            CubeCount::new_2d(cols.div_ceil(32) as u32, chunks as u32),
            CubeDim::new_2d(32, lanes as u32),
            x.clone().into_tensor_arg(),
            partial.clone().into_tensor_arg(),
            rows as u32,
            cols as u32,
            chunk as u32,
            lanes,
            burn::backend::cubecl::dtype_to_storage_type(x.dtype),
        );
        let dtype = x.dtype;
        finish(partial, &x, chunks, cols, dtype)
    }
}
