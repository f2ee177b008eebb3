//! FSDP's communication hidden behind compute (FSDP2's all-gather prefetch and asynchronous
//! reduce-scatter), on the rank's [`CommStream`].
//!
//! While a training step is *armed* ([`begin_step`] … [`end_step`]), every FSDP collective of
//! this rank runs on the stream, over duplicates of the shard groups:
//! - **All-gather prefetch.** The parameters are gathered in the order the previous step
//!   gathered them (forward, and under reshard-after-forward again in backward). When one is
//!   read, the rest of its unit (a transformer block, or a parameter outside the blocks) and
//!   the next `depth` units are queued, so their gathers run while this one's block computes.
//!   The first step has no history and gathers on demand; a step that reads in another order
//!   stops prefetching for its remainder (correct, just not overlapped).
//! - **Asynchronous reduce-scatter.** Backward queues each gradient's reduce-scatter and goes
//!   on; [`end_step`] waits for them and adds each into the accumulated gradients exactly as
//!   the synchronous path would (the contributions of one backward pass summed first, then
//!   added to the accumulator), so the numbers are bit for bit those of the synchronous path.
//!
//! - **HSDP's replica all-reduce** ([`super::replica`], when enabled with the replica group):
//!   in the step's last backward pass each completed gradient is all-reduced over the replicas
//!   on the same stream, in buckets, while backward goes on.
//!
//! Every rank of a shard group gathers and reduces the same parameters in the same order (the
//! same program on the same model), and the stream runs jobs in submission order, so the
//! collective order on each duplicated group is the same on every rank. Other collectives (TP,
//! CP, EP, the all-reduce of gradients that TP leaves partial) stay synchronous on the rank's
//! own groups.

use super::replica::{Reduced, Replica};
use crate::comm::stream::{CommStream, Pending, StreamStats};
use crate::comm::{CommError, CommExt, CommResult, Communicator, ReduceOp};
use crate::fsdp::Sharding;
use crate::registry::{with_group, GroupHandle};
use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::prelude::*;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

type Reader = Arc<dyn Fn() -> Vec<f32> + Send + Sync>;
pub(super) type Job = Pending<CommResult<Vec<f32>>>;

/// One sharded parameter as this step sees it.
struct Shard {
    read: Reader,
    group: u64,
    rows: usize,
    /// Rows per shard (the last shards zero-padded).
    chunk: usize,
    unit: usize,
    param: ParamId,
    /// Elements of the gathered (padded) parameter.
    numel: usize,
    /// Part of a transformer block (its unit is the block).
    in_block: bool,
    /// Its gradient is all-reduced over the replicas next (HSDP), on the stream.
    replicated: bool,
}

/// A queued reduce-scatter: which backward pass (epoch) produced it, for which parameter; its
/// result once waited for.
struct GradJob {
    epoch: usize,
    key: u64,
    shape: Vec<usize>,
    dtype: burn::tensor::DType,
    job: Result<Job, CommResult<Vec<f32>>>,
    /// The padded gradient the queued job holds (host bytes).
    bytes: usize,
    /// Its result went into the parameter's replica sum (HSDP), not back to the trainer.
    summed: bool,
}

struct Overlap {
    stream: CommStream,
    /// Duplicates of the shard groups, by the registered group's id.
    comms: HashMap<u64, Arc<dyn Communicator>>,
    depth: usize,
    armed: bool,
    shards: HashMap<u64, Shard>,
    /// The gather order of the previous step and of this one, by key.
    last: Vec<u64>,
    now: Vec<u64>,
    diverged: bool,
    /// Gathers queued ahead, by position in `last`.
    issued: HashMap<usize, Job>,
    next_issue: usize,
    epoch: usize,
    grads: Vec<GradJob>,
    /// Bytes of gradients queued and not yet waited for, and their bound: as many units as
    /// the prefetch keeps gathered (`depth + 1`, of the largest unit), so a stream slower than
    /// backward holds back backward instead of every gradient's host copy.
    queued: usize,
    queue_limit: usize,
    /// `grads[..waited]` hold their results.
    waited: usize,
    /// HSDP: the replica all-reduce on this stream.
    replica: Option<Replica>,
}

thread_local! {
    static STATE: RefCell<Option<Overlap>> = const { RefCell::new(None) };
}

