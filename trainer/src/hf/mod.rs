//! Hugging Face interop: a model family's HF weights read as a [`TensorSource`] in titan-rs's
//! names and layout (so loading reshards like any checkpoint: each rank reads only its slice),
//! and a titan-rs model written as an HF folder that transformers loads ([`export`]). The names
//! are the family's ([`titan_models::registry::Family::hf_tensor`]; the tables are in
//! `models/src/<family>/hf.rs`).

pub mod export;

use anyhow::{anyhow, bail, Context, Result};
use burn::prelude::Device;
use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use titan_checkpoints::{FolderReader, Region, TensorSource};
use titan_models::{registry, HfTensor, ModelArgs, Transformer};

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

/// Where one titan-rs tensor comes from.
enum Entry {
    /// An HF tensor, maybe transposed.
    One { name: String, transposed: bool },
    /// An `[out, in]` matrix whose rows are taken in `perm` order.
    Permuted { name: String, perm: Vec<usize> },
    /// Stacked experts `[E, in, out]` from one `[out, in]` matrix per expert.
    PerExpert { names: Vec<String> },
    /// Not in the HF format: zeros of this shape.
    Zeros(Vec<usize>),
}

/// The model arguments of the HF folder `dir` (its `config.json`); errors name the file.
pub fn folder_args(dir: &Path) -> Result<ModelArgs> {
    let p = dir.join("config.json");
    let text = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
    titan_models::hf_config::from_hf_config(&text).map_err(|e| anyhow!("{}: {e}", p.display()))
}

/// An HF model folder's weights in titan-rs names and `[in, out]` layout. Tensors with no
/// titan-rs counterpart keep their HF name (so the loader reports them).
pub struct HfSource {
    inner: FolderReader,
    names: BTreeMap<String, Entry>,
}

impl HfSource {
    /// Opens `dir`; its `config.json` says the family (whose names are used) and the shape.
    pub fn open(dir: &Path) -> Result<Self> {
        let inner = FolderReader::open(dir)?;
        let args = folder_args(dir)?;
        let family = registry::of(&args);
        let hf = inner.shapes();
        let mut keys: Vec<(String, Vec<usize>)> =
            Transformer::new(&args, 0, &Device::flex()).param_specs().into_iter().map(|s| (s.path, s.shape)).collect();
        // A separate `lm_head` of a tied model is read (and then ignored by the loader).
        if args.tie_word_embeddings {
            keys.push(("output.weight".into(), vec![args.dim, args.vocab_size]));
        }
        let (mut names, mut used) = (BTreeMap::new(), HashSet::new());
        for (key, shape) in keys {
            let entry = match (family.hf_tensor)(&args, &key) {
                Some(HfTensor::One { name, transposed }) if hf.contains_key(&name) => Entry::One { name, transposed },
                Some(HfTensor::PerExpert { names }) if names.iter().all(|n| hf.contains_key(n)) => {
                    // Read as one stacked tensor: every expert's matrix must have expert 0's shape.
                    if let Some(odd) = names.iter().find(|n| hf[*n] != hf[&names[0]]) {
                        bail!(
                            "{}: expert tensor `{odd}` has shape {:?} but `{}` has {:?}; every expert of a layer must have the same shape (is `moe_intermediate_size` in config.json right?)",
                            dir.display(),
                            hf[odd],
                            names[0],
                            hf[&names[0]]
                        );
                    }
                    Entry::PerExpert { names }
                }
                Some(HfTensor::Permuted { name, perm }) if hf.contains_key(&name) => Entry::Permuted { name, perm },
                Some(HfTensor::Absent) => Entry::Zeros(shape),
                _ => continue, // not in the folder: the loader names it as missing
            };
            match &entry {
                Entry::One { name, .. } | Entry::Permuted { name, .. } => {
                    used.insert(name.clone());
                }
                Entry::PerExpert { names } => used.extend(names.iter().cloned()),
                Entry::Zeros(_) => {}
            }
            names.insert(key, entry);
        }
        for name in hf.into_keys().filter(|n| !used.contains(n)) {
            names.insert(name.clone(), Entry::One { name, transposed: false });
        }
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
        match self.names.get(key)? {
            Entry::One { name, transposed } => {
                let mut s = self.inner.shape(name)?;
                if *transposed {
                    s.reverse();
                }
                Some(s)
            }
            Entry::Permuted { name, .. } => {
                let s = self.inner.shape(name)?;
                (s.len() == 2).then(|| vec![s[1], s[0]])
            }
            Entry::PerExpert { names } => {
                let s = self.inner.shape(&names[0])?;
                (s.len() == 2).then(|| vec![names.len(), s[1], s[0]])
            }
            Entry::Zeros(s) => Some(s.clone()),
        }
    }

    fn read(&self, key: &str, region: &Region) -> Result<Vec<f32>> {
        // A transposed `[out, in]` matrix's region of the `[in, out]` view.
        let flipped = |offsets: &[usize], lengths: &[usize]| Region {
            offsets: offsets.iter().rev().copied().collect(),
            lengths: lengths.iter().rev().copied().collect(),
        };
        match self.names.get(key) {
            None => self.inner.read(key, region),
            Some(Entry::One { name, transposed: false }) => self.inner.read(name, region),
            Some(Entry::One { name, transposed: true }) => {
                let r = flipped(&region.offsets, &region.lengths);
                Ok(transpose(&self.inner.read(name, &r)?, r.lengths[0], r.lengths[1]))
            }
            Some(Entry::PerExpert { names }) => {
                let (e0, ne) = (region.offsets[0], region.lengths[0]);
                let r = flipped(&region.offsets[1..], &region.lengths[1..]);
                let mut out = Vec::with_capacity(region.numel());
                for name in &names[e0..e0 + ne] {
                    out.extend(transpose(&self.inner.read(name, &r)?, r.lengths[0], r.lengths[1]));
                }
                Ok(out)
            }
            Some(Entry::Permuted { name, perm }) => {
                // The HF rows of the requested outputs (one block of rows around them), picked.
                let (i0, ni, o0, no) = (region.offsets[0], region.lengths[0], region.offsets[1], region.lengths[1]);
                let rows = &perm[o0..o0 + no];
                let lo = rows.iter().copied().min().unwrap_or(0);
                let hi = rows.iter().copied().max().map_or(0, |m| m + 1);
                let data = self.inner.read(name, &Region { offsets: vec![lo, i0], lengths: vec![hi - lo, ni] })?;
                let mut out = vec![0f32; ni * no];
                for (j, &r) in rows.iter().enumerate() {
                    for i in 0..ni {
                        out[i * no + j] = data[(r - lo) * ni + i];
                    }
                }
                Ok(out)
            }
            Some(Entry::Zeros(_)) => Ok(vec![0.0; region.numel()]),
        }
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
    fn transpose_swaps_rows_and_columns() {
        assert_eq!(transpose(&[1., 2., 3., 4., 5., 6.], 2, 3), vec![1., 4., 2., 5., 3., 6.]);
    }
}
