//! The memory plan of one rank, from the config alone (nothing is allocated): what the rank
//! holds at the peak of a training step, term by term.
//!
//! * Parameters, gradients, AdamW moments: this rank's pipeline stages, its TP slice, its FSDP
//!   rows; float32 (masters stay float32 under mixed precision).
//! * FSDP-gathered parameters: each read of a sharded parameter all-gathers it. Without reshard
//!   after forward a block's gathered weights stay alive from its forward to its backward unless
//!   the block is checkpointed (then only the block being recomputed holds them); with it only
//!   the token embedding's (Burn's embedding op keeps its weight) stay, and backward holds one
//!   block's gathered weights at a time (in the backward working set). The compute-type copy a
//!   linear keeps of its weight under mixed precision is kept either way.
//! * Activations: what autodiff keeps for backward, per block and per microbatch (below), times
//!   the microbatches a rank holds at once under its pipeline schedule.
//! * Backward working set: the logits' gradient on the last stage, one block's activation
//!   gradients, and with checkpointing the block being recomputed.
//! * Communication buffers: the gradient reduction's host copies (data parallel), the
//!   tensor-parallel activation collectives and the pipeline's send/receive buffers.
//! * Kernel workspace: the attention kernel's per-thread score tiles and the CPU GEMM's packed
//!   panels.
//!
//! What autodiff keeps per block and token (elements of the compute type; `d` model width,
//! `q`/`kv` the rank's query/key-value width, `f` its FFN width, `h` its heads): the block input
//! and the residual after attention (`2d`, over `tp` under sequence parallelism), the two norm
//! outputs the projections read (`2d`), RoPE'd queries and keys and the values (`q + 2kv`, the
//! attention kernel's saved inputs), the attention output twice (the kernel's copy and the
//! contiguous copy `wo` reads, `2q`), the FFN's gate, up and `silu · mul` (`3f`), plus the
//! attention's log-sum-exp (`h`, float32). A checkpointed block keeps its input only. The last
//! stage keeps the final norm's input and output (`2d`) and float32 logits (`vocab / tp`).

use crate::config::{JobConfig, RotateMethod};
use crate::rank::parallelize::{ep_split_dim, tp_split_dim};
use crate::rank::pipeline::RankLayout;
use anyhow::{anyhow, Result};
use burn::prelude::*;
use titan_models::{Checkpointing, ModelArgs};
use titan_parallel::pp::schedule::{peak_in_flight, rank_actions};
use titan_parallel::ParallelDims;

/// One rank's planned bytes at the peak of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RankMemory {
    pub params: u64,
    pub grads: u64,
    pub optimizer: u64,
    /// FSDP: gathered full parameters alive at the peak.
    pub gathered: u64,
    /// Saved for backward, all microbatches the rank holds at once.
    pub activations: u64,
    /// Microbatch-stages whose activations are held at once (pipeline schedule).
    pub microbatches_alive: usize,
    /// One microbatch's saved activations of one block without checkpointing.
    pub per_layer: u64,
    pub backward_working_set: u64,
    /// Collective buffers during forward and backward (TP, PP, FSDP gathers).
    pub comm_buffers: u64,
    /// The data-parallel gradient reduction's buffers, after backward.
    pub reduction_buffers: u64,
    pub workspace: u64,
}

impl RankMemory {
    /// Parameters, gradients and optimizer state: held for the whole run.
    pub fn state(&self) -> u64 {
        self.params + self.grads + self.optimizer
    }

    /// The peak: the state, plus the larger of the forward/backward phase and the gradient
    /// reduction that follows it (activations are freed by then).
    pub fn total(&self) -> u64 {
        let compute = self.gathered + self.activations + self.backward_working_set + self.comm_buffers + self.workspace;
        self.state() + compute.max(self.reduction_buffers)
    }
}

/// Element counts of the model as one rank of the mesh sees it.
struct Widths {
    d: u64,
    q: u64,
    kv: u64,
    f: u64,
    heads: u64,
    vocab: u64,
    /// Qwen3's QK-norm: the normed queries and keys kept next to the projections.
    qk_norm: u64,
    /// Positions of the residual stream per position of the sequence (`1/tp` under SP).
    residual_share: f64,
    /// A mixture-of-experts FFN's activations per token (all kept / kept under op-level AC):
    /// the router scores, each of the `top_k` dispatched copies of the token (its gathered row,
    /// the two expert projections, their `silu · mul`, the expert output) and the shared experts.
    moe: Option<(u64, u64)>,
}

