//! Reading regions of tensors from checkpoints, memory-mapped: only the chunks that overlap the
//! requested region are touched (and each chunk's CRC32 is checked the first time it is read).

use super::{Chunk, Metadata, FORMAT, METADATA};
use crate::region::{copy_overlap, copy_overlap_as, Elem, Region};
use anyhow::{anyhow, bail, Context, Result};
use memmap2::Mmap;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Drops the pages of `map[start..start + len]` from this process's memory once they are copied
/// out: they are clean pages of a read-only file mapping, re-read from the page cache if needed
/// again, so a big load keeps one tensor resident rather than every file it has touched.
fn release(map: &Mmap, start: usize, len: usize) {
    // SAFETY: a read-only shared file mapping; after MADV_DONTNEED the same bytes are faulted in
    // again from the file (which is never modified in place), so no borrow sees other data.
    unsafe {
        let _ = map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, len);
    }
}

/// Named tensors of which any region can be read.
pub trait TensorSource: Send + Sync {
    /// What to name in errors (a folder or a file).
    fn describe(&self) -> String;
    /// Every tensor's name and global shape.
    fn shapes(&self) -> BTreeMap<String, Vec<usize>>;
    /// One tensor's global shape, `None` if absent.
    fn shape(&self, key: &str) -> Option<Vec<usize>>;
    /// The values of `region` of tensor `key`, row-major.
    fn read(&self, key: &str, region: &Region) -> Result<Vec<f32>>;
}

/// Memory maps of a folder's files, opened on first use.
#[derive(Default)]
struct Maps {
    maps: Mutex<HashMap<PathBuf, Arc<Mmap>>>,
}

impl Maps {
    fn get(&self, path: &Path) -> Result<Arc<Mmap>> {
        let mut maps = self.maps.lock().unwrap();
        if let Some(m) = maps.get(path) {
            return Ok(m.clone());
        }
        let f = fs::File::open(path).with_context(|| format!("checkpoint file {} is missing", path.display()))?;
        // SAFETY: checkpoint files are never modified in place (they are written once, then the
        // folder is renamed into place); a file truncated under us is caught by the size checks.
        let m = Arc::new(unsafe { Mmap::map(&f) }.with_context(|| format!("mapping {}", path.display()))?);
        maps.insert(path.to_path_buf(), m.clone());
        Ok(m)
    }
}

/// A sharded checkpoint folder (`metadata.json` + rank files).
pub struct ShardedReader {
    dir: PathBuf,
    pub meta: Metadata,
    maps: Maps,
    verified: Mutex<HashSet<(String, u64)>>,
}

impl ShardedReader {
    pub fn open(dir: &Path) -> Result<Self> {
        let p = dir.join(METADATA);
        let text = fs::read_to_string(&p).with_context(|| format!("{} is missing", p.display()))?;
        let meta: Metadata = serde_json::from_str(&text)
            .with_context(|| format!("{} is corrupt (not titan-rs metadata)", p.display()))?;
        if meta.format != FORMAT {
            bail!("{}: format {:?}, this titan-rs reads {FORMAT:?}", p.display(), meta.format);
        }
        Ok(Self { dir: dir.to_path_buf(), meta, maps: Maps::default(), verified: Mutex::default() })
    }

    /// Checks every chunk of every tensor against its CRC32 (each chunk once per reader);
    /// returns how many chunks there are. Readers that use only part of a checkpoint call it so
    /// a damaged byte anywhere is an error, not only in what they read.
    pub fn verify(&self) -> Result<usize> {
        let mut n = 0;
        for (key, t) in &self.meta.tensors {
            for c in &t.chunks {
                let map = self.maps.get(&self.dir.join(&c.file))?;
                self.chunk_bytes(&map, c, key)?;
                release(&map, c.byte_offset as usize, c.byte_len as usize);
                n += 1;
            }
        }
        Ok(n)
    }

