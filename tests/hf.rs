//! Hugging Face interop against fixtures written by transformers itself (Llama:
//! scripts/hf_fixture.py; Qwen3 dense and MoE: scripts/family_fixtures.py): titan-rs's logits,
//! loss and greedy continuation equal transformers', under any layout; export and conversion
//! round trips; every bad input a clear error.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use titan_checkpoints::{FileReader, FolderReader, Region, TensorSource};

fn fixture(name: &str) -> PathBuf {
    repo().join("tests/fixtures/hf").join(name)
}

/// The flags that train the HF model in `dir` (initialised from its weights; `model.name` its
/// family).
fn hf_flags(dir: &Path) -> Vec<String> {
    let d = dir.display().to_string();
    // (A config naming no family: the default, so the run reports the config's own error.)
    let family = titan_rs::config::hf_model_name(dir).map_or("llama3".into(), |n| n.to_string());
    [
        "--model.name",
        &family,
        "--model.flavor",
        "hf",
        "--model.hf_assets_path",
        &d,
        "--model.tokenizer_path",
        "assets/tokenizer/tokenizer.json",
        "--checkpoint.initial_load_path",
        &d,
        "--checkpoint.initial_load_in_hf",
        "true",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn run_hf(dump: &Path, dir: &Path, extra: &str, steps: u32) -> std::process::Output {
    let mut args = tiny_args(dump, steps);
    args.extend(hf_flags(dir));
    run(&args, &extra.split_whitespace().collect::<Vec<_>>())
}

/// Mean next-token cross-entropy of `logits` `[B, T, V]` for `ids` `[B, T]` (f64).
fn next_token_loss(logits: &[f32], ids: &[Vec<i64>], v: usize) -> f64 {
    let t = ids[0].len();
    let (mut sum, mut n) = (0.0f64, 0usize);
    for (b, row) in ids.iter().enumerate() {
        for i in 0..t - 1 {
            let l = &logits[(b * t + i) * v..(b * t + i + 1) * v];
            let m = l.iter().fold(f32::MIN, |a, &x| a.max(x)) as f64;
            let lse = m + l.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
            sum += lse - l[row[i + 1] as usize] as f64;
            n += 1;
        }
    }
    sum / n as f64
}

/// The model titan-rs builds from each fixture (config.json in both shapes; bf16 single file
/// with tied embeddings; fp32 in shards, untied; Llama, Qwen3, Qwen3-MoE) gives transformers'
/// logits within 1e-4 and its loss within 1e-5 relative, loaded through the trainer's own
/// (resharding) path; for Qwen3 also transformers' greedy continuation of a prompt, token for
/// token.
#[test]
fn logits_and_loss_equal_transformers() {
    use titan_rs::{config::load_config, rank::RankContext, train::trainer::Trainer};
    let d = tempfile::tempdir().unwrap();
    for name in
        ["tied_bf16", "untied_sharded", "qwen3_tied_bf16", "qwen3_moe_sharded", "qwen3_yarn", "deepseek_v3_tiny"]
    {
        let dir = fixture(name);
        let reference: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
        let ids: Vec<Vec<i64>> = serde_json::from_value(reference["input_ids"].clone()).unwrap();
        let mut flags = tiny_args(&d.path().join(name), 1);
        flags.extend(hf_flags(&dir));
        let overrides = titan_rs::config::parse_overrides(&flags[3..]).unwrap();
        let cfg = load_config(Some(&repo().join("configs/llama_debug.toml")), &overrides).unwrap();
        let t = Trainer::new(cfg, RankContext::single()).unwrap();
        let (b, s) = (ids.len(), ids[0].len());
        let flat: Vec<i64> = ids.iter().flatten().copied().collect();
        let x = titan_rs::rank::pipeline::to_tensor_2d(&flat, b, s, &t.device);
        let logits: Vec<f32> = t.model.chunks[0].forward(x).into_data().try_into_vec::<f32>().unwrap();
        let want = FileReader::open(&dir.join("reference.safetensors")).unwrap();
        let want = want.read("logits", &Region::full(&[b, s, 2048])).unwrap();
        let worst = logits.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(worst <= 1e-4, "{name}: logits differ by up to {worst}");
        let (ours, theirs) = (next_token_loss(&logits, &ids, 2048), reference["loss"].as_f64().unwrap());
        eprintln!(
            "{name}: logits within {worst:e}, loss {ours} vs transformers {theirs} ({:e} relative)",
            (ours - theirs).abs() / theirs
        );
        assert!((ours - theirs).abs() <= 1e-5 * theirs, "{name}: loss {ours} vs transformers {theirs}");
        if let Some(want) = reference.get("greedy") {
            let mut seq: Vec<i64> = serde_json::from_value(reference["greedy_prompt"].clone()).unwrap();
            let prompt = seq.len();
            let want: Vec<i64> = serde_json::from_value(want.clone()).unwrap();
            while seq.len() < prompt + want.len() {
                let x = titan_rs::rank::pipeline::to_tensor_2d(&seq, 1, seq.len(), &t.device);
                let l: Vec<f32> = t.model.chunks[0].forward(x).into_data().try_into_vec::<f32>().unwrap();
                let last = &l[l.len() - 2048..];
                let next = (0..2048).fold(0, |best, i| if last[i] > last[best] { i } else { best });
                seq.push(next as i64);
            }
            assert_eq!(&seq[prompt..], &want[..], "{name}: greedy continuation");
        }
    }
}

/// Loaded under FSDP 2 × TP 2 (tied) and PP 2 (untied), training gives the single-rank losses
/// within 1e-5; under FSDP 2 × TP 2 each rank reads about a quarter of the model.
#[test]
fn hf_models_load_under_every_layout() {
    let d = tempfile::tempdir().unwrap();
    let b8 = "--training.global_batch_size 8";
    let fsdp_tp = "--parallelism.data_parallel_shard_degree 2 --parallelism.tensor_parallel_degree 2 --training.local_batch_size 4";
    let pp = "--parallelism.data_parallel_shard_degree 1 --parallelism.pipeline_parallel_degree 2 --training.local_batch_size 8";
    let ep = "--parallelism.data_parallel_shard_degree 2 --parallelism.expert_parallel_degree 2 --training.local_batch_size 4";
    for (i, (name, layout)) in [
        ("tied_bf16", fsdp_tp),
        ("untied_sharded", pp),
        ("qwen3_tied_bf16", fsdp_tp),
        ("qwen3_moe_sharded", fsdp_tp),
        ("qwen3_moe_sharded", pp),
        ("qwen3_moe_sharded", ep),
        ("deepseek_v3_tiny", fsdp_tp),
        ("deepseek_v3_tiny", pp),
        ("deepseek_v3_tiny", ep),
    ]
    .into_iter()
    .enumerate()
    {
        let single = d.path().join(format!("{name}-1"));
        if !single.exists() {
            assert_ok(&run_hf(
                &single,
                &fixture(name),
                &format!("{b8} --parallelism.data_parallel_shard_degree 1 --training.local_batch_size 8"),
                3,
            ));
        }
        let dump = d.path().join(format!("{name}-{i}"));
        let mut args = tiny_args(&dump, 3);
        args.extend(hf_flags(&fixture(name)));
        args.extend(format!("{b8} {layout}").split_whitespace().map(String::from));
        // With the loader's info lines (`titan` runs at RUST_LOG=warn).
        let o = titan_logging(&args.iter().map(String::as_str).collect::<Vec<_>>(), "info");
        assert_ok(&o);
        assert_matches(name, &metric_values(&single), &metric_values(&dump), 1e-5);
        if name == "tied_bf16" {
            let log = String::from_utf8_lossy(&o.stderr);
            let reads: Vec<(f64, f64)> = log
                .lines()
                .filter_map(|l| l.split(": read ").nth(1))
                .map(|r| {
                    let w: Vec<&str> = r.split_whitespace().collect();
                    (w[0].parse().unwrap(), w[3].parse().unwrap())
                })
                .collect();
            assert_eq!(reads.len(), 4, "{log}");
            for (read, total) in reads {
                assert!(read / total < 0.3, "a rank read {read} of {total} values");
            }
        }
    }
}

fn copy_fixture(name: &str, to: &Path, edit: impl Fn(&mut serde_json::Value)) -> PathBuf {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(fixture(name)).unwrap().flatten() {
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
    let p = to.join("config.json");
    let mut c: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    edit(&mut c);
    std::fs::write(&p, c.to_string()).unwrap();
    to.to_path_buf()
}

#[test]
fn bad_hf_inputs_are_clear_errors() {
    let d = tempfile::tempdir().unwrap();
    let case = |n: &str, edit: &dyn Fn(&mut serde_json::Value), needles: &[&str]| {
        let dir = copy_fixture("untied_sharded", &d.path().join(n), edit);
        if n == "missing-shard" {
            std::fs::remove_file(dir.join("model-00002-of-00004.safetensors")).unwrap();
        }
        let o = run_hf(&d.path().join(format!("{n}-dump")), &dir, "", 1);
        assert_clean_error(&o, needles);
    };
    case("missing-shard", &|_| {}, &["model-00002-of-00004.safetensors", "missing"]);
    case("more-layers", &|c| c["num_hidden_layers"] = 3.into(), &["layers.2.", "is missing"]);
    case("fewer-layers", &|c| c["num_hidden_layers"] = 1.into(), &["layers.1.", "matches no parameter"]);
    case("ffn", &|c| c["intermediate_size"] = 128.into(), &["feed_forward.w", "[64, 160]", "[64, 128]"]);
    case("vocab", &|c| c["vocab_size"] = 1000.into(), &["2048 tokens", "vocab_size 1000"]);
    case("bias", &|c| c["attention_bias"] = true.into(), &["config.json", "`attention_bias` = true"]);
    case("rope", &|c| c["rope_scaling"]["rope_type"] = "longrope".into(), &["config.json", "\"longrope\""]);
    case("arch", &|c| c["architectures"] = serde_json::json!(["Qwen2ForCausalLM"]), &["Qwen2ForCausalLM"]);
    // A Qwen3 folder read as Llama: the fix is named.
    let q = fixture("qwen3_tied_bf16");
    let mut args = tiny_args(&d.path().join("family-dump"), 1);
    args.extend(hf_flags(&q).into_iter().map(|f| if f == "qwen3" { "llama3".into() } else { f }));
    assert_clean_error(&run(&args, &[]), &["qwen3 model", "`model.name` = \"llama3\"", "set `model.name` = \"qwen3\""]);
    // Qwen3-MoE: a sliding window and a sparse step it does not implement.
    let moe_case = |n: &str, edit: &dyn Fn(&mut serde_json::Value), needles: &[&str]| {
        let dir = copy_fixture("qwen3_moe_sharded", &d.path().join(n), edit);
        assert_clean_error(&run_hf(&d.path().join(format!("{n}-dump")), &dir, "", 1), needles);
    };
    moe_case("window", &|c| c["use_sliding_window"] = true.into(), &["config.json", "`use_sliding_window` = true"]);
    moe_case("sparse", &|c| c["decoder_sparse_step"] = 2.into(), &["config.json", "`decoder_sparse_step` = 2"]);
    moe_case(
        "experts",
        &|c| c["num_experts"] = 4.into(),
        &["layers.0.moe.router.gate.weight", "[64, 8] there", "needs [64, 4]"],
    );
    // One expert's matrix stored with another shape (its header edited, same bytes).
    let odd = copy_fixture("qwen3_moe_sharded", &d.path().join("odd-expert"), |_: &mut serde_json::Value| {});
    let name = "model.layers.0.mlp.experts.1.gate_proj.weight";
    let shard = std::fs::read_dir(&odd)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.extension().is_some_and(|e| e == "safetensors")
                && std::fs::read(p).unwrap().windows(name.len()).any(|w| w == name.as_bytes())
        })
        .unwrap();
    let mut bytes = std::fs::read(&shard).unwrap();
    let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + len]).unwrap();
    let shape = header[name]["shape"].as_array_mut().unwrap();
    assert_ne!(shape[0], shape[1], "a square matrix would not change");
    shape.reverse();
    let mut text = header.to_string().into_bytes();
    assert!(text.len() <= len);
    text.resize(len, b' ');
    bytes[8..8 + len].copy_from_slice(&text);
    std::fs::write(&shard, bytes).unwrap();
    assert_clean_error(
        &run_hf(&d.path().join("odd-expert-dump"), &odd, "", 1),
        &[name, "experts.0.gate_proj.weight", "same shape"],
    );
    let tied = copy_fixture("tied_bf16", &d.path().join("tied-pp"), |_: &mut serde_json::Value| {});
    let o = run_hf(
        &d.path().join("tied-pp-dump"),
        &tied,
        "--parallelism.data_parallel_shard_degree 1 --parallelism.pipeline_parallel_degree 2",
        1,
    );
    assert_clean_error(&o, &["tie_word_embeddings", "pipeline_parallel_degree"]);
}

