//! The communicator: one process group over host buffers.
//!
//! Backends implement byte-level operations tagged with a [`DType`]; [`CommExt`] gives the
//! typed calls (`all_reduce(&mut [f32], ReduceOp::Sum)`, …). A device-buffer backend (NCCL)
//! would implement the same trait.

mod exchange;
mod local;
#[cfg(feature = "mpi")]
mod mpi;
mod reduce;
pub mod stream;
pub mod timing;
pub mod watchdog;

pub use local::{LocalComm, LocalWorld};
#[cfg(feature = "mpi")]
pub use mpi::{MpiComm, MpiWorld};
pub use reduce::reduce;

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    F32,
    BF16,
    /// Raw bytes: gathered, broadcast and sent, never reduced.
    U8,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::BF16 => 2,
            DType::U8 => 1,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Mean,
    Max,
}

/// What a collective call was, for matching calls across ranks and for error reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallInfo {
    pub kind: &'static str,
    pub dtype: DType,
    /// Elements contributed by this rank.
    pub count: usize,
    pub op: Option<ReduceOp>,
    pub root: Option<usize>,
}

impl fmt::Display for CallInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({:?} × {}", self.kind, self.dtype, self.count)?;
        if let Some(op) = self.op {
            write!(f, ", {op:?}")?;
        }
        if let Some(r) = self.root {
            write!(f, ", root {r}")?;
        }
        f.write_str(")")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommError {
    #[error("collective mismatch: {0}")]
    Mismatch(String),
    #[error("collective timed out: {0}")]
    Timeout(String),
    #[error("stopped because another rank failed: {0}")]
    Aborted(String),
    #[error("invalid collective call: {0}")]
    Invalid(String),
}

pub type CommResult<T> = Result<T, CommError>;

/// A process group. Ranks are the group's own (0..size); `global_ranks` maps them to the world.
pub trait Communicator: Send + Sync {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    fn global_ranks(&self) -> &[usize];

    /// Reduces `buf` (elements of `dtype`) across the group in rank order; every rank gets the result.
    fn all_reduce_bytes(&self, buf: &mut [u8], dtype: DType, op: ReduceOp) -> CommResult<()>;
    /// Concatenates every rank's `send`, in rank order, into `recv` (`size ×` as long).
    fn all_gather_bytes(&self, send: &[u8], recv: &mut [u8], dtype: DType) -> CommResult<()>;
    /// Reduces every rank's `send` and keeps chunk `rank` (of `size` equal chunks) in `recv`.
    fn reduce_scatter_bytes(&self, send: &[u8], recv: &mut [u8], dtype: DType, op: ReduceOp) -> CommResult<()>;
    /// Copies `root`'s `buf` to every rank.
    fn broadcast_bytes(&self, buf: &mut [u8], dtype: DType, root: usize) -> CommResult<()>;
    /// Point to point, matched by `(source, destination, tag)` in order.
    fn send_bytes(&self, buf: &[u8], dtype: DType, dst: usize, tag: u32) -> CommResult<()>;
    fn recv_bytes(&self, buf: &mut [u8], dtype: DType, src: usize, tag: u32) -> CommResult<()>;
    fn barrier(&self) -> CommResult<()>;
    /// The timeout of waits and the hang report, shared by every group of this world: setting
    /// them on one group sets them for all.
    fn watchdog(&self) -> &watchdog::Watchdog;
    /// The sub-group of the given *global* ranks (which must include this rank). Every member
    /// must ask for the same set.
    fn sub_group(&self, global_ranks: &[usize]) -> CommResult<Box<dyn Communicator>>;
    /// The same ranks as a new, independent communicator (`MPI_Comm_dup`): its collectives are
    /// matched only with each other, so one thread may run them while another runs this
    /// group's. Every member must duplicate at the same point.
    fn duplicate(&self) -> CommResult<Box<dyn Communicator>>;
}

/// Element types a communicator carries.
pub trait Element: bytemuck::Pod + Send + Sync {
    const DTYPE: DType;
}
impl Element for f32 {
    const DTYPE: DType = DType::F32;
}
impl Element for half::bf16 {
    const DTYPE: DType = DType::BF16;
}
impl Element for u8 {
    const DTYPE: DType = DType::U8;
}

/// The point-to-point tag of [`CommExt::all_to_all`]'s parts (apart from the pipeline's and the
/// context-parallel ring's).
pub const ALL_TO_ALL_TAG: u32 = 1 << 23;

/// Typed collectives on any communicator.
pub trait CommExt: Communicator {
    fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> CommResult<()> {
        self.all_reduce_bytes(bytemuck::cast_slice_mut(buf), T::DTYPE, op)
    }
    fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> CommResult<()> {
        self.all_gather_bytes(bytemuck::cast_slice(send), bytemuck::cast_slice_mut(recv), T::DTYPE)
    }
    fn reduce_scatter<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> CommResult<()> {
        self.reduce_scatter_bytes(bytemuck::cast_slice(send), bytemuck::cast_slice_mut(recv), T::DTYPE, op)
    }
    fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> CommResult<()> {
        self.broadcast_bytes(bytemuck::cast_slice_mut(buf), T::DTYPE, root)
    }
    fn send<T: Element>(&self, buf: &[T], dst: usize, tag: u32) -> CommResult<()> {
        self.send_bytes(bytemuck::cast_slice(buf), T::DTYPE, dst, tag)
    }
    fn recv<T: Element>(&self, buf: &mut [T], src: usize, tag: u32) -> CommResult<()> {
        self.recv_bytes(bytemuck::cast_slice_mut(buf), T::DTYPE, src, tag)
    }
    /// All-to-all with parts of any size (MPI's `Alltoallv`; expert parallelism's token
    /// dispatch and combine): rank `r` sends `parts[j]` to rank `j` and gets back `out[i]`, the
    /// part rank `i` addressed to it (its own part is copied). Every rank's part sizes are
    /// all-gathered first (so receivers know them and empty parts send nothing), then the parts
    /// go point to point — the checked, timed send/recv of the backend, non-blocking sends, so
    /// there is no ordering deadlock.
    fn all_to_all<T: Element>(&self, parts: &[Vec<T>]) -> CommResult<Vec<Vec<T>>> {
        let (n, me) = (self.size(), self.rank());
        if parts.len() != n {
            return Err(CommError::Mismatch(format!("all_to_all: {} parts for {n} ranks", parts.len())));
        }
        let counts: Vec<u8> = parts.iter().flat_map(|p| (p.len() as u64).to_le_bytes()).collect();
        let mut all = vec![0u8; counts.len() * n];
        self.all_gather(&counts, &mut all)?;
        let count = |from: usize, to: usize| {
            let at = (from * n + to) * 8;
            u64::from_le_bytes(all[at..at + 8].try_into().expect("8 bytes")) as usize
        };
        for (j, part) in parts.iter().enumerate() {
            if j != me && !part.is_empty() {
                self.send(part, j, ALL_TO_ALL_TAG)?;
            }
        }
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let mut got = vec![T::zeroed(); count(i, me)];
            if i == me {
                got.copy_from_slice(&parts[me]);
            } else if !got.is_empty() {
                self.recv(&mut got, i, ALL_TO_ALL_TAG)?;
            }
            out.push(got);
        }
        Ok(out)
    }

    /// Every rank's `send` (of any length), in rank order: the lengths are gathered first,
    /// then the messages padded to the longest.
    fn all_gather_varlen(&self, send: &[u8]) -> CommResult<Vec<Vec<u8>>> {
        let n = self.size();
        let mut lens = vec![0u8; 8 * n];
        self.all_gather(&(send.len() as u64).to_le_bytes(), &mut lens)?;
        let lens: Vec<usize> = lens.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap()) as usize).collect();
        let max = lens.iter().copied().max().unwrap_or(0);
        let mut padded = send.to_vec();
        padded.resize(max, 0);
        let mut all = vec![0u8; max * n];
        self.all_gather(&padded, &mut all)?;
        Ok(lens.iter().enumerate().map(|(r, &l)| all[r * max..r * max + l].to_vec()).collect())
    }
}

impl<C: Communicator + ?Sized> CommExt for C {}

#[cfg(test)]
mod tests;
