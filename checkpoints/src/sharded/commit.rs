//! Saving a sharded checkpoint across ranks (threads or processes), in three phases:
//!
//! 1. [`prepare`] (collective): rank 0 creates the step's partial folder; every rank learns its
//!    name and what every other rank holds, and keeps the pieces it is to write.
//! 2. [`PreparedSave::write`] (local, no communication, so it can run on a background thread
//!    while training continues): this rank's file, flushed to disk.
//! 3. [`finish`] (collective): every rank learns every rank's outcome. If all succeeded, rank 0
//!    writes `metadata.json`, the small files and the manifest, then renames the folder into
//!    `step-N/`; if any failed, every rank reports the first failure (rank and file) and the
//!    partial folder is removed. Either way all ranks return the same result.
//!
//! A process killed at any moment leaves at worst a partial folder, which is never loaded and
//! is removed by the next save.

use super::write::{assign, write_rank_file, Desc};
use super::{Chunk, Metadata, Piece, TensorMeta, FORMAT, METADATA};
use crate::folder::{CheckpointFolder, PendingCheckpoint};
use anyhow::{anyhow, bail, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The ranks taking part in a save: a collective that gathers every rank's bytes.
pub trait Group {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Every rank's `bytes`, in rank order.
    fn all_gather(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>>;
}

/// One rank alone.
pub struct Solo;

impl Group for Solo {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn all_gather(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        Ok(vec![bytes.to_vec()])
    }
}

/// What a rank contributes to a checkpoint.
pub struct SaveRequest {
    pub step: u64,
    /// The pieces this rank holds (replicas included: [`prepare`] picks one writer each).
    pub pieces: Vec<Piece>,
    /// Small files rank 0 writes next to the metadata (train state, config).
    pub files: Vec<(String, Vec<u8>)>,
    pub saved_under: String,
    pub model_only: bool,
}

/// A save whose writers are decided; [`PreparedSave::write`] writes this rank's file.
pub struct PreparedSave {
    step: u64,
    rank: usize,
    world: usize,
    dir: PathBuf,
    /// Rank 0 owns the partial folder (dropping it uncommitted removes the folder).
    pending: Option<PendingCheckpoint>,
    to_write: Vec<Piece>,
    shapes: BTreeMap<String, Vec<usize>>,
    files: Vec<(String, Vec<u8>)>,
    saved_under: String,
    model_only: bool,
}

/// A save whose rank file is written (or failed); [`finish`] commits it.
pub struct WrittenSave {
    outcome: Outcome,
    rest: PreparedSave,
}

#[derive(Serialize, Deserialize)]
struct Hello {
    /// Rank 0: the partial folder, or why it could not be created.
    dir: Option<Result<PathBuf, String>>,
    descs: Vec<Desc>,
}

#[derive(Serialize, Deserialize)]
enum Outcome {
    Written { file: String, bytes: u64, chunks: Vec<(String, Chunk)> },
    Nothing,
    Failed(String),
}

fn gather<T: Serialize + for<'de> Deserialize<'de>>(group: &dyn Group, value: &T) -> Result<Vec<T>> {
    group
        .all_gather(&serde_json::to_vec(value)?)?
        .iter()
        .map(|b| serde_json::from_slice(b).map_err(|e| anyhow!("a rank sent a malformed checkpoint message: {e}")))
        .collect()
}

/// Phase 1 (every rank): agree on the folder and on who writes which piece.
pub fn prepare(folder: &CheckpointFolder, group: &dyn Group, req: SaveRequest) -> Result<PreparedSave> {
    let rank = group.rank();
    let pending = if rank == 0 { Some(folder.begin(req.step)) } else { None };
    let hello = Hello {
        dir: pending.as_ref().map(|p| p.as_ref().map(|p| p.dir().to_path_buf()).map_err(|e| format!("{e:#}"))),
        descs: req.pieces.iter().map(Desc::from).collect(),
    };
    let hellos = gather(group, &hello)?;
    let dir = match &hellos[0].dir {
        Some(Ok(d)) => d.clone(),
        Some(Err(e)) => bail!("checkpoint step-{} not saved: rank 0 could not create its folder: {e}", req.step),
        None => bail!("checkpoint step-{}: rank 0 sent no folder", req.step),
    };
    let held: Vec<Vec<Desc>> = hellos.into_iter().map(|h| h.descs).collect();
    let (writes, shapes) = assign(&held)?;
    let to_write = req.pieces.into_iter().zip(&writes[rank]).filter(|(_, w)| **w).map(|(p, _)| p).collect();
    Ok(PreparedSave {
        step: req.step,
        rank,
        world: group.size(),
        dir,
        pending: pending.transpose()?,
        to_write,
        shapes: if rank == 0 { shapes } else { BTreeMap::new() },
        files: req.files,
        saved_under: req.saved_under,
        model_only: req.model_only,
    })
}

impl PreparedSave {
    /// Bytes of tensor data this rank writes.
    pub fn bytes_to_write(&self) -> usize {
        self.to_write.iter().map(|p| p.data.len() * 4).sum()
    }

    /// Phase 2 (this rank, any thread): writes this rank's file. Failures are kept for
    /// [`finish`], which reports them on every rank.
    pub fn write(mut self) -> WrittenSave {
        let pieces = std::mem::take(&mut self.to_write);
        let outcome = if pieces.is_empty() {
            Outcome::Nothing
        } else {
            let file = format!("rank-{:05}-of-{:05}.safetensors", self.rank, self.world);
            match write_rank_file(&self.dir.join(&file), &pieces) {
                Ok((bytes, chunks)) => Outcome::Written { file, bytes, chunks },
                Err(e) => Outcome::Failed(format!("{e:#}")),
            }
        };
        WrittenSave { outcome, rest: self }
    }
}

/// Phase 3 (every rank): commit if every rank's write succeeded; returns the committed folder.
pub fn finish(folder: &CheckpointFolder, group: &dyn Group, w: WrittenSave, keep_latest_k: usize) -> Result<PathBuf> {
    let WrittenSave { outcome, rest } = w;
    let step = rest.step;
    let outcomes = gather(group, &outcome)?;
    if let Some((r, msg)) = outcomes.iter().enumerate().find_map(|(r, o)| match o {
        Outcome::Failed(m) => Some((r, m)),
        _ => None,
    }) {
        drop(rest.pending); // removes the partial folder (rank 0)
        let kept = folder.latest().ok().flatten().map(|s| format!("; the last checkpoint, step-{s}, is kept")).unwrap_or_default();
        bail!("checkpoint step-{step} not saved: rank {r} failed: {msg}{kept}");
    }
    let committed = match rest.pending {
        Some(pending) => commit(folder, pending, outcomes, rest.shapes, rest.files, &rest.saved_under, rest.model_only, step, keep_latest_k)
            .map_err(|e| format!("{e:#}")),
        None => Ok(PathBuf::new()),
    };
    let results: Vec<Result<PathBuf, String>> = gather(group, &committed)?;
    match &results[0] {
        Ok(dir) => Ok(dir.clone()),
        Err(e) => bail!("checkpoint step-{step} not saved: rank 0 could not commit it: {e}"),
    }
}

#[allow(clippy::too_many_arguments)]
fn commit(
    folder: &CheckpointFolder,
    mut pending: PendingCheckpoint,
    outcomes: Vec<Outcome>,
    shapes: BTreeMap<String, Vec<usize>>,
    files: Vec<(String, Vec<u8>)>,
    saved_under: &str,
    model_only: bool,
    step: u64,
    keep_latest_k: usize,
) -> Result<PathBuf> {
    let mut tensors: BTreeMap<String, TensorMeta> = shapes
        .into_iter()
        .map(|(k, shape)| (k, TensorMeta { shape, dtype: "F32".into(), chunks: Vec::new() }))
        .collect();
    let world = outcomes.len();
    for o in outcomes {
        if let Outcome::Written { file, bytes, chunks } = o {
            pending.add_file(&file, bytes, None);
            for (key, c) in chunks {
                tensors.get_mut(&key).ok_or_else(|| anyhow!("a rank wrote {key}, which no rank declared"))?.chunks.push(c);
            }
        }
    }
    for t in tensors.values_mut() {
        t.chunks.sort_by(|a, b| a.region.offsets.cmp(&b.region.offsets));
    }
    let meta = Metadata { format: FORMAT.into(), step, saved_under: saved_under.into(), world_size: world, model_only, tensors };
    pending.write(METADATA, serde_json::to_string_pretty(&meta)?.as_bytes())?;
    for (name, bytes) in &files {
        pending.write(name, bytes)?;
    }
    let dir = pending.commit()?;
    folder.prune(keep_latest_k)?;
    Ok(dir)
}

#[cfg(test)]
mod tests;
