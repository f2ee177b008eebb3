//! Pipeline schedules: the order in which each rank runs forward (F) and backward (B) of each
//! microbatch on each of its stages, and a simulation of them (unit-time forward, two-unit
//! backward) for `titan-rs plan`: the timeline per rank and the bubble fraction.
//!
//! * GPipe: every forward, then every backward.
//! * 1F1B: `pp − 1 − rank` warm-up forwards, then one forward and one backward alternately, then
//!   the remaining backwards (at most `pp` microbatches' activations alive).
//! * Interleaved 1F1B (Megatron-LM): `v` stages per rank; forwards go through the rank's stages in
//!   groups of `pp` microbatches, warm-up `2·(pp − 1 − rank) + (v − 1)·pp`; needs the number of
//!   microbatches to be a multiple of `pp`.

use std::fmt::Write;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    GPipe,
    OneFOneB,
    Interleaved1F1B,
}

impl Schedule {
    /// The `parallelism.pipeline_parallel_schedule` names.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "GPipe" => Schedule::GPipe,
            "1F1B" => Schedule::OneFOneB,
            "Interleaved1F1B" => Schedule::Interleaved1F1B,
            _ => return None,
        })
    }

    /// The config name (the inverse of `parse`).
    pub fn name(self) -> &'static str {
        match self {
            Schedule::GPipe => "GPipe",
            Schedule::OneFOneB => "1F1B",
            Schedule::Interleaved1F1B => "Interleaved1F1B",
        }
    }

    pub fn is_interleaved(self) -> bool {
        self == Schedule::Interleaved1F1B
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Forward { stage: usize, microbatch: usize },
    Backward { stage: usize, microbatch: usize },
}

/// Checks the microbatch count for a schedule; the error names the key.
pub fn check_microbatches(schedule: Schedule, pp: usize, n: usize) -> Result<(), String> {
    if n == 0 {
        return Err("`parallelism.num_pp_microbatches` must be >= 1 (or -1 for the pipeline degree)".into());
    }
    if schedule.is_interleaved() && n % pp != 0 {
        return Err(format!(
            "`parallelism.num_pp_microbatches` = {n} must be a multiple of `pipeline_parallel_degree` = {pp} for \"Interleaved1F1B\""
        ));
    }
    Ok(())
}

/// Rank `rank`'s actions, in order, for `n` microbatches on `pp` ranks with `v` stages each.
pub fn rank_actions(schedule: Schedule, pp: usize, v: usize, n: usize, rank: usize) -> Vec<Action> {
    let f = |stage, microbatch| Action::Forward { stage, microbatch };
    let b = |stage, microbatch| Action::Backward { stage, microbatch };
    match schedule {
        Schedule::GPipe => (0..n).map(|m| f(rank, m)).chain((0..n).map(|m| b(rank, m))).collect(),
        Schedule::OneFOneB => {
            let warmup = (pp - 1 - rank).min(n);
            one_f_one_b(n, warmup, |k| f(rank, k), |k| b(rank, k))
        }
        Schedule::Interleaved1F1B => {
            // k-th forward/backward of this rank → (stage, microbatch), Megatron's order.
            let mb = |k: usize| (k / (pp * v)) * pp + k % pp;
            let chunk = |k: usize| (k / pp) % v;
            let total = n * v;
            let warmup = (2 * (pp - 1 - rank) + (v - 1) * pp).min(total);
            one_f_one_b(total, warmup, |k| f(chunk(k) * pp + rank, mb(k)), |k| b((v - 1 - chunk(k)) * pp + rank, mb(k)))
        }
    }
}

/// The most microbatch-stages whose activations a rank holds at once (forwards run whose
/// backward has not): what the schedule costs in activation memory.
pub fn peak_in_flight(actions: &[Action]) -> usize {
    let (mut live, mut peak) = (0usize, 0usize);
    for a in actions {
        match a {
            Action::Forward { .. } => live += 1,
            Action::Backward { .. } => live = live.saturating_sub(1),
        }
        peak = peak.max(live);
    }
    peak
}

/// `warmup` forwards, then forward/backward pairs, then the remaining backwards.
fn one_f_one_b(total: usize, warmup: usize, f: impl Fn(usize) -> Action, b: impl Fn(usize) -> Action) -> Vec<Action> {
    let mut out: Vec<Action> = (0..warmup).map(&f).collect();
    for i in 0..total - warmup {
        out.push(f(warmup + i));
        out.push(b(i));
    }
    out.extend((total - warmup..total).map(b));
    out
}

/// A simulated run: each action's start time per rank (forward 1 unit, backward 2).
#[derive(Debug, Clone)]
pub struct Timeline {
    pub rows: Vec<Vec<(usize, Action)>>,
    pub makespan: usize,
    /// Idle share of `ranks × makespan`.
    pub bubble: f64,
    pub virtual_stages: usize,
}

