//! Dataset mixtures: which source global sample `g` comes from, as a pure function of `g` and
//! the seed (so resume and resharding need no state beyond the sample count).
//!
//! Samples are dealt in blocks of [`PERIOD`]: source `s` gets exactly `counts[s]` samples of
//! every block (its weight's share of the block, rounded by largest remainder), in an order
//! shuffled per block by the seed. Sample `g` is the `k`-th sample of its source, `k` counting
//! that source's samples in all earlier blocks and earlier in this block; each source then maps
//! `k` through its own epoch permutation, as a single corpus does.

use anyhow::{bail, Result};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// Samples per block: every aligned window of this many samples holds each source's share
/// exactly (weights are resolved to 1/PERIOD).
pub const PERIOD: usize = 1000;

pub struct Mixture {
    counts: Vec<usize>,
    period: usize,
    seed: u64,
    /// The current block: its index, each position's source and that source's rank before it.
    block: Option<(u64, Vec<(u32, u32)>)>,
}

impl Mixture {
    /// `weights` in any scale (each > 0). One source: every sample is its own, in order.
    pub fn new(weights: &[f64], seed: u64) -> Result<Self> {
        if let Some((i, w)) = weights.iter().enumerate().find(|(_, w)| !(w.is_finite() && **w > 0.0)) {
            bail!("`training.datasets[{i}].weight` = {w} must be a positive number");
        }
        if weights.len() <= 1 {
            return Ok(Self { counts: vec![1], period: 1, seed, block: None });
        }
        let total: f64 = weights.iter().sum();
        let exact: Vec<f64> = weights.iter().map(|w| w / total * PERIOD as f64).collect();
        let mut counts: Vec<usize> = exact.iter().map(|x| x.floor() as usize).collect();
        let mut order: Vec<usize> = (0..weights.len()).collect();
        order.sort_by(|&a, &b| (exact[b] - exact[b].floor()).total_cmp(&(exact[a] - exact[a].floor())).then(a.cmp(&b)));
        for &i in order.iter().take(PERIOD - counts.iter().sum::<usize>()) {
            counts[i] += 1;
        }
        if let Some(i) = counts.iter().position(|&c| c == 0) {
            bail!("`training.datasets[{i}].weight` = {} is below 1/{PERIOD} of the total {total}; raise it or drop the source", weights[i]);
        }
        Ok(Self { counts, period: PERIOD, seed, block: None })
    }

    /// Samples of each source in every block.
    pub fn counts(&self) -> &[usize] {
        &self.counts
    }

    /// Samples of each source among global samples `[0, g)`: whole blocks by their counts, then
    /// the start of `g`'s block.
    pub fn samples_before(&mut self, g: u64) -> Vec<u64> {
        let blocks = g / self.period as u64;
        let mut n: Vec<u64> = self.counts.iter().map(|&c| c as u64 * blocks).collect();
        for x in blocks * self.period as u64..g {
            n[self.locate(x).0] += 1;
        }
        n
    }

    /// The source of global sample `g` and its index among that source's samples.
    pub fn locate(&mut self, g: u64) -> (usize, u64) {
        if self.counts.len() == 1 {
            return (0, g);
        }
        let (b, r) = (g / self.period as u64, (g % self.period as u64) as usize);
        if self.block.as_ref().map(|x| x.0) != Some(b) {
            let mut deal: Vec<u32> =
                self.counts.iter().enumerate().flat_map(|(s, &c)| std::iter::repeat_n(s as u32, c)).collect();
            deal.shuffle(&mut ChaCha8Rng::seed_from_u64(self.seed.wrapping_mul(0xD1B5_4A32_D192_ED03) ^ b));
            let mut seen = vec![0u32; self.counts.len()];
            let ranked = deal
                .iter()
                .map(|&s| {
                    seen[s as usize] += 1;
                    (s, seen[s as usize] - 1)
                })
                .collect();
            self.block = Some((b, ranked));
        }
        let (s, rank) = self.block.as_ref().unwrap().1[r];
        (s as usize, b * self.counts[s as usize] as u64 + rank as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn next_at(g: u64, s: usize) -> u64 {
        let mut m = Mixture::new(&[3.0, 1.0, 0.5], 7).unwrap();
        (0..g).filter(|&x| m.locate(x).0 == s).count() as u64
    }

    #[test]
    fn every_block_holds_the_exact_shares_and_sources_are_read_in_order() {
        let mut m = Mixture::new(&[3.0, 1.0, 0.5], 7).unwrap();
        assert_eq!(m.counts(), &[667, 222, 111]);
        let mut next = [0u64; 3];
        for b in 0..3u64 {
            let mut per = [0usize; 3];
            for g in b * 1000..(b + 1) * 1000 {
                let (s, k) = m.locate(g);
                assert_eq!(k, next[s], "source {s} is read in order");
                next[s] += 1;
                per[s] += 1;
            }
            assert_eq!(per, [667, 222, 111]);
        }
        // A pure function of g: asking out of order gives the same answers.
        assert_eq!(m.samples_before(2345), vec![next_at(2345, 0), next_at(2345, 1), next_at(2345, 2)]);
        let mut again = Mixture::new(&[3.0, 1.0, 0.5], 7).unwrap();
        assert_eq!(again.locate(2500), m.locate(2500));
        assert_eq!(again.locate(10), m.locate(10));
        assert_ne!(
            (0..50).map(|g| Mixture::new(&[1.0, 1.0], 1).unwrap().locate(g).0).collect::<Vec<_>>(),
            (0..50).map(|g| Mixture::new(&[1.0, 1.0], 2).unwrap().locate(g).0).collect::<Vec<_>>()
        );
    }

    #[test]
    fn bad_weights_are_named() {
        assert!(Mixture::new(&[1.0, 0.0], 0).err().unwrap().to_string().contains("datasets[1].weight"));
        assert!(Mixture::new(&[1.0, -2.0], 0).err().unwrap().to_string().contains("datasets[1]"));
        assert!(Mixture::new(&[1.0, 1e-5], 0).err().unwrap().to_string().contains("below 1/1000"));
        let mut one = Mixture::new(&[2.0], 0).unwrap();
        assert_eq!(one.locate(12345), (0, 12345));
    }
}
