//! A titan-rs model written as a Hugging Face folder: `config.json`, `generation_config.json`,
//! safetensors shards (+ `model.safetensors.index.json` when there is more than one, as
//! transformers writes them), the tokenizer. Streamed: one tensor in memory at a time; the
//! folder appears complete or not at all.

use super::transpose;
use crate::config::ExportDtype;
use anyhow::{anyhow, bail, Context, Result};
use safetensors::Dtype;
use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use titan_checkpoints::sharded::tools::{stream_safetensors, LazyTensor};
use titan_checkpoints::{Region, TensorSource};
use titan_models::hf_config::to_hf_config;
use titan_models::{registry, HfTensor, ModelArgs};

pub struct ExportOptions {
    /// The weights' type (`checkpoint.export_dtype`).
    pub dtype: ExportDtype,
    /// Shards are cut above this size (transformers' default: 5 GB).
    pub max_shard_bytes: u64,
    /// A `tokenizer.json` to ship with the weights.
    pub tokenizer: Option<PathBuf>,
    pub max_position_embeddings: usize,
}

impl Default for ExportOptions {
    fn default() -> Self {
        Self {
            dtype: ExportDtype::Float32,
            max_shard_bytes: 5_000_000_000,
            tokenizer: None,
            max_position_embeddings: 8192,
        }
    }
}

fn encode(v: &[f32], dtype: Dtype) -> Vec<u8> {
    match dtype {
        Dtype::BF16 => v.iter().flat_map(|x| half::bf16::from_f32(*x).to_le_bytes()).collect(),
        _ => bytemuck::cast_slice(v).to_vec(),
    }
}

