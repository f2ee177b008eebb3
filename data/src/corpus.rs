//! Corpus files → one cached token file (documents joined with EOS), streamed.
//!
//! A corpus is a file, a folder (searched recursively) or a glob (`data/*.jsonl.gz`) of the
//! formats in [`crate::formats`]. It is tokenized once, in bounded memory: pieces of text are
//! batched (≈ 1 MB), encoded in parallel (the tokenizers crate's batch encoding on rayon) and
//! appended to a temporary token file that is renamed into place only when complete, so an
//! interrupted run (even kill -9) never leaves a cache a later run trusts. The cache key hashes
//! the tokenizer, every input's name and bytes, and the options.

use crate::formats::{accepted_extensions, for_each_piece, for_each_token_block, format_of, Format, TokenDtype};
use crate::token_file::{TokenFile, TokenWriter};
use crate::tokenizer::Tokenizer;
use anyhow::{bail, Context, Result};
use std::hash::Hasher;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Text bytes encoded per batch.
const BATCH_BYTES: usize = 1 << 20;

/// How corpus files are read.
#[derive(Debug, Clone, PartialEq)]
pub struct CorpusOptions {
    /// The JSON field holding a document's text.
    pub text_column: String,
    /// The id type of pre-tokenized `.bin` files.
    pub token_dtype: TokenDtype,
}

impl Default for CorpusOptions {
    fn default() -> Self {
        Self { text_column: "text".into(), token_dtype: TokenDtype::U16 }
    }
}

/// `*` and `?` wildcards in one path component.
fn wildcard(pattern: &[u8], name: &[u8]) -> bool {
    match (pattern.first(), name.first()) {
        (None, None) => true,
        (Some(b'*'), _) => wildcard(&pattern[1..], name) || (!name.is_empty() && wildcard(pattern, &name[1..])),
        (Some(b'?'), Some(_)) => wildcard(&pattern[1..], &name[1..]),
        (Some(p), Some(n)) if p == n => wildcard(&pattern[1..], &name[1..]),
        _ => false,
    }
}

/// The corpus files of `path` (a file, a folder, or a glob in its last component), sorted for a
/// stable order.
pub fn list_corpus_files(path: &Path) -> Result<Vec<PathBuf>> {
    if path.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if name.contains(['*', '?']) {
        let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
            .with_context(|| format!("dataset glob {}: cannot read {}", path.display(), dir.display()))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_file() && wildcard(name.as_bytes(), p.file_name().unwrap().as_encoded_bytes()))
            .collect();
        out.sort();
        if out.is_empty() {
            bail!("dataset glob {} matches no file", path.display());
        }
        if let Some(bad) = out.iter().find(|p| format_of(p).is_none()) {
            bail!(
                "dataset glob {} matches {}, which is not a corpus format ({})",
                path.display(),
                bad.display(),
                accepted_extensions()
            );
        }
        return Ok(out);
    }
    if !path.is_dir() {
        bail!("dataset path {} does not exist", path.display());
    }
    let mut out = Vec::new();
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
            } else if format_of(&p).is_some() {
                out.push(p);
            }
        }
    }
    out.sort();
    if out.is_empty() {
        bail!("dataset folder {} holds no corpus files ({})", path.display(), accepted_extensions());
    }
    Ok(out)
}

fn cache_key(files: &[PathBuf], tokenizer: &Tokenizer, o: &CorpusOptions) -> Result<u64> {
    let mut h = fnv::FnvHasher::default();
    h.write(b"titan-rs token cache v2");
    h.write(&std::fs::read(tokenizer.path()).with_context(|| format!("reading {}", tokenizer.path().display()))?);
    // The options as they were spelled when the token dtype was a string (cached corpora keep
    // their keys).
    h.write(
        format!("CorpusOptions {{ text_column: {:?}, token_dtype: {:?} }}", o.text_column, o.token_dtype.as_str())
            .as_bytes(),
    );
    let mut buf = vec![0u8; 1 << 20];
    for f in files {
        h.write(f.file_name().map(|n| n.as_encoded_bytes()).unwrap_or_default());
        let mut r = std::fs::File::open(f).with_context(|| format!("cannot read corpus file {}", f.display()))?;
        loop {
            let n = r.read(&mut buf).with_context(|| format!("reading {}", f.display()))?;
            if n == 0 {
                break;
            }
            h.write(&buf[..n]);
        }
    }
    Ok(h.finish())
}

