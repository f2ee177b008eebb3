//! Corpus file formats, read as a stream of text pieces (bounded memory whatever the size):
//!
//! * `.txt`, `.md`, `.text`: one document per file;
//! * `.jsonl`, `.json` (one JSON object per line), also gzip (`.jsonl.gz`) and zstd
//!   (`.jsonl.zst`) compressed: one document per line, in the configured text field;
//! * `.parquet` (the layout of HF datasets and the FineWeb/C4 dumps): one document per row of
//!   the configured text column, read in record batches with only that column decoded;
//! * `.bin`: pre-tokenized ids (nanoGPT's flat little-endian `uint16`, or `uint32`), no text.
//!
//! Texts are cut into pieces of about [`PIECE`] bytes after a newline followed by a non-space,
//! so pieces tokenize exactly as the whole does under byte-level pre-tokenization. Text without
//! such a line break in [`LONG`] bytes (one huge line) is cut before a space that follows a
//! non-space — a word boundary, also exact for the GPT-2 and Llama-3 pre-tokenizers — and only
//! text with no whitespace at all at a character boundary, so memory stays bounded.

use anyhow::{bail, Context, Result};
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Texts are encoded in pieces of about this many bytes.
pub const PIECE: usize = 1 << 16;
/// Text with no line-break cut point in this many bytes is cut at a word boundary instead.
pub const LONG: usize = 16 * PIECE;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    Jsonl(Compression),
    Parquet,
    Tokens,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

/// The id type of pre-tokenized `.bin` files (`training.dataset_token_dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum TokenDtype {
    /// nanoGPT's layout.
    #[serde(rename = "uint16")]
    U16,
    #[serde(rename = "uint32")]
    U32,
}

impl TokenDtype {
    pub const ALL: &'static [TokenDtype] = &[TokenDtype::U16, TokenDtype::U32];

    /// The value as written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenDtype::U16 => "uint16",
            TokenDtype::U32 => "uint32",
        }
    }

    /// Bytes per id.
    pub fn width(self) -> usize {
        match self {
            TokenDtype::U16 => 2,
            TokenDtype::U32 => 4,
        }
    }
}

impl std::fmt::Display for TokenDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for TokenDtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL.iter().copied().find(|d| d.as_str() == s).ok_or_else(|| {
            format!("`training.dataset_token_dtype` = {s:?} is not supported; use \"uint16\" or \"uint32\"")
        })
    }
}

/// Every corpus format by file-name ending (matched case-insensitively): the one table that
/// `format_of` and every error listing the accepted formats read.
pub const FORMATS: &[(&str, Format)] = &[
    (".txt", Format::Text),
    (".md", Format::Text),
    (".text", Format::Text),
    (".jsonl", Format::Jsonl(Compression::None)),
    (".json", Format::Jsonl(Compression::None)),
    (".jsonl.gz", Format::Jsonl(Compression::Gzip)),
    (".json.gz", Format::Jsonl(Compression::Gzip)),
    (".jsonl.zst", Format::Jsonl(Compression::Zstd)),
    (".jsonl.zstd", Format::Jsonl(Compression::Zstd)),
    (".json.zst", Format::Jsonl(Compression::Zstd)),
    (".parquet", Format::Parquet),
    (".bin", Format::Tokens),
];

/// The accepted endings, space-separated, for error messages.
pub fn accepted_extensions() -> String {
    FORMATS.iter().map(|(e, _)| *e).collect::<Vec<_>>().join(" ")
}

/// The format of a corpus file by its name, `None` for a file that is not one.
pub fn format_of(path: &Path) -> Option<Format> {
    let name = path.file_name()?.to_str()?.to_ascii_lowercase();
    FORMATS.iter().find(|(e, _)| name.ends_with(e)).map(|&(_, f)| f)
}

