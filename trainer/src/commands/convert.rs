//! `titan-rs convert from-hf` and `convert to-hf`: offline conversion between a Hugging Face
//! model folder (any registered family) and a titan-rs checkpoint, one tensor in memory at a time.

use crate::config::{to_toml, JobConfig};
use crate::hf::export::{export, ExportOptions};
use crate::hf::HfSource;
use anyhow::{anyhow, Context, Result};
use std::path::{Path, PathBuf};
use titan_checkpoints::sharded::tools::{open_verified, write_source};
use titan_checkpoints::{CheckpointFolder, TensorSource};

/// Writes the HF model in `hf_dir` as the titan-rs checkpoint `out/step-0` (model only: start
/// training from it with `checkpoint.initial_load_path`). Returns the step folder and tensors.
pub fn from_hf(hf_dir: &Path, out: &Path) -> Result<(PathBuf, usize)> {
    let args = crate::hf::folder_args(hf_dir)?;
    let src = HfSource::open(hf_dir)?;
    let n = src.shapes().len();
    let mut cfg = JobConfig::default();
    cfg.model.flavor = "hf".into();
    cfg.model.name = args.family.parse().map_err(|e: String| anyhow!(e))?;
    cfg.model.hf_assets_path = std::fs::canonicalize(hf_dir)?.display().to_string();
    let state = serde_json::json!({
        "step": 0, "optimizer_step": 0, "loader": { "samples_consumed": 0 }, "seed": 0, "flavor": "hf",
    });
    let files = [
        ("train_state.json".to_string(), serde_json::to_vec_pretty(&state)?),
        ("config.toml".to_string(), to_toml(&cfg).into_bytes()),
    ];
    let under = format!("converted from {} ({} layers, dim {})", hf_dir.display(), args.n_layers, args.dim);
    let shown = crate::hf::WithProgress::new(&src, "from-hf");
    let dir = write_source(&CheckpointFolder::new(out), 0, &shown, &files, &under, true)?;
    Ok((dir, n))
}

/// Writes the model of the titan-rs checkpoint `ckpt` (a step folder, or the latest in a folder)
/// as an HF folder `out`. Returns tensors and weight bytes.
pub fn to_hf(ckpt: &Path, out: &Path, o: &ExportOptions) -> Result<(usize, u64)> {
    let reader = crate::checkpoint::open_step(ckpt)?;
    let cfg =
        crate::config::load_config(Some(&reader.path("config.toml")), &[]).context("the checkpoint's config.toml")?;
    let args = cfg.model_args().map_err(|e| anyhow!(e))?;
    let sources = open_verified(reader.dir())?;
    let tokenizer = o.tokenizer.clone().or_else(|| Some(cfg.model.tokenizer_file()).filter(|p| p.exists()));
    let max_position_embeddings = crate::hf::export::max_positions(&cfg);
    let shown = crate::hf::WithProgress::new(sources[0].as_ref(), "to-hf");
    export(
        &shown,
        &args,
        out,
        &ExportOptions { tokenizer, max_position_embeddings, dtype: o.dtype, max_shard_bytes: o.max_shard_bytes },
    )
}
