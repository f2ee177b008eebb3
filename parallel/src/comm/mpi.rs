//! The `mpi` backend (cargo feature `mpi`): one rank per process, over MPI (rsmpi on OpenMPI).
//!
//! Collectives use the same exchange as the `local` backend — every rank's call header is
//! all-gathered and compared first (a mismatch is an error naming both calls), then the data is
//! all-gathered and reduced in rank order — so an MPI run gives bitwise the same numbers as a
//! threads run. Waits poll non-blocking requests against the watchdog's timeout; on a timeout the
//! rank appends what it waited for to the hang report, gives the other ranks a moment to do the
//! same, names the ranks that never arrived, and aborts the MPI job, so no process is left
//! hanging.
//!
//! Sub-groups are made with `MPI_Comm_split`, so every rank of the parent must call
//! [`Communicator::sub_group`] at the same point, each with its own group — as mesh setup does.

use super::exchange::{self, Exchange};
use super::watchdog::{self, Watchdog};
use super::{CallInfo, CommError, CommResult, Communicator, DType, ReduceOp};
use mpi::environment::{Threading, Universe};
use mpi::point_to_point::MatchedReceiveVec;
use mpi::request::{scope, StaticScope};
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::Communicator as _;
use mpi::traits::*;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const KINDS: &[&str] = &["all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier", "send"];
const HEADER: usize = 6;

/// The initialised MPI environment of this process.
pub struct MpiWorld {
    universe: Arc<Universe>,
    watchdog: Arc<Watchdog>,
    multiple: bool,
}

impl MpiWorld {
    /// Initialises MPI (once per process).
    pub fn init(timeout: Duration) -> Result<Self, CommError> {
        // Thread-multiple: the background communication stream (`stream.rs`) runs collectives
        // on duplicated communicators while the rank's thread runs its own.
        let (universe, level) = mpi::initialize_with_threading(Threading::Multiple)
            .ok_or_else(|| CommError::Invalid("MPI was already initialised in this process".into()))?;
        let multiple = level == Threading::Multiple;
        Ok(Self { universe: Arc::new(universe), watchdog: Arc::new(Watchdog::new(timeout)), multiple })
    }

    pub fn communicator(&self) -> MpiComm {
        let comm = self.universe.world();
        let size = comm.size() as usize;
        let mut c = MpiComm::new(comm, (0..size).collect(), self.universe.clone(), self.watchdog.clone());
        c.multiple = self.multiple;
        c
    }

    /// Ends every process of the job with `code`.
    pub fn abort(&self, code: i32) -> ! {
        self.universe.world().abort(code)
    }
}

struct Pending {
    request: mpi::request::Request<'static, [u8], StaticScope>,
    buf: *mut [u8],
}

pub struct MpiComm {
    comm: SimpleCommunicator,
    ranks: Vec<usize>,
    rank: usize,
    seq: AtomicU64,
    watchdog: Arc<Watchdog>,
    history: Mutex<VecDeque<String>>,
    outbox: Mutex<Vec<Pending>>,
    /// MPI gave `MPI_THREAD_MULTIPLE` (duplicates may be driven from another thread).
    multiple: bool,
    _universe: Arc<Universe>,
}

// SAFETY: a communicator is driven from one thread at a time (its rank's thread, or for a
// duplicate the rank's communication stream, which needs and checks `MPI_THREAD_MULTIPLE`). The raw buffers in `outbox` are owned by it until their sends complete.
unsafe impl Send for MpiComm {}
unsafe impl Sync for MpiComm {}

fn encode(seq: u64, i: &CallInfo) -> [u64; HEADER] {
    let kind = KINDS.iter().position(|k| *k == i.kind).unwrap_or(usize::MAX) as u64;
    let dtype = match i.dtype {
        DType::F32 => 0,
        DType::BF16 => 1,
        DType::U8 => 2,
    };
    let op = match i.op {
        None => 0,
        Some(ReduceOp::Sum) => 1,
        Some(ReduceOp::Mean) => 2,
        Some(ReduceOp::Max) => 3,
    };
    [seq, kind, dtype, i.count as u64, op, i.root.map_or(u64::MAX, |r| r as u64)]
}

fn decode(h: &[u64]) -> String {
    let kind = KINDS.get(h[1] as usize).copied().unwrap_or("?");
    let dtype = [DType::F32, DType::BF16, DType::U8].get(h[2] as usize).copied().unwrap_or(DType::U8);
    let op =
        [None, Some(ReduceOp::Sum), Some(ReduceOp::Mean), Some(ReduceOp::Max)].get(h[4] as usize).copied().flatten();
    let root = (h[5] != u64::MAX).then_some(h[5] as usize);
    format!("{} #{}", CallInfo { kind, dtype, count: h[3] as usize, op, root }, h[0])
}

