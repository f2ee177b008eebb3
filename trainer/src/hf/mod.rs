//! Hugging Face interop: `LlamaForCausalLM` weights read as a [`TensorSource`] in titan-rs's
//! names and layout (so loading reshards like any checkpoint: each rank reads only its slice),
//! and a titan-rs model written as an HF folder that transformers loads.
//!
//! Key mapping (HF stores linear weights `[out, in]`, titan-rs `[in, out]`: transposed):
//!
//! | titan-rs | Hugging Face | |
//! |---|---|---|
//! | `tok_embeddings.weight` | `model.embed_tokens.weight` | |
//! | `layers.N.attention.{wq,wk,wv,wo}.weight` | `model.layers.N.self_attn.{q,k,v,o}_proj.weight` | transposed |
//! | `layers.N.feed_forward.{w1,w2,w3}.weight` | `model.layers.N.mlp.{gate,down,up}_proj.weight` | transposed |
//! | `layers.N.attention_norm.weight` | `model.layers.N.input_layernorm.weight` | |
//! | `layers.N.ffn_norm.weight` | `model.layers.N.post_attention_layernorm.weight` | |
//! | `norm.weight` | `model.norm.weight` | |
//! | `output.weight` (absent when tied) | `lm_head.weight` | transposed |
//!
//! Both use RoPE's rotate-half layout, so q/k need no permutation.

pub mod export;

use anyhow::Result;
use std::collections::BTreeMap;
use std::path::Path;
use titan_checkpoints::{FolderReader, Region, TensorSource};

/// `(titan-rs suffix, HF suffix, transposed)` inside a block.
const BLOCK: [(&str, &str, bool); 9] = [
    ("attention.wq.weight", "self_attn.q_proj.weight", true),
    ("attention.wk.weight", "self_attn.k_proj.weight", true),
    ("attention.wv.weight", "self_attn.v_proj.weight", true),
    ("attention.wo.weight", "self_attn.o_proj.weight", true),
    ("feed_forward.w1.weight", "mlp.gate_proj.weight", true),
    ("feed_forward.w2.weight", "mlp.down_proj.weight", true),
    ("feed_forward.w3.weight", "mlp.up_proj.weight", true),
    ("attention_norm.weight", "input_layernorm.weight", false),
    ("ffn_norm.weight", "post_attention_layernorm.weight", false),
];
const TOP: [(&str, &str, bool); 3] = [
    ("tok_embeddings.weight", "model.embed_tokens.weight", false),
    ("norm.weight", "model.norm.weight", false),
    ("output.weight", "lm_head.weight", true),
];

/// A name translated through the tables (`to_hf`: titan-rs → HF, else back), with whether the
/// matrix is transposed; `None` for a name with no counterpart.
fn translate(name: &str, to_hf: bool) -> Option<(String, bool)> {
    let pick = |e: &(&'static str, &'static str, bool)| if to_hf { (e.0, e.1) } else { (e.1, e.0) };
    if let Some(e) = TOP.iter().find(|e| pick(e).0 == name) {
        return Some((pick(e).1.to_string(), e.2));
    }
    let (from, to) = if to_hf { ("layers.", "model.layers.") } else { ("model.layers.", "layers.") };
    let (n, tail) = name.strip_prefix(from)?.split_once('.')?;
    let e = BLOCK.iter().find(|e| pick(e).0 == tail)?;
    Some((format!("{to}{n}.{}", pick(e).1), e.2))
}

/// The HF name of a titan-rs key and whether the matrix is stored transposed.
pub fn to_hf(key: &str) -> Option<(String, bool)> {
    translate(key, true)
}

/// The titan-rs key of an HF name and whether it is transposed.
pub fn from_hf(name: &str) -> Option<(String, bool)> {
    translate(name, false)
}

/// `[rows, cols]` row-major → `[cols, rows]`.
pub fn transpose(data: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; data.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = data[r * cols + c];
        }
    }
    out
}

