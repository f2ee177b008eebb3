//! FSDP (TorchTitan's `fully_shard`, PyTorch FSDP2): every parameter is split along dim 0 over
//! the shard group. A rank stores only its rows (so its optimizer state is only its rows too);
//! the full value is all-gathered each time the model reads the parameter, and the gradient of
//! that all-gather is a reduce-scatter, so each rank receives the summed gradient of its rows.
//!
//! Applied from outside the model as a Burn parameter *reparameterization*: the stored base of a
//! parameter becomes the shard, and `Param::val()` (what the model's layers call) returns
//! [`fsdp_unshard`]`(shard)`. The model code is unchanged.
//!
//! Reshard after forward (TorchTitan's `reshard_after_forward`): with it, the gathered value is
//! freed once the ops reading it have run, and gathered again in backward (the unshard is an op
//! autodiff recomputes, see `autograd`); without it, autodiff keeps every gathered parameter from
//! forward to backward (ZeRO-2's memory). The numbers are the same either way.
//!
//! Uneven dim 0 is handled as FSDP2 does: every shard holds `ceil(rows / n)` rows, the last ones
//! padded with zeros; the gathered value is narrowed back to `rows`. Padding rows get a zero
//! gradient, so AdamW keeps them at zero and they add nothing to the gradient norm.

use crate::autograd::fsdp_unshard;
use crate::comm::{CommExt, CommResult, Communicator};
use crate::registry::GroupHandle;
use burn::module::{Module, Param, Reparameterization, Reparameterizer};
use burn::prelude::*;
use std::collections::BTreeMap;

/// How one parameter is split along dim 0: rank `rank` of `size` holds rows
/// `[rank·chunk, (rank+1)·chunk)` of `rows`, zero-padded past the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardLayout {
    pub rows: usize,
    pub chunk: usize,
    pub rank: usize,
    pub size: usize,
}

impl ShardLayout {
    pub fn new(rows: usize, size: usize, rank: usize) -> Self {
        Self { rows, chunk: rows.div_ceil(size), rank, size }
    }

    /// This rank's rows of a full row-major tensor of `shape`; returns the shard and its shape.
    pub fn shard(&self, full: &[f32], shape: &[usize]) -> (Vec<f32>, Vec<usize>) {
        assert_eq!(shape[0], self.rows, "sharding a tensor of {} rows with a layout of {}", shape[0], self.rows);
        let inner: usize = shape[1..].iter().product();
        let start = (self.rank * self.chunk).min(self.rows);
        let end = ((self.rank + 1) * self.chunk).min(self.rows);
        let mut out = full[start * inner..end * inner].to_vec();
        out.resize(self.chunk * inner, 0.0);
        let mut s = shape.to_vec();
        s[0] = self.chunk;
        (out, s)
    }

    /// The full tensor from every rank's shard (a collective over the shard group).
    pub fn unshard(&self, shard: &[f32], comm: &dyn Communicator) -> CommResult<Vec<f32>> {
        let inner = shard.len() / self.chunk.max(1);
        let mut full = vec![0f32; shard.len() * comm.size()];
        comm.all_gather(shard, &mut full)?;
        full.truncate(self.rows * inner);
        Ok(full)
    }
}

/// The layouts of a sharded model, by parameter path.
#[derive(Debug, Clone, Default)]
pub struct Sharding {
    pub layouts: BTreeMap<String, ShardLayout>,
    /// The registry id of the shard group of each sharded parameter.
    pub groups: BTreeMap<String, u64>,
    /// Each sharded parameter's key (unique in the process): what its unshard op carries, so
    /// the overlap ([`overlap`]) can prefetch and reduce it on the communication stream.
    pub keys: BTreeMap<String, u64>,
}

impl Sharding {
    pub fn layout(&self, path: &str) -> Option<&ShardLayout> {
        self.layouts.get(path)
    }
}

/// The reparameterization a sharded parameter carries: its value is the all-gather of the
/// stored shard, narrowed to the parameter's rows.
#[derive(Module, Debug)]
pub struct FsdpParam {
    pub group: u64,
    pub rows: usize,
    /// Gathered again in backward instead of kept from forward.
    pub reshard: bool,
    /// The parameter's key in [`Sharding::keys`].
    pub key: u64,
}

impl Reparameterization for FsdpParam {
    const NAME: &'static str = "fsdp";

    fn apply<const D: usize>(&self, shard: Tensor<D>) -> Tensor<D> {
        fsdp_unshard(shard, self.group, self.rows, self.reshard, self.key)
    }
}

static NEXT_KEY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

struct FullyShard<'a, F> {
    group_of: F,
    reshard: bool,
    out: &'a mut Sharding,
}

impl<F: Fn(&str) -> Option<GroupHandle>> Reparameterizer for FullyShard<'_, F> {
    type Reparam = FsdpParam;

    fn reparameterize<const D: usize>(
        &mut self,
        path: &str,
        param: Param<Tensor<D>>,
    ) -> (Param<Tensor<D>>, Option<FsdpParam>) {
        let Some(group) = (self.group_of)(path) else { return (param, None) };
        let rows = param.lazy_shape()[0];
        let layout = ShardLayout::new(rows, group.size(), group.rank());
        self.out.layouts.insert(path.to_string(), layout);
        self.out.groups.insert(path.to_string(), group.id());
        let key = NEXT_KEY.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.out.keys.insert(path.to_string(), key);
        let sharded = param.map(|full| {
            let (device, shape) = (full.device(), full.dims().to_vec());
            let data = full.into_data().convert::<f32>().try_into_vec::<f32>().expect("f32 parameter");
            let (shard, shard_shape) = layout.shard(&data, &shape);
            leaf(Tensor::<D>::from_data(TensorData::new(shard, shard_shape), &device))
        });
        (sharded, Some(FsdpParam { group: group.id(), rows, reshard: self.reshard, key }))
    }
}

/// `t` as a new trainable leaf (its own values, no graph history).
pub(crate) fn leaf<const D: usize>(t: Tensor<D>) -> Tensor<D> {
    let device = t.device();
    let t = Tensor::<D>::from_data(t.into_data(), &device);
    if device.is_autodiff() {
        t.require_grad()
    } else {
        t
    }
}

/// Shards every parameter of `model` along dim 0 over `group` (TorchTitan applies `fully_shard`
/// per block and then to the root; here every parameter is its own unit, gathered when read).
/// Each parameter is materialised in full once, one at a time, to cut out this rank's rows.
/// `reshard`: reshard after forward (the gathered values are freed and gathered again in
/// backward).
pub fn fully_shard<M: Module>(model: M, group: &GroupHandle, reshard: bool) -> (M, Sharding) {
    fully_shard_by(model, reshard, |_| Some(group.clone()))
}

/// [`fully_shard`] with a group per parameter (`group_of(path)`; `None` leaves it whole):
/// expert parallelism shards the routed experts over their own group.
pub fn fully_shard_by<M: Module>(
    model: M,
    reshard: bool,
    group_of: impl Fn(&str) -> Option<GroupHandle>,
) -> (M, Sharding) {
    let mut out = Sharding::default();
    let model = model.apply_reparameterization(FullyShard { group_of, reshard, out: &mut out });
    (model, out)
}

pub mod overlap;
mod replica;
#[cfg(test)]
mod tests;