/// Turns overlap on for this rank (on its own thread): starts the stream and duplicates each
/// shard group (collective: every rank passes its groups in the same order). `depth`: units
/// gathered ahead of the one being read (0: a unit's parameters together, nothing further).
/// `replicas`: under HSDP, the replica group and the bucket size of its overlapped all-reduce.
pub fn enable(groups: &[&GroupHandle], depth: usize, replicas: Option<(&dyn Communicator, usize)>) -> CommResult<()> {
    let mut comms = HashMap::new();
    for g in groups {
        let dup = with_group(g.id(), |c| c.duplicate())?;
        comms.insert(g.id(), Arc::<dyn Communicator>::from(dup));
    }
    let replica = match replicas {
        Some((c, bucket_bytes)) => Some(Replica::new(c.duplicate()?.into(), bucket_bytes)),
        None => None,
    };
    let stream = CommStream::new("titan-rs comm stream");
    STATE.with(|s| {
        *s.borrow_mut() = Some(Overlap {
            stream,
            comms,
            depth,
            armed: false,
            shards: HashMap::new(),
            last: Vec::new(),
            now: Vec::new(),
            diverged: false,
            issued: HashMap::new(),
            next_issue: 0,
            epoch: 0,
            grads: Vec::new(),
            queued: 0,
            queue_limit: 0,
            waited: 0,
            replica,
        })
    });
    Ok(())
}

/// Turns overlap off on this thread (the stream finishes what is queued and ends).
pub fn disable() {
    STATE.with(|s| s.borrow_mut().take());
}

pub fn is_enabled() -> bool {
    STATE.with(|s| s.borrow().is_some())
}

/// Whether FSDP's collectives go to the stream now.
pub(crate) fn armed() -> bool {
    STATE.with(|s| s.borrow().as_ref().is_some_and(|o| o.armed))
}

/// The unit of a parameter path: its transformer block (`…layers.N`), or the parameter itself.
fn unit_of(path: &str) -> String {
    let parts: Vec<&str> = path.split('.').collect();
    match parts.iter().position(|p| *p == "layers") {
        Some(i) if i + 1 < parts.len() => parts[..i + 2].join("."),
        _ => path.to_string(),
    }
}

/// Arms the step: registers the current shard of every FSDP parameter of `model` (the
/// optimizer replaced them since the last step). `replicated`: the parameters whose gradient
/// only the replica all-reduce completes (HSDP overlaps it; the others stay synchronous).
/// Nothing when overlap is off.
pub fn begin_step<M: Module>(model: &M, sharding: &Sharding, record_trace: bool, replicated: &dyn Fn(ParamId) -> bool) {
    struct Collect<'a> {
        path: Vec<String>,
        sharding: &'a Sharding,
        units: HashMap<String, usize>,
        out: HashMap<u64, Shard>,
        replicated: &'a dyn Fn(ParamId) -> bool,
    }
    impl ModuleVisitor for Collect<'_> {
        titan_models::track_module_path!();
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            let path = self.path.join(".");
            let (Some(&key), Some(layout), Some(&group)) =
                (self.sharding.keys.get(&path), self.sharding.layouts.get(&path), self.sharding.groups.get(&path))
            else {
                return;
            };
            let n = self.units.len();
            let unit_name = unit_of(&path);
            let in_block = unit_name != path;
            let unit = *self.units.entry(unit_name).or_insert(n);
            let t = p.val().inner();
            let numel = t.shape().num_elements() * layout.size;
            let read: Reader =
                Arc::new(move || t.clone().into_data().convert::<f32>().try_into_vec::<f32>().expect("float32 shard"));
            self.out.insert(
                key,
                Shard {
                    read,
                    group,
                    rows: layout.rows,
                    chunk: layout.chunk,
                    unit,
                    param: p.id,
                    numel,
                    in_block,
                    replicated: (self.replicated)(p.id),
                },
            );
        }
    }
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        let Some(o) = s.as_mut() else { return };
        let mut c = Collect { path: Vec::new(), sharding, units: HashMap::new(), out: HashMap::new(), replicated };
        model.visit(&mut c);
        o.shards = c.out;
        // The bound counts in transformer blocks (the largest); a parameter outside them (the
        // output head can be larger than a block) is queued alone.
        let mut unit_bytes: HashMap<usize, usize> = HashMap::new();
        for sh in o.shards.values().filter(|sh| sh.in_block) {
            *unit_bytes.entry(sh.unit).or_default() += 4 * sh.numel;
        }
        o.queue_limit = (o.depth + 1) * unit_bytes.values().copied().max().unwrap_or(0);
        o.queued = 0;
        o.waited = 0;
        o.grads.clear(); // left by a step that failed before its end
        o.armed = true;
        o.diverged = false;
        o.now.clear();
        o.issued.clear();
        o.next_issue = 0;
        o.epoch = 0;
        if let Some(r) = o.replica.as_mut() {
            r.begin_step();
        }
        o.stream.record_events(record_trace);
    });
}