/// A reader that counts the bytes read from the file (for progress: compressed bytes).
pub struct Counted<R> {
    inner: R,
    pub read: Arc<AtomicU64>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

fn open(path: &Path, counter: &Arc<AtomicU64>) -> Result<Counted<File>> {
    let f = File::open(path).with_context(|| format!("cannot read corpus file {}", path.display()))?;
    Ok(Counted { inner: f, read: counter.clone() })
}

/// The first cut point at or after `PIECE` in `buf` (see the module doc), if any.
fn cut(buf: &[u8]) -> Option<usize> {
    let line = (PIECE.max(1)..buf.len()).find(|&i| buf[i - 1] == b'\n' && !buf[i].is_ascii_whitespace());
    if line.is_some() || buf.len() < LONG {
        return line;
    }
    (PIECE..buf.len())
        .find(|&i| buf[i] == b' ' && !buf[i - 1].is_ascii_whitespace())
        .or_else(|| (LONG..buf.len()).find(|&i| buf[i] & 0xC0 != 0x80))
}

/// Splits one document into pieces, calling `each(piece, last)`.
fn pieces_of(doc: &str, each: &mut dyn FnMut(String, bool) -> Result<()>) -> Result<()> {
    let mut rest = doc;
    while let Some(i) = cut(rest.as_bytes()) {
        each(rest[..i].to_string(), false)?;
        rest = &rest[i..];
    }
    each(rest.to_string(), true)
}

/// Streams the text pieces of every document of the text file `path`: `each(piece, last piece
/// of its document)`. `counter` counts the file bytes read. Errors name the file (and line).
pub fn for_each_piece(
    path: &Path,
    format: Format,
    text_field: &str,
    counter: &Arc<AtomicU64>,
    each: &mut dyn FnMut(String, bool) -> Result<()>,
) -> Result<()> {
    let file = open(path, counter)?;
    match format {
        Format::Text => {
            let mut r = BufReader::with_capacity(1 << 20, file);
            let mut buf: Vec<u8> = Vec::new();
            let mut block = vec![0u8; 1 << 20];
            loop {
                let n = r.read(&mut block).with_context(|| format!("reading {}", path.display()))?;
                buf.extend_from_slice(&block[..n]);
                while let Some(i) = cut(&buf) {
                    let rest = buf.split_off(i);
                    let piece = String::from_utf8(std::mem::replace(&mut buf, rest))
                        .with_context(|| format!("{} is not UTF-8 text", path.display()))?;
                    each(piece, false)?;
                }
                if n == 0 {
                    let piece =
                        String::from_utf8(buf).with_context(|| format!("{} is not UTF-8 text", path.display()))?;
                    return each(piece, true);
                }
            }
        }
        Format::Jsonl(c) => {
            let reader: Box<dyn Read> = match c {
                Compression::None => Box::new(file),
                Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(file)),
                Compression::Zstd => {
                    Box::new(zstd::Decoder::new(file).with_context(|| format!("{}: not zstd data", path.display()))?)
                }
            };
            let what = match c {
                Compression::None => "",
                Compression::Gzip => " (corrupt gzip data?)",
                Compression::Zstd => " (corrupt zstd data?)",
            };
            let mut r = BufReader::with_capacity(1 << 20, reader);
            let mut line = String::new();
            for n in 1.. {
                line.clear();
                if r.read_line(&mut line).with_context(|| format!("{}:{n}: cannot read{what}", path.display()))? == 0 {
                    return Ok(());
                }
                if line.trim().is_empty() {
                    continue;
                }
                let v: serde_json::Value =
                    serde_json::from_str(&line).with_context(|| format!("{}:{n}: not valid JSON", path.display()))?;
                match v.get(text_field).and_then(|t| t.as_str()) {
                    Some(t) => pieces_of(t, each)?,
                    None => bail!(
                        "{}:{n}: no string field {text_field:?} (set `training.dataset_text_column`)",
                        path.display()
                    ),
                }
            }
            unreachable!()
        }
        Format::Parquet => for_each_parquet_document(path, file, text_field, each),
        Format::Tokens => bail!("{} holds token ids, not text", path.display()),
    }
}

