//! The decoder every family shares: embedding → N × (attention + SwiGLU FFN or MoE, pre-norm)
//! → norm → output head. What differs between families is a field of [`ModelArgs`]: the head
//! width, Qwen3's per-head QK-norm, DeepSeek's latent attention ([`crate::mla`]), the experts.
//!
//! Plain model code, no communication. Parameter paths follow TorchTitan
//! (`tok_embeddings.weight`, `layers.3.attention.wq.weight`, `norm.weight`, `output.weight`).

use crate::args::ModelArgs;
use crate::axes::{LogicalAxis, ParamSpec};
use crate::checkpoint::{Checkpointing, Tape};
use crate::hooks::Hooks;
use crate::layers::{Embedding, Linear, RmsNorm};
use crate::mla::Mla;
use crate::moe::MoE;
use crate::positions::{Documents, Positions};
use crate::rope::RopeScaling;
use burn::module::{ModuleVisitor, Param};
use burn::prelude::*;
use burn::tensor::{DType, Gradients};
use std::ops::Range;
use titan_kernels::backward_boundary;
use titan_profiling::Boundary;

const INIT_STD: f64 = 0.02;

#[derive(Module, Debug)]
pub struct Attention {
    pub wq: Linear,
    pub wk: Linear,
    pub wv: Linear,
    pub wo: Linear,
    /// Qwen3: RMSNorm over each query / key head (`[head_dim]` weights) before RoPE.
    pub q_norm: Option<RmsNorm>,
    pub k_norm: Option<RmsNorm>,
    pub head_dim: usize,
    /// Use the fused kernel (`titan_kernels`) where the device has it.
    pub fused: bool,
}

impl Attention {
    fn new(a: &ModelArgs, seed: u64, path: &str, out_std: f64, device: &Device) -> Self {
        let hd = a.head_dim();
        let p = |n: &str| format!("{path}.{n}");
        Self {
            wq: Linear::new(seed, &p("wq"), a.dim, a.n_heads * hd, INIT_STD, device),
            wk: Linear::new(seed, &p("wk"), a.dim, a.n_kv_heads * hd, INIT_STD, device),
            wv: Linear::new(seed, &p("wv"), a.dim, a.n_kv_heads * hd, INIT_STD, device),
            wo: Linear::new(seed, &p("wo"), a.n_heads * hd, a.dim, out_std, device),
            q_norm: a.qk_norm.then(|| RmsNorm::new(seed, &p("q_norm"), hd, a.norm_eps, device)),
            k_norm: a.qk_norm.then(|| RmsNorm::new(seed, &p("k_norm"), hd, a.norm_eps, device)),
            head_dim: hd,
            fused: true,
        }
    }

    /// Head counts come from the projections' output widths, so a rank holding a slice of the
    /// heads (tensor parallelism) runs the same code on its heads.
    pub fn forward(&self, x: Tensor<3>, pos: &Positions, hooks: &Hooks) -> Tensor<3> {
        let x = hooks.column_input(x);
        let [b, t, _] = x.dims();
        let hd = self.head_dim;
        let heads = |y: Tensor<3>| {
            let n = y.dims()[2] / hd;
            y.reshape([b, t, n, hd]).swap_dims(1, 2)
        };
        // Per-head norm over the last dim, on `[b·t, heads, hd]` (before the heads move forward).
        let head_norm = |y: Tensor<3>, norm: &Option<RmsNorm>| match norm {
            Some(norm) => {
                let n = y.dims()[2] / hd;
                norm.forward(y.reshape([b * t, n, hd])).reshape([b, t, n * hd])
            }
            None => y,
        };
        let q = pos.rope.apply(heads(head_norm(self.wq.forward(x.clone()), &self.q_norm)));
        let k = pos.rope.apply(heads(head_norm(self.wk.forward(x.clone()), &self.k_norm)));
        let v = heads(self.wv.forward(x));
        let nh = q.dims()[1];
        let o = hooks.attention(q, k, v, pos.doc_starts.clone(), self.fused);
        hooks.row_output(self.wo.forward(o.swap_dims(1, 2).reshape([b, t, nh * hd])))
    }
}

