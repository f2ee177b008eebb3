//! The command line: config printing, errors (never panics), tokenizer training.

mod common;
use common::*;

#[test]
fn config_prints_the_effective_config() {
    let out = assert_ok(&titan(&[
        "config",
        "--config",
        "configs/llama_debug.toml",
        "--training.steps=7",
        "--checkpoint.enable",
        "false",
    ]));
    let v: toml::Table = out.parse().unwrap();
    assert_eq!(v["training"]["steps"].as_integer(), Some(7));
    assert_eq!(v["checkpoint"]["enable"].as_bool(), Some(false));
    assert_eq!(v["model"]["flavor"].as_str(), Some("debugmodel"));
    assert_eq!(v["optimizer"]["eps"].as_float(), Some(1e-8));
}

#[test]
fn unknown_key_in_file_exits_nonzero_with_file_line_and_hint() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("bad.toml");
    std::fs::write(&p, "[training]\nsteps = 3\nlocal_batchsize = 2\n").unwrap();
    let o = titan(&["train", "--config", p.to_str().unwrap()]);
    assert_clean_error(
        &o,
        &["unknown config key `training.local_batchsize`", "bad.toml:3", "training.local_batch_size"],
    );
}

#[test]
fn impossible_expert_parallelism_is_a_clear_error() {
    let ep = ["train", "--config", "configs/llama_debug.toml", "--parallelism.expert_parallel_degree", "2"];
    let o = titan(&[&ep[..], &["--parallelism.data_parallel_shard_degree", "2"]].concat());
    assert_clean_error(&o, &["expert_parallel_degree` = 2 needs a mixture-of-experts model"]);
    let o =
        titan(&[&ep[..], &["--model.flavor", "moe_debug", "--parallelism.data_parallel_shard_degree", "3"]].concat());
    assert_clean_error(&o, &["expert_parallel_degree` = 2 must divide dp_shard·cp·tp = 3"]);
}

/// `titan-rs ptx` compiles through burn's CUDA backend: a build without it says which build has
/// it, and writes nothing.
#[test]
fn ptx_without_cuda_names_the_build_that_has_it() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("ptx");
    let o = titan(&["ptx", "--out", out.to_str().unwrap()]);
    assert_clean_error(&o, &["--features cuda", "scripts/gpu/cuda_llvm.sh"]);
    assert!(!out.exists());
}

#[test]
fn wrong_type_on_the_command_line() {
    let o = titan(&["train", "--config", "configs/llama_debug.toml", "--training.steps", "ten"]);
    assert_clean_error(&o, &["`training.steps` on the command line must be an integer"]);
}

#[test]
fn missing_dataset_and_tokenizer_are_clear_errors() {
    let o = titan(&["train", "--config", "configs/llama_debug.toml", "--training.dataset_path", "/nope/corpus"]);
    assert_clean_error(&o, &["/nope/corpus does not exist"]);
    let o = titan(&["train", "--config", "configs/llama_debug.toml", "--model.tokenizer_path", "/nope/tokenizer.json"]);
    assert_clean_error(&o, &["/nope/tokenizer.json", "tokenizer train"]);
}

#[test]
fn tokenizer_train_command_writes_a_working_tokenizer() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("tok.json");
    assert_ok(&titan(&[
        "tokenizer",
        "train",
        "--input",
        "assets/shakespeare/valid.txt",
        "--vocab-size",
        "512",
        "--out",
        out.to_str().unwrap(),
    ]));
    let tok = titan_data::Tokenizer::from_file(&out).unwrap();
    assert_eq!(tok.vocab_size(), 512);
    let s = "HAMLET:\nTo be, or not to be, that is the question.";
    assert_eq!(tok.decode(&tok.encode(s).unwrap()).unwrap(), s);
}

#[test]
fn shipped_tokenizer_round_trips_the_corpus() {
    let tok = titan_data::Tokenizer::from_file(&repo().join("assets/tokenizer/tokenizer.json")).unwrap();
    assert_eq!(tok.vocab_size(), 2048);
    let text = std::fs::read_to_string(repo().join("assets/shakespeare/valid.txt")).unwrap();
    let sample: String = text.chars().take(20_000).collect();
    let ids = tok.encode(&sample).unwrap();
    assert_eq!(tok.decode(&ids).unwrap(), sample);
    assert!(ids.len() * 2 < sample.len(), "BPE should compress: {} tokens for {} bytes", ids.len(), sample.len());
}