/// The documents of a Parquet file's `text_field` column (string or large string), in row
/// order; null rows are skipped.
fn for_each_parquet_document(
    path: &Path,
    file: Counted<File>,
    text_field: &str,
    each: &mut dyn FnMut(String, bool) -> Result<()>,
) -> Result<()> {
    use arrow_array::{Array, LargeStringArray, StringArray, StringViewArray};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::arrow::ProjectionMask;
    let (read, len) = (file.read.clone(), file.inner.metadata().map(|m| m.len()).unwrap_or(0));
    let b = ParquetRecordBatchReaderBuilder::try_new(file.inner)
        .with_context(|| format!("{} is not a readable Parquet file", path.display()))?;
    let schema = b.schema().clone();
    let Some(i) = schema.fields().iter().position(|f| f.name() == text_field) else {
        let cols: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        bail!("{}: no column {text_field:?} (columns: {cols:?}); set `training.dataset_text_column`", path.display());
    };
    let mask = ProjectionMask::roots(b.parquet_schema(), [i]);
    let reader =
        b.with_projection(mask).with_batch_size(1024).build().with_context(|| format!("reading {}", path.display()))?;
    let mut row = 0usize;
    for batch in reader {
        let batch = batch.with_context(|| format!("{}: corrupt Parquet data after row {row}", path.display()))?;
        let col = batch.column(0);
        let texts: Vec<Option<&str>> = if let Some(a) = col.as_any().downcast_ref::<StringArray>() {
            a.iter().collect()
        } else if let Some(a) = col.as_any().downcast_ref::<LargeStringArray>() {
            a.iter().collect()
        } else if let Some(a) = col.as_any().downcast_ref::<StringViewArray>() {
            a.iter().collect()
        } else {
            bail!("{}: column {text_field:?} has type {}, not text", path.display(), col.data_type());
        };
        for t in texts.into_iter().flatten() {
            pieces_of(t, each)?;
        }
        row += batch.num_rows();
    }
    // Progress: the Parquet reader reads the file itself; count it when done.
    read.fetch_add(len, Ordering::Relaxed);
    Ok(())
}