/// SwiGLU: `w2(silu(w1 x) · w3 x)`.
#[derive(Module, Debug)]
pub struct FeedForward {
    pub w1: Linear,
    pub w2: Linear,
    pub w3: Linear,
    /// Use the fused `silu · mul` kernel where the device has one.
    pub fused: bool,
}

impl FeedForward {
    fn new(a: &ModelArgs, seed: u64, path: &str, out_std: f64, device: &Device) -> Self {
        let h = a.ffn_hidden_dim();
        let p = |n: &str| format!("{path}.{n}");
        Self {
            w1: Linear::new(seed, &p("w1"), a.dim, h, INIT_STD, device),
            w2: Linear::new(seed, &p("w2"), h, a.dim, out_std, device),
            w3: Linear::new(seed, &p("w3"), a.dim, h, out_std, device),
            fused: true,
        }
    }

    pub fn forward(&self, x: Tensor<3>, hooks: &Hooks) -> Tensor<3> {
        let x = hooks.column_input(x);
        let gate = titan_kernels::silu_mul(self.w1.forward(x.clone()), self.w3.forward(x), self.fused);
        hooks.row_output(self.w2.forward(gate))
    }
}

#[derive(Module, Debug)]
pub struct TransformerBlock {
    pub attention_norm: RmsNorm,
    /// Grouped-query attention, or (DeepSeek) `None` and `mla`.
    pub attention: Option<Attention>,
    pub mla: Option<Mla>,
    pub ffn_norm: RmsNorm,
    /// The dense FFN, or (MoE models after their dense layers) `None` and `moe`.
    pub feed_forward: Option<FeedForward>,
    pub moe: Option<MoE>,
}

impl TransformerBlock {
    fn new(a: &ModelArgs, seed: u64, layer: usize, device: &Device) -> Self {
        let path = format!("layers.{layer}");
        // TorchTitan's depth init: output projections get std 0.02 / sqrt(2·(layer+1)).
        let out_std = INIT_STD / (2.0 * (layer + 1) as f64).sqrt();
        Self {
            attention_norm: RmsNorm::new(seed, &format!("{path}.attention_norm"), a.dim, a.norm_eps, device),
            attention: a.mla.is_none().then(|| Attention::new(a, seed, &format!("{path}.attention"), out_std, device)),
            mla: a.mla.as_ref().map(|m| Mla::new(a, m, seed, &format!("{path}.mla"), INIT_STD, out_std, device)),
            ffn_norm: RmsNorm::new(seed, &format!("{path}.ffn_norm"), a.dim, a.norm_eps, device),
            feed_forward: (!a.is_moe_layer(layer))
                .then(|| FeedForward::new(a, seed, &format!("{path}.feed_forward"), out_std, device)),
            moe: a
                .moe
                .as_ref()
                .filter(|_| a.is_moe_layer(layer))
                .map(|m| MoE::new(a, m, seed, &format!("{path}.moe"), out_std, device)),
        }
    }

    pub fn forward(&self, x: Tensor<3>, pos: &Positions, hooks: &Hooks) -> Tensor<3> {
        let n = self.attention_norm.forward(x.clone());
        let h = x + match (&self.attention, &self.mla) {
            (Some(a), _) => a.forward(n, pos, hooks),
            (None, Some(m)) => m.forward(n, pos, hooks),
            (None, None) => unreachable!("a block has grouped-query or latent attention"),
        };
        let n = self.ffn_norm.forward(h.clone());
        let ffn = match (&self.feed_forward, &self.moe) {
            (Some(f), _) => f.forward(n, hooks),
            (None, Some(m)) => m.forward(n, hooks),
            (None, None) => unreachable!("a block has a dense or an MoE FFN"),
        };
        h + ffn
    }
}

