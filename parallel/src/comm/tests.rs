//! Every collective on 2, 3 and 4 ranks of the local backend, checked against values computed
//! directly; mismatches, timeouts and failures end promptly with errors that say what happened.

use crate::comm::*;
use crate::launcher::run_ranks;
use crate::mesh::{Axis, ParallelDims};
use half::bf16;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(20);

/// Rank r's contribution: distinct, non-trivial values (sums are not exact in f32).
fn contribution(rank: usize, n: usize) -> Vec<f32> {
    (0..n).map(|i| ((rank * 7919 + i * 104_729) % 1000) as f32 / 7.0 - 50.0 + 0.1 * rank as f32).collect()
}

#[test]
fn all_reduce_sum_mean_max_in_rank_order() {
    for world in [2, 3, 4] {
        let n = 1000;
        let out = run_ranks(world, T, |c| {
            let mut s = contribution(c.rank(), n);
            c.all_reduce(&mut s, ReduceOp::Sum)?;
            let mut m = contribution(c.rank(), n);
            c.all_reduce(&mut m, ReduceOp::Mean)?;
            let mut x = contribution(c.rank(), n);
            c.all_reduce(&mut x, ReduceOp::Max)?;
            Ok((s, m, x))
        })
        .unwrap();
        let (mut sum, mut max) = (contribution(0, n), contribution(0, n));
        for r in 1..world {
            let c = contribution(r, n);
            sum.iter_mut().zip(&c).for_each(|(a, b)| *a += b);
            max.iter_mut().zip(&c).for_each(|(a, b)| *a = a.max(*b));
        }
        let mean: Vec<f32> = sum.iter().map(|s| s / world as f32).collect();
        for (s, m, x) in out {
            // Bit-exact: the same rank-order sum on every rank.
            assert_eq!(s, sum, "world {world}");
            assert_eq!(m, mean);
            assert_eq!(x, max);
        }
    }
}

#[test]
fn all_gather_reduce_scatter_broadcast() {
    for world in [2, 3, 4] {
        let n = 12;
        let out = run_ranks(world, T, |c| {
            let mine = contribution(c.rank(), n);
            let mut gathered = vec![0f32; n * c.size()];
            c.all_gather(&mine, &mut gathered)?;
            let full = contribution(c.rank() + 10, n * c.size());
            let mut part = vec![0f32; n];
            c.reduce_scatter(&full, &mut part, ReduceOp::Sum)?;
            let mut b = if c.rank() == world - 1 { contribution(99, n) } else { vec![0.0; n] };
            c.broadcast(&mut b, world - 1)?;
            Ok((gathered, part, b))
        })
        .unwrap();
        let gathered: Vec<f32> = (0..world).flat_map(|r| contribution(r, n)).collect();
        for (rank, (g, part, b)) in out.into_iter().enumerate() {
            assert_eq!(g, gathered);
            let mut want = vec![0f32; n];
            for r in 0..world {
                let full = contribution(r + 10, n * world);
                want.iter_mut().zip(&full[rank * n..(rank + 1) * n]).for_each(|(a, x)| *a += x);
            }
            // The first contribution is the start value, so compare like the backend sums.
            let mut acc = contribution(10, n * world)[rank * n..(rank + 1) * n].to_vec();
            for r in 1..world {
                let full = contribution(r + 10, n * world);
                acc.iter_mut().zip(&full[rank * n..(rank + 1) * n]).for_each(|(a, x)| *a += x);
            }
            assert_eq!(part, acc);
            assert!(part.iter().zip(&want).all(|(a, b)| (a - b).abs() <= 1e-4 * b.abs().max(1.0)));
            assert_eq!(b, contribution(99, n));
        }
    }
}

#[test]
fn bf16_and_bytes() {
    let out = run_ranks(3, T, |c| {
        let mut x: Vec<bf16> = (0..8).map(|i| bf16::from_f32(i as f32 + c.rank() as f32)).collect();
        c.all_reduce(&mut x, ReduceOp::Sum)?;
        let mut bytes = vec![0u8; 3 * 4];
        c.all_gather(&[c.rank() as u8; 4], &mut bytes)?;
        let e = c.all_reduce(&mut [1u8, 2], ReduceOp::Sum).unwrap_err();
        Ok((x, bytes, e))
    })
    .unwrap();
    for (x, bytes, e) in out {
        assert_eq!(
            x.iter().map(|v| v.to_f32()).collect::<Vec<_>>(),
            (0..8).map(|i| 3.0 * i as f32 + 3.0).collect::<Vec<_>>()
        );
        assert_eq!(bytes, vec![0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]);
        assert!(e.to_string().contains("raw bytes cannot be reduced"));
    }
}

