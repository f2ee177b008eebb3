//! Sharded checkpoints through the binary: saved by every rank of an n-D layout, resumed under
//! other layouts, crash-safe mid-save (kill -9, synchronous and async), inspected and
//! consolidated.

mod common;
use common::*;
use std::path::Path;
use titan_checkpoints::{FileReader, Region, ShardedReader, TensorSource};

/// debugmodel (6 layers, 16 heads, dim 256), 12 sequences of 32 tokens per step.
const BASE: &str = "--model.flavor debugmodel --training.global_batch_size 12";
const CK: &str = "--checkpoint.enable true --checkpoint.interval 2";
const SINGLE: &str = "--parallelism.data_parallel_shard_degree 1 --training.local_batch_size 12";
const THREE_D: &str = "--parallelism.pipeline_parallel_degree 2 --parallelism.data_parallel_shard_degree 2 --parallelism.tensor_parallel_degree 2 --training.local_batch_size 6";

/// A checkpoint saved by 8 ranks (PP 2 × FSDP 2 × TP 2) resumes bit for bit under the same
/// layout, and within 1e-5 relative of the uninterrupted run under one rank, TP 4, FSDP 3
/// (uneven rows: 256 = 86 + 86 + 84), HSDP 2 × 2 and Interleaved PP 2.
#[test]
fn an_8_rank_3d_checkpoint_resumes_under_other_layouts() {
    let d = tempfile::tempdir().unwrap();
    let straight = layout_run(&d.path().join("straight"), &format!("{BASE} {SINGLE}"), 4);
    let straight_3d = layout_run(&d.path().join("straight-3d"), &format!("{BASE} {THREE_D}"), 4);
    assert_matches("3-D vs one rank", &straight, &straight_3d, 1e-5);
    let saved = d.path().join("saved");
    layout_run(&saved, &format!("{BASE} {THREE_D} {CK} --debug.stop_at_step 2"), 4);
    // Every rank wrote a file: no rank gathered the model.
    let step2 = saved.join("checkpoint/step-2");
    let rank_files = std::fs::read_dir(&step2).unwrap().flatten().filter(|e| e.file_name().to_string_lossy().starts_with("rank-")).count();
    assert_eq!(rank_files, 8, "one file per rank");

    let same = d.path().join("same");
    copy_dir(&saved, &same);
    assert_eq!(layout_run(&same, &format!("{BASE} {THREE_D} {CK}"), 4), straight_3d, "same layout: bit for bit");
    for (name, layout) in [
        ("single", SINGLE.to_string()),
        ("tp4", "--parallelism.data_parallel_shard_degree 1 --parallelism.tensor_parallel_degree 4 --training.local_batch_size 12".into()),
        ("fsdp3", "--parallelism.data_parallel_shard_degree 3 --training.local_batch_size 4".into()),
        ("hsdp2x2", "--parallelism.data_parallel_replicate_degree 2 --parallelism.data_parallel_shard_degree 2 --training.local_batch_size 3".into()),
        (
            "interleaved-pp2",
            "--parallelism.data_parallel_shard_degree 1 --parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_schedule Interleaved1F1B --training.local_batch_size 12".into(),
        ),
    ] {
        let dump = d.path().join(name);
        copy_dir(&saved, &dump);
        assert_matches(name, &straight, &layout_run(&dump, &format!("{BASE} {layout} {CK}"), 4), 1e-5);
    }

    // inspect names the layout and the chunks; consolidate writes every tensor in full.
    let out = assert_ok(&titan(&["checkpoint", "inspect", step2.to_str().unwrap()]));
    for want in ["sharded", "step 2", "8 rank(s)", "pp 2", "tp 2", "layers.5.attention.wq.weight  [256, 256]", "exp_avg_sq.norm.weight"] {
        assert!(out.contains(want), "inspect lacks {want:?}:\n{out}");
    }
    let file = d.path().join("full.safetensors");
    let o = assert_ok(&titan(&["checkpoint", "consolidate", saved.to_str().unwrap(), file.to_str().unwrap()]));
    assert!(o.contains("wrote"), "{o}");
    let (full, sharded) = (FileReader::open(&file).unwrap(), ShardedReader::open(&step2).unwrap());
    assert_eq!(full.shapes(), sharded.shapes());
    for (k, shape) in sharded.shapes() {
        let r = Region::full(&shape);
        let (a, b) = (full.read(&k, &r).unwrap(), sharded.read(&k, &r).unwrap());
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "{k}");
    }
}

/// `(step → (loss, grad norm))` keeping the last line of each step (a resumed run repeats the
/// steps after its checkpoint).
fn by_step(dump: &Path) -> std::collections::BTreeMap<u64, (String, String)> {
    losses(dump).into_iter().map(|(s, l, g)| (s, (l, g))).collect()
}