#[test]
fn bench_comm_checks_every_collective_on_four_ranks() {
    // The full sweep, 1 KiB to 64 MiB (9 sizes), every result checked by the binary.
    let out = assert_ok(&titan(&["bench", "comm", "--nproc", "4", "--iters", "1"]));
    for op in ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv", "all_to_all"] {
        let rows = out.lines().filter(|l| l.starts_with(&format!("| {op} |"))).count();
        assert_eq!(rows, 9, "{op} rows (1 KiB..64 MiB):\n{out}");
    }
    assert!(out.contains("every result checked"));
    let o = titan(&["bench", "comm", "--nproc", "1"]);
    assert_clean_error(&o, &["--nproc 1", "at least 2 ranks"]);
}

#[test]
fn injected_faults_end_the_threads_run_with_the_first_error() {
    let o = titan(&["bench", "comm", "--nproc", "3", "--inject-fault", "mismatch"]);
    assert_clean_error(&o, &["collective mismatch", "all_gather(F32 × 4)", "all_reduce(F32 × 4, Sum)"]);
    let o = titan(&["bench", "comm", "--nproc", "3", "--inject-fault", "fail"]);
    assert_clean_error(&o, &["rank 1: injected failure"]);
    let t = std::time::Instant::now();
    let o = titan(&["bench", "comm", "--nproc", "2", "--inject-fault", "hang", "--timeout-seconds", "1"]);
    let err = assert_clean_error(
        &o,
        &["timed out", "waited 1.0s in barrier", "ranks [1] never arrived", "rank 1: no collectives"],
    );
    assert!(t.elapsed().as_secs() < 30, "{err}");
}

#[test]
fn log_rank_must_name_an_existing_rank() {
    let o = titan(&[
        "train",
        "--config",
        "configs/llama_debug.toml",
        "--parallelism.data_parallel_replicate_degree",
        "2",
        "--training.local_batch_size",
        "2",
        "--log-rank",
        "5",
    ]);
    assert_clean_error(&o, &["--log-rank 5: there are only 2 rank(s)"]);
}

#[test]
fn nproc_is_checked_against_the_mesh() {
    let base = ["train", "--config", "configs/llama_debug.toml", "--training.local_batch_size", "2"];
    let with = |extra: &[&str]| titan(&base.iter().chain(extra).copied().collect::<Vec<_>>());
    let o = with(&[
        "--nproc",
        "3",
        "--parallelism.data_parallel_replicate_degree",
        "2",
        "--parallelism.data_parallel_shard_degree",
        "1",
    ]);
    assert_clean_error(&o, &["--nproc 3: invalid parallel dims", "!= world size 3"]);
    let o = with(&["--nproc", "6", "--parallelism.data_parallel_replicate_degree", "4"]);
    assert_clean_error(&o, &["--nproc 6: `parallelism.data_parallel_shard_degree` = -1 needs the world size 6"]);
    // A shard degree of -1 takes the ranks --nproc gives: FSDP over 2 ranks.
    let d = tempfile::tempdir().unwrap();
    let o = run(&tiny_args(d.path(), 1), &["--nproc", "2", "--parallelism.data_parallel_shard_degree", "-1"]);
    assert!(assert_ok(&o).contains("on 2 data-parallel rank(s)"));
}

#[test]
fn bench_train_reports_throughput_and_comm_share_on_a_mesh() {
    let args = "bench train --config configs/llama_debug.toml --model.flavor tiny --training.seq_len 32 \
                --training.local_batch_size 2 --parallelism.data_parallel_shard_degree 2 --warmup 1 --steps 2";
    let out = assert_ok(&titan(&args.split_whitespace().collect::<Vec<_>>()));
    let row = out
        .lines()
        .find(|l| l.starts_with("| tiny | replicate 1 × shard 2 × tp 1 | 2×32 | 2 |"))
        .unwrap_or_else(|| panic!("{out}"));
    let cols: Vec<&str> = row.split('|').map(str::trim).collect();
    let tps: f64 = cols[6].parse().unwrap();
    let shares: Vec<f64> = cols[7].split('/').map(|x| x.trim().trim_end_matches('%').parse().unwrap()).collect();
    let (exposed, hidden) = (shares[0], shares[1]);
    assert!(tps > 0.0 && exposed > 0.0 && exposed < 100.0 && (0.0..100.0).contains(&hidden), "{row}");
}

