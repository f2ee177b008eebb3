//! Reading and writing Hugging Face `config.json`, shared by the families' adapters: the
//! fields every decoder has, in both shapes users have — transformers 5's `rope_parameters`,
//! and the top-level `rope_theta` + `rope_scaling` of the configs on the Hub. Anything a
//! family does not implement is an error naming the field and its value.
//!
//! [`from_hf_config`] and [`to_hf_config`] pick the family ([`crate::registry`]).

use crate::args::ModelArgs;
use crate::rope::RopeScaling;
use serde_json::{Map, Value};

pub type Config = Map<String, Value>;

/// A number, `None` when absent or null.
pub fn num(c: &Config, key: &str) -> Result<Option<f64>, String> {
    match c.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_f64().map(Some).ok_or_else(|| format!("`{key}` = {v} is not a number")),
    }
}

pub fn need(c: &Config, key: &str) -> Result<f64, String> {
    num(c, key)?.ok_or_else(|| format!("`{key}` is missing"))
}

/// A positive integer that must be there.
pub fn count(c: &Config, key: &str) -> Result<usize, String> {
    let x = need(c, key)?;
    if x < 1.0 || x.fract() != 0.0 {
        return Err(format!("`{key}` = {x} is not a positive integer"));
    }
    Ok(x as usize)
}

/// A non-negative integer, `default` when absent.
pub fn index_or(c: &Config, key: &str, default: usize) -> Result<usize, String> {
    match num(c, key)? {
        Some(x) if x < 0.0 || x.fract() != 0.0 => Err(format!("`{key}` = {x} is not a non-negative integer")),
        Some(x) => Ok(x as usize),
        None => Ok(default),
    }
}

/// A positive integer, `default` when absent.
pub fn count_or(c: &Config, key: &str, default: usize) -> Result<usize, String> {
    match num(c, key)? {
        Some(_) => count(c, key),
        None => Ok(default),
    }
}

pub fn flag(c: &Config, key: &str) -> bool {
    c.get(key).and_then(Value::as_bool).unwrap_or(false)
}

/// Errors when boolean `key` is set to the value the model does not implement.
pub fn refuse_flag(c: &Config, key: &str, why: &str) -> Result<(), String> {
    match c.get(key).and_then(Value::as_bool) {
        Some(true) => Err(format!("`{key}` = true is not supported ({why})")),
        _ => Ok(()),
    }
}

/// Errors when `key` is present and not null.
pub fn refuse_present(c: &Config, key: &str, why: &str) -> Result<(), String> {
    match c.get(key).filter(|x| !x.is_null()) {
        Some(x) => Err(format!("`{key}` = {x} is not supported ({why})")),
        None => Ok(()),
    }
}

/// Parses the JSON text of a `config.json` into its object.
pub fn parse(text: &str) -> Result<Config, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    v.as_object().cloned().ok_or_else(|| "not a JSON object".into())
}

/// The decoder fields every family shares (hidden size, layers, heads, `head_dim` — given, or
/// hidden / heads —, vocabulary, FFN width, RMSNorm eps, tied head, RoPE), for `family`.
pub fn decoder_args(c: &Config, family: &'static str) -> Result<ModelArgs, String> {
    if let Some(act) = c.get("hidden_act").and_then(Value::as_str).filter(|a| *a != "silu") {
        return Err(format!("`hidden_act` = {act:?} is not supported; use \"silu\" (SwiGLU)"));
    }
    if let Some(tp) = num(c, "pretraining_tp")?.filter(|t| *t != 1.0) {
        return Err(format!("`pretraining_tp` = {tp} is not supported; use 1"));
    }
    let dim = count(c, "hidden_size")?;
    let n_heads = count(c, "num_attention_heads")?;
    let (theta, rope_scaling) = rope(c)?;
    let mut a = ModelArgs::base(
        family,
        dim,
        count(c, "num_hidden_layers")?,
        n_heads,
        count_or(c, "num_key_value_heads", n_heads)?,
        count(c, "vocab_size")?,
    );
    a.head_dim = count_or(c, "head_dim", dim / n_heads)?;
    a.multiple_of = 1;
    a.norm_eps = num(c, "rms_norm_eps")?.unwrap_or(1e-6);
    a.rope_theta = theta;
    a.rope_scaling = rope_scaling;
    a.ffn_hidden = Some(count(c, "intermediate_size")?);
    a.tie_word_embeddings = flag(c, "tie_word_embeddings");
    Ok(a)
}

