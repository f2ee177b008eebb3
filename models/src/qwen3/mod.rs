//! Qwen3 (`model.name = "qwen3"`), dense and mixture-of-experts: the Llama-shaped decoder with
//! per-head RMSNorm of queries and keys before RoPE, a `head_dim` of its own (Qwen3-0.6B:
//! hidden 1024, 16 heads of 128), RoPE theta 1e6, RMSNorm eps 1e-6, tied or untied head; the
//! MoE flavors route each token to the top 8 of 128 softmax-scored experts (renormalised,
//! `norm_topk_prob`) with no shared experts. [`hf`]: `Qwen3ForCausalLM` and
//! `Qwen3MoeForCausalLM` in and out.

pub mod hf;

use crate::args::{ModelArgs, MoeArgs, ScoreFunc};
use crate::registry::Family;

pub const NAME: &str = "qwen3";

/// Flavor names accepted by `model.flavor` (the published shapes, a debug one, a tiny one for tests).
pub const FLAVORS: &[&str] = &[
    "tiny",
    "debugmodel",
    "0.6B",
    "1.7B",
    "4B",
    "8B",
    "14B",
    "32B",
    "tiny_moe",
    "debugmodel_moe",
    "30B-A3B",
    "235B-A22B",
];

pub const FAMILY: Family = Family {
    name: NAME,
    flavors: FLAVORS,
    flavor,
    architectures: &["Qwen3ForCausalLM", "Qwen3MoeForCausalLM"],
    model_types: &["qwen3", "qwen3_moe"],
    from_hf_config: hf::from_hf_config,
    to_hf_config: hf::to_hf_config,
    hf_tensor: hf::hf_tensor,
    exportable: hf::exportable,
};

/// Qwen3's vocabulary (the published checkpoints).
const VOCAB: usize = 151_936;

/// A Qwen3 shape: QK-norm, the given head width and FFN width, theta 1e6, eps 1e-6.
fn qwen3(
    dim: usize,
    layers: usize,
    heads: usize,
    kv: usize,
    head_dim: usize,
    ffn: usize,
    vocab: usize,
    tied: bool,
) -> ModelArgs {
    let mut a = ModelArgs::base(NAME, dim, layers, heads, kv, vocab);
    a.head_dim = head_dim;
    a.qk_norm = true;
    a.ffn_hidden = Some(ffn);
    a.multiple_of = 1;
    a.rope_theta = 1_000_000.0;
    a.norm_eps = 1e-6;
    a.tie_word_embeddings = tied;
    a
}

/// Qwen3-MoE's router: softmax scores, top `top_k`, renormalised; every layer sparse, no shared
/// experts. No bias balancing by default (the HF format has no bias; Qwen3 trained with an
/// auxiliary loss instead): `model.moe_load_balance_coeff` turns it on.
fn moe(a: ModelArgs, experts: usize, top_k: usize, hidden: usize) -> ModelArgs {
    a.with_moe(MoeArgs {
        num_experts: experts,
        top_k,
        n_group: 1,
        topk_group: 1,
        hidden_dim: hidden,
        num_shared_experts: 0,
        n_dense_layers: 0,
        score_func: ScoreFunc::Softmax,
        route_norm: true,
        route_scale: 1.0,
        load_balance_coeff: 0.0,
        aux_loss_alpha: 0.0,
    })
}

/// The named flavor, or `None` (see [`FLAVORS`]).
///
/// * `tiny` / `tiny_moe`: 2 layers, dim 64, 4 heads of 32 (wider than dim / heads, as in
///   Qwen3), the shipped 2 048-token vocabulary; `tiny_moe`: 8 experts of 32, top 2.
/// * `debugmodel`: TorchTitan's Qwen3 debug shape — dim 256, 8 layers, 16 heads (8 kv) of 128,
///   FFN 3072, vocabulary 2048. `debugmodel_moe`: the same with 8 experts of 256, top 2.
/// * `0.6B` … `32B`, `30B-A3B`, `235B-A22B`: the published configs (vocabulary 151 936; 0.6B,
///   1.7B and 4B tie their head to the embedding).
pub fn flavor(name: &str) -> Option<ModelArgs> {
    Some(match name {
        "tiny" => qwen3(64, 2, 4, 2, 32, 128, 2048, false),
        "debugmodel" => qwen3(256, 8, 16, 8, 128, 3072, 2048, false),
        "0.6B" => qwen3(1024, 28, 16, 8, 128, 3072, VOCAB, true),
        "1.7B" => qwen3(2048, 28, 16, 8, 128, 6144, VOCAB, true),
        "4B" => qwen3(2560, 36, 32, 8, 128, 9728, VOCAB, true),
        "8B" => qwen3(4096, 36, 32, 8, 128, 12288, VOCAB, false),
        "14B" => qwen3(5120, 40, 40, 8, 128, 17408, VOCAB, false),
        "32B" => qwen3(5120, 64, 64, 8, 128, 25600, VOCAB, false),
        "tiny_moe" => moe(qwen3(64, 2, 4, 2, 32, 128, 2048, false), 8, 2, 32),
        "debugmodel_moe" => moe(qwen3(256, 8, 16, 8, 128, 3072, 2048, false), 8, 2, 256),
        "30B-A3B" => moe(qwen3(2048, 48, 32, 4, 128, 6144, VOCAB, false), 128, 8, 768),
        "235B-A22B" => moe(qwen3(4096, 94, 64, 4, 128, 12288, VOCAB, false), 128, 8, 1536),
        _ => return None,
    })
}