/// The step's last backward pass is next (HSDP: its forward counts each parameter's gathers,
/// the gradients its backward will bring).
pub fn begin_last_pass() {
    STATE.with(|s| {
        if let Some(o) = s.borrow_mut().as_mut().filter(|o| o.armed) {
            let epoch = o.epoch;
            if let Some(r) = o.replica.as_mut() {
                r.begin_last_pass(epoch);
            }
        }
    });
}

/// The forward of the last pass is over (a recompute's gathers in backward are not counted).
pub fn end_forward() {
    STATE.with(|s| {
        if let Some(r) = s.borrow_mut().as_mut().and_then(|o| o.replica.as_mut()) {
            r.end_forward();
        }
    });
}

impl Overlap {
    fn comm(&self, group: u64) -> Arc<dyn Communicator> {
        self.comms.get(&group).cloned().unwrap_or_else(|| panic!("FSDP group {group} has no duplicate for overlap"))
    }

    /// Queues the all-gather of parameter `key` (its shard from `data`, or read on the stream).
    fn submit_gather(&self, key: u64, data: Option<Vec<f32>>) -> Job {
        let s = &self.shards[&key];
        let (comm, read, rows, chunk) = (self.comm(s.group), s.read.clone(), s.rows, s.chunk);
        self.stream.submit("fsdp.all_gather", 0, move || {
            let shard = data.unwrap_or_else(|| read());
            let mut full = vec![0f32; shard.len() * comm.size()];
            comm.all_gather(&shard, &mut full)?;
            full.truncate(rows * (shard.len() / chunk.max(1)));
            Ok(full)
        })
    }

    /// Queues the gathers that follow position `i` of the last step's order, up to `depth`
    /// units past the unit at `i`.
    fn prefetch_after(&mut self, i: usize) {
        let Some(&here) = self.last.get(i) else { return };
        let Some(mut unit) = self.shards.get(&here).map(|s| s.unit) else { return };
        let mut ahead = 0;
        for j in (i + 1)..self.last.len() {
            let Some(s) = self.shards.get(&self.last[j]) else { break };
            if s.unit != unit {
                ahead += 1;
                unit = s.unit;
            }
            if ahead > self.depth {
                break;
            }
            if j >= self.next_issue {
                let job = self.submit_gather(self.last[j], None);
                self.issued.insert(j, job);
                self.next_issue = j + 1;
            }
        }
    }
}

/// The gathered value (all `rows` rows) of FSDP parameter `key`, whose shard `shard` reads.
/// `None` when the step is not armed or the parameter is not registered: gather synchronously.
pub(crate) fn gather(key: u64, shard: impl FnOnce() -> Vec<f32>) -> Option<CommResult<Vec<f32>>> {
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        let o = s.as_mut().filter(|o| o.armed && o.shards.contains_key(&key))?;
        let i = o.now.len();
        o.now.push(key);
        if let Some(r) = o.replica.as_mut() {
            r.count_gather(key);
        }
        if !o.diverged && !o.last.is_empty() && o.last.get(i) != Some(&key) {
            o.diverged = true; // another order than last step: no more prefetching this step
        }
        let job = match o.issued.remove(&i).filter(|_| !o.diverged) {
            Some(job) => job,
            None => o.submit_gather(key, Some(shard())),
        };
        if !o.diverged {
            o.prefetch_after(i);
        }
        Some(o.stream.wait(job))
    })
}

