//! The training loader: fixed global sample order, each data-parallel rank taking its slice of
//! every global batch by *global sample index*.
//!
//! A sample is window `w` of the token stream: tokens `[w·T, w·T + T + 1)` (inputs are the first
//! T, targets the last T). Epoch `e` visits all windows in a permutation seeded by `(seed, e)`.
//! Global sample `g` is window `perm_{g / n}[g % n]`. Step `s` uses global samples
//! `[s·G, (s+1)·G)`; microbatch `m` of dp rank `r` takes `L` consecutive ones starting at
//! `s·G + m·(dp·L) + r·L`. The state is just the number of global samples consumed, so it is the
//! same for every rank and every dp degree: a checkpoint resumes under another layout exactly.

use crate::mixture::Mixture;
use crate::token_file::TokenFile;
use anyhow::{bail, Result};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

#[derive(Debug, Clone, PartialEq)]
pub struct LoaderConfig {
    pub seq_len: usize,
    pub global_batch_size: usize,
    pub local_batch_size: usize,
    pub dp_rank: usize,
    pub dp_degree: usize,
    pub seed: u64,
}

impl LoaderConfig {
    /// Microbatches per step on each rank (gradient accumulation steps).
    pub fn accumulation_steps(&self) -> usize {
        self.global_batch_size / (self.local_batch_size * self.dp_degree)
    }
}

/// Everything needed to continue the sample stream exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct LoaderState {
    pub samples_consumed: u64,
}

/// `batch × seq_len` inputs and targets, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub inputs: Vec<i64>,
    pub targets: Vec<i64>,
    pub batch: usize,
    pub seq_len: usize,
}

impl Batch {
    fn from_windows(tokens: &TokenFile, windows: &[usize], seq_len: usize) -> Self {
        let pairs: Vec<(&TokenFile, usize)> = windows.iter().map(|&w| (tokens, w)).collect();
        Self::from_sources(&pairs, seq_len)
    }

    /// Window `w` of each `(tokens, w)`.
    fn from_sources(windows: &[(&TokenFile, usize)], seq_len: usize) -> Self {
        let mut inputs = Vec::with_capacity(windows.len() * seq_len);
        let mut targets = Vec::with_capacity(windows.len() * seq_len);
        for &(tokens, w) in windows {
            let s = w * seq_len;
            inputs.extend(tokens.window(s, s + seq_len));
            targets.extend(tokens.window(s + 1, s + seq_len + 1));
        }
        Self { inputs, targets, batch: windows.len(), seq_len }
    }

    pub fn num_tokens(&self) -> usize {
        self.batch * self.seq_len
    }
}

/// One corpus of a mixture: its tokens and its own epoch permutation of windows.
struct Source {
    tokens: Arc<TokenFile>,
    num_windows: usize,
    perm: Option<(u64, Vec<u32>)>,
    /// Source 0 uses the loader's seed as before mixtures existed (its stream is unchanged).
    seed: u64,
}

impl Source {
    fn window_of(&mut self, k: u64) -> usize {
        let n = self.num_windows as u64;
        let epoch = k / n;
        if self.perm.as_ref().map(|(e, _)| *e) != Some(epoch) {
            let mut order: Vec<u32> = (0..self.num_windows as u32).collect();
            let mut rng = ChaCha8Rng::seed_from_u64(self.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ epoch);
            order.shuffle(&mut rng);
            self.perm = Some((epoch, order));
        }
        self.perm.as_ref().unwrap().1[(k % n) as usize] as usize
    }
}

pub struct DataLoader {
    sources: Vec<Source>,
    mixture: Mixture,
    cfg: LoaderConfig,
    state: LoaderState,
}

impl DataLoader {
    pub fn new(tokens: Arc<TokenFile>, cfg: LoaderConfig) -> Result<Self> {
        Self::mixture(vec![(tokens, 1.0)], cfg)
    }

