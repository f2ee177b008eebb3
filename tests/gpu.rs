//! Training on burn's wgpu backend with the CubeCL kernels (on CPU-only machines: Mesa's
//! software Vulkan adapter, so shapes stay tiny). Built with `--features wgpu`.

mod common;
use common::*;

/// The tiny model's steps on the wgpu CPU adapter — fused RMSNorm, SwiGLU, RoPE, attention and
/// cross-entropy kernels — give the flex run's losses and gradient norms. Tolerance 1e-5
/// relative: the kernels sum in other orders and llvmpipe's `exp` differs from Rust's in the
/// last bits; measured ≤ 6e-7 over the three steps. With `activation_checkpoint.mode = "full"`
/// the adapter's steps are unchanged bit for bit.
#[test]
fn training_on_the_wgpu_adapter_matches_the_cpu_run() {
    let d = tempfile::tempdir().unwrap();
    // Attention pinned to the fused kernel: `auto` measures per process, and this test compares
    // two GPU processes bit for bit.
    let flags = "--training.global_batch_size 4 --parallelism.data_parallel_shard_degree 1 --model.attention fused";
    let cpu = layout_run(&d.path().join("cpu"), flags, 3);
    let gpu = layout_run(&d.path().join("wgpu"), &format!("{flags} --training.device wgpu"), 3);
    assert_matches("wgpu vs cpu", &cpu, &gpu, 1e-5);
    let reference = layout_run(
        &d.path().join("wgpu-reference"),
        &format!("{flags} --training.device wgpu --model.kernels reference --model.attention reference"),
        3,
    );
    assert_matches("wgpu composed ops vs cpu", &cpu, &reference, 1e-5);
    // Activation checkpointing on the adapter: the recompute runs the same kernels on the same
    // values, so the steps equal the run without it.
    let ac = layout_run(&d.path().join("wgpu-ac"), &format!("{flags} --training.device wgpu --activation_checkpoint.mode full"), 3);
    assert_eq!(ac, gpu, "wgpu: activation checkpointing changed the steps");
}

/// Muon on the adapter (Newton–Schulz on the device's matmul; under FSDP 2 × TP 2 the owners'
/// matrices staged through host memory) follows the one-rank CPU run within 1e-5.
#[test]
fn muon_on_the_wgpu_adapter_matches_the_cpu_run() {
    let d = tempfile::tempdir().unwrap();
    let muon = "--optimizer.name Muon --optimizer.lr 0.02 --training.global_batch_size 8 --model.attention fused";
    let cpu = layout_run(&d.path().join("cpu"), &format!("{muon} --parallelism.data_parallel_shard_degree 1 --training.local_batch_size 8"), 3);
    let mesh = "--parallelism.data_parallel_shard_degree 2 --parallelism.tensor_parallel_degree 2 --training.local_batch_size 4";
    for (name, flags) in [("one wgpu rank", "--parallelism.data_parallel_shard_degree 1 --training.local_batch_size 8"), ("wgpu FSDP 2 × TP 2", mesh)] {
        let dump = d.path().join(name.replace([' ', '×'], "_"));
        assert_matches(name, &cpu, &layout_run(&dump, &format!("{muon} {flags} --training.device wgpu"), 3), 1e-5);
    }
}

/// A mixture-of-experts model on the adapter (the grouped expert GEMM's CubeCL kernels, forward
/// and backward) follows the CPU run.
#[test]
fn moe_training_on_the_wgpu_adapter_matches_the_cpu_run() {
    let d = tempfile::tempdir().unwrap();
    let flags = "--model.flavor moe_debug --training.global_batch_size 4 --parallelism.data_parallel_shard_degree 1 --model.attention fused";
    let cpu = layout_run(&d.path().join("cpu"), flags, 2);
    let gpu = layout_run(&d.path().join("wgpu"), &format!("{flags} --training.device wgpu"), 2);
    assert_matches("moe_debug wgpu vs cpu", &cpu, &gpu, 1e-5);
}