/// Messages of any length, including all empty, come back in rank order.
#[test]
fn all_gather_of_uneven_and_empty_messages() {
    let out = run_ranks(3, T, |c| {
        let uneven = c.all_gather_varlen(&vec![c.rank() as u8 + 7; c.rank()])?;
        let empty = c.all_gather_varlen(&[])?;
        Ok((uneven, empty))
    })
    .unwrap();
    for (uneven, empty) in out {
        assert_eq!(uneven, vec![vec![], vec![8], vec![9, 9]]);
        assert_eq!(empty, vec![Vec::<u8>::new(); 3]);
    }
}

#[test]
fn send_recv_around_a_ring_and_barrier() {
    for world in [2, 3, 4] {
        let out = run_ranks(world, T, |c| {
            let (r, n) = (c.rank(), c.size());
            c.send(&contribution(r, 5), (r + 1) % n, 7)?;
            let mut got = vec![0f32; 5];
            c.recv(&mut got, (r + n - 1) % n, 7)?;
            c.barrier()?;
            Ok(got)
        })
        .unwrap();
        for (r, got) in out.into_iter().enumerate() {
            assert_eq!(got, contribution((r + world - 1) % world, 5));
        }
    }
}

#[test]
fn mesh_sub_groups_reduce_only_within_the_group() {
    let mesh = ParallelDims::new(1, 2, 1, 2, 1, 1, 4).unwrap().mesh();
    let out = run_ranks(4, T, |c| {
        let tp = c.sub_group(&mesh.group(Axis::Tp, c.rank()))?;
        let dp = c.sub_group(&mesh.group(Axis::Dp, c.rank()))?;
        let mut a = [c.rank() as f32];
        tp.all_reduce(&mut a, ReduceOp::Sum)?;
        let mut b = [c.rank() as f32];
        dp.all_reduce(&mut b, ReduceOp::Sum)?;
        Ok((a[0], b[0], tp.rank(), dp.rank()))
    })
    .unwrap();
    // tp groups {0,1} {2,3}; dp groups {0,2} {1,3}.
    assert_eq!(out, vec![(1.0, 2.0, 0, 0), (1.0, 4.0, 1, 0), (5.0, 2.0, 0, 1), (5.0, 4.0, 1, 1)]);
}

#[test]
fn mismatched_calls_are_an_error_naming_both() {
    let start = Instant::now();
    let e = run_ranks(2, T, |c| {
        if c.rank() == 0 {
            c.all_reduce(&mut [1f32; 4], ReduceOp::Sum)?;
        } else {
            let mut out = [0f32; 8];
            c.all_gather(&[1f32; 4], &mut out)?;
        }
        Ok(())
    })
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("collective #0") && e.contains("all_reduce(F32 × 4, Sum)") && e.contains("all_gather(F32 × 4)"),
        "{e}"
    );
    assert!(start.elapsed() < Duration::from_secs(5));
    let e = run_ranks(3, T, |c| c.all_reduce(&mut vec![0f32; 4 + c.rank() % 2], ReduceOp::Sum).map_err(Into::into))
        .unwrap_err();
    assert!(e.to_string().contains("F32 × 5") && e.to_string().contains("F32 × 4"), "{e}");
}

