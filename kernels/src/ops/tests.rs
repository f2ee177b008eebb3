//! Every fused kernel (and the linear layer) on every device that has them — the CPU (flex) and, with the `wgpu`
//! feature, burn's wgpu backend (on CPU-only machines: Mesa's software Vulkan adapter) —
//! against the composed-ops reference on flex: forward and gradients, fresh random inputs each
//! run (the seed is printed on failure); on wgpu the kernel outputs are allocated over poisoned
//! (NaN) memory so an unwritten element shows.

use burn::prelude::*;
use burn::tensor::DType;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

/// float32: largest |a − b| relative to the largest |b| (the bound).
const TOL: f32 = 1e-5;
/// float16 inputs on CubeCL devices against the float32 reference: an 11-bit mantissa rounds
/// each input and output by up to 2⁻¹¹ ≈ 4.9e-4; reductions over a few hundred columns (f32
/// accumulators) and the sums of the tests' `Σ out · w` add a few of those. Seen on the
/// software adapter (2 × 250 cases): at most 2.0e-3 (SwiGLU's `dg`), attention's gradients
/// 1.1e-3, the cross-entropy's 1.7e-3 — which reached 5.8e-3 while its log-sum-exp was saved
/// in float16 (now float32, as the attention's).
const TOL_F16: f32 = 5e-3;

/// The devices with fused kernels in this build (with autodiff).
pub(crate) fn devices() -> Vec<Device> {
    let mut d = vec![Device::flex().autodiff()];
    #[cfg(feature = "wgpu")]
    d.push(Device::wgpu(burn::tensor::DeviceKind::Cpu).autodiff());
    d
}

/// Largest |a − b| relative to the largest |b|, the scale floored at 1: inputs are standard
/// normal, so values are of order 1, except gradients that are zero in exact arithmetic (dq of
/// attention at T = 1: `dP − rowsum(dO∘O)` cancels), which are compared in absolute terms.
fn rel_err(a: Tensor<1>, b: Tensor<1>) -> f32 {
    let a: Vec<f32> = a.into_data().convert::<f32>().try_into_vec().unwrap();
    let b: Vec<f32> = b.into_data().convert::<f32>().try_into_vec().unwrap();
    assert_eq!(a.len(), b.len());
    assert!(a.iter().all(|x| x.is_finite()), "the kernel left non-finite values");
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1.0);
    a.iter().zip(&b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

fn seed() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
}

fn normal(n: usize, rng: &mut impl Rng) -> Vec<f32> {
    (0..n).map(|_| rng.sample::<f32, _>(StandardNormal)).collect()
}

/// Fills and frees a large buffer with NaN so the memory pool hands poisoned memory to the next
/// allocations.
fn poison(device: &Device) {
    let p = Tensor::<1>::full([1 << 20], f32::NAN, &device.clone().without_autodiff());
    let _: f32 = p.clone().slice([0..1]).into_scalar();
    drop(p);
}

/// Runs `op(inputs, fused)` fused on every device and as the reference on flex; compares the
/// outputs and the gradients of `Σ out · w` (random `w`) for every input.
fn compare(
    name: &str,
    inputs: &[Vec<f32>],
    rng: &mut impl Rng,
    seed: u64,
    op: &dyn Fn(&[Tensor<1>], bool) -> Tensor<1>,
) {
    compare_on(&devices(), name, inputs, rng, seed, TOL, op)
}

