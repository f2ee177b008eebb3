//! Pipeline parallelism end to end: every schedule, interleaved virtual stages, PP composed with
//! FSDP and with FSDP × TP (3-D), resume and resharding of PP checkpoints, and `titan-rs plan`.

mod common;
use common::*;

/// The debugmodel (6 layers, 16 heads) at seq 32, global batch 8, one rank per data-parallel
/// group unless `extra` says otherwise.
const DEBUG: &str = "--model.flavor debugmodel --training.global_batch_size 8 --parallelism.data_parallel_shard_degree";

/// Every schedule (4 microbatches), interleaved with 2 and 3 virtual stages per rank, pp 2 ×
/// FSDP 2 and pp 2 × FSDP 2 × TP 2 (8 ranks) give the single-rank losses and gradient norms.
/// Tolerance 1e-5 relative: a pipeline splits the batch into microbatches whose gradients are
/// summed in another order, and TP/FSDP add their own partial sums; measured ≈ 1e-7.
#[test]
fn pipeline_layouts_match_the_single_rank_run() {
    let d = tempfile::tempdir().unwrap();
    let single = layout_run(&d.path().join("single"), &format!("{DEBUG} 1 --training.local_batch_size 8"), 4);
    assert_eq!(single.len(), 4);
    let pp2 = "--training.local_batch_size 8 --parallelism.pipeline_parallel_degree 2";
    for (name, extra) in [
        ("gpipe", format!("{DEBUG} 1 {pp2} --parallelism.num_pp_microbatches 4 --parallelism.pipeline_parallel_schedule GPipe")),
        ("1f1b", format!("{DEBUG} 1 {pp2} --parallelism.num_pp_microbatches 4 --parallelism.pipeline_parallel_schedule 1F1B")),
        (
            "interleaved-v2",
            format!("{DEBUG} 1 {pp2} --parallelism.num_pp_microbatches 4 --parallelism.pipeline_parallel_schedule Interleaved1F1B"),
        ),
        (
            "interleaved-v3",
            format!(
                "{DEBUG} 1 {pp2} --parallelism.num_pp_microbatches 2 --parallelism.pipeline_parallel_schedule Interleaved1F1B --parallelism.pipeline_parallel_layers_per_stage 1"
            ),
        ),
        (
            "pp2-fsdp2",
            format!("{DEBUG} 2 --training.local_batch_size 4 --parallelism.pipeline_parallel_degree 2"),
        ),
        (
            "pp2-fsdp2-tp2",
            format!(
                "{DEBUG} 2 --training.local_batch_size 4 --parallelism.pipeline_parallel_degree 2 --parallelism.tensor_parallel_degree 2"
            ),
        ),
    ] {
        let got = layout_run(&d.path().join(name), &extra, 4);
        assert_matches(name, &single, &got, 1e-5);
    }
}

/// Resume under pp 2 × FSDP 2 (same layout) is bit-exact; the checkpoint (whole-model names,
/// full tensors) resumes on one rank and under an interleaved split of other stages.
#[test]
fn pipeline_checkpoints_resume_bit_exact_and_reshard() {
    let d = tempfile::tempdir().unwrap();
    let pp = format!("{DEBUG} 2 --training.local_batch_size 4 --parallelism.pipeline_parallel_degree 2");
    let ck = "--checkpoint.enable true --checkpoint.interval 2";
    let straight = layout_run(&d.path().join("straight"), &pp, 4);
    let resumed = d.path().join("resumed");
    layout_run(&resumed, &format!("{pp} {ck} --debug.stop_at_step 2"), 4);
    assert_eq!(layout_run(&resumed, &format!("{pp} {ck}"), 4), straight, "bit for bit");
    let single = d.path().join("single");
    layout_run(&single, &format!("{pp} {ck} --debug.stop_at_step 2"), 4);
    let got = layout_run(&single, &format!("{DEBUG} 1 --training.local_batch_size 8 {ck}"), 4);
    assert_matches("pp2-fsdp2 to single", &straight, &got, 1e-5);
    let inter = d.path().join("interleaved");
    layout_run(&inter, &format!("{pp} {ck} --debug.stop_at_step 2"), 4);
    let other = format!(
        "{DEBUG} 1 --training.local_batch_size 8 --parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_schedule Interleaved1F1B {ck}"
    );
    assert_matches("pp2-fsdp2 to interleaved pp2", &straight, &layout_run(&inter, &other, 4), 1e-5);
}

