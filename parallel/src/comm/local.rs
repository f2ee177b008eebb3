//! The `local` backend: every rank is a thread of this process.
//!
//! A collective is an *exchange*: each rank deposits its call description and bytes in the
//! group's slot for its next sequence number; once all have arrived, each rank computes its result
//! from all contributions in rank order (so results are bitwise identical on every rank and
//! every run). Calls that differ (kind, dtype, size, op, root) are an error naming both; waits
//! time out with a per-rank history of the last collectives; a failed rank aborts the world.

use super::exchange::{self, Exchange};
use super::watchdog::{self, Watchdog};
use super::{CallInfo, CommError, CommResult, Communicator, DType, ReduceOp};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

const TICK: Duration = Duration::from_millis(20);
const HISTORY: usize = 16;
const REPORTED: usize = 4;

struct Record {
    group: Vec<usize>,
    seq: u64,
    call: String,
    done: bool,
}

#[derive(Default)]
struct Slot {
    infos: Vec<Option<CallInfo>>,
    data: Vec<Option<Vec<u8>>>,
    arrived: usize,
    taken: usize,
    ready: Option<Arc<Vec<Vec<u8>>>>,
    error: Option<CommError>,
}

struct Group {
    ranks: Vec<usize>,
    /// 0 for a group made by `sub_group`; a duplicate's own context otherwise.
    context: u64,
    /// Next sequence number of each member (kept here so every handle of a rank shares it).
    seq: Vec<AtomicU64>,
    /// Duplicates each member has made of this group so far.
    duplicates: Vec<AtomicU64>,
    slots: Mutex<HashMap<u64, Slot>>,
    cv: Condvar,
}

type MailKey = (usize, usize, u32);

/// The shared state of one run: groups, mailboxes, flight recorder, abort flag.
pub struct LocalWorld {
    size: usize,
    watchdog: Watchdog,
    aborted: AtomicBool,
    first_error: Mutex<Option<String>>,
    groups: Mutex<HashMap<(Vec<usize>, u64), Arc<Group>>>,
    mail: Mutex<HashMap<MailKey, VecDeque<(CallInfo, Vec<u8>)>>>,
    mail_cv: Condvar,
    recorder: Vec<Mutex<VecDeque<Record>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl LocalWorld {
    pub fn new(size: usize, timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            size,
            watchdog: Watchdog::new(timeout),
            aborted: AtomicBool::new(false),
            first_error: Mutex::new(None),
            groups: Mutex::new(HashMap::new()),
            mail: Mutex::new(HashMap::new()),
            mail_cv: Condvar::new(),
            recorder: (0..size).map(|_| Mutex::new(VecDeque::new())).collect(),
        })
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// The world group's communicator for `rank`.
    pub fn communicator(self: &Arc<Self>, rank: usize) -> LocalComm {
        let ranks: Vec<usize> = (0..self.size).collect();
        LocalComm { world: self.clone(), group: self.group(&ranks, 0), rank }
    }

    fn group(&self, ranks: &[usize], context: u64) -> Arc<Group> {
        lock(&self.groups)
            .entry((ranks.to_vec(), context))
            .or_insert_with(|| {
                Arc::new(Group {
                    ranks: ranks.to_vec(),
                    context,
                    seq: ranks.iter().map(|_| AtomicU64::new(0)).collect(),
                    duplicates: ranks.iter().map(|_| AtomicU64::new(0)).collect(),
                    slots: Mutex::new(HashMap::new()),
                    cv: Condvar::new(),
                })
            })
            .clone()
    }

    /// Stops every rank: waits return [`CommError::Aborted`] with the first message recorded.
    pub fn abort(&self, message: String) {
        lock(&self.first_error).get_or_insert(message);
        self.aborted.store(true, Ordering::SeqCst);
        for g in lock(&self.groups).values() {
            g.cv.notify_all();
        }
        self.mail_cv.notify_all();
    }

    /// The first failure reported to [`LocalWorld::abort`].
    pub fn first_error(&self) -> Option<String> {
        lock(&self.first_error).clone()
    }

    fn check_abort(&self) -> CommResult<()> {
        if self.aborted.load(Ordering::SeqCst) {
            return Err(CommError::Aborted(self.first_error().unwrap_or_default()));
        }
        Ok(())
    }

