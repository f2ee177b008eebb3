//! `titan-rs generate`: sample text from a checkpoint.

use crate::config::load_config;
use crate::rank::params::{load_model_tensors, param_shapes};
use crate::rank::pipeline::to_tensor_2d;
use crate::train::trainer::build_model;
use anyhow::{anyhow, Context, Result};
use burn::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::Path;
use titan_checkpoints::sharded::tools::open_verified;
use titan_checkpoints::{HostTensor, Region, TensorMap, TensorSource};
use titan_data::Tokenizer;
use titan_models::Transformer;

pub struct GenerateOptions {
    pub prompt: String,
    pub max_new_tokens: usize,
    pub temperature: f64,
    pub top_k: usize,
    pub seed: u64,
    pub context: usize,
}

/// Every parameter of `fresh` read in full from `src` (errors name the tensor and `src`).
pub fn load_whole(fresh: Transformer, src: &dyn TensorSource, device: &Device) -> Result<Transformer> {
    let mut tensors = TensorMap::new();
    for (path, _) in param_shapes(&fresh) {
        if let Some(shape) = src.shape(&path) {
            let data = src.read(&path, &Region::full(&shape))?;
            tensors.insert(path, HostTensor { shape, data });
        }
    }
    load_model_tensors(fresh, tensors, device, &src.describe(), &|p| p.to_string(), &|_| false).map_err(|e| anyhow!(e))
}

/// Samples from a titan-rs checkpoint (a `step-N` folder, a folder of them, a dump folder) or a
/// Hugging Face model folder (`config.json` + safetensors; its `tokenizer.json` if it has one).
pub fn generate(checkpoint: &Path, o: &GenerateOptions) -> Result<String> {
    let device = Device::flex();
    let (model, tokenizer) = if crate::hf::is_hf_folder(checkpoint) {
        let mut cfg = crate::config::JobConfig::default();
        cfg.model.flavor = "hf".into();
        cfg.model.name = crate::config::hf_model_name(checkpoint).map_err(|e| anyhow!(e))?;
        cfg.model.hf_assets_path = checkpoint.display().to_string();
        if !checkpoint.join("tokenizer.json").exists() {
            cfg.model.tokenizer_path = crate::config::Model::default().tokenizer_file().display().to_string();
        }
        let args = cfg.model_args().map_err(|e| anyhow!(e))?;
        let src = crate::hf::HfSource::open(checkpoint)?;
        (
            load_whole(build_model(&cfg, &args, 0, &device), &src, &device)?,
            Tokenizer::from_file(&cfg.model.tokenizer_file())?,
        )
    } else {
        let reader = crate::checkpoint::open_step(checkpoint)?;
        let cfg = load_config(Some(&reader.path("config.toml")), &[]).context("the checkpoint's config.toml")?;
        let args = cfg.model_args().map_err(|e| anyhow!(e))?;
        let sources = open_verified(reader.dir())?;
        let model = load_whole(build_model(&cfg, &args, 0, &device), sources[0].as_ref(), &device)?;
        (model, Tokenizer::from_file(&cfg.model.tokenizer_file())?)
    };

    let mut ids: Vec<i64> = tokenizer.encode(&o.prompt)?.into_iter().map(i64::from).collect();
    if ids.is_empty() {
        ids.push(tokenizer.eos_id() as i64);
    }
    let prompt_len = ids.len();
    let mut rng = ChaCha8Rng::seed_from_u64(o.seed);
    for _ in 0..o.max_new_tokens {
        let window = &ids[ids.len().saturating_sub(o.context)..];
        let logits = model.forward(to_tensor_2d(window, 1, window.len(), &device));
        let [_, t, v] = logits.dims();
        let last: Vec<f32> = logits.slice([0..1, t - 1..t, 0..v]).into_data().try_to_vec::<f32>().expect("f32 logits");
        let next = sample(&last, o.temperature, o.top_k, &mut rng);
        if next == tokenizer.eos_id() as usize {
            break;
        }
        ids.push(next as i64);
    }
    let new: Vec<u32> = ids[prompt_len..].iter().map(|&i| i as u32).collect();
    Ok(format!("{}{}", o.prompt, tokenizer.decode(&new)?))
}

/// Top-k sampling at a temperature (greedy when the temperature is 0).
fn sample(logits: &[f32], temperature: f64, top_k: usize, rng: &mut ChaCha8Rng) -> usize {
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    if temperature <= 0.0 {
        return idx[0];
    }
    idx.truncate(top_k.max(1));
    let m = logits[idx[0]] as f64;
    let w: Vec<f64> = idx.iter().map(|&i| ((logits[i] as f64 - m) / temperature).exp()).collect();
    let mut r = rng.gen::<f64>() * w.iter().sum::<f64>();
    for (i, wi) in idx.iter().zip(&w) {
        if r < *wi {
            return *i;
        }
        r -= wi;
    }
    idx[idx.len() - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_respects_greedy_and_top_k() {
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let l = [0.1, 3.0, 2.9, -5.0];
        assert_eq!(sample(&l, 0.0, 0, &mut rng), 1);
        for _ in 0..100 {
            assert!([1, 2].contains(&sample(&l, 1.0, 2, &mut rng)));
        }
    }
}