/// Queues the reduce-scatter of parameter `key`'s gradient (`grad`, `shape` with the
/// parameter's rows, zero-padded to `chunk` rows per rank); [`end_step`] collects it. `false`
/// when the step is not armed: reduce synchronously.
pub(crate) fn reduce_scatter(
    key: u64,
    grad: impl FnOnce() -> Vec<f32>,
    shape: &[usize],
    chunk: usize,
    dtype: burn::tensor::DType,
) -> bool {
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        let Some(o) = s.as_mut().filter(|o| o.armed && o.shards.contains_key(&key)) else { return false };
        let comm = o.comm(o.shards[&key].group);
        let n = comm.size();
        let inner: usize = shape[1..].iter().product();
        let mut data = grad();
        data.resize(chunk * n * inner, 0.0);
        let bytes = data.len() * 4;
        // HSDP: float32 gradients are summed on the stream for its replica all-reduce.
        let epoch = o.epoch;
        let sum = match (o.replica.as_mut(), o.shards[&key].replicated && dtype == burn::tensor::DType::F32) {
            (Some(r), true) => Some(r.sum_of(key)),
            _ => None,
        };
        let summed = sum.is_some();
        let job = o.stream.submit("fsdp.reduce_scatter", bytes, move || {
            let mut out = vec![0f32; chunk * inner];
            comm.reduce_scatter(&data, &mut out, ReduceOp::Sum)?;
            match sum {
                Some(sum) => {
                    sum.lock().expect("gradient sum").add(epoch, out);
                    Ok(Vec::new())
                }
                None => Ok(out),
            }
        });
        if let (true, Some(r)) = (summed, o.replica.as_mut()) {
            r.queued(key, epoch, chunk * inner, &o.stream);
        }
        let mut shard_shape = shape.to_vec();
        shard_shape[0] = chunk;
        o.grads.push(GradJob { epoch, key, shape: shard_shape, dtype, job: Ok(job), bytes, summed });
        o.queued += bytes;
        // Over the bound: wait for the oldest queued ones (their results are kept).
        let mut i = o.waited;
        while o.queued > o.queue_limit && i + 1 < o.grads.len() {
            let g = &mut o.grads[i];
            let done = match std::mem::replace(&mut g.job, Err(Ok(Vec::new()))) {
                Ok(job) => o.stream.wait(job),
                Err(done) => done,
            };
            g.job = Err(done);
            o.queued -= g.bytes;
            i += 1;
            o.waited = i;
        }
        true
    })
}

/// Marks the end of one backward pass (one `Gradients` turned into parameter gradients): the
/// reduce-scatters queued so far are summed among themselves before joining the accumulator.
pub fn seal_epoch() {
    STATE.with(|s| {
        if let Some(o) = s.borrow_mut().as_mut().filter(|o| o.armed) {
            o.epoch += 1;
        }
    });
}