/// Pieces waiting to be encoded, and the token file they go to.
struct Sink<'a> {
    w: TokenWriter,
    batch: Vec<(String, bool)>,
    bytes: usize,
    tokenizer: &'a Tokenizer,
}

impl Sink<'_> {
    fn piece(&mut self, text: String, last: bool) -> Result<()> {
        self.bytes += text.len();
        self.batch.push((text, last));
        if self.bytes >= BATCH_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        let texts: Vec<&str> = self.batch.iter().map(|(t, _)| t.as_str()).collect();
        let encoded = self.tokenizer.encode_batch(texts)?;
        let eos = self.tokenizer.eos_id();
        for ((_, last), ids) in self.batch.iter().zip(encoded) {
            self.w.push(&ids)?;
            if *last {
                self.w.push(&[eos])?;
            }
        }
        self.batch.clear();
        self.bytes = 0;
        Ok(())
    }
}

/// Tokenizes the corpus at `path` into `cache_dir` (or reuses the cached file).
pub fn tokenize_corpus(path: &Path, tokenizer: &Tokenizer, cache_dir: &Path) -> Result<TokenFile> {
    tokenize_corpus_with(path, tokenizer, cache_dir, &CorpusOptions::default())
}

/// [`tokenize_corpus`] with reading options.
pub fn tokenize_corpus_with(
    path: &Path,
    tokenizer: &Tokenizer,
    cache_dir: &Path,
    o: &CorpusOptions,
) -> Result<TokenFile> {
    Ok(tokenize_or_reuse(path, tokenizer, cache_dir, o)?.0)
}

/// The cached token file when it exists and is whole.
fn reuse(cached: &Path) -> Option<TokenFile> {
    if !cached.exists() {
        return None;
    }
    match TokenFile::open(cached) {
        Ok(f) => {
            tracing::info!("reusing tokenized corpus {} ({} tokens)", cached.display(), f.len());
            Some(f)
        }
        Err(_) => {
            tracing::warn!("cached token file {} is damaged; rebuilding", cached.display());
            None
        }
    }
}

