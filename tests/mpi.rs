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
