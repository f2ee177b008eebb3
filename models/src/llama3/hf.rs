//! `LlamaForCausalLM` in and out: `config.json` ↔ [`ModelArgs`], and titan-rs parameter names
//! → Hugging Face tensor names (the reverse is found by listing the model's parameters).
//!
//! | titan-rs | Hugging Face | |
//! |---|---|---|
//! | `tok_embeddings.weight` | `model.embed_tokens.weight` | |
//! | `layers.N.attention.{wq,wk,wv,wo}.weight` | `model.layers.N.self_attn.{q,k,v,o}_proj.weight` | transposed |
//! | `layers.N.feed_forward.{w1,w2,w3}.weight` | `model.layers.N.mlp.{gate,down,up}_proj.weight` | transposed |
//! | `layers.N.attention_norm.weight` | `model.layers.N.input_layernorm.weight` | |
//! | `layers.N.ffn_norm.weight` | `model.layers.N.post_attention_layernorm.weight` | |
//! | `norm.weight` | `model.norm.weight` | |
//! | `output.weight` (absent when tied) | `lm_head.weight` | transposed |
//!
//! HF stores linear weights `[out, in]`, titan-rs `[in, out]`. Both use RoPE's rotate-half
//! layout, so q/k need no permutation.

use crate::args::ModelArgs;
use crate::hf_config::{decoder_args, decoder_config, refuse_flag, refuse_present, Config};
use crate::registry::HfTensor;
use serde_json::Value;

/// `(titan-rs suffix, HF suffix, transposed)` inside a block.
const BLOCK: [(&str, &str, bool); 9] = [
    ("attention.wq.weight", "self_attn.q_proj.weight", true),
    ("attention.wk.weight", "self_attn.k_proj.weight", true),
    ("attention.wv.weight", "self_attn.v_proj.weight", true),
    ("attention.wo.weight", "self_attn.o_proj.weight", true),
    ("feed_forward.w1.weight", "mlp.gate_proj.weight", true),
    ("feed_forward.w2.weight", "mlp.down_proj.weight", true),
    ("feed_forward.w3.weight", "mlp.up_proj.weight", true),
    ("attention_norm.weight", "input_layernorm.weight", false),
    ("ffn_norm.weight", "post_attention_layernorm.weight", false),
];
const TOP: [(&str, &str, bool); 3] = [
    ("tok_embeddings.weight", "model.embed_tokens.weight", false),
    ("norm.weight", "model.norm.weight", false),
    ("output.weight", "lm_head.weight", true),
];

/// A block parameter key split into its layer and the rest (`layers.3.attention.wq.weight` →
/// `(3, "attention.wq.weight")`).
pub fn block_key(key: &str) -> Option<(usize, &str)> {
    let (n, tail) = key.strip_prefix("layers.")?.split_once('.')?;
    Some((n.parse().ok()?, tail))
}

/// The HF tensor of a Llama-layout parameter: the embedding, norms, attention projections,
/// dense FFN and output head (what every decoder family here shares).
pub fn dense_tensor(key: &str) -> Option<HfTensor> {
    let one = |name: String, transposed: bool| Some(HfTensor::One { name, transposed });
    if let Some(e) = TOP.iter().find(|e| e.0 == key) {
        return one(e.1.to_string(), e.2);
    }
    let (n, tail) = block_key(key)?;
    let e = BLOCK.iter().find(|e| e.0 == tail)?;
    one(format!("model.layers.{n}.{}", e.1), e.2)
}

pub fn hf_tensor(_args: &ModelArgs, key: &str) -> Option<HfTensor> {
    dense_tensor(key)
}

/// Whether `args` can be written as a `LlamaForCausalLM` (which has no experts).
pub fn exportable(args: &ModelArgs) -> Result<(), String> {
    if args.moe.is_some() {
        return Err("a llama3 mixture-of-experts flavor has no Hugging Face counterpart (LlamaForCausalLM has no experts); the titan-rs checkpoint holds the model".into());
    }
    Ok(())
}

pub fn from_hf_config(c: &Config) -> Result<ModelArgs, String> {
    refuse_flag(c, "attention_bias", "Llama has no biases")?;
    refuse_flag(c, "mlp_bias", "Llama has no biases")?;
    for key in ["sliding_window", "num_local_experts", "num_experts"] {
        refuse_present(c, key, "titan-rs's Llama has none")?;
    }
    decoder_args(c, super::NAME)
}