/// Streams the ids of a pre-tokenized `.bin` file (`uint16` or `uint32`, little-endian) in
/// blocks, checking each against `vocab`: `each(block)`.
pub fn for_each_token_block(
    path: &Path,
    dtype: TokenDtype,
    vocab: usize,
    counter: &Arc<AtomicU64>,
    each: &mut dyn FnMut(&[u32]) -> Result<()>,
) -> Result<()> {
    let width = dtype.width();
    let len = std::fs::metadata(path).with_context(|| format!("cannot read corpus file {}", path.display()))?.len();
    if len % width as u64 != 0 {
        bail!(
            "{}: {len} bytes is not a whole number of {dtype} ids (is `training.dataset_token_dtype` right?)",
            path.display()
        );
    }
    let mut r = BufReader::with_capacity(1 << 20, open(path, counter)?);
    let mut block = vec![0u8; width << 18];
    let mut ids = Vec::with_capacity(1 << 18);
    let mut pos = 0u64;
    loop {
        let mut filled = 0;
        while filled < block.len() {
            let n = r.read(&mut block[filled..]).with_context(|| format!("reading {}", path.display()))?;
            if n == 0 {
                break;
            }
            filled += n;
        }
        if filled == 0 {
            return Ok(());
        }
        ids.clear();
        for c in block[..filled].chunks_exact(width) {
            let id = if width == 2 {
                u16::from_le_bytes([c[0], c[1]]) as u32
            } else {
                u32::from_le_bytes(c.try_into().unwrap())
            };
            if id as usize >= vocab {
                bail!(
                    "{}: token id {id} at position {} is not below the vocabulary size {vocab}",
                    path.display(),
                    pos + ids.len() as u64
                );
            }
            ids.push(id);
        }
        pos += ids.len() as u64;
        each(&ids)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(path: &Path, f: Format) -> Result<Vec<(String, bool)>> {
        let mut out = Vec::new();
        for_each_piece(path, f, "text", &Arc::new(AtomicU64::new(0)), &mut |p, last| {
            out.push((p, last));
            Ok(())
        })?;
        Ok(out)
    }

    /// One 3 MB line (no line breaks) is cut at word boundaries into bounded pieces that
    /// tokenize exactly as the whole line; text without whitespace is cut at characters.
    #[test]
    fn a_text_without_line_breaks_is_cut_at_words() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("line.txt");
        let words = ["alpha", "beta,", "gamma", "δέλτα", "123", "e.g.", "x"];
        let doc: String = (0..420_000).map(|i| words[i * 7 % 11 % words.len()]).collect::<Vec<_>>().join(" ");
        std::fs::write(&p, &doc).unwrap();
        let got = collect(&p, Format::Text).unwrap();
        assert!(got.len() >= 3, "{} pieces", got.len());
        assert!(got.iter().all(|(s, _)| s.len() <= LONG + (1 << 20)), "a piece is unbounded");
        assert_eq!(got.iter().map(|x| x.0.as_str()).collect::<String>(), doc);
        let tok = crate::Tokenizer::from_file(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/tokenizer/tokenizer.json"),
        )
        .unwrap();
        let pieces: Vec<u32> = got.iter().flat_map(|(s, _)| tok.encode(s).unwrap()).collect();
        assert_eq!(pieces, tok.encode(&doc).unwrap(), "pieces tokenize differently from the whole");
        let q = d.path().join("blob.txt");
        let blob = "é".repeat(2 * LONG);
        std::fs::write(&q, &blob).unwrap();
        let got = collect(&q, Format::Text).unwrap();
        assert!(got.len() >= 2 && got.iter().map(|x| x.0.as_str()).collect::<String>() == blob);
    }

    #[test]
    fn text_pieces_cover_the_file_and_cut_before_a_non_space() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a.txt");
        let doc = "line one\n  indented\nnext\n".repeat(20_000);
        std::fs::write(&p, &doc).unwrap();
        let got = collect(&p, Format::Text).unwrap();
        assert!(got.len() > 1);
        assert_eq!(got.iter().map(|x| x.0.as_str()).collect::<String>(), doc);
        assert!(got[1..].iter().all(|(s, _)| !s.starts_with(' ')));
        assert_eq!(got.iter().filter(|x| x.1).count(), 1);
    }

    #[test]
    fn compressed_jsonl_reads_like_plain_and_errors_name_file_and_line() {
        use std::io::Write;
        let d = tempfile::tempdir().unwrap();
        let body = "{\"text\": \"one\"}\n\n{\"text\": \"two\", \"id\": 3}\n";
        let gz = d.path().join("a.jsonl.gz");
        let mut e = flate2::write::GzEncoder::new(std::fs::File::create(&gz).unwrap(), flate2::Compression::default());
        e.write_all(body.as_bytes()).unwrap();
        e.finish().unwrap();
        let zst = d.path().join("a.jsonl.zst");
        std::fs::write(&zst, zstd::encode_all(body.as_bytes(), 3).unwrap()).unwrap();
        for p in [&gz, &zst] {
            let f = format_of(p).unwrap();
            let docs: Vec<String> = collect(p, f).unwrap().into_iter().map(|x| x.0).collect();
            assert_eq!(docs, vec!["one", "two"]);
        }
        let mut bytes = std::fs::read(&gz).unwrap();
        let n = bytes.len();
        bytes[n / 2] ^= 0xff;
        bytes.truncate(n - 4);
        let bad = d.path().join("bad.jsonl.gz");
        std::fs::write(&bad, &bytes).unwrap();
        let e = format!("{:#}", collect(&bad, format_of(&bad).unwrap()).unwrap_err());
        assert!(e.contains("bad.jsonl.gz"), "{e}");
        let nofield = d.path().join("c.jsonl");
        std::fs::write(&nofield, "{\"text\": \"ok\"}\n{\"body\": 1}\n").unwrap();
        let e = format!("{:#}", collect(&nofield, format_of(&nofield).unwrap()).unwrap_err());
        assert!(e.contains("c.jsonl:2") && e.contains("\"text\""), "{e}");
    }

    #[test]
    fn token_files_are_checked_against_the_vocabulary() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t.bin");
        let ids: Vec<u8> = [1u16, 2, 300, 4].iter().flat_map(|x| x.to_le_bytes()).collect();
        std::fs::write(&p, &ids).unwrap();
        let c = Arc::new(AtomicU64::new(0));
        let mut got = Vec::new();
        for_each_token_block(&p, TokenDtype::U16, 2048, &c, &mut |b| {
            got.extend_from_slice(b);
            Ok(())
        })
        .unwrap();
        assert_eq!(got, vec![1, 2, 300, 4]);
        let e = for_each_token_block(&p, TokenDtype::U16, 256, &c, &mut |_| Ok(())).unwrap_err().to_string();
        assert!(e.contains("t.bin") && e.contains("300") && e.contains("position 2"), "{e}");
        let e = for_each_token_block(&p, TokenDtype::U32, 2048, &c, &mut |_| Ok(())).unwrap_err().to_string();
        assert!(e.contains("t.bin"), "{e}");
        std::fs::write(&p, [1u8, 2, 3]).unwrap();
        let e = for_each_token_block(&p, TokenDtype::U16, 2048, &c, &mut |_| Ok(())).unwrap_err().to_string();
        assert!(e.contains("whole number"), "{e}");
    }
}
