//! Deterministic, order-independent parameter initialisation.
//!
//! Every parameter is drawn from its own ChaCha stream seeded by `(seed, module path)`, so the
//! values do not depend on construction order, on which parameters a rank materialises, or on
//! the device. Parameters are created lazily: building the 405B flavor allocates nothing until a
//! value is read.

use burn::module::{Param, ParamId};
use burn::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;

/// How a parameter's values are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// Normal(0, std²) truncated at ±3·std (re-drawn outside).
    TruncNormal { std: f64 },
    /// Normal(0, std²), untruncated (token embedding, as TorchTitan).
    Normal { std: f64 },
    /// All ones (norm weights).
    Ones,
}

/// 64-bit FNV-1a of a string: stable across platforms and Rust versions.
pub fn stable_hash(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.as_bytes() {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The parameter id for a module path: the same on every rank and every restart.
pub fn param_id(path: &str) -> ParamId {
    ParamId::from(stable_hash(path))
}

/// Draws the values of one parameter on the host.
pub fn init_values(seed: u64, path: &str, numel: usize, init: Init) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ stable_hash(path));
    match init {
        Init::Ones => vec![1.0; numel],
        Init::Normal { std } => (0..numel).map(|_| (rng.sample::<f64, _>(StandardNormal) * std) as f32).collect(),
        Init::TruncNormal { std } => (0..numel)
            .map(|_| loop {
                let z: f64 = rng.sample(StandardNormal);
                if z.abs() <= 3.0 {
                    break (z * std) as f32;
                }
            })
            .collect(),
    }
}

/// A lazily initialised, trainable parameter named by `path`.
pub fn lazy_param<const D: usize>(
    seed: u64,
    path: &str,
    shape: [usize; D],
    init: Init,
    device: &Device,
) -> Param<Tensor<D>> {
    let owned = path.to_string();
    Param::uninitialized(
        param_id(path),
        move |device: &Device, require_grad: bool| {
            let numel = shape.iter().product();
            let data = TensorData::new(init_values(seed, &owned, numel, init), shape);
            let t = Tensor::<D>::from_data(data, device);
            if require_grad {
                t.require_grad()
            } else {
                t
            }
        },
        device.clone(),
        true,
        Shape::from(shape.to_vec()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_depend_on_seed_and_path_only() {
        let a = init_values(7, "layers.0.attention.wq.weight", 1000, Init::TruncNormal { std: 0.02 });
        let b = init_values(7, "layers.0.attention.wq.weight", 1000, Init::TruncNormal { std: 0.02 });
        let c = init_values(7, "layers.1.attention.wq.weight", 1000, Init::TruncNormal { std: 0.02 });
        let d = init_values(8, "layers.0.attention.wq.weight", 1000, Init::TruncNormal { std: 0.02 });
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
        assert!(a.iter().all(|x| x.abs() <= 0.06 + 1e-7));
        let mean: f64 = a.iter().map(|&x| x as f64).sum::<f64>() / 1000.0;
        let var: f64 = a.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / 1000.0;
        assert!((var.sqrt() - 0.02).abs() < 0.002, "std {}", var.sqrt());
    }
}
