//! Mixture-of-experts FFN (DeepSeek-V3 / Qwen3-MoE style, TorchTitan's `moe.py`): a top-k
//! router, routed SwiGLU experts run as one grouped GEMM over the tokens sorted by expert,
//! optional shared experts, and auxiliary-loss-free load balancing (a per-expert bias added to
//! the scores for the choice of experts only, moved toward balance from the token counts after
//! each step).
//!
//! No communication here: where the tokens of an expert are computed is the hooks' business
//! ([`crate::hooks::ActivationHooks::experts`]; expert parallelism sends them to the rank that
//! holds the expert and back).

use crate::args::{ModelArgs, MoeArgs, ScoreFunc};
use crate::hooks::Hooks;
use crate::init::{lazy_param, param_id, Init};
use crate::layers::Linear;
use burn::module::Param;
use burn::prelude::*;
use burn::tensor::FloatDType;
use std::sync::{Arc, Mutex};

const INIT_STD: f64 = 0.02;

/// The router: `scores = score_func(x · gate)`, `[tokens, experts]`.
#[derive(Module, Debug)]
pub struct Router {
    pub gate: Linear,
}

/// The routed experts, stacked: `w1, w3: [experts, dim, hidden]`, `w2: [experts, hidden, dim]`
/// (under expert parallelism, this rank's experts only).
#[derive(Module, Debug)]
pub struct GroupedExperts {
    pub w1: Param<Tensor<3>>,
    pub w2: Param<Tensor<3>>,
    pub w3: Param<Tensor<3>>,
    /// Use the grouped GEMM kernel where the device has one.
    pub fused: bool,
}

impl GroupedExperts {
    fn new(seed: u64, path: &str, e: usize, dim: usize, hidden: usize, out_std: f64, device: &Device) -> Self {
        let p = |n: &str| format!("{path}.{n}");
        Self {
            w1: lazy_param(seed, &p("w1"), [e, dim, hidden], Init::TruncNormal { std: INIT_STD }, device),
            w2: lazy_param(seed, &p("w2"), [e, hidden, dim], Init::TruncNormal { std: out_std }, device),
            w3: lazy_param(seed, &p("w3"), [e, dim, hidden], Init::TruncNormal { std: out_std }, device),
            fused: true,
        }
    }

    /// SwiGLU of every expert over its rows: `xs` sorted by (local) expert, `sizes[e]` rows each.
    pub fn forward(&self, xs: Tensor<2>, sizes: &[usize]) -> Tensor<2> {
        let dtype = xs.dtype();
        let w = |p: &Param<Tensor<3>>| p.val().cast(dtype);
        let gm = |x: Tensor<2>, w: Tensor<3>| titan_kernels::grouped_matmul(x, w, sizes, self.fused);
        let h = titan_kernels::silu_mul(gm(xs.clone(), w(&self.w1)), gm(xs, w(&self.w3)), self.fused);
        gm(h, w(&self.w2))
    }

    /// Experts held here (a slice of them under expert parallelism).
    pub fn local_experts(&self) -> usize {
        self.w1.lazy_shape()[0]
    }
}

/// The shared experts: one SwiGLU FFN of `hidden · num_shared` units every token goes through.
#[derive(Module, Debug)]
pub struct SharedExperts {
    pub w1: Linear,
    pub w2: Linear,
    pub w3: Linear,
    pub fused: bool,
}

impl SharedExperts {
    fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        self.w2.forward(titan_kernels::silu_mul(self.w1.forward(x.clone()), self.w3.forward(x), self.fused))
    }
}

/// What the training forward passes of a layer routed since the last [`MoE::take_load`]
/// (shared by the clones of a layer).
#[derive(Debug, Clone, Default)]
pub struct LoadCounter(Arc<Mutex<Load>>);

/// Tokens per expert, and this rank's part of the balance loss in the objective.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Load {
    pub tokens: Vec<u64>,
    pub aux_loss: f64,
}

