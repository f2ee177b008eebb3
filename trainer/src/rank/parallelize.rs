//! How the decoder (every family) is laid out on this rank's mesh (TorchTitan's `parallelize_llama`):
//! tensor parallelism first (slices driven by each parameter's logical axes, activation hooks),
//! then FSDP over the TP-local parameters. The same placement turns full tensors (checkpoints)
//! into this rank's pieces and back, computes the loss, and completes gradients and their norm.

use crate::rank::grads;
use crate::rank::params;
use crate::rank::{RankContext, RankModel};
use anyhow::Result;
use burn::module::ParamId;
use burn::optim::GradientsParams;
use burn::prelude::*;
use std::collections::BTreeMap;
use std::collections::HashSet;
use std::sync::Arc;
use titan_checkpoints::{HostTensor, TensorMap};
use titan_models::Hooks;
use titan_models::{decoder::logical_axes, LogicalAxis};
use titan_parallel::autograd::host::{self, Prim};
use titan_parallel::cp::{ContextParallelHooks, CpSpec, Rotate};
use titan_parallel::ddp::overlap::hook_gradients;
use titan_parallel::ddp::{all_reduce_gradients, BUCKET_BYTES};
use titan_parallel::ep::ExpertParallelHooks;
use titan_parallel::fsdp::{fully_shard_by, Sharding};
use titan_parallel::loss_parallel::vocab_parallel_cross_entropy_sum;
use titan_parallel::registry::with_group;
use titan_parallel::tp::{apply_tensor_parallel, slice_params, TensorParallel};
use titan_parallel::{CommExt, Communicator};

/// The dimension tensor parallelism splits: the one whose logical axis is heads, kv heads, the
/// FFN hidden units or the vocabulary (Megatron's column/row choice follows from the layout:
/// `[embed, heads]` splits columns, `[heads, embed]` rows). Norm weights (`[embed]`) replicate.
pub fn tp_split_dim(path: &str) -> Option<usize> {
    use LogicalAxis::*;
    logical_axes(path)?.iter().position(|a| matches!(a, Vocab | Heads | KvHeads | Mlp))
}

/// The dimension expert parallelism splits: the expert index of the stacked routed-expert
/// weights (the router's expert columns and the balancing bias stay whole: every rank routes).
pub fn ep_split_dim(path: &str) -> Option<usize> {
    let axes = logical_axes(path)?;
    (axes.len() == 3 && axes[0] == LogicalAxis::Experts).then_some(0)
}

/// Whether a parameter's gradient is partial per TP rank whatever sequence parallelism does:
/// a mixture-of-experts FFN's (run on this rank's tokens only), the QK-norm weights (each
/// rank applies them to its own heads) and latent attention's replicated low-rank path (read
/// by this rank's heads only).
fn tp_partial(path: &str) -> bool {
    path.contains(".moe.")
        || logical_axes(path).is_some_and(|a| a == [LogicalAxis::HeadDim] || a.contains(&LogicalAxis::Latent))
}

/// What expert parallelism did: the routed experts' split dimension (0), by parameter path.
#[derive(Debug, Clone)]
pub struct ExpertParallel {
    pub split_dims: BTreeMap<String, usize>,
}

/// The parallelisms applied to this rank's model.
#[derive(Debug, Clone, Default)]
pub struct Placement {
    pub tp: Option<TensorParallel>,
    pub ep: Option<ExpertParallel>,
    /// Context parallelism: this rank's share of every sequence.
    pub cp: Option<CpSpec>,
    pub fsdp: Option<Sharding>,
    /// Parameters split by TP (their squared gradient norms are summed over the TP group).
    tp_split: HashSet<ParamId>,
    /// Routed experts split by EP (summed over the EP group, sharded over the expert FSDP group).
    ep_split: HashSet<ParamId>,
    /// Parameters whose gradients are partial per TP rank (MoE, QK-norm).
    tp_partial: HashSet<ParamId>,
    /// Use the fused cross-entropy kernel where the device has one.
    pub fused_loss: bool,
    /// Plain DDP with overlap: every parameter's gradient hook key, by path (`ddp::overlap`).
    pub ddp_hooks: Option<BTreeMap<String, u64>>,
    /// The replicas' (and TP's partial) gradient all-reduce bucket size in bytes.
    pub bucket_bytes: usize,
}

impl Placement {
    /// Whether tensor parallelism splits the sequence too (norms and residual stream).
    pub fn sequence_parallel(&self) -> bool {
        self.tp.as_ref().is_some_and(|t| t.sequence_parallel)
    }
}