/// RoPE theta and Llama-3.1 scaling from `rope_parameters` (transformers 5) or the top-level
/// `rope_theta` + `rope_scaling` (the Hub).
fn rope(c: &Config) -> Result<(f64, Option<RopeScaling>), String> {
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
    let scaling = match rope_type {
        "default" => None,
        "llama3" => Some(RopeScaling::Llama3 {
            factor: need(&rope, "factor")?,
            low_freq_factor: need(&rope, "low_freq_factor")?,
            high_freq_factor: need(&rope, "high_freq_factor")?,
            original_max_position_embeddings: need(&rope, "original_max_position_embeddings")?,
        }),
        "yarn" => {
            let factor = need(&rope, "factor")?;
            // transformers: given, else mscale / mscale_all_dim when both are set, else from the factor.
            let attention_factor =
                match (num(&rope, "attention_factor")?, num(&rope, "mscale")?, num(&rope, "mscale_all_dim")?) {
                    (Some(a), _, _) => a,
                    (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                        RopeScaling::yarn_mscale(factor, m) / RopeScaling::yarn_mscale(factor, all)
                    }
                    _ => RopeScaling::yarn_mscale(factor, 1.0),
                };
            Some(RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: need(&rope, "original_max_position_embeddings")?,
                beta_fast: num(&rope, "beta_fast")?.filter(|b| *b != 0.0).unwrap_or(32.0),
                beta_slow: num(&rope, "beta_slow")?.filter(|b| *b != 0.0).unwrap_or(1.0),
                truncate: rope.get("truncate").and_then(Value::as_bool).unwrap_or(true),
                attention_factor,
            })
        }
        other => {
            return Err(format!(
                "`rope_type` = {other:?} is not supported; titan-rs implements \"default\", \"llama3\" and \"yarn\""
            ))
        }
    };
    Ok((num(&rope, "rope_theta")?.unwrap_or(10_000.0), scaling))
}

/// The `config.json` fields every family shares, for `architecture` / `model_type`
/// (transformers 5's shape, with the top-level `rope_theta` and `rope_scaling` older
/// transformers read as well). Families add theirs.
pub fn decoder_config(
    a: &ModelArgs,
    architecture: &str,
    model_type: &str,
    max_position_embeddings: usize,
    dtype: &str,
) -> Value {
    let mut rope = serde_json::json!({ "rope_type": "default", "rope_theta": a.rope_theta });
    let mut scaling = Value::Null;
    if let Some(s) = &a.rope_scaling {
        // The enum serialises as transformers names the fields (`rope_type` its tag).
        let mut r = serde_json::to_value(s).expect("rope scaling as JSON");
        let (RopeScaling::Llama3 { original_max_position_embeddings: old, .. }
        | RopeScaling::Yarn { original_max_position_embeddings: old, .. }) = s;
        r["original_max_position_embeddings"] = (*old as u64).into();
        scaling = r.clone();
        rope = r;
        rope["rope_theta"] = a.rope_theta.into();
    }
    serde_json::json!({
        "architectures": [architecture],
        "model_type": model_type,
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
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": true,
        "dtype": dtype,
    })
}

/// The model arguments of a `config.json` (its text), of whichever family its `architectures`
/// (or `model_type`) names; errors name the field.
pub fn from_hf_config(text: &str) -> Result<ModelArgs, String> {
    let c = parse(text)?;
    let family = crate::registry::family_of_config(&c)?;
    let args = (family.from_hf_config)(&c)?;
    args.validate()?;
    Ok(args)
}

/// The `config.json` of `args`, written by its family's adapter.
pub fn to_hf_config(a: &ModelArgs, max_position_embeddings: usize, dtype: &str) -> Value {
    (crate::registry::of(a).to_hf_config)(a, max_position_embeddings, dtype)
}
