//! HuggingFace `tokenizer.json` loading and byte-level BPE training (the `tokenizers` crate).

use anyhow::{anyhow, Context, Result};
use std::path::{Path, PathBuf};
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::AddedToken;

/// End-of-sequence tokens we recognise, in order of preference.
const EOS_CANDIDATES: &[&str] = &["<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"];

/// The special token `titan-rs tokenizer train` adds.
pub const EOS_TOKEN: &str = "<|endoftext|>";

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    eos_id: u32,
    path: PathBuf,
}

impl Tokenizer {
    pub fn from_file(path: &Path) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| {
            anyhow!("cannot load tokenizer {}: {e} (make one with `titan-rs tokenizer train`)", path.display())
        })?;
        let eos_id = EOS_CANDIDATES.iter().find_map(|t| inner.token_to_id(t)).ok_or_else(|| {
            anyhow!("tokenizer {} has no end-of-text token (one of {EOS_CANDIDATES:?})", path.display())
        })?;
        Ok(Self { inner, eos_id, path: path.to_path_buf() })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn eos_id(&self) -> u32 {
        self.eos_id
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.inner.encode(text, false).map_err(|e| anyhow!("tokenizer: {e}"))?.get_ids().to_vec())
    }

    /// Encodes many texts in parallel (rayon inside `tokenizers`); order is preserved.
    pub fn encode_batch(&self, texts: Vec<&str>) -> Result<Vec<Vec<u32>>> {
        let enc = self.inner.encode_batch(texts, false).map_err(|e| anyhow!("tokenizer: {e}"))?;
        Ok(enc.iter().map(|e| e.get_ids().to_vec()).collect())
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, false).map_err(|e| anyhow!("tokenizer: {e}"))
    }
}

/// Trains a byte-level BPE tokenizer (GPT-2/Llama-3 style, no prefix space) on text files and
/// writes it as `tokenizer.json`. The vocabulary includes the 256 byte symbols and `<|endoftext|>`.
pub fn train_bpe(inputs: &[PathBuf], vocab_size: usize, out: &Path) -> Result<usize> {
    if vocab_size < 300 {
        anyhow::bail!("--vocab-size {vocab_size} is too small: byte-level BPE needs at least 300 (256 bytes + merges)");
    }
    let files: Vec<String> = inputs.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .show_progress(false)
        .vocab_size(vocab_size)
        .min_frequency(2)
        .special_tokens(vec![AddedToken::from(EOS_TOKEN, true)])
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build()
        .into();
    let byte_level = ByteLevel::new(false, true, true);
    let mut tok = tokenizers::Tokenizer::new(BPE::default());
    tok.with_pre_tokenizer(Some(byte_level));
    tok.with_decoder(Some(byte_level));
    tok.with_post_processor(Some(byte_level));
    tok.train_from_files(&mut trainer, files).map_err(|e| anyhow!("training the tokenizer: {e}"))?;
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    tok.save(out, false).map_err(|e| anyhow!("writing {}: {e}", out.display()))?;
    Ok(tok.get_vocab_size(true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn train_then_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("t.txt");
        let body = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n".repeat(50);
        std::fs::write(&text, &body).unwrap();
        let out = dir.path().join("tok/tokenizer.json");
        let n = train_bpe(&[text], 400, &out).unwrap();
        assert!(n <= 400 && n > 257, "vocab {n}");
        let tok = Tokenizer::from_file(&out).unwrap();
        for s in ["To be, or not to be", "  odd   spacing\n\nand ünïcödé ✓", ""] {
            let ids = tok.encode(s).unwrap();
            assert_eq!(tok.decode(&ids).unwrap(), s);
        }
        // Merges were learned: the repeated text compresses well below one token per byte.
        assert!(tok.encode(&body).unwrap().len() * 3 < body.len());
        assert_eq!(tok.eos_id(), tok.inner.token_to_id(EOS_TOKEN).unwrap());
    }

    #[test]
    fn missing_tokenizer_is_a_clear_error() {
        let e = Tokenizer::from_file(Path::new("/nonexistent/tokenizer.json")).err().unwrap().to_string();
        assert!(e.contains("/nonexistent/tokenizer.json") && e.contains("tokenizer train"), "{e}");
    }
}
