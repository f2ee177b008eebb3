//! Corpus formats, streaming tokenization and its crash safety, through the library and the
//! binary.

mod common;
use common::*;
use std::io::Write;
use std::path::{Path, PathBuf};
use titan_data::{tokenize_corpus_with, CorpusOptions, TokenFile, Tokenizer};

fn tokenizer() -> Tokenizer {
    Tokenizer::from_file(&repo().join("assets/tokenizer/tokenizer.json")).unwrap()
}

fn ids(f: &TokenFile) -> Vec<i64> {
    f.window(0, f.len()).collect()
}

/// The same documents as `.jsonl`, `.jsonl.gz`, `.jsonl.zst`, one `.txt` per document and a
/// nanoGPT-style `uint16` `.bin` of the expected ids all give the same tokens.
#[test]
fn every_format_gives_the_same_tokens() {
    let d = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(repo().join("assets/shakespeare/valid.txt")).unwrap();
    let docs: Vec<&str> = text.split("\n\n").filter(|s| !s.trim().is_empty()).take(40).collect();
    let jsonl: String = docs.iter().map(|t| serde_json::json!({ "text": t, "id": 1 }).to_string() + "\n").collect();
    let dir = |n: &str| {
        let p = d.path().join(n);
        std::fs::create_dir_all(&p).unwrap();
        p
    };
    std::fs::write(dir("plain").join("a.jsonl"), &jsonl).unwrap();
    let mut gz = flate2::write::GzEncoder::new(std::fs::File::create(dir("gz").join("a.jsonl.gz")).unwrap(), flate2::Compression::default());
    gz.write_all(jsonl.as_bytes()).unwrap();
    gz.finish().unwrap();
    std::fs::write(dir("zst").join("a.jsonl.zst"), zstd::encode_all(jsonl.as_bytes(), 3).unwrap()).unwrap();
    for (i, t) in docs.iter().enumerate() {
        std::fs::write(dir("txt").join(format!("{i:03}.txt")), t).unwrap();
    }
    {
        use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
        let ids: ArrayRef = std::sync::Arc::new(Int64Array::from_iter_values(0..docs.len() as i64));
        let texts: ArrayRef = std::sync::Arc::new(StringArray::from_iter_values(docs.iter()));
        let batch = RecordBatch::try_from_iter([("id", ids), ("text", texts)]).unwrap();
        let f = std::fs::File::create(dir("parquet").join("part-0.parquet")).unwrap();
        let mut w = parquet::arrow::ArrowWriter::try_new(f, batch.schema(), None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    }
    let (tok, cache, o) = (tokenizer(), d.path().join("cache"), CorpusOptions::default());
    let want = ids(&tokenize_corpus_with(&d.path().join("plain"), &tok, &cache, &o).unwrap());
    assert!(want.len() > 1000);
    for n in ["gz", "zst", "txt", "parquet"] {
        assert_eq!(ids(&tokenize_corpus_with(&d.path().join(n), &tok, &cache, &o).unwrap()), want, "{n}");
    }
    let bin: Vec<u8> = want.iter().flat_map(|&x| (x as u16).to_le_bytes()).collect();
    std::fs::write(dir("bin").join("train.bin"), &bin).unwrap();
    assert_eq!(ids(&tokenize_corpus_with(&d.path().join("bin"), &tok, &cache, &o).unwrap()), want, "bin");
    // A glob over two of them concatenates in name order.
    std::fs::copy(d.path().join("gz/a.jsonl.gz"), d.path().join("zst/b.jsonl.gz")).unwrap();
    let both = ids(&tokenize_corpus_with(&d.path().join("zst/*.jsonl.*"), &tok, &cache, &o).unwrap());
    assert_eq!(both, [want.clone(), want.clone()].concat());
    // Parquet errors name the file (and the column).
    let pq = d.path().join("parquet");
    let o3 = CorpusOptions { text_column: "body".into(), ..Default::default() };
    let e = format!("{:#}", tokenize_corpus_with(&pq, &tok, &cache, &o3).err().unwrap());
    assert!(e.contains("part-0.parquet") && e.contains("no column \"body\"") && e.contains("\"text\""), "{e}");
    let mut bytes = std::fs::read(pq.join("part-0.parquet")).unwrap();
    let n = bytes.len();
    bytes.truncate(n / 2);
    std::fs::write(dir("badpq").join("x.parquet"), &bytes).unwrap();
    let e = format!("{:#}", tokenize_corpus_with(&d.path().join("badpq"), &tok, &cache, &o).err().unwrap());
    assert!(e.contains("x.parquet"), "{e}");
    // Another text column is another cache entry.
    let other = jsonl.replace("\"text\"", "\"body\"");
    std::fs::write(dir("body").join("a.jsonl"), other).unwrap();
    let o2 = CorpusOptions { text_column: "body".into(), ..Default::default() };
    assert_eq!(ids(&tokenize_corpus_with(&d.path().join("body"), &tok, &cache, &o2).unwrap()), want);
    let e = format!("{:#}", tokenize_corpus_with(&d.path().join("body"), &tok, &cache, &o).err().unwrap());
    assert!(e.contains("a.jsonl:1") && e.contains("dataset_text_column"), "{e}");
}

/// Training reads a compressed corpus; bad inputs are errors that name the file.
#[test]
fn training_reads_compressed_corpora_and_bad_inputs_name_the_file() {
    let d = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(repo().join("assets/shakespeare/train.txt")).unwrap();
    let jsonl: String = text.split("\n\n").map(|t| serde_json::json!({ "content": t }).to_string() + "\n").collect();
    let zst = d.path().join("corpus.jsonl.zst");
    std::fs::write(&zst, zstd::encode_all(jsonl.as_bytes(), 3).unwrap()).unwrap();
    let z = zst.to_str().unwrap();
    let args = tiny_args(&d.path().join("run"), 3);
    assert_ok(&run(&args, &["--training.dataset_path", z, "--training.dataset_text_column", "content"]));
    let o = run(&args, &["--training.dataset_path", z]);
    assert_clean_error(&o, &["corpus.jsonl.zst:1", "\"text\"", "dataset_text_column"]);
    let mut bytes = std::fs::read(&zst).unwrap();
    let n = bytes.len();
    bytes[n / 2..n / 2 + 64].fill(0x55);
    let bad = d.path().join("bad.jsonl.zst");
    std::fs::write(&bad, &bytes).unwrap();
    let o = run(&args, &["--training.dataset_path", bad.to_str().unwrap(), "--training.dataset_text_column", "content"]);
    assert_clean_error(&o, &["bad.jsonl.zst"]);
    let big = d.path().join("ids.bin");
    std::fs::write(&big, [1u8, 0, 0xff, 0xff]).unwrap();
    let o = run(&args, &["--training.dataset_path", big.to_str().unwrap()]);
    assert_clean_error(&o, &["ids.bin", "65535", "vocabulary size 2048"]);
    let o = run(&args, &["--training.dataset_token_dtype", "int8"]);
    assert_clean_error(&o, &["training.dataset_token_dtype", "uint16"]);
    // Nothing half-cached: every file in the cache is a complete token file.
    let cache = repo().join(&args[args.iter().position(|a| a == "--training.cache_dir").unwrap() + 1]);
    for e in std::fs::read_dir(cache).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".tokens") {
            TokenFile::open(&e.path()).unwrap();
        }
    }
}