/// How the parallelisms are applied, beyond the mesh.
#[derive(Debug, Clone, Copy)]
pub struct ParallelOptions {
    /// TP splits the sequence too (norms and residual stream).
    pub sequence_parallel: bool,
    pub cp_rotate: Rotate,
    /// FSDP frees gathered parameters after forward and gathers them again in backward.
    pub reshard_after_forward: bool,
    /// Hook the parameters for DDP's overlapped all-reduce (plain DDP only: no other
    /// parallelism reduces the gradients).
    pub ddp_overlap: bool,
}

/// Applies TP, then CP (the attention hook), then EP (the routed experts), then FSDP (over
/// dp_shard × cp; the routed experts under EP over their own group), to this rank's full
/// stages (pipeline parallelism chose the stages).
pub fn parallelize_llama(mut model: RankModel, rank: &RankContext, opts: ParallelOptions) -> (RankModel, Placement) {
    let ParallelOptions { sequence_parallel, cp_rotate, reshard_after_forward, ddp_overlap } = opts;
    let mut placement = Placement { bucket_bytes: BUCKET_BYTES, ..Placement::default() };
    let plain_ddp = rank.replicate.is_some()
        && [&rank.fsdp, &rank.efsdp, &rank.tp, &rank.cp, &rank.ep].iter().all(|g| g.is_none())
        && rank.pp.is_none();
    if ddp_overlap && plain_ddp {
        let (m, keys) = hook_gradients(model);
        model = m;
        placement.ddp_hooks = Some(keys);
    }
    if let Some(g) = &rank.tp {
        let (m, tp, hooks) = apply_tensor_parallel(model, g, sequence_parallel, tp_split_dim);
        model = RankModel { chunks: m.chunks.into_iter().map(|c| c.with_hooks(hooks.clone())).collect() };
        placement.tp_split = params::param_ids(&model)
            .into_iter()
            .filter(|(_, p)| tp.split_dims.contains_key(p))
            .map(|(id, _)| id)
            .collect();
        placement.tp = Some(tp);
    }
    if let Some(g) = &rank.cp {
        let spec = CpSpec::new(g, cp_rotate);
        model = RankModel {
            chunks: model
                .chunks
                .into_iter()
                .map(|c| {
                    let hooks = ContextParallelHooks { inner: c.hooks.clone(), spec };
                    c.with_hooks(Hooks(Some(Arc::new(hooks))))
                })
                .collect(),
        };
        placement.cp = Some(spec);
    }
    let ids = |model: &RankModel, keep: &dyn Fn(&str) -> bool| -> HashSet<ParamId> {
        params::param_ids(model).into_iter().filter(|(_, p)| keep(p)).map(|(id, _)| id).collect()
    };
    placement.tp_partial = ids(&model, &tp_partial);
    if let Some(g) = &rank.ep {
        let (m, split_dims) = slice_params(model, g, ep_split_dim);
        let wrap = |c: titan_models::Transformer| {
            let hooks = ExpertParallelHooks { inner: c.hooks.clone(), group: g.clone() };
            c.with_hooks(Hooks(Some(Arc::new(hooks))))
        };
        model = RankModel { chunks: m.chunks.into_iter().map(wrap).collect() };
        placement.ep_split = ids(&model, &|p| split_dims.contains_key(p));
        placement.ep = Some(ExpertParallel { split_dims });
    }
    if rank.fsdp.is_some() || rank.efsdp.is_some() {
        let ep = rank.ep.is_some();
        let (m, s) = fully_shard_by(model, reshard_after_forward, |path| {
            if titan_models::moe::is_balancing_bias(path) {
                None
            } else if ep && ep_split_dim(path).is_some() {
                rank.efsdp.clone()
            } else {
                rank.fsdp.clone()
            }
        });
        model = m;
        placement.fsdp = Some(s);
    }
    (model, placement)
}

/// The parameter path of a tensor key: itself for the model, `exp_avg.<path>` (or another
/// optimizer-state prefix) for the optimizer.
pub fn param_path(key: &str) -> &str {
    crate::optim::split_state_key(key).1
}

impl Placement {
    /// Summed cross-entropy of this rank's logits (vocabulary-parallel under TP).
    pub fn loss(&self, logits: Tensor<3>, targets: Tensor<2, Int>) -> Tensor<1> {
        match &self.tp {
            Some(tp) => vocab_parallel_cross_entropy_sum(logits, targets, &tp.group),
            None => titan_kernels::cross_entropy_sum(logits, targets, self.fused_loss),
        }
    }

