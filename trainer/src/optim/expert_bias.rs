//! Auxiliary-loss-free load balancing (DeepSeek-V3; TorchTitan runs it as an optimizer
//! pre-hook): after each step, every MoE layer's tokens per expert are summed over all the
//! ranks that routed that layer's tokens (data, context and tensor parallel), and the layer's
//! expert bias moves by `load_balance_coeff · sign(mean − load)`. The same sums on every rank
//! give the same bias everywhere. Also the load metric: max / mean tokens per expert.

use crate::rank::{RankContext, RankModel};
use crate::state;
use anyhow::Result;
use burn::prelude::*;
use titan_checkpoints::{HostTensor, TensorMap};
use titan_models::moe::{bias_update, imbalance};
use titan_parallel::registry::with_group;
use titan_parallel::{CommExt, ReduceOp};

/// One MoE layer's load in the step just taken (the whole job's tokens).
#[derive(Debug, Clone, serde::Serialize)]
pub struct ExpertLoad {
    /// The global layer index.
    pub layer: usize,
    /// max / mean tokens per expert (1 = balanced).
    pub imbalance: f64,
    pub tokens: Vec<u64>,
}

/// Takes the step's expert loads, sums them over the ranks routing the same layers, moves the
/// balancing biases, and returns the loads (empty for a dense model).
pub fn balance(model: RankModel, rank: &RankContext, device: &Device) -> Result<(RankModel, Vec<ExpertLoad>)> {
    let mut layers = Vec::new();
    for (c, chunk) in model.chunks.iter().enumerate() {
        for (layer, moe) in chunk.moe_layers() {
            let mut load = moe.take_load();
            load.resize(moe.cfg.num_experts, 0);
            let local = layer - chunk.first_layer;
            let path = format!("chunks.{c}.layers.{local}.moe.expert_bias");
            layers.push((layer, path, moe.cfg.load_balance_coeff, moe.expert_bias.val(), load));
        }
    }
    if layers.is_empty() {
        return Ok((model, Vec::new()));
    }
    // One vector of every layer's counts, summed over tp, cp and dp (exact in f32 below 2^24
    // tokens per expert and step).
    let mut all: Vec<f32> = layers.iter().flat_map(|l| l.4.iter().map(|&c| c as f32)).collect();
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
        let tokens: Vec<u64> = all[at..at + local.len()].iter().map(|&c| c as u64).collect();
        at += local.len();
        if coeff > 0.0 {
            let current = bias.into_data().convert::<f32>().try_into_vec::<f32>().expect("f32 bias");
            let shape = vec![current.len()];
            biases.insert(path, HostTensor { shape, data: bias_update(&current, &tokens, coeff) });
        }
        out.push(ExpertLoad { layer, imbalance: imbalance(&tokens), tokens });
    }
    Ok((state::set_some_tensors(model, biases, device), out))
}
