//! Activation checkpointing (TorchTitan's `activation_checkpoint`): a checkpointed block keeps
//! only its input in forward and recomputes itself in backward.
//!
//! Burn has no `torch.utils.checkpoint`, so the stage's backward is cut at the checkpointed
//! blocks' boundaries. In forward a checkpointed block runs on the parameters' plain values
//! (`Module::valid`: no graph, nothing kept) and its output re-enters autodiff as a new leaf; the
//! block's input is saved. The backward then runs in passes, last block first: a pass ends at the
//! leaf of the latest checkpointed block, whose gradient `dy` starts the next pass,
//! `(block(x) · dy).sum().backward()`, which recomputes the block from its saved input with a
//! graph and continues through whatever was kept before it. Everything the block does in forward
//! runs again in the recompute: FSDP's parameter all-gathers, the tensor-parallel collectives,
//! the fused kernels, the compute dtype. The residual stream between blocks is the only tensor
//! crossing a boundary, so each part of the graph is traversed exactly once, as without
//! checkpointing.

use crate::llama::{traced, Transformer};
use crate::rope::RopeTables;
use burn::prelude::*;
use burn::tensor::Gradients;

/// Which blocks recompute their activations in backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Checkpointing {
    /// Keep every activation (no recompute).
    #[default]
    None,
    /// Every block (`mode = "full"`).
    Full,
    /// Every `n`-th block, counting from 1 as TorchTitan does: blocks `n-1, 2n-1, …`
    /// (`mode = "selective"`, `selective_ac_option = "n"`).
    EveryNth(usize),
}

impl Checkpointing {
    /// Whether the block with global index `layer` is checkpointed.
    pub fn covers(&self, layer: usize) -> bool {
        match *self {
            Checkpointing::None => false,
            Checkpointing::Full => true,
            Checkpointing::EveryNth(n) => n > 0 && (layer + 1) % n == 0,
        }
    }
}

/// What the backward of a checkpointed stage needs: each checkpointed block's saved input and
/// the leaf its output became, in forward order.
pub struct Tape {
    rope: Option<RopeTables>,
    saved: Vec<Saved>,
}

struct Saved {
    /// Local index of the block in the stage.
    block: usize,
    input: Tensor<3>,
    output: Tensor<3>,
}

impl Tape {
    pub(crate) fn new() -> Self {
        Self { rope: None, saved: Vec::new() }
    }

    /// Whether any block was checkpointed.
    pub fn is_empty(&self) -> bool {
        self.saved.is_empty()
    }

    /// Runs block `block` of `model` on `x` without keeping anything for backward, saves `x`,
    /// and returns the output as a new leaf.
    pub(crate) fn checkpoint(&mut self, model: &Transformer, block: usize, x: Tensor<3>, rope: &RopeTables) -> Tensor<3> {
        let plain_rope = rope.without_autodiff();
        let layer = model.layers[block].valid();
        let y = traced(|| model.block_name(block), x.clone().inner(), |x| layer.forward(x, &plain_rope, &model.hooks));
        let output = y.autodiff().require_grad();
        self.rope.get_or_insert_with(|| rope.clone());
        self.saved.push(Saved { block, input: x, output: output.clone() });
        output
    }
}

impl Transformer {
    /// The backward pass of this stage from `root` (the loss, or `(y · dy).sum()` of the stage
    /// output), recomputing the checkpointed blocks of `tape`. Every pass but the last hands its
    /// gradients to `each`; the last pass's gradients are returned (they hold the stage input's
    /// gradient). Without checkpointed blocks this is `root.backward()`.
    pub fn backward_stage(&self, root: Tensor<1>, tape: Tape, mut each: impl FnMut(Gradients)) -> Gradients {
        let mut grads = root.backward();
        let Some(rope) = tape.rope else { return grads };
        for s in tape.saved.into_iter().rev() {
            let dy = s.output.grad(&grads).expect("a checkpointed block's output takes part in the loss");
            each(grads);
            let layer = &self.layers[s.block];
            let _span = titan_profiling::span_with(|| format!("{}.recompute", self.block_name(s.block)), "backward");
            let y = traced(|| self.block_name(s.block), s.input, |x| layer.forward(x, &rope, &self.hooks));
            grads = (y * dy).sum().backward();
        }
        grads
    }

    /// The name of local block `block` in step traces (its global index).
    pub(crate) fn block_name(&self, block: usize) -> String {
        format!("layers.{}", self.first_layer + block)
    }
}
