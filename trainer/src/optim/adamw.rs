//! AdamW with state keyed by parameter path (FQN), as PyTorch's `torch.optim.AdamW`.
//!
//! Burn's optimizers key state by `ParamId`; titan-rs keys it by module path so checkpoints are
//! readable safetensors (`exp_avg.<path>`, `exp_avg_sq.<path>`) and state can later be split or
//! joined along a parameter's shard dimension.

use burn::module::{Module, ModuleMapper, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use std::collections::BTreeMap;
use titan_checkpoints::{HostTensor, TensorMap};
use titan_kernels::ops::AdamWStep;

#[derive(Debug, Clone, PartialEq)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// The update as one fused pass where the device has the kernel (the CPU), else the
    /// composed ops (`titan_kernels::adamw`).
    pub fused: bool,
}

impl AdamWConfig {
    pub fn from_config(o: &crate::config::Optimizer) -> Self {
        Self { beta1: o.betas[0], beta2: o.betas[1], eps: o.eps, weight_decay: o.weight_decay, fused: true }
    }

    /// The `f32` scalars of step `t` (1-based) at learning rate `lr`.
    fn step_scalars(&self, t: i32, lr: f64, grad_scale: f64) -> AdamWStep {
        AdamWStep {
            one_minus_beta1: (1.0 - self.beta1) as f32,
            beta2: self.beta2 as f32,
            one_minus_beta2: (1.0 - self.beta2) as f32,
            bias2_sqrt: (1.0 - self.beta2.powi(t)).sqrt() as f32,
            eps: self.eps as f32,
            decay: (1.0 - lr * self.weight_decay) as f32,
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
    cfg: AdamWConfig,
    /// Optimizer steps taken (bias correction uses it).
    step: u64,
    state: BTreeMap<String, Moments>,
}

impl AdamW {
    pub fn new(cfg: AdamWConfig) -> Self {
        Self { cfg, step: 0, state: BTreeMap::new() }
    }

    pub fn step_count(&self) -> u64 {
        self.step
    }

    /// Bytes of optimizer state held (two moments per parameter element that has been updated).
    pub fn state_bytes(&self) -> usize {
        self.state.values().map(|m| (m.exp_avg.dims()[0] + m.exp_avg_sq.dims()[0]) * 4).sum()
    }

    /// One update of every parameter that has a gradient. `grad_scale` multiplies the gradients
    /// first (global-norm clipping).
    pub fn step<M: Module>(&mut self, model: M, grads: GradientsParams, lr: f64, grad_scale: f64) -> M {
        self.step += 1;
        let h = self.cfg.step_scalars(self.step as i32, lr, grad_scale);
        let mut u = Update { opt: self, grads, h, path: Vec::new() };
        model.map(&mut u)
    }

    /// State as host tensors (`exp_avg.<path>`, `exp_avg_sq.<path>`), shaped like the parameters.
    pub fn state_dict<M: Module>(&self, model: &M) -> TensorMap {
        let shapes: BTreeMap<String, Vec<usize>> = crate::rank::params::param_shapes(model).into_iter().collect();
        let mut out = TensorMap::new();
        for (path, m) in &self.state {
            let shape = shapes[path].clone();
            for (prefix, t) in [("exp_avg", &m.exp_avg), ("exp_avg_sq", &m.exp_avg_sq)] {
                let data = t.to_data().try_into_vec::<f32>().expect("f32 optimizer state");
                out.insert(format!("{prefix}.{path}"), HostTensor { shape: shape.clone(), data });
            }
        }
        out
    }

    /// Restores state saved by [`AdamW::state_dict`]; every key must match a parameter's path
    /// and shape.
    pub fn load_state_dict<M: Module>(
        &mut self,
        model: &M,
        step: u64,
        mut t: TensorMap,
        device: &Device,
    ) -> Result<(), String> {
        self.state.clear();
        for (path, shape) in crate::rank::params::param_shapes(model) {
            let (Some(m), Some(v)) = (t.remove(&format!("exp_avg.{path}")), t.remove(&format!("exp_avg_sq.{path}")))
            else {
                if step > 0 && !titan_models::moe::is_balancing_bias(&path) {
                    return Err(format!("no optimizer state for parameter {path}"));
                }
                continue;
            };
            if m.shape != shape || v.shape != shape {
                return Err(format!("optimizer state of {path} has shape {:?}, the model needs {shape:?}", m.shape));
            }
            let n = m.data.len();
            self.state.insert(
                path,
                Moments {
                    exp_avg: Tensor::from_data(TensorData::new(m.data, [n]), device),
                    exp_avg_sq: Tensor::from_data(TensorData::new(v.data, [n]), device),
                },
            );
        }
        if let Some(extra) = t.keys().next() {
            return Err(format!("optimizer state {extra} belongs to no parameter of this model"));
        }
        self.step = step;
        Ok(())
    }
}

struct Update<'a> {
    opt: &'a mut AdamW,
    grads: GradientsParams,
    /// This step's scalars, the same for every parameter.
    h: AdamWStep,
    path: Vec<String>,
}

impl ModuleMapper for Update<'_> {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.pop();
    }
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let Some(grad) = self.grads.remove::<D>(param.id) else {
            return param;
        };
        let (id, tensor, mapper) = param.consume();
        // The updated value re-enters autodiff with the parameter's checkpointing strategy
        // (op-level selective AC runs every tensor under Burn's balanced strategy).
        let strategy = tensor.gradient_checkpointing_strategy();
        let shape = tensor.shape();
        let n = shape.num_elements();
        let g = grad.reshape([n]);
        let p = tensor.inner().reshape([n]);
        let path = self.path.join(".");
        let m = self
            .opt
            .state
            .remove(&path)
            .unwrap_or_else(|| Moments { exp_avg: g.zeros_like(), exp_avg_sq: g.zeros_like() });
        let (p, exp_avg, exp_avg_sq) = titan_kernels::adamw(p, g, m.exp_avg, m.exp_avg_sq, self.h, self.opt.cfg.fused);
        self.opt.state.insert(path, Moments { exp_avg, exp_avg_sq });
        let mut updated = Tensor::from_inner(p.reshape(shape));
        if let Some(s) = strategy {
            updated = updated.with_gradient_checkpointing_strategy(s);
        }
        let updated = updated.require_grad();
        Param::from_mapped_value(id, updated, mapper)
    }
}