impl LoadCounter {
    fn add(&self, counts: &[usize], aux_loss: f64) {
        let mut l = self.0.lock().expect("load counter");
        let n = counts.len().max(l.tokens.len());
        l.tokens.resize(n, 0);
        l.tokens.iter_mut().zip(counts).for_each(|(a, &c)| *a += c as u64);
        l.aux_loss += aux_loss;
    }
    fn take(&self) -> Load {
        std::mem::take(&mut *self.0.lock().expect("load counter"))
    }
}

thread_local! {
    static OBJECTIVE_TOKENS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The tokens the step's loss is averaged over (the trainer sets it before each step): the
/// balance loss of a sequence joins the objective weighted by its positions over this count,
/// so it enters as a mean over the batch's sequences.
pub fn set_objective_tokens(n: usize) {
    OBJECTIVE_TOKENS.with(|c| c.set(n));
}

#[derive(Module, Debug)]
pub struct MoE {
    pub router: Router,
    pub experts: GroupedExperts,
    pub shared_experts: Option<SharedExperts>,
    /// Aux-loss-free balancing: added to the scores when choosing experts (not to the weights).
    /// Not trained by gradients; moved by [`bias_update`] after each step.
    pub expert_bias: Param<Tensor<1>>,
    #[module(skip)]
    pub cfg: MoeArgs,
    #[module(skip)]
    pub load: LoadCounter,
}

impl MoE {
    pub fn new(a: &ModelArgs, m: &MoeArgs, seed: u64, path: &str, out_std: f64, device: &Device) -> Self {
        let p = |n: &str| format!("{path}.{n}");
        let shared = m.num_shared_experts * m.hidden_dim;
        let e = m.num_experts;
        Self {
            router: Router { gate: Linear::new(seed, &p("router.gate"), a.dim, e, INIT_STD, device) },
            experts: GroupedExperts::new(seed, &p("experts"), e, a.dim, m.hidden_dim, out_std, device),
            shared_experts: (shared > 0).then(|| SharedExperts {
                w1: Linear::new(seed, &p("shared_experts.w1"), a.dim, shared, INIT_STD, device),
                w2: Linear::new(seed, &p("shared_experts.w2"), shared, a.dim, out_std, device),
                w3: Linear::new(seed, &p("shared_experts.w3"), a.dim, shared, out_std, device),
                fused: true,
            }),
            expert_bias: bias_param(&p("expert_bias"), e, device),
            cfg: m.clone(),
            load: LoadCounter::default(),
        }
    }

    /// `x: [B, T, D]` → `[B, T, D]`.
    pub fn forward(&self, x: Tensor<3>, hooks: &Hooks) -> Tensor<3> {
        let x = hooks.moe_input(x);
        let [b, t, d] = x.dims();
        let (n, k, e) = (b * t, self.cfg.top_k, self.cfg.num_experts);
        let flat = x.reshape([n, d]);
        let device = flat.device();
        let scores = self.cfg.score_func.apply(self.router.gate.forward(flat.clone()).cast(FloatDType::F32));
        let bias = host(self.expert_bias.val());
        let groups = (self.cfg.n_group, self.cfg.topk_group);
        let route = Routing::choose_grouped(&host(scores.clone()), &bias, e, k, groups);
        let training = device.is_autodiff();
        let aux = (training && self.cfg.aux_loss_alpha > 0.0).then(|| self.balance_loss(scores.clone(), &route, b, t));
        if training {
            // Training passes only (a checkpointed block counts in its recomputation).
            let value = aux
                .as_ref()
                .map_or(0.0, |(l, scale)| titan_kernels::transfer::scalar(l.clone().reshape([1])) as f64 * scale);
            self.load.add(&route.counts, value);
        }
        let ints = |v: &[usize]| {
            titan_kernels::transfer::to_device::<1, Int>(
                TensorData::new(v.iter().map(|&i| i as i64).collect(), [v.len()]),
                &device,
            )
        };
        let chosen = ints(&route.experts).reshape([n, k]);
        let mut weights = scores.gather(1, chosen);
        if self.cfg.route_norm {
            weights = weights.clone() / (weights.sum_dim(1) + 1e-20);
        }
        let weights = weights.mul_scalar(self.cfg.route_scale).cast(flat.dtype());
        // Rows sorted by expert, computed wherever the hooks place the experts, then back in
        // (token, choice) order and summed with the routing weights.
        let (sorted_tokens, row_of_slot) = route.permutation();
        let xs = flat.clone().select(0, ints(&sorted_tokens));
        let ys = hooks.experts(xs, &route.counts, &|xs, sizes| self.experts.forward(xs, sizes));
        let ys = ys.select(0, ints(&row_of_slot));
        let mut y = (ys.reshape([n, k, d]) * weights.reshape([n, k, 1])).sum_dim(1).reshape([n, d]);
        if let Some(s) = &self.shared_experts {
            y = y + s.forward(flat);
        }
        if let Some((loss, scale)) = aux {
            y = titan_kernels::attach_aux_loss(y, loss, scale);
        }
        hooks.moe_output(y.reshape([b, t, d]))
    }

    /// DeepSeek-V3's sequence-wise balance loss over the `b` sequences of `t` positions this
    /// rank routes: `α · Σ_e f_e · P_e` per sequence, with `f_e = E / (K·t) ·` (tokens routed
    /// to `e`) and `P_e` the mean normalised score of `e`; summed over the sequences, with the
    /// weight that makes it a mean over the batch's sequences in the objective.
    fn balance_loss(&self, scores: Tensor<2>, route: &Routing, b: usize, t: usize) -> (Tensor<1>, f64) {
        let (e, k) = (self.cfg.num_experts, self.cfg.top_k);
        let normalised = scores.clone() / scores.sum_dim(1);
        let p = normalised.reshape([b, t, e]).mean_dim(1).reshape([b, e]);
        let mut f = vec![0f32; b * e];
        for (slot, &expert) in route.experts.iter().enumerate() {
            f[(slot / k / t) * e + expert] += e as f32 / (k * t) as f32;
        }
        let f = titan_kernels::transfer::to_device::<2, Float>(TensorData::new(f, [b, e]), &p.device());
        let loss = (p * f).sum().mul_scalar(self.cfg.aux_loss_alpha);
        let tokens = OBJECTIVE_TOKENS.with(|c| c.get()).max(1);
        (loss, t as f64 / tokens as f64)
    }

    /// The tokens routed to each expert, and the balance loss, of the training passes since the
    /// last call.
    pub fn take_load(&self) -> Load {
        self.load.take()
    }

    /// Puts back a [`Load`] taken with [`MoE::take_load`] (passes that must not count, such as
    /// the trainer's silent-data-corruption probe, run between the two).
    pub fn restore_load(&self, load: Load) {
        *self.load.0.lock().expect("load counter") = load;
    }

    pub fn with_fused(mut self, fused: bool) -> Self {
        self.experts.fused = fused;
        self.router.gate.fused = fused;
        if let Some(s) = &mut self.shared_experts {
            s.fused = fused;
            for l in [&mut s.w1, &mut s.w2, &mut s.w3] {
                l.fused = fused;
            }
        }
        self
    }
}

/// Whether the parameter at `path` is moved by the balancing step rather than by gradients (it
/// has no optimizer state and is never sharded).
pub fn is_balancing_bias(path: &str) -> bool {
    path.ends_with(".expert_bias")
}

/// The balancing bias, zeros, not trained by gradients.
fn bias_param(path: &str, e: usize, device: &Device) -> Param<Tensor<1>> {
    Param::uninitialized(
        param_id(path),
        move |device: &Device, _require_grad: bool| Tensor::<1>::zeros([e], device),
        device.clone(),
        false,
        Shape::from(vec![e]),
    )
}

fn host<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    titan_kernels::transfer::to_host_f32(t)
}

