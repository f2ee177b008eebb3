//! Multi-head latent attention (DeepSeek-V2/V3, TorchTitan's `deepseek_v3/model.py`): queries
//! through an optional low-rank bottleneck (`wq_a` → RMSNorm → `wq_b`), keys and values from one
//! compressed latent per position (`wkv_a` → RMSNorm → `wkv_b`), plus a RoPE part of every key
//! shared by the heads (the rest of `wkv_a`'s output). Each head's query and key are `[nope |
//! rope]`; values have their own width.
//!
//! No communication here; the heads are those this rank holds (tensor parallelism splits
//! `wq_b` / `wkv_b` by heads and `wo` by rows; the latent path is replicated). The attention
//! itself is the hooks' (one kernel for every family): values are padded with zero columns to
//! the query/key width and the padding cut from the output, which leaves the result exact.

use crate::args::{MlaArgs, ModelArgs};
use crate::hooks::Hooks;
use crate::layers::{Linear, RmsNorm};
use crate::positions::Positions;
use burn::prelude::*;

#[derive(Module, Debug)]
pub struct Mla {
    /// Queries without a bottleneck (`q_lora_rank` = 0).
    pub wq: Option<Linear>,
    pub wq_a: Option<Linear>,
    pub q_a_norm: Option<RmsNorm>,
    pub wq_b: Option<Linear>,
    pub wkv_a: Linear,
    pub kv_a_norm: RmsNorm,
    pub wkv_b: Linear,
    pub wo: Linear,
    #[module(skip)]
    pub cfg: MlaArgs,
    pub fused: bool,
}

impl Mla {
    pub fn new(a: &ModelArgs, m: &MlaArgs, seed: u64, path: &str, std: f64, out_std: f64, device: &Device) -> Self {
        let p = |n: &str| format!("{path}.{n}");
        let (h, qk) = (a.n_heads, m.qk_head_dim());
        let lora = m.q_lora_rank;
        let norm = |n: &str, d: usize| RmsNorm::new(seed, &p(n), d, a.norm_eps, device);
        Self {
            wq: (lora == 0).then(|| Linear::new(seed, &p("wq"), a.dim, h * qk, std, device)),
            wq_a: (lora > 0).then(|| Linear::new(seed, &p("wq_a"), a.dim, lora, std, device)),
            q_a_norm: (lora > 0).then(|| norm("q_a_norm", lora)),
            wq_b: (lora > 0).then(|| Linear::new(seed, &p("wq_b"), lora, h * qk, std, device)),
            wkv_a: Linear::new(seed, &p("wkv_a"), a.dim, m.kv_lora_rank + m.qk_rope_head_dim, std, device),
            kv_a_norm: norm("kv_a_norm", m.kv_lora_rank),
            wkv_b: Linear::new(seed, &p("wkv_b"), m.kv_lora_rank, h * (m.qk_nope_head_dim + m.v_head_dim), std, device),
            wo: Linear::new(seed, &p("wo"), h * m.v_head_dim, a.dim, out_std, device),
            cfg: m.clone(),
            fused: true,
        }
    }

    pub fn forward(&self, x: Tensor<3>, pos: &Positions, hooks: &Hooks) -> Tensor<3> {
        let x = hooks.column_input(x);
        let [b, t, _] = x.dims();
        let m = &self.cfg;
        let (nope, rope, vd, qk) = (m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.qk_head_dim());
        let q = match (&self.wq, &self.wq_a, &self.q_a_norm, &self.wq_b) {
            (Some(wq), ..) => wq.forward(x.clone()),
            (None, Some(a), Some(n), Some(b)) => b.forward(n.forward(a.forward(x.clone()))),
            _ => unreachable!("queries have wq or the wq_a / q_a_norm / wq_b bottleneck"),
        };
        let h = q.dims()[2] / qk;
        let q = q.reshape([b, t, h, qk]).swap_dims(1, 2);
        let q_pe = pos.rope.apply(q.clone().narrow(3, nope, rope));
        let q_nope = q.narrow(3, 0, nope);
        let kv = self.wkv_a.forward(x);
        let k_pe = kv.clone().narrow(2, m.kv_lora_rank, rope).reshape([b, t, 1, rope]).swap_dims(1, 2);
        let k_pe = pos.rope.apply(k_pe).expand([b, h, t, rope]);
        let kv = self.wkv_b.forward(self.kv_a_norm.forward(kv.narrow(2, 0, m.kv_lora_rank)));
        let kv = kv.reshape([b, t, h, nope + vd]).swap_dims(1, 2);
        let k = Tensor::cat(vec![kv.clone().narrow(3, 0, nope), k_pe], 3);
        let v = kv.narrow(3, nope, vd);
        // One width for q, k, v: the larger of qk and v, zero-padded; the kernel's scale
        // 1/sqrt(width) is corrected to 1/sqrt(qk) · softmax_scale on q.
        let width = qk.max(vd);
        let pad = |y: Tensor<4>, from: usize| {
            if from == width {
                return y;
            }
            let zeros = Tensor::<4>::zeros([b, h, t, width - from], &y.device()).cast(y.dtype());
            Tensor::cat(vec![y, zeros], 3)
        };
        let mut q = Tensor::cat(vec![q_nope, q_pe], 3);
        let scale = m.softmax_scale * (width as f64 / qk as f64).sqrt();
        if scale != 1.0 {
            q = q.mul_scalar(scale);
        }
        let o = hooks.attention(pad(q, qk), pad(k, qk), pad(v, vd), pos.doc_starts.clone(), self.fused);
        let o = o.narrow(3, 0, vd).swap_dims(1, 2).reshape([b, t, h * vd]);
        hooks.row_output(self.wo.forward(o))
    }

    /// Chooses the fused kernels (linear, RMSNorm) or Burn's composed ops.
    pub fn set_fused(&mut self, fused: bool) {
        for l in [&mut self.wq, &mut self.wq_a, &mut self.wq_b].into_iter().flatten() {
            l.fused = fused;
        }
        for l in [&mut self.wkv_a, &mut self.wkv_b, &mut self.wo] {
            l.fused = fused;
        }
        for n in [self.q_a_norm.as_mut(), Some(&mut self.kv_a_norm)].into_iter().flatten() {
            n.fused = fused;
        }
    }
}
