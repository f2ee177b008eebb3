//! The n-dimensional rank grid (TorchTitan's `ParallelDims`).
//!
//! Axis order, outermost first: `pp, dp_replicate, dp_shard, cp, tp` (as TorchTitan; tp
//! innermost, so a TP group is made of consecutive ranks). Derived groups: `dp` = replicate ×
//! shard (data loading), `fsdp` = shard × cp (the context-parallel ranks also shard the
//! weights). Size-1 axes give single-rank groups, on which collectives are no-ops.

use std::fmt;

/// The degrees as written in `[parallelism]` (`data_parallel_shard_degree` may be -1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParallelDims {
    pub dp_replicate: usize,
    pub dp_shard: usize,
    pub cp: usize,
    pub tp: usize,
    pub pp: usize,
    pub ep: usize,
    pub world_size: usize,
}

/// An axis of the mesh, or a derived (flattened) group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Axis {
    Pp,
    DpReplicate,
    DpShard,
    /// Context parallelism: the ranks that split each sequence.
    Cp,
    Tp,
    /// dp_replicate × dp_shard: data loading, loss and DDP gradient reduction.
    Dp,
    /// dp_shard × cp: FSDP parameter sharding.
    Fsdp,
    /// Expert parallelism: `ep` consecutive ranks of dp_shard × cp × tp (borrowing tp first,
    /// then cp, then dp_shard, as TorchTitan) split the routed experts.
    Ep,
    /// The ranks of dp_shard × cp × tp holding the same experts (`/ ep` of them): FSDP of the
    /// expert weights.
    Efsdp,
}

impl fmt::Display for Axis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Axis::Pp => "pp",
            Axis::DpReplicate => "dp_replicate",
            Axis::DpShard => "dp_shard",
            Axis::Cp => "cp",
            Axis::Tp => "tp",
            Axis::Dp => "dp",
            Axis::Fsdp => "fsdp",
            Axis::Ep => "ep",
            Axis::Efsdp => "efsdp",
        })
    }
}

impl ParallelDims {
    /// Resolves `dp_shard = -1` to the ranks the other degrees leave and checks the product.
    /// Errors name the `[parallelism]` key to change and values that would work.
    pub fn new(
        dp_replicate: i64,
        dp_shard: i64,
        cp: i64,
        tp: i64,
        pp: i64,
        ep: i64,
        world_size: usize,
    ) -> Result<Self, String> {
        let positive = |key: &str, v: i64| -> Result<usize, String> {
            if v >= 1 {
                Ok(v as usize)
            } else {
                Err(format!("`parallelism.{key}` = {v} must be >= 1"))
            }
        };
        let dp_replicate = positive("data_parallel_replicate_degree", dp_replicate)?;
        let cp = positive("context_parallel_degree", cp)?;
        let tp = positive("tensor_parallel_degree", tp)?;
        let pp = positive("pipeline_parallel_degree", pp)?;
        let ep = positive("expert_parallel_degree", ep)?;
        if world_size == 0 {
            return Err("world size must be >= 1".into());
        }
        let others = dp_replicate * cp * tp * pp;
        let dp_shard = match dp_shard {
            -1 => {
                if world_size % others != 0 {
                    return Err(format!(
                        "`parallelism.data_parallel_shard_degree` = -1 needs the world size {world_size} to be a multiple of dp_replicate·cp·tp·pp = {others}; change the other degrees or the number of ranks"
                    ));
                }
                world_size / others
            }
            v => positive("data_parallel_shard_degree", v)?,
        };
        let product = others * dp_shard;
        if product != world_size {
            return Err(format!(
                "invalid parallel dims: dp_replicate({dp_replicate}) · dp_shard({dp_shard}) · cp({cp}) · tp({tp}) · pp({pp}) = {product} != world size {world_size}; set `parallelism.data_parallel_shard_degree` = -1 to use the remaining ranks, or launch {product} ranks"
            ));
        }
        if (dp_shard * cp * tp) % ep != 0 {
            return Err(format!(
                "`parallelism.expert_parallel_degree` = {ep} must divide dp_shard·cp·tp = {}",
                dp_shard * cp * tp
            ));
        }
        Ok(Self { dp_replicate, dp_shard, cp, tp, pp, ep, world_size })
    }

    /// Every mesh dimension with its degree (TorchTitan's names), expert parallelism when on:
    /// `replicate 1 × shard 1 × cp 2 × tp 2 × pp 2`. The one description the start-up line,
    /// `titan-rs plan` and `checkpoint inspect` print.
    pub fn describe(&self) -> String {
        let ep = if self.ep > 1 { format!(" (ep {} over shard × cp × tp)", self.ep) } else { String::new() };
        format!(
            "replicate {} × shard {} × cp {} × tp {} × pp {}{ep}",
            self.dp_replicate, self.dp_shard, self.cp, self.tp, self.pp
        )
    }