/// Qwen3 (QK-norm: the fused RMSNorm kernel over each head; heads wider than dim / heads),
/// Qwen3-MoE and DeepSeek-V3 (latent attention, group-limited routing) on the adapter follow the
/// CPU run within 1e-5; Qwen3 under FSDP 2 × TP 2 on GPU ranks (the QK-norm gradients summed
/// over TP) equals one GPU rank. Qwen3-MoE runs with `model.attention = "auto"` on the adapter:
/// the grouped expert GEMM (and attention) are chosen by measurement, logged, and the run still
/// follows the CPU's.
#[test]
fn other_families_on_the_wgpu_adapter_match_the_cpu_run() {
    let d = tempfile::tempdir().unwrap();
    let base = "--training.global_batch_size 4";
    let mut one_gpu = Vec::new();
    for (family, flavor) in [("qwen3", "tiny"), ("qwen3", "tiny_moe"), ("deepseek_v3", "tiny")] {
        let flags =
            format!("{base} --model.name {family} --model.flavor {flavor} --parallelism.data_parallel_shard_degree 1");
        let cpu = layout_run(&d.path().join(format!("{family}-{flavor}-cpu")), &format!("{flags} --model.attention fused"), 2);
        let dump = d.path().join(format!("{family}-{flavor}-wgpu"));
        let gpu = if flavor == "tiny_moe" {
            let extra = format!("{flags} --model.attention auto --training.device wgpu");
            let mut args = tiny_args(&dump, 2);
            args.extend(extra.split_whitespace().map(String::from));
            let o = titan_logging(&args.iter().map(String::as_str).collect::<Vec<_>>(), "info");
            assert_ok(&o);
            let log = String::from_utf8_lossy(&o.stderr);
            assert!(log.contains("kernel choice: grouped expert GEMM"), "{log}");
            metric_values(&dump)
        } else {
            layout_run(&dump, &format!("{flags} --model.attention fused --training.device wgpu"), 2)
        };
        assert_matches(&format!("{family} {flavor} wgpu vs cpu"), &cpu, &gpu, 1e-5);
        if (family, flavor) == ("qwen3", "tiny") {
            one_gpu = gpu;
        }
    }
    let mesh = format!(
        "{base} --model.attention fused --model.name qwen3 --model.flavor tiny --training.device wgpu --nproc 4 --parallelism.data_parallel_shard_degree 2 \
         --parallelism.tensor_parallel_degree 2 --training.local_batch_size 2"
    );
    assert_matches("qwen3 wgpu FSDP 2 × TP 2", &one_gpu, &layout_run(&d.path().join("mesh"), &mesh, 2), 1e-5);
}

/// The mesh on GPU ranks — several ranks as threads sharing the software adapter, their
/// collectives staged through host memory — equals one GPU rank: DDP 2 (gradients all-reduced in
/// buckets as backward produces them), TP 2 without sequence parallelism, PP 2 × FSDP 2 × TP 2
/// (pipeline sends, FSDP's gathers and reduce-scatters, TP with SP in one job), HSDP 2 × 2 and
/// CP 2 (ring and all-gather; used to be refused on GPU devices). FSDP 2 × TP 2 on GPU ranks is
/// also checked by the Muon, Qwen3 and checkpoint tests; each layout alone is checked on the CPU
/// (tests/train.rs, pipeline.rs, context_parallel.rs). Tolerance 1e-5 relative, as the same
/// layouts on the CPU (sums in another order). These layouts used to panic ("Backend not
/// supported for custom op 'dist_collective'").
#[test]
fn parallel_layouts_on_the_wgpu_adapter_equal_one_gpu_rank() {
    let d = tempfile::tempdir().unwrap();
    let base = "--training.global_batch_size 4 --training.device wgpu --model.attention fused";
    let one = layout_run(&d.path().join("one"), &format!("{base} --parallelism.data_parallel_shard_degree 1"), 2);
    let half = "--training.local_batch_size 2";
    for (name, flags) in [
        ("DDP 2", format!("--nproc 2 --parallelism.data_parallel_replicate_degree 2 --parallelism.data_parallel_shard_degree 1 {half}")),
        (
            "TP 2 without SP",
            "--nproc 2 --parallelism.data_parallel_shard_degree 1 --parallelism.tensor_parallel_degree 2 --parallelism.enable_sequence_parallel false".to_string(),
        ),
        (
            "PP 2 x FSDP 2 x TP 2",
            format!("--nproc 8 --parallelism.data_parallel_shard_degree 2 --parallelism.pipeline_parallel_degree 2 --parallelism.tensor_parallel_degree 2 {half}"),
        ),
        (
            "HSDP 2x2",
            "--nproc 4 --parallelism.data_parallel_replicate_degree 2 --parallelism.data_parallel_shard_degree 2 --training.local_batch_size 1".to_string(),
        ),
        ("CP 2 ring", "--nproc 2 --parallelism.data_parallel_shard_degree 1 --parallelism.context_parallel_degree 2".to_string()),
        (
            "CP 2 all-gather",
            "--nproc 2 --parallelism.data_parallel_shard_degree 1 --parallelism.context_parallel_degree 2 --parallelism.context_parallel_rotate_method allgather".to_string(),
        ),
    ] {
        let got = layout_run(&d.path().join(name.replace(' ', "_")), &format!("{base} {flags}"), 2);
        assert_matches(&format!("{name} on wgpu vs one wgpu rank"), &one, &got, 1e-5);
    }
}

