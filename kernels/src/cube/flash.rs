//! Causal (and block-causal) flash attention tiled in shared memory, forward and backward
//! (FlashAttention-2's loop order): `q: [B, H, T, D]`, `k, v: [B, KV, T, D]` (GQA: query head `h`
//! reads kv head `h / (H / KV)`); query `i` of batch row `b` sees keys `starts[b, i] ..= i`
//! (documents packed in a row; all zero: plain causal; starts never decrease along a row).
//!
//! A cube of `block` threads owns `block` rows — neighbouring queries of one head (forward,
//! `dq`) or neighbouring keys of one kv head (`dk`, `dv`) — each thread one row, its operands and
//! accumulators in float32 registers (`D` is a compile-time constant; the loops over it are
//! unrolled on GPUs, not on a software adapter, whose compiler splits every barrier into
//! coroutines and took over 15 minutes on the unrolled kernels).
//! The other side streams through shared memory `tile` rows at a time, loaded once per cube by
//! all its threads with neighbouring threads reading neighbouring addresses, so every key (query)
//! row is read from memory once per cube instead of once per thread; every thread then reads the
//! same shared address at the same time (a broadcast). Only the tiles a block can see are loaded
//! (from the block's first document start to its last row), the probabilities are recomputed in
//! the backward from the saved log-sum-exp, and no `T × T` matrix exists. Float32 accumulation
//! whatever the tensors' float type.

use cubecl::prelude::*;

/// Keys the forward scores at a time before rescaling its accumulator (their scores stay in
/// registers).
const SUB: usize = 16;

/// Rows `r0 .. r0 + tile` of the row-major `[.., dim]` matrix starting at `base` in `src`, as
/// float32, into `dst` (rows at or past `end` are left unwritten: no caller reads them), the
/// cube's `units` threads striding over neighbouring elements.
#[cube]
fn load_tile<F: Float>(
    src: &Tensor<F>,
    base: usize,
    r0: usize,
    end: usize,
    dst: &mut Shared<[f32]>,
    #[comptime] tile: usize,
    #[comptime] dim: usize,
    #[comptime] units: usize,
) {
    let mut e = UNIT_POS as usize;
    while e < comptime!(tile * dim) {
        let r = r0 + e / dim;
        if r < end {
            dst[e] = f32::cast_from(src[base + r * dim + e % dim]);
        }
        e += units;
    }
}

/// The sum of `x` over the `lanes` neighbouring threads that share a row (`lanes` a power of
/// two up to 8, the rows' lanes aligned in the plane): butterfly shuffles, every lane gets it.
#[cube]
fn lane_sum(x: f32, #[comptime] lanes: usize) -> f32 {
    let mut v = x;
    if comptime!(lanes > 1) {
        v += plane_shuffle_xor(v, 1u32);
    }
    if comptime!(lanes > 2) {
        v += plane_shuffle_xor(v, 2u32);
    }
    if comptime!(lanes > 4) {
        v += plane_shuffle_xor(v, 4u32);
    }
    v
}

/// `Σ_c a[c] · s[base + c]` over the `dim` elements of a row split over `lanes` threads and a
/// shared-memory row: this lane's columns `cc · lanes + lane` (neighbouring lanes on
/// neighbouring addresses), then summed over the row's lanes.
#[cube]
fn row_dot(
    a: &Array<f32>,
    s: &Shared<[f32]>,
    base: usize,
    lane: usize,
    #[comptime] dim: usize,
    #[comptime] lanes: usize,
    #[comptime] unroll: bool,
) -> f32 {
    let mut acc = 0.0f32;
    #[unroll(unroll)]
    for cc in 0..comptime!(dim / lanes) {
        acc += a[cc] * s[base + cc * lanes + lane];
    }
    lane_sum(acc, lanes)
}

/// This lane's columns of row `row` of a `[.., dim]` tensor into a float32 register array
/// (`scale` times it).
#[cube]
fn load_row<F: Float>(
    src: &Tensor<F>,
    row: usize,
    lane: usize,
    scale: f32,
    #[comptime] dim: usize,
    #[comptime] lanes: usize,
    #[comptime] unroll: bool,
) -> Array<f32> {
    let mut a = Array::<f32>::new(comptime!(dim / lanes));
    #[unroll(unroll)]
    for cc in 0..comptime!(dim / lanes) {
        a[cc] = f32::cast_from(src[row * dim + cc * lanes + lane]) * scale;
    }
    a
}

