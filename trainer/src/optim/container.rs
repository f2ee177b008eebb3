//! The optimizers of one rank's parameters (TorchTitan's `OptimizersContainer`): each parameter
//! takes AdamW or Muon with its group's learning rate and weight decay ([`super::groups`]); one
//! step count, one state dict (`exp_avg.*`, `exp_avg_sq.*`, `momentum_buffer.*`).

use super::adamw::{AdamW, AdamWConfig};
use super::groups::{ParamGroups, Settings};
use super::muon::distributed::{orthogonalise, Pending};
use super::muon::{Muon, MuonConfig};
use crate::config::{Optimizer, OptimizerName};
use crate::rank::parallelize::Placement;
use anyhow::{anyhow, Result};
use burn::module::{Module, ModuleMapper, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use std::collections::{BTreeMap, HashMap};
use titan_checkpoints::TensorMap;

pub struct Optimizers {
    groups: ParamGroups,
    /// Each local parameter path's settings (named by its checkpoint name).
    settings: BTreeMap<String, Settings>,
    base_lr: f64,
    adamw: AdamW,
    muon: Muon,
    /// Optimizer steps taken (AdamW's bias correction uses it).
    step: u64,
}

impl Optimizers {
    pub fn new(o: &Optimizer, fused: bool) -> Result<Self> {
        Ok(Self {
            groups: ParamGroups::new(o).map_err(|e| anyhow!(e))?,
            settings: BTreeMap::new(),
            base_lr: o.lr,
            adamw: AdamW::new(AdamWConfig::from_config(o, fused)),
            muon: Muon::new(MuonConfig::from_config(o)),
            step: 0,
        })
    }

    /// Resolves every parameter's group; `name` gives a local path's checkpoint name (the one
    /// `param_groups` patterns match). Errors name the group and the parameter.
    pub fn prepare<M: Module>(&mut self, model: &M, name: impl Fn(&str) -> String) -> Result<()> {
        for (path, shape) in crate::rank::params::param_shapes(model) {
            let s = self.groups.settings(&name(&path), shape.len()).map_err(|e| anyhow!(e))?;
            self.settings.insert(path, s);
        }
        Ok(())
    }

    fn settings_of(&self, path: &str, ndim: usize) -> Result<Settings, String> {
        match self.settings.get(path) {
            Some(s) => Ok(*s),
            None => self.groups.settings(path, ndim),
        }
    }

    /// How many parameters each optimizer takes.
    pub fn counts(&self) -> (usize, usize) {
        let muon = self.settings.values().filter(|s| s.optimizer == OptimizerName::Muon).count();
        (self.settings.len() - muon, muon)
    }

    pub fn step_count(&self) -> u64 {
        self.step
    }

    pub fn state_bytes(&self) -> usize {
        self.adamw.state_bytes() + self.muon.state_bytes()
    }

    /// One update of every parameter that has a gradient, at scheduled learning rate `lr` (each
    /// group's rate is scaled as the base one is). `grad_scale` multiplies the gradients first
    /// (global-norm clipping, loss scaling). Muon's matrices are orthogonalised whole over the
    /// layout in `placement` (a collective on the ranks that share them).
    pub fn step<M: Module>(
        &mut self,
        model: M,
        grads: GradientsParams,
        lr: f64,
        grad_scale: f64,
        placement: &Placement,
        device: &Device,
    ) -> Result<M> {
        self.step += 1;
        let factor = lr / self.base_lr;
        let mut first = First {
            opt: self,
            grads,
            factor,
            grad_scale,
            path: Vec::new(),
            pending: Vec::new(),
            rates: Vec::new(),
            error: None,
        };
        let model = model.map(&mut first);
        let (pending, rates, error) =
            (std::mem::take(&mut first.pending), std::mem::take(&mut first.rates), first.error.take());
        if let Some(e) = error {
            return Err(anyhow!(e));
        }
        if pending.is_empty() {
            return Ok(model);
        }
        let paths: Vec<String> = pending.iter().map(|p| p.path.clone()).collect();
        let updates = {
            let _span = titan_profiling::span("muon orthogonalise", "optimizer");
            orthogonalise(pending, &self.muon.cfg, placement, &device.clone().without_autodiff())?
        };
        let updates: HashMap<String, (Tensor<1>, f64, f64)> =
            paths.into_iter().zip(rates).zip(updates).map(|((path, (lr, wd)), o)| (path, (o, lr, wd))).collect();
        Ok(model.map(&mut Second { updates, path: Vec::new() }))
    }

    /// State as host tensors, shaped like the parameters.
    pub fn state_dict<M: Module>(&self, model: &M) -> TensorMap {
        let shapes: BTreeMap<String, Vec<usize>> = crate::rank::params::param_shapes(model).into_iter().collect();
        let mut out = TensorMap::new();
        self.adamw.state_dict(&shapes, &mut out);
        self.muon.state_dict(&shapes, &mut out);
        out
    }

    /// Restores state saved by [`Optimizers::state_dict`]: each parameter's state must be that of
    /// the optimizer its group gives it, with its shape; nothing may be left over.
    pub fn load_state_dict<M: Module>(
        &mut self,
        model: &M,
        step: u64,
        mut t: TensorMap,
        device: &Device,
    ) -> Result<(), String> {
        self.adamw.clear();
        self.muon.clear();
        for (path, shape) in crate::rank::params::param_shapes(model) {
            let s = self.settings_of(&path, shape.len())?;
            let found = match s.optimizer {
                OptimizerName::AdamW => self.adamw.load(&path, &shape, &mut t, device)?,
                OptimizerName::Muon => self.muon.load(&path, &shape, &mut t, device)?,
            };
            if !found && step > 0 && !titan_models::moe::is_balancing_bias(&path) {
                let other = match s.optimizer {
                    OptimizerName::AdamW => "momentum_buffer",
                    OptimizerName::Muon => "exp_avg",
                };
                if t.contains_key(&format!("{other}.{path}")) {
                    return Err(format!(
                        "the checkpoint holds {other} state for {path}, but this config gives it {}; keep the optimizer it was trained with, or add \"optimizer\" to `checkpoint.exclude_from_loading` to start a fresh one",
                        s.optimizer
                    ));
                }
                return Err(format!("no optimizer state for parameter {path}"));
            }
        }
        if let Some(extra) = t.keys().next() {
            return Err(format!("optimizer state {extra} belongs to no parameter of this model"));
        }
        self.step = step;
        Ok(())
    }
}

/// A parameter replaced by `f` of its flattened value, re-entering autodiff with its
/// checkpointing strategy (op-level selective AC runs every tensor under Burn's balanced one).
fn replace<const D: usize>(param: Param<Tensor<D>>, f: impl FnOnce(Tensor<1>) -> Tensor<1>) -> Param<Tensor<D>> {
    let (id, tensor, mapper) = param.consume();
    let strategy = tensor.gradient_checkpointing_strategy();
    let shape = tensor.shape();
    let p = f(tensor.inner().reshape([shape.num_elements()]));
    let mut updated = Tensor::from_inner(p.reshape(shape));
    if let Some(s) = strategy {
        updated = updated.with_gradient_checkpointing_strategy(s);
    }
    Param::from_mapped_value(id, updated.require_grad(), mapper)
}

/// AdamW's updates, and Muon's momentum (its matrices wait for the orthogonalisation).
struct First<'a> {
    opt: &'a mut Optimizers,
    grads: GradientsParams,
    factor: f64,
    grad_scale: f64,
    path: Vec<String>,
    pending: Vec<Pending>,
    /// Each pending matrix's (scheduled learning rate, weight decay).
    rates: Vec<(f64, f64)>,
    error: Option<String>,
}

