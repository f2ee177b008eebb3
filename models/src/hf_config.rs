//! A model shape from a Hugging Face `config.json` (`LlamaForCausalLM`), in both shapes users
//! have: transformers 5's `rope_parameters`, and the top-level `rope_theta` + `rope_scaling` of
//! the Llama-3.x configs on the Hub. Anything this model does not implement is an error naming
//! the field and its value.

use crate::args::ModelArgs;
use crate::rope::RopeScaling;
use serde_json::{Map, Value};

fn num(c: &Map<String, Value>, key: &str) -> Result<Option<f64>, String> {
    match c.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_f64().map(Some).ok_or_else(|| format!("`{key}` = {v} is not a number")),
    }
}

fn need(c: &Map<String, Value>, key: &str) -> Result<f64, String> {
    num(c, key)?.ok_or_else(|| format!("`{key}` is missing"))
}

fn count(c: &Map<String, Value>, key: &str) -> Result<usize, String> {
    let x = need(c, key)?;
    if x < 1.0 || x.fract() != 0.0 {
        return Err(format!("`{key}` = {x} is not a positive integer"));
    }
    Ok(x as usize)
}

/// The model arguments of a `config.json` (its text), or an error naming the field.
pub fn from_hf_config(text: &str) -> Result<ModelArgs, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    let c = v.as_object().ok_or("not a JSON object")?;
    if let Some(a) = c.get("architectures").and_then(Value::as_array) {
        if !a.iter().any(|x| x == "LlamaForCausalLM") {
            return Err(format!("`architectures` = {} is not supported; titan-rs reads LlamaForCausalLM", Value::Array(a.clone())));
        }
    }
    if let Some(t) = c.get("model_type").and_then(Value::as_str).filter(|t| *t != "llama") {
        return Err(format!("`model_type` = {t:?} is not supported; titan-rs reads \"llama\""));
    }
    for (key, ok) in [("attention_bias", false), ("mlp_bias", false)] {
        if let Some(b) = c.get(key).and_then(Value::as_bool).filter(|b| *b != ok) {
            return Err(format!("`{key}` = {b} is not supported (Llama has no biases)"));
        }
    }
    if let Some(act) = c.get("hidden_act").and_then(Value::as_str).filter(|a| *a != "silu") {
        return Err(format!("`hidden_act` = {act:?} is not supported; use \"silu\" (SwiGLU)"));
    }
    for key in ["sliding_window", "num_local_experts", "num_experts"] {
        if let Some(x) = c.get(key).filter(|x| !x.is_null()) {
            return Err(format!("`{key}` = {x} is not supported by titan-rs's Llama"));
        }
    }
    if let Some(tp) = num(c, "pretraining_tp")?.filter(|t| *t != 1.0) {
        return Err(format!("`pretraining_tp` = {tp} is not supported; use 1"));
    }
    let dim = count(c, "hidden_size")?;
    let n_heads = count(c, "num_attention_heads")?;
    let n_kv_heads = match num(c, "num_key_value_heads")? {
        Some(_) => count(c, "num_key_value_heads")?,
        None => n_heads,
    };
    if let Some(hd) = num(c, "head_dim")? {
        if hd as usize * n_heads != dim {
            return Err(format!(
                "`head_dim` = {hd} with hidden_size {dim} and {n_heads} heads is not supported (titan-rs uses head_dim = hidden_size / num_attention_heads = {})",
                dim / n_heads
            ));
        }
    }
    // transformers 5: everything under `rope_parameters`; Llama-3.x on the Hub: top level.
    let rope = match c.get("rope_parameters") {
        Some(Value::Object(p)) => p.clone(),
        _ => {
            let mut p = c.get("rope_scaling").and_then(Value::as_object).cloned().unwrap_or_default();
            if let Some(t) = c.get("rope_theta") {
                p.insert("rope_theta".into(), t.clone());
            }
            p
        }
    };
    let rope_type = rope.get("rope_type").or_else(|| rope.get("type")).and_then(Value::as_str).unwrap_or("default");
    let rope_scaling = match rope_type {
        "default" => None,
        "llama3" => Some(RopeScaling {
            factor: need(&rope, "factor")?,
            low_freq_factor: need(&rope, "low_freq_factor")?,
            high_freq_factor: need(&rope, "high_freq_factor")?,
            original_max_position_embeddings: need(&rope, "original_max_position_embeddings")?,
        }),
        other => return Err(format!("`rope_type` = {other:?} is not supported; titan-rs implements \"default\" and \"llama3\"")),
    };
    let args = ModelArgs {
        dim,
        n_layers: count(c, "num_hidden_layers")?,
        n_heads,
        n_kv_heads,
        vocab_size: count(c, "vocab_size")?,
        multiple_of: 1,
        ffn_dim_multiplier: None,
        norm_eps: num(c, "rms_norm_eps")?.unwrap_or(1e-6),
        rope_theta: num(&rope, "rope_theta")?.unwrap_or(10_000.0),
        rope_scaling,
        ffn_hidden: Some(count(c, "intermediate_size")?),
        tie_word_embeddings: c.get("tie_word_embeddings").and_then(Value::as_bool).unwrap_or(false),
        moe: None,
    };
    args.validate()?;
    Ok(args)
}