    /// The bytes of `chunk`, checked against its CRC32 the first time.
    fn chunk_bytes<'a>(&self, map: &'a Mmap, chunk: &Chunk, key: &str) -> Result<&'a [u8]> {
        let path = self.dir.join(&chunk.file);
        let (start, end) = (chunk.byte_offset as usize, (chunk.byte_offset + chunk.byte_len) as usize);
        if end > map.len() || chunk.byte_len as usize != chunk.region.numel() * 4 {
            bail!(
                "checkpoint file {} is truncated: {key} needs bytes {start}..{end}, the file has {}",
                path.display(),
                map.len()
            );
        }
        let bytes = &map[start..end];
        let id = (chunk.file.clone(), chunk.byte_offset);
        if !self.verified.lock().unwrap().contains(&id) {
            if crc32fast::hash(bytes) != chunk.crc32 {
                bail!("checkpoint file {} is corrupt: the CRC32 of {key} (bytes {start}..{end}) does not match {METADATA}", path.display());
            }
            self.verified.lock().unwrap().insert(id);
        }
        Ok(bytes)
    }
}

impl TensorSource for ShardedReader {
    fn describe(&self) -> String {
        self.dir.display().to_string()
    }

    fn shapes(&self) -> BTreeMap<String, Vec<usize>> {
        self.meta.tensors.iter().map(|(k, t)| (k.clone(), t.shape.clone())).collect()
    }

    fn shape(&self, key: &str) -> Option<Vec<usize>> {
        self.meta.tensors.get(key).map(|t| t.shape.clone())
    }

    fn read(&self, key: &str, region: &Region) -> Result<Vec<f32>> {
        let t = self.meta.tensors.get(key).ok_or_else(|| anyhow!("{} has no tensor {key}", self.describe()))?;
        let mut out = vec![0f32; region.numel()];
        let mut filled = 0;
        for c in &t.chunks {
            if c.region.intersect(region).is_none() {
                continue;
            }
            let map = self.maps.get(&self.dir.join(&c.file))?;
            let bytes = self.chunk_bytes(&map, c, key)?;
            filled += copy_overlap(bytes, &c.region, &mut out, region);
            release(&map, c.byte_offset as usize, c.byte_len as usize);
        }
        if filled != region.numel() {
            bail!(
                "{}: the chunks of {key} cover {filled} of the {} elements asked for ({METADATA} is damaged)",
                self.describe(),
                region.numel()
            );
        }
        Ok(out)
    }
}

/// One safetensors file of full tensors (the consolidated checkpoint format, the output of
/// `checkpoint consolidate`, a Hugging Face weight file), float32, bfloat16 or float16, read
/// as float32.
pub struct FileReader {
    path: PathBuf,
    map: Mmap,
    /// Name → (shape, encoding, absolute byte range).
    tensors: BTreeMap<String, (Vec<usize>, Elem, usize, usize)>,
}

impl FileReader {
    pub fn open(path: &Path) -> Result<Self> {
        let f = fs::File::open(path).with_context(|| format!("{} is missing", path.display()))?;
        // SAFETY: as above, checkpoint files are not modified in place.
        let map = unsafe { Mmap::map(&f) }.with_context(|| format!("mapping {}", path.display()))?;
        let (n, meta) = safetensors::SafeTensors::read_metadata(&map)
            .map_err(|e| anyhow!("{} is not a valid safetensors file: {e:?}", path.display()))?;
        let mut tensors = BTreeMap::new();
        for (name, info) in meta.tensors() {
            let elem = match info.dtype {
                safetensors::Dtype::F32 => Elem::F32,
                safetensors::Dtype::BF16 => Elem::BF16,
                safetensors::Dtype::F16 => Elem::F16,
                d => bail!(
                    "{}: tensor {name} has dtype {d:?}; titan-rs reads float32, bfloat16 and float16",
                    path.display()
                ),
            };
            let (s, e) = (8 + n + info.data_offsets.0, 8 + n + info.data_offsets.1);
            if e > map.len() {
                bail!("{} is truncated: {name} ends at byte {e} of {}", path.display(), map.len());
            }
            tensors.insert(name, (info.shape.clone(), elem, s, e));
        }
        Ok(Self { path: path.to_path_buf(), map, tensors })
    }
}

