//! Helpers shared by the integration tests: run the real `titan-rs` binary.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub fn titan(args: &[&str]) -> Output {
    titan_logging(args, "warn")
}

/// Runs `titan-rs` from the repository with `RUST_LOG` = `level`.
pub fn titan_logging(args: &[&str], level: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_titan-rs"))
        .args(args)
        .current_dir(repo())
        .env("RUST_LOG", level)
        .env(AUTOTUNE.0, AUTOTUNE.1)
        .output()
        .expect("run titan-rs")
}

/// CubeCL's autotune level for the runs on Mesa's software adapter: `minimal` times the fewest
/// kernel candidates (a cold tiny wgpu run measured 41 s at the default level, 19 s at minimal).
/// Every candidate computes the same result; the tests check results, not which kernel is fastest.
pub const AUTOTUNE: (&str, &str) = ("CUBECL_AUTOTUNE_LEVEL", "minimal");

pub fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// Asserts a failed run: non-zero exit, no panic, stderr containing every needle.
pub fn assert_clean_error(o: &Output, needles: &[&str]) -> String {
    let (out, err) = text(o);
    assert!(!o.status.success(), "expected failure\nstdout:\n{out}\nstderr:\n{err}");
    assert!(!err.contains("panicked") && !err.contains("RUST_BACKTRACE"), "panic instead of an error:\n{err}");
    for n in needles {
        assert!(err.contains(n), "stderr lacks {n:?}:\n{err}");
    }
    err
}

pub fn assert_ok(o: &Output) -> String {
    let (out, err) = text(o);
    assert!(o.status.success(), "titan-rs failed ({})\nstdout:\n{out}\nstderr:\n{err}", o.status);
    out
}

/// A tiny, fast training job (flavor `tiny`, 4×32 tokens per step) writing to `dump`.
pub fn tiny_args(dump: &Path, steps: u32) -> Vec<String> {
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("token-cache");
    [
        "train",
        "--config",
        "configs/llama_debug.toml",
        "--model.flavor",
        "tiny",
        "--training.seq_len",
        "32",
        "--training.local_batch_size",
        "4",
        "--lr_scheduler.warmup_steps",
        "3",
        "--optimizer.lr",
        "3e-3",
        "--metrics.log_freq",
        "1",
        "--validation.enable",
        "false",
        "--checkpoint.enable",
        "false",
        "--metrics.save_loss_curve",
        "false",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([
        "--training.steps".into(),
        steps.to_string(),
        "--job.dump_folder".into(),
        dump.display().to_string(),
        "--training.cache_dir".into(),
        cache.display().to_string(),
    ])
    .collect()
}

pub fn run(args: &[String], extra: &[&str]) -> Output {
    let mut all: Vec<&str> = args.iter().map(String::as_str).collect();
    all.extend_from_slice(extra);
    titan(&all)
}

/// `(step, loss, grad_norm)` of every training line in `metrics.jsonl`, as the exact JSON text
/// of the numbers (equal text = equal f64 bits).
pub fn losses(dump: &Path) -> Vec<(u64, String, String)> {
    metric_lines(dump)
        .into_iter()
        .map(|v| (v["step"].as_u64().unwrap(), v["loss"].to_string(), v["grad_norm"].to_string()))
        .collect()
}

/// Every training line of `metrics.jsonl` (those with a loss), parsed.
pub fn metric_lines(dump: &Path) -> Vec<serde_json::Value> {
    let body = std::fs::read_to_string(dump.join("metrics.jsonl")).expect("metrics.jsonl");
    body.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()).filter(|v| v.get("loss").is_some()).collect()
}

/// (loss, grad norm) per step from `metrics.jsonl`.
pub fn metric_values(dump: &Path) -> Vec<(f64, f64)> {
    losses(dump).into_iter().map(|(_, l, g)| (l.parse().unwrap(), g.parse().unwrap())).collect()
}

/// Asserts per-step loss and grad norm within `tol` relative of the reference.
pub fn assert_matches(name: &str, want: &[(f64, f64)], got: &[(f64, f64)], tol: f64) {
    assert_eq!(got.len(), want.len(), "{name}: steps");
    for (step, ((l1, g1), (l2, g2))) in want.iter().zip(got).enumerate() {
        assert!((l1 - l2).abs() <= tol * l1.abs(), "{name} step {}: loss {l2} vs {l1}", step + 1);
        assert!((g1 - g2).abs() <= tol * g1.abs(), "{name} step {}: grad norm {g2} vs {g1}", step + 1);
    }
}

/// Runs the tiny job (global batch 8) with `extra` flags; returns (loss, grad norm) per step.
pub fn layout_run(dump: &Path, extra: &str, steps: u32) -> Vec<(f64, f64)> {
    let extra: Vec<&str> = extra.split_whitespace().collect();
    assert_ok(&run(&tiny_args(dump, steps), &extra));
    metric_values(dump)
}

/// Copies the folder `from` (recursively) to `to`.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            copy_dir(&p, &to.join(e.file_name()));
        } else {
            std::fs::copy(&p, to.join(e.file_name())).unwrap();
        }
    }
}