/// The `config.json` of `args` (transformers 5's shape, with the top-level `rope_theta` and
/// `rope_scaling` older transformers read as well).
pub fn to_hf_config(a: &ModelArgs, max_position_embeddings: usize, dtype: &str) -> Value {
    let mut rope = serde_json::json!({ "rope_type": "default", "rope_theta": a.rope_theta });
    let mut scaling = Value::Null;
    if let Some(s) = &a.rope_scaling {
        let r = serde_json::json!({
            "rope_type": "llama3",
            "factor": s.factor,
            "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_position_embeddings as u64,
        });
        scaling = r.clone();
        rope = r;
        rope["rope_theta"] = a.rope_theta.into();
    }
    serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": a.dim,
        "num_hidden_layers": a.n_layers,
        "num_attention_heads": a.n_heads,
        "num_key_value_heads": a.n_kv_heads,
        "head_dim": a.head_dim(),
        "intermediate_size": a.ffn_hidden_dim(),
        "vocab_size": a.vocab_size,
        "rms_norm_eps": a.norm_eps,
        "rope_theta": a.rope_theta,
        "rope_scaling": scaling,
        "rope_parameters": rope,
        "tie_word_embeddings": a.tie_word_embeddings,
        "max_position_embeddings": max_position_embeddings,
        "hidden_act": "silu",
        "attention_bias": false,
        "mlp_bias": false,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "use_cache": true,
        "dtype": dtype,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HUB: &str = r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
        "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
        "intermediate_size": 8192, "vocab_size": 128256, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192, "rope_type": "llama3"}, "tie_word_embeddings": true,
        "max_position_embeddings": 131072, "hidden_act": "silu"}"#;

    #[test]
    fn llama_3_2_1b_reads_in_both_shapes() {
        let a = from_hf_config(HUB).unwrap();
        assert_eq!((a.dim, a.n_layers, a.n_heads, a.n_kv_heads, a.ffn_hidden_dim()), (2048, 16, 32, 8, 8192));
        assert!(a.tie_word_embeddings);
        // Meta's published count for Llama-3.2 1B (tied): 1 235 814 400.
        assert_eq!(a.num_params(), 1_235_814_400);
        let s = a.rope_scaling.unwrap();
        assert_eq!((s.factor, s.original_max_position_embeddings, a.rope_theta), (32.0, 8192.0, 500000.0));
        let v5 = to_hf_config(&a, 131072, "bfloat16").to_string();
        assert_eq!(from_hf_config(&v5).unwrap(), a);
        // transformers 5 only: `rope_parameters`, no top-level fields.
        let mut only5: Value = serde_json::from_str(&v5).unwrap();
        let o = only5.as_object_mut().unwrap();
        o.remove("rope_theta");
        o.remove("rope_scaling");
        assert_eq!(from_hf_config(&only5.to_string()).unwrap(), a);
    }

    #[test]
    fn unsupported_fields_are_named() {
        let with = |k: &str, v: &str| {
            let mut x: Value = serde_json::from_str(HUB).unwrap();
            x[k] = serde_json::from_str(v).unwrap();
            from_hf_config(&x.to_string()).unwrap_err()
        };
        assert!(with("architectures", r#"["MistralForCausalLM"]"#).contains("MistralForCausalLM"));
        assert!(with("attention_bias", "true").contains("`attention_bias` = true"));
        assert!(with("sliding_window", "4096").contains("`sliding_window` = 4096"));
        assert!(with("rope_scaling", r#"{"rope_type": "yarn", "factor": 4.0}"#).contains("\"yarn\""));
        assert!(with("head_dim", "128").contains("`head_dim` = 128"));
        assert!(with("num_experts", "8").contains("`num_experts`"));
        let mut x: Value = serde_json::from_str(HUB).unwrap();
        x.as_object_mut().unwrap().remove("hidden_size");
        assert!(from_hf_config(&x.to_string()).unwrap_err().contains("`hidden_size` is missing"));
    }
}
