//! `DeepseekV3ForCausalLM` in and out. Llama's names ([`crate::llama3::hf`]) for the embedding,
//! norms, dense FFNs and head, and:
//!
//! | titan-rs | Hugging Face | |
//! |---|---|---|
//! | `layers.N.mla.wq` / `wq_a`, `q_a_norm`, `wq_b` | `model.layers.N.self_attn.q_proj` / `q_a_proj`, `q_a_layernorm`, `q_b_proj` | transposed¹ |
//! | `layers.N.mla.wkv_a`, `kv_a_norm`, `wkv_b`, `wo` | `…self_attn.kv_a_proj_with_mqa`, `kv_a_layernorm`, `kv_b_proj`, `o_proj` | transposed¹ |
//! | `layers.N.moe.router.gate.weight` | `model.layers.N.mlp.gate.weight` | transposed |
//! | `layers.N.moe.expert_bias` | `model.layers.N.mlp.gate.e_score_correction_bias` | |
//! | `layers.N.moe.experts.{w1,w3,w2}` | `model.layers.N.mlp.experts.{e}.{gate,up,down}_proj.weight` | one per expert, transposed |
//! | `layers.N.moe.shared_experts.{w1,w3,w2}.weight` | `model.layers.N.mlp.shared_experts.{gate,up,down}_proj.weight` | transposed |
//!
//! ¹ With `rope_interleave` (DeepSeek's checkpoints), the RoPE outputs of `q_proj` / `q_b_proj`
//! (per head) and `kv_a_proj_with_mqa` hold rotation pairs side by side; titan-rs rotates halves,
//! so those rows are de-interleaved when read and interleaved again when written (the attention
//! scores do not change: queries and keys are permuted alike). Multi-token-prediction layers
//! (`num_nextn_predict_layers`) are not read (as transformers) nor written.

use crate::args::{MlaArgs, ModelArgs, MoeArgs, ScoreFunc};
use crate::hf_config::{count, count_or, decoder_args, decoder_config, flag, index_or, num, refuse_flag, Config};
use crate::llama3::hf::{block_key, dense_tensor};
use crate::registry::HfTensor;
use crate::rope::RopeScaling;
use serde_json::Value;

/// Titan-rs output index → HF output index for `blocks` blocks of `block` outputs whose `rope`
/// outputs from `offset` on are interleaved in HF.
fn deinterleave(blocks: usize, block: usize, offset: usize, rope: usize) -> Vec<usize> {
    let mut perm: Vec<usize> = (0..blocks * block).collect();
    for b in 0..blocks {
        for j in 0..rope {
            let from = if j < rope / 2 { 2 * j } else { 2 * (j - rope / 2) + 1 };
            perm[b * block + offset + j] = b * block + offset + from;
        }
    }
    perm
}

pub fn hf_tensor(args: &ModelArgs, key: &str) -> Option<HfTensor> {
    let (n, tail) = block_key(key).unwrap_or((0, ""));
    let one =
        |name: &str, transposed: bool| Some(HfTensor::One { name: format!("model.layers.{n}.{name}"), transposed });
    let m = args.mla.as_ref()?;
    let roped = |name: &str, blocks: usize, block: usize, offset: usize| {
        let name = format!("model.layers.{n}.self_attn.{name}.weight");
        let perm = deinterleave(blocks, block, offset, m.qk_rope_head_dim);
        Some(HfTensor::Permuted { name, perm })
    };
    let (h, qk) = (args.n_heads, m.qk_head_dim());
    let experts = |proj: &str| {
        let e = args.moe.as_ref()?.num_experts;
        Some(HfTensor::PerExpert {
            names: (0..e).map(|e| format!("model.layers.{n}.mlp.experts.{e}.{proj}.weight")).collect(),
        })
    };
    match tail {
        "mla.wq.weight" => roped("q_proj", h, qk, m.qk_nope_head_dim),
        "mla.wq_a.weight" => one("self_attn.q_a_proj.weight", true),
        "mla.q_a_norm.weight" => one("self_attn.q_a_layernorm.weight", false),
        "mla.wq_b.weight" => roped("q_b_proj", h, qk, m.qk_nope_head_dim),
        "mla.wkv_a.weight" => roped("kv_a_proj_with_mqa", 1, m.kv_lora_rank + m.qk_rope_head_dim, m.kv_lora_rank),
        "mla.kv_a_norm.weight" => one("self_attn.kv_a_layernorm.weight", false),
        "mla.wkv_b.weight" => one("self_attn.kv_b_proj.weight", true),
        "mla.wo.weight" => one("self_attn.o_proj.weight", true),
        "moe.router.gate.weight" => one("mlp.gate.weight", true),
        "moe.expert_bias" => one("mlp.gate.e_score_correction_bias", false),
        "moe.experts.w1" => experts("gate_proj"),
        "moe.experts.w3" => experts("up_proj"),
        "moe.experts.w2" => experts("down_proj"),
        "moe.shared_experts.w1.weight" => one("mlp.shared_experts.gate_proj.weight", true),
        "moe.shared_experts.w3.weight" => one("mlp.shared_experts.up_proj.weight", true),
        "moe.shared_experts.w2.weight" => one("mlp.shared_experts.down_proj.weight", true),
        _ => dense_tensor(key),
    }
}

