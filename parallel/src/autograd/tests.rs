//! Each differentiable collective on 2, 3 and 4 ranks: outputs and gradients equal the
//! unsharded computation (float32, ≤ 1e-5 relative to the largest value).

use super::*;
use crate::comm::Communicator;
use crate::launcher::run_ranks;
use crate::registry::register;
use std::time::Duration;

const TOL: f32 = 1e-5;

fn dev() -> Device {
    Device::flex().autodiff()
}

/// Deterministic values for (tag, shape).
fn vals<const D: usize>(tag: usize, shape: [usize; D]) -> Tensor<D> {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| (((tag * 7919 + i * 104_729) % 2003) as f32) / 1000.0 - 1.0).collect();
    Tensor::from_data(TensorData::new(v, shape), &dev())
}

fn host<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().unwrap()
}

fn assert_close(got: Vec<f32>, want: Vec<f32>, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-12);
    let err = got.iter().zip(&want).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(err <= TOL * scale, "{what}: error {err} vs scale {scale}");
}

fn sum_of<const D: usize>(n: usize, f: impl Fn(usize) -> Tensor<D>) -> Tensor<D> {
    (1..n).fold(f(0), |acc, r| acc + f(r))
}

fn on_ranks(check: impl Fn(usize, usize, &GroupHandle) + Sync) {
    for n in [2, 3, 4] {
        run_ranks(n, Duration::from_secs(30), |c| {
            let r = c.rank();
            let g = register(Box::new(c));
            check(r, n, &g);
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{n} ranks: {e}"));
    }
}

#[test]
fn copy_to_group_all_reduces_the_gradient() {
    on_ranks(|r, n, g| {
        let x = vals(1, [3, 4]).require_grad();
        let y = copy_to_group(x.clone(), g);
        assert_close(host(y.clone()), host(x.clone()), "f forward");
        let grads = (y * vals(10 + r, [3, 4])).sum().backward();
        assert_close(host(x.grad(&grads).unwrap()), host(sum_of(n, |s| vals(10 + s, [3, 4]))), "f backward");
    });
}

#[test]
fn reduce_from_group_sums_forward_and_passes_the_gradient() {
    on_ranks(|r, n, g| {
        let x = vals(20 + r, [2, 5]).require_grad();
        let y = reduce_from_group(x.clone(), g);
        assert_close(host(y.clone()), host(sum_of(n, |s| vals(20 + s, [2, 5]))), "g forward");
        let grads = (y * vals(3, [2, 5])).sum().backward();
        assert_close(host(x.grad(&grads).unwrap()), host(vals(3, [2, 5])), "g backward");
    });
}

#[test]
fn gather_and_split_along_a_middle_dim() {
    on_ranks(|r, n, g| {
        // gather: [2, 3, 4] per rank → [2, 3n, 4]
        let x = vals(30 + r, [2, 3, 4]).require_grad();
        let y = gather_from_group(x.clone(), 1, g);
        let full = Tensor::cat((0..n).map(|s| vals(30 + s, [2, 3, 4])).collect(), 1);
        assert_close(host(y.clone()), host(full), "gather forward");
        let w = vals(4, [2, 3 * n, 4]);
        let grads = (y * w.clone()).sum().backward();
        assert_close(host(x.grad(&grads).unwrap()), host(w.slice([0..2, 3 * r..3 * r + 3, 0..4])), "gather backward");
        // split: [2, 3, 4n] replicated → [2, 3, 4] per rank
        let x = vals(5, [2, 3, 4 * n]).require_grad();
        let y = split_to_group(x.clone(), 2, g);
        assert_close(host(y.clone()), host(x.clone().slice([0..2, 0..3, 4 * r..4 * r + 4])), "split forward");
        let grads = (y * vals(40 + r, [2, 3, 4])).sum().backward();
        let want = Tensor::cat((0..n).map(|s| vals(40 + s, [2, 3, 4])).collect(), 2);
        assert_close(host(x.grad(&grads).unwrap()), host(want), "split backward");
    });
}

#[test]
fn reduce_scatter_forward_all_gather_backward() {
    on_ranks(|r, n, g| {
        let x = vals(50 + r, [2, 2 * n, 3]).require_grad();
        let y = reduce_scatter_to_group(x.clone(), 1, g);
        let total = sum_of(n, |s| vals(50 + s, [2, 2 * n, 3]));
        assert_close(host(y.clone()), host(total.slice([0..2, 2 * r..2 * r + 2, 0..3])), "reduce-scatter forward");
        let grads = (y * vals(60 + r, [2, 2, 3])).sum().backward();
        let want = Tensor::cat((0..n).map(|s| vals(60 + s, [2, 2, 3])).collect(), 1);
        assert_close(host(x.grad(&grads).unwrap()), host(want), "reduce-scatter backward");
    });
}

#[test]
fn fsdp_all_gather_reduce_scatters_the_gradient() {
    on_ranks(|r, n, g| {
        let shard = vals(70 + r, [2, 5]).require_grad();
        let full = fsdp_all_gather(shard.clone(), g);
        assert_close(
            host(full.clone()),
            host(Tensor::cat((0..n).map(|s| vals(70 + s, [2, 5])).collect(), 0)),
            "fsdp forward",
        );
        // Each rank uses the full parameter on its own data.
        let grads = (full * vals(80 + r, [2 * n, 5])).sum().backward();
        let total = sum_of(n, |s| vals(80 + s, [2 * n, 5]));
        assert_close(host(shard.grad(&grads).unwrap()), host(total.slice([2 * r..2 * r + 2, 0..5])), "fsdp backward");
    });
}

#[test]
fn sequence_gather_reduce_scatters_the_gradient_along_its_dim() {
    on_ranks(|r, n, g| {
        let x = vals(100 + r, [2, 3, 4]).require_grad();
        let full = all_gather_to_group(x.clone(), 1, g);
        let want = Tensor::cat((0..n).map(|s| vals(100 + s, [2, 3, 4])).collect(), 1);
        assert_close(host(full.clone()), host(want), "sequence gather forward");
        let grads = (full * vals(110 + r, [2, 3 * n, 4])).sum().backward();
        let total = sum_of(n, |s| vals(110 + s, [2, 3 * n, 4]));
        assert_close(host(x.grad(&grads).unwrap()), host(total.slice([0..2, 3 * r..3 * r + 3, 0..4])), "backward");
    });
}

/// Several collectives of different kinds and sizes inside one backward. If ranks ran them in
/// different orders, the communicator would report a mismatch (or time out); identical graphs
/// must run them in the same order and give the unsharded gradient.
#[test]
fn backward_issues_collectives_in_the_same_order_on_every_rank() {
    on_ranks(|r, n, g| {
        let x = vals(90, [4, 6]).require_grad();
        let a = copy_to_group(x.clone(), g) * vals(91 + r, [4, 6]); // f: grad all-reduce [4, 6]
        let b = gather_from_group(x.clone().slice([0..2, 0..6]), 0, g); // split in backward
        let c = fsdp_all_gather(x.clone().slice([0..4, 0..3]), g); // reduce-scatter [4n, 3] → [4, 3]
        let loss = a.sum() + (b * vals(5, [2 * n, 6])).sum() + (c * vals(6, [4 * n, 3])).sum();
        let grads = loss.backward();
        let mut want = sum_of(n, |s| vals(91 + s, [4, 6]));
        let gb = vals(5, [2 * n, 6]).slice([2 * r..2 * r + 2, 0..6]);
        want = want.clone().slice_assign([0..2, 0..6], want.slice([0..2, 0..6]) + gb);
        let gc = vals(6, [4 * n, 3]).slice([4 * r..4 * r + 4, 0..3]).mul_scalar(n as f32);
        want = want.clone().slice_assign([0..4, 0..3], want.slice([0..4, 0..3]) + gc);
        assert_close(host(x.grad(&grads).unwrap()), host(want), "mixed backward");
    });
}