    /// Samples drawn from several corpora in proportion to their weights ([`Mixture`]).
    pub fn mixture(corpora: Vec<(Arc<TokenFile>, f64)>, cfg: LoaderConfig) -> Result<Self> {
        let per_step = cfg.local_batch_size * cfg.dp_degree;
        if cfg.seq_len == 0 || cfg.local_batch_size == 0 || cfg.global_batch_size % per_step != 0 {
            bail!(
                "global batch {} must be a positive multiple of local batch {} × dp degree {}",
                cfg.global_batch_size,
                cfg.local_batch_size,
                cfg.dp_degree
            );
        }
        let weights: Vec<f64> = corpora.iter().map(|c| c.1).collect();
        let mixture = Mixture::new(&weights, cfg.seed)?;
        let mut sources = Vec::new();
        for (i, (tokens, _)) in corpora.into_iter().enumerate() {
            let num_windows = tokens.len().saturating_sub(1) / cfg.seq_len;
            if num_windows == 0 {
                bail!(
                    "the corpus {} has {} tokens, fewer than one sample of seq_len {} + 1",
                    tokens.path().display(),
                    tokens.len(),
                    cfg.seq_len
                );
            }
            let seed = if i == 0 { cfg.seed } else { cfg.seed ^ (i as u64).wrapping_mul(0xA076_1D64_78BD_642F) };
            sources.push(Source { tokens, num_windows, perm: None, seed });
        }
        Ok(Self { sources, mixture, cfg, state: LoaderState::default() })
    }

    /// Windows of the first corpus (the only one without a mixture).
    pub fn num_windows(&self) -> usize {
        self.sources[0].num_windows
    }

    pub fn state(&self) -> LoaderState {
        self.state
    }

    pub fn load_state(&mut self, state: LoaderState) {
        self.state = state;
    }

    /// The source and window of global sample `g`.
    fn window_of(&mut self, g: u64) -> (usize, usize) {
        let (s, k) = self.mixture.locate(g);
        (s, self.sources[s].window_of(k))
    }

    /// Samples of each source among the first `g` global samples (every rank computes the same).
    pub fn source_samples(&mut self, g: u64) -> Vec<u64> {
        self.mixture.samples_before(g)
    }

    /// This rank's microbatches of the next step, in order; advances the state by one global batch.
    pub fn next_step(&mut self) -> Vec<Batch> {
        let c = self.cfg.clone();
        let base = self.state.samples_consumed;
        let mut out = Vec::with_capacity(c.accumulation_steps());
        for m in 0..c.accumulation_steps() {
            let first = base + (m * c.dp_degree * c.local_batch_size + c.dp_rank * c.local_batch_size) as u64;
            let picks: Vec<(usize, usize)> =
                (0..c.local_batch_size as u64).map(|i| self.window_of(first + i)).collect();
            let windows: Vec<(&TokenFile, usize)> = picks.iter().map(|&(s, w)| (&*self.sources[s].tokens, w)).collect();
            out.push(Batch::from_sources(&windows, c.seq_len));
        }
        self.state.samples_consumed += c.global_batch_size as u64;
        out
    }
}

/// Validation batches: the held-out stream in order, `batch` windows at a time, at most
/// `max_batches` (all when `None`).
pub struct ValidationBatches;

impl ValidationBatches {
    pub fn collect(tokens: &TokenFile, seq_len: usize, batch: usize, max_batches: Option<usize>) -> Vec<Batch> {
        let windows = tokens.len().saturating_sub(1) / seq_len;
        let n = (windows / batch).min(max_batches.unwrap_or(usize::MAX));
        (0..n)
            .map(|b| Batch::from_windows(tokens, &(b * batch..(b + 1) * batch).collect::<Vec<_>>(), seq_len))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(n: u32) -> Arc<TokenFile> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.bin");
        TokenFile::write(&p, &(0..n).collect::<Vec<_>>()).unwrap();
        let f = TokenFile::open(&p).unwrap();
        std::mem::forget(dir); // keep the mapped file's folder for the test's life
        Arc::new(f)
    }