#[test]
fn a_missing_rank_times_out_with_the_flight_recorder() {
    let start = Instant::now();
    let e = run_ranks(3, Duration::from_millis(500), |c| {
        c.barrier()?;
        if c.rank() != 2 {
            c.all_reduce(&mut [1f32; 16], ReduceOp::Sum)?;
        }
        Ok(())
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("timed out") && e.contains("all_reduce(F32 × 16, Sum) #1"), "{e}");
    assert!(e.contains("rank 2: #0 barrier") && e.contains("WAITING"), "{e}");
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[test]
fn one_failing_rank_stops_all_promptly_with_its_error() {
    let start = Instant::now();
    let e = run_ranks(4, T, |c| {
        if c.rank() == 2 {
            anyhow::bail!("boom on purpose");
        }
        c.barrier()?;
        Ok(())
    })
    .unwrap_err()
    .to_string();
    assert_eq!(e, "rank 2: boom on purpose");
    let e = run_ranks(3, T, |c| {
        if c.rank() == 1 {
            panic!("panic on purpose");
        }
        c.barrier()?;
        Ok(())
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("rank 1 panicked: panic on purpose"), "{e}");
    assert!(start.elapsed() < Duration::from_secs(5), "took {:?}", start.elapsed());
}

#[test]
fn receiving_the_wrong_size_is_a_mismatch() {
    let e = run_ranks(2, T, |c| {
        if c.rank() == 0 {
            c.send(&[1f32; 3], 1, 0)?;
        } else {
            c.recv(&mut [0f32; 4], 0, 0)?;
        }
        Ok(())
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("rank 0 sent send(F32 × 3) with tag 0 but rank 1 expects send(F32 × 4)"), "{e}");
}

/// All-to-all on 2, 3 and 4 ranks with uneven parts, empty parts (rank r sends nothing to rank
/// r + 1), its own part, twice in a row (the second's messages must not mix with the first's),
/// in f32 and bf16 — and a wrong part count is an error.
#[test]
fn all_to_all_moves_uneven_and_empty_parts() {
    let part = |from: usize, to: usize, round: usize, world: usize| -> Vec<f32> {
        let len = if to == (from + 1) % world { 0 } else { 1 + (from * 5 + to * 3 + round) % 7 };
        (0..len).map(|i| (from * 100 + to * 10 + i + round * 1000) as f32).collect()
    };
    for world in [2, 3, 4] {
        let out = run_ranks(world, T, |c| {
            let r = c.rank();
            let mut got = Vec::new();
            for round in 0..2 {
                let parts: Vec<Vec<f32>> = (0..world).map(|to| part(r, to, round, world)).collect();
                got.push(c.all_to_all(&parts)?);
            }
            let halves: Vec<Vec<bf16>> =
                (0..world).map(|to| vec![bf16::from_f32((r * 10 + to) as f32); to + 1]).collect();
            let h = c.all_to_all(&halves)?;
            let e = c.all_to_all(&halves[..world - 1]).unwrap_err().to_string();
            Ok((got, h, e))
        })
        .unwrap();
        for (r, (got, h, e)) in out.into_iter().enumerate() {
            for (round, recv) in got.iter().enumerate() {
                for (from, p) in recv.iter().enumerate() {
                    assert_eq!(*p, part(from, r, round, world), "world {world}, round {round}, {from} → {r}");
                }
            }
            for (from, p) in h.iter().enumerate() {
                assert_eq!(*p, vec![bf16::from_f32((from * 10 + r) as f32); r + 1]);
            }
            assert!(e.contains("parts for"), "{e}");
        }
    }
}

/// A duplicate's collectives are matched only among themselves: each rank runs a stream of
/// all-reduces on a duplicate from a second thread while its own thread runs others on the
/// original group, in a different interleaving on each rank; every result is right.
#[test]
fn duplicated_groups_run_collectives_concurrently_with_the_original() {
    let out = run_ranks(3, T, |c| {
        let dup: std::sync::Arc<dyn Communicator> = c.duplicate()?.into();
        let stream = crate::comm::stream::CommStream::new("test");
        let pending: Vec<_> = (0..20)
            .map(|i| {
                let dup = dup.clone();
                stream.submit("all_reduce", 4, move || {
                    let mut v = vec![(dup.rank() * 100 + i) as f32];
                    dup.all_reduce(&mut v, ReduceOp::Sum).map(|_| v[0])
                })
            })
            .collect();
        let mut mine = Vec::new();
        for i in 0..20 {
            if i % (c.rank() + 2) == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            let mut v = vec![(c.rank() + i) as f32];
            c.all_reduce(&mut v, ReduceOp::Sum)?;
            mine.push(v[0]);
        }
        let theirs: Vec<f32> = pending.into_iter().map(|p| stream.wait(p)).collect::<CommResult<_>>()?;
        Ok((mine, theirs))
    })
    .unwrap();
    for (mine, theirs) in out {
        assert_eq!(mine, (0..20).map(|i| (3 + 3 * i) as f32).collect::<Vec<_>>());
        assert_eq!(theirs, (0..20).map(|i| (300 + 3 * i) as f32).collect::<Vec<_>>());
    }
}
