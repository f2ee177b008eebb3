//! AdamW with state keyed by parameter path (FQN), as PyTorch's `torch.optim.AdamW`.
//!
//! Burn's optimizers key state by `ParamId`; titan-rs keys it by module path so checkpoints are
//! readable safetensors (`exp_avg.<path>`, `exp_avg_sq.<path>`) and state can later be split or
//! joined along a parameter's shard dimension. Which parameters it updates, and with which
//! learning rate and weight decay, the parameter groups decide ([`super::container`]).

use burn::prelude::*;
use std::collections::BTreeMap;
use titan_checkpoints::{HostTensor, TensorMap};
use titan_kernels::ops::AdamWStep;

#[derive(Debug, Clone, PartialEq)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// The update as one fused pass where the device has the kernel (the CPU), else the
    /// composed ops (`titan_kernels::adamw`).
    pub fused: bool,
}

impl AdamWConfig {
    pub fn from_config(o: &crate::config::Optimizer, fused: bool) -> Self {
        Self { beta1: o.betas[0], beta2: o.betas[1], eps: o.eps, fused }
    }

    /// The `f32` scalars of step `t` (1-based) at learning rate `lr` and weight decay `wd`.
    pub fn step_scalars(&self, t: u64, lr: f64, wd: f64, grad_scale: f64) -> AdamWStep {
        let t = t as i32;
        AdamWStep {
            one_minus_beta1: (1.0 - self.beta1) as f32,
            beta2: self.beta2 as f32,
            one_minus_beta2: (1.0 - self.beta2) as f32,
            bias2_sqrt: (1.0 - self.beta2.powi(t)).sqrt() as f32,
            eps: self.eps as f32,
            decay: (1.0 - lr * wd) as f32,
            step_size: (lr / (1.0 - self.beta1.powi(t))) as f32,
            grad_scale: grad_scale as f32,
        }
    }
}

/// First and second moments of one parameter, flattened.
struct Moments {
    exp_avg: Tensor<1>,
    exp_avg_sq: Tensor<1>,
}

pub struct AdamW {
    pub cfg: AdamWConfig,
    state: BTreeMap<String, Moments>,
}

impl AdamW {
    pub fn new(cfg: AdamWConfig) -> Self {
        Self { cfg, state: BTreeMap::new() }
    }

    /// Bytes of optimizer state held (two moments per parameter element that has been updated).
    pub fn state_bytes(&self) -> usize {
        self.state.values().map(|m| (m.exp_avg.dims()[0] + m.exp_avg_sq.dims()[0]) * 4).sum()
    }

    /// The updated (flattened) parameter `p` at `path` from its gradient `g` (moments start at
    /// zero on a parameter's first update).
    pub fn update(&mut self, path: &str, p: Tensor<1>, g: Tensor<1>, h: AdamWStep) -> Tensor<1> {
        let m =
            self.state.remove(path).unwrap_or_else(|| Moments { exp_avg: g.zeros_like(), exp_avg_sq: g.zeros_like() });
        let (p, exp_avg, exp_avg_sq) = titan_kernels::adamw(p, g, m.exp_avg, m.exp_avg_sq, h, self.cfg.fused);
        self.state.insert(path.to_string(), Moments { exp_avg, exp_avg_sq });
        p
    }

    /// State as host tensors (`exp_avg.<path>`, `exp_avg_sq.<path>`), shaped like the parameters.
    pub fn state_dict(&self, shapes: &BTreeMap<String, Vec<usize>>, out: &mut TensorMap) {
        for (path, m) in &self.state {
            let shape = shapes[path].clone();
            for (prefix, t) in [("exp_avg", &m.exp_avg), ("exp_avg_sq", &m.exp_avg_sq)] {
                let data = t.to_data().try_into_vec::<f32>().expect("f32 optimizer state");
                out.insert(format!("{prefix}.{path}"), HostTensor { shape: shape.clone(), data });
            }
        }
    }

    /// Takes `path`'s moments out of `t`; `Ok(false)` when `t` has none for it.
    pub fn load(&mut self, path: &str, shape: &[usize], t: &mut TensorMap, device: &Device) -> Result<bool, String> {
        let (Some(m), Some(v)) = (t.remove(&format!("exp_avg.{path}")), t.remove(&format!("exp_avg_sq.{path}"))) else {
            return Ok(false);
        };
        if m.shape != shape || v.shape != shape {
            return Err(format!("optimizer state of {path} has shape {:?}, the model needs {shape:?}", m.shape));
        }
        let n = m.data.len();
        let exp_avg = Tensor::from_data(TensorData::new(m.data, [n]), device);
        let exp_avg_sq = Tensor::from_data(TensorData::new(v.data, [n]), device);
        self.state.insert(path.to_string(), Moments { exp_avg, exp_avg_sq });
        Ok(true)
    }

    pub fn clear(&mut self) {
        self.state.clear();
    }
}