/// Expert parallelism on the wgpu adapter (the token all-to-all staged through host memory):
/// Qwen3's `tiny_moe` (8 experts, top 2) under EP 2 and EP 2 × TP 2 equals one wgpu rank per
/// step (1e-5 relative, as on the CPU, where `tests/moe.rs` runs the larger `moe_debug`). It
/// used to be refused on GPU devices.
#[test]
fn expert_parallel_on_the_wgpu_adapter_equals_one_gpu_rank() {
    let d = tempfile::tempdir().unwrap();
    let base = "--model.name qwen3 --model.flavor tiny_moe --training.device wgpu --model.attention fused";
    let one = layout_run(&d.path().join("one"), &format!("{base} --parallelism.data_parallel_shard_degree 1 --training.local_batch_size 4"), 2);
    for (name, flags) in [
        ("EP 2", "--nproc 2 --parallelism.data_parallel_shard_degree 2 --parallelism.expert_parallel_degree 2 --training.local_batch_size 2"),
        (
            "EP 2 x TP 2",
            "--nproc 4 --parallelism.data_parallel_shard_degree 2 --parallelism.tensor_parallel_degree 2 --parallelism.expert_parallel_degree 2 --training.local_batch_size 2",
        ),
    ] {
        let got = layout_run(&d.path().join(name.replace(' ', "_")), &format!("{base} {flags}"), 2);
        assert_matches(&format!("{name} on wgpu vs one wgpu rank"), &one, &got, 1e-5);
    }
}

#[test]
fn a_missing_adapter_is_a_clear_error_listing_what_exists() {
    let d = tempfile::tempdir().unwrap();
    let o = run(&tiny_args(d.path(), 1), &["--training.device", "vulkan", "--training.device_index", "3"]);
    assert_clean_error(&o, &["`training.device_index` = 3", "adapters found"]);
}

/// float16 compute on the wgpu adapter tracks float32 (2e-3 relative: 11 bits of mantissa and
/// AdamW over the steps; measured 2.4e-4). bfloat16: Mesa's software adapter has no bfloat16 arithmetic, so it is
/// a clear error there; where an adapter has it, it must track float32 too.
#[test]
fn half_precision_on_the_wgpu_adapter() {
    let d = tempfile::tempdir().unwrap();
    let flags = "--training.global_batch_size 4 --parallelism.data_parallel_shard_degree 1 --training.device wgpu --model.attention fused";
    let f32_run = layout_run(&d.path().join("f32"), flags, 3);
    let f16 = layout_run(&d.path().join("f16"), &format!("{flags} --training.mixed_precision_param float16"), 3);
    assert_matches("float16 vs float32 on wgpu", &f32_run, &f16, 2e-3);
    let dump = d.path().join("bf16");
    let o = run(
        &tiny_args(&dump, 3),
        &[&flags.split(' ').collect::<Vec<_>>()[..], &["--training.mixed_precision_param", "bfloat16"]].concat(),
    );
    if o.status.success() {
        assert_matches("bfloat16 vs float32 on wgpu", &f32_run, &metric_values(&dump), 1e-2);
    } else {
        assert_clean_error(&o, &["`training.mixed_precision_param` = \"bfloat16\"", "\"float16\""]);
    }
}

