//! Where this rank's parameters lie in the global tensors: for every local parameter, its
//! checkpoint key (global layer numbering), global shape and the region it holds — from the
//! pipeline stages, the TP split and the FSDP rows. The same slots turn the rank's tensors into
//! pieces to save and read the regions to load, whatever layout wrote the checkpoint.

use crate::rank::parallelize::Placement;
use crate::rank::params;
use crate::rank::pipeline::RankLayout;
use crate::rank::{RankContext, RankModel};
use anyhow::{anyhow, bail, Result};
use titan_checkpoints::{HostTensor, Piece, Region, TensorMap, TensorSource};

/// One local parameter's place in its global tensor.
#[derive(Debug, Clone)]
pub struct Slot {
    /// The module path on this rank (`chunks.0.layers.1.attention.wq.weight`).
    pub local: String,
    /// The checkpoint key (`layers.5.attention.wq.weight`).
    pub key: String,
    pub shape: Vec<usize>,
    /// The part of the global tensor this rank holds (FSDP padding excluded).
    pub region: Region,
    /// The stored local shape (FSDP shards padded to equal rows).
    pub local_shape: Vec<usize>,
}

/// Every parameter's slot on this rank.
pub fn slots(model: &RankModel, placement: &Placement, layout: &RankLayout, rank: &RankContext) -> Vec<Slot> {
    params::param_shapes(model)
        .into_iter()
        .map(|(local, local_shape)| {
            let fsdp = placement.fsdp.as_ref().and_then(|s| s.layout(&local));
            // The TP-local tensor: the FSDP shard's rows are rows of it.
            let mut tp_local = local_shape.clone();
            if let Some(l) = fsdp {
                tp_local[0] = l.rows;
            }
            let mut shape = tp_local.clone();
            let mut region = Region::full(&tp_local);
            // Split dimensions: TP's (heads, hidden units, vocabulary) and EP's (experts).
            let splits = [
                placement.tp.as_ref().zip(rank.tp.as_ref()).map(|(p, g)| (&p.split_dims, g)),
                placement.ep.as_ref().zip(rank.ep.as_ref()).map(|(p, g)| (&p.split_dims, g)),
            ];
            for (dims, g) in splits.into_iter().flatten() {
                if let Some(&d) = dims.get(&local) {
                    shape[d] *= g.size();
                    region.offsets[d] = g.rank() * tp_local[d];
                }
            }
            if let Some(l) = fsdp {
                let start = (l.rank * l.chunk).min(l.rows);
                let end = ((l.rank + 1) * l.chunk).min(l.rows);
                region.offsets[0] += start;
                region.lengths[0] = end - start;
            }
            Slot { key: layout.global_key(&local), local, shape, region, local_shape }
        })
        .collect()
}

/// The optimizer-state key of a parameter key.
fn moment_key(prefix: &str, key: &str) -> String {
    format!("{prefix}.{key}")
}

use crate::optim::STATE_PREFIXES as MOMENTS;

/// This rank's pieces of the model (`model`: local path → stored tensor) and of the optimizer
/// state (`optim`: `exp_avg.<local path>` → stored tensor), padding rows dropped. The values
/// move into the pieces (no copy: the staged tensors are the pieces).
pub fn pieces(slots: &[Slot], mut model: TensorMap, mut optim: Option<TensorMap>) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut add = |key: String, s: &Slot, t: Option<HostTensor>| {
        if let Some(mut t) = t.filter(|_| s.region.numel() > 0) {
            t.data.truncate(s.region.numel());
            out.push(Piece { key, shape: s.shape.clone(), region: s.region.clone(), data: t.data });
        }
    };
    for s in slots {
        add(s.key.clone(), s, model.remove(&s.local));
        for m in MOMENTS {
            add(moment_key(m, &s.key), s, optim.as_mut().and_then(|o| o.remove(&moment_key(m, &s.local))));
        }
    }
    out
}

/// Reads `key`'s region for `slot` from `src`, padded to the local shape; `None` if absent.
fn read_slot(src: &dyn TensorSource, key: &str, s: &Slot) -> Result<Option<HostTensor>> {
    let Some(shape) = src.shape(key) else { return Ok(None) };
    if shape != s.shape {
        bail!(
            "{}: parameter {key} has shape {shape:?} there, but this model needs {:?} (a checkpoint of another model or flavor?)",
            src.describe(),
            s.shape
        );
    }
    let mut data = src.read(key, &s.region)?;
    data.resize(s.local_shape.iter().product(), 0.0);
    Ok(Some(HostTensor { shape: s.local_shape.clone(), data }))
}

/// This rank's model tensors (local path → stored tensor) read from `src`. A missing tensor is
/// an error naming it; so is a tensor `src` holds that this rank should hold (`mine(key)`) but
/// no slot has.
pub fn read_model(src: &dyn TensorSource, slots: &[Slot], mine: &dyn Fn(&str) -> bool) -> Result<TensorMap> {
    let mut out = TensorMap::new();
    for s in slots {
        let t =
            read_slot(src, &s.key, s)?.ok_or_else(|| anyhow!("{}: parameter {} is missing", src.describe(), s.key))?;
        out.insert(s.local.clone(), t);
    }
    let known: std::collections::HashSet<&str> = slots.iter().map(|s| s.key.as_str()).collect();
    if let Some(extra) = src
        .shapes()
        .into_keys()
        .find(|k| !MOMENTS.iter().any(|m| k.starts_with(&format!("{m}."))) && mine(k) && !known.contains(k.as_str()))
    {
        bail!("{}: tensor {extra} matches no parameter of this model (a checkpoint of another model?)", src.describe());
    }
    Ok(out)
}

/// This rank's optimizer moments (`exp_avg.<local path>` → stored tensor) read from `src`;
/// parameters without state are left out (the optimizer reports them if it needs them).
pub fn read_optimizer(src: &dyn TensorSource, slots: &[Slot]) -> Result<TensorMap> {
    let mut out = TensorMap::new();
    for s in slots {
        for m in MOMENTS {
            if let Some(t) = read_slot(src, &moment_key(m, &s.key), s)? {
                out.insert(moment_key(m, &s.local), t);
            }
        }
    }
    Ok(out)
}