/// The corpus's token file, and whether this call tokenized it (rather than reusing the cache).
/// Callers that need the same cache entry at once — the ranks of a job, threads or processes on
/// one host — take turns on a lock file beside it: the first tokenizes, the others then reuse.
fn tokenize_or_reuse(
    path: &Path,
    tokenizer: &Tokenizer,
    cache_dir: &Path,
    o: &CorpusOptions,
) -> Result<(TokenFile, bool)> {
    let files = list_corpus_files(path)?;
    let key = cache_key(&files, tokenizer, o)?;
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("corpus").replace(['*', '?'], "_");
    let cached = cache_dir.join(format!("{stem}-{key:016x}.tokens"));
    if let Some(f) = reuse(&cached) {
        return Ok((f, false));
    }
    std::fs::create_dir_all(cache_dir).with_context(|| format!("creating cache folder {}", cache_dir.display()))?;
    let lock_path = cached.with_extension("tokens.lock");
    let lock = std::fs::File::create(&lock_path).with_context(|| format!("creating {}", lock_path.display()))?;
    // Released when `lock` is dropped or the process dies (a killed tokenizer blocks nobody).
    lock.lock().with_context(|| format!("locking {}", lock_path.display()))?;
    if let Some(f) = reuse(&cached) {
        return Ok((f, false));
    }
    let total: u64 = files.iter().filter_map(|f| std::fs::metadata(f).ok()).map(|m| m.len()).sum();
    let bar = indicatif::ProgressBar::new(total);
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("tokenizing [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {msg}")
    {
        bar.set_style(style);
    }
    let counter = Arc::new(AtomicU64::new(0));
    let start = std::time::Instant::now();
    let mut sink = Sink { w: TokenWriter::create(&cached)?, batch: Vec::new(), bytes: 0, tokenizer };
    for f in &files {
        match format_of(f).unwrap_or(Format::Text) {
            Format::Tokens => {
                sink.flush()?;
                let vocab = tokenizer.vocab_size();
                for_each_token_block(f, o.token_dtype, vocab, &counter, &mut |b| sink.w.push(b))?;
            }
            format => for_each_piece(f, format, &o.text_column, &counter, &mut |p, last| {
                let r = sink.piece(p, last);
                bar.set_position(counter.load(Ordering::Relaxed));
                let secs = start.elapsed().as_secs_f64().max(1e-9);
                bar.set_message(format!("{:.0} tokens/s", sink.w.len() as f64 / secs));
                r
            })?,
        }
    }
    sink.flush()?;
    bar.finish_and_clear();
    let n = sink.w.len();
    sink.w.finish()?;
    let secs = start.elapsed().as_secs_f64();
    tracing::info!(
        "tokenized {} ({} files, {:.1} MB) into {n} tokens at {} in {secs:.1} s ({:.1} MB/s, {:.0} tokens/s)",
        path.display(),
        files.len(),
        total as f64 / 1e6,
        cached.display(),
        total as f64 / 1e6 / secs,
        n as f64 / secs
    );
    Ok((TokenFile::open(&cached)?, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folders_and_globs_list_corpus_files() {
        let dir = tempfile::tempdir().unwrap();
        for f in ["a.jsonl", "b.jsonl.gz", "c.txt", "notes.csv"] {
            std::fs::write(dir.path().join(f), "").unwrap();
        }
        let all = list_corpus_files(dir.path()).unwrap();
        assert_eq!(all.len(), 3);
        let g = list_corpus_files(&dir.path().join("*.jsonl*")).unwrap();
        assert_eq!(
            g.iter().map(|p| p.file_name().unwrap().to_str().unwrap()).collect::<Vec<_>>(),
            vec!["a.jsonl", "b.jsonl.gz"]
        );
        let e = list_corpus_files(&dir.path().join("*.parquet")).unwrap_err().to_string();
        assert!(e.contains("matches no file"), "{e}");
        let e = list_corpus_files(&dir.path().join("*")).unwrap_err().to_string();
        assert!(e.contains("notes.csv"), "{e}");
        // The accepted formats in the message are the reader's own table: Parquet included.
        for (ext, _) in crate::formats::FORMATS {
            assert!(e.contains(ext), "{ext} missing from: {e}");
        }
        assert!(e.contains(".parquet"), "{e}");
        let empty = tempfile::tempdir().unwrap();
        std::fs::write(empty.path().join("notes.csv"), "").unwrap();
        let e = list_corpus_files(empty.path()).unwrap_err().to_string();
        assert!(e.contains("holds no corpus files") && e.contains(".parquet") && e.contains(".jsonl.zst"), "{e}");
    }

    /// Four ranks (threads here; processes take the same file lock) asking for the same corpus
    /// at once: exactly one tokenizes, the others wait and reuse its file.
    #[test]
    fn concurrent_callers_tokenize_once() {
        let dir = tempfile::tempdir().unwrap();
        let corpus = dir.path().join("c.jsonl");
        let body: String = (0..2000).map(|i| format!("{{\"text\": \"document {i} about {}\"}}\n", i * 7)).collect();
        std::fs::write(&corpus, body).unwrap();
        let tok =
            Tokenizer::from_file(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/tokenizer/tokenizer.json"))
                .unwrap();
        let cache = dir.path().join("cache");
        let results: Vec<(Vec<i64>, bool)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        let (f, built) = tokenize_or_reuse(&corpus, &tok, &cache, &CorpusOptions::default()).unwrap();
                        (f.window(0, f.len()).collect(), built)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(results.iter().filter(|(_, built)| *built).count(), 1, "exactly one caller tokenizes");
        assert!(results[0].0.len() > 10_000);
        assert!(results.iter().all(|(ids, _)| *ids == results[0].0));
    }
}
