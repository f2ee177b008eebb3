//! Collectives built on one primitive, the *exchange*: every rank contributes a call description
//! and its bytes and receives every rank's bytes in rank order. Each rank then computes its own
//! result (rank-order reduction), so every backend built on it gives bitwise identical results on
//! every rank and the same results as every other such backend.

use super::{reduce, CallInfo, CommError, CommResult, DType, ReduceOp};
use std::sync::Arc;

pub trait Exchange {
    fn group_rank(&self) -> usize;
    fn group_size(&self) -> usize;
    /// Every rank's `data` for this call, in rank order; errors when the ranks' calls differ.
    fn exchange(&self, info: CallInfo, data: Vec<u8>) -> CommResult<Arc<Vec<Vec<u8>>>>;
}

pub fn info(
    kind: &'static str,
    dtype: DType,
    bytes: usize,
    op: Option<ReduceOp>,
    root: Option<usize>,
) -> CommResult<CallInfo> {
    if bytes % dtype.size() != 0 {
        return Err(CommError::Invalid(format!("{kind}: {bytes} bytes is not a whole number of {dtype:?} elements")));
    }
    Ok(CallInfo { kind, dtype, count: bytes / dtype.size(), op, root })
}

pub fn check_peer(rank: usize, size: usize, peer: usize, what: &str) -> CommResult<usize> {
    if peer >= size || peer == rank {
        return Err(CommError::Invalid(format!("{what} rank {peer} in a group of {size} (this is rank {rank})")));
    }
    Ok(peer)
}

/// A sub-group request as sorted, distinct global ranks, and this rank's index in it.
pub fn sub_group_ranks(global_ranks: &[usize], me: usize, world: usize) -> CommResult<(Vec<usize>, usize)> {
    let mut ranks = global_ranks.to_vec();
    ranks.sort();
    ranks.dedup();
    let Some(rank) = ranks.iter().position(|&r| r == me) else {
        return Err(CommError::Invalid(format!("rank {me} asked for sub-group {ranks:?} that does not contain it")));
    };
    if let Some(bad) = ranks.iter().find(|&&r| r >= world) {
        return Err(CommError::Invalid(format!("sub-group {ranks:?} names rank {bad} outside the world of {world}")));
    }
    Ok((ranks, rank))
}

pub fn all_reduce(ex: &impl Exchange, buf: &mut [u8], dtype: DType, op: ReduceOp) -> CommResult<()> {
    let all = ex.exchange(info("all_reduce", dtype, buf.len(), Some(op), None)?, buf.to_vec())?;
    let parts: Vec<&[u8]> = all.iter().map(|p| p.as_slice()).collect();
    reduce(&parts, buf, dtype, op)
}

pub fn all_gather(ex: &impl Exchange, send: &[u8], recv: &mut [u8], dtype: DType) -> CommResult<()> {
    if recv.len() != send.len() * ex.group_size() {
        return Err(CommError::Invalid(format!(
            "all_gather: recv holds {} bytes, needs {} × {}",
            recv.len(),
            ex.group_size(),
            send.len()
        )));
    }
    let all = ex.exchange(info("all_gather", dtype, send.len(), None, None)?, send.to_vec())?;
    for (chunk, part) in recv.chunks_mut(send.len().max(1)).zip(all.iter()) {
        chunk.copy_from_slice(part);
    }
    Ok(())
}

pub fn reduce_scatter(ex: &impl Exchange, send: &[u8], recv: &mut [u8], dtype: DType, op: ReduceOp) -> CommResult<()> {
    if send.len() != recv.len() * ex.group_size() {
        return Err(CommError::Invalid(format!(
            "reduce_scatter: send holds {} bytes, needs {} × {}",
            send.len(),
            ex.group_size(),
            recv.len()
        )));
    }
    let all = ex.exchange(info("reduce_scatter", dtype, send.len(), Some(op), None)?, send.to_vec())?;
    let (c, r) = (recv.len(), ex.group_rank());
    let parts: Vec<&[u8]> = all.iter().map(|p| &p[r * c..(r + 1) * c]).collect();
    reduce(&parts, recv, dtype, op)
}

pub fn broadcast(ex: &impl Exchange, buf: &mut [u8], dtype: DType, root: usize) -> CommResult<()> {
    if root >= ex.group_size() {
        return Err(CommError::Invalid(format!("broadcast from rank {root} in a group of {}", ex.group_size())));
    }
    let all = ex.exchange(info("broadcast", dtype, buf.len(), None, Some(root))?, buf.to_vec())?;
    buf.copy_from_slice(&all[root]);
    Ok(())
}

pub fn barrier(ex: &impl Exchange) -> CommResult<()> {
    ex.exchange(info("barrier", DType::U8, 0, None, None)?, Vec::new()).map(|_| ())
}

/// The four exchange-based collectives of a [`super::Communicator`] impl whose type implements
/// [`Exchange`] (the `local` and `mpi` backends).
#[macro_export]
#[doc(hidden)]
macro_rules! exchange_collectives {
    () => {
        fn all_reduce_bytes(&self, buf: &mut [u8], dtype: DType, op: ReduceOp) -> CommResult<()> {
            $crate::comm::timing::timed("all_reduce", buf.len(), self.global_ranks(), || exchange::all_reduce(self, buf, dtype, op))
        }

        fn all_gather_bytes(&self, send: &[u8], recv: &mut [u8], dtype: DType) -> CommResult<()> {
            $crate::comm::timing::timed("all_gather", send.len(), self.global_ranks(), || exchange::all_gather(self, send, recv, dtype))
        }

        fn reduce_scatter_bytes(&self, send: &[u8], recv: &mut [u8], dtype: DType, op: ReduceOp) -> CommResult<()> {
            $crate::comm::timing::timed("reduce_scatter", send.len(), self.global_ranks(), || exchange::reduce_scatter(self, send, recv, dtype, op))
        }

        fn broadcast_bytes(&self, buf: &mut [u8], dtype: DType, root: usize) -> CommResult<()> {
            $crate::comm::timing::timed("broadcast", buf.len(), self.global_ranks(), || exchange::broadcast(self, buf, dtype, root))
        }
    };
}
