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

fn reference(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>) -> Tensor<4> {
    let [b, h, t, d] = q.dims();
    let kv = k.dims()[1];
    let rep = |x: Tensor<4>| x.unsqueeze_dim::<5>(2).expand([b, kv, h / kv, t, d]).reshape([b, h, t, d]);
    attention(q, rep(k), rep(v), None, None, AttentionModuleOptions { is_causal: true, ..Default::default() })
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

#[test]
fn forward_and_gradients_match_the_reference() {
    let seed: u64 = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let dev = Device::flex().autodiff();
    for &(b, h, kv, t, d) in SHAPES {
        let q = random([b, h, t, d], &mut rng, &dev).require_grad();
        let k = random([b, kv, t, d], &mut rng, &dev).require_grad();
        let v = random([b, kv, t, d], &mut rng, &dev).require_grad();
        let w = random([b, h, t, d], &mut rng, &dev);
        let fused = causal_attention(q.clone(), k.clone(), v.clone());
        let refo = reference(q.clone(), k.clone(), v.clone());
        let ctx = format!("shape b{b} h{h} kv{kv} t{t} d{d}, seed {seed}");
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
fn results_do_not_depend_on_the_thread_count() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    let n = cpu::Dims { b: 2, h: 4, kv: 2, t: 133, d: 16 };
    let mut r = |len: usize| (0..len).map(|_| rng.sample::<f32, _>(StandardNormal)).collect::<Vec<f32>>();
    let (q, k, v, d_o) = (r(2 * 4 * 133 * 16), r(2 * 2 * 133 * 16), r(2 * 2 * 133 * 16), r(2 * 4 * 133 * 16));
    let run = |threads| {
        rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap().install(|| {
            let (o, lse) = cpu::forward(&q, &k, &v, n, 0.25);
            let g = cpu::backward(&q, &k, &v, &o, &lse, &d_o, n, 0.25);
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
    let e = rel_err(&causal_attention(q.clone(), k.clone(), v.clone()), &reference(q, k, v));
    assert!(e <= TOL, "{e}");
}