impl Widths {
    fn new(a: &ModelArgs, tp: u64, sp: bool) -> Self {
        // Latent attention: every head's query and key are qk wide, its value padded to them.
        let hd = a.mla.as_ref().map_or(a.head_dim(), |m| m.qk_head_dim().max(m.v_head_dim)) as u64;
        let kv_heads = if a.mla.is_some() { a.n_heads } else { a.n_kv_heads } as u64;
        Self {
            d: a.dim as u64,
            q: a.n_heads as u64 / tp * hd,
            kv: (kv_heads / tp).max(1) * hd,
            f: (a.ffn_hidden_dim() as u64).div_ceil(tp),
            heads: a.n_heads as u64 / tp,
            qk_norm: if a.qk_norm { (a.n_heads as u64 / tp + (a.n_kv_heads as u64 / tp).max(1)) * hd } else { 0 },
            vocab: (a.vocab_size as u64).div_ceil(tp),
            residual_share: if sp && tp > 1 { 1.0 / tp as f64 } else { 1.0 },
            moe: a.moe.as_ref().map(|m| {
                let (k, h, d) = (m.top_k as u64, m.hidden_dim as u64, a.dim as u64);
                let shared = (m.num_shared_experts * m.hidden_dim) as u64;
                let e = m.num_experts as u64;
                (3 * e + k * (2 * d + 3 * h) + 3 * shared, k * (d + 2 * h) + 2 * shared + e)
            }),
        }
    }

    /// Per-token FFN activations of block `layer` (all kept, or kept under op-level AC).
    fn ffn(&self, a: &ModelArgs, layer: usize, ops: bool) -> u64 {
        match self.moe {
            Some((all, kept)) if a.is_moe_layer(layer) => {
                if ops {
                    kept
                } else {
                    all
                }
            }
            _ => (if ops { 2 } else { 3 }) * self.f,
        }
    }

    /// Bytes block `layer` keeps per token without checkpointing.
    fn block(&self, a: &ModelArgs, layer: usize, elem: u64) -> f64 {
        let residual = 2.0 * self.d as f64 * self.residual_share;
        let full = 2 * self.d + self.q + 2 * self.kv + 2 * self.q + self.qk_norm + self.ffn(a, layer, false);
        (residual + full as f64) * elem as f64 + 4.0 * self.heads as f64
    }

    /// Bytes a block keeps per token under op-level selective checkpointing: the outputs of its
    /// compute-bound ops — the q, k, v projections, the attention output (and its log-sum-exp),
    /// the `wo` and `w2` outputs, the FFN's gate and up projections; norms, RoPE, `silu · mul`,
    /// the residual adds and copies are recomputed.
    fn ops(&self, a: &ModelArgs, layer: usize, elem: u64) -> f64 {
        let kept = self.q + 2 * self.kv + self.q + self.ffn(a, layer, true);
        (kept as f64 + 2.0 * self.d as f64 * self.residual_share) * elem as f64 + 4.0 * self.heads as f64
    }

    /// Bytes a checkpointed block keeps per token: its input.
    fn checkpointed(&self, elem: u64) -> f64 {
        self.d as f64 * self.residual_share * elem as f64
    }

    /// Bytes the last stage keeps per token: final norm input and output, float32 logits.
    fn head(&self, elem: u64) -> f64 {
        (self.d as f64 * self.residual_share + self.d as f64) * elem as f64 + 4.0 * self.vocab as f64
    }
}

