//! Parallelism infrastructure for titan-rs.
//!
//! * [`mesh`]: TorchTitan's `ParallelDims` rules — degrees, world size, the rank grid
//!   (`pp, dp_replicate, dp_shard, cp, tp`, tp innermost) and the derived groups.
//! * [`comm`]: the [`comm::Communicator`] trait over host buffers (f32, bf16, bytes) and the
//!   `local` backend (every rank a thread; reductions in fixed rank order, so bitwise
//!   reproducible; mismatched calls and timeouts are errors, never hangs or mixed data).
//! * [`autograd`]: differentiable collectives on Burn tensors (Megatron's f and g, gather/split,
//!   reduce-scatter, the FSDP parameter all-gather) as custom autodiff ops.
//! * [`ddp`]: data parallelism — bucketed gradient all-reduce over the dp group.
//! * [`fsdp`]: parameters sharded along dim 0, gathered when read (a Burn reparameterization).
//! * [`cp`]: context parallelism — sequences split over ranks, ring attention.
//! * [`ep`]: expert parallelism — routed experts split over ranks, tokens dispatched and
//!   combined by all-to-all.
//! * [`tp`]: tensor (and sequence) parallelism — parameter slices and activation hooks;
//!   [`loss_parallel`]: cross-entropy over vocabulary-split logits.
//! * [`launcher`]: runs one closure per rank on threads; the first failure stops every rank.

pub mod autograd;
pub mod comm;
pub mod cp;
pub mod ddp;
pub mod ep;
pub mod fsdp;
pub mod groups;
pub mod launcher;
pub mod loss_parallel;
pub mod mesh;
pub mod pp;
pub mod registry;
pub mod tp;

pub use comm::{CommError, CommExt, Communicator, DType, ReduceOp};

/// Marks the end of one backward pass for the overlapped collectives (FSDP's queued
/// reduce-scatters, DDP's ready gradients): what a pass produced is summed before it joins the
/// gradients accumulated over passes, as the trainer's accumulation does.
pub fn seal_backward_pass() {
    fsdp::overlap::seal_epoch();
    ddp::overlap::seal_epoch();
}
pub use groups::MeshGroups;
pub use launcher::{run_ranks, run_ranks_or_exit, under_mpi_launcher};
pub use mesh::{Axis, Mesh, ParallelDims};