    pub fn dp(&self) -> usize {
        self.dp_replicate * self.dp_shard
    }
    pub fn dp_enabled(&self) -> bool {
        self.dp() > 1
    }
    pub fn fsdp_enabled(&self) -> bool {
        self.dp_shard > 1
    }
    pub fn cp_enabled(&self) -> bool {
        self.cp > 1
    }
    /// The FSDP group's size: the shard ranks and the context-parallel ranks together.
    pub fn fsdp_size(&self) -> usize {
        self.dp_shard * self.cp
    }
    pub fn tp_enabled(&self) -> bool {
        self.tp > 1
    }
    pub fn pp_enabled(&self) -> bool {
        self.pp > 1
    }
    pub fn ep_enabled(&self) -> bool {
        self.ep > 1
    }
    /// The expert weights' FSDP group size: dp_shard · cp · tp / ep.
    pub fn efsdp_size(&self) -> usize {
        self.dp_shard * self.cp * self.tp / self.ep
    }

    /// Ranks that do not split the data (tp·pp·cp): the divisor for per-device throughput.
    pub fn non_data_parallel_size(&self) -> usize {
        self.cp * self.tp * self.pp
    }

    /// Checks the degrees against a model; each error names the key and values that work.
    pub fn validate_model(
        &self,
        n_heads: usize,
        n_kv_heads: usize,
        ffn_hidden: usize,
        vocab: usize,
        n_layers: usize,
    ) -> Result<(), String> {
        let tp = self.tp;
        for (what, n) in [
            ("n_heads", n_heads),
            ("n_kv_heads", n_kv_heads),
            ("the FFN hidden size", ffn_hidden),
            ("vocab_size", vocab),
        ] {
            if n % tp != 0 {
                return Err(format!(
                    "`parallelism.tensor_parallel_degree` = {tp} does not divide the model's {what} ({n}); use one of {:?}",
                    common_divisors(&[n_heads, n_kv_heads, ffn_hidden, vocab])
                ));
            }
        }
        if self.pp > n_layers {
            return Err(format!(
                "`parallelism.pipeline_parallel_degree` = {} exceeds the model's {n_layers} layers; use at most {n_layers}",
                self.pp
            ));
        }
        Ok(())
    }

    pub fn mesh(&self) -> Mesh {
        Mesh { dims: *self }
    }
}

fn common_divisors(ns: &[usize]) -> Vec<usize> {
    let g = ns.iter().fold(0, |a, &b| gcd(a, b));
    (1..=g).filter(|d| g % d == 0).collect()
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Rank ↔ coordinates, and the members of each rank's groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mesh {
    pub dims: ParallelDims,
}

/// A rank's position on each axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Coords {
    pub pp: usize,
    pub dp_replicate: usize,
    pub dp_shard: usize,
    pub cp: usize,
    pub tp: usize,
}

impl Coords {
    /// The rank's index among the data-parallel ranks (its data shard).
    pub fn dp_rank(&self, d: &ParallelDims) -> usize {
        self.dp_replicate * d.dp_shard + self.dp_shard
    }
}

impl Mesh {
    fn sizes(&self) -> [usize; 5] {
        let d = &self.dims;
        [d.pp, d.dp_replicate, d.dp_shard, d.cp, d.tp]
    }

    pub fn coords(&self, rank: usize) -> Coords {
        let [_, r, s, c, t] = self.sizes();
        Coords {
            pp: rank / (r * s * c * t),
            dp_replicate: (rank / (s * c * t)) % r,
            dp_shard: (rank / (c * t)) % s,
            cp: (rank / t) % c,
            tp: rank % t,
        }
    }

    pub fn rank_of(&self, x: Coords) -> usize {
        let [_, r, s, c, t] = self.sizes();
        (((x.pp * r + x.dp_replicate) * s + x.dp_shard) * c + x.cp) * t + x.tp
    }

    /// `rank`'s index in the flattened dp_shard × cp × tp block (tp fastest).
    fn expert_index(&self, x: &Coords) -> usize {
        (x.dp_shard * self.dims.cp + x.cp) * self.dims.tp + x.tp
    }