#[test]
fn a_device_this_build_lacks_is_a_clear_error() {
    let d = tempfile::tempdir().unwrap();
    if !cfg!(feature = "cuda") {
        let o = run(&tiny_args(d.path(), 1), &["--training.device", "cuda"]);
        assert_clean_error(&o, &["`training.device` = \"cuda\"", "--features cuda"]);
    }
    let o = run(&tiny_args(d.path(), 1), &["--training.device", "tpu"]);
    assert_clean_error(&o, &["`training.device`", "\"cpu\""]);
}

/// The 8B flavor on this machine: parameters, gradients and AdamW moments alone need ≈ 120 GiB,
/// so `train` stops within seconds with the breakdown (it used to be OOM-killed); `plan` shows
/// a layout whose per-rank total fits an 80 GiB GPU.
#[test]
fn a_model_that_cannot_fit_is_refused_before_anything_is_allocated() {
    let d = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let o = run(&tiny_args(d.path(), 1), &["--model.flavor", "8B"]);
    let err = assert_clean_error(
        &o,
        &["`model.flavor` = \"8B\" does not fit", "AdamW moments", "`training.memory_check = false`"],
    );
    assert!(started.elapsed().as_secs() < 30, "took {:?}: {err}", started.elapsed());
    let plan = assert_ok(&titan(&[
        "plan",
        "--config",
        "configs/llama_debug.toml",
        "--model.flavor",
        "8B",
        "--parallelism.data_parallel_shard_degree",
        "8",
        "--parallelism.tensor_parallel_degree",
        "2",
    ]));
    let line = plan.lines().find(|l| l.trim_start().starts_with("pp rank 0:")).unwrap_or_else(|| panic!("{plan}"));
    let gib: f64 = line.split_whitespace().nth(3).unwrap().parse().unwrap();
    assert!(gib > 5.0 && gib < 80.0, "{line}");
}

/// The start-up line names every mesh dimension with its degree, from the one resolved mesh
/// (it used to print "replicate 0" for CP 2 × TP 2 × PP 2 and leave CP out).
#[test]
fn start_line_names_every_mesh_dimension() {
    let d = tempfile::tempdir().unwrap();
    let mesh = [
        "--nproc",
        "8",
        "--parallelism.context_parallel_degree",
        "2",
        "--parallelism.tensor_parallel_degree",
        "2",
        "--parallelism.pipeline_parallel_degree",
        "2",
    ];
    let out = assert_ok(&run(&tiny_args(d.path(), 1), &mesh));
    let line = out.lines().find(|l| l.starts_with("training steps")).unwrap_or_else(|| panic!("{out}"));
    assert!(
        line.contains("on 1 data-parallel rank(s); mesh 8 rank(s) = replicate 1 × shard 1 × cp 2 × tp 2 × pp 2 (sequence parallel); pipeline 1F1B"),
        "{line}"
    );
    // Expert parallelism is named with the ranks it borrows.
    let e = tempfile::tempdir().unwrap();
    let moe = [
        "--nproc",
        "2",
        "--model.flavor",
        "moe_debug",
        "--parallelism.data_parallel_shard_degree",
        "2",
        "--parallelism.expert_parallel_degree",
        "2",
    ];
    let out = assert_ok(&run(&tiny_args(e.path(), 1), &moe));
    let line = out.lines().find(|l| l.starts_with("training steps")).unwrap_or_else(|| panic!("{out}"));
    assert!(
        line.contains("mesh 2 rank(s) = replicate 1 × shard 2 × cp 1 × tp 1 × pp 1 (ep 2 over shard × cp × tp)"),
        "{line}"
    );
}

/// A single value for a list key is a one-element list: `--debug.fail_at_steps 1` fails the
/// run at step 1 (it used to be ignored), in a config file too.
#[test]
fn a_scalar_for_a_list_key_takes_effect() {
    let d = tempfile::tempdir().unwrap();
    let o = run(&tiny_args(d.path(), 3), &["--debug.fail_at_steps", "1", "--debug.fail_mode", "error"]);
    assert_clean_error(&o, &["injected failure at step 1 (debug.fail_at_steps, attempt 0)"]);
    let f = d.path().join("job.toml");
    std::fs::write(&f, "[debug]\nfail_at_steps = 2\nfail_mode = \"error\"\n").unwrap();
    let o = run(&tiny_args(d.path(), 3), &["--config", f.to_str().unwrap()]);
    assert_clean_error(&o, &["injected failure at step 2"]);
}
