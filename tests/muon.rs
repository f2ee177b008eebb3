//! Muon through the binary: every layout equals one rank (the orthogonalisation sees whole
//! matrices: owner computes over the FSDP group, TP slices gathered, experts one by one); its
//! checkpoints resume bit for bit in their own layout and reshard to others; config mistakes
//! are clear errors.

mod common;
use common::*;

const MUON: &str = "--optimizer.name Muon --optimizer.lr 0.02 --training.global_batch_size 8";

fn muon(rest: &str) -> String {
    format!("{MUON} {rest}")
}

/// Dense and mixture-of-experts layouts against one rank, within 1e-5 relative (loss and
/// gradient norm of every step; in practice they agree to the printed digit).
#[test]
fn muon_layouts_equal_one_rank() {
    let d = tempfile::tempdir().unwrap();
    let single = layout_run(
        &d.path().join("single"),
        &muon("--parallelism.data_parallel_shard_degree 1 --training.local_batch_size 8"),
        4,
    );
    for (name, layout) in [
        ("FSDP 4", "--parallelism.data_parallel_shard_degree 4 --training.local_batch_size 2"),
        ("FSDP 2 × TP 2", "--parallelism.data_parallel_shard_degree 2 --parallelism.tensor_parallel_degree 2 --training.local_batch_size 4"),
        ("HSDP 2 × 2", "--parallelism.data_parallel_replicate_degree 2 --parallelism.data_parallel_shard_degree 2 --training.local_batch_size 2"),
        ("PP 2 × FSDP 2", "--parallelism.pipeline_parallel_degree 2 --parallelism.data_parallel_shard_degree 2 --training.local_batch_size 4"),
        ("CP 2 × FSDP 2", "--parallelism.context_parallel_degree 2 --parallelism.data_parallel_shard_degree 2 --training.local_batch_size 4"),
    ] {
        let dump = d.path().join(name.replace([' ', '×'], "_"));
        assert_matches(name, &single, &layout_run(&dump, &muon(layout), 4), 1e-5);
    }
    let moe = |rest: &str| muon(&format!("--model.flavor moe_debug {rest}"));
    let single = layout_run(
        &d.path().join("moe_single"),
        &moe("--parallelism.data_parallel_shard_degree 1 --training.local_batch_size 8"),
        3,
    );
    for (name, layout) in [
        ("EP 2 × FSDP 2", "--parallelism.data_parallel_shard_degree 4 --parallelism.expert_parallel_degree 2 --training.local_batch_size 2"),
        ("EP 2 × FSDP 2 × TP 2", "--parallelism.data_parallel_shard_degree 2 --parallelism.tensor_parallel_degree 2 --parallelism.expert_parallel_degree 2 --training.local_batch_size 4"),
        ("EP 2 × PP 2", "--parallelism.data_parallel_shard_degree 2 --parallelism.pipeline_parallel_degree 2 --parallelism.num_pp_microbatches 2 --parallelism.expert_parallel_degree 2 --training.local_batch_size 4"),
    ] {
        let dump = d.path().join(name.replace([' ', '×'], "_"));
        assert_matches(name, &single, &layout_run(&dump, &moe(layout), 3), 1e-5);
    }
}

/// A Muon checkpoint of FSDP 2 × TP 2 (momentum buffers sharded like the parameters): resumed
/// in its own layout it gives the uninterrupted run's losses bit for bit; resumed on one rank
/// and on PP 2 it matches within 1e-5.
#[test]
fn muon_checkpoints_resume_bit_exact_and_reshard() {
    let d = tempfile::tempdir().unwrap();
    let ck = "--checkpoint.enable true --checkpoint.interval 3";
    let two_d = muon("--parallelism.data_parallel_shard_degree 2 --parallelism.tensor_parallel_degree 2 --training.local_batch_size 4");
    let whole = d.path().join("whole");
    let straight = layout_run(&whole, &two_d, 6);
    let saved = d.path().join("saved");
    layout_run(&saved, &format!("{two_d} {ck} --debug.stop_at_step 3"), 6);
    let (same, one, pp) = (d.path().join("same"), d.path().join("one"), d.path().join("pp"));
    for to in [&same, &one, &pp] {
        copy_dir(&saved, to);
    }
    layout_run(&same, &format!("{two_d} {ck}"), 6);
    assert_eq!(losses(&whole), losses(&same), "FSDP 2 × TP 2 resumed in its own layout, bit for bit");
    let single = muon(&format!("--parallelism.data_parallel_shard_degree 1 --training.local_batch_size 8 {ck}"));
    assert_matches("resumed on one rank", &straight, &layout_run(&one, &single, 6), 1e-5);
    let pp2 = muon(&format!("--parallelism.pipeline_parallel_degree 2 --parallelism.data_parallel_shard_degree 1 --training.local_batch_size 8 {ck}"));
    assert_matches("resumed on PP 2", &straight, &layout_run(&pp, &pp2, 6), 1e-5);
    // An AdamW run cannot silently continue from Muon state.
    let o = run(
        &tiny_args(&one, 8),
        &[ck, "--training.global_batch_size", "8"].iter().flat_map(|s| s.split_whitespace()).collect::<Vec<_>>(),
    );
    assert_clean_error(&o, &["momentum_buffer", "exclude_from_loading"]);
}

#[test]
fn muon_for_a_vector_or_a_bad_pattern_is_a_clear_error() {
    let d = tempfile::tempdir().unwrap();
    let cfg = d.path().join("groups.toml");
    let base = std::fs::read_to_string(repo().join("configs/llama_debug.toml")).unwrap();
    std::fs::write(&cfg, format!("{base}\n[[optimizer.param_groups]]\npattern = \"norm\"\noptimizer = \"Muon\"\n"))
        .unwrap();
    let mut args = tiny_args(d.path(), 1);
    args[2] = cfg.display().to_string();
    let o = run(&args, &[]);
    assert_clean_error(&o, &["param_groups[0]", "norm", "Muon orthogonalises matrices only"]);
    let o = run(&tiny_args(d.path(), 1), &["--optimizer.param_groups", "[{pattern = \"(\"}]"]);
    assert_clean_error(&o, &["optimizer.param_groups[0].pattern", "regular expression"]);
}
