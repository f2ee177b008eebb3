//! Mixture-of-experts models through the binary: `moe_debug` learns Shakespeare; expert
//! parallelism alone and composed with FSDP, TP (with and without sequence parallelism), PP, CP
//! and DDP equals one rank (loss and gradient norm per step, ≤ 1e-5 relative; measured ≤ 3e-6);
//! a checkpoint written under EP 2 × FSDP 2 resumes bit for bit in its own layout and within
//! 1e-5 on one rank and under EP 4; EP on a dense model is a clear error.

mod common;
use common::*;

const ONE: &str = "--model.flavor moe_debug --parallelism.data_parallel_shard_degree 1 --training.local_batch_size 8";

fn moe(rest: &str) -> String {
    format!("--model.flavor moe_debug {rest}")
}

#[test]
fn expert_parallel_layouts_equal_one_rank() {
    let d = tempfile::tempdir().unwrap();
    let single = layout_run(&d.path().join("single"), ONE, 3);
    let b4 = "--training.local_batch_size 4";
    for (name, layout) in [
        ("EP 2", moe(&format!("--parallelism.data_parallel_shard_degree 2 --parallelism.expert_parallel_degree 2 {b4}"))),
        ("EP 2 × FSDP 2", moe("--parallelism.data_parallel_shard_degree 4 --parallelism.expert_parallel_degree 2 --training.local_batch_size 2")),
        ("EP 2 × FSDP 2 × TP 2", moe(&format!("--parallelism.data_parallel_shard_degree 2 --parallelism.tensor_parallel_degree 2 --parallelism.expert_parallel_degree 2 {b4}"))),
        ("EP 2 over TP 2 without SP", moe("--parallelism.data_parallel_shard_degree 1 --parallelism.tensor_parallel_degree 2 --parallelism.enable_sequence_parallel false --parallelism.expert_parallel_degree 2 --training.local_batch_size 8")),
        ("TP 2, experts replicated", moe("--parallelism.data_parallel_shard_degree 1 --parallelism.tensor_parallel_degree 2 --training.local_batch_size 8")),
        ("EP 2 × PP 2", moe(&format!("--parallelism.data_parallel_shard_degree 2 --parallelism.pipeline_parallel_degree 2 --parallelism.num_pp_microbatches 2 --parallelism.expert_parallel_degree 2 {b4}"))),
        ("EP 2 over CP 2", moe("--parallelism.data_parallel_shard_degree 1 --parallelism.context_parallel_degree 2 --parallelism.expert_parallel_degree 2 --training.local_batch_size 8")),
        ("EP 2 × DDP 2", moe("--parallelism.data_parallel_replicate_degree 2 --parallelism.data_parallel_shard_degree 2 --parallelism.expert_parallel_degree 2 --training.local_batch_size 2")),
    ] {
        let dump = d.path().join(name.replace([' ', '×', ','], "_"));
        assert_matches(name, &single, &layout_run(&dump, &layout, 3), 1e-5);
    }
}

/// Per-layer expert loads (tokens per expert, whole job) from `metrics.jsonl`.
fn loads(dump: &std::path::Path) -> Vec<String> {
    let body = std::fs::read_to_string(dump.join("metrics.jsonl")).unwrap();
    body.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter_map(|v| v.get("moe_tokens_per_expert").map(|t| t.to_string()))
        .collect()
}

#[test]
fn expert_parallel_checkpoints_resume_and_reshard() {
    let d = tempfile::tempdir().unwrap();
    let ck = "--checkpoint.enable true --checkpoint.interval 2";
    let ep2 = moe(&format!("--parallelism.data_parallel_shard_degree 4 --parallelism.expert_parallel_degree 2 --training.local_batch_size 2 {ck}"));
    let whole = d.path().join("whole");
    layout_run(&whole, &ep2, 4);
    let saved = d.path().join("saved");
    layout_run(&saved, &format!("{ep2} --debug.stop_at_step 2"), 4);
    let (same, one, ep4) = (d.path().join("same"), d.path().join("one"), d.path().join("ep4"));
    for to in [&same, &one, &ep4] {
        copy_dir(&saved, to);
    }
    layout_run(&same, &ep2, 4);
    // The same layout: every step's loss, gradient norm and routing bit for bit (the balancing
    // bias is part of the checkpoint).
    assert_eq!(losses(&whole), losses(&same), "EP 2 × FSDP 2 resumed in its own layout");
    assert_eq!(loads(&whole), loads(&same));
    let want = metric_values(&whole);
    assert_matches("EP 2 × FSDP 2 checkpoint resumed on one rank", &want, &layout_run(&one, &format!("{ONE} {ck}"), 4), 1e-5);
    let as_ep4 = moe(&format!("--parallelism.data_parallel_shard_degree 4 --parallelism.expert_parallel_degree 4 --training.local_batch_size 2 {ck}"));
    assert_matches("EP 2 × FSDP 2 checkpoint resumed as EP 4", &want, &layout_run(&ep4, &as_ep4, 4), 1e-5);
}