/// Writes this lane's columns (a float32 register array) into row `row` of a `[.., dim]`
/// tensor, times `scale`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn store_row<F: Float>(
    dst: &mut Tensor<F>,
    row: usize,
    lane: usize,
    a: &Array<f32>,
    scale: f32,
    #[comptime] dim: usize,
    #[comptime] lanes: usize,
    #[comptime] unroll: bool,
) {
    #[unroll(unroll)]
    for cc in 0..comptime!(dim / lanes) {
        dst[row * dim + cc * lanes + lane] = F::cast_from(a[cc] * scale);
    }
}

/// The document start of token `i` of batch row `b`.
#[cube]
fn start_of<I: Numeric>(starts: &Tensor<I>, b: usize, t: usize, i: usize) -> usize {
    u32::cast_from(starts[b * t + i]) as usize
}

/// The rows a cube owns: rows `start .. end` (at most `block`, neighbouring) of head row `head`
/// of a `[heads, T]` layout, `mine` the calling thread's (`live`: inside the sequence) and
/// `lane` its place among the `lanes` neighbouring threads that share the row.
#[derive(CubeType)]
struct Block {
    head: usize,
    start: usize,
    end: usize,
    mine: usize,
    lane: usize,
    live: bool,
}

#[cube]
fn cube_block(seq: u32, #[comptime] block: usize, #[comptime] lanes: usize) -> Block {
    let t = seq as usize;
    let blocks = (t + block - 1) / block;
    let start = (CUBE_POS % blocks) * block;
    let mine = start + UNIT_POS as usize / lanes;
    let mut end = start + block;
    if end > t {
        end = t;
    }
    Block { head: CUBE_POS / blocks, start, end, mine, lane: UNIT_POS as usize % lanes, live: mine < t }
}

/// The offset in `[B, KV, T, D]` of the K/V rows query head row `head` (of `[B, H]`) reads.
#[cube]
fn kv_base(head: usize, heads: u32, kv_heads: u32, t: usize, #[comptime] dim: usize) -> usize {
    let (h_n, kv_n) = (heads as usize, kv_heads as usize);
    ((head / h_n) * kv_n + (head % h_n) / (h_n / kv_n)) * t * dim
}

/// Forward: cube `c` holds queries `q0 .. q0 + block` of head row `bh = c / ⌈T / block⌉`;
/// each thread keeps its query, output accumulator, running maximum and sum, and per key tile
/// takes the tile's maximum first, so the accumulator is rescaled once a tile. Writes the output
/// and the log-sum-exp of each row.
#[cube(launch)]
pub fn flash_fwd<F: Float, I: Numeric>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    starts: &Tensor<I>,
    o: &mut Tensor<F>,
    lse: &mut Tensor<f32>,
    batch_heads: u32,
    heads: u32,
    kv_heads: u32,
    seq: u32,
    scale: f32,
    #[comptime] dim: usize,
    #[comptime] tile: usize,
    #[comptime] block: usize,
    #[comptime] lanes: usize,
    #[comptime] unroll: bool,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    let blk = cube_block(seq, block, lanes);
    let lane = blk.lane;
    let units = comptime!(block * lanes);
    if blk.head >= batch_heads as usize {
        terminate!();
    }
    let (t, bh) = (seq as usize, blk.head);
    let (b, kv_base) = (bh / heads as usize, kv_base(bh, heads, kv_heads, t, dim));
    let (q0, i, hi, live) = (blk.start, blk.mine, blk.end, blk.live);
    let row = bh * t + i;
    let mut first = hi;
    let mut qv = Array::<f32>::new(comptime!(dim / lanes));
    if live {
        first = start_of::<I>(starts, b, t, i);
        qv = load_row::<F>(q, row, lane, scale, dim, lanes, unroll);
    }
    let mut acc = Array::<f32>::new(comptime!(dim / lanes));
    let mut scores = Array::<f32>::new(SUB);
    let mut ks = Shared::<[f32]>::new_slice(comptime!(tile * dim));
    let mut vs = Shared::<[f32]>::new_slice(comptime!(tile * dim));
    let mut m = comptime!(-3.0e38f32).runtime();
    let mut l = 0.0f32;
    let mut j0 = start_of::<I>(starts, b, t, q0);
    while j0 < hi {
        load_tile::<F>(k, kv_base, j0, hi, &mut ks, tile, dim, units);
        load_tile::<F>(v, kv_base, j0, hi, &mut vs, tile, dim, units);
        sync_cube();
        // `SUB` keys at a time: their scores (every thread computes them, so the shuffles run
        // with whole planes; a masked key's is dropped, and a thread past the sequence masks
        // all: its `first` is `hi`), the chunk's maximum, one rescale, then the weighted values.
        for chunk in 0..comptime!(tile.div_ceil(SUB)) {
            let c0 = chunk * SUB;
            let mut top = m;
            #[unroll(unroll)]
            for u in 0..SUB {
                let (jj, j) = (c0 + u, j0 + c0 + u);
                if jj < tile {
                    let s = row_dot(&qv, &ks, jj * dim, lane, dim, lanes, unroll);
                    if j >= first && j <= i {
                        scores[u] = s;
                        top = top.max(s);
                    }
                }
            }
            if live {
                let corr = (m - top).exp();
                l *= corr;
                #[unroll(unroll)]
                for cc in 0..comptime!(dim / lanes) {
                    acc[cc] *= corr;
                }
                #[unroll(unroll)]
                for u in 0..SUB {
                    let (jj, j) = (c0 + u, j0 + c0 + u);
                    if jj < tile && j >= first && j <= i {
                        let p = (scores[u] - top).exp();
                        l += p;
                        #[unroll(unroll)]
                        for cc in 0..comptime!(dim / lanes) {
                            acc[cc] += p * vs[jj * dim + cc * lanes + lane];
                        }
                    }
                }
                m = top;
            }
        }
        sync_cube();
        j0 += tile;
    }
    if live {
        store_row::<F>(o, row, lane, &acc, 1.0f32 / l, dim, lanes, unroll);
        if lane == 0 {
            lse[row] = m + l.ln();
        }
    }
}

