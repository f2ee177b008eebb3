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

use crate::positions::Positions;
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
    /// Op-level selective checkpointing (`selective_ac_option = "op"`): no block is cut; the
    /// device runs Burn's balanced gradient checkpointing, which keeps the outputs of the
    /// compute-bound ops (matmuls, attention) and recomputes the memory-bound ones (RMSNorm,
    /// RoPE, `silu · mul`, residual adds, copies) in backward.
    Ops,
}

impl Checkpointing {
    /// Whether the block with global index `layer` is checkpointed.
    pub fn covers(&self, layer: usize) -> bool {
        match *self {
            Checkpointing::None | Checkpointing::Ops => false,
            Checkpointing::Full => true,
            Checkpointing::EveryNth(n) => n > 0 && (layer + 1) % n == 0,
        }
    }
}

/// What the backward of a checkpointed stage needs: each checkpointed block's saved input and
/// the leaf its output became, in forward order.
pub struct Tape {
    positions: Option<Positions>,
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
        Self { positions: None, saved: Vec::new() }
    }

    /// Runs `plain_forward` (block `block`) on `x` off the graph with plain position tensors,
    /// so nothing is kept for backward; saves `x` and returns the output as a new leaf.
    pub(crate) fn checkpoint(
        &mut self,
        block: usize,
        x: Tensor<3>,
        pos: &Positions,
        plain_forward: impl FnOnce(Tensor<3>, &Positions) -> Tensor<3>,
    ) -> Tensor<3> {
        let y = plain_forward(x.clone().inner(), &pos.without_autodiff());
        let output = y.autodiff().require_grad();
        self.positions.get_or_insert_with(|| pos.clone());
        self.saved.push(Saved { block, input: x, output: output.clone() });
        output
    }

    /// The backward pass from `root`, recomputing each checkpointed block with
    /// `recompute(block, input, positions)` (last block first). Every pass but the last hands its
    /// gradients to `each`; the last pass's gradients are returned. Without checkpointed blocks
    /// this is `root.backward()`.
    pub(crate) fn backward(
        self,
        root: Tensor<1>,
        mut recompute: impl FnMut(usize, Tensor<3>, &Positions) -> Tensor<3>,
        mut each: impl FnMut(Gradients),
    ) -> Gradients {
        let mut grads = root.backward();
        let Some(pos) = self.positions else { return grads };
        for s in self.saved.into_iter().rev() {
            let dy = s.output.grad(&grads).expect("a checkpointed block's output takes part in the loss");
            each(grads);
            let y = recompute(s.block, s.input, &pos);
            grads = (y * dy).sum().backward();
        }
        grads
    }
}