/// Ends the armed step: waits for the queued reduce-scatters and adds them to `acc` (per
/// parameter, the contributions of each backward pass summed in order, then added to the
/// accumulator in order — as the synchronous path's autodiff and accumulation do), waits out
/// unused prefetches, and keeps this step's gather order for the next. Under HSDP the
/// gradients the stream all-reduced over the replicas go into `acc` final and their parameters
/// into `all_reduced` (the synchronous all-reduce skips them). Returns what the stream did
/// (busy, exposed, its trace events); `None` when overlap is off.
pub fn end_step<M: Module>(
    model: &M,
    acc: &mut GradientsParams,
    all_reduced: &mut HashSet<ParamId>,
) -> CommResult<Option<StreamStats>> {
    let taken = STATE.with(|s| {
        let mut s = s.borrow_mut();
        let o = s.as_mut()?;
        o.armed = false;
        o.last = std::mem::take(&mut o.now);
        let grads = std::mem::take(&mut o.grads);
        let unused: Vec<Job> = o.issued.drain().map(|(_, j)| j).collect();
        let params: HashMap<u64, ParamId> = o.shards.iter().map(|(k, s)| (*k, s.param)).collect();
        o.shards.clear();
        let mut results = Vec::with_capacity(grads.len());
        let mut summed = HashMap::new();
        let mut first_error = None;
        for g in grads {
            let result = match g.job {
                Ok(job) => o.stream.wait(job),
                Err(done) => done,
            };
            match result {
                Ok(_) if g.summed => {
                    summed.insert(g.key, (g.shape, g.dtype));
                }
                Ok(data) => results.push((params[&g.key], g.epoch, g.shape, g.dtype, data)),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        for j in unused {
            if let Err(e) = o.stream.wait(j) {
                first_error.get_or_insert(e);
            }
        }
        // HSDP: each summed gradient, all-reduced over the replicas or this rank's sum alone.
        let mut replicas = Vec::new();
        if let Some(r) = o.replica.as_mut() {
            match r.finish(&o.stream) {
                Ok(out) => {
                    for (key, reduced) in out {
                        // Missing only where its reduce-scatter failed (that error is returned).
                        if let Some((shape, dtype)) = summed.remove(&key) {
                            replicas.push((params[&key], shape, dtype, reduced));
                        }
                    }
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        Some((results, replicas, first_error, o.stream.take_stats()))
    });
    let Some((results, replicas, error, stats)) = taken else { return Ok(None) };
    if let Some(e) = error {
        return Err(e);
    }
    let mut by_param: HashMap<ParamId, Vec<(usize, Vec<usize>, burn::tensor::DType, Vec<f32>)>> = HashMap::new();
    for (id, epoch, shape, dtype, data) in results {
        by_param.entry(id).or_default().push((epoch, shape, dtype, data));
    }
    // HSDP: a gradient all-reduced over the replicas is final (only this function brings a
    // sharded parameter's gradient into the accumulator); this rank's sum alone joins it as one
    // pass's would, for the synchronous all-reduce.
    let mut finals = HashMap::new();
    for (id, shape, dtype, reduced) in replicas {
        match reduced {
            Reduced::Done(data) => {
                finals.insert(id, (shape, dtype, data));
            }
            Reduced::Local(data) => by_param.entry(id).or_default().push((usize::MAX, shape, dtype, data)),
        }
    }
    struct Add<'a> {
        acc: &'a mut GradientsParams,
        by_param: HashMap<ParamId, Vec<(usize, Vec<usize>, burn::tensor::DType, Vec<f32>)>>,
        finals: HashMap<ParamId, (Vec<usize>, burn::tensor::DType, Vec<f32>)>,
        all_reduced: &'a mut HashSet<ParamId>,
    }
    impl ModuleVisitor for Add<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            let device = p.val().device();
            let to_device = |shape: Vec<usize>, dtype, data| {
                let shape: [usize; D] = shape.try_into().expect("gradient rank");
                let data = TensorData::new(data, shape).convert_dtype(dtype);
                titan_kernels::transfer::to_device::<D, Float>(data, &device).inner()
            };
            if let Some((shape, dtype, data)) = self.finals.remove(&p.id) {
                if self.acc.get::<D>(p.id).is_none() {
                    self.acc.register::<D>(p.id, to_device(shape, dtype, data));
                    self.all_reduced.insert(p.id);
                    return;
                }
                self.finals.insert(p.id, (shape, dtype, data)); // reported below
            }
            let Some(parts) = self.by_param.remove(&p.id) else { return };
            let mut epoch_sum: Option<(usize, Tensor<D>)> = None;
            let flush = |acc: &mut GradientsParams, g: Tensor<D>| {
                let sum = match acc.remove::<D>(p.id) {
                    Some(a) => a + g,
                    None => g,
                };
                acc.register::<D>(p.id, sum);
            };
            for (epoch, shape, dtype, data) in parts {
                let g = to_device(shape, dtype, data);
                epoch_sum = match epoch_sum.take() {
                    Some((e, s)) if e == epoch => Some((e, s + g)),
                    Some((_, s)) => {
                        flush(self.acc, s);
                        Some((epoch, g))
                    }
                    None => Some((epoch, g)),
                };
            }
            if let Some((_, s)) = epoch_sum {
                flush(self.acc, s);
            }
        }
    }
    let mut add = Add { acc, by_param, finals, all_reduced };
    model.visit(&mut add);
    if let Some(id) = add.by_param.keys().chain(add.finals.keys()).next() {
        return Err(CommError::Invalid(format!(
            "reduce-scattered gradient of parameter {id} not in the model, or already in the accumulated gradients"
        )));
    }
    Ok(Some(stats))
}