/// [`compare`] on the given devices, within `tol` in float32.
fn compare_on(
    devices: &[Device],
    name: &str,
    inputs: &[Vec<f32>],
    rng: &mut impl Rng,
    seed: u64,
    tol: f32,
    op: &dyn Fn(&[Tensor<1>], bool) -> Tensor<1>,
) {
    let make_as = |dev: &Device, dtype: DType| -> Vec<Tensor<1>> {
        inputs.iter().map(|v| Tensor::from_data(TensorData::new(v.clone(), [v.len()]), (dev, dtype)).require_grad()).collect()
    };
    let make = |dev: &Device| make_as(dev, DType::F32);
    let fdev = Device::flex().autodiff();
    let xf = make(&fdev);
    let yf = op(&xf, false);
    let w = normal(yf.dims()[0], rng);
    let wt = |dev: &Device| Tensor::<1>::from_data(TensorData::new(w.clone(), [w.len()]), dev);
    let gf = (yf.clone() * wt(&fdev)).sum().backward();
    for dev in devices {
        // On CubeCL devices the kernels also run on float16 inputs (the compute type of
        // `training.mixed_precision_param = "float16"`), against the same float32 reference,
        // and the row reductions in both variants (one cube per row, one thread per row).
        let cube = crate::on_cube(dev);
        let dtypes: &[(DType, f32)] = if cube { &[(DType::F32, tol), (DType::F16, TOL_F16)] } else { &[(DType::F32, tol)] };
        let variants: &[bool] = if cube { &[true, false] } else { &[true] };
        let _pinned = cube.then(|| ROW_VARIANT.lock().unwrap_or_else(|p| p.into_inner()));
        for (&(dtype, tol), &per_cube) in dtypes.iter().flat_map(|d| variants.iter().map(move |v| (d, v))) {
            pin_row_variant(cube.then_some(per_cube));
            let name = &format!("{name}{}", if cube && !per_cube { " (one thread per row)" } else { "" });
            let xg = make_as(dev, dtype);
            if cube {
                poison(dev);
            }
            let yg = op(&xg, true);
            assert_eq!(yg.dtype(), dtype, "{name} on {dev:?}: output type");
            let e = rel_err(yg.clone(), yf.clone());
            assert!(e <= tol, "{name} on {dev:?} ({dtype:?}): forward error {e} (seed {seed})");
            let gg = (yg.cast(DType::F32) * wt(dev)).sum().backward();
            for (i, (a, b)) in xg.iter().zip(&xf).enumerate() {
                if let (Some(a), Some(b)) = (a.grad(&gg), b.grad(&gf)) {
                    let e = rel_err(a, b);
                    assert!(e <= tol, "{name} on {dev:?} ({dtype:?}): gradient of input {i} error {e} (seed {seed})");
                }
            }
        }
        pin_row_variant(None);
    }
}

/// Held by a test while it pins the row-reduction variant (a process-wide setting).
static ROW_VARIANT: std::sync::Mutex<()> = std::sync::Mutex::new(());

use crate::force_row_variant as pin_row_variant;

#[test]
fn rms_norm_silu_mul_and_rope_match_the_reference() {
    let s = seed();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(s);
    // The fourth shape spans several parallel tasks of the CPU kernels; on CubeCL devices the
    // rows wider than a cube's 256 threads (700) take each thread over several columns, and
    // 70 000 rows need more cubes than one grid dimension holds (65 535).
    for (b, t, d) in [(2, 5, 64), (1, 1, 12), (3, 7, 33), (4, 33, 200), (2, 3, 700), (1, 70_000, 4)] {
        let inputs = [normal(b * t * d, &mut rng), normal(d, &mut rng)];
        // `dw` sums b·t rows: over 70 000 of them f32 sums in different orders (the flex
        // reference's and the kernels') differ by ≈ 1e-5 of the result.
        let tol = if b * t > 10_000 { 1e-4 } else { TOL };
        compare_on(&devices(), &format!("rms_norm {b}x{t}x{d}"), &inputs, &mut rng, s, tol, &|x, fused| {
            crate::rms_norm(x[0].clone().reshape([b, t, d]), x[1].clone(), 1e-5, fused).reshape([b * t * d])
        });
        let inputs = [normal(b * t * d, &mut rng), normal(b * t * d, &mut rng)];
        compare(&format!("silu_mul {b}x{t}x{d}"), &inputs, &mut rng, s, &|x, fused| {
            crate::silu_mul(x[0].clone(), x[1].clone(), fused)
        });
    }
    for (b, h, t, d) in [(2, 3, 5, 8), (1, 1, 1, 4), (1, 2, 9, 16)] {
        // Real RoPE tables repeat their halves: angle i and i + d/2 are the same.
        let angles: Vec<f32> = (0..t * d).map(|i| (i / d) as f32 * 0.3 + (i % (d / 2)) as f32 * 0.01).collect();
        let table = |f: fn(f32) -> f32| angles.iter().map(|&a| f(a)).collect::<Vec<f32>>();
        let (cos, sin) = (table(f32::cos), table(f32::sin));
        let inputs = [normal(b * h * t * d, &mut rng)];
        compare(&format!("rope {b}x{h}x{t}x{d}"), &inputs, &mut rng, s, &|x, fused| {
            let dev = x[0].device();
            let tab = |v: &Vec<f32>| {
                Tensor::<4>::from_data(TensorData::new(v.clone(), [1, 1, t, d]), &dev).cast(x[0].dtype())
            };
            crate::rope(x[0].clone().reshape([b, h, t, d]), tab(&cos), tab(&sin), fused).reshape([b * h * t * d])
        });
    }
}