/// The whole model, or one pipeline stage of it: the embedding only on the first stage, the
/// final norm and output head only on the last (as TorchTitan's pipeline split leaves them).
#[derive(Module, Debug)]
pub struct Transformer {
    pub tok_embeddings: Option<Embedding>,
    pub layers: Vec<TransformerBlock>,
    pub norm: Option<RmsNorm>,
    pub output: Option<Linear>,
    pub rope_theta: f64,
    #[module(skip)]
    pub rope_scaling: Option<RopeScaling>,
    /// The output head is the embedding table (`output` is `None`; the whole model only).
    #[module(skip)]
    pub tie_word_embeddings: bool,
    pub head_dim: usize,
    /// Use the fused RMSNorm, SwiGLU and RoPE kernels where the device has them (GPUs).
    pub fused_kernels: bool,
    /// Mixed precision: the float type activations are computed in (parameters stay float32
    /// masters, cast on use; logits come out float32). `None`: the parameters' type.
    #[module(skip)]
    pub compute_dtype: Option<DType>,
    /// Where a parallelism moves activations (none for the plain model).
    #[module(skip)]
    pub hooks: Hooks,
    /// The global index of `layers[0]` (a pipeline stage holds a range of the model's blocks);
    /// names the blocks in step traces.
    #[module(skip)]
    pub first_layer: usize,
    /// The model has mixture-of-experts layers (this stage may hold none of them).
    #[module(skip)]
    pub moe_enabled: bool,
}

impl Transformer {
    /// Builds the model lazily: no parameter memory is allocated until a value is used, so the
    /// big flavors can be built for counting and planning.
    pub fn new(a: &ModelArgs, seed: u64, device: &Device) -> Self {
        Self::stage(a, seed, device, 0..a.n_layers, true, true)
    }

    /// One pipeline stage: the blocks `layers` (global indices, so their parameters are
    /// initialised exactly as in the whole model), with the embedding when `first` and the final
    /// norm and output head when `last`.
    pub fn stage(a: &ModelArgs, seed: u64, device: &Device, layers: Range<usize>, first: bool, last: bool) -> Self {
        Self {
            tok_embeddings: first.then(|| Embedding::new(seed, "tok_embeddings", a.vocab_size, a.dim, device)),
            first_layer: layers.start,
            layers: layers.map(|l| TransformerBlock::new(a, seed, l, device)).collect(),
            norm: last.then(|| RmsNorm::new(seed, "norm", a.dim, a.norm_eps, device)),
            output: (last && !a.tie_word_embeddings)
                .then(|| Linear::new(seed, "output", a.dim, a.vocab_size, (a.dim as f64).powf(-0.5), device)),
            rope_theta: a.rope_theta,
            rope_scaling: a.rope_scaling,
            tie_word_embeddings: a.tie_word_embeddings,
            head_dim: a.head_dim(),
            fused_kernels: true,
            compute_dtype: None,
            hooks: Hooks::default(),
            moe_enabled: a.moe.is_some(),
        }
    }

    /// Chooses the fused attention kernel (default) or Burn's composed ops (the reference).
    pub fn with_fused_attention(mut self, fused: bool) -> Self {
        for l in &mut self.layers {
            if let Some(a) = &mut l.attention {
                a.fused = fused;
            }
            if let Some(m) = &mut l.mla {
                m.fused = fused;
            }
        }
        self
    }

    /// Chooses the fused RMSNorm, SwiGLU, RoPE and linear kernels where the device has them
    /// (default) or Burn's composed ops.
    pub fn with_fused_kernels(mut self, fused: bool) -> Self {
        self.fused_kernels = fused;
        for l in &mut self.layers {
            l.attention_norm.fused = fused;
            l.ffn_norm.fused = fused;
            if let Some(a) = &mut l.attention {
                for linear in [&mut a.wq, &mut a.wk, &mut a.wv, &mut a.wo] {
                    linear.fused = fused;
                }
                for norm in [&mut a.q_norm, &mut a.k_norm].into_iter().flatten() {
                    norm.fused = fused;
                }
            }
            if let Some(m) = &mut l.mla {
                m.set_fused(fused);
            }
            if let Some(f) = &mut l.feed_forward {
                f.fused = fused;
                for linear in [&mut f.w1, &mut f.w2, &mut f.w3] {
                    linear.fused = fused;
                }
            }
            l.moe = l.moe.take().map(|m| m.with_fused(fused));
        }
        if let Some(n) = &mut self.norm {
            n.fused = fused;
        }
        if let Some(o) = &mut self.output {
            o.fused = fused;
        }
        self
    }

    /// Computes activations in `dtype` (mixed precision), `None` for the parameters' type.
    pub fn with_compute_dtype(mut self, dtype: Option<DType>) -> Self {
        self.compute_dtype = dtype;
        self
    }