/// `dq` (and `delta = rowsum(dO ∘ O)`, which the `dk`/`dv` pass reads): the forward's layout,
/// key tiles streamed through shared memory, the probabilities recomputed from `lse`.
#[cube(launch)]
pub fn flash_bwd_dq<F: Float, I: Numeric>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    starts: &Tensor<I>,
    o: &Tensor<F>,
    lse: &Tensor<f32>,
    d_o: &Tensor<F>,
    dq: &mut Tensor<F>,
    delta: &mut Tensor<f32>,
    batch_heads: u32,
    heads: u32,
    kv_heads: u32,
    seq: u32,
    scale: f32,
    #[comptime] dim: usize,
    #[comptime] tile: usize,
    #[comptime] block: usize,
    #[comptime] lanes: usize,
    #[comptime] unroll: bool,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    let blk = cube_block(seq, block, lanes);
    let lane = blk.lane;
    let units = comptime!(block * lanes);
    if blk.head >= batch_heads as usize {
        terminate!();
    }
    let (t, bh) = (seq as usize, blk.head);
    let (b, kv_base) = (bh / heads as usize, kv_base(bh, heads, kv_heads, t, dim));
    let (q0, i, hi, live) = (blk.start, blk.mine, blk.end, blk.live);
    let row = bh * t + i;
    let mut first = hi;
    let mut qv = Array::<f32>::new(comptime!(dim / lanes));
    let mut dov = Array::<f32>::new(comptime!(dim / lanes));
    let mut row_lse = 0.0f32;
    let mut dl = 0.0f32;
    if live {
        first = start_of::<I>(starts, b, t, i);
        qv = load_row::<F>(q, row, lane, scale, dim, lanes, unroll);
        dov = load_row::<F>(d_o, row, lane, 1.0f32, dim, lanes, unroll);
        row_lse = lse[row];
        #[unroll(unroll)]
        for cc in 0..comptime!(dim / lanes) {
            dl += dov[cc] * f32::cast_from(o[row * dim + cc * lanes + lane]);
        }
    }
    // Outside the branch: every thread of a row's plane shuffles.
    dl = lane_sum(dl, lanes);
    if live && lane == 0 {
        delta[row] = dl;
    }
    let mut acc = Array::<f32>::new(comptime!(dim / lanes));
    let mut ks = Shared::<[f32]>::new_slice(comptime!(tile * dim));
    let mut vs = Shared::<[f32]>::new_slice(comptime!(tile * dim));
    let mut j0 = start_of::<I>(starts, b, t, q0);
    while j0 < hi {
        load_tile::<F>(k, kv_base, j0, hi, &mut ks, tile, dim, units);
        load_tile::<F>(v, kv_base, j0, hi, &mut vs, tile, dim, units);
        sync_cube();
        // Every thread takes both dot products (whole planes shuffle), masked keys dropped (a
        // thread past the sequence masks all: its `first` is `hi`).
        for jj in 0..tile {
            let j = j0 + jj;
            let qk = row_dot(&qv, &ks, jj * dim, lane, dim, lanes, unroll);
            let dov_v = row_dot(&dov, &vs, jj * dim, lane, dim, lanes, unroll);
            if j >= first && j <= i {
                let p = (qk - row_lse).exp();
                let ds = p * (dov_v - dl);
                #[unroll(unroll)]
                for cc in 0..comptime!(dim / lanes) {
                    acc[cc] += ds * ks[jj * dim + cc * lanes + lane];
                }
            }
        }
        sync_cube();
        j0 += tile;
    }
    if live {
        store_row::<F>(dq, row, lane, &acc, scale, dim, lanes, unroll);
    }
}

