use super::*;
use crate::region::Region;
use crate::sharded::read::{ShardedReader, TensorSource};
use std::sync::{Arc, Barrier, Mutex};

/// Ranks as threads, gathering through a shared slot per rank.
struct Threads {
    rank: usize,
    slots: Arc<Mutex<Vec<Vec<u8>>>>,
    barrier: Arc<Barrier>,
}

impl Group for Threads {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.slots.lock().unwrap().len()
    }
    fn all_gather(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.slots.lock().unwrap()[self.rank] = bytes.to_vec();
        self.barrier.wait();
        let out = self.slots.lock().unwrap().clone();
        self.barrier.wait();
        Ok(out)
    }
}

fn full_w() -> Vec<f32> {
    (0..12).map(|x| x as f32 * 0.5 - 1.0).collect()
}

/// Rank r of 4 (2 replicas × 2 shards): rows of `w` [4, 3] by shard, `n` [3] on every rank.
fn pieces(rank: usize) -> Vec<Piece> {
    let s = rank % 2;
    vec![
        Piece {
            key: "w".into(),
            shape: vec![4, 3],
            region: Region { offsets: vec![2 * s, 0], lengths: vec![2, 3] },
            data: full_w()[6 * s..6 * s + 6].to_vec(),
        },
        Piece { key: "n".into(), shape: vec![3], region: Region::full(&[3]), data: vec![1.0, 2.0, 3.0] },
        // Held by this rank alone (as a pipeline stage's tensors are), so every rank writes.
        Piece { key: format!("own.{rank}"), shape: vec![1], region: Region::full(&[1]), data: vec![rank as f32] },
    ]
}

/// Runs a save on 4 thread ranks; `sabotage(rank, prepared)` runs between prepare and write.
fn save(folder: &CheckpointFolder, step: u64, sabotage: fn(usize, &PreparedSave)) -> Vec<Result<PathBuf>> {
    let (slots, barrier) = (Arc::new(Mutex::new(vec![Vec::new(); 4])), Arc::new(Barrier::new(4)));
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|rank| {
                let g = Threads { rank, slots: slots.clone(), barrier: barrier.clone() };
                s.spawn(move || {
                    let req = SaveRequest {
                        step,
                        pieces: pieces(rank),
                        files: vec![("train_state.json".into(), b"{}".to_vec())],
                        saved_under: "replicate 2 x shard 2".into(),
                        model_only: false,
                    };
                    let p = prepare(folder, &g, req)?;
                    sabotage(rank, &p);
                    finish(folder, &g, p.write(), 0)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn four_ranks_save_once_each_piece_and_any_region_reads_back() {
    let d = tempfile::tempdir().unwrap();
    let folder = CheckpointFolder::new(d.path());
    for r in save(&folder, 7, |_, _| {}) {
        assert_eq!(r.unwrap(), folder.step_dir(7));
    }
    let reader = folder.open(7).unwrap();
    assert!(reader.has(METADATA) && reader.has("train_state.json"));
    let src = ShardedReader::open(&folder.step_dir(7)).unwrap();
    // `w`'s two shards are written once each, `n` once.
    assert_eq!(src.meta.tensors["w"].chunks.len(), 2);
    assert_eq!(src.meta.tensors["n"].chunks.len(), 1);
    let w = src.read("w", &Region::full(&[4, 3])).unwrap();
    assert!(w.iter().zip(full_w()).all(|(a, b)| a.to_bits() == b.to_bits()));
    // Column 1 of rows 1..4 spans both shards.
    let col = src.read("w", &Region { offsets: vec![1, 1], lengths: vec![3, 1] }).unwrap();
    assert_eq!(col, vec![full_w()[4], full_w()[7], full_w()[10]]);
    assert_eq!(src.read("n", &Region::full(&[3])).unwrap(), vec![1.0, 2.0, 3.0]);
    let text = super::super::tools::inspect(&folder.step_dir(7)).unwrap();
    assert!(text.contains("step 7") && text.contains("replicate 2 x shard 2") && text.contains("w  [4, 3]"), "{text}");
}

#[test]
fn a_failed_write_on_one_rank_fails_every_rank_and_keeps_the_last_checkpoint() {
    let d = tempfile::tempdir().unwrap();
    let folder = CheckpointFolder::new(d.path());
    assert!(save(&folder, 1, |_, _| {}).iter().all(|r| r.is_ok()));
    let results = save(&folder, 2, |rank, p| {
        // A folder where rank 1's file should go makes its write fail.
        if rank == 1 {
            std::fs::create_dir(p.dir.join("rank-00001-of-00004.safetensors")).unwrap();
        }
    });
    for r in &results {
        let e = format!("{:#}", r.as_ref().unwrap_err());
        assert!(e.contains("rank 1 failed") && e.contains("rank-00001-of-00004.safetensors") && e.contains("step-1, is kept"), "{e}");
    }
    assert_eq!(folder.steps().unwrap(), vec![1]);
    // No partial folder is left.
    assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    assert!(folder.open(1).is_ok());
}

#[test]
fn corrupt_chunks_are_named() {
    let d = tempfile::tempdir().unwrap();
    let folder = CheckpointFolder::new(d.path());
    assert!(save(&folder, 3, |_, _| {}).iter().all(|r| r.is_ok()));
    let src = ShardedReader::open(&folder.step_dir(3)).unwrap();
    let c = src.meta.tensors["w"].chunks[0].clone();
    let path = folder.step_dir(3).join(&c.file);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[c.byte_offset as usize] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let src = ShardedReader::open(&folder.step_dir(3)).unwrap();
    let e = src.read("w", &Region::full(&[4, 3])).unwrap_err().to_string();
    assert!(e.contains(&c.file) && e.contains("CRC32") && e.contains("w"), "{e}");
    let e = src.read("nope", &Region::full(&[1])).unwrap_err().to_string();
    assert!(e.contains("no tensor nope"), "{e}");
}