    fn record(&self, rank: usize, group: &[usize], seq: u64, call: &CallInfo) {
        let mut r = lock(&self.recorder[rank]);
        if r.len() == HISTORY {
            r.pop_front();
        }
        r.push_back(Record { group: group.to_vec(), seq, call: call.to_string(), done: false });
    }

    fn record_done(&self, rank: usize, group: &[usize], seq: u64) {
        if let Some(rec) = lock(&self.recorder[rank]).iter_mut().rev().find(|r| r.seq == seq && r.group == group) {
            rec.done = true;
        }
    }

    /// The watchdog's timeout and hang report (every group of this world).
    pub fn watchdog(&self) -> &Watchdog {
        &self.watchdog
    }

    /// The timeout message of rank `me` waiting in `what` on `group`: who arrived, who never
    /// did, and every rank's last collectives; also appended to the hang report file.
    fn hang_report(&self, me: usize, what: &str, group: &[usize], arrived: &[usize], missing: &[usize]) -> String {
        let head = watchdog::waiting_line(me, &watchdog::hostname(), self.watchdog.timeout(), what, group);
        let body = format!(
            "{head}; ranks {arrived:?} arrived, ranks {missing:?} never arrived. Last collectives of each rank:{}",
            self.flight_report()
        );
        match self.watchdog.write(&body) {
            Some(path) => format!("{body}\n(hang report: {})", path.display()),
            None => body,
        }
    }

    /// Each rank's last collectives (the flight recorder), for timeout reports.
    pub fn flight_report(&self) -> String {
        let mut out = String::new();
        for (rank, rec) in self.recorder.iter().enumerate() {
            let rec = lock(rec);
            let last: Vec<String> = rec
                .iter()
                .rev()
                .take(REPORTED)
                .rev()
                .map(|r| format!("#{} {} on {:?} {}", r.seq, r.call, r.group, if r.done { "done" } else { "WAITING" }))
                .collect();
            let line = if last.is_empty() { "no collectives".to_string() } else { last.join("; ") };
            out.push_str(&format!("\n  rank {rank}: {line}"));
        }
        out
    }
}

/// One rank's handle on one group.
pub struct LocalComm {
    world: Arc<LocalWorld>,
    group: Arc<Group>,
    rank: usize,
}

impl LocalComm {
    pub fn world(&self) -> &Arc<LocalWorld> {
        &self.world
    }

    fn global(&self, r: usize) -> usize {
        self.group.ranks[r]
    }

    fn check_peer(&self, peer: usize, what: &str) -> CommResult<usize> {
        exchange::check_peer(self.rank, self.size(), peer, what).map(|p| self.global(p))
    }
}

impl Exchange for LocalComm {
    fn group_rank(&self) -> usize {
        self.rank
    }

    fn group_size(&self) -> usize {
        self.group.ranks.len()
    }

