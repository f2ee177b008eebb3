//! This rank: its place on the mesh (the groups it communicates in), the part of the model it
//! holds and how it runs it — the parallelisms applied to its stages ([`parallelize`]), the
//! pipeline schedule over them ([`pipeline`]), its parameters as host tensors ([`params`]) and
//! its gradients: accumulated over microbatches, their global norm, clipping ([`grads`]).

pub mod grads;
pub mod parallelize;
pub mod params;
pub mod pipeline;

use burn::prelude::*;
use titan_models::Transformer;
use titan_parallel::registry::{register, GroupHandle};
use titan_parallel::{Communicator, MeshGroups, ParallelDims};

/// The pipeline stages on this rank (`chunks[c]` is stage `c·pp + pp_rank`); one chunk holding
/// the whole model without pipeline parallelism.
#[derive(Module, Debug)]
pub struct RankModel {
    pub chunks: Vec<Transformer>,
}

/// This rank's place on the mesh. Groups are `None` where their axis has size 1.
pub struct RankContext {
    /// The resolved mesh (every degree, -1 resolved against the world size).
    pub dims: ParallelDims,
    pub world_rank: usize,
    pub dp_rank: usize,
    pub dp_degree: usize,
    /// Every data-parallel rank (the loss sum).
    pub dp: Option<Box<dyn Communicator>>,
    /// Ranks with the same parameters (DDP; HSDP across shard groups): gradient all-reduce.
    pub replicate: Option<Box<dyn Communicator>>,
    /// The FSDP shard group, registered for the differentiable collectives on this thread.
    pub fsdp: Option<GroupHandle>,
    /// The tensor-parallel group, registered likewise.
    pub tp: Option<GroupHandle>,
    /// The context-parallel group (the ranks splitting each sequence), registered likewise.
    pub cp: Option<GroupHandle>,
    /// The expert-parallel group (the ranks splitting the routed experts) and the expert
    /// weights' FSDP group, registered likewise.
    pub ep: Option<GroupHandle>,
    pub efsdp: Option<GroupHandle>,
    /// The pipeline stage index and group (point-to-point between stages).
    pub pp_rank: usize,
    pub pp: Option<Box<dyn Communicator>>,
    /// Every rank (`None` alone): checkpoints agree over it.
    pub world: Option<Box<dyn Communicator>>,
}

impl RankContext {
    pub fn single() -> Self {
        Self::new(MeshGroups::single())
    }

    /// Ranks splitting each sequence (1 without context parallelism).
    pub fn cp_degree(&self) -> usize {
        self.cp.as_ref().map_or(1, |g| g.size())
    }

    /// Must be called on the rank's own thread (the FSDP and TP groups are registered there).
    pub fn new(g: MeshGroups) -> Self {
        Self {
            dims: g.dims,
            world_rank: g.world_rank,
            dp_rank: g.dp_rank,
            dp_degree: g.dp_degree,
            dp: g.dp,
            replicate: g.replicate,
            fsdp: g.shard.map(register),
            tp: g.tp.map(register),
            cp: g.cp.map(register),
            ep: g.ep.map(register),
            efsdp: g.efsdp.map(register),
            pp_rank: g.pp_rank,
            pp: g.pp,
            world: g.world,
        }
    }
}
