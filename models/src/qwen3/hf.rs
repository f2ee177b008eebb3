//! `Qwen3ForCausalLM` and `Qwen3MoeForCausalLM` in and out. The names are Llama's
//! ([`crate::llama3::hf`]) plus:
//!
//! | titan-rs | Hugging Face | |
//! |---|---|---|
//! | `layers.N.attention.{q,k}_norm.weight` | `model.layers.N.self_attn.{q,k}_norm.weight` | |
//! | `layers.N.moe.router.gate.weight` | `model.layers.N.mlp.gate.weight` | transposed |
//! | `layers.N.moe.experts.{w1,w3,w2}` `[E, ·, ·]` | `model.layers.N.mlp.experts.{e}.{gate,up,down}_proj.weight` | one per expert, transposed |
//! | `layers.N.moe.expert_bias` | — (zeros in, must be zero out) | |
//!
//! `config.json`: `head_dim`, `num_experts` (the Hub) or `num_local_experts` (as transformers 5
//! writes it), `num_experts_per_tok`, `moe_intermediate_size`, `norm_topk_prob`,
//! `mlp_only_layers` (a prefix: the first dense layers), `decoder_sparse_step` (1). Sliding-window
//! layers and biases are errors naming the field. `router_aux_loss_coef` is Qwen3's training
//! loss, not the model: it is read by nothing and written as 0.001 (transformers' default).

use crate::args::{ModelArgs, MoeArgs, ScoreFunc};
use crate::hf_config::{count, count_or, decoder_args, decoder_config, flag, num, refuse_flag, refuse_present, Config};
use crate::llama3::hf::{block_key, dense_tensor};
use crate::registry::HfTensor;
use serde_json::Value;

pub fn hf_tensor(args: &ModelArgs, key: &str) -> Option<HfTensor> {
    if let Some(t) = dense_tensor(key) {
        return Some(t);
    }
    let (n, tail) = block_key(key)?;
    let one =
        |name: &str, transposed: bool| Some(HfTensor::One { name: format!("model.layers.{n}.{name}"), transposed });
    let experts = |proj: &str| {
        let e = args.moe.as_ref()?.num_experts;
        Some(HfTensor::PerExpert {
            names: (0..e).map(|e| format!("model.layers.{n}.mlp.experts.{e}.{proj}.weight")).collect(),
        })
    };
    match tail {
        "attention.q_norm.weight" => one("self_attn.q_norm.weight", false),
        "attention.k_norm.weight" => one("self_attn.k_norm.weight", false),
        "moe.router.gate.weight" => one("mlp.gate.weight", true),
        "moe.experts.w1" => experts("gate_proj"),
        "moe.experts.w3" => experts("up_proj"),
        "moe.experts.w2" => experts("down_proj"),
        "moe.expert_bias" => Some(HfTensor::Absent),
        _ => None,
    }
}

/// Qwen3-MoE has no shared experts and routes with renormalised softmax scores.
pub fn exportable(args: &ModelArgs) -> Result<(), String> {
    match &args.moe {
        Some(m) if m.num_shared_experts > 0 || m.score_func != ScoreFunc::Softmax || m.route_scale != 1.0 => {
            Err("Qwen3MoeForCausalLM has softmax routing with no shared experts and no routed scaling; this model has other settings".into())
        }
        _ => Ok(()),
    }
}