fn all_tensors(dir: &Path) -> Vec<(String, Vec<u32>)> {
    let r = FolderReader::open(dir).unwrap();
    r.shapes()
        .into_iter()
        .map(|(k, s)| (k.clone(), r.read(&k, &Region::full(&s)).unwrap().iter().map(|x| x.to_bits()).collect()))
        .collect()
}

/// from-hf → to-hf gives back the same tensors bit for bit (fp32, 4 shards); a titan-rs
/// checkpoint exported with `last_save_in_hf` (bfloat16) and converted back starts training
/// exactly as the checkpoint itself (model only) does.
#[test]
fn conversion_and_export_round_trip() {
    let d = tempfile::tempdir().unwrap();
    let (ck, out) = (d.path().join("ck"), d.path().join("out"));
    let p = |x: &Path| x.to_str().unwrap().to_string();
    assert_ok(&titan(&["convert", "from-hf", &p(&fixture("untied_sharded")), &p(&ck)]));
    assert_ok(&titan(&["convert", "to-hf", &p(&ck), &p(&out), "--max-shard-mb", "1"]));
    assert!(out.join("model.safetensors.index.json").exists());
    assert_eq!(all_tensors(&out), all_tensors(&fixture("untied_sharded")));
    // Qwen3 (bf16 in, fp32 out: the same values) and Qwen3-MoE (one HF matrix per expert): every
    // tensor back, no more, no fewer, and a config transformers reads as the same class.
    for (name, class) in [
        ("qwen3_tied_bf16", "Qwen3ForCausalLM"),
        ("qwen3_moe_sharded", "Qwen3MoeForCausalLM"),
        ("deepseek_v3_tiny", "DeepseekV3ForCausalLM"),
    ] {
        let (ck, out) = (d.path().join(format!("{name}-ck")), d.path().join(format!("{name}-out")));
        assert_ok(&titan(&["convert", "from-hf", &p(&fixture(name)), &p(&ck)]));
        assert_ok(&titan(&["convert", "to-hf", &p(&ck), &p(&out), "--max-shard-mb", "1"]));
        assert_eq!(all_tensors(&out), all_tensors(&fixture(name)), "{name}");
        let c: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
        assert_eq!(c["architectures"][0], class);
        let back = titan_models::hf_config::from_hf_config(&c.to_string()).unwrap();
        let orig = titan_models::hf_config::from_hf_config(
            &std::fs::read_to_string(fixture(name).join("config.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(back, orig, "{name}");
    }

    let trained = d.path().join("trained");
    let o = run_hf(
        &trained,
        &fixture("tied_bf16"),
        "--checkpoint.enable true --checkpoint.last_save_in_hf true --checkpoint.export_dtype bfloat16",
        2,
    );
    assert!(assert_ok(&o).contains("step-2-hf"));
    let hf = trained.join("checkpoint/step-2-hf");
    for f in ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
        assert!(hf.join(f).exists(), "{f}");
    }
    let exported: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(hf.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        (exported["tie_word_embeddings"].as_bool(), exported["rope_parameters"]["rope_type"].as_str()),
        (Some(true), Some("llama3"))
    );
    // The same start from the bf16 export and from the checkpoint rounded to bf16 by hand is
    // what a user gets; here: from the fp32 export vs the checkpoint itself, exactly.
    let fp32 = d.path().join("fp32");
    assert_ok(&titan(&["convert", "to-hf", &p(&trained.join("checkpoint/step-2")), &p(&fp32)]));
    let (a, b) = (d.path().join("from-ckpt"), d.path().join("from-hf"));
    let args = tiny_args(&a, 2).into_iter().chain(hf_flags(&fixture("tied_bf16"))).collect::<Vec<_>>();
    assert_ok(&run(
        &args,
        &[
            "--checkpoint.initial_load_in_hf",
            "false",
            "--checkpoint.initial_load_path",
            &p(&trained.join("checkpoint/step-2")),
        ],
    ));
    assert_ok(&run_hf(&b, &fp32, "", 2));
    assert_eq!(losses(&a), losses(&b));
    // … and through `convert from-hf` into a titan-rs checkpoint again.
    let (back, c) = (d.path().join("back"), d.path().join("from-back"));
    assert_ok(&titan(&["convert", "from-hf", &p(&fp32), &p(&back)]));
    assert_ok(&run(
        &args.iter().map(|x| x.replace(&p(&a), &p(&c))).collect::<Vec<_>>(),
        &["--checkpoint.initial_load_in_hf", "false", "--checkpoint.initial_load_path", &p(&back.join("step-0"))],
    ));
    assert_eq!(losses(&a), losses(&c));
    // generate reads an HF folder; temperature 0 is greedy (the same text twice).
    let g = |seed: &str| {
        assert_ok(&titan(&[
            "generate",
            "--checkpoint",
            &p(&fp32),
            "--prompt",
            "KING",
            "--temperature",
            "0",
            "--max-new-tokens",
            "8",
            "--seed",
            seed,
        ]))
    };
    assert_eq!(g("1"), g("2"));
}
