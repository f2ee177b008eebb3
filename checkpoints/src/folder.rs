//! Atomic checkpoint folders: `step-N/` appears only complete, with a verified manifest.
//!
//! Writing goes to `.step-N.partial-<pid>/`; `manifest.json` (every file's size and CRC32) is
//! written last and the folder renamed to `step-N/`. A crash leaves at worst a partial folder,
//! which is ignored and cleaned up, never a damaged `step-N/`.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

const MANIFEST: &str = "manifest.json";
const FORMAT: &str = "titan-rs-checkpoint/1";

#[derive(Debug, Serialize, Deserialize)]
struct Manifest {
    format: String,
    step: u64,
    files: BTreeMap<String, FileEntry>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct FileEntry {
    bytes: u64,
    /// `None` for the rank files of a sharded checkpoint, whose chunks carry their own CRC32
    /// (so a rank reading a few chunks need not read whole files).
    crc32: Option<u32>,
}

/// `{dump_folder}/{checkpoint.folder}`: the set of step checkpoints.
pub struct CheckpointFolder {
    root: PathBuf,
    /// Folders being deleted in the background (old checkpoints), joined on drop.
    deleting: std::sync::Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl Drop for CheckpointFolder {
    fn drop(&mut self) {
        for h in self.deleting.get_mut().map(std::mem::take).unwrap_or_default() {
            let _ = h.join();
        }
    }
}

/// Whether a dot-folder in the root is this process's work in progress (a partial save, or a
/// folder being deleted), not a leftover of a process that died.
fn is_ours(name: &str) -> bool {
    let pid = std::process::id();
    name.ends_with(&format!(".partial-{pid}")) || name.contains(&format!(".trash-{pid}-"))
}

impl CheckpointFolder {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into(), deleting: Default::default() }
    }