    /// The ranks of `rank`'s group along `axis`, ascending; the group's rank order.
    pub fn group(&self, axis: Axis, rank: usize) -> Vec<usize> {
        let x = self.coords(rank);
        if matches!(axis, Axis::Ep | Axis::Efsdp) {
            let (ep, f) = (self.dims.ep, self.expert_index(&x));
            let same = |y: &Coords| {
                let g = self.expert_index(y);
                y.pp == x.pp
                    && y.dp_replicate == x.dp_replicate
                    && if axis == Axis::Ep { g / ep == f / ep } else { g % ep == f % ep }
            };
            return (0..self.dims.world_size).filter(|&r| same(&self.coords(r))).collect();
        }
        let [p, r, s, c, t] = self.sizes();
        let one = |v: usize| v..v + 1;
        let (pp, rr, ss, cc, tt) = match axis {
            Axis::Pp => (0..p, one(x.dp_replicate), one(x.dp_shard), one(x.cp), one(x.tp)),
            Axis::DpReplicate => (one(x.pp), 0..r, one(x.dp_shard), one(x.cp), one(x.tp)),
            Axis::DpShard => (one(x.pp), one(x.dp_replicate), 0..s, one(x.cp), one(x.tp)),
            Axis::Cp => (one(x.pp), one(x.dp_replicate), one(x.dp_shard), 0..c, one(x.tp)),
            Axis::Fsdp => (one(x.pp), one(x.dp_replicate), 0..s, 0..c, one(x.tp)),
            Axis::Tp => (one(x.pp), one(x.dp_replicate), one(x.dp_shard), one(x.cp), 0..t),
            Axis::Dp => (one(x.pp), 0..r, 0..s, one(x.cp), one(x.tp)),
            Axis::Ep | Axis::Efsdp => unreachable!("handled above"),
        };
        let mut out = Vec::new();
        for a in pp {
            for b in rr.clone() {
                for e in ss.clone() {
                    for g in cc.clone() {
                        for f in tt.clone() {
                            out.push(self.rank_of(Coords { pp: a, dp_replicate: b, dp_shard: e, cp: g, tp: f }));
                        }
                    }
                }
            }
        }
        out.sort();
        out
    }

