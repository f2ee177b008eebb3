//! The fused kernel against the composed Burn ops (the reference path), forward and gradients.

use super::*;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

/// Largest |a-b| relative to the largest |b|, with the scale floored at 1: the inputs are
/// standard normal, so outputs and gradients are of order 1 (the largest of each is above 1 in
/// every shape tested) except those that are zero in exact arithmetic (dq, dk at T = 1, where
/// `dP − rowsum(dO∘O)` cancels and only rounding noise of the O(1) terms is left); those are
/// compared in absolute terms.
fn rel_err(a: &Tensor<4>, b: &Tensor<4>) -> f32 {
    let a: Vec<f32> = a.to_data().convert::<f32>().try_to_vec().unwrap();
    let b: Vec<f32> = b.to_data().convert::<f32>().try_to_vec().unwrap();
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1.0);
    a.iter().zip(&b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

fn random(shape: [usize; 4], rng: &mut impl Rng, device: &Device) -> Tensor<4> {
    let n = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| rng.sample::<f32, _>(StandardNormal)).collect();
    Tensor::from_data(TensorData::new(v, shape), device)
}

/// Burn's own attention with an explicit `[B, H, T, T]` boolean mask (true = hidden), built
/// entry by entry from the definition: query `i` sees key `j` iff `start(i) ≤ j ≤ i`.
fn reference(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, starts: &[i64]) -> Tensor<4> {
    let [b, h, t, d] = q.dims();
    let kv = k.dims()[1];
    let rep = |x: Tensor<4>| x.unsqueeze_dim::<5>(2).expand([b, kv, h / kv, t, d]).reshape([b, h, t, d]);
    let mut hidden = Vec::with_capacity(b * h * t * t);
    for bi in 0..b {
        for _ in 0..h {
            for i in 0..t {
                hidden.extend((0..t).map(|j| j > i || (j as i64) < starts[bi * t + i]));
            }
        }
    }
    let mask = Tensor::<4, Bool>::from_data(TensorData::new(hidden, [b, h, t, t]), &q.device());
    attention(q, rep(k), rep(v), Some(mask), None, AttentionModuleOptions::default())
}

/// Document starts for rows of `t` tokens with documents ending at random positions (about one
/// every `mean` tokens, plus a document ending exactly at a tile edge when `t` allows).
fn random_starts(b: usize, t: usize, mean: usize, rng: &mut impl Rng) -> Vec<i64> {
    let mut starts = Vec::with_capacity(b * t);
    for _ in 0..b {
        let mut start = 0;
        for i in 0..t {
            starts.push(start as i64);
            if rng.gen_range(0..mean) == 0 || i + 1 == cpu::TILE_Q {
                start = i + 1;
            }
        }
    }
    starts
}

fn ints(v: &[i64], shape: [usize; 2], device: &Device) -> Tensor<2, Int> {
    Tensor::from_data(TensorData::new(v.to_vec(), shape), device)
}

/// Shapes: T below, equal to and above the tiles (`cpu::TILE_Q` = 64 query rows, `cpu::TILE_K`
/// = 256 key rows) and not a multiple of them (150 = 2·64 + 22, 129 = 2·64 + 1, 300 = 256 + 44:
/// two key tiles), GQA, T = 1, D not a multiple of 8.
const SHAPES: &[(usize, usize, usize, usize, usize)] = &[
    (2, 4, 2, 37, 16),
    (1, 2, 2, 1, 8),
    (2, 4, 4, 64, 32),
    (1, 6, 2, 20, 12),
    (3, 8, 1, 9, 4),
    (1, 4, 2, 150, 16),
    (2, 2, 1, 129, 8),
    (1, 4, 2, 300, 16),
];

/// f32 tolerance: relative to the largest value, as in the issue (≤ 1e-5).
const TOL: f32 = 1e-5;