/// `titan-rs bench kernels` checks and times every kernel on the device: fifteen rows (the row reductions in both variants), each within
/// float32 tolerance of its reference (the timings are printed, not asserted).
#[test]
fn bench_kernels_checks_every_kernel_on_the_device() {
    let args = "bench kernels --config configs/llama_debug.toml --model.flavor tiny --training.device wgpu \
                --training.local_batch_size 2 --training.seq_len 16 --iters 1";
    let out = assert_ok(&titan(&args.split_whitespace().collect::<Vec<_>>()));
    let rows: Vec<&str> = out.lines().filter(|l| l.starts_with("| ") && !l.starts_with("| kernel")).collect();
    let names: Vec<&str> = rows.iter().map(|r| r.split('|').nth(1).unwrap().trim()).collect();
    let want = [
        "rms_norm",
        "silu_mul",
        "rope",
        "attention fwd",
        "attention fwd+bwd",
        "block-causal attention fwd+bwd",
        "linear fwd+bwd",
        "grouped expert GEMM fwd+bwd",
        "cross_entropy",
        "rms_norm fwd+bwd",
        "rms_norm, one thread per row",
        "rms_norm fwd+bwd, one thread per row",
        "cross_entropy, one thread per row",
        "adamw",
        "sum of squares",
    ];
    assert_eq!(names, want, "{out}");
    for r in rows {
        let err: f64 = r.split('|').nth(3).unwrap().trim().parse().unwrap();
        assert!(err <= 1e-5, "{r}");
    }
}

/// The fit check on a GPU device: `1B` (50 GiB planned at seq_len 2048) with 30 GiB of device memory (stated with
/// `training.device_memory_gib`, as the software adapter has no driver to ask) is refused
/// before anything is allocated, naming the device, where the number came from and the levers.
#[test]
fn a_model_too_large_for_the_gpu_is_refused_before_allocating() {
    let t = std::time::Instant::now();
    let o = titan(&[
        "train", "--config", "configs/llama_debug.toml", "--model.flavor", "1B", "--training.device", "wgpu",
        "--training.device_memory_gib", "30", "--training.seq_len", "2048",
    ]);
    assert_clean_error(&o, &["does not fit", "each rank's wgpu device", "`training.device_memory_gib`", "activation_checkpoint.mode", "training.memory_check = false"]);
    assert!(t.elapsed().as_secs() < 30, "took {:?}", t.elapsed());
}