    /// Moves `dir` out of sight (one rename) and deletes it on a background thread, so that
    /// training does not wait for old checkpoints to be unlinked. A deletion cut short by the
    /// process exiting is finished by a later [`Self::prune`].
    fn discard(&self, dir: &Path) -> Result<()> {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let trash = self.root.join(format!(".{name}.trash-{}-{n}", std::process::id()));
        fs::rename(dir, &trash).with_context(|| format!("removing {}", dir.display()))?;
        let h = std::thread::spawn(move || {
            let _ = fs::remove_dir_all(&trash);
        });
        self.deleting.lock().unwrap().push(h);
        Ok(())
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn step_dir(&self, step: u64) -> PathBuf {
        self.root.join(format!("step-{step}"))
    }

    /// Steps with a committed checkpoint folder, ascending.
    pub fn steps(&self) -> Result<Vec<u64>> {
        if !self.root.exists() {
            return Ok(vec![]);
        }
        let mut steps = Vec::new();
        for e in fs::read_dir(&self.root).with_context(|| format!("reading {}", self.root.display()))? {
            let name = e?.file_name();
            if let Some(n) = name.to_str().and_then(|n| n.strip_prefix("step-")).and_then(|n| n.parse().ok()) {
                steps.push(n);
            }
        }
        steps.sort();
        Ok(steps)
    }

    pub fn latest(&self) -> Result<Option<u64>> {
        Ok(self.steps()?.last().copied())
    }

    /// Starts writing the checkpoint of `step` in a partial folder.
    pub fn begin(&self, step: u64) -> Result<PendingCheckpoint> {
        fs::create_dir_all(&self.root).with_context(|| format!("creating {}", self.root.display()))?;
        let dir = self.root.join(format!(".step-{step}.partial-{}", std::process::id()));
        if dir.exists() {
            fs::remove_dir_all(&dir)?;
        }
        fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(PendingCheckpoint { dir, final_dir: self.step_dir(step), step, files: BTreeMap::new() })
    }

    /// Opens a committed checkpoint after checking every file against its manifest.
    pub fn open(&self, step: u64) -> Result<CheckpointReader> {
        let dir = self.step_dir(step);
        let mpath = dir.join(MANIFEST);
        let text = fs::read_to_string(&mpath)
            .with_context(|| format!("checkpoint {} has no readable {MANIFEST}", dir.display()))?;
        let m: Manifest = serde_json::from_str(&text)
            .with_context(|| format!("{} is corrupt (not a titan-rs manifest)", mpath.display()))?;
        if m.format != FORMAT || m.step != step {
            bail!("{}: format {:?} step {} (expected {FORMAT} step {step})", mpath.display(), m.format, m.step);
        }
        for (name, entry) in &m.files {
            let p = dir.join(name);
            let len = fs::metadata(&p).with_context(|| format!("checkpoint file {} is missing", p.display()))?.len();
            if len != entry.bytes {
                bail!(
                    "checkpoint file {} is truncated or altered: {len} bytes, manifest says {}",
                    p.display(),
                    entry.bytes
                );
            }
            if let Some(crc) = entry.crc32 {
                let bytes = fs::read(&p).with_context(|| format!("reading {}", p.display()))?;
                if crc32fast::hash(&bytes) != crc {
                    bail!("checkpoint file {} is corrupt: CRC32 does not match the manifest", p.display());
                }
            }
        }
        Ok(CheckpointReader { dir, files: m.files.into_keys().collect() })
    }

    /// Deletes every checkpoint after step `step` (a rollback to it).
    pub fn discard_after(&self, step: u64) -> Result<()> {
        for s in self.steps()?.into_iter().filter(|&s| s > step) {
            self.discard(&self.step_dir(s)).with_context(|| format!("removing checkpoint step-{s} after a rollback"))?;
        }
        Ok(())
    }

    /// Deletes all but the newest `k` checkpoints (`k == 0` keeps all) and stale partial folders.
    pub fn prune(&self, keep_latest_k: usize) -> Result<()> {
        if let Ok(entries) = fs::read_dir(&self.root) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with(".step-") && !is_ours(&name) {
                    let _ = fs::remove_dir_all(e.path());
                }
            }
        }
        if keep_latest_k == 0 {
            return Ok(());
        }
        let steps = self.steps()?;
        for s in steps.iter().take(steps.len().saturating_sub(keep_latest_k)) {
            self.discard(&self.step_dir(*s)).with_context(|| format!("removing old checkpoint step-{s}"))?;
        }
        Ok(())
    }
}

pub struct PendingCheckpoint {
    dir: PathBuf,
    final_dir: PathBuf,
    step: u64,
    files: BTreeMap<String, FileEntry>,
}

impl PendingCheckpoint {
    pub fn write(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        let p = self.dir.join(name);
        let mut f = fs::File::create(&p).with_context(|| format!("creating {}", p.display()))?;
        f.write_all(bytes).with_context(|| format!("writing {}", p.display()))?;
        f.sync_all()?;
        self.add_file(name, bytes.len() as u64, Some(crc32fast::hash(bytes)));
        Ok(())
    }

    /// The partial folder (other ranks write their files into it).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Records a file another writer put into the folder (already flushed to disk).
    pub fn add_file(&mut self, name: &str, bytes: u64, crc32: Option<u32>) {
        self.files.insert(name.to_string(), FileEntry { bytes, crc32 });
    }

    /// Writes the manifest and renames the folder into place. An existing `step-N` (from an
    /// earlier run) is replaced only after the new one is complete.
    pub fn commit(mut self) -> Result<PathBuf> {
        let files = std::mem::take(&mut self.files);
        let m = Manifest { format: FORMAT.into(), step: self.step, files };
        self.write(MANIFEST, serde_json::to_string_pretty(&m)?.as_bytes())?;
        if self.final_dir.exists() {
            // Swap the new folder and the old `step-N` in one atomic rename, so that a crash
            // at any moment leaves one complete `step-N`; the old one is then under the partial
            // name and removed with it.
            exchange(&self.dir, &self.final_dir)
                .with_context(|| format!("replacing {} with {}", self.final_dir.display(), self.dir.display()))?;
            fs::remove_dir_all(&self.dir)?;
        } else {
            fs::rename(&self.dir, &self.final_dir)
                .with_context(|| format!("renaming {} to {}", self.dir.display(), self.final_dir.display()))?;
        }
        if let Some(parent) = self.final_dir.parent() {
            if let Ok(d) = fs::File::open(parent) {
                let _ = d.sync_all();
            }
        }
        Ok(self.final_dir.clone())
    }
}