/// DeepSeek-V3's HF layout: sigmoid routing with normalised weights.
pub fn exportable(args: &ModelArgs) -> Result<(), String> {
    match &args.moe {
        Some(m) if m.score_func == ScoreFunc::Sigmoid && m.route_norm && args.mla.is_some() => Ok(()),
        _ => Err("DeepseekV3ForCausalLM routes by sigmoid scores, normalised, with latent attention; this model has other settings (the 16B flavor's softmax router is DeepSeek-V2's)".into()),
    }
}

pub fn from_hf_config(c: &Config) -> Result<ModelArgs, String> {
    refuse_flag(c, "attention_bias", "titan-rs's latent attention has no biases")?;
    let mut a = decoder_args(c, super::NAME)?;
    if a.n_kv_heads != a.n_heads {
        return Err(format!(
            "`num_key_value_heads` = {} must equal `num_attention_heads` = {} (latent attention)",
            a.n_kv_heads, a.n_heads
        ));
    }
    let rope = count(c, "qk_rope_head_dim")?;
    let q_lora_rank = match num(c, "q_lora_rank")? {
        None => 0,
        Some(_) => count(c, "q_lora_rank")?,
    };
    // transformers folds YaRN's `mscale_all_dim` into the softmax scale (mscale²).
    let softmax_scale = match (&a.rope_scaling, rope_field(c, "mscale_all_dim")?) {
        (Some(RopeScaling::Yarn { factor, .. }), Some(all)) if all != 0.0 => {
            let m = RopeScaling::yarn_mscale(*factor, all);
            m * m
        }
        _ => 1.0,
    };
    a.head_dim = rope;
    a.mla = Some(MlaArgs {
        q_lora_rank,
        kv_lora_rank: count(c, "kv_lora_rank")?,
        qk_nope_head_dim: count(c, "qk_nope_head_dim")?,
        qk_rope_head_dim: rope,
        v_head_dim: count(c, "v_head_dim")?,
        softmax_scale,
    });
    if c.get("rope_interleave").and_then(Value::as_bool) == Some(false) {
        return Err("`rope_interleave` = false is not supported; titan-rs reads DeepSeek's interleaved RoPE weights (the default)".into());
    }
    let experts = match num(c, "n_routed_experts")? {
        Some(_) => count(c, "n_routed_experts")?,
        None => count(c, "num_local_experts")?,
    };
    let n_group = count_or(c, "n_group", 1)?;
    Ok(a.with_moe(MoeArgs {
        num_experts: experts,
        top_k: count(c, "num_experts_per_tok")?,
        n_group,
        topk_group: count_or(c, "topk_group", n_group)?,
        hidden_dim: count(c, "moe_intermediate_size")?,
        num_shared_experts: num(c, "n_shared_experts")?.map_or(Ok(0), |_| count(c, "n_shared_experts"))?,
        n_dense_layers: index_or(c, "first_k_dense_replace", 0)?,
        score_func: ScoreFunc::Sigmoid,
        route_norm: flag(c, "norm_topk_prob"),
        route_scale: num(c, "routed_scaling_factor")?.unwrap_or(1.0),
        load_balance_coeff: 1e-3,
        aux_loss_alpha: 0.0,
    }))
}

/// A field of the rope parameters in either config shape.
fn rope_field(c: &Config, key: &str) -> Result<Option<f64>, String> {
    let rope = c.get("rope_parameters").or_else(|| c.get("rope_scaling")).and_then(Value::as_object);
    rope.map_or(Ok(None), |r| num(r, key))
}

pub fn to_hf_config(a: &ModelArgs, max_position_embeddings: usize, dtype: &str) -> Value {
    let mut v = decoder_config(a, "DeepseekV3ForCausalLM", "deepseek_v3", max_position_embeddings, dtype);
    if let Some(m) = &a.mla {
        v["q_lora_rank"] = if m.q_lora_rank == 0 { Value::Null } else { m.q_lora_rank.into() };
        v["kv_lora_rank"] = m.kv_lora_rank.into();
        v["qk_nope_head_dim"] = m.qk_nope_head_dim.into();
        v["qk_rope_head_dim"] = m.qk_rope_head_dim.into();
        v["v_head_dim"] = m.v_head_dim.into();
        v["rope_interleave"] = true.into();
        if m.softmax_scale != 1.0 {
            // mscale² = softmax_scale, as transformers derives it from `mscale_all_dim`.
            if let Some(RopeScaling::Yarn { factor, .. }) = a.rope_scaling {
                let mscale_all_dim = (m.softmax_scale.sqrt() - 1.0) / (0.1 * factor.ln());
                for key in ["rope_parameters", "rope_scaling"] {
                    v[key]["mscale_all_dim"] = mscale_all_dim.into();
                    v[key]["mscale"] = mscale_all_dim.into();
                }
            }
        }
    }
    if let Some(m) = &a.moe {
        v["n_routed_experts"] = m.num_experts.into();
        v["num_experts_per_tok"] = m.top_k.into();
        v["n_group"] = m.n_group.into();
        v["topk_group"] = m.topk_group.into();
        v["moe_intermediate_size"] = m.hidden_dim.into();
        v["n_shared_experts"] = m.num_shared_experts.into();
        v["first_k_dense_replace"] = m.n_dense_layers.into();
        v["norm_topk_prob"] = m.route_norm.into();
        v["routed_scaling_factor"] = m.route_scale.into();
    }
    v["num_nextn_predict_layers"] = 0.into();
    v
}
