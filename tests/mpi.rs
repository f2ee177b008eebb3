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
        .env(AUTOTUNE.0, AUTOTUNE.1)
        .output()
        .expect("mpirun (install openmpi-bin)")
}

#[test]
fn bench_comm_under_mpirun_checks_every_collective() {
    for np in [2, 4] {
        let o = mpirun(np, &["bench", "comm", "--max-mib", "4", "--iters", "2"]);
        let out = assert_ok(&o);
        assert!(out.contains(&format!("mpi (one rank per process) backend, {np} ranks")), "{out}");
        for op in ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv", "all_to_all"] {
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
    assert_fails_fast(&o, t, "rank 1 on host");
    assert!(String::from_utf8_lossy(&o.stderr).contains(": injected failure"));
    let t = std::time::Instant::now();
    let o = mpirun(2, &["bench", "comm", "--inject-fault", "hang", "--timeout-seconds", "2"]);
    assert_fails_fast(&o, t, "collective timed out: rank 0 (host ");
    assert!(String::from_utf8_lossy(&o.stderr).contains("waited 2.0s in barrier"));
}

/// A training rank that never enters its next collective (rank 1 of FSDP 2, at step 2): rank 0
/// times out after `comm.train_timeout_seconds`, writes what it waited for into the dump
/// folder's `hang_report.txt`, names rank 1 as never arrived and ends the job.
#[test]
fn mpi_hang_report_names_the_rank_that_never_arrived() {
    let d = tempfile::tempdir().unwrap();
    let mut args = tiny_args(d.path(), 3);
    args.extend(
        ["--parallelism.data_parallel_shard_degree", "2", "--debug.fail_at_steps", "[2]", "--debug.fail_rank", "1"]
            .iter()
            .chain(&["--debug.fail_mode", "hang", "--comm.train_timeout_seconds", "3"])
            .map(|s| s.to_string()),
    );
    let t = std::time::Instant::now();
    let o = mpirun(2, &args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_fails_fast(&o, t, "ranks [1] never arrived");
    let report = std::fs::read_to_string(d.path().join("hang_report.txt")).expect("hang_report.txt");
    assert!(report.contains("rank 0 (host ") && report.contains("waited 3.0s in "), "{report}");
}

/// DDP, FSDP, TP and PP as two MPI processes give exactly the losses of the two-thread runs: both
/// backends use the same exchange and rank-order reduction. The FSDP run is checkpointed at step
/// 3 and resumed by a second `mpirun`, and still matches bit for bit.
#[test]
fn data_parallel_under_mpirun_equals_the_threads_run_bit_for_bit() {
    let d = tempfile::tempdir().unwrap();
    let ddp = ["--parallelism.data_parallel_replicate_degree", "2", "--parallelism.data_parallel_shard_degree", "1"];
    let fsdp = ["--parallelism.data_parallel_replicate_degree", "1", "--parallelism.data_parallel_shard_degree", "2"];
    let tp = ["--parallelism.data_parallel_shard_degree", "1", "--parallelism.tensor_parallel_degree", "2"];
    let pp = ["--parallelism.data_parallel_shard_degree", "1", "--parallelism.pipeline_parallel_degree", "2"];
    for (name, layout) in [("ddp", ddp), ("fsdp", fsdp), ("tp", tp), ("pp", pp)] {
        let (threads, procs) = (d.path().join(format!("{name}-threads")), d.path().join(format!("{name}-mpi")));
        let mut dp = layout.to_vec();
        dp.extend_from_slice(&["--training.local_batch_size", "2"]);
        assert_ok(&run(&tiny_args(&threads, 5), &dp));
        let args = tiny_args(&procs, 5);
        let mut all: Vec<&str> = args.iter().map(String::as_str).chain(dp.iter().copied()).collect();
        if name == "fsdp" {
            all.extend_from_slice(&["--checkpoint.enable", "true", "--checkpoint.interval", "3"]);
            let mut first = all.clone();
            first.extend_from_slice(&["--debug.stop_at_step", "3"]);
            assert_ok(&mpirun(2, &first));
        }
        let out = assert_ok(&mpirun(2, &all));
        let dp = if name == "tp" || name == "pp" { 1 } else { 2 };
        assert!(out.contains(&format!("on {dp} data-parallel rank(s)")), "{out}");
        assert_eq!(losses(&threads), losses(&procs), "{name}");
        assert_eq!(losses(&procs).len(), 5, "{name}");
    }
    let o =
        mpirun(2, &["train", "--config", "configs/llama_debug.toml", "--parallelism.data_parallel_shard_degree", "1"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("mpirun -np 2: invalid parallel dims"));
}

/// A sharded checkpoint written by 4 MPI processes (FSDP 2 × TP 2, each process its own file)
/// resumes bit for bit under a second `mpirun` of the same layout, and within 1e-5 relative of
/// the uninterrupted run on one rank in threads.
#[test]
fn sharded_checkpoints_of_mpi_processes_resume_and_reshard() {
    let d = tempfile::tempdir().unwrap();
    let b8 = ["--training.global_batch_size", "8", "--checkpoint.interval", "2"];
    let two_d = ["--parallelism.data_parallel_shard_degree", "2", "--parallelism.tensor_parallel_degree", "2", "--training.local_batch_size", "4"];
    let with = |dump: &std::path::Path, layout: &[&str], extra: &[&str]| -> Vec<String> {
        tiny_args(dump, 4).into_iter().chain(b8.iter().chain(layout).chain(extra).map(|s| s.to_string())).collect()
    };
    let strs = |v: &[String]| v.iter().map(String::as_str).collect::<Vec<_>>().join(" ");
    let single = d.path().join("single");
    assert_ok(&run(&with(&single, &["--parallelism.data_parallel_shard_degree", "1", "--training.local_batch_size", "8"], &[]), &[]));
    let straight = d.path().join("straight");
    assert_ok(&mpirun(4, &strs(&with(&straight, &two_d, &[])).split(' ').collect::<Vec<_>>()));
    let ck = ["--checkpoint.enable", "true"];
    let resumed = d.path().join("resumed");
    let first = with(&resumed, &two_d, &[&ck[..], &["--debug.stop_at_step", "2"]].concat());
    assert_ok(&mpirun(4, &strs(&first).split(' ').collect::<Vec<_>>()));
    let files = std::fs::read_dir(resumed.join("checkpoint/step-2")).unwrap().flatten().filter(|e| e.file_name().to_string_lossy().starts_with("rank-")).count();
    assert!(files >= 4, "every process wrote its pieces ({files} rank files)");
    let moved = d.path().join("moved");
    std::fs::create_dir_all(moved.join("checkpoint")).unwrap();
    let status = Command::new("cp").args(["-r", resumed.join("checkpoint/step-2").to_str().unwrap(), moved.join("checkpoint").to_str().unwrap()]).status().unwrap();
    assert!(status.success());
    std::fs::copy(resumed.join("metrics.jsonl"), moved.join("metrics.jsonl")).unwrap();
    assert_ok(&mpirun(4, &strs(&with(&resumed, &two_d, &ck)).split(' ').collect::<Vec<_>>()));
    assert_eq!(losses(&resumed)[2..], losses(&straight)[2..], "same layout under mpirun: bit for bit");
    assert_ok(&run(&with(&moved, &["--parallelism.data_parallel_shard_degree", "1", "--training.local_batch_size", "8"], &ck), &[]));
    assert_matches("mpi fsdp2×tp2 to one rank", &metric_values(&single), &metric_values(&moved), 1e-5);
}

/// GPU ranks as MPI processes (each its own process on the software adapter, collectives staged
/// through host memory into MPI): FSDP 2 × TP 2 equals the same layout as threads step for step
/// (1e-5 relative: two processes' GPU kernels against one process's), and a GPU rank's process
/// killed with SIGKILL mid-step ends the whole job promptly, mpirun naming that rank.
#[cfg(feature = "wgpu")]
#[test]
fn gpu_ranks_under_mpirun_train_and_a_killed_one_ends_the_job() {
    let d = tempfile::tempdir().unwrap();
    let layout = [
        "--training.device", "wgpu", "--model.attention", "fused", "--parallelism.data_parallel_shard_degree", "2",
        "--parallelism.tensor_parallel_degree", "2", "--training.local_batch_size", "2",
    ];
    let threads = d.path().join("threads");
    assert_ok(&run(&tiny_args(&threads, 3), &layout));
    let procs = d.path().join("mpi");
    let args = tiny_args(&procs, 3);
    let all: Vec<&str> = args.iter().map(String::as_str).chain(layout.iter().copied()).collect();
    let t = std::time::Instant::now();
    assert_ok(&mpirun(4, &all));
    // Start-up (each process compiles its kernels on the software adapter) and three steps.
    let whole_run = t.elapsed();
    assert_matches("FSDP 2 x TP 2 on wgpu: mpirun vs threads", &metric_values(&threads), &metric_values(&procs), 1e-5);

    let t = std::time::Instant::now();
    let killed = tiny_args(&d.path().join("killed"), 4);
    let mut all: Vec<&str> = killed.iter().map(String::as_str).chain(layout.iter().copied()).collect();
    all.extend_from_slice(&["--debug.fail_at_steps", "[2]", "--debug.fail_rank", "3", "--debug.fail_mode", "kill", "--comm.train_timeout_seconds", "30"]);
    let o = mpirun(4, &all);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    // Killed during step 2: the job must end before the collective timeout (30 s) could have
    // ended it, so well within the uninterrupted run's time plus that timeout.
    let limit = whole_run + std::time::Duration::from_secs(30);
    assert!(t.elapsed() < limit, "took {:?}, more than {limit:?}", t.elapsed());
    assert!(err.contains("rank 3"), "the report lacks the killed rank:\n{err}");
}

/// Muon under FSDP 2 × TP 2 as four MPI processes: the owner-computes all-to-alls and the TP
/// all-gathers go through MPI, and the losses equal the four-thread run's bit for bit.
#[test]
fn muon_under_mpirun_equals_the_threads_run_bit_for_bit() {
    let d = tempfile::tempdir().unwrap();
    let layout = [
        "--optimizer.name",
        "Muon",
        "--optimizer.lr",
        "0.02",
        "--parallelism.data_parallel_shard_degree",
        "2",
        "--parallelism.tensor_parallel_degree",
        "2",
        "--training.local_batch_size",
        "2",
    ];
    let (threads, procs) = (d.path().join("threads"), d.path().join("mpi"));
    assert_ok(&run(&tiny_args(&threads, 4), &layout));
    let args = tiny_args(&procs, 4);
    let all: Vec<&str> = args.iter().map(String::as_str).chain(layout.iter().copied()).collect();
    assert_ok(&mpirun(4, &all));
    assert_eq!(losses(&threads), losses(&procs));
    assert_eq!(losses(&procs).len(), 4);
}