/// Atomically exchanges two paths (Linux `renameat2(RENAME_EXCHANGE)`).
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(std::io::Error::other);
    let (a, b) = (c(a)?, c(b)?);
    // SAFETY: two valid NUL-terminated paths; the call only renames.
    let r = unsafe {
        libc::syscall(libc::SYS_renameat2, libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), libc::RENAME_EXCHANGE)
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

impl Drop for PendingCheckpoint {
    fn drop(&mut self) {
        // Not committed (error path): leave no partial folder behind.
        if self.dir.exists() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

pub struct CheckpointReader {
    dir: PathBuf,
    files: Vec<String>,
}

impl CheckpointReader {
    pub fn has(&self, name: &str) -> bool {
        self.files.iter().any(|f| f == name)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn read(&self, name: &str) -> Result<Vec<u8>> {
        if !self.files.iter().any(|f| f == name) {
            bail!("checkpoint {} has no {name}", self.dir.display());
        }
        let p = self.dir.join(name);
        fs::read(&p).with_context(|| format!("reading {}", p.display()))
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(f: &CheckpointFolder, step: u64, body: &[u8]) {
        let mut p = f.begin(step).unwrap();
        p.write("a.bin", body).unwrap();
        p.commit().unwrap();
    }

    #[test]
    fn commit_list_open_prune() {
        let d = tempfile::tempdir().unwrap();
        let f = CheckpointFolder::new(d.path().join("checkpoint"));
        assert_eq!(f.latest().unwrap(), None);
        for s in [5, 10, 15] {
            write(&f, s, format!("body{s}").as_bytes());
        }
        assert_eq!(f.steps().unwrap(), vec![5, 10, 15]);
        assert_eq!(f.open(10).unwrap().read("a.bin").unwrap(), b"body10");
        f.prune(2).unwrap();
        assert_eq!(f.steps().unwrap(), vec![10, 15]);
        write(&f, 15, b"again");
        assert_eq!(f.open(15).unwrap().read("a.bin").unwrap(), b"again");
    }

    #[test]
    fn uncommitted_checkpoint_leaves_nothing() {
        let d = tempfile::tempdir().unwrap();
        let f = CheckpointFolder::new(d.path());
        write(&f, 1, b"good");
        {
            let mut p = f.begin(2).unwrap();
            p.write("a.bin", b"half").unwrap();
            // dropped without commit: a failed save
        }
        assert_eq!(f.steps().unwrap(), vec![1]);
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 1);
    }

    #[test]
    fn truncated_or_corrupt_files_are_named() {
        let d = tempfile::tempdir().unwrap();
        let f = CheckpointFolder::new(d.path());
        write(&f, 3, b"0123456789");
        let p = f.step_dir(3).join("a.bin");
        fs::write(&p, b"01234").unwrap();
        let e = f.open(3).err().unwrap().to_string();
        assert!(e.contains("a.bin") && e.contains("truncated"), "{e}");
        fs::write(&p, b"0123456788").unwrap();
        let e = f.open(3).err().unwrap().to_string();
        assert!(e.contains("a.bin") && e.contains("CRC32"), "{e}");
        fs::write(f.step_dir(3).join(MANIFEST), b"{").unwrap();
        let e = format!("{:#}", f.open(3).err().unwrap());
        assert!(e.contains("manifest.json") && e.contains("corrupt"), "{e}");
    }
}
