//! DDP's gradient all-reduce issued as gradients become ready (PyTorch DDP's reducer), on the
//! rank's [`CommStream`] over a duplicate of the replica group.
//!
//! Every replicated parameter carries a hook ([`DdpParam`], an identity op on each read whose
//! backward hands the gradient over as it passes). In the step's last backward pass (the last
//! microbatch), a parameter's gradient is complete once as many gradients arrived as the
//! forward read it; it is then added to what the earlier microbatches accumulated — on the
//! host, the same float32 additions in the same order as the trainer's accumulation (a
//! pass's arrivals summed first, then added to the accumulator) — and appended to the open
//! bucket; a full bucket (`bucket_bytes`) is all-reduced at once while backward goes on.
//! [`finish`] all-reduces the last bucket, waits for all, and writes the sums into the
//! accumulated gradients; the parameters it did not complete (none, in a regular model) are
//! left to the synchronous all-reduce. The reduction is the communicator's rank-order sum, which
//! does not depend on how gradients are bucketed, so the numbers are those of the synchronous
//! path bit for bit (on the CPU; a GPU may flush denormals in its own additions).
//!
//! Used where the replica group is the only one a parameter's gradient is reduced over (DDP
//! without FSDP, TP, CP, EP or PP); HSDP's replica all-reduce follows FSDP's reduce-scatters on
//! FSDP's stream (`fsdp::replica`).

use super::pass_sum::PassSum;
use crate::comm::stream::{CommStream, Pending, StreamStats};
use crate::comm::{CommExt, CommResult, Communicator, ReduceOp};
use burn::module::{Module, ModuleVisitor, Param, ParamId, Reparameterization, Reparameterizer};
use burn::optim::GradientsParams;
use burn::prelude::*;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

static NEXT_KEY: AtomicU64 = AtomicU64::new(1);

/// The hook a replicated parameter carries: its value is itself, through
/// [`crate::autograd::grad_ready`].
#[derive(Module, Debug)]
pub struct DdpParam {
    pub key: u64,
}

impl Reparameterization for DdpParam {
    const NAME: &'static str = "ddp";

    fn apply<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        count_read(self.key);
        crate::autograd::grad_ready(x, self.key)
    }
}

struct Hook<'a> {
    keys: &'a mut BTreeMap<String, u64>,
}

impl Reparameterizer for Hook<'_> {
    type Reparam = DdpParam;

    fn reparameterize<const D: usize>(
        &mut self,
        path: &str,
        param: Param<Tensor<D>>,
    ) -> (Param<Tensor<D>>, Option<DdpParam>) {
        let key = NEXT_KEY.fetch_add(1, Ordering::Relaxed);
        self.keys.insert(path.to_string(), key);
        (param, Some(DdpParam { key }))
    }
}

/// Hooks every parameter of `model`; returns the keys by parameter path.
pub fn hook_gradients<M: Module>(model: M) -> (M, BTreeMap<String, u64>) {
    let mut keys = BTreeMap::new();
    let model = model.apply_reparameterization(Hook { keys: &mut keys });
    (model, keys)
}

/// One parameter's gradient in the last pass: its sum so far and how many gradients arrived.
#[derive(Default)]
struct Part {
    sum: PassSum,
    arrived: usize,
}

type Job = Pending<CommResult<Vec<f32>>>;

struct DdpOverlap {
    stream: CommStream,
    comm: Arc<dyn Communicator>,
    bucket_bytes: usize,
    /// The forward of the last pass is counting reads; its backward hands gradients over.
    counting: bool,
    armed: bool,
    reads: HashMap<u64, usize>,
    parts: HashMap<u64, Part>,
    epoch: usize,
    bucket: Vec<(u64, usize)>,
    data: Vec<f32>,
    jobs: Vec<(Vec<(u64, usize)>, Job)>,
}

thread_local! {
    static STATE: RefCell<Option<DdpOverlap>> = const { RefCell::new(None) };
}

/// Turns the overlap on for this rank: starts its stream and duplicates the replica group
/// (collective: every replica calls it at the same point).
pub fn enable(replicate: &dyn Communicator, bucket_bytes: usize) -> CommResult<()> {
    let comm: Arc<dyn Communicator> = replicate.duplicate()?.into();
    let state = DdpOverlap {
        stream: CommStream::new("titan-rs ddp stream"),
        comm,
        bucket_bytes,
        counting: false,
        armed: false,
        reads: HashMap::new(),
        parts: HashMap::new(),
        epoch: 0,
        bucket: Vec::new(),
        data: Vec::new(),
        jobs: Vec::new(),
    };
    STATE.with(|s| *s.borrow_mut() = Some(state));
    Ok(())
}

pub fn is_enabled() -> bool {
    STATE.with(|s| s.borrow().is_some())
}

fn count_read(key: u64) {
    STATE.with(|s| {
        if let Some(o) = s.borrow_mut().as_mut().filter(|o| o.counting) {
            *o.reads.entry(key).or_default() += 1;
        }
    });
}

