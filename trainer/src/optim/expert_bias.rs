//! Auxiliary-loss-free load balancing (DeepSeek-V3; TorchTitan runs it as an optimizer
//! pre-hook): after each step, every MoE layer's tokens per expert are summed over all the
//! ranks that routed that layer's tokens (data, context and tensor parallel), and the layer's
//! expert bias moves by `load_balance_coeff · sign(mean − load)`. The same sums on every rank
//! give the same bias everywhere. Also the load metrics: max / mean tokens per expert and the
//! sequence-wise balance loss.

use crate::rank::params;
use crate::rank::{RankContext, RankModel};
use anyhow::Result;
use burn::prelude::*;
use titan_checkpoints::{HostTensor, TensorMap};
use titan_models::moe::{bias_update, imbalance};
use titan_parallel::registry::with_group;
use titan_parallel::{CommExt, ReduceOp};

/// One MoE layer's load in the step just taken (the whole job's tokens).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ExpertLoad {
    /// The global layer index.
    pub layer: usize,
    /// max / mean tokens per expert (1 = balanced).
    pub imbalance: f64,
    pub tokens: Vec<u64>,
    /// The layer's sequence-wise balance loss in the objective (0 when off).
    pub aux_loss: f64,
}

/// Takes the step's expert loads, sums them over the ranks routing the same layers, moves the
/// balancing biases, and returns the loads (empty for a dense model).
pub fn balance(model: RankModel, rank: &RankContext, device: &Device) -> Result<(RankModel, Vec<ExpertLoad>)> {
    let mut layers = Vec::new();
    // A pipeline stage without MoE layers still joins the stages' exchange below.
    let any_moe = model.chunks.iter().any(|c| c.moe_enabled);
    for (c, chunk) in model.chunks.iter().enumerate() {
        for (layer, moe) in chunk.moe_layers() {
            let mut load = moe.take_load();
            load.tokens.resize(moe.cfg.num_experts, 0);
            let local = layer - chunk.first_layer;
            let path = format!("chunks.{c}.layers.{local}.moe.expert_bias");
            layers.push((layer, path, moe.cfg.load_balance_coeff, moe.expert_bias.val(), load));
        }
    }
    if !any_moe {
        return Ok((model, Vec::new()));
    }
    // One vector of every layer's counts, summed over tp, cp and dp (exact in f32 below 2^24
    // tokens per expert and step).
    let mut all: Vec<f32> =
        layers.iter().flat_map(|l| l.4.tokens.iter().map(|&c| c as f32).chain([l.4.aux_loss as f32])).collect();
    for g in [&rank.tp, &rank.cp].into_iter().flatten() {
        with_group(g.id(), |c| c.all_reduce(&mut all, ReduceOp::Sum))?;
    }
    if let Some(dp) = &rank.dp {
        dp.all_reduce(&mut all, ReduceOp::Sum)?;
    }
    let mut biases = TensorMap::new();
    let mut out = Vec::new();
    let mut at = 0;
    for (layer, path, coeff, bias, local) in layers {
        let n = local.tokens.len();
        let tokens: Vec<u64> = all[at..at + n].iter().map(|&c| c as u64).collect();
        let aux_loss = all[at + n] as f64;
        at += n + 1;
        if coeff > 0.0 {
            let current = titan_kernels::transfer::to_host_f32(bias);
            let shape = vec![current.len()];
            biases.insert(path, HostTensor { shape, data: bias_update(&current, &tokens, coeff) });
        }
        out.push(ExpertLoad { layer, imbalance: imbalance(&tokens), tokens, aux_loss });
    }
    // Every stage's layers on every rank (the logging rank reports them all).
    if let Some(pp) = &rank.pp {
        let mine = serde_json::to_vec(&out)?;
        out = Vec::new();
        for part in pp.all_gather_varlen(&mine)? {
            out.extend(serde_json::from_slice::<Vec<ExpertLoad>>(&part)?);
        }
        out.sort_by_key(|l| l.layer);
    }
    Ok((params::set_some_tensors(model, biases, device), out))
}
