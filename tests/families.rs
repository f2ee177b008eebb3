//! The model families other than Llama 3 through the binary (Llama's own tests are the rest of
//! `tests/`): the debug flavors of Qwen3, Qwen3-MoE and DeepSeek-V3 learn Shakespeare; each under
//! FSDP 2 × TP 2, TP 2 without SP, PP 2 and CP 2 (and the MoE ones under EP 2, alone and with
//! TP 2 × FSDP 2) equals one rank (loss and gradient norm per step, ≤ 1e-5 relative); `plan`
//! prints the published shapes; a flavor of another family is a clear error.

mod common;
use common::*;

fn model(family: &str, flavor: &str, rest: &str) -> String {
    format!("--model.name {family} --model.flavor {flavor} {rest}")
}

/// The shipped config's flavor and the MoE one learn: ln(2048) = 7.62 at init, well below after
/// 30 steps (the tiny shapes, to keep the test short; `configs/qwen3_debug.toml` runs debugmodel).
#[test]
fn debug_flavors_of_every_family_learn_shakespeare() {
    let d = tempfile::tempdir().unwrap();
    for (family, flavor) in [("qwen3", "tiny"), ("qwen3", "tiny_moe"), ("deepseek_v3", "tiny")] {
        let dump = d.path().join(format!("{family}-{flavor}"));
        assert_ok(&run(&tiny_args(&dump, 30), &model(family, flavor, "").split_whitespace().collect::<Vec<_>>()));
        let l = losses(&dump);
        let (first, last): (f64, f64) = (l[0].1.parse().unwrap(), l[29].1.parse().unwrap());
        eprintln!("{family} {flavor}: loss {first} -> {last}");
        assert!(first > 7.0 && last < first - 1.0, "{family} {flavor}: loss {first} -> {last}");
    }
    // The shipped config parses and trains its first steps.
    let cfg = d.path().join("cfg");
    let o = titan(&[
        "train",
        "--config",
        "configs/qwen3_debug.toml",
        "--training.steps",
        "2",
        "--job.dump_folder",
        cfg.to_str().unwrap(),
        "--checkpoint.enable",
        "false",
        "--metrics.save_loss_curve",
        "false",
    ]);
    assert_ok(&o);
    assert_eq!(losses(&cfg).len(), 2);
}

#[test]
fn every_family_under_every_layout_equals_one_rank() {
    let d = tempfile::tempdir().unwrap();
    let b4 = "--training.local_batch_size 4";
    for (family, flavor) in [("qwen3", "tiny"), ("qwen3", "tiny_moe"), ("deepseek_v3", "tiny")] {
        let one = "--parallelism.data_parallel_shard_degree 1 --training.local_batch_size 8";
        let single = layout_run(&d.path().join(format!("{family}-{flavor}-1")), &model(family, flavor, one), 3);
        let mut layouts = vec![
            ("FSDP 2 × TP 2", format!("--parallelism.data_parallel_shard_degree 2 --parallelism.tensor_parallel_degree 2 {b4}")),
            ("PP 2", "--parallelism.data_parallel_shard_degree 1 --parallelism.pipeline_parallel_degree 2 --training.local_batch_size 8".into()),
            ("CP 2", "--parallelism.data_parallel_shard_degree 1 --parallelism.context_parallel_degree 2 --training.local_batch_size 8".into()),
            ("TP 2 without SP", "--parallelism.data_parallel_shard_degree 1 --parallelism.tensor_parallel_degree 2 --parallelism.enable_sequence_parallel false --training.local_batch_size 8".into()),
        ];
        if flavor == "tiny_moe" || family == "deepseek_v3" {
            layouts.push((
                "EP 2",
                format!("--parallelism.data_parallel_shard_degree 2 --parallelism.expert_parallel_degree 2 {b4}"),
            ));
            layouts.push(("EP 2 × FSDP 2 × TP 2", format!("--parallelism.data_parallel_shard_degree 2 --parallelism.tensor_parallel_degree 2 --parallelism.expert_parallel_degree 2 {b4}")));
        }
        for (name, layout) in layouts {
            let dump = d.path().join(format!("{family}-{flavor}-{}", name.replace([' ', '×'], "_")));
            let got = layout_run(&dump, &model(family, flavor, &layout), 3);
            assert_matches(&format!("{family} {flavor} {name}"), &single, &got, 1e-5);
        }
    }
}

#[test]
fn plan_prints_the_published_shapes_and_bad_flavors_are_named() {
    for (flavor, want) in [
        ("0.6B", "qwen3/0.6B: 28 layers, 596.0 M parameters, 16 heads (8 kv) of 128, QK-norm"),
        ("30B-A3B", "qwen3/30B-A3B: 48 layers (0 dense), 30532.1 M parameters"),
    ] {
        let out = assert_ok(&titan(&[
            "plan",
            "--config",
            "configs/qwen3_debug.toml",
            "--model.flavor",
            flavor,
            "--parallelism.data_parallel_shard_degree",
            "8",
        ]));
        assert!(out.contains(want), "{out}");
    }
    let out = assert_ok(&titan(&[
        "plan",
        "--config",
        "configs/qwen3_debug.toml",
        "--model.name",
        "deepseek_v3",
        "--model.flavor",
        "671B",
        "--parallelism.data_parallel_shard_degree",
        "64",
        "--parallelism.expert_parallel_degree",
        "8",
    ]));
    assert!(out.contains("deepseek_v3/671B: 61 layers (3 dense), 671026.4 M parameters"), "{out}");
    let o = titan(&["train", "--config", "configs/qwen3_debug.toml", "--model.flavor", "moe_debug"]);
    assert_clean_error(&o, &["`model.flavor` = \"moe_debug\"", "30B-A3B"]);
    let o = titan(&["train", "--config", "configs/llama_debug.toml", "--model.name", "gpt2"]);
    assert_clean_error(&o, &["model.name", "qwen3"]);
}
