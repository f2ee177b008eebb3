//! Model hyper-parameters every family fills, and the analytic parameter / FLOP counts.
//!
//! The named flavors live with their family (`crate::llama3`, `crate::qwen3`); the registry
//! (`crate::registry`) finds them by `model.name`.

use crate::rope::RopeScaling;
use serde::Serialize;

/// Hyper-parameters of a decoder (TorchTitan's `TransformerModelArgs`, one struct for the
/// families that share the decoder: what differs is a field here, not a copy of the model).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelArgs {
    /// The family (`model.name`) these arguments belong to: which HF adapter reads and writes them.
    pub family: &'static str,
    pub dim: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    /// Width of one attention head; `dim / n_heads` for Llama, set on its own for Qwen3
    /// (Qwen3-0.6B: dim 1024, 16 heads of 128).
    pub head_dim: usize,
    /// Per-head RMSNorm of queries and keys before RoPE (Qwen3).
    pub qk_norm: bool,
    pub vocab_size: usize,
    pub multiple_of: usize,
    pub ffn_dim_multiplier: Option<f64>,
    pub norm_eps: f64,
    pub rope_theta: f64,
    /// Llama-3.1+ RoPE frequency scaling (HF models); `None` for the flavors.
    pub rope_scaling: Option<RopeScaling>,
    /// The SwiGLU hidden size when given explicitly (HF `intermediate_size`); `None`: Llama-3's
    /// rule from `multiple_of` and `ffn_dim_multiplier`.
    pub ffn_hidden: Option<usize>,
    /// The output head is the embedding table (Llama-3.2 1B/3B).
    pub tie_word_embeddings: bool,
    /// Mixture-of-experts FFNs (after the first `n_dense_layers` blocks); `None`: dense.
    pub moe: Option<MoeArgs>,
    /// Multi-head latent attention (DeepSeek-V2/V3) instead of grouped-query attention; then
    /// `head_dim` is the RoPE part of a head (`qk_rope_head_dim`) and `n_kv_heads = n_heads`.
    pub mla: Option<MlaArgs>,
}

/// Multi-head latent attention (TorchTitan's / transformers' DeepSeek-V3 arguments).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MlaArgs {
    /// Rank of the queries' low-rank projection (`wq_a` → norm → `wq_b`); 0: one `wq`.
    pub q_lora_rank: usize,
    /// Rank of the compressed keys and values (`wkv_a` → norm → `wkv_b`).
    pub kv_lora_rank: usize,
    /// Per head: query/key dimensions without position, with RoPE (shared by the heads' keys),
    /// and value dimensions.
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    /// Factor on the softmax scale `1/sqrt(qk_nope_head_dim + qk_rope_head_dim)` (YaRN's
    /// `mscale²` under DeepSeek-V3's long-context RoPE; 1 otherwise).
    pub softmax_scale: f64,
}

impl MlaArgs {
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// Parameters of one MLA block with `heads` heads on `dim`.
    pub fn params(&self, dim: usize, heads: usize) -> usize {
        let qk = self.qk_head_dim();
        let q = match self.q_lora_rank {
            0 => dim * heads * qk,
            r => dim * r + r + r * heads * qk,
        };
        let kv = dim * (self.kv_lora_rank + self.qk_rope_head_dim)
            + self.kv_lora_rank
            + self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim);
        q + kv + heads * self.v_head_dim * dim
    }
}

/// How router logits become scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ScoreFunc {
    Softmax,
    Sigmoid,
}

