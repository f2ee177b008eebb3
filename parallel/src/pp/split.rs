//! Splitting the model's layers into pipeline stages. Stage `s` of `S = pp × v` lives on rank
//! `s mod pp` (interleaved schedules give each rank `v` stages: `r, r + pp, …`). The embedding
//! is on stage 0, the final norm, head and loss on stage `S − 1`.

use super::Schedule;
use std::ops::Range;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageSplit {
    pub pp: usize,
    /// Stages per rank.
    pub virtual_stages: usize,
    /// The layers of each stage, by stage.
    pub layers: Vec<Range<usize>>,
}

impl StageSplit {
    /// `layers_per_stage = None`: an even split into `pp` stages (two per rank for the
    /// interleaved schedule), the first stages taking one more layer where it does not divide.
    /// Errors name the `[parallelism]` key and what would work.
    pub fn new(
        n_layers: usize,
        pp: usize,
        schedule: Schedule,
        layers_per_stage: Option<usize>,
    ) -> Result<Self, String> {
        let stages = match layers_per_stage {
            Some(0) => {
                return Err(
                    "`parallelism.pipeline_parallel_layers_per_stage` must be >= 1 (or -1 for an even split)".into()
                )
            }
            Some(l) => n_layers.div_ceil(l),
            None if schedule.is_interleaved() => 2 * pp,
            None => pp,
        };
        if stages % pp != 0 {
            return Err(format!(
                "`parallelism.pipeline_parallel_layers_per_stage` = {} gives {stages} stages for {n_layers} layers, not a multiple of `pipeline_parallel_degree` = {pp}; choose layers per stage so that ceil({n_layers} / it) is a multiple of {pp}",
                layers_per_stage.unwrap_or(0)
            ));
        }
        let v = stages / pp;
        if v > 1 && !schedule.is_interleaved() {
            return Err(format!(
                "{stages} stages on {pp} ranks needs `parallelism.pipeline_parallel_schedule` = \"Interleaved1F1B\" ({schedule:?} runs one stage per rank); or set `pipeline_parallel_layers_per_stage` = {}",
                n_layers.div_ceil(pp)
            ));
        }
        if v == 1 && schedule.is_interleaved() {
            return Err(format!(
                "\"Interleaved1F1B\" needs at least 2 stages per rank; `pipeline_parallel_layers_per_stage` gives {stages} stages on {pp} ranks (use at most {} layers per stage, or -1)",
                n_layers / (2 * pp)
            ));
        }
        if stages > n_layers {
            return Err(format!(
                "{stages} pipeline stages ({pp} ranks × {v} per rank) but the model has only {n_layers} layers; lower `parallelism.pipeline_parallel_degree` or the stages per rank"
            ));
        }
        let layers = match layers_per_stage {
            Some(l) => (0..stages).map(|s| (s * l).min(n_layers)..((s + 1) * l).min(n_layers)).collect(),
            None => {
                let (base, extra) = (n_layers / stages, n_layers % stages);
                let mut start = 0;
                (0..stages)
                    .map(|s| {
                        let n = base + usize::from(s < extra);
                        start += n;
                        start - n..start
                    })
                    .collect()
            }
        };
        Ok(Self { pp, virtual_stages: v, layers })
    }

    pub fn num_stages(&self) -> usize {
        self.layers.len()
    }

    pub fn rank_of_stage(&self, stage: usize) -> usize {
        stage % self.pp
    }

    /// The stages on `rank`, in order (local chunk `c` is stage `c·pp + rank`).
    pub fn stages_of_rank(&self, rank: usize) -> Vec<usize> {
        (0..self.virtual_stages).map(|c| c * self.pp + rank).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_and_explicit_splits() {
        let s = StageSplit::new(6, 2, Schedule::OneFOneB, None).unwrap();
        assert_eq!(s.layers, vec![0..3, 3..6]);
        let s = StageSplit::new(7, 2, Schedule::Interleaved1F1B, None).unwrap();
        assert_eq!(s.layers, vec![0..2, 2..4, 4..6, 6..7]);
        assert_eq!(s.stages_of_rank(1), vec![1, 3]);
        assert_eq!(s.rank_of_stage(2), 0);
        let s = StageSplit::new(6, 2, Schedule::Interleaved1F1B, Some(1)).unwrap();
        assert_eq!((s.virtual_stages, s.num_stages()), (3, 6));
        let e = StageSplit::new(6, 2, Schedule::OneFOneB, Some(2)).unwrap_err();
        assert!(e.contains("3 stages") && e.contains("multiple of `pipeline_parallel_degree` = 2"), "{e}");
        let e = StageSplit::new(6, 2, Schedule::GPipe, Some(1)).unwrap_err();
        assert!(e.contains("Interleaved1F1B"), "{e}");
        let e = StageSplit::new(2, 2, Schedule::Interleaved1F1B, None).unwrap_err();
        assert!(e.contains("only 2 layers"), "{e}");
    }
}
