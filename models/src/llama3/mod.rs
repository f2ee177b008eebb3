//! Llama 3 (`model.name = "llama3"`): the flavors, and (in [`hf`]) the `LlamaForCausalLM`
//! adapter. The modules are the shared decoder ([`crate::decoder`]); the DeepSeek-style MoE
//! flavors put [`crate::moe`] on it.

pub mod hf;

use crate::args::{ModelArgs, MoeArgs, ScoreFunc};
use crate::registry::Family;

pub const NAME: &str = "llama3";

/// Flavor names accepted by `model.flavor`.
pub const FLAVORS: &[&str] = &["tiny", "debugmodel", "small", "1B", "3B", "8B", "70B", "405B", "moe_debug", "moe_1B"];

/// The family as the registry sees it.
pub const FAMILY: Family = Family {
    name: NAME,
    flavors: FLAVORS,
    flavor,
    architectures: &["LlamaForCausalLM"],
    model_types: &["llama"],
    from_hf_config: hf::from_hf_config,
    to_hf_config: hf::to_hf_config,
    hf_tensor: hf::hf_tensor,
    exportable: hf::exportable,
};

fn base(dim: usize, n_layers: usize, n_heads: usize, n_kv_heads: usize, vocab: usize) -> ModelArgs {
    ModelArgs::base(NAME, dim, n_layers, n_heads, n_kv_heads, vocab)
}

/// The named flavor, or `None` if the name is unknown (see [`FLAVORS`]).
///
/// * `tiny`: a 2-layer model for fast tests (not in TorchTitan).
/// * `debugmodel`: TorchTitan's debug model (dim 256, 6 layers, 16 heads, vocab 2048).
/// * `small`: dim 768, 12 layers, 12 heads, 4 kv heads, vocab 2048 (≈ 78.7 M parameters),
///   sized for the shipped 2 048-token tokenizer.
/// * `1B` … `405B`: Llama-3.x shapes with the Llama-3 vocabulary (128 256) and an untied head.
/// * `moe_debug`: TorchTitan's DeepSeek-V3 debug shape — dim 256, 3 layers (the first
///   dense), 8 experts of 256 hidden units, top 3, 2 shared experts.
/// * `moe_1B`: ≈ 1.0 B parameters of which ≈ 0.30 B active per token — dim 1024, 12 layers
///   (the first dense), 32 experts of 832 hidden units, top 7, 2 shared; the shipped
///   2 048-token vocabulary.
pub fn flavor(name: &str) -> Option<ModelArgs> {
    const LLAMA3_VOCAB: usize = 128_256;
    Some(match name {
        "tiny" => base(64, 2, 4, 2, 2048),
        "debugmodel" => base(256, 6, 16, 16, 2048),
        "small" => base(768, 12, 12, 4, 2048),
        "1B" => base(2048, 16, 32, 8, LLAMA3_VOCAB).ffn(1.5, 256),
        "3B" => base(3072, 28, 24, 8, LLAMA3_VOCAB).ffn(1.0, 256),
        "8B" => base(4096, 32, 32, 8, LLAMA3_VOCAB).ffn(1.3, 1024),
        "70B" => base(8192, 80, 64, 8, LLAMA3_VOCAB).ffn(1.3, 4096),
        "405B" => base(16384, 126, 128, 8, LLAMA3_VOCAB).ffn(1.2, 4096),
        "moe_debug" => base(256, 3, 16, 16, 2048).with_moe(MoeArgs {
            num_experts: 8,
            top_k: 3,
            n_group: 1,
            topk_group: 1,
            hidden_dim: 256,
            num_shared_experts: 2,
            n_dense_layers: 1,
            score_func: ScoreFunc::Softmax,
            route_norm: false,
            route_scale: 1.0,
            load_balance_coeff: 1e-3,
            aux_loss_alpha: 0.0,
        }),
        "moe_1B" => base(1024, 12, 16, 8, 2048).with_moe(MoeArgs {
            num_experts: 32,
            top_k: 7,
            n_group: 1,
            topk_group: 1,
            hidden_dim: 832,
            num_shared_experts: 2,
            n_dense_layers: 1,
            score_func: ScoreFunc::Sigmoid,
            route_norm: true,
            route_scale: 1.0,
            load_balance_coeff: 1e-3,
            aux_loss_alpha: 0.0,
        }),
        _ => return None,
    })
}