    /// Seed for `rank`: the same on every SPMD axis, distinct per pipeline stage (TorchTitan).
    pub fn seed(&self, base: u64, rank: usize) -> u64 {
        base.wrapping_add(self.coords(rank).pp as u64 * 0x9E37_79B9)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(r: i64, s: i64, tp: i64, pp: i64, world: usize) -> Result<ParallelDims, String> {
        ParallelDims::new(r, s, 1, tp, pp, 1, world)
    }

    #[test]
    fn shard_degree_minus_one_takes_the_remaining_ranks() {
        let d = dims(2, -1, 2, 1, 8).unwrap();
        assert_eq!((d.dp_replicate, d.dp_shard, d.tp), (2, 2, 2));
        assert_eq!(dims(1, -1, 1, 1, 1).unwrap().dp_shard, 1);
        assert_eq!(dims(1, -1, 1, 2, 8).unwrap().dp_shard, 4);
        assert!(d.dp_enabled() && d.fsdp_enabled() && d.tp_enabled() && !d.pp_enabled());
        assert_eq!(d.dp(), 4);
        assert_eq!(d.non_data_parallel_size(), 2);
    }

    #[test]
    fn product_must_equal_world_size() {
        let e = dims(2, 2, 1, 1, 8).unwrap_err();
        assert!(e.contains("invalid parallel dims") && e.contains("= 4 != world size 8") && e.contains("-1"), "{e}");
        let e = dims(1, -1, 3, 1, 8).unwrap_err();
        assert!(e.contains("multiple of dp_replicate·cp·tp·pp = 3"), "{e}");
        let e = dims(0, 1, 1, 1, 1).unwrap_err();
        assert!(e.contains("data_parallel_replicate_degree` = 0"), "{e}");
        let e = ParallelDims::new(1, 2, 1, 1, 1, 3, 2).unwrap_err();
        assert!(e.contains("expert_parallel_degree` = 3"), "{e}");
    }

    #[test]
    fn tp_is_innermost_and_groups_partition_the_world() {
        let m = dims(2, 2, 2, 2, 16).unwrap().mesh();
        assert_eq!(m.group(Axis::Tp, 5), vec![4, 5]);
        assert_eq!(m.group(Axis::DpShard, 5), vec![5, 7]);
        assert_eq!(m.group(Axis::DpReplicate, 5), vec![1, 5]);
        assert_eq!(m.group(Axis::Dp, 5), vec![1, 3, 5, 7]);
        assert_eq!(m.group(Axis::Pp, 5), vec![5, 13]);
        for axis in [
            Axis::Pp,
            Axis::DpReplicate,
            Axis::DpShard,
            Axis::Cp,
            Axis::Fsdp,
            Axis::Tp,
            Axis::Dp,
            Axis::Ep,
            Axis::Efsdp,
        ] {
            let mut seen = vec![0; 16];
            for r in 0..16 {
                let g = m.group(axis, r);
                assert!(g.contains(&r));
                for &x in &g {
                    seen[x] += 1;
                    assert_eq!(m.group(axis, x), g, "groups must agree between members");
                }
            }
            let size = m.group(axis, 0).len();
            assert!(seen.iter().all(|&c| c == size), "{axis}: {seen:?}");
        }
        for r in 0..16 {
            assert_eq!(m.rank_of(m.coords(r)), r);
        }
    }

    /// pp, dp_replicate, dp_shard, cp, tp (TorchTitan's order): cp sits between shard and tp,
    /// and FSDP spans dp_shard × cp.
    #[test]
    fn cp_sits_inside_dp_shard_and_fsdp_spans_both() {
        let m = ParallelDims::new(1, 2, 2, 2, 1, 1, 8).unwrap().mesh();
        assert_eq!(m.group(Axis::Tp, 5), vec![4, 5]);
        assert_eq!(m.group(Axis::Cp, 5), vec![5, 7]);
        assert_eq!(m.group(Axis::DpShard, 5), vec![1, 5]);
        assert_eq!(m.group(Axis::Fsdp, 5), vec![1, 3, 5, 7]);
        assert_eq!(m.group(Axis::Dp, 5), vec![1, 5]);
        assert_eq!(m.coords(5), Coords { pp: 0, dp_replicate: 0, dp_shard: 1, cp: 0, tp: 1 });
        for r in 0..8 {
            assert_eq!(m.rank_of(m.coords(r)), r);
        }
    }

    /// EP borrows tp first, then cp, then dp_shard; the expert FSDP group is the rest.
    #[test]
    fn ep_groups_borrow_tp_then_cp_then_dp_shard() {
        // dp_shard 2 × tp 2, ep 2: EP over the TP pair, expert FSDP over the shard pair.
        let m = ParallelDims::new(1, 2, 1, 2, 1, 2, 4).unwrap().mesh();
        assert_eq!(m.group(Axis::Ep, 2), vec![2, 3]);
        assert_eq!(m.group(Axis::Efsdp, 2), vec![0, 2]);
        // dp_shard 4, ep 2 (replicate 2): EP pairs of shard ranks, within a replica.
        let m = ParallelDims::new(2, 4, 1, 1, 1, 2, 8).unwrap().mesh();
        assert_eq!(m.group(Axis::Ep, 5), vec![4, 5]);
        assert_eq!(m.group(Axis::Efsdp, 5), vec![5, 7]);
        assert_eq!(m.dims.efsdp_size(), 2);
        // ep = dp_shard · tp: every rank of the replica holds different experts.
        let m = ParallelDims::new(1, 2, 1, 2, 2, 4, 8).unwrap().mesh();
        assert_eq!(m.group(Axis::Ep, 6), vec![4, 5, 6, 7]);
        assert_eq!(m.group(Axis::Efsdp, 6), vec![6]);
    }

    #[test]
    fn size_one_axes_are_single_rank_groups() {
        let m = dims(1, -1, 1, 1, 4).unwrap().mesh();
        assert_eq!(m.group(Axis::Tp, 2), vec![2]);
        assert_eq!(m.group(Axis::Pp, 2), vec![2]);
        assert_eq!(m.group(Axis::Fsdp, 2), vec![0, 1, 2, 3]);
        assert_eq!(m.coords(3).dp_rank(&m.dims), 3);
    }

    #[test]
    fn seeds_are_shared_across_spmd_axes_and_distinct_per_stage() {
        let m = dims(1, 2, 2, 2, 8).unwrap().mesh();
        assert_eq!(m.seed(42, 0), m.seed(42, 3));
        assert_ne!(m.seed(42, 0), m.seed(42, 4));
    }

    #[test]
    fn model_validation_names_the_key_and_what_works() {
        let d = dims(1, 1, 3, 1, 3).unwrap();
        let e = d.validate_model(16, 16, 768, 2048, 6).unwrap_err();
        assert!(
            e.contains("tensor_parallel_degree` = 3") && e.contains("n_heads (16)") && e.contains("[1, 2, 4, 8, 16]"),
            "{e}"
        );
        let d = dims(1, 1, 1, 8, 8).unwrap();
        let e = d.validate_model(16, 16, 768, 2048, 6).unwrap_err();
        assert!(e.contains("pipeline_parallel_degree` = 8") && e.contains("at most 6"), "{e}");
        dims(1, 1, 4, 2, 8).unwrap().validate_model(16, 16, 768, 2048, 6).unwrap();
    }
}
