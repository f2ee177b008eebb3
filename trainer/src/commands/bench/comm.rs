//! `titan-rs bench comm`: every collective of the communicator from 1 KiB to 64 MiB, each result
//! checked against the expected values as it goes, with times and bandwidths (nccl-tests style:
//! `algbw` = bytes / time, `busbw` scales it by what each algorithm must move).

use anyhow::{bail, Result};
use std::time::{Duration, Instant};
use titan_parallel::{run_ranks_or_exit, CommExt, Communicator, ReduceOp};

#[derive(Debug, Clone)]
pub struct Row {
    pub op: &'static str,
    pub bytes: usize,
    pub seconds: f64,
    pub algbw_gbs: f64,
    pub busbw_gbs: f64,
}

pub const OPS: &[&str] = &["all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv", "all_to_all"];

/// Exact in f32 whatever the sum order: small integers.
fn value(rank: usize, i: usize) -> f32 {
    ((rank + 1) * 3 + i % 11) as f32
}

fn check(op: &str, bytes: usize, got: &[f32], want: impl Fn(usize) -> f32) -> Result<()> {
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want(i)) {
        bail!("{op} of {bytes} bytes returned a wrong value at element {i}: {} instead of {}", got[i], want(i));
    }
    Ok(())
}

/// One collective `iters` times on `n` f32 per rank; checks the last result; returns seconds per call.
fn run_op(c: &dyn Communicator, op: &str, n: usize, iters: usize) -> Result<f64> {
    let (r, size) = (c.rank(), c.size());
    let mine: Vec<f32> = (0..n).map(|i| value(r, i)).collect();
    let bytes = n * 4;
    let mut best = f64::MAX;
    for _ in 0..iters {
        c.barrier()?;
        let t = Instant::now();
        match op {
            "all_reduce" => {
                let mut buf = mine.clone();
                c.all_reduce(&mut buf, ReduceOp::Sum)?;
                check(op, bytes, &buf, |i| (0..size).map(|s| value(s, i)).sum())?;
            }
            "all_gather" => {
                let mut out = vec![0f32; n * size];
                c.all_gather(&mine, &mut out)?;
                check(op, bytes, &out, |i| value(i / n, i % n))?;
            }
            "reduce_scatter" => {
                let full: Vec<f32> = (0..n * size).map(|i| value(r, i)).collect();
                let mut out = vec![0f32; n];
                c.reduce_scatter(&full, &mut out, ReduceOp::Sum)?;
                check(op, bytes, &out, |i| (0..size).map(|s| value(s, r * n + i)).sum())?;
            }
            "broadcast" => {
                let mut buf = if r == 0 { mine.clone() } else { vec![0f32; n] };
                c.broadcast(&mut buf, 0)?;
                check(op, bytes, &buf, |i| value(0, i))?;
            }
            "send_recv" => {
                // Ring: send to the next rank, receive from the previous one.
                c.send(&mine, (r + 1) % size, 0)?;
                let mut got = vec![0f32; n];
                c.recv(&mut got, (r + size - 1) % size, 0)?;
                check(op, bytes, &got, |i| value((r + size - 1) % size, i))?;
            }
            "all_to_all" => {
                // `n` f32 per rank in `size` parts (the last takes the remainder).
                let cut = |j: usize| j * n / size;
                let parts: Vec<Vec<f32>> = (0..size).map(|j| mine[cut(j)..cut(j + 1)].to_vec()).collect();
                let got = c.all_to_all(&parts)?;
                for (from, p) in got.iter().enumerate() {
                    check(op, bytes, p, |i| value(from, cut(r) + i))?;
                }
            }
            _ => bail!("unknown collective {op}"),
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(best)
}

fn bus_factor(op: &str, n: usize) -> f64 {
    let n = n as f64;
    match op {
        "all_reduce" => 2.0 * (n - 1.0) / n,
        "all_gather" | "reduce_scatter" | "all_to_all" => (n - 1.0) / n,
        _ => 1.0,
    }
}

/// A fault to inject on rank 1 before the sweep, to test how failures end a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Fault {
    /// Rank 1 calls all-gather where the others call all-reduce.
    Mismatch,
    /// Rank 1 fails with an error.
    Fail,
    /// Rank 1 sleeps instead of joining a barrier.
    Hang,
}

fn inject(c: &dyn Communicator, fault: Option<Fault>) -> Result<()> {
    let Some(fault) = fault else { return Ok(()) };
    let odd = c.rank() == 1;
    match fault {
        Fault::Mismatch if odd => {
            let mut out = vec![0f32; 4 * c.size()];
            c.all_gather(&[1f32; 4], &mut out)?;
        }
        Fault::Mismatch => c.all_reduce(&mut [1f32; 4], ReduceOp::Sum)?,
        Fault::Fail if odd => bail!("injected failure"),
        Fault::Hang if odd => std::thread::sleep(Duration::from_secs(3600)),
        Fault::Fail | Fault::Hang => c.barrier()?,
    }
    Ok(())
}

/// Every collective at sizes 1 KiB × 4^k up to `max_bytes`, on this rank of `c`.
fn sweep(c: &dyn Communicator, max_bytes: usize, iters: usize, fault: Option<Fault>) -> Result<Vec<Row>> {
    inject(c, fault)?;
    let sizes: Vec<usize> =
        std::iter::successors(Some(1024usize), |s| Some(s * 4)).take_while(|&s| s <= max_bytes).collect();
    let mut rows = Vec::new();
    for op in OPS {
        for &bytes in &sizes {
            let secs = run_op(c, op, bytes / 4, iters)?;
            let algbw = bytes as f64 / secs / 1e9;
            rows.push(Row { op, bytes, seconds: secs, algbw_gbs: algbw, busbw_gbs: algbw * bus_factor(op, c.size()) });
        }
    }
    Ok(rows)
}

/// Runs the sweep on `nproc` local ranks (threads); rank 0's timings.
pub fn bench_comm(
    nproc: usize,
    max_bytes: usize,
    iters: usize,
    timeout: Duration,
    fault: Option<Fault>,
) -> Result<Vec<Row>> {
    if nproc < 2 {
        bail!("--nproc {nproc}: a communication benchmark needs at least 2 ranks");
    }
    let per_rank = run_ranks_or_exit(nproc, timeout, Duration::from_secs(5), |c| sweep(&c, max_bytes, iters, fault))?;
    Ok(per_rank.into_iter().next().unwrap_or_default())
}

/// Runs the sweep with this process as one MPI rank; returns `(rank, world size, rows)`.
#[cfg(feature = "mpi")]
pub fn bench_comm_mpi(
    max_bytes: usize,
    iters: usize,
    timeout: Duration,
    fault: Option<Fault>,
) -> Result<(usize, usize, Vec<Row>)> {
    titan_parallel::launcher::run_mpi_rank(timeout, |c| {
        if c.size() < 2 {
            bail!("a communication benchmark needs at least 2 ranks: mpirun -np 2 …");
        }
        Ok((c.rank(), c.size(), sweep(&c, max_bytes, iters, fault)?))
    })
}

pub fn print_table(rows: &[Row], nproc: usize, backend: &str) {
    println!("{backend} backend, {nproc} ranks, f32, every result checked");
    println!("| collective | size | time | algbw GB/s | busbw GB/s |");
    println!("|---|---|---|---|---|");
    for r in rows {
        let size = if r.bytes >= 1 << 20 { format!("{} MiB", r.bytes >> 20) } else { format!("{} KiB", r.bytes >> 10) };
        println!("| {} | {size} | {:.1} µs | {:.2} | {:.2} |", r.op, r.seconds * 1e6, r.algbw_gbs, r.busbw_gbs);
    }
}