pub fn to_hf_config(a: &ModelArgs, max_position_embeddings: usize, dtype: &str) -> Value {
    let mut v = decoder_config(a, "LlamaForCausalLM", "llama", max_position_embeddings, dtype);
    v["mlp_bias"] = false.into();
    v["pretraining_tp"] = 1.into();
    v
}

#[cfg(test)]
mod tests {
    use crate::hf_config::{from_hf_config, to_hf_config};
    use crate::registry::HfTensor;
    use crate::rope::RopeScaling;
    use serde_json::Value;

    const HUB: &str = r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
        "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
        "intermediate_size": 8192, "vocab_size": 128256, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192, "rope_type": "llama3"}, "tie_word_embeddings": true,
        "max_position_embeddings": 131072, "hidden_act": "silu"}"#;

    #[test]
    fn llama_3_2_1b_reads_in_both_shapes() {
        let a = from_hf_config(HUB).unwrap();
        assert_eq!(a.family, "llama3");
        assert_eq!((a.dim, a.n_layers, a.n_heads, a.n_kv_heads, a.ffn_hidden_dim()), (2048, 16, 32, 8, 8192));
        assert!(a.tie_word_embeddings);
        // Meta's published count for Llama-3.2 1B (tied): 1 235 814 400.
        assert_eq!(a.num_params(), 1_235_814_400);
        let Some(RopeScaling::Llama3 { factor, original_max_position_embeddings, .. }) = a.rope_scaling else {
            panic!("{:?}", a.rope_scaling)
        };
        assert_eq!((factor, original_max_position_embeddings, a.rope_theta), (32.0, 8192.0, 500000.0));
        let v5 = to_hf_config(&a, 131072, "bfloat16").to_string();
        assert_eq!(from_hf_config(&v5).unwrap(), a);
        // transformers 5 only: `rope_parameters`, no top-level fields.
        let mut only5: Value = serde_json::from_str(&v5).unwrap();
        let o = only5.as_object_mut().unwrap();
        o.remove("rope_theta");
        o.remove("rope_scaling");
        assert_eq!(from_hf_config(&only5.to_string()).unwrap(), a);
        // An explicit head_dim other than hidden / heads is a shape of its own.
        let mut wide: Value = serde_json::from_str(HUB).unwrap();
        wide["head_dim"] = 128.into();
        let w = from_hf_config(&wide.to_string()).unwrap();
        assert_eq!((w.head_dim(), w.num_params() - a.num_params()), (128, 16 * 2048 * (32 + 8) * 64 * 2));
    }

    #[test]
    fn unsupported_fields_are_named() {
        let with = |k: &str, v: &str| {
            let mut x: Value = serde_json::from_str(HUB).unwrap();
            x[k] = serde_json::from_str(v).unwrap();
            from_hf_config(&x.to_string()).unwrap_err()
        };
        let arch = with("architectures", r#"["MistralForCausalLM"]"#);
        assert!(arch.contains("MistralForCausalLM") && arch.contains("Qwen3ForCausalLM"), "{arch}");
        assert!(with("attention_bias", "true").contains("`attention_bias` = true"));
        assert!(with("sliding_window", "4096").contains("`sliding_window` = 4096"));
        assert!(with("rope_scaling", r#"{"rope_type": "longrope", "factor": 4.0}"#).contains("\"longrope\""));
        assert!(with("num_experts", "8").contains("`num_experts`"));
        assert!(with("hidden_act", r#""gelu""#).contains("`hidden_act` = \"gelu\""));
        let mut x: Value = serde_json::from_str(HUB).unwrap();
        x.as_object_mut().unwrap().remove("hidden_size");
        assert!(from_hf_config(&x.to_string()).unwrap_err().contains("`hidden_size` is missing"));
    }

    #[test]
    fn names_follow_transformers() {
        let one = |k: &str| match super::dense_tensor(k) {
            Some(HfTensor::One { name, transposed }) => (name, transposed),
            other => panic!("{k}: {other:?}"),
        };
        assert_eq!(one("layers.2.feed_forward.w3.weight"), ("model.layers.2.mlp.up_proj.weight".into(), true));
        assert_eq!(one("layers.11.attention.wk.weight"), ("model.layers.11.self_attn.k_proj.weight".into(), true));
        assert_eq!(one("layers.0.ffn_norm.weight"), ("model.layers.0.post_attention_layernorm.weight".into(), false));
        assert_eq!(one("output.weight"), ("lm_head.weight".into(), true));
        assert!(super::dense_tensor("layers.0.attention.rotary.inv_freq").is_none());
    }
}