fn corpus(dir: &Path, mb: usize) -> PathBuf {
    let text = std::fs::read_to_string(repo().join("assets/shakespeare/train.txt")).unwrap();
    let p = dir.join(format!("big{mb}.txt"));
    let mut f = std::io::BufWriter::new(std::fs::File::create(&p).unwrap());
    let mut n = 0;
    while n < mb << 20 {
        f.write_all(text.as_bytes()).unwrap();
        n += text.len();
    }
    p
}

fn encode(input: &Path, cache: &Path) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_titan-rs"))
        .args(["tokenizer", "encode", input.to_str().unwrap(), "--cache-dir", cache.to_str().unwrap()])
        .current_dir(repo())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

fn peak_mib(out: &str) -> f64 {
    out.split("peak memory ").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap()
}

/// kill -9 in the middle of tokenizing leaves no token file a later run would trust; the rerun
/// writes the same tokens as an uninterrupted run. Memory does not grow with the corpus: 4× the
/// text costs less than 16 MiB more peak memory, and stays under a 160 MiB cap.
#[test]
fn tokenization_streams_in_bounded_memory_and_survives_kill_9() {
    let d = tempfile::tempdir().unwrap();
    let (small, big) = (corpus(d.path(), 8), corpus(d.path(), 32));
    let cache = d.path().join("cache");
    let mut child = encode(&big, &cache);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let names: Vec<String> = std::fs::read_dir(&cache).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    assert!(!names.iter().any(|n| n.ends_with(".tokens")), "a half-written cache would be trusted: {names:?}");
    let rerun = assert_ok(&encode(&big, &cache).wait_with_output().unwrap());
    let clean = assert_ok(&encode(&big, &d.path().join("clean")).wait_with_output().unwrap());
    let file = |out: &str| PathBuf::from(out.split(": ").next().unwrap());
    assert_eq!(std::fs::read(file(&rerun)).unwrap(), std::fs::read(file(&clean)).unwrap());
    let small_out = assert_ok(&encode(&small, &d.path().join("small")).wait_with_output().unwrap());
    let (p8, p32) = (peak_mib(&small_out), peak_mib(&clean));
    eprintln!("peak memory: {p8} MiB for 8 MiB of text, {p32} MiB for 32 MiB");
    assert!(p32 - p8 < 16.0 && p32 < 160.0, "peak {p8} → {p32} MiB");
}