#[test]
fn plan_draws_each_rank_and_the_bubble() {
    let o = titan(&[
        "plan",
        "--config",
        "configs/llama_debug.toml",
        "--parallelism.pipeline_parallel_degree",
        "2",
        "--parallelism.num_pp_microbatches",
        "4",
        "--parallelism.data_parallel_shard_degree",
        "1",
    ]);
    let out = assert_ok(&o);
    // 1F1B on 2 ranks with 4 microbatches: the textbook bubble (pp − 1) / (n + pp − 1) = 1/5.
    for want in [
        "stage 0 on pp rank 0: embedding + layers 0..3",
        "stage 1 on pp rank 1: layers 3..6 + norm + head + loss",
        "rank 0 |F0 F1 .  .  B0 B0 F2 B1 B1 F3 B2 B2 .  B3 B3",
        "rank 1 |.  F0 B0 B0 F1 B1 B1 F2 B2 B2 F3 B3 B3 .  .",
        "bubble: 20.0% of rank time idle",
        "GPipe            bubble  20.0%",
        "Interleaved1F1B  bubble  11.1%",
    ] {
        assert!(out.contains(want), "lacks {want:?}:\n{out}");
    }
}

#[test]
fn impossible_pipeline_configs_are_clear_errors() {
    let plan = |extra: &[&str]| {
        let mut a = vec!["plan", "--config", "configs/llama_debug.toml", "--parallelism.pipeline_parallel_degree", "2"];
        a.extend_from_slice(extra);
        titan(&a)
    };
    let o = plan(&["--parallelism.num_pp_microbatches", "3"]);
    assert_clean_error(&o, &["`training.local_batch_size` = 4", "`parallelism.num_pp_microbatches` = 3"]);
    let o = plan(&[
        "--parallelism.pipeline_parallel_schedule",
        "Interleaved1F1B",
        "--parallelism.num_pp_microbatches",
        "1",
    ]);
    assert_clean_error(
        &o,
        &["`parallelism.num_pp_microbatches` = 1 must be a multiple of `pipeline_parallel_degree` = 2"],
    );
    let o = plan(&["--parallelism.pipeline_parallel_layers_per_stage", "2"]);
    assert_clean_error(&o, &["`parallelism.pipeline_parallel_layers_per_stage` = 2 gives 3 stages"]);
    let o = plan(&["--parallelism.pipeline_parallel_degree", "8"]);
    assert_clean_error(&o, &["`parallelism.pipeline_parallel_degree` = 8 exceeds the model's 6 layers"]);
    let o = plan(&["--parallelism.pipeline_parallel_schedule", "ZeroBubble"]);
    assert_clean_error(&o, &["parallelism.pipeline_parallel_schedule", "1F1B"]);
}

/// Mixed precision composes with the pipeline and FSDP: bfloat16 compute under pp 2 and under
/// FSDP 2 tracks the single-rank bfloat16 run (2e-3 relative: the microbatch and shard sums
/// round to bfloat16 in other orders; measured ≤ 2e-4).
#[test]
fn bfloat16_compute_composes_with_pipeline_and_fsdp() {
    let d = tempfile::tempdir().unwrap();
    let bf16 = "--training.mixed_precision_param bfloat16";
    let single = layout_run(&d.path().join("single"), &format!("{DEBUG} 1 --training.local_batch_size 8 {bf16}"), 3);
    let pp = format!("{DEBUG} 1 --training.local_batch_size 8 --parallelism.pipeline_parallel_degree 2 {bf16}");
    assert_matches("pp2 bfloat16", &single, &layout_run(&d.path().join("pp2"), &pp, 3), 2e-3);
    let fsdp = format!("{DEBUG} 2 --training.local_batch_size 4 {bf16}");
    assert_matches("fsdp2 bfloat16", &single, &layout_run(&d.path().join("fsdp2"), &fsdp, 3), 2e-3);
}