    /// Installs a parallelism's activation hooks.
    pub fn with_hooks(mut self, hooks: Hooks) -> Self {
        self.hooks = hooks;
        self
    }

    /// Token ids `[B, T]` → logits `[B, T, vocab]` (under tensor parallelism, this rank's slice
    /// of the vocabulary: the full logits are never formed). The whole model only.
    pub fn forward(&self, tokens: Tensor<2, Int>) -> Tensor<3> {
        let t = tokens.dims()[1];
        self.forward_stage(StageInput::Tokens(tokens), t, None)
    }

    /// This stage's part of the forward pass for sequences of `seq_len` positions: token ids on
    /// the first stage, hidden states `[B, T', dim]` after it; logits out of the last stage,
    /// hidden states out of the others. With `docs`, attention is block-causal over the packed
    /// documents (see [`crate::positions`]).
    pub fn forward_stage(&self, input: StageInput, seq_len: usize, docs: Option<&Documents>) -> Tensor<3> {
        self.forward_stage_checkpointed(input, seq_len, docs, Checkpointing::None).0
    }

    /// [`Self::forward_stage`] with the blocks `ac` covers checkpointed: they keep only their
    /// input, and [`Self::backward_stage`] with the returned tape recomputes them. Without
    /// autodiff nothing is kept anyway and no block is checkpointed.
    pub fn forward_stage_checkpointed(
        &self,
        input: StageInput,
        seq_len: usize,
        docs: Option<&Documents>,
        ac: Checkpointing,
    ) -> (Tensor<3>, Tape) {
        let mut h = match (input, &self.tok_embeddings) {
            (StageInput::Tokens(ids), Some(e)) => self.hooks.embed(e.weight.val(), ids),
            (StageInput::Hidden(h), None) => h,
            _ => panic!("token ids go to the stage with the embedding, hidden states to the others"),
        };
        if let Some(dtype) = self.compute_dtype {
            h = h.cast(dtype);
        }
        let mut pos =
            Positions::new(self.rope_theta, self.rope_scaling.as_ref(), self.head_dim, seq_len, docs, &h.device());
        pos.rope.fused = self.fused_kernels;
        let mut tape = Tape::new();
        let autodiff = h.device().is_autodiff();
        for (i, layer) in self.layers.iter().enumerate() {
            h = if autodiff && ac.covers(self.first_layer + i) {
                tape.checkpoint(i, h, &pos, |x, pos| {
                    let layer = layer.valid();
                    traced(|| self.block_name(i), x, |x| layer.forward(x, pos, &self.hooks))
                })
            } else {
                traced(|| self.block_name(i), h, |h| layer.forward(h, &pos, &self.hooks))
            };
        }
        let out = match (&self.norm, &self.output, &self.tok_embeddings) {
            // Logits in float32 for the loss, whatever the compute type.
            (Some(norm), Some(output), _) => traced(
                || "output".into(),
                h,
                |h| output.forward(self.hooks.column_input(norm.forward(h))).cast(burn::tensor::FloatDType::F32),
            ),
            // Tied: logits = h · Eᵀ (under TP, this rank's vocabulary rows of E: its logits slice).
            (Some(norm), None, Some(e)) if self.tie_word_embeddings => traced(
                || "output".into(),
                h,
                |h| {
                    let x = self.hooks.column_input(norm.forward(h));
                    let w = e.weight.val().cast(x.dtype()).transpose().unsqueeze::<3>();
                    x.matmul(w).cast(burn::tensor::FloatDType::F32)
                },
            ),
            _ => h,
        };
        (out, tape)
    }

    /// The backward pass of this stage from `root` (the loss, or `(y · dy).sum()` of the stage
    /// output), recomputing the checkpointed blocks of `tape` (see [`crate::checkpoint`]). Every
    /// pass but the last hands its gradients to `each`; the last pass's gradients are returned
    /// (they hold the stage input's gradient).
    pub fn backward_stage(&self, root: Tensor<1>, tape: Tape, each: impl FnMut(Gradients)) -> Gradients {
        let recompute = |i: usize, x: Tensor<3>, pos: &Positions| {
            let _span = titan_profiling::span_with(|| format!("{}.recompute", self.block_name(i)), "backward");
            traced(|| self.block_name(i), x, |x| self.layers[i].forward(x, pos, &self.hooks))
        };
        tape.backward(root, recompute, each)
    }