/// `dk` and `dv`: cube `c` holds keys `k0 .. k0 + block` of kv head row `c / ⌈T / block⌉`,
/// each thread its key and value rows and their gradients; for every query head sharing the kv
/// head, the query tiles from `k0` on stream through shared memory (queries, their output
/// gradients, `lse`, `delta`, document starts) until a tile starts after the block's last key's
/// document.
#[cube(launch)]
pub fn flash_bwd_dkv<F: Float, I: Numeric>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    starts: &Tensor<I>,
    lse: &Tensor<f32>,
    delta: &Tensor<f32>,
    d_o: &Tensor<F>,
    dk: &mut Tensor<F>,
    dv: &mut Tensor<F>,
    batch_kv: u32,
    heads: u32,
    kv_heads: u32,
    seq: u32,
    scale: f32,
    #[comptime] dim: usize,
    #[comptime] tile: usize,
    #[comptime] block: usize,
    #[comptime] lanes: usize,
    #[comptime] unroll: bool,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    let blk = cube_block(seq, block, lanes);
    let lane = blk.lane;
    let units = comptime!(block * lanes);
    if blk.head >= batch_kv as usize {
        terminate!();
    }
    let (t, bk, h_n, kv_n) = (seq as usize, blk.head, heads as usize, kv_heads as usize);
    let (group, b, kh) = (h_n / kv_n, bk / kv_n, bk % kv_n);
    let (k0, j, last, live) = (blk.start, blk.mine, blk.end - 1, blk.live);
    let row = bk * t + j;
    let mut kr = Array::<f32>::new(comptime!(dim / lanes));
    let mut vr = Array::<f32>::new(comptime!(dim / lanes));
    if live {
        kr = load_row::<F>(k, row, lane, scale, dim, lanes, unroll);
        vr = load_row::<F>(v, row, lane, 1.0f32, dim, lanes, unroll);
    }
    let mut dka = Array::<f32>::new(comptime!(dim / lanes));
    let mut dva = Array::<f32>::new(comptime!(dim / lanes));
    let mut qs = Shared::<[f32]>::new_slice(comptime!(tile * dim));
    let mut dos = Shared::<[f32]>::new_slice(comptime!(tile * dim));
    let mut ls = Shared::<[f32]>::new_slice(tile);
    let mut ds = Shared::<[f32]>::new_slice(tile);
    let mut st = Shared::<[u32]>::new_slice(tile);
    for g in 0..group {
        let q_row0 = (b * h_n + kh * group + g) * t;
        let mut i0 = k0;
        while i0 < t {
            // Starts never decrease along a row: from here on every query is in a later
            // document than every key of the block (the same test in every thread).
            if start_of::<I>(starts, b, t, i0) > last {
                break;
            }
            load_tile::<F>(q, q_row0 * dim, i0, t, &mut qs, tile, dim, units);
            load_tile::<F>(d_o, q_row0 * dim, i0, t, &mut dos, tile, dim, units);
            let mut e = UNIT_POS as usize;
            while e < tile {
                let r = i0 + e;
                if r < t {
                    ls[e] = lse[q_row0 + r];
                    ds[e] = delta[q_row0 + r];
                    st[e] = u32::cast_from(start_of::<I>(starts, b, t, r));
                }
                e += units;
            }
            sync_cube();
            // Every thread takes both dot products (whole planes shuffle), masked queries
            // dropped (a thread past the sequence masks all: `i >= j` fails).
            for ii in 0..tile {
                let i = i0 + ii;
                let kq = row_dot(&kr, &qs, ii * dim, lane, dim, lanes, unroll);
                let vdo = row_dot(&vr, &dos, ii * dim, lane, dim, lanes, unroll);
                if i < t && i >= j && st[ii] as usize <= j {
                    let p = (kq - ls[ii]).exp();
                    let dsv = p * (vdo - ds[ii]);
                    #[unroll(unroll)]
                    for cc in 0..comptime!(dim / lanes) {
                        let c = cc * lanes + lane;
                        dva[cc] += p * dos[ii * dim + c];
                        dka[cc] += dsv * qs[ii * dim + c];
                    }
                }
            }
            sync_cube();
            i0 += tile;
        }
    }
    if live {
        store_row::<F>(dk, row, lane, &dka, scale, dim, lanes, unroll);
        store_row::<F>(dv, row, lane, &dva, 1.0f32, dim, lanes, unroll);
    }
}

