//! FSDP's reshard after forward (`parallelism.fsdp_reshard_after_forward`): freeing the gathered
//! parameters after forward and gathering them again in backward changes no number, and saves
//! the memory the plan says it saves.

mod common;
use common::*;

/// "always" equals "never" bit for bit (losses and gradient norms as logged), on FSDP 2,
/// FSDP 2 × TP 2 and HSDP 2 × 2, with activation checkpointing none, full and op-level.
#[test]
fn reshard_after_forward_equals_keeping_the_gathered_parameters_bit_for_bit() {
    let layouts = [
        "--parallelism.data_parallel_shard_degree 2",
        "--parallelism.data_parallel_shard_degree 2 --parallelism.tensor_parallel_degree 2",
        "--parallelism.data_parallel_replicate_degree 2 --parallelism.data_parallel_shard_degree 2",
    ];
    let acs = [
        "--activation_checkpoint.mode none",
        "--activation_checkpoint.mode full",
        "--activation_checkpoint.mode selective --activation_checkpoint.selective_ac_option op",
    ];
    for layout in layouts {
        for ac in acs {
            let run_with = |reshard: &str| {
                let d = tempfile::tempdir().unwrap();
                let flags = format!("{layout} {ac} --parallelism.fsdp_reshard_after_forward {reshard}");
                let extra: Vec<&str> = flags.split_whitespace().collect();
                assert_ok(&run(&tiny_args(d.path(), 3), &extra));
                losses(d.path())
            };
            let never = run_with("never");
            assert_eq!(never.len(), 3, "[{layout}] {ac}");
            assert_eq!(run_with("always"), never, "[{layout}] {ac}: always vs never");
        }
    }
    // The default reshards (no pipeline), so it equals both.
}

/// The host total `titan-rs plan` prints for `flags`, and its FSDP-gathered term (GiB).
fn planned(flags: &[&str]) -> (f64, f64) {
    let mut args = vec!["plan", "--config", "configs/llama_debug.toml"];
    args.extend_from_slice(flags);
    let out = assert_ok(&titan(&args));
    let number_after = |key: &str| -> f64 {
        let line = out.lines().find(|l| l.contains(key)).unwrap_or_else(|| panic!("no {key:?} in\n{out}"));
        let rest = line.split(key).nth(1).unwrap();
        rest.trim_start_matches([' ', ':']).split_whitespace().next().unwrap().parse().unwrap_or_else(|e| panic!("{line}: {e}"))
    };
    (number_after("as threads of one process:"), number_after("FSDP-gathered/compute-type weights"))
}

/// Measured peak over the job's resident memory before the ranks built their models (GiB).
fn measured_peak(flags: &[&str]) -> f64 {
    let d = tempfile::tempdir().unwrap();
    assert_ok(&run(&tiny_args(d.path(), 2), flags));
    let lines = metric_lines(d.path());
    let peak = lines.iter().map(|v| v["peak_memory_gib"].as_f64().unwrap()).fold(0.0, f64::max);
    peak - lines[0]["runtime_memory_gib"].as_f64().unwrap()
}

/// `small` (seq_len 1024, 2 sequences per step) on FSDP 2: the measured peak under "always" is
/// below the one under "never" by the plan's difference within ±20 %, and that difference is at
/// least the plan's FSDP-gathered term less what stays gathered (the token embedding).
#[test]
fn reshard_after_forward_saves_the_planned_gathered_parameters() {
    let shape = "--model.flavor small --training.seq_len 1024 --training.local_batch_size 2 --parallelism.data_parallel_shard_degree 2";
    let with = |reshard: &str| format!("{shape} --parallelism.fsdp_reshard_after_forward {reshard}");
    let (never_flags, always_flags) = (with("never"), with("always"));
    let never_flags: Vec<&str> = never_flags.split_whitespace().collect();
    let always_flags: Vec<&str> = always_flags.split_whitespace().collect();
    let ((plan_never, gathered_never), (plan_always, gathered_always)) = (planned(&never_flags), planned(&always_flags));
    assert!(gathered_always < 0.5 * gathered_never, "planned gathered: always {gathered_always} vs never {gathered_never}");
    // Alternated, twice each; the smaller peak of each (another process's noise only adds).
    let mut never = f64::MAX;
    let mut always = f64::MAX;
    for _ in 0..2 {
        never = never.min(measured_peak(&never_flags));
        always = always.min(measured_peak(&always_flags));
    }
    let (saved, plan_saved) = (never - always, plan_never - plan_always);
    let report = format!(
        "never: planned {plan_never:.3} GiB, measured {never:.3}; always: planned {plan_always:.3}, measured {always:.3}; saved: planned {plan_saved:.3}, measured {saved:.3}"
    );
    println!("{report}");
    assert!(plan_saved > 0.0, "{report}");
    assert!((saved / plan_saved - 1.0).abs() <= 0.20, "{report}");
}