/// `[[training.datasets]]` with weights 3 : 1: after 1 000 samples (one block) exactly 750 and
/// 250 came from each source, reported in `metrics.jsonl`; a resumed run repeats the
/// uninterrupted one bit for bit (the interleave is a function of the sample index and seed).
#[test]
fn mixtures_deal_exact_shares_and_resume_bit_exact() {
    let d = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(repo().join("assets/shakespeare/valid.txt")).unwrap();
    let zst = d.path().join("second.jsonl.zst");
    let jsonl: String = text.split("\n\n").map(|t| serde_json::json!({ "text": t }).to_string() + "\n").collect();
    std::fs::write(&zst, zstd::encode_all(jsonl.as_bytes(), 3).unwrap()).unwrap();
    let mix = format!(r#"[{{path = "assets/shakespeare/train.txt", weight = 3}}, {{path = "{}", weight = 1.0}}]"#, zst.display());
    let dump = d.path().join("mix");
    assert_ok(&run(&tiny_args(&dump, 125), &["--training.datasets", &mix, "--training.local_batch_size", "8"]));
    let last: serde_json::Value =
        serde_json::from_str(std::fs::read_to_string(dump.join("metrics.jsonl")).unwrap().lines().filter(|l| l.contains("\"loss\"")).last().unwrap()).unwrap();
    let by = &last["tokens_by_source"];
    assert_eq!(by["assets/shakespeare/train.txt"].as_u64(), Some(750 * 32), "{last}");
    assert_eq!(by[zst.display().to_string()].as_u64(), Some(250 * 32), "{last}");
    let ck = ["--checkpoint.enable", "true", "--checkpoint.interval", "3", "--training.datasets", &mix];
    let straight = d.path().join("straight");
    assert_ok(&run(&tiny_args(&straight, 6), &ck));
    let resumed = d.path().join("resumed");
    assert_ok(&run(&tiny_args(&resumed, 6), &[&ck[..], &["--debug.stop_at_step", "3"]].concat()));
    assert_ok(&run(&tiny_args(&resumed, 6), &ck));
    assert_eq!(losses(&resumed), losses(&straight));
    let o = run(&tiny_args(&resumed, 1), &["--training.datasets", r#"[{path = "assets/shakespeare/train.txt", weight = 0}]"#]);
    assert_clean_error(&o, &["training.datasets[0].weight"]);
}

/// `model.attn_mask_type = "block_causal"` through the binary: a corpus of short documents
/// (several end-of-text tokens in most 32-token rows) trains the same — within 1e-5 relative —
/// on one rank, FSDP 2 × TP 2 (sequence parallel), and PP 2 (1F1B, 4 microbatches) with full
/// activation checkpointing; RoPE positions restarting per document change only rounding
/// (RoPE scores depend on relative positions); causal masking of the same rows trains
/// differently.
#[test]
fn block_causal_training_matches_across_layouts() {
    let d = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(repo().join("assets/shakespeare/valid.txt")).unwrap();
    let jsonl: String = text
        .split('\n')
        .filter(|l| !l.trim().is_empty())
        .map(|t| serde_json::json!({ "text": t }).to_string() + "\n")
        .collect();
    let corpus = d.path().join("short-docs.jsonl");
    std::fs::write(&corpus, jsonl).unwrap();
    let data = format!("--training.dataset_path {} --training.global_batch_size 8", corpus.display());
    let block = format!("{data} --model.attn_mask_type block_causal");
    let one_rank = "--parallelism.data_parallel_shard_degree 1 --training.local_batch_size 8";
    let one = layout_run(&d.path().join("one"), &format!("{block} {one_rank}"), 3);
    let fsdp_tp = "--parallelism.data_parallel_shard_degree 2 --parallelism.tensor_parallel_degree 2 --training.local_batch_size 4";
    assert_matches("FSDP 2 × TP 2", &one, &layout_run(&d.path().join("fsdp-tp"), &format!("{block} {fsdp_tp}"), 3), 1e-5);
    let pp = "--parallelism.data_parallel_shard_degree 1 --training.local_batch_size 8 --parallelism.pipeline_parallel_degree 2 --parallelism.num_pp_microbatches 4 --parallelism.pipeline_parallel_schedule 1F1B --activation_checkpoint.mode full";
    assert_matches("PP 2 + AC", &one, &layout_run(&d.path().join("pp"), &format!("{block} {pp}"), 3), 1e-5);
    let restart = layout_run(&d.path().join("restart"), &format!("{block} {one_rank} --model.rope_per_document true"), 3);
    assert_matches("RoPE per document", &one, &restart, 1e-5);
    let causal = layout_run(&d.path().join("causal"), &format!("{data} {one_rank}"), 3);
    // At initialisation attention is near uniform, so the loss moves little; the gradients do.
    assert!((causal[0].1 - one[0].1).abs() > 1e-3 * one[0].1, "causal {:?} vs block-causal {:?}", causal[0], one[0]);
    // The key is checked.
    let o = run(&tiny_args(&d.path().join("bad"), 1), &["--model.attn_mask_type", "document"]);
    assert_clean_error(&o, &["model.attn_mask_type", "block_causal"]);
    let o = run(&tiny_args(&d.path().join("bad2"), 1), &["--model.rope_per_document", "true"]);
    assert_clean_error(&o, &["model.rope_per_document", "block_causal"]);
}