#[test]
fn flash_attention_matches_the_reference() {
    let s = seed();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(s);
    // GQA, T = 1, T and D not multiples of anything; more queries than a cube's 64 rows and
    // more keys than a shared-memory tile (64 rows; at D = 128 the software adapter's 32 KiB
    // hold 31); causal, and block-causal with documents ending at random positions (the
    // reference: Burn's attention with the boolean mask). Rows shared by 1 (D = 4, 8, 12), 2
    // (D = 16), 4 (D = 32) and 8 threads (D = 64, 128) where the device has plane shuffles.
    let shapes = [
        (2, 4, 2, 7, 8),
        (1, 2, 2, 1, 4),
        (1, 4, 1, 13, 12),
        (2, 2, 1, 40, 8),
        (2, 2, 1, 150, 16),
        (1, 4, 2, 33, 32),
        (1, 2, 1, 70, 64),
        (1, 2, 2, 70, 128),
    ];
    // On the software adapter cubecl offers no plane shuffles, so the rows are shared by
    // several threads only when forced: both ways.
    for ((b, h, kv, t, d), shuffles) in shapes.into_iter().flat_map(|s| [(s, None), (s, Some(true))]) {
        crate::force_attention_shuffles(shuffles);
        for block in [false, true] {
            let inputs =
                [normal(b * h * t * d, &mut rng), normal(b * kv * t * d, &mut rng), normal(b * kv * t * d, &mut rng)];
            let mut starts = Vec::new();
            for _ in 0..b {
                let mut start = 0;
                for i in 0..t {
                    starts.push(start);
                    if block && rng.gen_range(0..5) == 0 {
                        start = i as i64 + 1;
                    }
                }
            }
            let name = format!("attention (block {block}, shuffles {shuffles:?}) b{b} h{h} kv{kv} t{t} d{d}");
            compare(&name, &inputs, &mut rng, s, &|x, fused| {
                let (q, k, v) = (
                    x[0].clone().reshape([b, h, t, d]),
                    x[1].clone().reshape([b, kv, t, d]),
                    x[2].clone().reshape([b, kv, t, d]),
                );
                let starts = block
                    .then(|| Tensor::<2, Int>::from_data(TensorData::new(starts.clone(), [b, t]), &q.device()));
                crate::attention(q, k, v, starts, fused).reshape([b * h * t * d])
            });
        }
    }
    crate::force_attention_shuffles(None);
}

#[test]
fn fused_cross_entropy_matches_the_reference() {
    let s = seed();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(s);
    // Vocabularies narrower and wider than a cube's 256 threads; rows past one grid dimension.
    for (b, t, v) in [(2, 3, 50), (1, 1, 7), (2, 5, 301), (4, 40, 301), (1, 3, 5000), (1, 66_000, 3)] {
        let logits: Vec<f32> = normal(b * t * v, &mut rng).into_iter().map(|x| 3.0 * x).collect();
        // Random targets; with many rows each row's largest logit, so the summed loss (a
        // float16 on the float16 pass) stays far below float16's largest value (65 504).
        let argmax = |r: usize| (0..v).max_by(|&i, &j| logits[r * v + i].total_cmp(&logits[r * v + j])).unwrap();
        let targets: Vec<i64> =
            (0..b * t).map(|r| if b * t > 1000 { argmax(r) as i64 } else { rng.gen_range(0..v as i64) }).collect();
        let inputs = [logits];
        compare(&format!("cross_entropy {b}x{t}x{v}"), &inputs, &mut rng, s, &|x, fused| {
            let dev = x[0].device();
            let tg = Tensor::<2, Int>::from_data(TensorData::new(targets.clone(), [b, t]), &dev);
            crate::cross_entropy_sum(x[0].clone().reshape([b, t, v]), tg, fused)
        });
    }
}

