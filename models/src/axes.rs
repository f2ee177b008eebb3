//! Logical axes: how each parameter dimension may be sharded.
//!
//! The model only *declares* axes; the parallelisms (FSDP, TP, …) decide what to do with them,
//! as TorchTitan's `parallelize_*` functions do.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LogicalAxis {
    /// Vocabulary entries (embedding rows, output-head columns).
    Vocab,
    /// The model (residual stream) dimension.
    Embed,
    /// Query heads × head_dim.
    Heads,
    /// Key/value heads × head_dim (grouped-query attention).
    KvHeads,
    /// Within one attention head (Qwen3's QK-norm weights): never split; under tensor
    /// parallelism each rank applies the weight to its heads, so its gradient is partial.
    HeadDim,
    /// The low-rank latent of multi-head latent attention (and, in `wkv_a`, the shared RoPE
    /// key): never split; under tensor parallelism only this rank's heads read it, so its
    /// gradients are partial.
    Latent,
    /// The SwiGLU hidden dimension.
    Mlp,
    /// The expert index of a mixture-of-experts layer (split by expert parallelism).
    Experts,
    /// Hidden units inside an expert (routed or shared; not split by tensor parallelism).
    ExpertMlp,
}

impl fmt::Display for LogicalAxis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            LogicalAxis::Vocab => "vocab",
            LogicalAxis::Embed => "embed",
            LogicalAxis::Heads => "heads",
            LogicalAxis::KvHeads => "kv_heads",
            LogicalAxis::HeadDim => "head_dim",
            LogicalAxis::Latent => "latent",
            LogicalAxis::Mlp => "mlp",
            LogicalAxis::Experts => "experts",
            LogicalAxis::ExpertMlp => "expert_mlp",
        };
        f.write_str(s)
    }
}

/// One parameter as the outside world sees it: module path, shape and logical axes.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSpec {
    pub path: String,
    pub shape: Vec<usize>,
    pub axes: Vec<LogicalAxis>,
}

impl fmt::Display for ParamSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let axes: Vec<String> = self.axes.iter().map(|a| a.to_string()).collect();
        write!(f, "{} {:?} [{}]", self.path, self.shape, axes.join(", "))
    }
}