/// Nothing parameter-sized crosses between host and GPU in a training step: `bench train --json`
/// counts every titan-rs transfer. For `tiny` (21 parameter tensors, ≈ 170 k parameters) on one
/// wgpu rank a step reads back the loss and one squared norm per parameter (4 B each) and writes
/// the batch's input and target ids; the RoPE tables are built once, not per step. The attention
/// kernel is chosen by measurement here (`model.attention = "auto"`), and its measuring runs stay
/// outside the counted steps.
#[test]
fn a_gpu_training_step_moves_only_scalars_and_the_batch() {
    let d = tempfile::tempdir().unwrap();
    let json = d.path().join("bench.json");
    let args = format!(
        "bench train --config configs/llama_debug.toml --model.flavor tiny --training.device wgpu \
         --training.seq_len 32 --training.local_batch_size 2 --warmup 1 --steps 2 --json {}",
        json.display()
    );
    // The choice is logged at info.
    let o = titan_logging(&args.split_whitespace().collect::<Vec<_>>(), "info");
    assert_ok(&o);
    // `model.attention = "auto"` (the default; the other tests here pin "fused"): the attention
    // kernel was chosen by measuring both on the adapter.
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(log.contains("kernel choice: causal attention") && log.contains("titan-rs fused"), "{log}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let (to_host, to_device) =
        (v["device_to_host_bytes_per_step"].as_u64().unwrap(), v["host_to_device_bytes_per_step"].as_u64().unwrap());
    let params = 21;
    assert!(to_host > 0 && to_host <= 4 * (params + 1), "{to_host} B read back per step: {v}");
    // Inputs and targets: 2 × 32 ids each, at most 8 bytes an id.
    let batch = 2 * 2 * 32 * 8;
    assert!(to_device > 0 && to_device <= batch, "{to_device} B written per step: {v}");
}

/// Checkpoints cross between GPU and CPU layouts: an FSDP 2 × TP 2 checkpoint written by four
/// wgpu ranks resumes on one CPU rank, and a one-rank CPU checkpoint resumes as FSDP 2 × TP 2 on
/// wgpu ranks; both end within 1e-5 relative of the uninterrupted CPU run (the GPU kernels sum in
/// other orders).
#[test]
fn gpu_and_cpu_checkpoints_resume_on_each_other() {
    let d = tempfile::tempdir().unwrap();
    let base = "--training.global_batch_size 4 --checkpoint.enable true --checkpoint.interval 2";
    let cpu_one = "--parallelism.data_parallel_shard_degree 1";
    let gpu_2x2 = "--training.device wgpu --model.attention fused --nproc 4 --parallelism.data_parallel_shard_degree 2 --parallelism.tensor_parallel_degree 2 --training.local_batch_size 2";
    let straight = layout_run(&d.path().join("straight"), &format!("{base} {cpu_one}"), 4);
    for (name, save, resume) in [("wgpu 2x2 -> cpu 1", gpu_2x2, cpu_one), ("cpu 1 -> wgpu 2x2", cpu_one, gpu_2x2)] {
        let dump = d.path().join(name.replace(' ', "_").replace('>', ""));
        layout_run(&dump, &format!("{base} {save} --debug.stop_at_step 2"), 4);
        assert!(dump.join("checkpoint/step-2").is_dir(), "{name}: no step-2 checkpoint");
        let resumed = layout_run(&dump, &format!("{base} {resume}"), 4);
        // metrics.jsonl holds steps 1–2 of the first run, then 3–4 of the resumed one.
        assert_matches(name, &straight, &resumed, 1e-5);
    }
}

/// float16's dynamic loss scaling: a step whose loss and gradients are not finite (injected at
/// step 2) is skipped — logged, `skipped` in metrics.jsonl, the scale halved from 65536 to 32768 —
/// and training goes on with finite steps; without loss scaling the same step stops the run.
#[test]
fn float16_loss_scaling_skips_an_overflowing_step_and_recovers() {
    let d = tempfile::tempdir().unwrap();
    let flags = [
        "--training.device", "wgpu", "--model.attention", "fused", "--training.global_batch_size", "4",
        "--parallelism.data_parallel_shard_degree", "1", "--training.mixed_precision_param", "float16", "--debug.inject_nonfinite_at_step", "2",
    ];
    let dump = d.path().join("scaled");
    let o = run(&tiny_args(&dump, 4), &flags);
    let out = assert_ok(&o);
    assert!(String::from_utf8_lossy(&o.stderr).contains("step skipped"), "{out}");
    let lines = metric_lines(&dump);
    let col = |k: &str| lines.iter().map(|v| v[k].clone()).collect::<Vec<_>>();
    assert_eq!(col("skipped"), [false, true, false, false].map(serde_json::Value::from).to_vec());
    assert_eq!(col("loss_scale"), [65536.0, 65536.0, 32768.0, 32768.0].map(serde_json::Value::from).to_vec());
    for v in [&lines[2], &lines[3]] {
        assert!(v["loss"].as_f64().is_some_and(f64::is_finite) && v["grad_norm"].as_f64().is_some_and(f64::is_finite), "{v}");
    }
    let o = run(&tiny_args(&d.path().join("unscaled"), 4), &[&flags[..], &["--training.loss_scale", "none"]].concat());
    assert_clean_error(&o, &["step 2", "training stopped"]);
}

/// `bench comm --training.device wgpu`: every collective on device buffers staged through host
/// memory, each result checked after the round trip, with the share of the time spent copying.
#[test]
fn bench_comm_stages_device_buffers_and_reports_the_copy_share() {
    let out = assert_ok(&titan(&["bench", "comm", "--nproc", "2", "--training.device", "wgpu", "--max-mib", "1", "--iters", "1"]));
    assert!(out.contains("wgpu tensors staged through host memory, every result checked"), "{out}");
    for op in ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv", "all_to_all"] {
        let rows: Vec<&str> = out.lines().filter(|l| l.starts_with(&format!("| {op} |"))).collect();
        assert_eq!(rows.len(), 6, "{op}:\n{out}");
        for r in rows {
            let share: f64 = r.split('|').nth(6).unwrap().trim().trim_end_matches(" %").parse().unwrap();
            assert!((0.0..=100.0).contains(&share), "{r}");
        }
    }
}
