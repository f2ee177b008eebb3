//! Muon's orthogonalisation on whole matrices, whatever the layout ("owner computes", as
//! TorchTitan's DistMuon and Megatron's distributed Muon do it):
//!
//! * **FSDP** (and HSDP/CP, whose shard group spans dp_shard × cp; and the routed experts'
//!   expert-FSDP group): each sharded matrix gets one owner in its shard group, owners balanced
//!   by size (largest first, to the least loaded rank). One all-to-all sends every shard to its
//!   matrix's owner, the owner orthogonalises, one all-to-all sends the shards back — each rank
//!   computes about 1/N of the Newton–Schulz work and receives and sends each of its matrices
//!   once, where an all-gather would have every rank receive and compute all of them.
//! * **TP**: the owner's TP slice is all-gathered over the TP group (whose ranks own the same
//!   matrices: they share the shard-group index), orthogonalised, and split back.
//! * **EP**: each rank holds whole experts; each expert's matrix is orthogonalised on its own.
//! * **PP**: each stage orthogonalises its own matrices. **DDP** replicas hold equal gradients
//!   and compute the same result.
//!
//! Without sharding the update stays on the device; sharded matrices move through the host (the
//! communicators' buffers).

use super::newton_schulz::batched;
use super::MuonConfig;
use crate::rank::parallelize::Placement;
use anyhow::Result;
use burn::prelude::*;
use std::collections::BTreeMap;
use titan_parallel::autograd::host::{self, Prim};
use titan_parallel::registry::with_group;
use titan_parallel::CommExt;

/// One parameter's momentum update on this rank: its (local) path and shape, flattened values.
pub struct Pending {
    pub path: String,
    pub shape: Vec<usize>,
    pub update: Tensor<1>,
}

/// The orthogonalised, shape-scaled updates of `items`, in order, each shaped like its shard.
pub fn orthogonalise(items: Vec<Pending>, cfg: &MuonConfig, placement: &Placement, device: &Device) -> Result<Vec<Tensor<1>>> {
    let mut out: Vec<Option<Tensor<1>>> = (0..items.len()).map(|_| None).collect();
    let mut sharded: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (i, it) in items.iter().enumerate() {
        match placement.fsdp.as_ref().and_then(|s| s.layout(&it.path).map(|_| s.groups[&it.path])) {
            Some(group) => sharded.entry(group).or_default().push(i),
            None => {
                out[i] = Some(match tp_dim(placement, &it.path) {
                    None => {
                        let u = it.update.clone().reshape(batched(&it.shape));
                        cfg.orthogonal_update(u).reshape([it.shape.iter().product::<usize>()])
                    }
                    Some(_) => {
                        let data = host_vec(&it.update);
                        Tensor::from_data(TensorData::new(whole(cfg, placement, &it.path, data, &it.shape, device), [data_len(&it.shape)]), device)
                    }
                });
            }
        }
    }
    for (group, idx) in sharded {
        for (i, t) in owner_computes(&items, &idx, group, cfg, placement, device)? {
            out[i] = Some(t);
        }
    }
    Ok(out.into_iter().map(|t| t.expect("every update orthogonalised")).collect())
}

fn data_len(shape: &[usize]) -> usize {
    shape.iter().product()
}

fn host_vec(t: &Tensor<1>) -> Vec<f32> {
    t.to_data().try_into_vec::<f32>().expect("f32 update")
}

fn tp_dim(placement: &Placement, path: &str) -> Option<usize> {
    placement.tp.as_ref().and_then(|tp| tp.split_dims.get(path).copied())
}

