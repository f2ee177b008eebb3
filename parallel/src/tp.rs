//! Tensor parallelism (Megatron-LM; TorchTitan's `apply_tp`), with sequence parallelism.
//!
//! Applied from outside the model in two parts:
//! * parameters: every parameter with a dimension that may be split over the TP group (the
//!   caller says which, from the parameter's logical axes) keeps only this rank's slice —
//!   wq/wk/wv, w1/w3 and the output head by columns (heads, hidden units, vocabulary), wo and w2
//!   by rows, the token embedding by vocabulary rows; norm weights are replicated;
//! * activations: [`TensorParallelHooks`] at the model's hook points. Column-parallel inputs are
//!   Megatron's f (identity, gradient all-reduced) or, with sequence parallelism, an all-gather
//!   along the sequence (gradient reduce-scattered); row-parallel outputs are g (all-reduce) or
//!   a reduce-scatter along the sequence (gradient all-gathered). The embedding is a masked
//!   lookup in this rank's vocabulary rows followed by the same reduction.
//!
//! With sequence parallelism the residual stream and the norms between blocks hold `T / tp`
//! positions per rank, so a norm weight's gradient is partial on each rank and must be summed over
//! the TP group ([`TensorParallel::replicated_grads_are_partial`]).

use crate::autograd::{
    all_gather_to_group, copy_to_group, gather_from_group, reduce_from_group, reduce_scatter_to_group, split_to_group,
};
use crate::registry::GroupHandle;
use burn::module::{Module, ModuleMapper, Param};
use burn::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use titan_models::{ActivationHooks, Hooks};

/// The activation side of tensor parallelism.
#[derive(Debug)]
pub struct TensorParallelHooks {
    pub group: GroupHandle,
    pub sequence_parallel: bool,
}

impl ActivationHooks for TensorParallelHooks {
    fn embed(&self, weight: Tensor<2>, ids: Tensor<2, Int>) -> Tensor<3> {
        let rows = weight.dims()[0];
        let local = ids.sub_scalar((self.group.rank() * rows) as i64);
        let mine = local.clone().greater_equal_elem(0).bool_and(local.clone().lower_elem(rows as i64));
        let idx = local.mask_fill(mine.clone().bool_not(), 0);
        let partial = burn::tensor::module::embedding(weight, idx) * mine.float().unsqueeze_dim::<3>(2);
        self.row_output(partial)
    }

    fn column_input(&self, x: Tensor<3>) -> Tensor<3> {
        if self.sequence_parallel {
            all_gather_to_group(x, 1, &self.group)
        } else {
            copy_to_group(x, &self.group)
        }
    }

    fn row_output(&self, y: Tensor<3>) -> Tensor<3> {
        if self.sequence_parallel {
            reduce_scatter_to_group(y, 1, &self.group)
        } else {
            reduce_from_group(y, &self.group)
        }
    }

    /// A mixture-of-experts FFN is not split by TP: each rank routes its own positions
    /// (TorchTitan's token split) — already so under sequence parallelism, else a split of the
    /// replicated stream, gathered again after the layer.
    fn moe_input(&self, x: Tensor<3>) -> Tensor<3> {
        if self.sequence_parallel {
            x
        } else {
            split_to_group(x, 1, &self.group)
        }
    }

    fn moe_output(&self, y: Tensor<3>) -> Tensor<3> {
        if self.sequence_parallel {
            y
        } else {
            gather_from_group(y, 1, &self.group)
        }
    }
}

/// What tensor parallelism did to a model: the split dimension of every split parameter.
#[derive(Debug, Clone)]
pub struct TensorParallel {
    pub group: GroupHandle,
    pub sequence_parallel: bool,
    /// Parameter path → the dimension split over the group (absent: replicated).
    pub split_dims: BTreeMap<String, usize>,
}

impl TensorParallel {
    /// Whether replicated parameters' gradients differ per rank and must be summed over the TP
    /// group (sequence parallelism: each rank's norms saw only its positions).
    pub fn replicated_grads_are_partial(&self) -> bool {
        self.sequence_parallel
    }
}

/// Splits the parameters of `model` over `group` (`split_dim(path)`: the dimension to split,
/// `None` to replicate) and installs the activation hooks with `install`.
pub fn apply_tensor_parallel<M: Module>(
    model: M,
    group: &GroupHandle,
    sequence_parallel: bool,
    split_dim: impl Fn(&str) -> Option<usize>,
) -> (M, TensorParallel, Hooks) {
    let (model, split_dims) = slice_params(model, group, split_dim);
    let hooks = Hooks(Some(Arc::new(TensorParallelHooks { group: group.clone(), sequence_parallel })));
    (model, TensorParallel { group: group.clone(), sequence_parallel, split_dims }, hooks)
}

/// Keeps this rank's slice of every parameter `split_dim(path)` names a dimension for (rank `r`
/// of the group holds chunk `r`); returns the split dimension of each split parameter. Tensor
/// parallelism slices heads, hidden units and vocabulary; expert parallelism the experts.
pub fn slice_params<M: Module>(
    model: M,
    group: &GroupHandle,
    split_dim: impl Fn(&str) -> Option<usize>,
) -> (M, BTreeMap<String, usize>) {
    let mut split_dims = BTreeMap::new();
    let mut m = Slice { path: Vec::new(), split_dim, rank: group.rank(), size: group.size(), out: &mut split_dims };
    let model = model.map(&mut m);
    (model, split_dims)
}

struct Slice<'a, F> {
    path: Vec<String>,
    split_dim: F,
    rank: usize,
    size: usize,
    out: &'a mut BTreeMap<String, usize>,
}

impl<F: Fn(&str) -> Option<usize>> ModuleMapper for Slice<'_, F> {
    titan_models::track_module_path!();
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let path = self.path.join(".");
        let Some(dim) = (self.split_dim)(&path) else { return param };
        let n = param.lazy_shape()[dim];
        assert!(n % self.size == 0, "{path}: dimension {dim} ({n}) does not split over {} ranks", self.size);
        self.out.insert(path, dim);
        let (rank, chunk) = (self.rank, n / self.size);
        param.map(|full| crate::fsdp::leaf(full.narrow(dim, rank * chunk, chunk)))
    }
}