/// The mixture-of-experts part of a model (TorchTitan's `MoEArgs`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MoeArgs {
    /// Routed experts per MoE layer.
    pub num_experts: usize,
    /// Experts each token is routed to.
    pub top_k: usize,
    /// Group-limited routing (DeepSeek-V3): the experts form `n_group` equal groups, and a token
    /// chooses its `top_k` only among the `topk_group` groups with the highest sums of their
    /// two best scores. `1, 1`: no limit.
    pub n_group: usize,
    pub topk_group: usize,
    /// Hidden units of one expert (shared experts: this times `num_shared_experts`).
    pub hidden_dim: usize,
    pub num_shared_experts: usize,
    /// The first blocks keep a dense FFN (DeepSeek-V3: 3).
    pub n_dense_layers: usize,
    pub score_func: ScoreFunc,
    /// Normalise the chosen experts' scores to sum to 1.
    pub route_norm: bool,
    pub route_scale: f64,
    /// Aux-loss-free balancing: the bias step per optimizer step (0 disables).
    pub load_balance_coeff: f64,
    /// Weight of DeepSeek-V3's sequence-wise balance loss `α · Σ_e f_e · P_e` (0 disables).
    pub aux_loss_alpha: f64,
}

impl MoeArgs {
    /// Parameters of one MoE FFN: router, routed experts, shared experts, balancing bias.
    pub fn params(&self, dim: usize) -> usize {
        let expert = 3 * dim * self.hidden_dim;
        dim * self.num_experts + expert * (self.num_experts + self.num_shared_experts) + self.num_experts
    }

    /// Of [`Self::params`], those one token uses: router, its `top_k` experts, the shared ones.
    pub fn active_params(&self, dim: usize) -> usize {
        dim * self.num_experts + 3 * dim * self.hidden_dim * (self.top_k + self.num_shared_experts)
    }
}

impl ModelArgs {
    /// A Llama-3 shaped model of `family` (the flavors' starting point): head_dim = dim / heads,
    /// Llama-3's FFN rule, RMSNorm eps 1e-5, RoPE theta 500 000, untied, dense.
    pub fn base(
        family: &'static str,
        dim: usize,
        n_layers: usize,
        n_heads: usize,
        n_kv_heads: usize,
        vocab_size: usize,
    ) -> Self {
        Self {
            family,
            dim,
            n_layers,
            n_heads,
            n_kv_heads,
            head_dim: dim / n_heads,
            qk_norm: false,
            vocab_size,
            multiple_of: 256,
            ffn_dim_multiplier: None,
            norm_eps: 1e-5,
            rope_theta: 500_000.0,
            rope_scaling: None,
            ffn_hidden: None,
            tie_word_embeddings: false,
            moe: None,
            mla: None,
        }
    }

    pub fn with_moe(mut self, m: MoeArgs) -> Self {
        self.moe = Some(m);
        self
    }

    /// Llama-3's FFN sizing: `multiplier` on 2/3 · 4·dim, rounded up to `multiple_of`.
    pub fn ffn(mut self, multiplier: f64, multiple_of: usize) -> Self {
        self.ffn_dim_multiplier = Some(multiplier);
        self.multiple_of = multiple_of;
        self
    }