#[test]
fn linear_matches_the_reference() {
    let s = seed();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(s);
    // Column panels (wide), row panels (narrow), one panel (small), a transposed input. The CPU
    // only: on CubeCL devices `linear` is Burn's matmul (whose autotuning on the software
    // adapter would cost minutes here); the wgpu training test covers it there.
    let cpu = [Device::flex().autodiff()];
    for (rows, d_in, d_out, transposed) in
        [(1, 1, 1, false), (5, 3, 7, true), (130, 70, 300, false), (300, 129, 40, false), (64, 96, 200, true)]
    {
        let inputs = [normal(rows * d_in, &mut rng), normal(d_in * d_out, &mut rng)];
        compare_on(&cpu, &format!("linear {rows}x{d_in}x{d_out} t{transposed}"), &inputs, &mut rng, s, TOL, &|x, fused| {
            let x2 = if transposed {
                x[0].clone().reshape([d_in, rows]).transpose()
            } else {
                x[0].clone().reshape([rows, d_in])
            };
            crate::linear(x2, x[1].clone().reshape([d_in, d_out]), fused).reshape([rows * d_out])
        });
    }
}

/// The fused AdamW step against the composed ops on flex, with and without gradient scaling,
/// over several parallel chunks: on the CPU bit for bit (the same `f32` operations in the same
/// order); on CubeCL devices within 1e-6 of the largest value (Vulkan's division and square root
/// may be a few ulps off the correctly rounded result), outputs over poisoned memory.
#[test]
fn fused_adamw_matches_the_reference() {
    let s = seed();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(s);
    let n = 40_000;
    let t = |v: &Vec<f32>, dev: &Device| Tensor::<1>::from_data(TensorData::new(v.clone(), [n]), dev);
    for (step, grad_scale) in [(1, 1.0f64), (7, 0.37)] {
        let (p, g, m) = (normal(n, &mut rng), normal(n, &mut rng), normal(n, &mut rng));
        let v: Vec<f32> = normal(n, &mut rng).into_iter().map(|x| x * x).collect();
        let (b1, b2, lr, wd) = (0.9f64, 0.95f64, 3e-4f64, 0.1f64);
        let h = crate::ops::AdamWStep {
            one_minus_beta1: (1.0 - b1) as f32,
            beta2: b2 as f32,
            one_minus_beta2: (1.0 - b2) as f32,
            bias2_sqrt: (1.0 - b2.powi(step)).sqrt() as f32,
            eps: 1e-8,
            decay: (1.0 - lr * wd) as f32,
            step_size: (lr / (1.0 - b1.powi(step))) as f32,
            grad_scale: grad_scale as f32,
        };
        let flex = Device::flex();
        let reference = crate::adamw(t(&p, &flex), t(&g, &flex), t(&m, &flex), t(&v, &flex), h, false);
        let reference = [reference.0, reference.1, reference.2].map(|x| x.into_data().try_to_vec::<f32>().unwrap());
        for dev in devices().into_iter().map(|d| d.without_autodiff()) {
            if crate::on_cube(&dev) {
                poison(&dev);
            }
            let fused = crate::adamw(t(&p, &dev), t(&g, &dev), t(&m, &dev), t(&v, &dev), h, true);
            let fused = [fused.0, fused.1, fused.2].map(|x| x.into_data().convert::<f32>().try_to_vec::<f32>().unwrap());
            for ((name, a), b) in ["p", "m", "v"].iter().zip(&fused).zip(&reference) {
                let what = format!("adamw {name} on {dev:?} (step {step}, scale {grad_scale}, seed {s})");
                if crate::on_cube(&dev) {
                    let scale = b.iter().fold(1f32, |x, y| x.max(y.abs()));
                    let e = a.iter().zip(b).fold(0f32, |x, (u, w)| x.max((u - w).abs())) / scale;
                    assert!(e <= 1e-6 && a.iter().all(|x| x.is_finite()), "{what}: error {e}");
                } else {
                    let differ = a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
                    assert_eq!(differ, 0, "{what}: {differ} of {n} differ");
                }
            }
        }
    }
}

