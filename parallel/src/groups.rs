//! The communicators one rank needs, cut from the world along the mesh (the rank grid lives in
//! `mesh.rs`; this is the one place that turns it into groups).

use crate::comm::{CommResult, Communicator};
use crate::mesh::{Axis, ParallelDims};

/// This rank's position and groups; a group is `None` where its axis has size 1.
pub struct MeshGroups {
    /// The resolved mesh these groups were cut from.
    pub dims: ParallelDims,
    /// Rank in the world.
    pub world_rank: usize,
    /// Index among all data-parallel ranks (`dp_replicate × dp_shard`): which data this rank reads.
    pub dp_rank: usize,
    pub dp_degree: usize,
    /// Every data-parallel rank: the loss sum.
    pub dp: Option<Box<dyn Communicator>>,
    /// Ranks holding the same shards (DDP, and HSDP across shard groups): gradient all-reduce.
    pub replicate: Option<Box<dyn Communicator>>,
    /// The FSDP shard group (dp_shard × cp): parameter all-gather, gradient reduce-scatter.
    pub shard: Option<Box<dyn Communicator>>,
    /// The context-parallel group (the ranks splitting each sequence).
    pub cp: Option<Box<dyn Communicator>>,
    /// The tensor-parallel group.
    pub tp: Option<Box<dyn Communicator>>,
    /// The expert-parallel group and the expert weights' FSDP group.
    pub ep: Option<Box<dyn Communicator>>,
    pub efsdp: Option<Box<dyn Communicator>>,
    /// This rank's pipeline stage index and the pipeline group (its rank `i` is stage rank `i`).
    pub pp_rank: usize,
    pub pp: Option<Box<dyn Communicator>>,
    /// Every rank (checkpoint agreement).
    pub world: Option<Box<dyn Communicator>>,
}

impl MeshGroups {
    pub fn single() -> Self {
        Self {
            dims: ParallelDims::new(1, 1, 1, 1, 1, 1, 1).expect("the one-rank mesh"),
            world_rank: 0,
            dp_rank: 0,
            dp_degree: 1,
            dp: None,
            replicate: None,
            shard: None,
            cp: None,
            tp: None,
            ep: None,
            efsdp: None,
            pp_rank: 0,
            pp: None,
            world: None,
        }
    }

    /// Cuts this rank's groups from `world` (every rank of `world` must call this at the same
    /// point, as sub-group creation is collective under MPI).
    pub fn new(world: &dyn Communicator, dims: &ParallelDims) -> CommResult<Self> {
        let mesh = dims.mesh();
        let rank = world.rank();
        let cut = |axis: Axis, size: usize| -> CommResult<Option<Box<dyn Communicator>>> {
            if size > 1 {
                world.sub_group(&mesh.group(axis, rank)).map(Some)
            } else {
                Ok(None)
            }
        };
        let dp = cut(Axis::Dp, dims.dp())?;
        let replicate = cut(Axis::DpReplicate, dims.dp_replicate)?;
        let shard = cut(Axis::Fsdp, dims.fsdp_size())?;
        let cp = cut(Axis::Cp, dims.cp)?;
        let tp = cut(Axis::Tp, dims.tp)?;
        let ep = cut(Axis::Ep, dims.ep)?;
        let efsdp = if dims.ep > 1 { cut(Axis::Efsdp, dims.efsdp_size())? } else { None };
        let pp = cut(Axis::Pp, dims.pp)?;
        let everyone: Vec<usize> = (0..world.size()).collect();
        let world_group = if world.size() > 1 { Some(world.sub_group(&everyone)?) } else { None };
        let c = mesh.coords(rank);
        Ok(Self {
            dims: *dims,
            world_rank: rank,
            dp_rank: c.dp_rank(dims),
            dp_degree: dims.dp(),
            dp,
            replicate,
            shard,
            cp,
            tp,
            ep,
            efsdp,
            pp_rank: c.pp,
            pp,
            world: world_group,
        })
    }
}
