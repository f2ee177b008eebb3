//! Runs one closure per rank, each on its own thread with its world communicator. The first rank
//! to fail (error or panic) aborts the world, so every other rank stops at its next wait; the
//! first failure is returned.

use crate::comm::{LocalComm, LocalWorld};
use anyhow::{anyhow, Result};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

/// Whether this process was started by an MPI launcher (mpirun, or srun with PMI): then the
/// ranks are processes and the world comes from MPI.
pub fn under_mpi_launcher() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"].iter().any(|v| std::env::var_os(v).is_some())
}

/// This rank's index among the ranks on its host: the MPI launcher's local rank, or (threads
/// of one process) the world rank.
pub fn local_rank(world_rank: usize) -> usize {
    ["OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"]
        .iter()
        .find_map(|k| std::env::var(k).ok()?.parse::<usize>().ok())
        .unwrap_or(world_rank)
}

/// Runs this process's rank under MPI: on failure the error is printed and the whole job is
/// aborted (non-zero exit everywhere), so no rank is left waiting.
#[cfg(feature = "mpi")]
pub fn run_mpi_rank<T>(timeout: Duration, f: impl FnOnce(crate::comm::MpiComm) -> Result<T>) -> Result<T> {
    let world = crate::comm::MpiWorld::init(timeout)?;
    let comm = world.communicator();
    let rank = crate::comm::Communicator::rank(&comm);
    let host = crate::comm::watchdog::hostname();
    match catch_unwind(AssertUnwindSafe(|| f(comm))) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => {
            eprintln!("error: rank {rank} on host {host}: {e:#}");
            world.abort(1)
        }
        Err(p) => {
            eprintln!("error: rank {rank} on host {host} panicked: {}", panic_message(p.as_ref()));
            world.abort(1)
        }
    }
}


fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// Runs `f(rank's communicator)` on `world_size` threads; returns every rank's value in rank
/// order, or the first failure.
pub fn run_ranks<T, F>(world_size: usize, timeout: Duration, f: F) -> Result<Vec<T>>
where
    T: Send,
    F: Fn(LocalComm) -> Result<T> + Sync,
{
    run_ranks_with(world_size, timeout, None, f)
}

/// [`run_ranks`] for a whole program: once a rank has failed, ranks that have not stopped within
/// `grace` (stuck in computation, where no collective can notice the abort) end the process
/// with the first error and exit code 1, so nothing is left hanging.
pub fn run_ranks_or_exit<T, F>(world_size: usize, timeout: Duration, grace: Duration, f: F) -> Result<Vec<T>>
where
    T: Send,
    F: Fn(LocalComm) -> Result<T> + Sync,
{
    run_ranks_with(world_size, timeout, Some(grace), f)
}

fn watchdog(world: std::sync::Arc<LocalWorld>, done: std::sync::Arc<std::sync::atomic::AtomicBool>, grace: Duration) {
    use std::sync::atomic::Ordering;
    std::thread::spawn(move || {
        while !done.load(Ordering::SeqCst) {
            if let Some(e) = world.first_error() {
                let since = std::time::Instant::now();
                while since.elapsed() < grace {
                    if done.load(Ordering::SeqCst) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                eprintln!(
                    "error: {e}
(other ranks did not stop within {:.0}s of the failure; exiting)",
                    grace.as_secs_f64()
                );
                std::process::exit(1);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
}

fn run_ranks_with<T, F>(world_size: usize, timeout: Duration, grace: Option<Duration>, f: F) -> Result<Vec<T>>
where
    T: Send,
    F: Fn(LocalComm) -> Result<T> + Sync,
{
    let world = LocalWorld::new(world_size, timeout);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    if let Some(grace) = grace {
        watchdog(world.clone(), done.clone(), grace);
    }
    let _finished = Finished(done);
    let results: Vec<Option<T>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..world_size)
            .map(|rank| {
                let (comm, world, f) = (world.communicator(rank), world.clone(), &f);
                std::thread::Builder::new()
                    .name(format!("rank-{rank}"))
                    .spawn_scoped(s, move || match catch_unwind(AssertUnwindSafe(|| f(comm))) {
                        Ok(Ok(v)) => Some(v),
                        Ok(Err(e)) => {
                            world.abort(format!("rank {rank}: {e:#}"));
                            None
                        }
                        Err(p) => {
                            world.abort(format!("rank {rank} panicked: {}", panic_message(p.as_ref())));
                            None
                        }
                    })
                    .expect("spawning a rank thread")
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(None)).collect()
    });
    if let Some(e) = world.first_error() {
        return Err(anyhow!(e));
    }
    results.into_iter().map(|r| r.ok_or_else(|| anyhow!("a rank stopped without a result"))).collect()
}

/// Tells the watchdog the ranks have all stopped (also when unwinding).
struct Finished(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for Finished {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}