impl MpiComm {
    fn new(comm: SimpleCommunicator, ranks: Vec<usize>, universe: Arc<Universe>, watchdog: Arc<Watchdog>) -> Self {
        let rank = comm.rank() as usize;
        Self {
            comm,
            ranks,
            rank,
            seq: AtomicU64::new(0),
            watchdog,
            history: Mutex::new(VecDeque::new()),
            outbox: Mutex::new(Vec::new()),
            multiple: false,
            _universe: universe,
        }
    }

    fn me(&self) -> usize {
        self.ranks[self.rank]
    }

    fn record(&self, what: String) {
        let mut h = self.history.lock().unwrap_or_else(|p| p.into_inner());
        if h.len() == 8 {
            h.pop_front();
        }
        h.push_back(what);
    }

    /// Reports a timeout and ends the job: an outstanding MPI request cannot be abandoned. The
    /// rank's block goes into the hang report; after a grace period (the other ranks waiting in
    /// the same collective time out within it and write theirs) the ranks of the group with no
    /// block are named as never arrived.
    fn timed_out(&self, what: &str) -> ! {
        let last =
            self.history.lock().unwrap_or_else(|p| p.into_inner()).iter().cloned().collect::<Vec<_>>().join("; ");
        let timeout = self.watchdog.timeout();
        let head = watchdog::waiting_line(self.me(), &watchdog::hostname(), timeout, what, &self.ranks);
        let mut message = format!("{head}\n  its last collectives: {last}");
        if let Some(path) = self.watchdog.write(&message) {
            std::thread::sleep((timeout / 4).clamp(Duration::from_secs(1), Duration::from_secs(10)));
            let absent = watchdog::absent_from_report(&path, what, &self.ranks);
            message.push_str(&format!(
                "\nranks {absent:?} never arrived (no block waiting in it in the hang report {})",
                path.display()
            ));
        }
        eprintln!("error: collective timed out: {message}");
        self.comm.abort(3)
    }

    fn poll_wait(&self, start: Instant, spins: &mut u32, what: &str) {
        if self.watchdog.expired(start) {
            self.timed_out(what);
        }
        *spins += 1;
        if *spins < 1000 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    fn all_gather_polled<T: Equivalence>(&self, send: &[T], recv: &mut [T], what: &str) {
        let start = Instant::now();
        let mut spins = 0;
        scope(|s| {
            let mut req = self.comm.immediate_all_gather_into(s, send, recv);
            loop {
                match req.test() {
                    Ok(_) => break,
                    Err(r) => {
                        req = r;
                        self.poll_wait(start, &mut spins, what);
                    }
                }
            }
        });
    }

    /// Frees the buffers of completed sends.
    fn reap(&self, wait: bool) {
        let mut outbox = self.outbox.lock().unwrap_or_else(|p| p.into_inner());
        let mut keep = Vec::new();
        for p in outbox.drain(..) {
            let done = if wait {
                p.request.wait();
                true
            } else {
                match p.request.test() {
                    Ok(_) => true,
                    Err(request) => {
                        keep.push(Pending { request, buf: p.buf });
                        false
                    }
                }
            };
            if done {
                // SAFETY: the buffer was leaked from a Box in `send_bytes` and its send is complete.
                drop(unsafe { Box::from_raw(p.buf) });
            }
        }
        *outbox = keep;
    }
}

impl Drop for MpiComm {
    fn drop(&mut self) {
        self.reap(true);
    }
}

impl Exchange for MpiComm {
    fn group_rank(&self) -> usize {
        self.rank
    }

    fn group_size(&self) -> usize {
        self.ranks.len()
    }