    /// The Llama-3 flavor `name` (see [`crate::llama3`]); other families through
    /// [`crate::registry`].
    pub fn flavor(name: &str) -> Option<Self> {
        crate::llama3::flavor(name)
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// SwiGLU hidden size as Llama-3 computes it: 2/3 of 4·dim, times the multiplier,
    /// rounded up to `multiple_of`.
    pub fn ffn_hidden_dim(&self) -> usize {
        if let Some(h) = self.ffn_hidden {
            return h;
        }
        let mut hidden = 2 * (4 * self.dim) / 3;
        if let Some(m) = self.ffn_dim_multiplier {
            hidden = (m * hidden as f64) as usize;
        }
        self.multiple_of * hidden.div_ceil(self.multiple_of)
    }

    /// Whether block `layer` has a mixture-of-experts FFN.
    pub fn is_moe_layer(&self, layer: usize) -> bool {
        self.moe.as_ref().is_some_and(|m| layer >= m.n_dense_layers)
    }

    /// Parameters of transformer block `layer` (all of them, or the ones one token uses).
    fn block_params(&self, layer: usize, active: bool) -> usize {
        let (d, hd) = (self.dim, self.head_dim());
        let qk_norm = if self.qk_norm { 2 * hd } else { 0 };
        let attn = match &self.mla {
            Some(mla) => mla.params(d, self.n_heads),
            None => d * self.n_heads * hd * 2 + d * self.n_kv_heads * hd * 2 + qk_norm,
        };
        let ffn = match &self.moe {
            Some(m) if self.is_moe_layer(layer) => {
                if active {
                    m.active_params(d)
                } else {
                    m.params(d)
                }
            }
            _ => 3 * d * self.ffn_hidden_dim(),
        };
        attn + ffn + 2 * d
    }

    /// Parameters of one (dense) transformer block.
    pub fn params_per_layer(&self) -> usize {
        self.block_params(0, false)
    }

    fn count(&self, active: bool) -> usize {
        let heads = if self.tie_word_embeddings { 1 } else { 2 };
        let blocks: usize = (0..self.n_layers).map(|l| self.block_params(l, active)).sum();
        self.vocab_size * self.dim * heads + blocks + self.dim
    }

    /// Analytic parameter count: embedding + blocks + final norm + output head (unless tied).
    pub fn num_params(&self) -> usize {
        self.count(false)
    }

    /// Parameters one token uses: as [`Self::num_params`] with only the router, the `top_k`
    /// routed and the shared experts of each MoE layer (all of them for a dense model).
    pub fn num_active_params(&self) -> usize {
        self.count(true)
    }

    /// Active parameters that take part in matmuls (everything but the embedding lookup; a tied
    /// table is the output head's matmul).
    pub fn num_matmul_params(&self) -> usize {
        if self.tie_word_embeddings {
            self.num_active_params()
        } else {
            self.num_active_params() - self.vocab_size * self.dim
        }
    }

    /// Training FLOPs per token at context length `seq_len`, as TorchTitan counts them:
    /// `6·N_matmul + 12·L·H·d_head·T`, with `N_matmul` the active parameters of an MoE model.
    pub fn flops_per_token(&self, seq_len: usize) -> f64 {
        let hd = self.mla.as_ref().map_or(self.head_dim(), |m| (m.qk_head_dim() + m.v_head_dim) / 2);
        6.0 * self.num_matmul_params() as f64 + 12.0 * (self.n_layers * self.n_heads * hd * seq_len) as f64
    }

    /// Checks the shape is internally consistent; the error names what to change.
    pub fn validate(&self) -> Result<(), String> {
        if self.head_dim == 0 {
            return Err(format!("head_dim is 0 (dim {} with {} heads)", self.dim, self.n_heads));
        }
        if self.n_heads % self.n_kv_heads != 0 {
            return Err(format!("n_heads {} is not divisible by n_kv_heads {}", self.n_heads, self.n_kv_heads));
        }
        if self.head_dim() % 2 != 0 {
            return Err(format!("head_dim {} must be even for RoPE", self.head_dim()));
        }
        if let Some(mla) = &self.mla {
            if self.head_dim != mla.qk_rope_head_dim || self.n_kv_heads != self.n_heads {
                return Err(format!(
                    "multi-head latent attention needs head_dim = qk_rope_head_dim ({} vs {}) and n_kv_heads = n_heads ({} vs {})",
                    self.head_dim, mla.qk_rope_head_dim, self.n_kv_heads, self.n_heads
                ));
            }
            if mla.kv_lora_rank == 0 || mla.qk_nope_head_dim == 0 || mla.v_head_dim == 0 {
                return Err("mla kv_lora_rank, qk_nope_head_dim and v_head_dim must be >= 1".into());
            }
        }
        if let Some(m) = &self.moe {
            if m.num_experts == 0 || m.top_k == 0 || m.top_k > m.num_experts {
                return Err(format!(
                    "moe top_k {} must be between 1 and the number of experts {}",
                    m.top_k, m.num_experts
                ));
            }
            if m.hidden_dim == 0 {
                return Err("moe hidden_dim must be >= 1".into());
            }
            if m.n_group == 0 || m.num_experts % m.n_group != 0 || m.topk_group == 0 || m.topk_group > m.n_group {
                return Err(format!(
                    "moe n_group {} must divide the {} experts and topk_group {} be between 1 and n_group",
                    m.n_group, m.num_experts, m.topk_group
                ));
            }
            if m.top_k > m.topk_group * (m.num_experts / m.n_group) {
                return Err(format!("moe top_k {} exceeds the experts of topk_group {} groups", m.top_k, m.topk_group));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ffn_hidden_dims_match_llama3() {
        let hidden = |f: &str| ModelArgs::flavor(f).unwrap().ffn_hidden_dim();
        assert_eq!(hidden("debugmodel"), 768);
        assert_eq!(hidden("1B"), 8192);
        assert_eq!(hidden("3B"), 8192);
        assert_eq!(hidden("8B"), 14336);
        assert_eq!(hidden("70B"), 28672);
        assert_eq!(hidden("405B"), 53248);
    }

    #[test]
    fn param_counts_match_published_llama3_sizes() {
        let n = |f: &str| ModelArgs::flavor(f).unwrap().num_params();
        // TorchTitan's debugmodel: "about 6.16 M".
        assert_eq!(n("debugmodel"), 6_163_712);
        // Meta's Llama-3.1 checkpoints (untied head): 8B, 70B, 405B.
        assert_eq!(n("8B"), 8_030_261_248);
        assert_eq!(n("70B"), 70_553_706_496);
        assert_eq!(n("405B"), 405_853_388_800);
        // Llama-3.2 1B / 3B are published with tied embeddings: ours are untied,
        // so we carry one more vocab × dim matrix.
        assert_eq!(n("1B") - 128_256 * 2048, 1_235_814_400);
        assert_eq!(n("3B") - 128_256 * 3072, 3_212_749_824);
        let small = n("small");
        assert!((50_000_000..=125_000_000).contains(&small), "small has {small}");
    }

    #[test]
    fn flops_per_token_follow_torchtitan_formula() {
        let a = ModelArgs::flavor("debugmodel").unwrap();
        let expect = 6.0 * (6_163_712.0 - 2048.0 * 256.0) + 12.0 * 6.0 * 16.0 * 16.0 * 256.0;
        assert_eq!(a.flops_per_token(256), expect);
    }

    const QWEN3_COUNTS: &[(&str, usize)] = &[
        ("0.6B", 596_049_920),
        ("1.7B", 1_720_574_976),
        ("4B", 4_022_468_096),
        ("8B", 8_190_735_360),
        ("14B", 14_768_307_200),
        ("32B", 32_762_123_264),
        ("30B-A3B", 30_532_122_624),
        ("235B-A22B", 235_093_634_560),
    ];

    #[test]
    fn qwen3_param_counts_match_transformers() {
        // transformers 5.25 on the meta device (scripts/family_fixtures.py --counts): the published
        // configs. Ours carry the MoE balancing bias too (experts per MoE layer).
        let n = |f: &str| {
            let a = crate::qwen3::flavor(f).unwrap();
            a.num_params() - a.moe.as_ref().map_or(0, |m| m.num_experts * a.n_layers)
        };
        for (f, want) in QWEN3_COUNTS {
            assert_eq!(n(f), *want, "{f}");
        }
        // DeepSeek-V3 (transformers 5.25, meta device, no multi-token prediction): 671 026 404 352
        // parameters and a 14 848-value correction-bias buffer, which ours counts as parameters.
        assert_eq!(crate::deepseek_v3::flavor("671B").unwrap().num_params(), 671_026_404_352 + 14_848);
    }
}
