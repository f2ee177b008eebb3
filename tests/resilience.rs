//! Resilience: a rank that never enters a collective ends the job with a hang report naming it;
//! start-up and training steps have their own timeouts (`comm.init_timeout_seconds`,
//! `comm.train_timeout_seconds`).

mod common;
use common::*;
use std::time::{Duration, Instant};

/// FSDP 2 on threads, rank 1 hanging at `step`: the job fails (non-zero exit), stderr and
/// `hang_report.txt` name rank 1 as the rank that never arrived; returns the time it took.
fn hang_at(step: u64, timeouts: &str) -> Duration {
    let d = tempfile::tempdir().unwrap();
    let flags = format!(
        "--parallelism.data_parallel_shard_degree 2 --debug.fail_at_steps [{step}] --debug.fail_rank 1 --debug.fail_mode hang {timeouts}"
    );
    let extra: Vec<&str> = flags.split_whitespace().collect();
    let start = Instant::now();
    let o = run(&tiny_args(d.path(), 3), &extra);
    let took = start.elapsed();
    let (out, err) = text(&o);
    assert!(!o.status.success(), "a hanging rank must fail the job\n{out}\n{err}");
    assert!(err.contains("ranks [1] never arrived"), "stderr names the missing rank:\n{err}");
    let report = std::fs::read_to_string(d.path().join("hang_report.txt")).expect("hang_report.txt in the dump folder");
    assert!(report.contains("rank 0 (host ") && report.contains("ranks [1] never arrived"), "{report}");
    assert!(report.contains("rank 1: ") && report.contains("WAITING"), "every rank's last collectives:\n{report}");
    took
}

#[test]
fn a_rank_that_never_arrives_is_named_in_the_hang_report() {
    // After the first step the training timeout (2 s) applies, not the start-up one (120 s).
    let took = hang_at(2, "--comm.init_timeout_seconds 120 --comm.train_timeout_seconds 2");
    assert!(took < Duration::from_secs(60), "took {took:?} with train_timeout_seconds = 2");
    // During the first step the start-up timeout (6 s) applies, not the training one (1 s).
    let took = hang_at(1, "--comm.init_timeout_seconds 6 --comm.train_timeout_seconds 1");
    assert!(took >= Duration::from_secs(6), "took {took:?}: the first step waits init_timeout_seconds = 6");
}

#[test]
fn bad_timeouts_are_clear_errors() {
    let d = tempfile::tempdir().unwrap();
    let o = run(&tiny_args(d.path(), 1), &["--comm.train_timeout_seconds", "0"]);
    assert_clean_error(&o, &["`comm.train_timeout_seconds` = 0", "positive number of seconds"]);
    let o = run(&tiny_args(d.path(), 1), &["--comm.timeout_seconds", "5"]);
    assert_clean_error(&o, &["comm.timeout_seconds", "did you mean"]);
}

/// FSDP 2 on threads with rank 1 sleeping 0.25 s in every step's compute: from the second
/// logging window on (`fault.straggler_windows = 2`) rank 1 is named in the log and in
/// `metrics.jsonl` with its numbers; without the slow rank nobody is.
#[test]
fn a_slow_rank_is_named_as_a_straggler() {
    let run_with = |steps: u32, extra: &str| {
        let d = tempfile::tempdir().unwrap();
        let flags = format!("--parallelism.data_parallel_shard_degree 2 {extra}");
        let extra: Vec<&str> = flags.split_whitespace().collect();
        let out = assert_ok(&run(&tiny_args(d.path(), steps), &extra));
        (out, metric_lines(d.path()))
    };
    let (out, lines) = run_with(4, "--fault.straggler_windows 2 --debug.slow_rank 1 --debug.slow_seconds 0.25");
    assert!(out.contains("straggler: rank 1 (host "), "{out}");
    let named: Vec<u64> = lines.iter().filter(|v| v.get("stragglers").is_some()).map(|v| v["step"].as_u64().unwrap()).collect();
    assert_eq!(named, [2, 3, 4], "steps naming a straggler");
    let s = &lines[3]["stragglers"][0];
    assert_eq!(s["rank"], 1);
    assert!(s["compute_s"].as_f64().unwrap() >= 0.25, "{s}");
    assert!(s["compute_s"].as_f64().unwrap() > 1.5 * s["median_compute_s"].as_f64().unwrap(), "{s}");
    // The fast rank waited for the slow one in the collectives; the straggler did not.
    assert!(s["comm_s"].as_f64().unwrap() < 0.25, "{s}");

    let (out, lines) = run_with(6, "--fault.straggler_windows 3 --metrics.log_freq 2");
    assert!(!out.contains("straggler:"), "{out}");
    assert!(lines.iter().all(|v| v.get("stragglers").is_none()));
}

/// (losses, SDC findings by step) of a tiny run with `flags`.
fn sdc_run(steps: u32, flags: &str) -> (Vec<(u64, String, String)>, Vec<(u64, serde_json::Value)>) {
    let d = tempfile::tempdir().unwrap();
    let extra: Vec<&str> = flags.split_whitespace().collect();
    assert_ok(&run(&tiny_args(d.path(), steps), &extra));
    let found = metric_lines(d.path())
        .into_iter()
        .filter_map(|v| Some((v["step"].as_u64()?, v.get("sdc_suspects")?.clone())))
        .collect();
    (losses(d.path()), found)
}