/// The gradient norm's `Σ x²` equals the f64 sum of the values: the CPU's f64 one-pass sum
/// within f32 rounding of the result, over sizes around the chunk length and an empty tensor;
/// on CubeCL devices (f32 partial sums in a fixed order) within 1e-5, also past the sizes
/// where Burn's own sum went wrong on the software adapter (≈ 2¹⁸ elements) and in float16
/// (f32 accumulation; within 1e-3 of the f64 sum of the float16 values).
#[test]
fn sum_squares_matches_the_f64_sum() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed());
    for dev in devices().into_iter().map(|d| d.without_autodiff()) {
        let cube = crate::on_cube(&dev);
        let sizes: &[usize] =
            if cube { &[1, 7, 255, 257, 100_000, 1_000_003, 5_000_000] } else { &[0, 1, 7, 16 * 1024, 16 * 1024 + 3, 100_000] };
        for &n in sizes {
            let v = normal(n, &mut rng);
            let want: f64 = v.iter().map(|&x| x as f64 * x as f64).sum();
            let t = Tensor::<2>::from_data(TensorData::new(v.clone(), [1, n]), &dev);
            let got = crate::sum_squares(t.clone());
            let tol = if cube { 1e-5 } else { 1e-6 };
            assert!((got - want).abs() <= tol * want.max(1.0), "n {n} on {dev:?}: {got} vs {want}");
            if cube {
                let half = Tensor::<2>::from_data(TensorData::new(v.clone(), [1, n]), (&dev, DType::F16));
                let rounded: Vec<f32> = half.clone().into_data().convert::<f32>().try_to_vec().unwrap();
                let want16: f64 = rounded.iter().map(|&x| x as f64 * x as f64).sum();
                let got16 = crate::sum_squares(half);
                assert!((got16 - want16).abs() <= 1e-3 * want16.max(1.0), "n {n} float16: {got16} vs {want16}");
            } else {
                let composed: f32 = t.square().sum().into_scalar();
                assert!((got - composed as f64).abs() <= 1e-4 * want.max(1.0), "n {n}: {got} vs Burn's {composed}");
            }
        }
    }
}

/// The summed loss counts every row, also past the ≈ 2¹⁸ elements at which Burn's sums stopped
/// counting on the software adapter (Burn's plain `sum` of these per-row losses gave 59 136
/// instead of 270 640 on CI's machine, though right on another): random logits over 2 classes,
/// 300 001 rows, against the per-row losses summed in f64 on the host.
#[test]
fn cross_entropy_sum_counts_every_row() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed());
    let (rows, v) = (300_001usize, 2usize);
    let logits = normal(rows * v, &mut rng);
    let targets: Vec<i64> = (0..rows).map(|_| rng.gen_range(0..v as i64)).collect();
    let want: f64 = (0..rows)
        .map(|r| {
            let (a, b) = (logits[r * v] as f64, logits[r * v + 1] as f64);
            let m = a.max(b);
            m + ((a - m).exp() + (b - m).exp()).ln() - logits[r * v + targets[r] as usize] as f64
        })
        .sum();
    for dev in devices().into_iter().map(|d| d.without_autodiff()) {
        let x = Tensor::<3>::from_data(TensorData::new(logits.clone(), [1, rows, v]), &dev);
        let tg = Tensor::<2, Int>::from_data(TensorData::new(targets.clone(), [1, rows]), &dev);
        let got: f32 = crate::cross_entropy_sum(x, tg, true).into_scalar();
        assert!((got as f64 - want).abs() <= 1e-5 * want, "{rows} rows on {dev:?}: {got} vs {want}");
    }
}