impl TensorSource for FileReader {
    fn describe(&self) -> String {
        self.path.display().to_string()
    }

    fn shapes(&self) -> BTreeMap<String, Vec<usize>> {
        self.tensors.iter().map(|(k, t)| (k.clone(), t.0.clone())).collect()
    }

    fn shape(&self, key: &str) -> Option<Vec<usize>> {
        self.tensors.get(key).map(|t| t.0.clone())
    }

    fn read(&self, key: &str, region: &Region) -> Result<Vec<f32>> {
        let (shape, elem, s, e) =
            self.tensors.get(key).ok_or_else(|| anyhow!("{} has no tensor {key}", self.describe()))?;
        let mut out = vec![0f32; region.numel()];
        copy_overlap_as(&self.map[*s..*e], *elem, &Region::full(shape), &mut out, region);
        release(&self.map, *s, e - s);
        Ok(out)
    }
}

/// The weights of a Hugging Face model folder: `model.safetensors`, or the files listed by
/// `model.safetensors.index.json` (every listed file must exist and hold its tensors).
pub struct FolderReader {
    dir: PathBuf,
    files: Vec<FileReader>,
    /// Tensor → index into `files`.
    by_name: BTreeMap<String, usize>,
}

impl FolderReader {
    pub fn open(dir: &Path) -> Result<Self> {
        let index = dir.join("model.safetensors.index.json");
        let mut files = Vec::new();
        let mut by_name = BTreeMap::new();
        if index.exists() {
            let text = fs::read_to_string(&index).with_context(|| format!("reading {}", index.display()))?;
            let v: serde_json::Value =
                serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", index.display()))?;
            let map = v["weight_map"].as_object().ok_or_else(|| anyhow!("{} has no weight_map", index.display()))?;
            let mut opened: BTreeMap<String, usize> = BTreeMap::new();
            for (name, file) in map {
                let file =
                    file.as_str().ok_or_else(|| anyhow!("{}: the file of {name} is not a string", index.display()))?;
                let i = match opened.get(file) {
                    Some(i) => *i,
                    None => {
                        let p = dir.join(file);
                        if !p.exists() {
                            bail!(
                                "{} names {file} (holding {name}), which is missing from {}",
                                index.display(),
                                dir.display()
                            );
                        }
                        files.push(FileReader::open(&p)?);
                        opened.insert(file.to_string(), files.len() - 1);
                        files.len() - 1
                    }
                };
                if files[i].shape(name).is_none() {
                    bail!("{} says {file} holds {name}, but it does not", index.display());
                }
                by_name.insert(name.clone(), i);
            }
        } else {
            let p = dir.join("model.safetensors");
            if !p.exists() {
                bail!("{} has neither model.safetensors nor model.safetensors.index.json", dir.display());
            }
            files.push(FileReader::open(&p)?);
            by_name = files[0].shapes().into_keys().map(|k| (k, 0)).collect();
        }
        Ok(Self { dir: dir.to_path_buf(), files, by_name })
    }

    fn file_of(&self, key: &str) -> Result<&FileReader> {
        let i = self.by_name.get(key).ok_or_else(|| anyhow!("{} has no tensor {key}", self.describe()))?;
        Ok(&self.files[*i])
    }
}

impl TensorSource for FolderReader {
    fn describe(&self) -> String {
        self.dir.display().to_string()
    }

    fn shapes(&self) -> BTreeMap<String, Vec<usize>> {
        self.by_name.iter().map(|(k, i)| (k.clone(), self.files[*i].shape(k).expect("checked on open"))).collect()
    }

    fn shape(&self, key: &str) -> Option<Vec<usize>> {
        self.file_of(key).ok()?.shape(key)
    }

    fn read(&self, key: &str, region: &Region) -> Result<Vec<f32>> {
        self.file_of(key)?.read(key, region)
    }
}
