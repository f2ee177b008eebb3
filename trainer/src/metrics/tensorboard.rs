//! TensorBoard event files (`metrics.enable_tensorboard`), written the way TensorFlow's
//! `EventsWriter` does: a first event with `file_version = "brain.Event:2"`, then one event per
//! step holding that step's scalars as `Summary.Value.simple_value`. Each event is a TFRecord:
//! `u64` length, masked CRC32C of the length, the protobuf bytes, masked CRC32C of the bytes.
//! The protobuf messages are `prost` derives of the three fields of `event.proto` and
//! `summary.proto` TensorBoard reads for scalars. [`read_scalars`] reads a file back, checking
//! every length and CRC (the tests use it; `scripts/check_tensorboard.py` checks the same files
//! with TensorBoard's own reader).

use anyhow::{bail, Context, Result};
use prost::Message;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// `tensorflow.Event`: wall time, step, and either the file version or a summary.
#[derive(Clone, PartialEq, Message)]
pub struct Event {
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    #[prost(int64, tag = "2")]
    pub step: i64,
    #[prost(string, optional, tag = "3")]
    pub file_version: Option<String>,
    #[prost(message, optional, tag = "5")]
    pub summary: Option<Summary>,
}

/// `tensorflow.Summary`.
#[derive(Clone, PartialEq, Message)]
pub struct Summary {
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<SummaryValue>,
}

/// `tensorflow.Summary.Value` with a scalar (`simple_value` is always written, even 0.0: it is
/// a `oneof` member in the schema, so its presence marks the value as a scalar).
#[derive(Clone, PartialEq, Message)]
pub struct SummaryValue {
    #[prost(string, tag = "1")]
    pub tag: String,
    #[prost(float, optional, tag = "2")]
    pub simple_value: Option<f32>,
}

/// TFRecord's CRC mask.
pub fn masked_crc32c(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

fn wall_time() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// Appends events to one `events.out.tfevents.*` file, flushed after each step so TensorBoard
/// shows a run while it trains.
pub struct EventWriter {
    file: File,
    path: PathBuf,
}

impl EventWriter {
    /// Creates a new event file in `dir` (made if missing).
    pub fn create(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating the TensorBoard folder {}", dir.display()))?;
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_else(|_| "localhost".into());
        let name = format!("events.out.tfevents.{}.{}.{}", wall_time() as u64, host.trim(), std::process::id());
        let path = dir.join(name);
        let file = File::options()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        let mut w = Self { file, path };
        w.write_event(&Event {
            wall_time: wall_time(),
            step: 0,
            file_version: Some("brain.Event:2".into()),
            summary: None,
        })?;
        Ok(w)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `scalars` (tag, value) for `step` as one event.
    pub fn scalars(&mut self, step: u64, scalars: &[(&str, f64)]) -> Result<()> {
        let value = scalars
            .iter()
            .filter(|(_, v)| v.is_finite())
            .map(|&(tag, v)| SummaryValue { tag: tag.to_string(), simple_value: Some(v as f32) })
            .collect();
        self.write_event(&Event {
            wall_time: wall_time(),
            step: step as i64,
            file_version: None,
            summary: Some(Summary { value }),
        })
    }

    fn write_event(&mut self, e: &Event) -> Result<()> {
        let data = e.encode_to_vec();
        let len = (data.len() as u64).to_le_bytes();
        let mut rec = Vec::with_capacity(data.len() + 16);
        rec.extend_from_slice(&len);
        rec.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
        rec.extend_from_slice(&data);
        rec.extend_from_slice(&masked_crc32c(&data).to_le_bytes());
        self.file
            .write_all(&rec)
            .and_then(|_| self.file.flush())
            .with_context(|| format!("writing {}", self.path.display()))
    }
}

/// One scalar read back: (step, tag, value).
pub type Scalar = (i64, String, f32);

/// Reads an event file: checks every record's framing and both masked CRC32Cs, decodes the
/// events, and returns the file version and every scalar.
pub fn read_scalars(path: &Path) -> Result<(String, Vec<Scalar>)> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let (mut at, mut version, mut out) = (0usize, String::new(), Vec::new());
    while at < bytes.len() {
        let rest = &bytes[at..];
        if rest.len() < 12 {
            bail!("{}: {} trailing bytes at offset {at}, not a record", path.display(), rest.len());
        }
        let (len_bytes, len_crc) = (&rest[..8], u32::from_le_bytes(rest[8..12].try_into().unwrap()));
        if masked_crc32c(len_bytes) != len_crc {
            bail!("{}: length CRC mismatch at offset {at}", path.display());
        }
        let len = u64::from_le_bytes(len_bytes.try_into().unwrap()) as usize;
        if rest.len() < 16 + len {
            bail!("{}: record at offset {at} claims {len} bytes, {} remain", path.display(), rest.len() - 12);
        }
        let data = &rest[12..12 + len];
        let data_crc = u32::from_le_bytes(rest[12 + len..16 + len].try_into().unwrap());
        if masked_crc32c(data) != data_crc {
            bail!("{}: data CRC mismatch at offset {at}", path.display());
        }
        let e = Event::decode(data).with_context(|| format!("{}: event at offset {at}", path.display()))?;
        if let Some(v) = e.file_version {
            version = v;
        }
        for v in e.summary.map(|s| s.value).unwrap_or_default() {
            if let Some(x) = v.simple_value {
                out.push((e.step, v.tag, x));
            }
        }
        at += 16 + len;
    }
    Ok((version, out))
}

/// The event files under `dir` (recursively), sorted.
pub fn event_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return out };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(event_files(&p));
        } else if p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("events.out.tfevents.")) {
            out.push(p);
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The masked CRC32C of TFRecord, checked against values TensorFlow's `masked_crc32c`
    /// gives: CRC32C("123456789") = 0xE3069283 (the Castagnoli check value).
    #[test]
    fn crc_is_castagnoli_masked() {
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
        let masked = 0xE306_9283u32.rotate_right(15).wrapping_add(0xa282_ead8);
        assert_eq!(masked_crc32c(b"123456789"), masked);
    }

    #[test]
    fn scalars_round_trip_and_corruption_is_caught() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = EventWriter::create(dir.path()).unwrap();
        w.scalars(1, &[("loss", 7.5), ("lr", 0.0), ("nan is skipped", f64::NAN)]).unwrap();
        w.scalars(2, &[("loss", 6.25)]).unwrap();
        let path = w.path().to_path_buf();
        drop(w);
        let (version, got) = read_scalars(&path).unwrap();
        assert_eq!(version, "brain.Event:2");
        let want = [(1, "loss", 7.5f32), (1, "lr", 0.0), (2, "loss", 6.25)];
        assert_eq!(got.len(), want.len());
        for ((s, t, v), (ws, wt, wv)) in got.iter().zip(want) {
            assert_eq!((*s, t.as_str(), *v), (ws, wt, wv));
        }
        assert_eq!(event_files(dir.path()), vec![path.clone()]);
        let mut bytes = std::fs::read(&path).unwrap();
        let n = bytes.len();
        bytes[n - 6] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert!(read_scalars(&path).unwrap_err().to_string().contains("data CRC mismatch"));
    }
}