/// `moe_debug` learns: the loss falls by more than 1.5 nats in 30 steps, the per-layer expert
/// load is reported, and the startup line gives total and active parameter counts.
#[test]
fn moe_debug_learns_shakespeare_and_reports_its_experts() {
    let d = tempfile::tempdir().unwrap();
    let o = run(&tiny_args(d.path(), 30), &["--model.flavor", "moe_debug", "--optimizer.lr", "3e-3"]);
    assert_ok(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("parameters (6.") && out.contains("active per token") && out.contains("8 experts, top 3, 2 shared"), "{out}");
    let v = metric_values(d.path());
    let (first, last) = (v[0].0, v[v.len() - 1].0);
    assert!(first - last > 1.5, "loss {first} → {last}");
    let body = std::fs::read_to_string(d.path().join("metrics.jsonl")).unwrap();
    let line: serde_json::Value = serde_json::from_str(body.lines().find(|l| l.contains("moe_imbalance")).unwrap()).unwrap();
    for layer in ["layers.1", "layers.2"] {
        let imbalance = line["moe_imbalance"][layer].as_f64().unwrap();
        let tokens: u64 = line["moe_tokens_per_expert"][layer].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).sum();
        // 4 sequences × 32 positions, top 3.
        assert!(imbalance >= 1.0 && tokens == 4 * 32 * 3, "{layer}: {imbalance} {tokens}");
    }
    assert!(line["moe_imbalance"].get("layers.0").is_none(), "the first layer is dense");

    let o = run(&tiny_args(&d.path().join("dense"), 1), &["--parallelism.expert_parallel_degree", "2", "--parallelism.data_parallel_shard_degree", "2"]);
    assert_clean_error(&o, &["expert_parallel_degree` = 2 needs a mixture-of-experts model", "moe_debug"]);
}

/// The sequence-wise balance loss (`model.moe_aux_loss_alpha`): it reaches the router (the
/// gradient norm differs from α = 0), it is reported per layer near α (≈ α · 1 for a balanced
/// router), and EP 2 × FSDP 2 and PP 2 × EP 2 with full activation checkpointing (the loss is
/// attached inside recomputed blocks) equal one rank.
#[test]
fn balance_loss_trains_the_router_in_every_layout() {
    let d = tempfile::tempdir().unwrap();
    let aux = "--model.moe_aux_loss_alpha 0.01";
    let plain = layout_run(&d.path().join("plain"), ONE, 3);
    let single = layout_run(&d.path().join("single"), &format!("{ONE} {aux}"), 3);
    assert!((plain[0].1 - single[0].1).abs() > 1e-7 * plain[0].1, "the balance loss must change the gradient");
    let body = std::fs::read_to_string(d.path().join("single/metrics.jsonl")).unwrap();
    let line: serde_json::Value = serde_json::from_str(body.lines().find(|l| l.contains("moe_aux_loss")).unwrap()).unwrap();
    for layer in ["layers.1", "layers.2"] {
        let v = line["moe_aux_loss"][layer].as_f64().unwrap();
        assert!((0.01..0.02).contains(&v), "{layer}: balance loss {v}");
    }
    for (name, layout) in [
        ("EP 2 × FSDP 2", moe(&format!("--parallelism.data_parallel_shard_degree 4 --parallelism.expert_parallel_degree 2 --training.local_batch_size 2 {aux}"))),
        ("PP 2 × EP 2, full AC", moe(&format!("--parallelism.data_parallel_shard_degree 2 --parallelism.pipeline_parallel_degree 2 --parallelism.num_pp_microbatches 2 --parallelism.expert_parallel_degree 2 --training.local_batch_size 4 --activation_checkpoint.mode full {aux}"))),
    ] {
        let dump = d.path().join(name.replace([' ', '×', ','], "_"));
        assert_matches(name, &single, &layout_run(&dump, &layout, 3), 1e-5);
    }
    let o = run(&tiny_args(&d.path().join("dense"), 1), &["--model.moe_aux_loss_alpha", "0.1"]);
    assert_clean_error(&o, &["model.moe_aux_loss_alpha` apply to mixture-of-experts flavors"]);
}