/// Simulates the schedule with its data dependencies (a stage's forward needs the previous
/// stage's, a backward the next stage's backward, or its own forward on the last stage). An
/// order that can never finish is an error (a schedule bug would deadlock).
pub fn simulate(schedule: Schedule, pp: usize, v: usize, n: usize) -> Result<Timeline, String> {
    let stages = pp * v;
    let plans: Vec<Vec<Action>> = (0..pp).map(|r| rank_actions(schedule, pp, v, n, r)).collect();
    let (mut fdone, mut bdone) = (vec![vec![None; n]; stages], vec![vec![None; n]; stages]);
    let (mut next, mut free) = (vec![0usize; pp], vec![0usize; pp]);
    let mut rows = vec![Vec::new(); pp];
    loop {
        let mut progressed = false;
        for r in 0..pp {
            while let Some(&a) = plans[r].get(next[r]) {
                let (ready, cost) = match a {
                    Action::Forward { stage, microbatch: m } => {
                        (if stage == 0 { Some(0) } else { fdone[stage - 1][m] }, 1)
                    }
                    Action::Backward { stage, microbatch: m } => {
                        (if stage == stages - 1 { fdone[stage][m] } else { bdone[stage + 1][m] }, 2)
                    }
                };
                let Some(ready) = ready else { break };
                let start = free[r].max(ready);
                free[r] = start + cost;
                match a {
                    Action::Forward { stage, microbatch } => fdone[stage][microbatch] = Some(free[r]),
                    Action::Backward { stage, microbatch } => bdone[stage][microbatch] = Some(free[r]),
                }
                rows[r].push((start, a));
                next[r] += 1;
                progressed = true;
            }
        }
        if (0..pp).all(|r| next[r] == plans[r].len()) {
            break;
        }
        if !progressed {
            return Err(format!("schedule {schedule:?} cannot finish: ranks wait on each other at {next:?}"));
        }
    }
    let makespan = free.iter().copied().max().unwrap_or(0);
    let busy = 3 * n * stages;
    Ok(Timeline { rows, makespan, bubble: 1.0 - busy as f64 / (pp * makespan) as f64, virtual_stages: v })
}

impl Timeline {
    /// One line per rank, one cell per time unit: `F3` forward of microbatch 3 (`F3.1` on the
    /// rank's second stage), `B3` backward (two cells), `.` idle.
    pub fn render(&self) -> String {
        let label = |a: &Action| {
            let (k, stage, m) = match *a {
                Action::Forward { stage, microbatch } => ('F', stage, microbatch),
                Action::Backward { stage, microbatch } => ('B', stage, microbatch),
            };
            let pp = self.rows.len();
            if self.virtual_stages > 1 {
                format!("{k}{m}.{}", stage / pp)
            } else {
                format!("{k}{m}")
            }
        };
        let width = self.rows.iter().flatten().map(|(_, a)| label(a).len()).max().unwrap_or(2) + 1;
        let mut out = String::new();
        for (r, row) in self.rows.iter().enumerate() {
            let mut cells = vec![".".to_string(); self.makespan];
            for (start, a) in row {
                let cost = if matches!(a, Action::Forward { .. }) { 1 } else { 2 };
                for c in cells.iter_mut().skip(*start).take(cost) {
                    *c = label(a);
                }
            }
            let _ = write!(out, "rank {r} |");
            for c in cells {
                let _ = write!(out, "{c:<width$}");
            }
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(actions: &[Action], n: usize, stages: &[usize]) {
        for &s in stages {
            for m in 0..n {
                assert_eq!(actions.iter().filter(|a| **a == Action::Forward { stage: s, microbatch: m }).count(), 1);
                assert_eq!(actions.iter().filter(|a| **a == Action::Backward { stage: s, microbatch: m }).count(), 1);
            }
        }
    }

    #[test]
    fn every_schedule_runs_each_forward_and_backward_once_and_finishes() {
        for (schedule, v) in [(Schedule::GPipe, 1), (Schedule::OneFOneB, 1), (Schedule::Interleaved1F1B, 2)] {
            for pp in [2, 4] {
                for n in [pp, 2 * pp, 3 * pp] {
                    for r in 0..pp {
                        let stages: Vec<usize> = (0..v).map(|c| c * pp + r).collect();
                        count(&rank_actions(schedule, pp, v, n, r), n, &stages);
                    }
                    simulate(schedule, pp, v, n).unwrap();
                }
            }
        }
    }

    #[test]
    fn bubbles_match_the_textbook_values() {
        // GPipe and 1F1B: (pp − 1) / (n + pp − 1) of the time idle.
        for s in [Schedule::GPipe, Schedule::OneFOneB] {
            let t = simulate(s, 4, 1, 8).unwrap();
            assert!((t.bubble - 3.0 / 11.0).abs() < 1e-9, "{s:?}: {}", t.bubble);
        }
        // Interleaving with v stages per rank shrinks it (Megatron: by about v).
        let t = simulate(Schedule::Interleaved1F1B, 4, 2, 8).unwrap();
        assert!(t.bubble < 3.0 / 11.0 * 0.75, "{}", t.bubble);
        // 1F1B keeps at most pp − rank microbatches in flight on rank `rank`.
        let a = rank_actions(Schedule::OneFOneB, 4, 1, 8, 0);
        assert_eq!(peak_in_flight(&a), 4);
        assert_eq!(peak_in_flight(&rank_actions(Schedule::OneFOneB, 4, 1, 8, 3)), 1);
        assert_eq!(peak_in_flight(&rank_actions(Schedule::GPipe, 4, 1, 8, 3)), 8);
    }
}