/// The silent-data-corruption check: clean on FSDP 2 × TP 2 and HSDP 2 × 2 and without effect on
/// training (losses bit for bit as without it); a persistent bit flip in one of three DDP
/// replicas is found by the replicas' vote and the replica named; a transient one (one of the
/// check's two runs) by re-execution; `fault.sdc_action = "stop"` stops with the rank named.
#[test]
fn the_sdc_check_names_the_corrupted_rank_and_changes_nothing_else() {
    let check = "--fault.sdc_check_interval 2";
    for layout in [
        "--parallelism.data_parallel_shard_degree 2 --parallelism.tensor_parallel_degree 2",
        "--parallelism.data_parallel_replicate_degree 2 --parallelism.data_parallel_shard_degree 2",
    ] {
        let (plain, none) = sdc_run(4, layout);
        assert!(none.is_empty());
        let (checked, found) = sdc_run(4, &format!("{layout} {check}"));
        assert_eq!(checked, plain, "[{layout}] the check changes no step");
        assert_eq!(found, [(2, serde_json::json!([])), (4, serde_json::json!([]))], "[{layout}] clean checks at steps 2 and 4");
    }

    let ddp3 = "--parallelism.data_parallel_replicate_degree 3 --parallelism.data_parallel_shard_degree 1 --training.local_batch_size 2";
    let (plain, _) = sdc_run(2, ddp3);
    let flags = format!("{ddp3} {check} --fault.sdc_action warn --debug.sdc_flip_rank 1 --debug.sdc_flip persistent");
    let (checked, found) = sdc_run(2, &flags);
    assert_eq!(checked, plain, "warn: training goes on unchanged");
    assert_eq!(found.len(), 1);
    let named = &found[0].1;
    assert_eq!((named[0]["rank"].as_u64(), named[0]["check"].as_str(), named.as_array().unwrap().len()), (Some(1), Some("replica"), 1), "{named}");

    let d = tempfile::tempdir().unwrap();
    let flags = format!("--parallelism.data_parallel_shard_degree 2 {check} --debug.sdc_flip_rank 0");
    let extra: Vec<&str> = flags.split_whitespace().collect();
    let o = run(&tiny_args(d.path(), 2), &extra);
    assert_clean_error(&o, &["silent-data-corruption check at step 2: rank 0 (host ", "gave different gradients when the same step ran twice", "fault.sdc_action"]);
}

/// The last logged (loss, grad norm) of every step (steps run again after a rollback or resume
/// are logged again; the last line counts).
fn last_per_step(dump: &std::path::Path) -> std::collections::BTreeMap<u64, (String, String)> {
    losses(dump).into_iter().map(|(s, l, g)| (s, (l, g))).collect()
}

/// A spiking batch (scrambled targets) at step 20 of a run checkpointed every 4 steps: the spike
/// is detected, the run rolls back to step 16 and skips the samples steps 17–20 read (logged,
/// recorded in the checkpoint), and a run stopped after the rollback and resumed gives the same
/// steps bit for bit.
#[test]
fn a_loss_spike_rolls_back_and_skips_its_data() {
    let flags = "--parallelism.data_parallel_shard_degree 2 --checkpoint.enable true --checkpoint.interval 4 \
                 --fault.loss_spike_zscore 3 --fault.loss_spike_window 10 --debug.spike_at_steps [20]";
    let go = |dump: &std::path::Path, extra: &str| {
        let all = format!("{flags} {extra}");
        let extra: Vec<&str> = all.split_whitespace().collect();
        assert_ok(&run(&tiny_args(dump, 24), &extra))
    };
    let a = tempfile::tempdir().unwrap();
    let out = go(a.path(), "");
    assert!(out.contains("step 20: loss spike") && out.contains("rolled back to step 16"), "{out}");
    let body = std::fs::read_to_string(a.path().join("metrics.jsonl")).unwrap();
    let rollback: serde_json::Value =
        body.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()).find(|v| v.get("rollback").is_some()).expect("a rollback line");
    // Global batch 8: steps 17–20 read samples [128, 160).
    assert_eq!(rollback["rollback"], serde_json::json!({"spike_step": 20, "resumed_from_step": 16, "first_sample": 128, "end_sample": 160}));
    let state = std::fs::read_to_string(a.path().join("checkpoint/step-24/train_state.json")).unwrap();
    assert!(state.contains("\"spike_step\": 20"), "the skip list is checkpointed:\n{state}");
    let straight = last_per_step(a.path());
    assert_eq!(straight.len(), 24);

    // Stopped after the rollback (at step 22), then resumed: the same steps, bit for bit.
    let b = tempfile::tempdir().unwrap();
    go(b.path(), "--debug.stop_at_step 22");
    go(b.path(), "");
    assert_eq!(last_per_step(b.path()), straight);
}