impl ScoreFunc {
    fn apply(self, logits: Tensor<2>) -> Tensor<2> {
        match self {
            ScoreFunc::Softmax => burn::tensor::activation::softmax(logits, 1),
            ScoreFunc::Sigmoid => burn::tensor::activation::sigmoid(logits),
        }
    }
}

/// Which experts each token goes to.
#[derive(Debug, Clone, PartialEq)]
pub struct Routing {
    /// `[tokens · k]`: token `i`'s choices at `i·k ..`, best first.
    pub experts: Vec<usize>,
    /// Tokens routed to each expert.
    pub counts: Vec<usize>,
    pub k: usize,
}

impl Routing {
    /// Top-`k` of `scores + bias` per token (`scores: [tokens, e]` row-major); ties go to the
    /// lower expert index, so every rank and layout chooses the same.
    pub fn choose(scores: &[f32], bias: &[f32], e: usize, k: usize) -> Self {
        Self::choose_grouped(scores, bias, e, k, (1, 1))
    }

    /// [`Self::choose`] limited to groups (DeepSeek-V3, as transformers routes): the experts
    /// form `n_group` consecutive groups, each scored by the sum of its two best `score + bias`;
    /// a token's `k` experts come from the `topk_group` best groups (ties to the lower index).
    pub fn choose_grouped(
        scores: &[f32],
        bias: &[f32],
        e: usize,
        k: usize,
        (n_group, topk_group): (usize, usize),
    ) -> Self {
        let n = scores.len() / e;
        let per_group = e / n_group;
        let mut experts = Vec::with_capacity(n * k);
        let mut counts = vec![0usize; e];
        let mut idx: Vec<usize> = (0..e).collect();
        let mut groups: Vec<usize> = (0..n_group).collect();
        let mut allowed = vec![true; e];
        for row in scores.chunks(e) {
            let key = |j: usize| row[j] + bias[j];
            if n_group > 1 {
                let best_two = |g: usize| {
                    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
                    for s in (g * per_group..(g + 1) * per_group).map(key) {
                        if s > a {
                            (a, b) = (s, a);
                        } else if s > b {
                            b = s;
                        }
                    }
                    if per_group > 1 {
                        a + b
                    } else {
                        a
                    }
                };
                let score: Vec<f32> = (0..n_group).map(best_two).collect();
                groups.sort_by(|&a, &b| score[b].total_cmp(&score[a]).then(a.cmp(&b)));
                allowed.fill(false);
                for &g in &groups[..topk_group] {
                    allowed[g * per_group..(g + 1) * per_group].fill(true);
                }
            }
            idx.sort_by(|&a, &b| allowed[b].cmp(&allowed[a]).then(key(b).total_cmp(&key(a))).then(a.cmp(&b)));
            for &j in &idx[..k] {
                experts.push(j);
                counts[j] += 1;
            }
        }
        Self { experts, counts, k }
    }