/// The orthogonalised update of this rank's TP-local piece `data` (of `shape`): all-gathered
/// over the TP group when TP splits it, orthogonalised whole, split back.
fn whole(cfg: &MuonConfig, placement: &Placement, path: &str, data: Vec<f32>, shape: &[usize], device: &Device) -> Vec<f32> {
    let orth = |data: Vec<f32>, shape: &[usize]| {
        let u = Tensor::<3>::from_data(TensorData::new(data, batched(shape)), device);
        cfg.orthogonal_update(u).into_data().try_into_vec::<f32>().expect("f32 update")
    };
    match (tp_dim(placement, path), &placement.tp) {
        (Some(dim), Some(tp)) => with_group(tp.group.id(), |c| {
            let (full, full_shape) = host::run(Prim::AllGather, data, shape, dim, c);
            let o = orth(full, &full_shape);
            host::run(Prim::Split, o, &full_shape, dim, c).0
        }),
        _ => orth(data, shape),
    }
}

/// The owner of each matrix (by position in `sizes`): largest first, to the least loaded rank
/// (the lowest on a tie), so every rank of the group computes the same assignment.
pub fn assign_owners(sizes: &[usize], ranks: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by(|&a, &b| sizes[b].cmp(&sizes[a]).then(a.cmp(&b)));
    let mut load = vec![0usize; ranks];
    let mut owner = vec![0; sizes.len()];
    for i in order {
        let r = (0..ranks).min_by_key(|&r| (load[r], r)).expect("a rank");
        owner[i] = r;
        load[r] += sizes[i];
    }
    owner
}

/// Owner computes over the shard group `group` for the matrices `idx` of `items`.
fn owner_computes(
    items: &[Pending],
    idx: &[usize],
    group: u64,
    cfg: &MuonConfig,
    placement: &Placement,
    device: &Device,
) -> Result<Vec<(usize, Tensor<1>)>> {
    let sharding = placement.fsdp.as_ref().expect("sharded");
    let layouts: Vec<_> = idx.iter().map(|&i| *sharding.layout(&items[i].path).expect("layout")).collect();
    let (n, me) = (layouts[0].size, layouts[0].rank);
    // Every shard has `chunk` rows of `inner` values; the TP-local matrix has `rows` of them.
    let inner = |k: usize| data_len(&items[idx[k]].shape[1..]);
    let sizes: Vec<usize> = (0..idx.len()).map(|k| layouts[k].rows * inner(k)).collect();
    let owner = assign_owners(&sizes, n);
    // Shards to their owners.
    let mut parts = vec![Vec::new(); n];
    let shards: Vec<Vec<f32>> = idx.iter().map(|&i| host_vec(&items[i].update)).collect();
    for (k, s) in shards.iter().enumerate() {
        parts[owner[k]].extend_from_slice(s);
    }
    let got = with_group(group, |c| c.all_to_all(&parts))?;
    // The owner's matrices, whole, orthogonalised, cut into shards again.
    let mut back = vec![Vec::new(); n];
    let mut cursor = vec![0usize; n];
    for k in (0..idx.len()).filter(|&k| owner[k] == me) {
        let l = layouts[k];
        let len = l.chunk * inner(k);
        let mut full = Vec::with_capacity(len * n);
        for (r, g) in got.iter().enumerate() {
            full.extend_from_slice(&g[cursor[r]..cursor[r] + len]);
            cursor[r] += len;
        }
        full.truncate(l.rows * inner(k));
        let mut shape = items[idx[k]].shape.clone();
        shape[0] = l.rows;
        let mut o = whole(cfg, placement, &items[idx[k]].path, full, &shape, device);
        o.resize(len * n, 0.0);
        for (r, b) in back.iter_mut().enumerate() {
            b.extend_from_slice(&o[r * len..(r + 1) * len]);
        }
    }
    let got = with_group(group, |c| c.all_to_all(&back))?;
    let mut cursor = vec![0usize; n];
    Ok(idx
        .iter()
        .enumerate()
        .map(|(k, &i)| {
            let (o, len) = (owner[k], layouts[k].chunk * inner(k));
            let shard = got[o][cursor[o]..cursor[o] + len].to_vec();
            cursor[o] += len;
            (i, Tensor::from_data(TensorData::new(shard, [len]), device))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    #[test]
    fn owners_are_balanced_by_size() {
        let owner = super::assign_owners(&[10, 40, 10, 30, 10], 2);
        assert_eq!(owner, vec![1, 0, 0, 1, 1]);
    }
}