    fn exchange(&self, info: CallInfo, data: Vec<u8>) -> CommResult<Arc<Vec<Vec<u8>>>> {
        let n = self.ranks.len();
        if n == 1 {
            return Ok(Arc::new(vec![data]));
        }
        self.reap(false);
        let seq = self.seq.fetch_add(1, Ordering::SeqCst);
        let what = format!("{info} #{seq}");
        self.record(what.clone());
        let mine = encode(seq, &info);
        let mut headers = vec![0u64; HEADER * n];
        self.all_gather_polled(&mine[..], &mut headers[..], &what);
        for (r, h) in headers.chunks(HEADER).enumerate() {
            if h != mine {
                return Err(CommError::Mismatch(format!(
                    "collective #{seq} on group {:?}: rank {} called {info} but rank {} called {}",
                    self.ranks,
                    self.me(),
                    self.ranks[r],
                    decode(h)
                )));
            }
        }
        if data.is_empty() {
            return Ok(Arc::new(vec![Vec::new(); n]));
        }
        let mut all = vec![0u8; data.len() * n];
        self.all_gather_polled(&data[..], &mut all[..], &what);
        Ok(Arc::new(all.chunks(data.len()).map(|c| c.to_vec()).collect()))
    }
}

impl Communicator for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.ranks.len()
    }

    fn global_ranks(&self) -> &[usize] {
        &self.ranks
    }

    crate::exchange_collectives!();

    fn send_bytes(&self, buf: &[u8], dtype: DType, dst: usize, tag: u32) -> CommResult<()> {
        exchange::check_peer(self.rank, self.size(), dst, "send to")?;
        let info = exchange::info("send", dtype, buf.len(), None, None)?;
        self.reap(false);
        self.record(format!("{info} to rank {} tag {tag}", self.ranks[dst]));
        // dtype code then the data, sent without blocking (a ring of sends must not deadlock).
        let mut msg = Vec::with_capacity(buf.len() + 1);
        msg.push(encode(0, &info)[2] as u8);
        msg.extend_from_slice(buf);
        let leaked: &'static mut [u8] = Box::leak(msg.into_boxed_slice());
        let ptr: *mut [u8] = leaked;
        // SAFETY: `ptr` stays valid until `reap` sees the request complete.
        let request =
            self.comm.process_at_rank(dst as i32).immediate_send_with_tag(StaticScope, unsafe { &*ptr }, tag as i32);
        self.outbox.lock().unwrap_or_else(|p| p.into_inner()).push(Pending { request, buf: ptr });
        Ok(())
    }

    fn recv_bytes(&self, buf: &mut [u8], dtype: DType, src: usize, tag: u32) -> CommResult<()> {
        exchange::check_peer(self.rank, self.size(), src, "recv from")?;
        let want = exchange::info("send", dtype, buf.len(), None, None)?;
        let what = format!("recv {want} from rank {} tag {tag}", self.ranks[src]);
        self.record(what.clone());
        let (start, mut spins) = (Instant::now(), 0);
        let matched = loop {
            self.reap(false);
            if let Some(m) = self.comm.process_at_rank(src as i32).immediate_matched_probe_with_tag(tag as i32) {
                break m;
            }
            self.poll_wait(start, &mut spins, &what);
        };
        let (msg, _) = matched.matched_receive_vec::<u8>();
        let dt = encode(0, &want)[2] as u8;
        if msg.len() != buf.len() + 1 || msg[0] != dt {
            let sent = [DType::F32, DType::BF16, DType::U8].get(msg[0] as usize).copied().unwrap_or(DType::U8);
            let count = msg.len().saturating_sub(1) / sent.size();
            return Err(CommError::Mismatch(format!(
                "rank {} sent send({sent:?} × {count}) with tag {tag} but rank {} expects {want}",
                self.ranks[src],
                self.me()
            )));
        }
        buf.copy_from_slice(&msg[1..]);
        Ok(())
    }

    fn barrier(&self) -> CommResult<()> {
        exchange::barrier(self)
    }

    fn watchdog(&self) -> &Watchdog {
        &self.watchdog
    }

    fn sub_group(&self, global_ranks: &[usize]) -> CommResult<Box<dyn Communicator>> {
        let world = self._universe.world().size() as usize;
        let (ranks, _) = exchange::sub_group_ranks(global_ranks, self.me(), world)?;
        let color = Color::with_value(ranks[0] as i32);
        let comm = self
            .comm
            .split_by_color(color)
            .ok_or_else(|| CommError::Invalid("MPI_Comm_split returned no communicator".into()))?;
        if comm.size() as usize != ranks.len() {
            return Err(CommError::Invalid(format!(
                "sub-group {ranks:?}: MPI made a group of {} ranks; every rank of the parent must create its group at the same point",
                comm.size()
            )));
        }
        let mut c = MpiComm::new(comm, ranks, self._universe.clone(), self.watchdog.clone());
        c.multiple = self.multiple;
        Ok(Box::new(c))
    }

    fn duplicate(&self) -> CommResult<Box<dyn Communicator>> {
        if !self.multiple {
            return Err(CommError::Invalid(
                "this MPI library did not grant MPI_THREAD_MULTIPLE, which communication overlap needs; set `parallelism.overlap_collectives = false`".into(),
            ));
        }
        let mut c =
            MpiComm::new(self.comm.duplicate(), self.ranks.clone(), self._universe.clone(), self.watchdog.clone());
        c.multiple = true;
        Ok(Box::new(c))
    }
}
