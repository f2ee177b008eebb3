//! Model hyper-parameters, the named flavors, and the analytic parameter / FLOP counts.

use crate::rope::RopeScaling;
use serde::Serialize;

/// Hyper-parameters of a Llama-3 model (TorchTitan's `TransformerModelArgs`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelArgs {
    pub dim: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
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
}

/// Flavor names accepted by `model.flavor`.
pub const FLAVORS: &[&str] = &["tiny", "debugmodel", "small", "1B", "3B", "8B", "70B", "405B"];

impl ModelArgs {
    fn base(dim: usize, n_layers: usize, n_heads: usize, n_kv_heads: usize, vocab_size: usize) -> Self {
        Self {
            dim,
            n_layers,
            n_heads,
            n_kv_heads,
            vocab_size,
            multiple_of: 256,
            ffn_dim_multiplier: None,
            norm_eps: 1e-5,
            rope_theta: 500_000.0,
            rope_scaling: None,
            ffn_hidden: None,
            tie_word_embeddings: false,
        }
    }

    fn ffn(mut self, multiplier: f64, multiple_of: usize) -> Self {
        self.ffn_dim_multiplier = Some(multiplier);
        self.multiple_of = multiple_of;
        self
    }

    /// The named flavor, or `None` if the name is unknown (see [`FLAVORS`]).
    ///
    /// * `tiny`: a 2-layer model for fast tests (not in TorchTitan).
    /// * `debugmodel`: TorchTitan's debug model (dim 256, 6 layers, 16 heads, vocab 2048).
    /// * `small`: dim 768, 12 layers, 12 heads, 4 kv heads, vocab 2048 (≈ 78.7 M parameters),
    ///   sized for the shipped 2 048-token tokenizer.
    /// * `1B` … `405B`: Llama-3.x shapes with the Llama-3 vocabulary (128 256) and an untied head.
    pub fn flavor(name: &str) -> Option<Self> {
        const LLAMA3_VOCAB: usize = 128_256;
        Some(match name {
            "tiny" => Self::base(64, 2, 4, 2, 2048),
            "debugmodel" => Self::base(256, 6, 16, 16, 2048),
            "small" => Self::base(768, 12, 12, 4, 2048),
            "1B" => Self::base(2048, 16, 32, 8, LLAMA3_VOCAB).ffn(1.5, 256),
            "3B" => Self::base(3072, 28, 24, 8, LLAMA3_VOCAB).ffn(1.0, 256),
            "8B" => Self::base(4096, 32, 32, 8, LLAMA3_VOCAB).ffn(1.3, 1024),
            "70B" => Self::base(8192, 80, 64, 8, LLAMA3_VOCAB).ffn(1.3, 4096),
            "405B" => Self::base(16384, 126, 128, 8, LLAMA3_VOCAB).ffn(1.2, 4096),
            _ => return None,
        })
    }

    pub fn head_dim(&self) -> usize {
        self.dim / self.n_heads
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

    /// Parameters of one transformer block.
    pub fn params_per_layer(&self) -> usize {
        let (d, hd) = (self.dim, self.head_dim());
        let attn = d * self.n_heads * hd * 2 + d * self.n_kv_heads * hd * 2;
        let ffn = 3 * d * self.ffn_hidden_dim();
        attn + ffn + 2 * d
    }

    /// Analytic parameter count: embedding + blocks + final norm + output head (unless tied).
    pub fn num_params(&self) -> usize {
        let heads = if self.tie_word_embeddings { 1 } else { 2 };
        self.vocab_size * self.dim * heads + self.n_layers * self.params_per_layer() + self.dim
    }

    /// Parameters that take part in matmuls (everything but the embedding lookup; a tied table
    /// is the output head's matmul).
    pub fn num_matmul_params(&self) -> usize {
        if self.tie_word_embeddings {
            self.num_params()
        } else {
            self.num_params() - self.vocab_size * self.dim
        }
    }

    /// Training FLOPs per token at context length `seq_len`, as TorchTitan counts them:
    /// `6·N_matmul + 12·L·H·d_head·T`.
    pub fn flops_per_token(&self, seq_len: usize) -> f64 {
        6.0 * self.num_matmul_params() as f64 + 12.0 * (self.n_layers * self.n_heads * self.head_dim() * seq_len) as f64
    }

    /// Checks the shape is internally consistent; the error names what to change.
    pub fn validate(&self) -> Result<(), String> {
        if self.dim % self.n_heads != 0 {
            return Err(format!("dim {} is not divisible by n_heads {}", self.dim, self.n_heads));
        }
        if self.n_heads % self.n_kv_heads != 0 {
            return Err(format!("n_heads {} is not divisible by n_kv_heads {}", self.n_heads, self.n_kv_heads));
        }
        if self.head_dim() % 2 != 0 {
            return Err(format!("head_dim {} must be even for RoPE", self.head_dim()));
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

    #[test]
    fn every_flavor_is_consistent() {
        for f in FLAVORS {
            ModelArgs::flavor(f).unwrap().validate().unwrap();
        }
        assert!(ModelArgs::flavor("9B").is_none());
    }
}
