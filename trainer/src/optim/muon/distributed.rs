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
pub fn orthogonalise(
    items: Vec<Pending>,
    cfg: &MuonConfig,
    placement: &Placement,
    device: &Device,
) -> Result<Vec<Tensor<1>>> {
    let mut out: Vec<Option<Tensor<1>>> = (0..items.len()).map(|_| None).collect();
    let mut sharded: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    let mut local = Vec::new();
    for (i, it) in items.iter().enumerate() {
        match placement.fsdp.as_ref().and_then(|s| s.layout(&it.path).map(|_| s.groups[&it.path])) {
            Some(group) => sharded.entry(group).or_default().push(i),
            None if tp_dim(placement, &it.path).is_none() => local.push(i),
            None => {
                let data = host_vec(&it.update);
                let o = whole(cfg, placement, &it.path, data, &it.shape, device);
                out[i] = Some(Tensor::from_data(TensorData::new(o, [data_len(&it.shape)]), device));
            }
        }
    }
    // Whole on this rank: on the device, batched by shape.
    let mats = local.iter().map(|&i| items[i].update.clone().reshape(batched(&items[i].shape))).collect();
    for (&i, o) in local.iter().zip(orthogonal_many(mats, cfg)) {
        out[i] = Some(o.reshape([data_len(&items[i].shape)]));
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
fn whole(
    cfg: &MuonConfig,
    placement: &Placement,
    path: &str,
    data: Vec<f32>,
    shape: &[usize],
    device: &Device,
) -> Vec<f32> {
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

/// The orthogonalised, shape-scaled updates of whole matrices (each `[batch, rows, cols]`):
/// those of one shape in one batched pass (one matmul per product for all of a shape's layers
/// and experts, instead of one per matrix).
fn orthogonal_many(mats: Vec<Tensor<3>>, cfg: &MuonConfig) -> Vec<Tensor<3>> {
    let mut by_shape: BTreeMap<[usize; 2], Vec<usize>> = BTreeMap::new();
    for (i, m) in mats.iter().enumerate() {
        let [_, r, c] = m.dims();
        by_shape.entry([r, c]).or_default().push(i);
    }
    let mut out: Vec<Option<Tensor<3>>> = (0..mats.len()).map(|_| None).collect();
    for idx in by_shape.into_values() {
        let sizes: Vec<usize> = idx.iter().map(|&i| mats[i].dims()[0]).collect();
        let o = cfg.orthogonal_update(Tensor::cat(idx.iter().map(|&i| mats[i].clone()).collect(), 0));
        let mut start = 0;
        for (&i, &b) in idx.iter().zip(&sizes) {
            out[i] = Some(o.clone().narrow(0, start, b));
            start += b;
        }
    }
    out.into_iter().map(|t| t.expect("every matrix orthogonalised")).collect()
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
    // The owner's matrices, whole (TP-split ones gathered over the TP group one by one, the
    // others batched by shape), orthogonalised, cut into shards again.
    let mine: Vec<usize> = (0..idx.len()).filter(|&k| owner[k] == me).collect();
    let mut cursor = vec![0usize; n];
    let mut done: Vec<Option<Vec<f32>>> = vec![None; mine.len()];
    let mut batch = Vec::new();
    for (j, &k) in mine.iter().enumerate() {
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
        if tp_dim(placement, &items[idx[k]].path).is_some() {
            done[j] = Some(whole(cfg, placement, &items[idx[k]].path, full, &shape, device));
        } else {
            batch.push((j, Tensor::<3>::from_data(TensorData::new(full, batched(&shape)), device)));
        }
    }
    let (slots, mats): (Vec<usize>, Vec<Tensor<3>>) = batch.into_iter().unzip();
    for (j, o) in slots.into_iter().zip(orthogonal_many(mats, cfg)) {
        done[j] = Some(o.into_data().try_into_vec::<f32>().expect("f32 update"));
    }
    let mut back = vec![Vec::new(); n];
    for (&k, o) in mine.iter().zip(done) {
        let len = layouts[k].chunk * inner(k);
        let mut o = o.expect("every owned matrix orthogonalised");
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
