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