/// The step's last backward pass is next: `acc` holds the earlier microbatches' gradients
/// (read to the host here, for the completed sums), `keys` the hooked parameters.
pub fn begin_last_pass<M: Module>(model: &M, keys: &BTreeMap<String, u64>, acc: &GradientsParams, record_trace: bool) {
    struct Snapshot<'a> {
        path: Vec<String>,
        keys: &'a BTreeMap<String, u64>,
        acc: &'a GradientsParams,
        out: HashMap<u64, Part>,
    }
    impl ModuleVisitor for Snapshot<'_> {
        titan_models::track_module_path!();
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            let Some(&key) = self.keys.get(&self.path.join(".")) else { return };
            let total = self.acc.get::<D>(p.id).map(titan_kernels::transfer::to_host_f32);
            self.out.insert(key, Part { sum: PassSum::from_total(total), arrived: 0 });
        }
    }
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        let Some(o) = s.as_mut() else { return };
        let mut v = Snapshot { path: Vec::new(), keys, acc, out: HashMap::new() };
        model.visit(&mut v);
        o.parts = v.out;
        o.reads.clear();
        o.counting = true;
        o.armed = true;
        o.epoch = 0;
        o.bucket.clear();
        o.data.clear();
        o.jobs.clear();
        o.stream.record_events(record_trace);
    });
}

/// The forward of the last pass is over (reads are counted).
pub fn end_forward() {
    STATE.with(|s| {
        if let Some(o) = s.borrow_mut().as_mut() {
            o.counting = false;
        }
    });
}

/// Marks the end of one backward pass (see `fsdp::overlap::seal_epoch`).
pub fn seal_epoch() {
    STATE.with(|s| {
        if let Some(o) = s.borrow_mut().as_mut().filter(|o| o.armed) {
            o.epoch += 1;
        }
    });
}

impl DdpOverlap {
    fn submit_bucket(&mut self) {
        if self.bucket.is_empty() {
            return;
        }
        let (members, mut data) = (std::mem::take(&mut self.bucket), std::mem::take(&mut self.data));
        let comm = self.comm.clone();
        let job = self.stream.submit("ddp.all_reduce", data.len() * 4, move || {
            comm.all_reduce(&mut data, ReduceOp::Sum)?;
            Ok(data)
        });
        self.jobs.push((members, job));
    }
}

/// A gradient of parameter `key` passing its hook in backward (`grad` reads it to the host).
pub(crate) fn on_grad(key: u64, grad: impl FnOnce() -> Vec<f32>) {
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        let Some(o) = s.as_mut().filter(|o| o.armed && !o.counting) else { return };
        let (epoch, reads) = (o.epoch, o.reads.get(&key).copied().unwrap_or(0));
        let Some(part) = o.parts.get_mut(&key) else { return };
        part.sum.add(epoch, grad());
        part.arrived += 1;
        if part.arrived == reads {
            let total = part.sum.take().expect("a completed gradient");
            o.bucket.push((key, total.len()));
            o.data.extend_from_slice(&total);
            if o.data.len() * 4 >= o.bucket_bytes {
                o.submit_bucket();
            }
        }
    });
}

/// Ends the last pass: all-reduces the open bucket, waits for every bucket and writes the sums
/// into `acc`. Returns the parameters it reduced (the synchronous all-reduce skips them) and
/// what the stream did; `None` when the overlap is off.
pub fn finish<M: Module>(
    model: &M,
    keys: &BTreeMap<String, u64>,
    acc: &mut GradientsParams,
) -> CommResult<Option<(HashSet<ParamId>, StreamStats)>> {
    let taken = STATE.with(|s| {
        let mut s = s.borrow_mut();
        let o = s.as_mut().filter(|o| o.armed)?;
        o.submit_bucket();
        o.armed = false;
        o.counting = false;
        o.parts.clear();
        let jobs = std::mem::take(&mut o.jobs);
        let mut out: HashMap<u64, Vec<f32>> = HashMap::new();
        let mut error = None;
        for (members, job) in jobs {
            match o.stream.wait(job) {
                Ok(data) => {
                    let mut at = 0;
                    for (key, len) in members {
                        out.insert(key, data[at..at + len].to_vec());
                        at += len;
                    }
                }
                Err(e) => {
                    error.get_or_insert(e);
                }
            }
        }
        Some((out, error, o.stream.take_stats()))
    });
    let Some((mut reduced, error, stats)) = taken else { return Ok(None) };
    if let Some(e) = error {
        return Err(e);
    }
    struct Put<'a> {
        path: Vec<String>,
        keys: &'a BTreeMap<String, u64>,
        reduced: &'a mut HashMap<u64, Vec<f32>>,
        acc: &'a mut GradientsParams,
        done: HashSet<ParamId>,
    }
    impl ModuleVisitor for Put<'_> {
        titan_models::track_module_path!();
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            let Some(data) = self.keys.get(&self.path.join(".")).and_then(|k| self.reduced.remove(k)) else { return };
            // The accumulated gradient holds this rank's sum; the reduced one replaces it.
            let Some(mine) = self.acc.remove::<D>(p.id) else { return };
            let (dims, dtype, device) = (mine.dims(), mine.dtype(), mine.device());
            let data = TensorData::new(data, dims).convert_dtype(dtype);
            self.acc.register::<D>(p.id, titan_kernels::transfer::to_device::<D, Float>(data, &device));
            self.done.insert(p.id);
        }
    }
    let mut put = Put { path: Vec::new(), keys, reduced: &mut reduced, acc, done: HashSet::new() };
    model.visit(&mut put);
    Ok(Some((put.done, stats)))
}