    /// The name of local block `block` in step traces (its global index).
    fn block_name(&self, block: usize) -> String {
        format!("layers.{}", self.first_layer + block)
    }

    /// The MoE layers of this stage with their global indices.
    pub fn moe_layers(&self) -> impl Iterator<Item = (usize, &MoE)> {
        self.layers.iter().enumerate().filter_map(|(i, l)| l.moe.as_ref().map(|m| (self.first_layer + i, m)))
    }

    /// Every parameter with its module path, shape and logical axes, in visiting order.
    pub fn param_specs(&self) -> Vec<ParamSpec> {
        let mut v = SpecCollector::default();
        self.visit(&mut v);
        v.out
    }
}

/// `f(x)` as the part `name` of the model in step traces: a `{name}.forward` span, and (through
/// gradient markers on its input and output) a `{name}.backward` span. Without a recording
/// this is `f(x)`.
fn traced(name: impl FnOnce() -> String, x: Tensor<3>, f: impl FnOnce(Tensor<3>) -> Tensor<3>) -> Tensor<3> {
    if !titan_profiling::is_active() {
        return f(x);
    }
    let name = name();
    let backward = format!("{name}.backward");
    let _span = titan_profiling::span(format!("{name}.forward"), "forward");
    let x = backward_boundary(x, &backward, Boundary::End);
    backward_boundary(f(x), &backward, Boundary::Begin)
}

/// What a pipeline stage receives.
pub enum StageInput {
    Tokens(Tensor<2, Int>),
    Hidden(Tensor<3>),
}

/// The logical axes of a parameter, from the last components of its path. Linear weights are
/// stored `[d_in, d_out]`.
pub fn logical_axes(path: &str) -> Option<Vec<LogicalAxis>> {
    use LogicalAxis::*;
    let mut parts = path.rsplit('.');
    let (last, owner) = (parts.next()?, parts.next()?);
    // Mixture-of-experts parameters: the experts' own axes, never split by tensor parallelism
    // (the MoE FFN runs on the tokens this rank holds).
    match (owner, last) {
        ("experts", "w1" | "w3") => return Some(vec![Experts, Embed, ExpertMlp]),
        ("experts", "w2") => return Some(vec![Experts, ExpertMlp, Embed]),
        ("moe", "expert_bias") => return Some(vec![Experts]),
        ("gate", "weight") => return Some(vec![Embed, Experts]),
        ("w1" | "w3", "weight") if path.contains(".shared_experts.") => return Some(vec![Embed, ExpertMlp]),
        ("w2", "weight") if path.contains(".shared_experts.") => return Some(vec![ExpertMlp, Embed]),
        _ => {}
    }
    if last != "weight" {
        return None;
    }
    Some(match owner {
        "tok_embeddings" => vec![Vocab, Embed],
        "output" => vec![Embed, Vocab],
        "wq" => vec![Embed, Heads],
        "wk" | "wv" => vec![Embed, KvHeads],
        "wo" => vec![Heads, Embed],
        "w1" | "w3" => vec![Embed, Mlp],
        "w2" => vec![Mlp, Embed],
        "norm" | "attention_norm" | "ffn_norm" => vec![Embed],
        "q_norm" | "k_norm" => vec![HeadDim],
        // Latent attention: the low-rank path is replicated, its outputs split by heads.
        "wq_a" | "wkv_a" => vec![Embed, Latent],
        "q_a_norm" | "kv_a_norm" => vec![Latent],
        "wq_b" | "wkv_b" => vec![Latent, Heads],
        _ => return None,
    })
}

#[derive(Default)]
struct SpecCollector {
    path: Vec<String>,
    out: Vec<ParamSpec>,
}

impl ModuleVisitor for SpecCollector {
    crate::track_module_path!();
    fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
        let path = self.path.join(".");
        let axes = logical_axes(&path).unwrap_or_else(|| panic!("parameter {path} declares no logical axes"));
        self.out.push(ParamSpec { path, shape: p.lazy_shape().to_vec(), axes });
    }
}
