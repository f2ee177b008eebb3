//! Expert-parallel dispatch and combine on 2 and 4 ranks against every expert on one rank:
//! each rank's expert outputs and input gradients, and each rank's expert-weight gradients
//! (summed over every rank's tokens), equal the single-rank computation (float32, ≤ 1e-5);
//! uneven counts, experts that get no token, and a rank that routes nothing.

use super::*;
use crate::launcher::run_ranks;
use crate::registry::register;
use std::time::Duration;
use titan_kernels::grouped_matmul;

const EXPERTS: usize = 8;
const D: usize = 6;
const H: usize = 5;

fn dev() -> Device {
    Device::flex().autodiff()
}

fn vals<const N: usize>(tag: usize, shape: [usize; N]) -> Tensor<N> {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| (((tag * 7919 + i * 104_729) % 2003) as f32) / 1000.0 - 1.0).collect();
    Tensor::from_data(TensorData::new(v, shape), &dev())
}

fn host<const N: usize>(t: Tensor<N>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().unwrap()
}

/// Rank `r`'s tokens per expert: uneven, some zero; rank 1 routes nothing.
fn counts(r: usize) -> Vec<usize> {
    if r == 1 {
        return vec![0; EXPERTS];
    }
    (0..EXPERTS).map(|e| (r * 3 + e * 5) % 4).collect()
}

fn assert_close(got: Vec<f32>, want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let err = got.iter().zip(want).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(err <= 1e-5, "{what}: error {err}");
}

#[test]
fn expert_parallel_equals_every_expert_on_one_rank() {
    for world in [2, 4] {
        let w = vals(1, [EXPERTS, D, H]);
        // Reference: each rank's rows through all experts on one rank; weight gradients summed.
        let mut want = Vec::new();
        let mut dw_sum = vec![0f32; EXPERTS * D * H];
        for r in 0..world {
            let c = counts(r);
            let m: usize = c.iter().sum();
            let (x, wr) = (vals(10 + r, [m, D]).require_grad(), w.clone().require_grad());
            let y = grouped_matmul(x.clone(), wr.clone(), &c, true);
            let g = (y.clone() * vals(20 + r, [m, H])).sum().backward();
            want.push((host(y), host(x.grad(&g).unwrap())));
            dw_sum.iter_mut().zip(host(wr.grad(&g).unwrap())).for_each(|(a, b)| *a += b);
        }
        let per = EXPERTS / world;
        run_ranks(world, Duration::from_secs(60), |comm| {
            let g = register(Box::new(comm));
            let r = g.rank();
            let hooks = ExpertParallelHooks { inner: Hooks::default(), group: g.clone() };
            let c = counts(r);
            let m: usize = c.iter().sum();
            let x = vals(10 + r, [m, D]).require_grad();
            let wl = w.clone().narrow(0, r * per, per).inner();
            let wl = Tensor::<3>::from_inner(wl).require_grad();
            let y = hooks.experts(x.clone(), &c, &|xs, sizes| grouped_matmul(xs, wl.clone(), sizes, true));
            let grads = (y.clone() * vals(20 + r, [m, H])).sum().backward();
            let ctx = format!("rank {r} of {world}");
            assert_close(host(y), &want[r].0, &format!("output, {ctx}"));
            if m > 0 {
                assert_close(host(x.grad(&grads).unwrap()), &want[r].1, &format!("input gradient, {ctx}"));
            }
            let dw = &dw_sum[r * per * D * H..(r + 1) * per * D * H];
            assert_close(host(wl.grad(&grads).unwrap()), dw, &format!("expert weight gradient, {ctx}"));
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{world} ranks: {e}"));
    }
}

#[test]
fn route_sends_receives_and_regroups_by_expert() {
    // 2 ranks, 4 experts (2 each); rank 1's view.
    let route = ExpertRoute { counts: vec![vec![1, 2, 3, 0], vec![0, 1, 1, 2]], per_rank: 2, rank: 1 };
    assert_eq!(route.send(), vec![1, 3]);
    assert_eq!(route.recv(), vec![3, 3]);
    assert_eq!(route.local_sizes(), vec![4, 2]);
    // Arrival: rank 0's expert-2 rows (0..3), rank 1's expert-2 row (3), expert-3 rows (4, 5).
    assert_eq!(route.regroup(), vec![0, 1, 2, 3, 4, 5]);
    let route = ExpertRoute { counts: vec![vec![1, 2], vec![3, 1]], per_rank: 2, rank: 0 };
    // Arrival: [r0 e0, r0 e1, r0 e1, r1 e0 ×3, r1 e1] → by expert: e0 rows 0, 3, 4, 5; e1 rows 1, 2, 6.
    assert_eq!(route.regroup(), vec![0, 3, 4, 5, 1, 2, 6]);
}
