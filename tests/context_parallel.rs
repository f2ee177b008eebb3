//! Context parallelism through the binary: the sequence split over 2 and 4 ranks (ring and
//! all-gather attention), composed with FSDP, TP + SP and PP, block-causal masking, and
//! checkpoints that resume without it — each equal to one rank (loss and gradient norm per
//! step, ≤ 1e-5 relative; measured ≤ 5e-7).

mod common;
use common::*;

const ONE: &str = "--parallelism.data_parallel_shard_degree 1 --training.local_batch_size 8";

fn cp(degree: usize, rest: &str) -> String {
    format!("--parallelism.context_parallel_degree {degree} {rest}")
}

#[test]
fn context_parallel_layouts_equal_one_rank() {
    let d = tempfile::tempdir().unwrap();
    let single = layout_run(&d.path().join("single"), ONE, 4);
    for (name, layout) in [
        ("CP 2", cp(2, ONE)),
        ("CP 4", cp(4, ONE)),
        ("CP 2 all-gather", cp(2, &format!("{ONE} --parallelism.context_parallel_rotate_method allgather"))),
        ("CP 2 × FSDP 2", cp(2, "--parallelism.data_parallel_shard_degree 2 --training.local_batch_size 4")),
        ("CP 2 × TP 2 (SP)", cp(2, &format!("{ONE} --parallelism.tensor_parallel_degree 2"))),
        ("CP 2 × PP 2", cp(2, &format!("{ONE} --parallelism.pipeline_parallel_degree 2 --parallelism.num_pp_microbatches 2"))),
        ("CP 2 × DDP 2", cp(2, "--parallelism.data_parallel_replicate_degree 2 --parallelism.data_parallel_shard_degree 1 --training.local_batch_size 4")),
    ] {
        let dump = d.path().join(name.replace([' ', '×', '(', ')'], "_"));
        assert_matches(name, &single, &layout_run(&dump, &layout, 4), 1e-5);
    }
}

/// A CP 2 × FSDP 2 checkpoint resumes on one rank; block-causal masking under CP 2 equals one
/// rank's; bad CP settings are clear errors.
#[test]
fn context_parallel_checkpoints_masks_and_errors() {
    let d = tempfile::tempdir().unwrap();
    let ck = "--checkpoint.enable true --checkpoint.interval 2";
    let single = layout_run(&d.path().join("single"), ONE, 4);
    let saved = d.path().join("saved");
    layout_run(&saved, &cp(2, &format!("--parallelism.data_parallel_shard_degree 2 --training.local_batch_size 4 {ck} --debug.stop_at_step 2")), 4);
    let resumed = layout_run(&saved, &format!("{ONE} {ck}"), 4);
    assert_matches("CP 2 × FSDP 2 checkpoint resumed on one rank", &single, &resumed, 1e-5);

    let text = std::fs::read_to_string(repo().join("assets/shakespeare/valid.txt")).unwrap();
    let jsonl: String = text.lines().filter(|l| !l.trim().is_empty()).map(|t| serde_json::json!({ "text": t }).to_string() + "\n").collect();
    let corpus = d.path().join("lines.jsonl");
    std::fs::write(&corpus, jsonl).unwrap();
    let block = format!("--training.dataset_path {} --model.attn_mask_type block_causal", corpus.display());
    let one = layout_run(&d.path().join("block-one"), &format!("{block} {ONE}"), 3);
    assert_matches("block-causal CP 2", &one, &layout_run(&d.path().join("block-cp2"), &cp(2, &format!("{block} {ONE}")), 3), 1e-5);
    let restart = format!("{block} --model.rope_per_document true");
    let one = layout_run(&d.path().join("restart-one"), &format!("{restart} {ONE}"), 3);
    assert_matches("RoPE per document CP 4", &one, &layout_run(&d.path().join("restart-cp4"), &cp(4, &format!("{restart} {ONE}")), 3), 1e-5);

    let o = run(&tiny_args(&d.path().join("bad"), 1), &["--parallelism.context_parallel_degree", "3", "--parallelism.data_parallel_shard_degree", "1"]);
    assert_clean_error(&o, &["training.seq_len` = 32", "context_parallel_degree` = 6"]);
}