    /// Deposits this rank's contribution and returns everyone's, in rank order.
    fn exchange(&self, info: CallInfo, data: Vec<u8>) -> CommResult<Arc<Vec<Vec<u8>>>> {
        self.world.check_abort()?;
        let n = self.group.ranks.len();
        if n == 1 {
            return Ok(Arc::new(vec![data]));
        }
        let seq = self.group.seq[self.rank].fetch_add(1, Ordering::SeqCst);
        let me = self.global(self.rank);
        self.world.record(me, &self.group.ranks, seq, &info);
        let mut slots = lock(&self.group.slots);
        let slot = slots.entry(seq).or_insert_with(|| Slot {
            infos: vec![None; n],
            data: vec![None; n],
            ..Default::default()
        });
        if let Some((other, theirs)) = slot.infos.iter().enumerate().find_map(|(r, i)| i.clone().map(|i| (r, i))) {
            if theirs != info {
                let e = CommError::Mismatch(format!(
                    "collective #{seq} on group {:?}: rank {me} called {info} but rank {} called {theirs}",
                    self.group.ranks,
                    self.global(other)
                ));
                slot.error.get_or_insert(e.clone());
                self.group.cv.notify_all();
                return Err(e);
            }
        }
        slot.infos[self.rank] = Some(info.clone());
        slot.data[self.rank] = Some(data);
        slot.arrived += 1;
        if slot.arrived == n {
            let all = slot.data.iter_mut().map(|d| d.take().unwrap_or_default()).collect();
            slot.ready = Some(Arc::new(all));
            self.group.cv.notify_all();
        }
        let start = Instant::now();
        loop {
            let slot = slots.get_mut(&seq).expect("slot lives until every rank took it");
            if let Some(e) = &slot.error {
                return Err(e.clone());
            }
            if let Some(all) = slot.ready.clone() {
                slot.taken += 1;
                if slot.taken == n {
                    slots.remove(&seq);
                }
                self.world.record_done(me, &self.group.ranks, seq);
                return Ok(all);
            }
            if let Err(e) = self.world.check_abort() {
                return Err(e);
            }
            if self.world.watchdog.expired(start) {
                let arrived: Vec<usize> = (0..n).filter(|&r| slot.infos[r].is_some()).map(|r| self.global(r)).collect();
                let missing: Vec<usize> = self.group.ranks.iter().copied().filter(|r| !arrived.contains(r)).collect();
                let what = format!("{info} #{seq}");
                let e = CommError::Timeout(self.world.hang_report(me, &what, &self.group.ranks, &arrived, &missing));
                slot.error.get_or_insert(e.clone());
                return Err(e);
            }
            slots = self.group.cv.wait_timeout(slots, TICK).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

impl Communicator for LocalComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.group.ranks.len()
    }

    fn global_ranks(&self) -> &[usize] {
        &self.group.ranks
    }

    crate::exchange_collectives!();

    fn send_bytes(&self, buf: &[u8], dtype: DType, dst: usize, tag: u32) -> CommResult<()> {
        self.world.check_abort()?;
        let to = self.check_peer(dst, "send to")?;
        let info = exchange::info("send", dtype, buf.len(), None, None)?;
        lock(&self.world.mail).entry((self.global(self.rank), to, tag)).or_default().push_back((info, buf.to_vec()));
        self.world.mail_cv.notify_all();
        Ok(())
    }

    fn recv_bytes(&self, buf: &mut [u8], dtype: DType, src: usize, tag: u32) -> CommResult<()> {
        let from = self.check_peer(src, "recv from")?;
        let want = exchange::info("send", dtype, buf.len(), None, None)?;
        let me = self.global(self.rank);
        let start = Instant::now();
        let mut mail = lock(&self.world.mail);
        loop {
            if let Some((info, data)) = mail.get_mut(&(from, me, tag)).and_then(|q| q.pop_front()) {
                if info != want {
                    return Err(CommError::Mismatch(format!(
                        "rank {from} sent {info} with tag {tag} but rank {me} expects {want}"
                    )));
                }
                buf.copy_from_slice(&data);
                return Ok(());
            }
            self.world.check_abort()?;
            if self.world.watchdog.expired(start) {
                let what = format!("a receive of {want} from rank {from} with tag {tag}");
                return Err(CommError::Timeout(self.world.hang_report(me, &what, &[from, me], &[me], &[from])));
            }
            mail = self.world.mail_cv.wait_timeout(mail, TICK).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    fn barrier(&self) -> CommResult<()> {
        exchange::barrier(self)
    }

    fn watchdog(&self) -> &Watchdog {
        &self.world.watchdog
    }

    fn sub_group(&self, global_ranks: &[usize]) -> CommResult<Box<dyn Communicator>> {
        let (ranks, rank) = exchange::sub_group_ranks(global_ranks, self.global(self.rank), self.world.size)?;
        Ok(Box::new(LocalComm { world: self.world.clone(), group: self.world.group(&ranks, 0), rank }))
    }

    /// The n-th duplicate a member makes of a group is the same group for every member (the
    /// members duplicate in the same order, as with `MPI_Comm_dup`).
    fn duplicate(&self) -> CommResult<Box<dyn Communicator>> {
        let n = self.group.duplicates[self.rank].fetch_add(1, Ordering::SeqCst) + 1;
        let context = self.group.context.wrapping_mul(1_000_003).wrapping_add(n);
        let group = self.world.group(&self.group.ranks, context);
        Ok(Box::new(LocalComm { world: self.world.clone(), group, rank: self.rank }))
    }
}
