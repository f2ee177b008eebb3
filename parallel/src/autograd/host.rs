//! The non-differentiable primitives on host data: identity, all-reduce (sum), all-gather,
//! split and reduce-scatter along any dimension.

use crate::comm::{CommExt, Communicator, ReduceOp};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prim {
    Identity = 0,
    AllReduce = 1,
    AllGather = 2,
    Split = 3,
    ReduceScatter = 4,
}

impl Prim {
    pub fn from_code(c: u32) -> Self {
        match c {
            0 => Prim::Identity,
            1 => Prim::AllReduce,
            2 => Prim::AllGather,
            3 => Prim::Split,
            4 => Prim::ReduceScatter,
            _ => unreachable!("collective code {c}"),
        }
    }
}

/// `shape` as `(outer, dim size, inner)` around `dim`.
fn around(shape: &[usize], dim: usize) -> (usize, usize, usize) {
    (shape[..dim].iter().product(), shape[dim], shape[dim + 1..].iter().product())
}

fn chunk_of(n: usize, size: usize, dim: usize) -> usize {
    assert!(n % size == 0, "dimension {dim} of size {n} does not split evenly over {size} ranks");
    n / size
}

/// Runs `prim` on this rank's `data` of `shape`; returns the result and its shape. Collective
/// errors (mismatch, timeout, abort) panic with the error, which the launcher reports.
pub fn run(
    prim: Prim,
    mut data: Vec<f32>,
    shape: &[usize],
    dim: usize,
    c: &dyn Communicator,
) -> (Vec<f32>, Vec<usize>) {
    let (n, r) = (c.size(), c.rank());
    let (a, nd, b) = around(shape, dim);
    let mut out_shape = shape.to_vec();
    let fail = |e| panic!("{e}");
    match prim {
        Prim::Identity => (data, out_shape),
        Prim::AllReduce => {
            c.all_reduce(&mut data, ReduceOp::Sum).unwrap_or_else(fail);
            (data, out_shape)
        }
        Prim::AllGather => {
            let mut gathered = vec![0f32; data.len() * n];
            c.all_gather(&data, &mut gathered).unwrap_or_else(fail);
            // rank-major [n][a][nd][b] → [a][n·nd][b]
            let mut out = Vec::with_capacity(gathered.len());
            for i in 0..a {
                for k in 0..n {
                    let base = k * a * nd * b + i * nd * b;
                    out.extend_from_slice(&gathered[base..base + nd * b]);
                }
            }
            out_shape[dim] = nd * n;
            (out, out_shape)
        }
        Prim::Split => {
            let ch = chunk_of(nd, n, dim);
            let mut out = Vec::with_capacity(a * ch * b);
            for i in 0..a {
                let base = i * nd * b + r * ch * b;
                out.extend_from_slice(&data[base..base + ch * b]);
            }
            out_shape[dim] = ch;
            (out, out_shape)
        }
        Prim::ReduceScatter => {
            let ch = chunk_of(nd, n, dim);
            // [a][n][ch][b] → rank-major [n][a][ch][b]
            let mut send = Vec::with_capacity(data.len());
            for k in 0..n {
                for i in 0..a {
                    let base = i * nd * b + k * ch * b;
                    send.extend_from_slice(&data[base..base + ch * b]);
                }
            }
            let mut out = vec![0f32; a * ch * b];
            c.reduce_scatter(&send, &mut out, ReduceOp::Sum).unwrap_or_else(fail);
            out_shape[dim] = ch;
            (out, out_shape)
        }
    }
}
