//! The MPI backend through the real binary under `mpirun` (MPI initialises once per process, so
//! it is tested with processes, not inside `cargo test` threads). Built with `--features mpi`.

mod common;
use common::*;
use std::process::Command;

fn mpirun(np: usize, args: &[&str]) -> std::process::Output {
    Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np", &np.to_string(), env!("CARGO_BIN_EXE_titan-rs")])
        .args(args)
        .current_dir(repo())
        .output()
        .expect("mpirun (install openmpi-bin)")
}

#[test]
fn bench_comm_under_mpirun_checks_every_collective() {
    for np in [2, 4] {
        let o = mpirun(np, &["bench", "comm", "--max-mib", "4", "--iters", "2"]);
        let out = assert_ok(&o);
        assert!(out.contains(&format!("mpi (one rank per process) backend, {np} ranks")), "{out}");
        for op in ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv"] {
            assert_eq!(out.lines().filter(|l| l.starts_with(&format!("| {op} |"))).count(), 7, "{op}:\n{out}");
        }
    }
}

fn assert_fails_fast(o: &std::process::Output, started: std::time::Instant, needle: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "expected a failure:\n{err}");
    assert!(err.contains(needle), "stderr lacks {needle:?}:\n{err}");
    assert!(started.elapsed().as_secs() < 60, "took {:?}", started.elapsed());
}

#[test]
fn mpi_mismatch_failure_and_hang_end_every_process_with_the_error() {
    let t = std::time::Instant::now();
    let o = mpirun(2, &["bench", "comm", "--inject-fault", "mismatch"]);
    assert_fails_fast(&o, t, "all_gather(F32 × 4)");
    assert!(String::from_utf8_lossy(&o.stderr).contains("collective mismatch"));
    let t = std::time::Instant::now();
    let o = mpirun(2, &["bench", "comm", "--inject-fault", "fail"]);
    assert_fails_fast(&o, t, "rank 1: injected failure");
    let t = std::time::Instant::now();
    let o = mpirun(2, &["bench", "comm", "--inject-fault", "hang", "--timeout-seconds", "2"]);
    assert_fails_fast(&o, t, "collective timed out: rank 0 waited 2.0s in barrier");
}

/// DDP as two MPI processes gives exactly the losses of the two-thread run: both backends use the
/// same exchange and rank-order reduction.
#[test]
fn ddp_under_mpirun_equals_the_threads_run_bit_for_bit() {
    let d = tempfile::tempdir().unwrap();
    let (threads, procs) = (d.path().join("threads"), d.path().join("mpi"));
    let dp = ["--parallelism.data_parallel_replicate_degree", "2", "--training.local_batch_size", "2"];
    assert_ok(&run(&tiny_args(&threads, 5), &dp));
    let args = tiny_args(&procs, 5);
    let mut all: Vec<&str> = args.iter().map(String::as_str).collect();
    all.extend_from_slice(&dp);
    let out = assert_ok(&mpirun(2, &all));
    assert!(out.contains("on 2 data-parallel rank(s)"), "{out}");
    assert_eq!(losses(&threads), losses(&procs));
    assert_eq!(losses(&procs).len(), 5);
    let o = mpirun(2, &["train", "--config", "configs/llama_debug.toml"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr)
        .contains("mpirun started 2 processes but `parallelism.data_parallel_replicate_degree` = 1"));
}
