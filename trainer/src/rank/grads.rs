//! Gradients across microbatches: accumulation, squared norms, the clipping coefficient.

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::prelude::*;

/// Adds `new` into `acc`, parameter by parameter.
pub fn accumulate<M: Module>(model: &M, acc: &mut GradientsParams, mut new: GradientsParams) {
    struct Add<'a> {
        acc: &'a mut GradientsParams,
        new: &'a mut GradientsParams,
    }
    impl ModuleVisitor for Add<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            if let Some(g) = self.new.remove::<D>(p.id) {
                let sum = match self.acc.remove::<D>(p.id) {
                    Some(a) => a + g,
                    None => g,
                };
                self.acc.register::<D>(p.id, sum);
            }
        }
    }
    model.visit(&mut Add { acc, new: &mut new });
}

/// Squared L2 norm of every gradient, by parameter, in the model's parameter order (f64 sums on
/// the host on the CPU, deterministic and exact enough for clipping; on GPU devices summed there
/// and read back together, one small transfer per step).
pub fn squared_norms<M: Module>(model: &M, grads: &GradientsParams) -> Vec<(ParamId, f64)> {
    struct Sq<'a> {
        grads: &'a GradientsParams,
        ids: Vec<ParamId>,
        sums: Vec<titan_kernels::SumSquares>,
    }
    impl ModuleVisitor for Sq<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            if let Some(g) = self.grads.get::<D>(p.id) {
                self.ids.push(p.id);
                self.sums.push(titan_kernels::start_sum_squares(g));
            }
        }
    }
    let mut v = Sq { grads, ids: Vec::new(), sums: Vec::new() };
    model.visit(&mut v);
    v.ids.into_iter().zip(titan_kernels::resolve_sum_squares(v.sums)).collect()
}

/// A hash of every gradient's bits, in the model's parameter order (the silent-data-corruption
/// check compares it); `flip`: one bit of the first gradient flipped first (fault injection).
pub fn hash<M: Module>(model: &M, grads: &GradientsParams, flip: bool) -> u64 {
    use std::hash::Hasher;
    struct Bits<'a> {
        grads: &'a GradientsParams,
        hasher: std::collections::hash_map::DefaultHasher,
        flip: bool,
    }
    impl ModuleVisitor for Bits<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            let Some(g) = self.grads.get::<D>(p.id) else { return };
            let data = g.into_data().convert::<f32>();
            let mut bits: Vec<u32> = data.as_slice::<f32>().expect("f32 gradient").iter().map(|x| x.to_bits()).collect();
            if std::mem::take(&mut self.flip) {
                bits[0] ^= 1;
            }
            self.hasher.write_usize(bits.len());
            bits.iter().for_each(|&b| self.hasher.write_u32(b));
        }
    }
    let mut v = Bits { grads, hasher: Default::default(), flip };
    model.visit(&mut v);
    v.hasher.finish()
}

/// The factor that scales the gradient to `max_norm` (1 when within it or clipping is off),
/// as `torch.nn.utils.clip_grads_with_norm_`.
pub fn clip_coefficient(norm: f64, max_norm: f64) -> f64 {
    if max_norm <= 0.0 {
        return 1.0;
    }
    (max_norm / (norm + 1e-6)).min(1.0)
}