impl ModuleMapper for First<'_> {
    titan_models::track_module_path!();
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let Some(grad) = self.grads.remove::<D>(param.id) else {
            return param;
        };
        let path = self.path.join(".");
        let s = match self.opt.settings_of(&path, D) {
            Ok(s) => s,
            Err(e) => {
                self.error.get_or_insert(e);
                return param;
            }
        };
        let n = grad.shape().num_elements();
        let g = grad.reshape([n]);
        match s.optimizer {
            OptimizerName::AdamW => {
                let h =
                    self.opt.adamw.cfg.step_scalars(self.opt.step, s.lr * self.factor, s.weight_decay, self.grad_scale);
                replace(param, |p| self.opt.adamw.update(&path, p, g, h))
            }
            OptimizerName::Muon => {
                let shape = param.lazy_shape().to_vec();
                let update = self.opt.muon.momentum(&path, g, self.grad_scale);
                self.pending.push(Pending { path, shape, update });
                self.rates.push((s.lr * self.factor, s.weight_decay));
                param
            }
        }
    }
}

/// Muon's steps along the orthogonalised updates.
struct Second {
    updates: HashMap<String, (Tensor<1>, f64, f64)>,
    path: Vec<String>,
}

impl ModuleMapper for Second {
    titan_models::track_module_path!();
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        match self.updates.remove(&self.path.join(".")) {
            Some((o, lr, wd)) => replace(param, |p| Muon::apply(p, o, lr, wd)),
            None => param,
        }
    }
}
