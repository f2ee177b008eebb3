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

/// [`open_sources`] with every byte checked first: a sharded checkpoint's chunks against their
/// CRC32s (a consolidated one's files are checked against the manifest when the step folder is
/// opened). For the readers that use part of a checkpoint — generation, export, inspection.
pub fn open_verified(dir: &Path) -> Result<Vec<Box<dyn TensorSource>>> {
    if dir.join(METADATA).exists() {
        let r = ShardedReader::open(dir)?;
        r.verify()?;
        return Ok(vec![Box::new(r)]);
    }
    open_sources(dir)
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
        let chunks = r.verify()?;
        let m = &r.meta;
        writeln!(
            s,
            "format {} (sharded), step {}, saved by {} rank(s) under {}",
            m.format, m.step, m.world_size, m.saved_under
        )?;
        writeln!(s, "verified: {chunks} chunk(s), every CRC32 matches {METADATA}")?;
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
                writeln!(
                    s,
                    "    {} @ {}+{}  offsets {:?} lengths {:?}",
                    c.file, c.byte_offset, c.byte_len, c.region.offsets, c.region.lengths
                )?;
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

/// A tensor whose bytes are produced only when the writer reaches it.
pub struct LazyTensor<'a> {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub bytes: Box<dyn Fn() -> Result<Vec<u8>> + 'a>,
}

struct View1<'a, 'b> {
    t: &'b LazyTensor<'a>,
    error: &'b RefCell<Option<anyhow::Error>>,
}

impl View for View1<'_, '_> {
    fn dtype(&self) -> Dtype {
        self.t.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.t.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        match (self.t.bytes)() {
            Ok(v) if v.len() == self.data_len() => Cow::Owned(v),
            Ok(v) => {
                self.error.borrow_mut().get_or_insert(anyhow::anyhow!(
                    "{}: {} bytes produced, {} expected",
                    self.t.name,
                    v.len(),
                    self.data_len()
                ));
                Cow::Owned(vec![0; self.data_len()])
            }
            Err(e) => {
                self.error.borrow_mut().get_or_insert(e);
                Cow::Owned(vec![0; self.data_len()])
            }
        }
    }
    fn data_len(&self) -> usize {
        self.t.shape.iter().product::<usize>() * self.t.dtype.size()
    }
}

/// Writes `tensors` into the safetensors file `path`, producing each one's bytes only when it is
/// written (one tensor in memory at a time), then flushes it to disk. On any error the file is
/// removed.
pub fn stream_safetensors(
    path: &Path,
    tensors: &[LazyTensor<'_>],
    metadata: Option<std::collections::HashMap<String, String>>,
) -> Result<u64> {
    let error = RefCell::new(None);
    let views: Vec<_> = tensors.iter().map(|t| (t.name.clone(), View1 { t, error: &error })).collect();
    let written =
        safetensors::serialize_to_file(views, &metadata, path).with_context(|| format!("writing {}", path.display()));
    if let Some(e) = error.into_inner() {
        let _ = fs::remove_file(path);
        return Err(e);
    }
    written?;
    let f = fs::File::open(path)?;
    f.sync_all()?;
    Ok(f.metadata()?.len())
}

/// Writes every tensor of the step folder `dir` in full into one safetensors file `out`,
/// one tensor in memory at a time; `out` appears only complete. Returns tensors and bytes.
pub fn consolidate(dir: &Path, out: &Path) -> Result<(usize, u64)> {
    let sources = open_verified(dir)?;
    let mut tensors = Vec::new();
    for src in &sources {
        for (key, shape) in src.shapes() {
            let (src, k, full) = (src.as_ref(), key.clone(), Region::full(&shape));
            let bytes = Box::new(move || Ok(bytemuck::cast_slice(&src.read(&k, &full)?).to_vec()));
            tensors.push(LazyTensor { name: key, dtype: Dtype::F32, shape, bytes });
        }
    }
    let tmp = out.with_extension("partial");
    if let Err(e) = stream_safetensors(&tmp, &tensors, None) {
        let _ = fs::remove_file(&tmp);
        return Err(e.context(format!("consolidating {} into {}", dir.display(), out.display())));
    }
    fs::rename(&tmp, out).with_context(|| format!("renaming {} to {}", tmp.display(), out.display()))?;
    Ok((tensors.len(), fs::metadata(out)?.len()))
}

/// Writes every tensor of `src` in full as a one-file sharded checkpoint `step-{step}` of
/// `folder` (metadata, `files`, manifest, atomic rename), one tensor in memory at a time.
pub fn write_source(
    folder: &crate::CheckpointFolder,
    step: u64,
    src: &dyn TensorSource,
    files: &[(String, Vec<u8>)],
    saved_under: &str,
    model_only: bool,
) -> Result<std::path::PathBuf> {
    use super::{Chunk, Metadata, TensorMeta, FORMAT};
    use std::collections::BTreeMap;
    let mut pending = folder.begin(step)?;
    let file = "rank-00000-of-00001.safetensors";
    let path = pending.dir().join(file);
    let shapes = src.shapes();
    let crcs = RefCell::new(BTreeMap::new());
    let tensors: Vec<LazyTensor> = shapes
        .iter()
        .map(|(key, shape)| {
            let (k, full, crcs) = (key.clone(), Region::full(shape), &crcs);
            let bytes = Box::new(move || {
                let b = bytemuck::cast_slice(&src.read(&k, &full)?).to_vec();
                crcs.borrow_mut().insert(k.clone(), crc32fast::hash(&b));
                Ok(b)
            });
            LazyTensor { name: key.clone(), dtype: Dtype::F32, shape: shape.clone(), bytes }
        })
        .collect();
    let bytes = stream_safetensors(&path, &tensors, None)?;
    drop(tensors);
    let f = fs::File::open(&path)?;
    // SAFETY: the file was just written here and nothing else writes it.
    let map = unsafe { memmap2::Mmap::map(&f) }?;
    let (n, header) = safetensors::SafeTensors::read_metadata(&map)
        .map_err(|e| anyhow::anyhow!("reading back {}: {e:?}", path.display()))?;
    let crcs = crcs.into_inner();
    let mut meta = Metadata {
        format: FORMAT.into(),
        step,
        saved_under: saved_under.into(),
        world_size: 1,
        model_only,
        tensors: BTreeMap::new(),
    };
    for (key, shape) in shapes {
        let info = header.info(&key).expect("a written tensor");
        let chunk = Chunk {
            file: file.into(),
            byte_offset: (8 + n + info.data_offsets.0) as u64,
            byte_len: (info.data_offsets.1 - info.data_offsets.0) as u64,
            region: Region::full(&shape),
            crc32: crcs[&key],
        };
        meta.tensors.insert(key, TensorMeta { shape, dtype: "F32".into(), chunks: vec![chunk] });
    }
    pending.add_file(file, bytes, None);
    pending.write(METADATA, serde_json::to_string_pretty(&meta)?.as_bytes())?;
    for (name, b) in files {
        pending.write(name, b)?;
    }
    pending.commit()
}
