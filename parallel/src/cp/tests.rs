//! Ring (and all-gather) attention on 2 and 4 ranks against the whole sequence's attention on
//! one: each rank's output rows and `dq, dk, dv` rows equal the full computation's at its
//! columns (float32, ≤ 1e-5 relative to the largest value), causal and block-causal, GQA, head
//! dims 8 and 12.

use super::*;
use crate::launcher::run_ranks;
use crate::registry::register;
use std::time::Duration;

const TOL: f32 = 1e-5;

fn dev() -> Device {
    Device::flex().autodiff()
}

/// Deterministic values for (tag, shape).
fn vals(tag: usize, shape: [usize; 4]) -> Tensor<4> {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| (((tag * 7919 + i * 104_729) % 2003) as f32) / 1000.0 - 1.0).collect();
    Tensor::from_data(TensorData::new(v, shape), &dev())
}

fn host(t: Tensor<4>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().unwrap()
}

fn assert_close(got: Vec<f32>, want: Vec<f32>, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs())).max(1.0);
    let err = got.iter().zip(&want).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(err <= TOL * scale, "{what}: error {err} vs scale {scale}");
}

/// Document starts of `b` rows of `t` tokens: documents of varying length (some crossing chunk
/// and rank boundaries).
fn doc_starts(b: usize, t: usize) -> Vec<i64> {
    let mut out = Vec::with_capacity(b * t);
    for row in 0..b {
        let mut start = 0;
        for i in 0..t {
            out.push(start as i64);
            if (i * 7 + row * 3) % 11 == 0 {
                start = i + 1;
            }
        }
    }
    out
}

fn check(c: usize, rotate: Rotate, block: bool, (b, h, kv, t, d): (usize, usize, usize, usize, usize)) {
    let (q, k, v, w) = (vals(1, [b, h, t, d]), vals(2, [b, kv, t, d]), vals(3, [b, kv, t, d]), vals(4, [b, h, t, d]));
    let starts = if block { doc_starts(b, t) } else { vec![0; b * t] };
    let starts_t = |s: &[i64], cols: usize| Tensor::<2, Int>::from_data(TensorData::new(s.to_vec(), [b, cols]), &dev());
    // The whole sequence on one rank.
    let (qf, kf, vf) = (q.clone().require_grad(), k.clone().require_grad(), v.clone().require_grad());
    let full = titan_kernels::attention(qf.clone(), kf.clone(), vf.clone(), block.then(|| starts_t(&starts, t)), true);
    let g = (full.clone() * w.clone()).sum().backward();
    let want = [host(full), host(qf.grad(&g).unwrap()), host(kf.grad(&g).unwrap()), host(vf.grad(&g).unwrap())];
    let ctx = format!("C {c}, {rotate:?}, block {block}, b{b} h{h} kv{kv} t{t} d{d}");
    run_ranks(c, Duration::from_secs(60), |comm| {
        let g = register(Box::new(comm));
        let spec = CpSpec::new(&g, rotate);
        let cols = spec.columns(t);
        let idx = Tensor::<1, Int>::from_data(TensorData::new(cols.iter().map(|&x| x as i64).collect::<Vec<_>>(), [cols.len()]), &dev());
        let take = |x: &Tensor<4>| x.clone().select(2, idx.clone());
        let (ql, kl, vl) = (take(&q).require_grad(), take(&k).require_grad(), take(&v).require_grad());
        let local_starts = starts_t(&spec.shard(&starts, t), cols.len());
        let o = context_attention(ql.clone(), kl.clone(), vl.clone(), block.then_some(local_starts), spec);
        let grads = (o.clone() * take(&w)).sum().backward();
        let got = [o, ql.grad(&grads).unwrap(), kl.grad(&grads).unwrap(), vl.grad(&grads).unwrap()];
        for (name, (got, want)) in ["output", "dq", "dk", "dv"].iter().zip(got.into_iter().zip(&want)) {
            let [_, heads, _, _] = got.dims();
            let want = Tensor::<4>::from_data(TensorData::new(want.clone(), [b, heads, t, d]), &dev());
            assert_close(host(got), host(take(&want)), &format!("{name} on rank {} ({ctx})", spec.rank));
        }
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{ctx}: {e}"));
}

#[test]
fn ring_attention_equals_the_whole_sequence() {
    for c in [2, 4] {
        for block in [false, true] {
            check(c, Rotate::Ring, block, (2, 4, 2, 16 * c, 12));
        }
    }
    check(2, Rotate::Ring, true, (1, 2, 1, 200, 8));
}

#[test]
fn allgather_attention_equals_the_whole_sequence() {
    for c in [2, 4] {
        check(c, Rotate::AllGather, true, (2, 4, 2, 8 * c, 8));
    }
    check(2, Rotate::AllGather, false, (1, 4, 4, 12, 12));
}

#[test]
fn head_tail_sharding_balances_causal_work() {
    let g = (0..4).map(|r| CpSpec { group: 0, degree: 4, rank: r, rotate: Rotate::Ring });
    // 16 positions, 8 chunks of 2: rank 1 holds chunks 1 and 6.
    let spec = CpSpec { group: 0, degree: 4, rank: 1, rotate: Rotate::Ring };
    assert_eq!(spec.columns(16), vec![2, 3, 12, 13]);
    assert_eq!(spec.shard(&(0..32).collect::<Vec<i32>>(), 16), vec![2, 3, 12, 13, 18, 19, 28, 29]);
    // Causal work (keys seen) per rank is equal.
    let work: Vec<usize> = g.map(|s| s.columns(64).iter().map(|&p| p + 1).sum()).collect();
    assert!(work.iter().all(|&x| x == work[0]), "{work:?}");
}