    /// Completes gradients after backward (FSDP's were reduce-scattered inside it): under
    /// sequence parallelism the replicated (norm) gradients are partial per TP rank and are
    /// summed; then replicas sum all of theirs.
    /// `done`: parameters whose replica all-reduce already ran (DDP's overlap).
    pub fn reduce_gradients(
        &self,
        model: &RankModel,
        acc: &mut GradientsParams,
        rank: &RankContext,
        done: &HashSet<ParamId>,
    ) -> Result<()> {
        if let Some(tp) = &self.tp {
            if tp.replicated_grads_are_partial() || !self.tp_partial.is_empty() {
                let partial = |id| self.partial_over_tp(id);
                with_group(tp.group.id(), |c| all_reduce_gradients(model, acc, c, self.bucket_bytes, &partial))?;
            }
        }
        if let Some(replicate) = &rank.replicate {
            all_reduce_gradients(model, acc, replicate.as_ref(), self.bucket_bytes, &|id| !done.contains(&id))?;
        }
        Ok(())
    }

    /// Whether parameter `id`'s gradient is partial per TP rank (summed over TP before the
    /// replicas): what saw only this rank's positions or heads — replicated parameters under
    /// sequence parallelism, MoE and QK-norm parameters always — except the EP-split experts
    /// (their dispatch already brought every rank's tokens).
    pub fn partial_over_tp(&self, id: ParamId) -> bool {
        let Some(tp) = &self.tp else { return false };
        !self.tp_split.contains(&id)
            && !self.ep_split.contains(&id)
            && (tp.replicated_grads_are_partial() || self.tp_partial.contains(&id))
    }

    /// The norm of the whole gradient, every parameter counted once: TP-split parameters' squares
    /// are summed over the TP group (replicated ones are equal there), then FSDP shards' over the
    /// shard group (padding is zero), then the pipeline stages'; replicas are not summed.
    pub fn grad_norm(&self, model: &RankModel, acc: &GradientsParams, rank: &RankContext) -> Result<f64> {
        let (mut split, mut replicated, mut experts) = (0.0f64, 0.0f64, 0.0f64);
        for (id, sq) in grads::squared_norms(model, acc) {
            if self.tp_split.contains(&id) {
                split += sq;
            } else if self.ep_split.contains(&id) {
                experts += sq;
            } else {
                replicated += sq;
            }
        }
        if let Some(tp) = &self.tp {
            split = with_group(tp.group.id(), |c| sum_over(c, split))?;
        }
        let mut total = split + replicated;
        if let Some(g) = &rank.fsdp {
            total = with_group(g.id(), |c| sum_over(c, total))?;
        }
        // EP-split experts: their slices over the EP group, their shards over the expert FSDP group.
        if let Some(g) = &rank.ep {
            experts = with_group(g.id(), |c| sum_over(c, experts))?;
            if let Some(e) = &rank.efsdp {
                experts = with_group(e.id(), |c| sum_over(c, experts))?;
            }
            total += experts;
        }
        if let Some(pp) = &rank.pp {
            total = sum_over(pp.as_ref(), total)?;
        }
        Ok(total.sqrt())
    }

    /// Full tensors from this rank's pieces (collectives over the shard and TP groups, in key
    /// order on every rank): FSDP shards are gathered first, then TP slices along their dim.
    /// The previous (gathered) checkpoint save, kept as `bench checkpoint`'s baseline.
    pub fn gather_full(&self, mut map: TensorMap, rank: &RankContext) -> Result<TensorMap> {
        if self.ep.is_some() {
            anyhow::bail!("gathering the whole model on one rank is not implemented under expert parallelism; the sharded checkpoint save handles it");
        }
        if let (Some(s), Some(g)) = (&self.fsdp, &rank.fsdp) {
            map = with_group(g.id(), |c| params::unshard(map, s, c, param_path))?;
        }
        if let Some(tp) = &self.tp {
            map = with_group(tp.group.id(), |c| {
                map.into_iter()
                    .map(|(k, t)| match tp.split_dims.get(param_path(&k)) {
                        Some(&dim) => {
                            let (data, shape) = host::run(Prim::AllGather, t.data, &t.shape, dim, c);
                            (k, HostTensor { shape, data })
                        }
                        None => (k, t),
                    })
                    .collect()
            });
        }
        Ok(map)
    }
}

/// `x` summed over `c` (each rank's value gathered, summed in rank order in f64).
fn sum_over(c: &dyn Communicator, x: f64) -> Result<f64> {
    let mut parts = vec![0f32; c.size()];
    c.all_gather(&[x as f32], &mut parts)?;
    Ok(parts.iter().map(|&p| p as f64).sum())
}

#[cfg(test)]
mod tests;