/// The plan of pipeline rank `pp_rank` of the mesh `dims`.
pub fn rank_memory(cfg: &JobConfig, args: &ModelArgs, dims: &ParallelDims, pp_rank: usize) -> Result<RankMemory> {
    let p = &cfg.parallelism;
    let local_batch = cfg.training.local_batch_size.max(1);
    let layout = RankLayout::new(p, args, local_batch, pp_rank).map_err(|e| anyhow!(e))?;
    let ac = cfg.activation_checkpoint.policy().map_err(|e| anyhow!(e))?;
    let (tp, dp) = (dims.tp.max(1) as u64, dims.dp_replicate.max(1) as u64);
    // Context-parallel ranks shard the weights with the shard group, and hold 1/cp of each
    // sequence.
    let (shard, cp) = (dims.fsdp_size().max(1) as u64, dims.cp.max(1));
    // Expert parallelism: the routed experts split over ep ranks, sharded over the rest.
    let (ep, expert_shard) = (dims.ep.max(1) as u64, dims.efsdp_size().max(1) as u64);
    let elem = cfg.training.mixed_precision_param.bytes();
    let w = Widths::new(args, tp, p.enable_sequence_parallel);
    let tokens = (local_batch / layout.microbatches * cfg.training.seq_len / cp) as f64;

    // Lazily initialised: building the stages allocates nothing, it only knows their shapes.
    let stages = layout.build(args, 0, (true, true), &Device::flex());
    let (mut local, mut gathered_kept, mut largest_block, mut largest_param) = (0u64, 0u64, 0u64, 0u64);
    // One block's gathered float32 weights (FSDP), for the overlap's buffers.
    let mut block_gathered = 0u64;
    let reshard = p.fsdp_reshard_after_forward.reshards(layout.split.pp > 1);
    // With reshard after forward: the gathered float32 weights of the block whose backward runs.
    let mut regathered_block = 0u64;
    let (mut activations, mut head) = (0.0f64, false);
    // Optimizer state: AdamW's two moments or Muon's one buffer per local element; Muon's owner
    // holds a whole matrix and the Newton–Schulz temporaries (X, its Gram matrix and square,
    // the polynomial product) while it orthogonalises, after the gradients are complete.
    let groups = crate::optim::groups::ParamGroups::new(&cfg.optimizer).map_err(|e| anyhow!(e))?;
    let (mut optimizer, mut muon_working) = (0u64, 0u64);
    for (chunk, &stage) in stages.chunks.iter().zip(&layout.stages) {
        let first = layout.split.layers[stage].start;
        let mut chunk_act = 0.0;
        for spec in chunk.param_specs() {
            let mut shape: Vec<u64> = spec.shape.iter().map(|&d| d as u64).collect();
            if let Some(d) = tp_split_dim(&spec.path).filter(|_| tp > 1) {
                shape[d] = shape[d].div_ceil(tp);
            }
            let routed = ep > 1 && ep_split_dim(&spec.path).is_some();
            if routed {
                shape[0] /= ep;
            }
            let full: u64 = shape.iter().product();
            largest_param = largest_param.max(full);
            let shard = if titan_models::moe::is_balancing_bias(&spec.path) {
                1
            } else if routed {
                expert_shard
            } else {
                shard
            };
            if shard > 1 {
                shape[0] = shape[0].div_ceil(shard);
            }
            let here: u64 = shape.iter().product();
            local += here;
            let block = block_of(&spec.path).map(|b| first + b);
            let name = match (block, spec.path.split_once('.').and_then(|(_, r)| r.split_once('.'))) {
                (Some(b), Some((_, tail))) => format!("layers.{b}.{tail}"),
                _ => spec.path.clone(),
            };
            let settings = groups.settings(&name, spec.shape.len()).map_err(|e| anyhow!(e))?;
            if settings.optimizer == crate::config::OptimizerName::Muon {
                optimizer += 4 * here;
                let (rows, cols) = (spec.shape[spec.shape.len() - 2] as u64, spec.shape[spec.shape.len() - 1] as u64);
                let small = rows.min(cols);
                muon_working = muon_working.max(4 * (3 * rows * cols + 2 * small * small));
            } else {
                optimizer += 8 * here;
            }
            // The compute-type copy a linear keeps of its weight (mixed precision), and the
            // FSDP-gathered value, live until backward unless the block is checkpointed.
            let kept = !block.is_some_and(|b| ac.covers(b));
            let gathered = (shard > 1) as u64 * 4;
            let fsdp_kept = if reshard && !keeps_its_weight(&spec.path) { 0 } else { gathered };
            let copies = (elem != 4) as u64 * elem;
            if kept {
                gathered_kept += full * (fsdp_kept + copies);
            }
            if block == Some(first) {
                largest_block += full * (gathered + copies);
                regathered_block += full * (gathered - fsdp_kept);
                block_gathered += full * gathered;
            }
        }
        for l in layout.split.layers[stage].clone() {
            chunk_act += match ac {
                Checkpointing::Ops => w.ops(args, l, elem),
                _ if ac.covers(l) => w.checkpointed(elem),
                _ => w.block(args, l, elem),
            };
        }
        // The last stage (it has the final norm) makes the logits, tied head or not.
        if chunk.norm.is_some() {
            chunk_act += w.head(elem);
            head = true;
        }
        activations = f64::max(activations, chunk_act);
    }
    let alive = peak_in_flight(&rank_actions(
        layout.schedule,
        layout.split.pp,
        layout.split.virtual_stages,
        layout.microbatches,
        pp_rank,
    ));
    let per_layer = (0..args.n_layers).map(|l| (w.block(args, l, elem) * tokens) as u64).max().unwrap_or(0);
    let any_ckpt = (0..args.n_layers).any(|l| ac.covers(l));
    // The first backward pass holds the logits' gradient (float32); a recomputed block's
    // activations are consumed while its gradients are made, so one block's worth at a time,
    // with its gathered weights. The residual stream's gradient and a few temporaries of its
    // size run alongside.
    let dlogits = (head as u64) * (4.0 * w.vocab as f64 * tokens) as u64;
    let recompute = if any_ckpt { per_layer + largest_block } else { 0 };
    let regathered = if any_ckpt { 0 } else { regathered_block };
    let working = dlogits.max(recompute + regathered) + 4 * (w.d as f64 * tokens) as u64 * elem;
    // Collectives copy their tensors to host buffers: float32 send and receive copies of the
    // residual stream (TP: the sequence-parallel all-gather and the reduce-scatter / all-reduce;
    // PP: a stage's activation and gradient), and of the largest parameter (FSDP's all-gather
    // of a shard into the full value), during forward and backward; the data-parallel gradient
    // reduction copies every local gradient once more (plus a bucket) after backward.
    let residual = 4 * (w.d as f64 * tokens) as u64;
    // CP: the attention's host copies of the local K and V, the blocks held (two in a ring, all
    // of them gathered), and as many dK, dV in backward.
    let kv_block = 4 * 2 * (w.kv as f64 * tokens) as u64;
    let cp_buffers = match (cp > 1, p.context_parallel_rotate_method) {
        (false, _) => 0,
        (true, RotateMethod::AllGather) => kv_block * (1 + 2 * cp as u64),
        (true, RotateMethod::Ring) => kv_block * 5,
    };
    let in_step = if tp > 1 { 3 * residual } else { 0 }
        + if layout.split.pp > 1 { 2 * residual } else { 0 }
        + if shard > 1 { 2 * 4 * largest_param } else { 0 }
        + cp_buffers;
    // Overlap (`overlap_collectives`): FSDP's prefetched gathers and queued reduce-scatters,
    // each bounded to `fsdp_prefetch_depth + 1` blocks (a larger parameter outside the blocks,
    // the head, is in flight alone: the largest parameter's buffers above). They coincide with
    // the peak when backward gathers again (reshard after forward, or recomputed blocks);
    // otherwise the peak is the end of forward, when nothing is left to prefetch and no
    // gradient is queued yet. Plain
    // DDP: its buckets and their sums, and with accumulation the earlier microbatches'
    // gradients read to the host, during the last backward.
    let blocks_ahead = (p.fsdp_prefetch_depth as u64 + 1) * block_gathered;
    let in_step =
        in_step + if p.overlap_collectives && shard > 1 && (reshard || any_ckpt) { 2 * blocks_ahead } else { 0 };
    let plain_ddp = dp > 1 && shard == 1 && tp == 1 && cp == 1 && ep == 1 && layout.split.pp == 1;
    let accumulating = cfg.global_batch_size(dims.dp()) > local_batch * dims.dp();
    let reduction = match (dp * shard > 1, p.overlap_collectives && plain_ddp) {
        (false, _) => 0,
        (true, true) => 4 * local * (2 + accumulating as u64),
        (true, false) => 4 * local + (25 << 20).min(4 * local),
    };
    let reduction = reduction.max(muon_working);
    let threads = rayon::current_num_threads() as u64;
    let workspace = threads * (2 * 64 * 64 * 4 + 2 * (256 * w.d.max(w.f)) * 4);
    Ok(RankMemory {
        params: 4 * local,
        grads: 4 * local,
        optimizer,
        gathered: gathered_kept,
        activations: (activations * tokens) as u64 * alive as u64,
        microbatches_alive: alive,
        per_layer,
        backward_working_set: working,
        comm_buffers: in_step,
        reduction_buffers: reduction,
        workspace,
    })
}

/// Whether the op reading a parameter keeps its gathered value for backward even with reshard
/// after forward: Burn's embedding op saves its weight.
fn keeps_its_weight(path: &str) -> bool {
    path.starts_with("tok_embeddings.")
}

/// The block index of a stage parameter path (`layers.I.…`).
fn block_of(path: &str) -> Option<usize> {
    path.strip_prefix("layers.")?.split('.').next()?.parse().ok()
}

/// The activation checkpointing of a plan, in words.
pub fn describe(ac: Checkpointing) -> String {
    match ac {
        Checkpointing::None => "no activation checkpointing".into(),
        Checkpointing::Full => "every block checkpointed".into(),
        Checkpointing::EveryNth(n) => format!("one block in every {n} checkpointed"),
        Checkpointing::Ops => "op-level selective checkpointing (matmul and attention outputs kept)".into(),
    }
}