/// The host side: tile sizes from the device's shared memory, and the launches.
pub mod launch {
    use crate::cube::{dims, empty, unroll_loops as unroll};
    use burn::backend::cubecl::dtype_to_storage_type;
    use burn::tensor::DType;
    use burn_cubecl::kernel::into_contiguous;
    use burn_cubecl::tensor::CubeTensor;
    use cubecl::{server::CubeCountSelection, CubeDim};
    use std::sync::atomic::{AtomicU8, Ordering};

    /// Threads (rows) per cube.
    pub(in crate::cube) const BLOCK: usize = 64;

    /// Rows a shared-memory tile holds: two float32 `[tile, dim]` tiles and three per-row
    /// values fit `shared_bytes` of shared memory; at most 64.
    pub(in crate::cube) fn tile_rows(shared_bytes: usize, dim: usize) -> usize {
        (shared_bytes / (8 * dim + 12)).clamp(1, 64)
    }

    /// [`tile_rows`] for the shared memory of `like`'s device.
    fn tile(like: &CubeTensor, dim: usize) -> usize {
        tile_rows(like.client.properties().hardware.max_shared_memory_size, dim)
    }

    /// Threads that share a row: the largest power of two up to 8, the smallest plane and
    /// `dim / 8` that divides `dim` (64 → 8 lanes of 8 columns, 128 → 8 of 16, 16 → 2 of 8), so
    /// a thread keeps `dim / lanes` columns of each row in registers instead of all of them
    /// (249–255 registers and spills on the H100/H200 with one thread a row:
    /// docs/gpu/ptx-sm90.md); 1 where the device has no plane shuffles.
    pub(in crate::cube) fn lanes_for(dim: usize, plane_size_min: u32, shuffles: bool) -> usize {
        if !shuffles {
            return 1;
        }
        let cap = 8usize.min(plane_size_min as usize).min(dim / 8).max(1);
        let mut lanes = 1usize << cap.ilog2();
        while dim % lanes != 0 {
            lanes /= 2;
        }
        lanes
    }

    /// Whether the attention kernels use plane shuffles: 0 as the device says (cubecl advertises
    /// them on GPUs, not on software adapters), 1 forced on, 2 forced off.
    static SHUFFLES: AtomicU8 = AtomicU8::new(0);

    /// Forces the plane shuffles on (`Some(true)`: rows shared by several threads even where the
    /// device does not advertise shuffles, as Mesa's software adapter, which has them) or off, or
    /// leaves them to the device (`None`). For tests and benchmarks.
    pub fn force_shuffles(on: Option<bool>) {
        SHUFFLES.store(on.map_or(0, |on| if on { 1 } else { 2 }), Ordering::Relaxed);
    }

    /// [`lanes_for`] on `like`'s device.
    fn lanes(like: &CubeTensor, dim: usize) -> usize {
        let props = like.client.properties();
        let shuffles = match SHUFFLES.load(Ordering::Relaxed) {
            0 => props.features.plane.contains(cubecl::ir::features::Plane::Ops),
            forced => forced == 1,
        };
        lanes_for(dim, props.hardware.plane_size_min, shuffles)
    }

    /// `(B·H, H, KV, T, D)` of `q: [B, H, T, D]`, `k: [B, KV, T, D]`.
    fn shape(q: &CubeTensor, k: &CubeTensor) -> (usize, usize, usize, usize, usize) {
        let (qd, kd) = (dims(q), dims(k));
        (qd[0] * qd[1], qd[1], kd[1], qd[2], qd[3])
    }

    /// One cube per `BLOCK` rows of each of `heads` head rows of `t` tokens, `lanes` threads a row.
    fn grid(like: &CubeTensor, heads: usize, t: usize, lanes: usize) -> (cubecl::CubeCount, CubeDim) {
        let cubes = heads * t.div_ceil(BLOCK);
        (CubeCountSelection::new(&like.client, cubes as u32).cube_count(), CubeDim::new_1d((BLOCK * lanes) as u32))
    }