/// Writes the model tensors of `src` (titan-rs names; optimizer state is skipped) as an HF
/// folder at `out`. Returns the tensors and bytes of weights written.
pub fn export(src: &dyn TensorSource, args: &ModelArgs, out: &Path, o: &ExportOptions) -> Result<(usize, u64)> {
    let dtype = match o.dtype {
        ExportDtype::Float32 => Dtype::F32,
        ExportDtype::BFloat16 => Dtype::BF16,
    };
    let family = registry::of(args);
    (family.exportable)(args)
        .map_err(|why| anyhow!("{}: cannot write it in Hugging Face format: {why}", src.describe()))?;
    let mut tensors = Vec::new();
    for (key, shape) in src.shapes().into_iter().filter(|(k, _)| !crate::optim::is_state_key(k)) {
        let hf = (family.hf_tensor)(args, &key).ok_or_else(|| {
            anyhow!("{}: tensor {key} has no Hugging Face name in the {} family", src.describe(), family.name)
        })?;
        match hf {
            HfTensor::One { name, transposed: t } => {
                let hf_shape: Vec<usize> = if t { shape.iter().rev().copied().collect() } else { shape.clone() };
                let full = Region::full(&shape);
                let bytes = Box::new(move || {
                    let v = src.read(&key, &full)?;
                    Ok(encode(&if t { transpose(&v, shape[0], shape[1]) } else { v }, dtype))
                });
                tensors.push(LazyTensor { name, dtype, shape: hf_shape, bytes });
            }
            // Rows in the HF order: HF row `perm[j]` is titan-rs output `j`.
            HfTensor::Permuted { name, perm } => {
                let (i, o) = (shape[0], shape[1]);
                let full = Region::full(&shape);
                let bytes = Box::new(move || {
                    let v = src.read(&key, &full)?;
                    let mut hf = vec![0f32; i * o];
                    for (j, &r) in perm.iter().enumerate() {
                        for k in 0..i {
                            hf[r * i + k] = v[k * o + j];
                        }
                    }
                    Ok(encode(&hf, dtype))
                });
                tensors.push(LazyTensor { name, dtype, shape: vec![o, i], bytes });
            }
            // One `[out, in]` matrix per expert of the stacked `[E, in, out]`.
            HfTensor::PerExpert { names } => {
                let [_, i, o] = shape[..] else {
                    bail!("{}: {key} has shape {shape:?}, not [experts, in, out]", src.describe())
                };
                for (e, name) in names.into_iter().enumerate() {
                    let key = key.clone();
                    let bytes = Box::new(move || {
                        let v = src.read(&key, &Region { offsets: vec![e, 0, 0], lengths: vec![1, i, o] })?;
                        Ok(encode(&transpose(&v, i, o), dtype))
                    });
                    tensors.push(LazyTensor { name, dtype, shape: vec![o, i], bytes });
                }
            }
            // Not in the format: only a zero value can be left out without changing the model.
            HfTensor::Absent => {
                if src.read(&key, &Region::full(&shape))?.iter().any(|&x| x != 0.0) {
                    bail!(
                        "{}: {key} is not zero, and the {} Hugging Face format has no place for it (the MoE balancing bias routes tokens differently); train with `model.moe_load_balance_coeff` = 0 to export",
                        src.describe(),
                        family.name
                    );
                }
            }
        }
    }
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    // Greedy shards in name order, as transformers cuts them.
    let size = |t: &LazyTensor| (t.shape.iter().product::<usize>() * dtype.size()) as u64;
    let mut shards: Vec<Vec<LazyTensor>> = vec![Vec::new()];
    let mut in_shard = 0u64;
    for t in tensors {
        if in_shard > 0 && in_shard + size(&t) > o.max_shard_bytes {
            shards.push(Vec::new());
            in_shard = 0;
        }
        in_shard += size(&t);
        shards.last_mut().expect("a shard").push(t);
    }
    let tmp = out.with_file_name(format!(".{}.partial", out.file_name().and_then(|n| n.to_str()).unwrap_or("hf")));
    if tmp.exists() {
        fs::remove_dir_all(&tmp)?;
    }
    fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let n = shards.len();
    let (mut weight_map, mut total, mut count) = (BTreeMap::new(), 0u64, 0usize);
    for (i, shard) in shards.iter().enumerate() {
        let file =
            if n == 1 { "model.safetensors".to_string() } else { format!("model-{:05}-of-{n:05}.safetensors", i + 1) };
        let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
        stream_safetensors(&tmp.join(&file), shard, Some(meta))?;
        for t in shard {
            total += size(t);
            count += 1;
            weight_map.insert(t.name.clone(), file.clone());
        }
    }
    let json = |v: serde_json::Value| serde_json::to_vec_pretty(&v).expect("JSON");
    if n > 1 {
        let index = serde_json::json!({ "metadata": { "total_size": total }, "weight_map": weight_map });
        fs::write(tmp.join("model.safetensors.index.json"), json(index))?;
    }
    fs::write(tmp.join("config.json"), json(to_hf_config(args, o.max_position_embeddings, o.dtype.as_str())))?;
    fs::write(tmp.join("generation_config.json"), json(serde_json::json!({ "_from_model_config": true })))?;
    if let Some(tok) = &o.tokenizer {
        fs::copy(tok, tmp.join("tokenizer.json")).with_context(|| format!("copying {}", tok.display()))?;
        let cfg = serde_json::json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": o.max_position_embeddings,
            "clean_up_tokenization_spaces": false,
        });
        fs::write(tmp.join("tokenizer_config.json"), json(cfg))?;
    }
    if out.exists() {
        fs::remove_dir_all(out).with_context(|| format!("replacing {}", out.display()))?;
    }
    fs::rename(&tmp, out).with_context(|| format!("renaming {} to {}", tmp.display(), out.display()))?;
    Ok((count, total))
}

/// `max_position_embeddings` of an export: the HF model's own (`flavor = "hf"`), else the
/// training sequence length.
pub fn max_positions(cfg: &crate::config::JobConfig) -> usize {
    let hf = crate::paths::resolve(&cfg.model.hf_assets_path).join("config.json");
    let own = (cfg.model.flavor == "hf")
        .then(|| std::fs::read_to_string(hf).ok())
        .flatten()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["max_position_embeddings"].as_u64());
    own.map_or(cfg.training.seq_len, |m| m as usize)
}