    /// The dispatch permutation, from one stable sort of the (token, choice) slots by expert:
    /// the token of each sorted row, and for each slot its row in the sorted order.
    pub fn permutation(&self) -> (Vec<usize>, Vec<usize>) {
        let mut order: Vec<usize> = (0..self.experts.len()).collect();
        order.sort_by_key(|&s| self.experts[s]);
        let mut row_of_slot = vec![0; order.len()];
        for (r, &s) in order.iter().enumerate() {
            row_of_slot[s] = r;
        }
        (order.into_iter().map(|s| s / self.k).collect(), row_of_slot)
    }
}

/// DeepSeek-V3's bias step from the tokens each expert got (summed over every rank routing
/// this layer's tokens): `bias += coeff · sign(mean − load)`, centred (TorchTitan subtracts the
/// mean of the step so the biases do not drift together).
pub fn bias_update(bias: &[f32], load: &[u64], coeff: f64) -> Vec<f32> {
    let mean = load.iter().sum::<u64>() as f64 / load.len().max(1) as f64;
    let sign = |x: f64| {
        if x > 0.0 {
            1.0
        } else if x < 0.0 {
            -1.0
        } else {
            0.0
        }
    };
    let step: Vec<f64> = load.iter().map(|&l| coeff * sign(mean - l as f64)).collect();
    let centre = step.iter().sum::<f64>() / step.len().max(1) as f64;
    bias.iter().zip(step).map(|(&b, s)| (b as f64 + s - centre) as f32).collect()
}

/// max / mean of tokens per expert (1 is perfect balance).
pub fn imbalance(load: &[u64]) -> f64 {
    let mean = load.iter().sum::<u64>() as f64 / load.len().max(1) as f64;
    if mean == 0.0 {
        return 1.0;
    }
    *load.iter().max().unwrap_or(&0) as f64 / mean
}