/// The fused op (`block`: block-causal with random documents, else causal) against Burn's
/// attention with the explicit mask, forward and the three gradients, on every shape.
fn check_against_reference(block: bool) {
    let seed: u64 = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let dev = Device::flex().autodiff();
    for &(b, h, kv, t, d) in SHAPES {
        let q = random([b, h, t, d], &mut rng, &dev).require_grad();
        let k = random([b, kv, t, d], &mut rng, &dev).require_grad();
        let v = random([b, kv, t, d], &mut rng, &dev).require_grad();
        let w = random([b, h, t, d], &mut rng, &dev);
        let starts = if block { random_starts(b, t, 24, &mut rng) } else { vec![0; b * t] };
        let fused = if block {
            block_causal_attention(q.clone(), k.clone(), v.clone(), ints(&starts, [b, t], &dev))
        } else {
            causal_attention(q.clone(), k.clone(), v.clone())
        };
        let refo = reference(q.clone(), k.clone(), v.clone(), &starts);
        let ctx = format!("block {block}, shape b{b} h{h} kv{kv} t{t} d{d}, seed {seed}");
        let e = rel_err(&fused, &refo);
        assert!(e <= TOL, "forward error {e} ({ctx})");
        let gf = (fused * w.clone()).sum().backward();
        let gr = (refo * w).sum().backward();
        for (name, x) in [("q", &q), ("k", &k), ("v", &v)] {
            let (a, r) = (x.grad(&gf).unwrap(), x.grad(&gr).unwrap());
            let e = rel_err(&a, &r);
            assert!(e <= TOL, "d{name} error {e} ({ctx})");
        }
    }
}

#[test]
fn forward_and_gradients_match_the_reference() {
    check_against_reference(false);
}

#[test]
fn block_causal_forward_and_gradients_match_the_masked_reference() {
    check_against_reference(true);
}

/// Block-causal attention over a packed row equals causal attention over each document alone
/// (the definition of document masking), and the composed reference path agrees too.
#[test]
fn block_causal_equals_each_document_alone() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let dev = Device::flex();
    let (h, kv, d) = (4, 2, 8);
    let lens = [70, 1, 200, 29]; // 300 tokens: crosses query and key tiles
    let t: usize = lens.iter().sum();
    let (q, k, v) = (
        random([1, h, t, d], &mut rng, &dev),
        random([1, kv, t, d], &mut rng, &dev),
        random([1, kv, t, d], &mut rng, &dev),
    );
    let mut starts = Vec::new();
    for (n, &len) in lens.iter().enumerate() {
        let s: usize = lens[..n].iter().sum();
        starts.extend(std::iter::repeat_n(s as i64, len));
    }
    let packed = block_causal_attention(q.clone(), k.clone(), v.clone(), ints(&starts, [1, t], &dev));
    let composed = crate::reference::attention(q.clone(), k.clone(), v.clone(), Some(ints(&starts, [1, t], &dev)));
    let mut s = 0;
    for len in lens {
        let cut = |x: &Tensor<4>, heads| x.clone().slice([0..1, 0..heads, s..s + len, 0..d]);
        let alone = causal_attention(cut(&q, h), cut(&k, kv), cut(&v, kv));
        let e = rel_err(&cut(&packed, h), &alone);
        assert!(e <= TOL, "document at {s} (length {len}): {e}");
        let e = rel_err(&cut(&composed, h), &alone);
        assert!(e <= TOL, "reference path, document at {s} (length {len}): {e}");
        s += len;
    }
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    let n = cpu::Dims::square(2, 4, 2, 133, 16);
    let mut r = |len: usize| (0..len).map(|_| rng.sample::<f32, _>(StandardNormal)).collect::<Vec<f32>>();
    let (q, k, v, d_o) = (r(2 * 4 * 133 * 16), r(2 * 2 * 133 * 16), r(2 * 2 * 133 * 16), r(2 * 4 * 133 * 16));
    let starts = random_starts(2, 133, 30, &mut rng);
    let run = |threads| {
        rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap().install(|| {
            let vis = cpu::Starts { starts: &starts, t: 133 };
            let (o, lse) = cpu::forward(&q, &k, &v, &vis, n, 0.25);
            let g = cpu::backward(&q, &k, &v, &vis, &o, &lse, &d_o, n, 0.25);
            (o, lse, g)
        })
    };
    assert_eq!(run(1), run(3));
}

#[test]
fn runs_without_autodiff_and_reports_support() {
    let dev = Device::flex();
    assert!(crate::has_kernels(&dev) && crate::has_kernels(&dev.clone().autodiff()));
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let (q, k, v) = (
        random([1, 2, 5, 8], &mut rng, &dev),
        random([1, 1, 5, 8], &mut rng, &dev),
        random([1, 1, 5, 8], &mut rng, &dev),
    );
    let e = rel_err(&causal_attention(q.clone(), k.clone(), v.clone()), &reference(q, k, v, &[0; 5]));
    assert!(e <= TOL, "{e}");
}