pub fn from_hf_config(c: &Config) -> Result<ModelArgs, String> {
    refuse_flag(c, "attention_bias", "titan-rs's Qwen3 projections have no biases")?;
    refuse_flag(c, "use_sliding_window", "titan-rs's Qwen3 attends to the whole causal context")?;
    if let Some(t) = c.get("layer_types").and_then(Value::as_array) {
        if let Some(x) = t.iter().find(|x| x.as_str() != Some("full_attention")) {
            return Err(format!(
                "`layer_types` holds {x}, which is not supported; titan-rs's Qwen3 has \"full_attention\" layers only"
            ));
        }
    }
    refuse_present(c, "shared_expert_intermediate_size", "Qwen3-MoE has no shared experts (that is Qwen2-MoE)")?;
    let mut a = decoder_args(c, super::NAME)?;
    a.qk_norm = true;
    let experts = match num(c, "num_experts")? {
        Some(_) => Some(count(c, "num_experts")?),
        None => num(c, "num_local_experts")?.map(|_| count(c, "num_local_experts")).transpose()?,
    };
    let moe_arch =
        c.get("architectures").and_then(Value::as_array).is_some_and(|a| a.iter().any(|x| x == "Qwen3MoeForCausalLM"))
            || c.get("model_type").and_then(Value::as_str) == Some("qwen3_moe");
    let Some(experts) = experts.filter(|_| moe_arch) else {
        if moe_arch {
            return Err("`num_experts` is missing (a Qwen3MoeForCausalLM config needs it)".into());
        }
        return Ok(a);
    };
    let step = count_or(c, "decoder_sparse_step", 1)?;
    if step != 1 {
        return Err(format!("`decoder_sparse_step` = {step} is not supported; titan-rs's MoE layers follow the first dense ones (use 1 with `mlp_only_layers`)"));
    }
    let dense: Vec<u64> = match c.get("mlp_only_layers") {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => serde_json::from_value(v.clone())
            .map_err(|_| format!("`mlp_only_layers` = {v} is not a list of layer indices"))?,
    };
    if dense.iter().enumerate().any(|(i, &l)| l != i as u64) {
        return Err(format!(
            "`mlp_only_layers` = {dense:?} is not supported; titan-rs keeps the first k layers dense (0, 1, …, k-1)"
        ));
    }
    Ok(a.with_moe(MoeArgs {
        num_experts: experts,
        top_k: count(c, "num_experts_per_tok")?,
        n_group: 1,
        topk_group: 1,
        hidden_dim: count(c, "moe_intermediate_size")?,
        num_shared_experts: 0,
        n_dense_layers: dense.len(),
        score_func: ScoreFunc::Softmax,
        route_norm: flag(c, "norm_topk_prob"),
        route_scale: 1.0,
        load_balance_coeff: 0.0,
        aux_loss_alpha: 0.0,
    }))
}

pub fn to_hf_config(a: &ModelArgs, max_position_embeddings: usize, dtype: &str) -> Value {
    let (arch, model_type) =
        if a.moe.is_some() { ("Qwen3MoeForCausalLM", "qwen3_moe") } else { ("Qwen3ForCausalLM", "qwen3") };
    let mut v = decoder_config(a, arch, model_type, max_position_embeddings, dtype);
    v["use_sliding_window"] = false.into();
    v["sliding_window"] = Value::Null;
    v["max_window_layers"] = a.n_layers.into();
    if let Some(m) = &a.moe {
        v["num_experts"] = m.num_experts.into();
        v["num_experts_per_tok"] = m.top_k.into();
        v["moe_intermediate_size"] = m.hidden_dim.into();
        v["norm_topk_prob"] = m.route_norm.into();
        v["decoder_sparse_step"] = 1.into();
        v["mlp_only_layers"] = (0..m.n_dense_layers).collect::<Vec<_>>().into();
        v["router_aux_loss_coef"] = 0.001.into();
        v["output_router_logits"] = false.into();
    }
    v
}

#[cfg(test)]
mod tests {
    use crate::hf_config::{from_hf_config, to_hf_config};
    use crate::registry::HfTensor;
    use serde_json::Value;

