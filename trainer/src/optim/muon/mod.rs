//! Muon: momentum orthogonalised by Newton–Schulz iterations, for the hidden weight matrices
//! (PyTorch's `torch.optim.Muon`, Keller Jordan's algorithm):
//!
//! ```text
//! B ← μ·B + g                       (momentum_buffer, kept per parameter shard)
//! U ← g + μ·B  (Nesterov)  or  B
//! O ← NewtonSchulz(U)               (on each whole matrix: see `distributed`)
//! θ ← θ·(1 − lr·wd) − lr·s(A, B)·O  (decoupled weight decay; s from `muon_adjust_lr_fn`)
//! ```
//!
//! The momentum and the update are elementwise, so they run on this rank's shard; only the
//! orthogonalisation needs the whole matrix ([`distributed`]). The state is one buffer per
//! parameter (`momentum_buffer.<path>`, PyTorch's name), shaped like it, so checkpoints reshard
//! it as they do AdamW's moments.

pub mod distributed;
pub mod newton_schulz;

use crate::config::{MuonAdjustLr, Optimizer};
use burn::prelude::*;
use newton_schulz::NewtonSchulz;
use std::collections::BTreeMap;
use titan_checkpoints::{HostTensor, TensorMap};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MuonConfig {
    pub momentum: f32,
    pub nesterov: bool,
    pub ns: NewtonSchulz,
    pub adjust_lr: MuonAdjustLr,
}

impl MuonConfig {
    pub fn from_config(o: &Optimizer) -> Self {
        let c = &o.muon_ns_coefficients;
        Self {
            momentum: o.muon_momentum as f32,
            nesterov: o.muon_nesterov,
            ns: NewtonSchulz {
                coefficients: [c[0] as f32, c[1] as f32, c[2] as f32],
                steps: o.muon_ns_steps,
                eps: o.muon_eps as f32,
            },
            adjust_lr: o.muon_adjust_lr_fn,
        }
    }

    /// The factor on the learning rate for a whole matrix of `rows × cols` (Burn's `[d_in,
    /// d_out]` layout: fan-in `rows`, fan-out `cols`).
    pub fn lr_scale(&self, rows: usize, cols: usize) -> f32 {
        match self.adjust_lr {
            MuonAdjustLr::MatchRmsAdamw => 0.2 * (rows.max(cols) as f32).sqrt(),
            MuonAdjustLr::Original => (cols as f32 / rows as f32).max(1.0).sqrt(),
        }
    }

    /// The orthogonalised, shape-scaled update of whole matrices `u` (`[batch, rows, cols]`).
    pub fn orthogonal_update(&self, u: Tensor<3>) -> Tensor<3> {
        let [_, rows, cols] = u.dims();
        self.ns.orthogonalise(u).mul_scalar(self.lr_scale(rows, cols))
    }
}

pub struct Muon {
    pub cfg: MuonConfig,
    /// Momentum buffers by parameter path, flattened.
    state: BTreeMap<String, Tensor<1>>,
}

impl Muon {
    pub fn new(cfg: MuonConfig) -> Self {
        Self { cfg, state: BTreeMap::new() }
    }

    pub fn state_bytes(&self) -> usize {
        self.state.values().map(|b| b.dims()[0] * 4).sum()
    }

    /// The momentum step of `path` from its (flattened, unscaled) gradient: updates the buffer
    /// and returns what is orthogonalised.
    pub fn momentum(&mut self, path: &str, g: Tensor<1>, grad_scale: f64) -> Tensor<1> {
        let g = if grad_scale != 1.0 { g.mul_scalar(grad_scale as f32) } else { g };
        let mu = self.cfg.momentum;
        let buf = match self.state.remove(path) {
            Some(b) => b.mul_scalar(mu) + g.clone(),
            None => g.clone(),
        };
        let u = if self.cfg.nesterov { g + buf.clone().mul_scalar(mu) } else { buf.clone() };
        self.state.insert(path.to_string(), buf);
        u
    }

    /// The decoupled weight decay and the step along the orthogonalised update `o`.
    pub fn apply(p: Tensor<1>, o: Tensor<1>, lr: f64, wd: f64) -> Tensor<1> {
        let p = if wd != 0.0 { p.mul_scalar((1.0 - lr * wd) as f32) } else { p };
        p - o.mul_scalar(lr as f32)
    }

    pub fn state_dict(&self, shapes: &BTreeMap<String, Vec<usize>>, out: &mut TensorMap) {
        for (path, b) in &self.state {
            let data = b.to_data().try_into_vec::<f32>().expect("f32 optimizer state");
            out.insert(format!("momentum_buffer.{path}"), HostTensor { shape: shapes[path].clone(), data });
        }
    }

    /// Takes `path`'s buffer out of `t`; `Ok(false)` when `t` has none for it.
    pub fn load(&mut self, path: &str, shape: &[usize], t: &mut TensorMap, device: &Device) -> Result<bool, String> {
        let Some(b) = t.remove(&format!("momentum_buffer.{path}")) else { return Ok(false) };
        if b.shape != shape {
            return Err(format!("Muon momentum of {path} has shape {:?}, the model needs {shape:?}", b.shape));
        }
        let n = b.data.len();
        self.state.insert(path.to_string(), Tensor::from_data(TensorData::new(b.data, [n]), device));
        Ok(true)
    }

    pub fn clear(&mut self) {
        self.state.clear();
    }
}

#[cfg(test)]
mod tests;