    /// The output `[B, H, T, D]` (in `q`'s float type) and log-sum-exp `[B, H, T]` (float32).
    pub fn forward(q: CubeTensor, k: CubeTensor, v: CubeTensor, starts: CubeTensor, scale: f64) -> (CubeTensor, CubeTensor) {
        let (q, k, v, starts) = (into_contiguous(q), into_contiguous(k), into_contiguous(v), into_contiguous(starts));
        let (bh, h, kv, t, d) = shape(&q, &k);
        let o = empty(&q, dims(&q), q.dtype);
        let lse = empty(&q, dims(&q)[..3].to_vec(), DType::F32);
        let lanes = lanes(&q, d);
        let (count, cube) = grid(&q, bh, t, lanes);
        let dtypes = [dtype_to_storage_type(q.dtype), dtype_to_storage_type(starts.dtype)];
        let (tile, unroll) = (tile(&q, d), unroll(&q));
        super::flash_fwd::launch(
            &q.client.clone(),
            count,
            cube,
            q.into_tensor_arg(),
            k.into_tensor_arg(),
            v.into_tensor_arg(),
            starts.into_tensor_arg(),
            o.clone().into_tensor_arg(),
            lse.clone().into_tensor_arg(),
            bh as u32,
            h as u32,
            kv as u32,
            t as u32,
            scale as f32,
            d,
            tile,
            BLOCK,
            lanes,
            unroll,
            dtypes,
        );
        (o, lse)
    }

    /// `(dq, dk, dv)`: the `dq` pass (which also writes `rowsum(dO ∘ O)`), then the `dk`/`dv`
    /// pass, on the same stream.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        q: CubeTensor,
        k: CubeTensor,
        v: CubeTensor,
        starts: CubeTensor,
        o: CubeTensor,
        lse: CubeTensor,
        d_o: CubeTensor,
        scale: f64,
    ) -> (CubeTensor, CubeTensor, CubeTensor) {
        let (q, k, v, starts) = (into_contiguous(q), into_contiguous(k), into_contiguous(v), into_contiguous(starts));
        let (o, lse, d_o) = (into_contiguous(o), into_contiguous(lse), into_contiguous(d_o));
        let (bh, h, kv, t, d) = shape(&q, &k);
        let dq = empty(&q, dims(&q), q.dtype);
        let (dk, dv) = (empty(&k, dims(&k), k.dtype), empty(&k, dims(&k), k.dtype));
        let delta = empty(&q, dims(&q)[..3].to_vec(), DType::F32);
        let dtypes = [dtype_to_storage_type(q.dtype), dtype_to_storage_type(starts.dtype)];
        let client = q.client.clone();
        let (tile, unroll, lanes) = (tile(&q, d), unroll(&q), lanes(&q, d));
        let (count, cube) = grid(&q, bh, t, lanes);
        super::flash_bwd_dq::launch(
            &client,
            count,
            cube,
            q.clone().into_tensor_arg(),
            k.clone().into_tensor_arg(),
            v.clone().into_tensor_arg(),
            starts.clone().into_tensor_arg(),
            o.into_tensor_arg(),
            lse.clone().into_tensor_arg(),
            d_o.clone().into_tensor_arg(),
            dq.clone().into_tensor_arg(),
            delta.clone().into_tensor_arg(),
            bh as u32,
            h as u32,
            kv as u32,
            t as u32,
            scale as f32,
            d,
            tile,
            BLOCK,
            lanes,
            unroll,
            dtypes,
        );
        let bkv = bh / h * kv;
        let (count, cube) = grid(&k, bkv, t, lanes);
        super::flash_bwd_dkv::launch(
            &client,
            count,
            cube,
            q.into_tensor_arg(),
            k.into_tensor_arg(),
            v.into_tensor_arg(),
            starts.into_tensor_arg(),
            lse.into_tensor_arg(),
            delta.into_tensor_arg(),
            d_o.into_tensor_arg(),
            dk.clone().into_tensor_arg(),
            dv.clone().into_tensor_arg(),
            bkv as u32,
            h as u32,
            kv as u32,
            t as u32,
            scale as f32,
            d,
            tile,
            BLOCK,
            lanes,
            unroll,
            dtypes,
        );
        (dq, dk, dv)
    }
}
