//! `titan-rs bench comm`: every collective of the communicator from 1 KiB to 64 MiB, each result
//! checked against the expected values as it goes, with times and bandwidths (nccl-tests style:
//! `algbw` = bytes / time, `busbw` scales it by what each algorithm must move). With
//! `--training.device wgpu` each rank holds its buffers on its GPU and every call is staged as
//! training stages it: device → host, the collective, host → device; the table adds the share
//! of the time spent copying.

use crate::config::DeviceKind;
use anyhow::{bail, Result};
use burn::prelude::*;
use std::time::{Duration, Instant};
use titan_parallel::{run_ranks_or_exit, CommExt, Communicator, ReduceOp};

#[derive(Debug, Clone)]
pub struct Row {
    pub op: &'static str,
    pub bytes: usize,
    pub seconds: f64,
    pub algbw_gbs: f64,
    pub busbw_gbs: f64,
    /// Share of the time spent copying device → host → device (0 on the CPU).
    pub copy_share: f64,
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

/// This rank's input to `op` with `n` f32 per rank.
fn input(op: &str, r: usize, n: usize, size: usize) -> Vec<f32> {
    let len = if op == "reduce_scatter" { n * size } else { n };
    if op == "broadcast" && r != 0 {
        return vec![0f32; n];
    }
    (0..len).map(|i| value(r, i)).collect()
}

/// Elements of `n` each rank sends rank `j` in the all-to-all (the last takes the remainder).
fn cut(n: usize, size: usize, j: usize) -> usize {
    j * n / size
}

/// Runs `op` on `x`; the result as one flat buffer.
fn collective(c: &dyn Communicator, op: &str, x: Vec<f32>, n: usize) -> Result<Vec<f32>> {
    let (r, size) = (c.rank(), c.size());
    Ok(match op {
        "all_reduce" | "broadcast" => {
            let mut buf = x;
            if op == "all_reduce" {
                c.all_reduce(&mut buf, ReduceOp::Sum)?;
            } else {
                c.broadcast(&mut buf, 0)?;
            }
            buf
        }
        "all_gather" => {
            let mut out = vec![0f32; n * size];
            c.all_gather(&x, &mut out)?;
            out
        }
        "reduce_scatter" => {
            let mut out = vec![0f32; n];
            c.reduce_scatter(&x, &mut out, ReduceOp::Sum)?;
            out
        }
        "send_recv" => {
            // Ring: send to the next rank, receive from the previous one.
            c.send(&x, (r + 1) % size, 0)?;
            let mut got = vec![0f32; n];
            c.recv(&mut got, (r + size - 1) % size, 0)?;
            got
        }
        "all_to_all" => {
            let parts: Vec<Vec<f32>> = (0..size).map(|j| x[cut(n, size, j)..cut(n, size, j + 1)].to_vec()).collect();
            c.all_to_all(&parts)?.concat()
        }
        _ => bail!("unknown collective {op}"),
    })
}

/// What element `i` of `op`'s result must be on rank `r`.
fn expected(op: &str, r: usize, n: usize, size: usize, i: usize) -> f32 {
    match op {
        "all_reduce" => (0..size).map(|s| value(s, i)).sum(),
        "all_gather" => value(i / n, i % n),
        "reduce_scatter" => (0..size).map(|s| value(s, r * n + i)).sum(),
        "broadcast" => value(0, i),
        "send_recv" => value((r + size - 1) % size, i),
        // Every rank sends this one its slice `cut(r)..cut(r + 1)`, the same length from each.
        _ => {
            let l = (cut(n, size, r + 1) - cut(n, size, r)).max(1);
            value(i / l, cut(n, size, r) + i % l)
        }
    }
}

/// One collective `iters` times on `n` f32 per rank, staged through host memory from and back to
/// `device` when one is given; checks the last result. Returns the best call's seconds and the
/// share of it spent copying between the device and the host.
fn run_op(c: &dyn Communicator, op: &str, n: usize, iters: usize, device: Option<&Device>) -> Result<(f64, f64)> {
    let (r, size) = (c.rank(), c.size());
    let host_in = input(op, r, n, size);
    let dev_in = device.map(|d| Tensor::<1>::from_data(TensorData::new(host_in.clone(), [host_in.len()]), d));
    let sync = |d: &Device| d.sync().map_err(|e| anyhow::anyhow!("the device failed to synchronise: {e:?}"));
    let bytes = n * 4;
    let (mut best, mut copy_share) = (f64::MAX, 0.0);
    for _ in 0..iters {
        if let Some(d) = device {
            sync(d)?;
        }
        c.barrier()?;
        let t = Instant::now();
        let x = match &dev_in {
            Some(x) => x.clone().into_data().try_into_vec::<f32>().map_err(|e| anyhow::anyhow!("{e:?}"))?,
            None => host_in.clone(),
        };
        let copy_out = t.elapsed().as_secs_f64();
        let out = collective(c, op, x, n)?;
        let t_in = Instant::now();
        if let Some(d) = device {
            let _staged = Tensor::<1>::from_data(TensorData::new(out.clone(), [out.len()]), d);
            sync(d)?;
        }
        let copy_in = t_in.elapsed().as_secs_f64();
        let secs = t.elapsed().as_secs_f64();
        check(op, bytes, &out, |i| expected(op, r, n, size, i))?;
        if secs < best {
            (best, copy_share) = (secs, (copy_out + copy_in) / secs);
        }
    }
    Ok((best, if device.is_some() { copy_share } else { 0.0 }))
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
fn sweep(c: &dyn Communicator, max_bytes: usize, iters: usize, fault: Option<Fault>, device: DeviceKind) -> Result<Vec<Row>> {
    inject(c, fault)?;
    let device = match device.is_gpu() {
        true => Some(crate::device::select(device, None, titan_parallel::launcher::local_rank(c.rank()))?),
        false => None,
    };
    let sizes: Vec<usize> =
        std::iter::successors(Some(1024usize), |s| Some(s * 4)).take_while(|&s| s <= max_bytes).collect();
    let mut rows = Vec::new();
    for op in OPS {
        for &bytes in &sizes {
            let (secs, copy_share) = run_op(c, op, bytes / 4, iters, device.as_ref())?;
            let algbw = bytes as f64 / secs / 1e9;
            let busbw_gbs = algbw * bus_factor(op, c.size());
            rows.push(Row { op, bytes, seconds: secs, algbw_gbs: algbw, busbw_gbs, copy_share });
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
    device: DeviceKind,
) -> Result<Vec<Row>> {
    if nproc < 2 {
        bail!("--nproc {nproc}: a communication benchmark needs at least 2 ranks");
    }
    let per_rank = run_ranks_or_exit(nproc, timeout, Duration::from_secs(5), |c| sweep(&c, max_bytes, iters, fault, device))?;
    Ok(per_rank.into_iter().next().unwrap_or_default())
}

/// Runs the sweep with this process as one MPI rank; returns `(rank, world size, rows)`.
#[cfg(feature = "mpi")]
pub fn bench_comm_mpi(
    max_bytes: usize,
    iters: usize,
    timeout: Duration,
    fault: Option<Fault>,
    device: DeviceKind,
) -> Result<(usize, usize, Vec<Row>)> {
    titan_parallel::launcher::run_mpi_rank(timeout, |c| {
        if c.size() < 2 {
            bail!("a communication benchmark needs at least 2 ranks: mpirun -np 2 …");
        }
        Ok((c.rank(), c.size(), sweep(&c, max_bytes, iters, fault, device)?))
    })
}

pub fn print_table(rows: &[Row], nproc: usize, backend: &str, device: DeviceKind) {
    let staged = if device.is_gpu() { format!(", {device} tensors staged through host memory") } else { String::new() };
    println!("{backend} backend, {nproc} ranks, f32{staged}, every result checked");
    println!("| collective | size | time | algbw GB/s | busbw GB/s | copying |");
    println!("|---|---|---|---|---|---|");
    for r in rows {
        let size = if r.bytes >= 1 << 20 { format!("{} MiB", r.bytes >> 20) } else { format!("{} KiB", r.bytes >> 10) };
        let copying = if device.is_gpu() { format!("{:.0} %", r.copy_share * 100.0) } else { "—".into() };
        println!("| {} | {size} | {:.1} µs | {:.2} | {:.2} | {copying} |", r.op, r.seconds * 1e6, r.algbw_gbs, r.busbw_gbs);
    }
}
