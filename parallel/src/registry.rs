//! Process groups used inside Burn ops, by handle.
//!
//! A Burn custom op can only carry plain values, so the differentiable collectives name their
//! group by a `u64` handle registered here. The registry is per thread: under the `local`
//! backend each rank is a thread, and Burn runs `backward()` on the calling thread, so forward
//! and backward of a rank find the same group.

use crate::comm::Communicator;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

static NEXT: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static GROUPS: RefCell<HashMap<u64, Arc<dyn Communicator>>> = RefCell::new(HashMap::new());
}

/// A registered group; dropping its last clone unregisters the group.
#[derive(Clone)]
pub struct GroupHandle(Arc<Registered>);

struct Registered {
    id: u64,
    size: usize,
    rank: usize,
}

impl GroupHandle {
    pub fn id(&self) -> u64 {
        self.0.id
    }
    pub fn size(&self) -> usize {
        self.0.size
    }
    pub fn rank(&self) -> usize {
        self.0.rank
    }
}

impl std::fmt::Debug for GroupHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "group {} (rank {} of {})", self.id(), self.rank(), self.size())
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        // Ignore a thread whose registry is already gone (thread exit).
        let _ = GROUPS.try_with(|g| g.borrow_mut().remove(&self.id));
    }
}

/// Registers `comm` on this thread for use by the differentiable collectives.
pub fn register(comm: Box<dyn Communicator>) -> GroupHandle {
    let id = NEXT.fetch_add(1, Ordering::SeqCst);
    let (size, rank) = (comm.size(), comm.rank());
    GROUPS.with(|g| g.borrow_mut().insert(id, Arc::from(comm)));
    GroupHandle(Arc::new(Registered { id, size, rank }))
}

/// Runs `f` with the group `id`. Panics when the group is not registered on this thread (a
/// collective op used outside its rank's thread).
pub fn with_group<R>(id: u64, f: impl FnOnce(&dyn Communicator) -> R) -> R {
    let comm = GROUPS.with(|g| g.borrow().get(&id).cloned());
    let comm = comm.unwrap_or_else(|| panic!("process group {id} is not registered on this thread"));
    f(comm.as_ref())
}
