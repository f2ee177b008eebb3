//! Who writes what, and a rank's file.

use super::{Chunk, Piece};
use crate::region::Region;
use anyhow::{bail, Context, Result};
use safetensors::tensor::{Dtype, TensorView};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

#[cfg(target_endian = "big")]
compile_error!("checkpoint files are written from the in-memory float32 bytes, which must be little-endian");

/// What a rank holds of a tensor, without the values: exchanged to decide who writes what.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Desc {
    pub key: String,
    pub shape: Vec<usize>,
    pub region: Region,
}

impl From<&Piece> for Desc {
    fn from(p: &Piece) -> Self {
        Self { key: p.key.clone(), shape: p.shape.clone(), region: p.region.clone() }
    }
}

/// For every rank's pieces (`held[r]`), whether rank `r` writes it. A piece held by several
/// ranks (replicas: data parallel, TP for unsplit tensors) is written once, by one of its
/// holders chosen by a hash of the key, so replicated tensors spread over their owners instead
/// of all landing on one rank. Also returns every tensor's global shape, after checking that
/// the distinct pieces of each tensor tile it exactly (an error otherwise: a bug, never a
/// silently incomplete checkpoint).
pub fn assign(held: &[Vec<Desc>]) -> Result<(Vec<Vec<bool>>, BTreeMap<String, Vec<usize>>)> {
    let mut holders: BTreeMap<(&str, &Region), Vec<(usize, usize)>> = BTreeMap::new();
    let mut shapes: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (r, descs) in held.iter().enumerate() {
        for (i, d) in descs.iter().enumerate() {
            if !d.region.within(&d.shape) {
                bail!("rank {r}: piece {:?} of {} lies outside its shape {:?}", d.region, d.key, d.shape);
            }
            match shapes.get(&d.key) {
                Some(s) if *s != d.shape => {
                    bail!("rank {r} holds {} with global shape {:?}, another rank with {s:?}", d.key, d.shape)
                }
                Some(_) => {}
                None => {
                    shapes.insert(d.key.clone(), d.shape.clone());
                }
            }
            holders.entry((&d.key, &d.region)).or_default().push((r, i));
        }
    }
    let mut covered: BTreeMap<&str, usize> = BTreeMap::new();
    let mut writes: Vec<Vec<bool>> = held.iter().map(|d| vec![false; d.len()]).collect();
    for ((key, region), hs) in &holders {
        *covered.entry(key).or_default() += region.numel();
        let pick = crc32fast::hash(format!("{key}{:?}", region.offsets).as_bytes()) as usize % hs.len();
        let (r, i) = hs[pick];
        writes[r][i] = true;
    }
    for (key, shape) in &shapes {
        let total: usize = shape.iter().product();
        if covered[key.as_str()] != total {
            bail!(
                "the ranks' pieces of {key} cover {} of its {total} elements (shape {shape:?}); refusing to write an incomplete checkpoint",
                covered[key.as_str()]
            );
        }
    }
    Ok((writes, shapes))
}

/// Writes `pieces` into `path` (one safetensors file, one tensor per piece, flushed to disk)
/// and returns the file's size and where each piece landed.
pub fn write_rank_file(path: &Path, pieces: &[Piece]) -> Result<(u64, Vec<(String, Chunk)>)> {
    let file = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
    let name = |p: &Piece| format!("{}@{}", p.key, p.region.offsets.iter().map(|o| o.to_string()).collect::<Vec<_>>().join(","));
    let views = pieces
        .iter()
        .map(|p| Ok((name(p), TensorView::new(Dtype::F32, p.region.lengths.clone(), bytemuck::cast_slice(&p.data))?)))
        .collect::<Result<Vec<_>, safetensors::SafeTensorError>>()?;
    safetensors::serialize_to_file(views, &None, path).with_context(|| format!("writing {}", path.display()))?;
    let f = fs::File::open(path).with_context(|| format!("reopening {}", path.display()))?;
    f.sync_all().with_context(|| format!("flushing {} to disk", path.display()))?;
    let bytes = f.metadata()?.len();
    // Where the pieces landed: the header's offsets, after the 8-byte length and the header.
    // SAFETY: the file was just written by this rank and nothing else writes it.
    let map = unsafe { memmap2::Mmap::map(&f) }.with_context(|| format!("mapping {}", path.display()))?;
    let (n, meta) = safetensors::SafeTensors::read_metadata(&map)
        .map_err(|e| anyhow::anyhow!("reading back {}: {e:?}", path.display()))?;
    let n = n as u64;
    let chunks = pieces
        .iter()
        .map(|p| {
            let info = meta.info(&name(p)).expect("a written tensor");
            let chunk = Chunk {
                file: file.clone(),
                byte_offset: 8 + n + info.data_offsets.0 as u64,
                byte_len: (info.data_offsets.1 - info.data_offsets.0) as u64,
                region: p.region.clone(),
                crc32: crc32fast::hash(bytemuck::cast_slice(&p.data)),
            };
            (p.key.clone(), chunk)
        })
        .collect();
    Ok((bytes, chunks))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(key: &str, shape: &[usize], off: usize, len: usize) -> Desc {
        Desc { key: key.into(), shape: shape.to_vec(), region: Region { offsets: vec![off], lengths: vec![len] } }
    }

    #[test]
    fn replicas_are_written_once_and_spread() {
        // Two replicas of a 2-way sharded `w`, and a replicated `n` on all four ranks.
        let held: Vec<Vec<Desc>> = (0..4)
            .map(|r| vec![d("w", &[4], (r % 2) * 2, 2), d("n", &[3], 0, 3), d(&format!("m{r}"), &[1], 0, 1)])
            .collect();
        let (writes, shapes) = assign(&held).unwrap();
        let count = |i: usize| (0..4).filter(|&r| writes[r][i]).count();
        assert_eq!((count(0), count(1)), (2, 1));
        assert!((0..4).all(|r| writes[r][2]));
        assert_eq!(shapes["w"], vec![4]);
        // Every shard of `w` once: ranks {0, 2} hold rows 0..2, {1, 3} rows 2..4.
        assert_eq!(writes[0][0] as u8 + writes[2][0] as u8, 1);
        assert_eq!(writes[1][0] as u8 + writes[3][0] as u8, 1);
    }

    #[test]
    fn incomplete_or_inconsistent_pieces_are_refused() {
        let e = assign(&[vec![d("w", &[4], 0, 2)]]).unwrap_err().to_string();
        assert!(e.contains("cover 2 of its 4"), "{e}");
        let e = assign(&[vec![d("w", &[4], 0, 4)], vec![d("w", &[5], 0, 5)]]).unwrap_err().to_string();
        assert!(e.contains("global shape"), "{e}");
        let e = assign(&[vec![d("w", &[4], 2, 4)]]).unwrap_err().to_string();
        assert!(e.contains("outside"), "{e}");
    }
}
