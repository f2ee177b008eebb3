//! `titan-rs checkpoint inspect` and `checkpoint consolidate`.

use super::read::{FileReader, ShardedReader, TensorSource};
use super::METADATA;
use crate::region::Region;
use anyhow::{bail, Context, Result};
use safetensors::tensor::{Dtype, View};
use std::borrow::Cow;
use std::cell::RefCell;
use std::fmt::Write;
use std::fs;
use std::path::Path;

/// The tensor sources of a committed step folder: the sharded format's metadata, or the
/// consolidated format's `model.safetensors` (+ `optimizer.safetensors`).
pub fn open_sources(dir: &Path) -> Result<Vec<Box<dyn TensorSource>>> {
    if dir.join(METADATA).exists() {
        return Ok(vec![Box::new(ShardedReader::open(dir)?)]);
    }
    let mut out: Vec<Box<dyn TensorSource>> = Vec::new();
    for f in ["model.safetensors", "optimizer.safetensors"] {
        if dir.join(f).exists() {
            out.push(Box::new(FileReader::open(&dir.join(f))?));
        }
    }
    if out.is_empty() {
        bail!("{} holds no titan-rs checkpoint (no {METADATA} or model.safetensors)", dir.display());
    }
    Ok(out)
}

fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.2} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

/// A readable description of a step folder: format, step, the layout it was saved under, the
/// files and their sizes, and every tensor with its shape and chunks.
pub fn inspect(dir: &Path) -> Result<String> {
    let mut s = String::new();
    writeln!(s, "checkpoint {}", dir.display())?;
    let mut files: Vec<(String, u64)> = fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .flatten()
        .filter_map(|e| Some((e.file_name().to_string_lossy().into_owned(), e.metadata().ok()?.len())))
        .collect();
    files.sort();
    if dir.join(METADATA).exists() {
        let r = ShardedReader::open(dir)?;
        let m = &r.meta;
        writeln!(s, "format {} (sharded), step {}, saved by {} rank(s) under {}", m.format, m.step, m.world_size, m.saved_under)?;
        if m.model_only {
            writeln!(s, "model only (no optimizer state)")?;
        }
        let total: u64 = files.iter().map(|f| f.1).sum();
        writeln!(s, "files ({}, {}):", files.len(), human(total))?;
        for (f, b) in &files {
            writeln!(s, "  {f}  {}", human(*b))?;
        }
        writeln!(s, "tensors ({}):", m.tensors.len())?;
        for (k, t) in &m.tensors {
            writeln!(s, "  {k}  {:?} {}  {} chunk(s)", t.shape, t.dtype, t.chunks.len())?;
            for c in &t.chunks {
                writeln!(s, "    {} @ {}+{}  offsets {:?} lengths {:?}", c.file, c.byte_offset, c.byte_len, c.region.offsets, c.region.lengths)?;
            }
        }
    } else {
        writeln!(s, "format titan-rs-checkpoint/1 (consolidated: full tensors written by rank 0)")?;
        for (f, b) in &files {
            writeln!(s, "  {f}  {}", human(*b))?;
        }
        for src in open_sources(dir)? {
            writeln!(s, "{}:", src.describe())?;
            for (k, shape) in src.shapes() {
                writeln!(s, "  {k}  {shape:?} F32")?;
            }
        }
    }
    Ok(s)
}

/// One tensor read from a source only when the writer asks for its bytes.
struct Lazy<'a> {
    src: &'a dyn TensorSource,
    key: String,
    shape: Vec<usize>,
    error: &'a RefCell<Option<anyhow::Error>>,
}

impl View for Lazy<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        match self.src.read(&self.key, &Region::full(&self.shape)) {
            Ok(v) => Cow::Owned(bytemuck::cast_slice(&v).to_vec()),
            Err(e) => {
                self.error.borrow_mut().get_or_insert(e);
                Cow::Owned(vec![0; self.data_len()])
            }
        }
    }
    fn data_len(&self) -> usize {
        self.shape.iter().product::<usize>() * 4
    }
}

/// Writes every tensor of the step folder `dir` in full into one safetensors file `out`,
/// one tensor in memory at a time; `out` appears only complete. Returns tensors and bytes.
pub fn consolidate(dir: &Path, out: &Path) -> Result<(usize, u64)> {
    let sources = open_sources(dir)?;
    let error = RefCell::new(None);
    let mut views = Vec::new();
    for src in &sources {
        for (key, shape) in src.shapes() {
            views.push((key.clone(), Lazy { src: src.as_ref(), key, shape, error: &error }));
        }
    }
    let n = views.len();
    let tmp = out.with_extension("partial");
    safetensors::serialize_to_file(views, &None, &tmp).with_context(|| format!("writing {}", tmp.display()))?;
    if let Some(e) = error.into_inner() {
        let _ = fs::remove_file(&tmp);
        return Err(e.context(format!("consolidating {}", dir.display())));
    }
    fs::File::open(&tmp)?.sync_all()?;
    fs::rename(&tmp, out).with_context(|| format!("renaming {} to {}", tmp.display(), out.display()))?;
    Ok((n, fs::metadata(out)?.len()))
}