    fn cfg(dp_rank: usize, dp: usize, local: usize, global: usize) -> LoaderConfig {
        LoaderConfig {
            seq_len: 4,
            global_batch_size: global,
            local_batch_size: local,
            dp_rank,
            dp_degree: dp,
            seed: 11,
        }
    }

    #[test]
    fn windows_are_shifted_by_one_and_cover_an_epoch_once() {
        let t = tokens(4 * 10 + 1);
        let mut l = DataLoader::new(t, cfg(0, 1, 2, 2)).unwrap();
        assert_eq!(l.num_windows(), 10);
        let mut seen = Vec::new();
        for _ in 0..5 {
            for b in l.next_step() {
                for r in 0..b.batch {
                    let inp = &b.inputs[r * 4..r * 4 + 4];
                    let tgt = &b.targets[r * 4..r * 4 + 4];
                    assert_eq!(inp[1..], tgt[..3]);
                    assert_eq!(inp[0] % 4, 0);
                    seen.push(inp[0] / 4);
                }
            }
        }
        seen.sort();
        assert_eq!(seen, (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn same_seed_same_stream_other_seed_other_stream() {
        let t = tokens(4 * 50 + 1);
        let run = |seed| {
            let mut c = cfg(0, 1, 4, 8);
            c.seed = seed;
            let mut l = DataLoader::new(t.clone(), c).unwrap();
            (0..20).flat_map(|_| l.next_step()).collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
    }

    #[test]
    fn sample_stream_is_independent_of_dp_degree_and_accumulation() {
        let t = tokens(4 * 37 + 1);
        let step_samples = |dp: usize, local: usize, steps: usize| {
            let mut loaders: Vec<_> =
                (0..dp).map(|r| DataLoader::new(t.clone(), cfg(r, dp, local, 8)).unwrap()).collect();
            (0..steps)
                .map(|_| {
                    let mut firsts: Vec<i64> = loaders
                        .iter_mut()
                        .flat_map(|l| l.next_step())
                        .flat_map(|b| b.inputs.chunks(4).map(|c| c[0]).collect::<Vec<_>>())
                        .collect();
                    firsts.sort();
                    firsts
                })
                .collect::<Vec<_>>()
        };
        let single = step_samples(1, 8, 12);
        assert_eq!(single, step_samples(2, 4, 12));
        assert_eq!(single, step_samples(4, 1, 12)); // 2 microbatches per rank
        assert_eq!(single, step_samples(1, 2, 12)); // 4 microbatches
    }

    #[test]
    fn resume_from_state_continues_exactly() {
        let t = tokens(4 * 23 + 1);
        let mut a = DataLoader::new(t.clone(), cfg(0, 1, 3, 6)).unwrap();
        let straight: Vec<Batch> = (0..9).flat_map(|_| a.next_step()).collect();
        let mut b = DataLoader::new(t.clone(), cfg(0, 1, 3, 6)).unwrap();
        let mut first: Vec<Batch> = (0..4).flat_map(|_| b.next_step()).collect();
        let state = b.state();
        let mut c = DataLoader::new(t, cfg(0, 1, 3, 6)).unwrap();
        c.load_state(state);
        first.extend((0..5).flat_map(|_| c.next_step()));
        assert_eq!(straight, first);
    }

    #[test]
    fn bad_batch_shapes_and_tiny_corpus_are_errors() {
        let t = tokens(10);
        assert!(DataLoader::new(t.clone(), cfg(0, 2, 3, 8)).is_err());
        let mut c = cfg(0, 1, 1, 1);
        c.seq_len = 64;
        let e = DataLoader::new(t, c).err().unwrap().to_string();
        assert!(e.contains("fewer than one sample"), "{e}");
    }

    #[test]
    fn validation_batches_are_in_order_and_limited() {
        let t = tokens(4 * 10 + 1);
        let v = ValidationBatches::collect(&t, 4, 3, None);
        assert_eq!(v.len(), 3);
        assert_eq!(v[1].inputs[0], 12);
        assert_eq!(ValidationBatches::collect(&t, 4, 3, Some(1)).len(), 1);
    }
}