/// A process SIGKILLed while a checkpoint is half written (every rank's file on disk, nothing
/// committed; on the writer thread under async saves) leaves the previous checkpoint as the
/// latest; the rerun resumes from it and ends with the uninterrupted run's losses, bit for bit.
#[test]
fn kill_9_during_a_sharded_or_async_save_resumes_bit_exact() {
    let d = tempfile::tempdir().unwrap();
    let fsdp = "--parallelism.data_parallel_shard_degree 2 --training.local_batch_size 2";
    let straight = d.path().join("straight");
    layout_run(&straight, fsdp, 6);
    for mode in ["disabled", "async"] {
        let dump = d.path().join(mode);
        let args = tiny_args(&dump, 6);
        let flags = format!("{fsdp} {CK} --checkpoint.async_mode {mode}");
        let flags: Vec<&str> = flags.split_whitespace().collect();
        let mut killed = flags.clone();
        killed.extend(["--debug.kill_during_save_at_step", "4"]);
        let o = run(&args, &killed);
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(o.status.signal(), Some(9), "{mode}: {}", String::from_utf8_lossy(&o.stderr));
        let ck = dump.join("checkpoint");
        let names: Vec<String> = std::fs::read_dir(&ck).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        assert!(names.contains(&"step-2".to_string()) && !names.contains(&"step-4".to_string()), "{mode}: {names:?}");
        assert!(names.iter().any(|n| n.starts_with(".step-4.partial")), "{mode}: the half-written save is left as a partial folder: {names:?}");
        let out = assert_ok(&run(&args, &flags));
        assert!(out.contains("saved checkpoint"), "{out}");
        assert_eq!(by_step(&dump), by_step(&straight), "{mode}");
        let names: Vec<String> = std::fs::read_dir(&ck).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        assert!(!names.iter().any(|n| n.starts_with(".step")), "{mode}: the partial folder is cleaned up: {names:?}");
    }
}

/// Model-only final checkpoints, exclusions on load, the first-step checkpoint and bad keys.
#[test]
fn checkpoint_keys_as_torchtitan() {
    let d = tempfile::tempdir().unwrap();
    let dump = d.path().join("run");
    let args = tiny_args(&dump, 3);
    let keys = ["--checkpoint.enable", "true", "--checkpoint.interval", "10", "--checkpoint.enable_first_step_checkpoint", "true", "--checkpoint.last_save_model_only", "true"];
    assert_ok(&run(&args, &keys));
    let ck = dump.join("checkpoint");
    let (first, last) = (ShardedReader::open(&ck.join("step-1")).unwrap(), ShardedReader::open(&ck.join("step-3")).unwrap());
    assert!(!first.meta.model_only && first.shapes().contains_key("exp_avg.norm.weight"));
    assert!(last.meta.model_only && !last.shapes().keys().any(|k| k.starts_with("exp_avg")));
    // Resuming training from a model-only checkpoint needs the optimizer excluded.
    let more = tiny_args(&dump, 5);
    let o = run(&more, &["--checkpoint.enable", "true"]);
    assert_clean_error(&o, &["step-3 holds only the model", "exclude_from_loading"]);
    assert_ok(&run(&more, &["--checkpoint.enable", "true", "--checkpoint.exclude_from_loading", "optimizer"]));
    assert_eq!(by_step(&dump).keys().copied().collect::<Vec<_>>(), vec![1, 2, 3, 4, 5]);
    let o = run(&more, &["--checkpoint.exclude_from_loading", "[\"lr\"]"]);
    assert_clean_error(&o, &["checkpoint.exclude_from_loading", "\"lr\"", "optimizer"]);
    let o = run(&more, &["--checkpoint.async_mode", "async_with_pinned_mem"]);
    assert_clean_error(&o, &["checkpoint.async_mode", "\"async\""]);
}

/// A checkpoint of the previous, consolidated format (full tensors in `model.safetensors` and
/// `optimizer.safetensors`, written by rank 0) resumes under FSDP 2, each rank reading its rows.
#[test]
fn consolidated_checkpoints_of_the_previous_format_still_load() {
    use titan_checkpoints::{save_tensors, CheckpointFolder, HostTensor, TensorMap};
    let d = tempfile::tempdir().unwrap();
    let fsdp = "--parallelism.data_parallel_shard_degree 2 --training.local_batch_size 2";
    let straight = layout_run(&d.path().join("straight"), &format!("{fsdp} --training.global_batch_size 4"), 4);
    let saved = d.path().join("saved");
    layout_run(&saved, &format!("{fsdp} --training.global_batch_size 4 {CK} --debug.stop_at_step 2"), 4);
    // Rewrite step-2 in the old format.
    let step2 = saved.join("checkpoint/step-2");
    let full = d.path().join("full.safetensors");
    assert_ok(&titan(&["checkpoint", "consolidate", step2.to_str().unwrap(), full.to_str().unwrap()]));
    let src = FileReader::open(&full).unwrap();
    let (mut model, mut optim) = (TensorMap::new(), TensorMap::new());
    for (k, shape) in src.shapes() {
        let t = HostTensor { data: src.read(&k, &Region::full(&shape)).unwrap(), shape };
        if k.starts_with("exp_avg") { optim.insert(k, t) } else { model.insert(k, t) };
    }
    let (state, config) = (std::fs::read(step2.join("train_state.json")).unwrap(), std::fs::read(step2.join("config.toml")).unwrap());
    let old = d.path().join("old");
    let folder = CheckpointFolder::new(old.join("checkpoint"));
    let mut p = folder.begin(2).unwrap();
    p.write("model.safetensors", &save_tensors(&model, Default::default()).unwrap()).unwrap();
    p.write("optimizer.safetensors", &save_tensors(&optim, Default::default()).unwrap()).unwrap();
    p.write("train_state.json", &state).unwrap();
    p.write("config.toml", &config).unwrap();
    p.commit().unwrap();
    drop(folder);
    std::fs::copy(saved.join("metrics.jsonl"), old.join("metrics.jsonl")).unwrap();
    let out = assert_ok(&titan(&["checkpoint", "inspect", old.join("checkpoint").to_str().unwrap()]));
    assert!(out.contains("consolidated") && out.contains("layers.1.feed_forward.w1.weight"), "{out}");
    let got = layout_run(&old, &format!("{fsdp} --training.global_batch_size 4 {CK}"), 4);
    assert_eq!(got, straight, "the old format resumes bit for bit under the layout that saved it");
}
