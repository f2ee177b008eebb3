//! The cached, memory-mapped token file: a 24-byte header and little-endian u32 tokens.

use anyhow::{bail, Context, Result};
use memmap2::Mmap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"TITANTOK";
const VERSION: u32 = 1;
const HEADER: usize = 24;

pub struct TokenFile {
    map: Mmap,
    len: usize,
    path: PathBuf,
}

impl TokenFile {
    /// Writes `tokens` to `path` atomically (temporary file + rename).
    pub fn write(path: &Path, tokens: &[u32]) -> Result<()> {
        let mut w = TokenWriter::create(path)?;
        w.push(tokens)?;
        w.finish()
    }

    pub fn open(path: &Path) -> Result<Self> {
        let f = File::open(path).with_context(|| format!("opening token file {}", path.display()))?;
        // SAFETY: the file is only ever replaced by rename, never modified in place.
        let map = unsafe { Mmap::map(&f) }.with_context(|| format!("mapping {}", path.display()))?;
        if map.len() < HEADER || &map[..8] != MAGIC {
            bail!("{} is not a titan-rs token file (bad header); delete it to rebuild", path.display());
        }
        let version = u32::from_le_bytes(map[8..12].try_into().unwrap());
        let len = u64::from_le_bytes(map[16..24].try_into().unwrap()) as usize;
        if version != VERSION || map.len() != HEADER + 4 * len {
            bail!("{} is truncated or from another version; delete it to rebuild", path.display());
        }
        Ok(Self { map, len, path: path.to_path_buf() })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn get(&self, i: usize) -> u32 {
        let o = HEADER + 4 * i;
        u32::from_le_bytes(self.map[o..o + 4].try_into().unwrap())
    }

    /// Tokens `[start, end)` as i64 (Burn's Int element).
    pub fn window(&self, start: usize, end: usize) -> impl Iterator<Item = i64> + '_ {
        (start..end).map(|i| self.get(i) as i64)
    }
}

/// Writes a token file as tokens stream in: a temporary file, its length patched into the
/// header at the end, flushed, then renamed into place. A writer dropped unfinished (an error)
/// removes its temporary file; a killed process leaves one, which nothing reads.
pub struct TokenWriter {
    tmp: PathBuf,
    path: PathBuf,
    w: Option<BufWriter<File>>,
    len: u64,
}

impl TokenWriter {
    pub fn create(path: &Path) -> Result<Self> {
        let tmp = path.with_extension(format!("tmp-{}-{:?}", std::process::id(), std::thread::current().id()));
        let f = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        let mut w = BufWriter::with_capacity(1 << 20, f);
        w.write_all(MAGIC)?;
        w.write_all(&VERSION.to_le_bytes())?;
        w.write_all(&4u32.to_le_bytes())?;
        w.write_all(&0u64.to_le_bytes())?;
        Ok(Self { tmp, path: path.to_path_buf(), w: Some(w), len: 0 })
    }

    pub fn push(&mut self, tokens: &[u32]) -> Result<()> {
        let w = self.w.as_mut().expect("an open writer");
        for t in tokens {
            w.write_all(&t.to_le_bytes()).with_context(|| format!("writing {}", self.tmp.display()))?;
        }
        self.len += tokens.len() as u64;
        Ok(())
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn finish(mut self) -> Result<()> {
        use std::io::{Seek, SeekFrom};
        let mut f = self.w.take().expect("an open writer").into_inner().map_err(|e| e.into_error())?;
        f.seek(SeekFrom::Start(16))?;
        f.write_all(&self.len.to_le_bytes())?;
        f.sync_all().with_context(|| format!("flushing {}", self.tmp.display()))?;
        std::fs::rename(&self.tmp, &self.path)
            .with_context(|| format!("renaming {} to {}", self.tmp.display(), self.path.display()))?;
        Ok(())
    }
}

impl Drop for TokenWriter {
    fn drop(&mut self) {
        if self.w.is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Entropy (nats/token) of the unigram distribution of the file's tokens: the loss of the best
/// model that ignores context. A trained model must end clearly below it.
pub fn unigram_entropy(tokens: &TokenFile) -> f64 {
    let mut counts = std::collections::HashMap::<u32, u64>::new();
    for i in 0..tokens.len() {
        *counts.entry(tokens.get(i)).or_default() += 1;
    }
    let n = tokens.len() as f64;
    counts.values().map(|&c| c as f64 / n).map(|p| -p * p.ln()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_open_read_and_reject_truncation() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.bin");
        TokenFile::write(&p, &[5, 6, 7, 70000]).unwrap();
        let f = TokenFile::open(&p).unwrap();
        assert_eq!(f.len(), 4);
        assert_eq!(f.window(1, 4).collect::<Vec<_>>(), vec![6, 7, 70000]);
        let h = unigram_entropy(&f);
        assert!((h - 4f64.ln()).abs() < 1e-12);
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() - 2]).unwrap();
        let e = TokenFile::open(&p).err().unwrap().to_string();
        assert!(e.contains("truncated"), "{e}");
    }
}
