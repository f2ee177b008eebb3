//! DeepSeek-V3 (`model.name = "deepseek_v3"`): multi-head latent attention
//! ([`crate::mla`]) with decoupled RoPE heads and YaRN long-context scaling, and the MoE of
//! [`crate::moe`] with sigmoid scores, group-limited top-k, routed scaling, the first blocks
//! dense, shared experts and aux-loss-free bias balancing. [`hf`]: `DeepseekV3ForCausalLM` in
//! and out. Multi-token prediction is not built (transformers does not run it either).

pub mod hf;

use crate::args::{MlaArgs, ModelArgs, MoeArgs, ScoreFunc};
use crate::registry::Family;
use crate::rope::RopeScaling;

pub const NAME: &str = "deepseek_v3";

pub const FLAVORS: &[&str] = &["tiny", "debugmodel", "16B", "671B"];

pub const FAMILY: Family = Family {
    name: NAME,
    flavors: FLAVORS,
    flavor,
    architectures: &["DeepseekV3ForCausalLM"],
    model_types: &["deepseek_v3"],
    from_hf_config: hf::from_hf_config,
    to_hf_config: hf::to_hf_config,
    hf_tensor: hf::hf_tensor,
    exportable: hf::exportable,
};

/// The shape: `heads` heads of latent attention on `dim`, the dense FFN `inter`.
fn deepseek(
    dim: usize,
    layers: usize,
    heads: usize,
    inter: usize,
    vocab: usize,
    mla: MlaArgs,
    moe: MoeArgs,
) -> ModelArgs {
    let mut a = ModelArgs::base(NAME, dim, layers, heads, heads, vocab);
    a.head_dim = mla.qk_rope_head_dim;
    a.ffn_hidden = Some(inter);
    a.multiple_of = 1;
    a.rope_theta = 10_000.0;
    a.norm_eps = 1e-6;
    a.mla = Some(mla);
    a.with_moe(moe)
}

fn mla(q_lora_rank: usize, kv_lora_rank: usize, nope: usize, rope: usize, v: usize) -> MlaArgs {
    MlaArgs {
        q_lora_rank,
        kv_lora_rank,
        qk_nope_head_dim: nope,
        qk_rope_head_dim: rope,
        v_head_dim: v,
        softmax_scale: 1.0,
    }
}

#[allow(clippy::too_many_arguments)]
fn moe(
    experts: usize,
    top_k: usize,
    hidden: usize,
    shared: usize,
    dense: usize,
    groups: (usize, usize),
    scale: f64,
) -> MoeArgs {
    MoeArgs {
        num_experts: experts,
        top_k,
        n_group: groups.0,
        topk_group: groups.1,
        hidden_dim: hidden,
        num_shared_experts: shared,
        n_dense_layers: dense,
        score_func: ScoreFunc::Sigmoid,
        route_norm: true,
        route_scale: scale,
        load_balance_coeff: 1e-3,
        aux_loss_alpha: 0.0,
    }
}

/// The named flavor, or `None` (see [`FLAVORS`]).
///
/// * `tiny` (tests): dim 64, 2 layers (the first dense), 4 heads of 16 + 8 RoPE (values 16),
///   query rank 32, key/value rank 32, 8 experts of 32 in 4 groups (best 2), top 2, 1 shared.
/// * `debugmodel` (TorchTitan's shape): dim 256, 6 layers (1 dense), 16 heads of 128 + 64
///   (values 128), no query bottleneck, key/value rank 512, 8 experts of 256, top 3, 2 shared.
/// * `16B` (DeepSeek-V2-Lite's / TorchTitan's): dim 2048, 27 layers (1 dense), 16 heads, key/value
///   rank 512, 64 experts of 1408, top 6 by softmax, 2 shared; vocabulary 102 400.
/// * `671B` (DeepSeek-V3): dim 7168, 61 layers (3 dense), 128 heads, query rank 1536, key/value
///   rank 512, 256 experts of 2048 in 8 groups (best 4), top 8, 1 shared, routed scale 2.5, YaRN
///   ×40 over 4096 positions; vocabulary 129 280.
pub fn flavor(name: &str) -> Option<ModelArgs> {
    Some(match name {
        "tiny" => deepseek(64, 2, 4, 128, 2048, mla(32, 32, 16, 8, 16), moe(8, 2, 32, 1, 1, (4, 2), 1.0)),
        "debugmodel" => deepseek(256, 6, 16, 1024, 2048, mla(0, 512, 128, 64, 128), moe(8, 3, 256, 2, 1, (1, 1), 1.0)),
        "16B" => {
            let mut a =
                deepseek(2048, 27, 16, 10944, 102_400, mla(0, 512, 128, 64, 128), moe(64, 6, 1408, 2, 1, (1, 1), 1.0));
            let m = a.moe.as_mut().expect("experts");
            (m.score_func, m.route_norm) = (ScoreFunc::Softmax, false);
            a
        }
        "671B" => {
            let mut a = deepseek(
                7168,
                61,
                128,
                18432,
                129_280,
                mla(1536, 512, 128, 64, 128),
                moe(256, 8, 2048, 1, 3, (8, 4), 2.5),
            );
            let factor = 40.0;
            a.rope_scaling = Some(RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: 4096.0,
                beta_fast: 32.0,
                beta_slow: 1.0,
                truncate: true,
                attention_factor: 1.0,
            });
            let mscale = RopeScaling::yarn_mscale(factor, 1.0);
            a.mla.as_mut().expect("latent attention").softmax_scale = mscale * mscale;
            a
        }
        _ => return None,
    })
}
