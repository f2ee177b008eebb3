//! Corpus files → documents → one cached token file (documents joined with EOS).
//!
//! A corpus is a plain-text or JSONL file, or a folder of them (`.txt`, `.md`: one document per
//! file; `.jsonl`: one document per line, `text` field). It is tokenized once; the cache key hashes
//! the tokenizer and every input's name and bytes, so an unchanged corpus is reused and a changed
//! one rebuilt.

use crate::token_file::TokenFile;
use crate::tokenizer::Tokenizer;
use anyhow::{bail, Context, Result};
use std::hash::Hasher;
use std::path::{Path, PathBuf};

const TEXT_EXTS: &[&str] = &["txt", "md", "text"];
const JSONL_EXTS: &[&str] = &["jsonl", "json"];
/// Texts are encoded in pieces of about this many bytes, cut after a newline, in parallel.
const PIECE: usize = 1 << 16;

/// The corpus files under `path` (itself if a file), sorted for a stable order.
pub fn list_corpus_files(path: &Path) -> Result<Vec<PathBuf>> {
    if path.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    if !path.is_dir() {
        bail!("dataset path {} does not exist", path.display());
    }
    let mut out = Vec::new();
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let p = e?.path();
            let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("");
            if p.is_dir() {
                stack.push(p);
            } else if TEXT_EXTS.contains(&ext) || JSONL_EXTS.contains(&ext) {
                out.push(p);
            }
        }
    }
    out.sort();
    if out.is_empty() {
        bail!("dataset folder {} holds no .txt/.md/.jsonl files", path.display());
    }
    Ok(out)
}

fn read_documents(path: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    if !JSONL_EXTS.contains(&ext) {
        return Ok(vec![text]);
    }
    let mut docs = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let v: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("{}:{}: not valid JSON", path.display(), i + 1))?;
        match v.get("text").and_then(|t| t.as_str()) {
            Some(t) => docs.push(t.to_string()),
            None => bail!("{}:{}: no string field \"text\"", path.display(), i + 1),
        }
    }
    Ok(docs)
}

/// Splits after newlines that are followed by a non-space, so pieces tokenize as the whole does
/// under byte-level pre-tokenization.
fn pieces(doc: &str) -> Vec<&str> {
    let bytes = doc.as_bytes();
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = PIECE;
    while i < bytes.len() {
        if bytes[i - 1] == b'\n' && !bytes[i].is_ascii_whitespace() && doc.is_char_boundary(i) {
            out.push(&doc[start..i]);
            start = i;
            i += PIECE;
        } else {
            i += 1;
        }
    }
    out.push(&doc[start..]);
    out
}

fn cache_key(files: &[PathBuf], tokenizer: &Tokenizer) -> Result<u64> {
    let mut h = fnv::FnvHasher::default();
    h.write(b"titan-rs token cache v1");
    h.write(&std::fs::read(tokenizer.path()).with_context(|| format!("reading {}", tokenizer.path().display()))?);
    for f in files {
        h.write(f.file_name().map(|n| n.as_encoded_bytes()).unwrap_or_default());
        h.write(&std::fs::read(f).with_context(|| format!("reading {}", f.display()))?);
    }
    Ok(h.finish())
}

/// Tokenizes the corpus at `path` into `cache_dir` (or reuses the cached file).
pub fn tokenize_corpus(path: &Path, tokenizer: &Tokenizer, cache_dir: &Path) -> Result<TokenFile> {
    let files = list_corpus_files(path)?;
    let key = cache_key(&files, tokenizer)?;
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("corpus");
    let cached = cache_dir.join(format!("{stem}-{key:016x}.tokens"));
    if cached.exists() {
        if let Ok(f) = TokenFile::open(&cached) {
            tracing::info!("reusing tokenized corpus {} ({} tokens)", cached.display(), f.len());
            return Ok(f);
        }
        tracing::warn!("cached token file {} is damaged; rebuilding", cached.display());
    }
    std::fs::create_dir_all(cache_dir).with_context(|| format!("creating cache folder {}", cache_dir.display()))?;
    let mut tokens = Vec::new();
    for f in &files {
        for doc in read_documents(f)? {
            for ids in tokenizer.encode_batch(pieces(&doc))? {
                tokens.extend(ids);
            }
            tokens.push(tokenizer.eos_id());
        }
    }
    TokenFile::write(&cached, &tokens)?;
    tracing::info!(
        "tokenized {} ({} files) into {} tokens at {}",
        path.display(),
        files.len(),
        tokens.len(),
        cached.display()
    );
    TokenFile::open(&cached)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_the_document_in_order() {
        let doc = "line one\n  indented\nnext\n".repeat(20_000);
        let p = pieces(&doc);
        assert!(p.len() > 1);
        assert_eq!(p.concat(), doc);
        assert!(p[1..].iter().all(|s| !s.starts_with(' ')));
    }

    #[test]
    fn jsonl_documents_and_errors_name_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("a.jsonl");
        std::fs::write(&good, "{\"text\": \"one\"}\n\n{\"text\": \"two\", \"id\": 3}\n").unwrap();
        assert_eq!(read_documents(&good).unwrap(), vec!["one", "two"]);
        let bad = dir.path().join("b.jsonl");
        std::fs::write(&bad, "{\"text\": \"one\"}\n{\"body\": 1}\n").unwrap();
        let e = format!("{:#}", read_documents(&bad).err().unwrap());
        assert!(e.contains("b.jsonl:2") && e.contains("\"text\""), "{e}");
        let files = list_corpus_files(dir.path()).unwrap();
        assert_eq!(files, vec![good, bad]);
    }
}
