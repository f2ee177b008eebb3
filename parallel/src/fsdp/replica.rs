//! HSDP's replica all-reduce overlapped with backward (FSDP2's HSDP: the all-reduce follows
//! each reduce-scatter on the reduce-scatter stream).
//!
//! Under HSDP a sharded gradient is reduce-scattered over the shard group and then all-reduced
//! over the replicas. The synchronous path all-reduces after the step's last backward pass,
//! on the accumulated gradient. Here, every queued reduce-scatter of such a parameter adds its
//! result into the parameter's [`PassSum`] on the stream (the trainer's accumulation order: a
//! pass's gradients summed first, then added to the earlier passes'); in the step's last pass,
//! once a parameter has received as many gradients as its forward gathered it, its sum joins
//! the open bucket, and a full bucket (`bucket_bytes`) is all-reduced on the stream while
//! backward goes on. The communicator's reduction does not depend on the bucketing, so the
//! result equals the synchronous path's bit for bit. A parameter whose gradients do not match
//! the count (none, in a regular model) keeps its plain sum for the synchronous all-reduce.

use super::overlap::Job;
use crate::comm::stream::CommStream;
use crate::comm::{CommExt, CommResult, Communicator, ReduceOp};
use crate::ddp::pass_sum::PassSum;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

pub(super) type Sum = Arc<Mutex<PassSum>>;

/// A bucket's members: parameter key, elements, and its gradients counted when it was issued.
type Members = Vec<(u64, usize, usize)>;

pub(super) struct Replica {
    comm: Arc<dyn Communicator>,
    bucket_bytes: usize,
    /// The forward of the step's last pass is counting gathers.
    counting: bool,
    last_epoch: Option<usize>,
    reads: HashMap<u64, usize>,
    arrived: HashMap<u64, usize>,
    sums: HashMap<u64, Sum>,
    bucket: Members,
    bucket_len: usize,
    jobs: Vec<(Members, Job)>,
}

/// What the step's replica all-reduce produced, by parameter key.
pub(super) enum Reduced {
    /// All-reduced over the replicas: the gradient is final.
    Done(Vec<f32>),
    /// This rank's sum only: the synchronous all-reduce completes it.
    Local(Vec<f32>),
}

impl Replica {
    pub fn new(comm: Arc<dyn Communicator>, bucket_bytes: usize) -> Self {
        Self {
            comm,
            bucket_bytes,
            counting: false,
            last_epoch: None,
            reads: HashMap::new(),
            arrived: HashMap::new(),
            sums: HashMap::new(),
            bucket: Vec::new(),
            bucket_len: 0,
            jobs: Vec::new(),
        }
    }

    pub fn begin_step(&mut self) {
        *self = Self::new(self.comm.clone(), self.bucket_bytes);
    }

    /// The step's last backward pass is `epoch`; its forward comes next.
    pub fn begin_last_pass(&mut self, epoch: usize) {
        self.counting = true;
        self.last_epoch = Some(epoch);
    }

    pub fn end_forward(&mut self) {
        self.counting = false;
    }

    pub fn count_gather(&mut self, key: u64) {
        if self.counting {
            *self.reads.entry(key).or_default() += 1;
        }
    }

    /// Where the reduce-scatter of parameter `key` adds its result (on the stream).
    pub fn sum_of(&mut self, key: u64) -> Sum {
        self.sums.entry(key).or_default().clone()
    }

    /// A reduce-scatter of parameter `key` (`len` elements) of pass `epoch` was queued after
    /// its sum's earlier ones; the last expected one of the last pass issues its all-reduce.
    pub fn queued(&mut self, key: u64, epoch: usize, len: usize, stream: &CommStream) {
        if self.last_epoch != Some(epoch) || self.counting {
            return;
        }
        let arrived = self.arrived.entry(key).or_default();
        *arrived += 1;
        if Some(&*arrived) == self.reads.get(&key) {
            self.bucket.push((key, len, *arrived));
            self.bucket_len += len;
            if self.bucket_len * 4 >= self.bucket_bytes {
                self.submit(stream);
            }
        }
    }

    fn submit(&mut self, stream: &CommStream) {
        if self.bucket.is_empty() {
            return;
        }
        let members = std::mem::take(&mut self.bucket);
        let sums: Vec<Sum> = members.iter().map(|(k, _, _)| self.sums[k].clone()).collect();
        let (comm, len) = (self.comm.clone(), std::mem::take(&mut self.bucket_len));
        // Runs after the members' reduce-scatters (the stream keeps submission order).
        let job = stream.submit("hsdp.all_reduce", len * 4, move || {
            let mut data = Vec::with_capacity(len);
            for s in &sums {
                data.extend(s.lock().expect("gradient sum").snapshot().unwrap_or_default());
            }
            if data.len() != len {
                return Err(crate::comm::CommError::Invalid(format!("HSDP bucket of {len} elements summed {}", data.len())));
            }
            comm.all_reduce(&mut data, ReduceOp::Sum)?;
            Ok(data)
        });
        self.jobs.push((members, job));
    }

    /// Ends the step (after every reduce-scatter was waited for): all-reduces the open bucket,
    /// waits for every bucket, and returns each summed parameter's gradient.
    pub fn finish(&mut self, stream: &CommStream) -> CommResult<HashMap<u64, Reduced>> {
        self.submit(stream);
        let mut first_error = None;
        let mut done = HashMap::new();
        for (members, job) in std::mem::take(&mut self.jobs) {
            match stream.wait(job) {
                Ok(data) => {
                    let mut at = 0;
                    for (key, len, arrived) in members {
                        // A gradient that came after the all-reduce was issued: not final.
                        if self.arrived.get(&key) == Some(&arrived) {
                            done.insert(key, data[at..at + len].to_vec());
                        }
                        at += len;
                    }
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        let mut out = HashMap::new();
        for (key, sum) in std::mem::take(&mut self.sums) {
            let reduced = match done.remove(&key) {
                Some(d) => Reduced::Done(d),
                None => match sum.lock().expect("gradient sum").take() {
                    Some(local) => Reduced::Local(local),
                    None => continue,
                },
            };
            out.insert(key, reduced);
        }
        Ok(out)
    }
}