/// An HF model folder's weights in titan-rs names and `[in, out]` layout. Tensors with no
/// titan-rs counterpart keep their HF name (so the loader reports them).
pub struct HfSource {
    inner: FolderReader,
    /// titan-rs key → (HF name, transposed).
    names: BTreeMap<String, (String, bool)>,
}

impl HfSource {
    pub fn open(dir: &Path) -> Result<Self> {
        let inner = FolderReader::open(dir)?;
        let names = inner
            .shapes()
            .into_keys()
            .map(|hf| match from_hf(&hf) {
                Some((key, t)) => (key, (hf, t)),
                None => (hf.clone(), (hf, false)),
            })
            .collect();
        Ok(Self { inner, names })
    }
}

impl TensorSource for HfSource {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn shapes(&self) -> BTreeMap<String, Vec<usize>> {
        self.names.keys().filter_map(|k| Some((k.clone(), self.shape(k)?))).collect()
    }

    fn shape(&self, key: &str) -> Option<Vec<usize>> {
        let (hf, t) = self.names.get(key)?;
        let mut s = self.inner.shape(hf)?;
        if *t {
            s.reverse();
        }
        Some(s)
    }

    fn read(&self, key: &str, region: &Region) -> Result<Vec<f32>> {
        let Some((hf, t)) = self.names.get(key) else { return self.inner.read(key, region) };
        if !*t {
            return self.inner.read(hf, region);
        }
        let flipped = Region {
            offsets: region.offsets.iter().rev().copied().collect(),
            lengths: region.lengths.iter().rev().copied().collect(),
        };
        let data = self.inner.read(hf, &flipped)?;
        Ok(transpose(&data, flipped.lengths[0], flipped.lengths[1]))
    }
}

/// `inner` drawing a progress bar (tensors read, on a terminal) for a conversion that reads
/// each tensor once.
pub struct WithProgress<'a> {
    inner: &'a dyn TensorSource,
    bar: indicatif::ProgressBar,
}

impl<'a> WithProgress<'a> {
    pub fn new(inner: &'a dyn TensorSource, what: &str) -> Self {
        let bar = indicatif::ProgressBar::new(inner.shapes().len() as u64);
        if let Ok(style) = indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} tensors, {elapsed}") {
            bar.set_style(style);
        }
        bar.set_message(what.to_string());
        Self { inner, bar }
    }
}

impl TensorSource for WithProgress<'_> {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn shapes(&self) -> BTreeMap<String, Vec<usize>> {
        self.inner.shapes()
    }
    fn shape(&self, key: &str) -> Option<Vec<usize>> {
        self.inner.shape(key)
    }
    fn read(&self, key: &str, region: &Region) -> Result<Vec<f32>> {
        let r = self.inner.read(key, region);
        self.bar.inc(1);
        r
    }
}

impl Drop for WithProgress<'_> {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}

/// Whether `dir` looks like an HF model folder (a `config.json` next to safetensors weights).
pub fn is_hf_folder(dir: &Path) -> bool {
    dir.join("config.json").exists()
        && (dir.join("model.safetensors").exists() || dir.join("model.safetensors.index.json").exists())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for key in [
            "tok_embeddings.weight",
            "layers.3.attention.wk.weight",
            "layers.11.feed_forward.w2.weight",
            "layers.0.ffn_norm.weight",
            "norm.weight",
            "output.weight",
        ] {
            let (hf, t) = to_hf(key).unwrap();
            assert_eq!(from_hf(&hf), Some((key.to_string(), t)));
        }
        assert_eq!(
            to_hf("layers.2.feed_forward.w3.weight").unwrap(),
            ("model.layers.2.mlp.up_proj.weight".into(), true)
        );
        assert!(from_hf("model.layers.0.self_attn.rotary_emb.inv_freq").is_none());
        assert_eq!(transpose(&[1., 2., 3., 4., 5., 6.], 2, 3), vec![1., 4., 2., 5., 3., 6.]);
    }
}