    /// Qwen3-0.6B's config.json as published on the Hub.
    const QWEN3_06B: &str = r#"{"architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
        "initializer_range": 0.02, "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28,
        "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
        "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
        "use_sliding_window": false, "vocab_size": 151936}"#;

    /// Qwen3-30B-A3B's config.json as published on the Hub.
    const QWEN3_30B_A3B: &str = r#"{"architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
        "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
        "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144, "max_position_embeddings": 40960,
        "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
        "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
        "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": false, "rms_norm_eps": 1e-06,
        "rope_scaling": null, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": null,
        "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
        "use_sliding_window": false, "vocab_size": 151936}"#;

    #[test]
    fn published_configs_read_as_the_flavors() {
        for (text, flavor) in [(QWEN3_06B, "0.6B"), (QWEN3_30B_A3B, "30B-A3B")] {
            let a = from_hf_config(text).unwrap();
            assert_eq!(a, super::super::flavor(flavor).unwrap(), "{flavor}");
            // Out and in again, in transformers 5's shape and with num_local_experts.
            let out = to_hf_config(&a, 40960, "bfloat16");
            assert_eq!(from_hf_config(&out.to_string()).unwrap(), a);
            let mut v5 = out.clone();
            let o = v5.as_object_mut().unwrap();
            o.remove("rope_theta");
            if let Some(e) = o.remove("num_experts") {
                o.insert("num_local_experts".into(), e);
            }
            assert_eq!(from_hf_config(&v5.to_string()).unwrap(), a);
        }
    }

    #[test]
    fn unsupported_fields_are_named() {
        let with = |base: &str, k: &str, v: &str| {
            let mut x: Value = serde_json::from_str(base).unwrap();
            x[k] = serde_json::from_str(v).unwrap();
            from_hf_config(&x.to_string()).unwrap_err()
        };
        assert!(with(QWEN3_06B, "use_sliding_window", "true").contains("`use_sliding_window` = true"));
        assert!(with(QWEN3_06B, "attention_bias", "true").contains("`attention_bias` = true"));
        assert!(with(QWEN3_06B, "layer_types", r#"["sliding_attention"]"#).contains("`layer_types`"));
        assert!(with(QWEN3_06B, "rope_scaling", r#"{"rope_type": "dynamic", "factor": 4.0}"#).contains("\"dynamic\""));
        assert!(with(QWEN3_30B_A3B, "decoder_sparse_step", "2").contains("`decoder_sparse_step` = 2"));
        assert!(with(QWEN3_30B_A3B, "mlp_only_layers", "[3]").contains("`mlp_only_layers` = [3]"));
        assert!(
            with(QWEN3_30B_A3B, "shared_expert_intermediate_size", "512").contains("`shared_expert_intermediate_size`")
        );
        assert!(with(QWEN3_30B_A3B, "num_experts", "null").contains("`num_experts` is missing"));
        // A prefix of dense layers is the first-k-dense layout.
        let mut x: Value = serde_json::from_str(QWEN3_30B_A3B).unwrap();
        x["mlp_only_layers"] = serde_json::json!([0, 1]);
        assert_eq!(from_hf_config(&x.to_string()).unwrap().moe.unwrap().n_dense_layers, 2);
    }

    #[test]
    fn names_follow_transformers() {
        let a = super::super::flavor("tiny_moe").unwrap();
        let t = |k: &str| super::hf_tensor(&a, k).unwrap();
        assert_eq!(
            t("layers.1.attention.q_norm.weight"),
            HfTensor::One { name: "model.layers.1.self_attn.q_norm.weight".into(), transposed: false }
        );
        assert_eq!(
            t("layers.0.moe.router.gate.weight"),
            HfTensor::One { name: "model.layers.0.mlp.gate.weight".into(), transposed: true }
        );
        match t("layers.1.moe.experts.w2") {
            HfTensor::PerExpert { names } => {
                assert_eq!(names.len(), 8);
                assert_eq!(names[7], "model.layers.1.mlp.experts.7.down_proj.weight");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(t("layers.0.moe.expert_bias"), HfTensor::Absent);
        assert_eq!(t("output.weight"), HfTensor::One { name: "lm_head.weight".into(), transposed: true });
    }
}
