//! The model's parameters as named host tensors, and back.

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::prelude::*;
use titan_checkpoints::{HostTensor, TensorMap};
use titan_parallel::fsdp::Sharding;
use titan_parallel::{CommError, Communicator};

/// `(path, shape)` of every parameter, in visiting order (no values are materialised).
pub fn param_shapes<M: Module>(model: &M) -> Vec<(String, Vec<usize>)> {
    struct V {
        path: Vec<String>,
        out: Vec<(String, Vec<usize>)>,
    }
    impl ModuleVisitor for V {
        titan_models::track_module_path!();
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            self.out.push((self.path.join("."), p.lazy_shape().to_vec()));
        }
    }
    let mut v = V { path: Vec::new(), out: Vec::new() };
    model.visit(&mut v);
    v.out
}

/// `(id, path)` of every parameter, in visiting order.
pub fn param_ids<M: Module>(model: &M) -> Vec<(ParamId, String)> {
    struct V {
        path: Vec<String>,
        out: Vec<(ParamId, String)>,
    }
    impl ModuleVisitor for V {
        titan_models::track_module_path!();
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            self.out.push((p.id, self.path.join(".")));
        }
    }
    let mut v = V { path: Vec::new(), out: Vec::new() };
    model.visit(&mut v);
    v.out
}

/// Every parameter's values, by path.
pub fn model_to_tensors<M: Module>(model: &M) -> TensorMap {
    struct V {
        path: Vec<String>,
        out: TensorMap,
    }
    impl ModuleVisitor for V {
        titan_models::track_module_path!();
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            let t = p.val();
            let shape = t.dims().to_vec();
            let data = t.into_data().try_into_vec::<f32>().expect("f32 parameters");
            self.out.insert(self.path.join("."), HostTensor { shape, data });
        }
    }
    let mut v = V { path: Vec::new(), out: TensorMap::new() };
    model.visit(&mut v);
    v.out
}

/// Replaces every parameter with the tensor named `name(path)`. Missing and mis-shaped tensors
/// are errors that name the tensor (`what` names the source, e.g. the file), and so are tensors
/// left over, except those `elsewhere` says another rank holds.
pub fn load_model_tensors<M: Module>(
    model: M,
    mut tensors: TensorMap,
    device: &Device,
    what: &str,
    name: &dyn Fn(&str) -> String,
    elsewhere: &dyn Fn(&str) -> bool,
) -> Result<M, String> {
    struct L<'a> {
        path: Vec<String>,
        tensors: &'a mut TensorMap,
        device: &'a Device,
        error: Option<String>,
        name: &'a dyn Fn(&str) -> String,
    }
    impl ModuleMapper for L<'_> {
        titan_models::track_module_path!();
        fn map_float<const D: usize>(&mut self, p: Param<Tensor<D>>) -> Param<Tensor<D>> {
            let path = (self.name)(&self.path.join("."));
            let want = p.lazy_shape().to_vec();
            match self.tensors.remove(&path) {
                Some(t) if t.shape == want => {
                    let value = Tensor::<D>::from_data(TensorData::new(t.data, want), self.device);
                    let value = if self.device.is_autodiff() { value.require_grad() } else { value };
                    Param::initialized(p.id, value)
                }
                Some(t) => {
                    self.error.get_or_insert(format!(
                        "parameter {path} has shape {:?} there, but this model needs {want:?} (a checkpoint of another model or flavor?)",
                        t.shape
                    ));
                    p
                }
                None => {
                    self.error.get_or_insert(format!("parameter {path} is missing"));
                    p
                }
            }
        }
    }
    let mut l = L { path: Vec::new(), tensors: &mut tensors, device, error: None, name };
    let model = model.map(&mut l);
    if let Some(e) = l.error {
        return Err(format!("{what}: {e}"));
    }
    if let Some(extra) = tensors.keys().find(|k| !elsewhere(k)) {
        return Err(format!(
            "{what}: tensor {extra} matches no parameter of this model (a checkpoint of another model?)"
        ));
    }
    Ok(model)
}

/// Replaces every parameter's stored value (its FSDP shard or TP slice as stored on this rank)
/// with `tensors[path]`, keeping its reparameterization; every parameter must be present.
pub fn set_local_tensors<M: Module>(model: M, tensors: TensorMap, device: &Device) -> M {
    replace_tensors(model, tensors, device, true)
}

/// [`set_local_tensors`] for the parameters `tensors` names; the others are kept.
pub fn set_some_tensors<M: Module>(model: M, tensors: TensorMap, device: &Device) -> M {
    replace_tensors(model, tensors, device, false)
}

fn replace_tensors<M: Module>(model: M, mut tensors: TensorMap, device: &Device, every: bool) -> M {
    struct S<'a> {
        path: Vec<String>,
        tensors: &'a mut TensorMap,
        device: &'a Device,
        every: bool,
    }
    impl ModuleMapper for S<'_> {
        titan_models::track_module_path!();
        fn map_float<const D: usize>(&mut self, p: Param<Tensor<D>>) -> Param<Tensor<D>> {
            let Some(t) = self.tensors.remove(&self.path.join(".")) else {
                assert!(!self.every, "a value for every parameter");
                return p;
            };
            let (id, _, mapper) = p.consume();
            let value = Tensor::<D>::from_data(TensorData::new(t.data, t.shape), self.device);
            let value = if self.device.is_autodiff() { value.require_grad() } else { value };
            Param::from_mapped_value(id, value, mapper)
        }
    }
    model.map(&mut S { path: Vec::new(), tensors: &mut tensors, device, every })
}

/// Bytes of every parameter as stored on this rank (shards under FSDP).
pub fn param_bytes<M: Module>(model: &M) -> usize {
    param_shapes(model).iter().map(|(_, s)| s.iter().product::<usize>() * 4).sum()
}

/// Full tensors from this rank's shards (a collective over the shard group, in key order, so
/// every rank issues the same calls). `path_of` maps a key to its parameter's path.
pub fn unshard(
    map: TensorMap,
    sharding: &Sharding,
    comm: &dyn Communicator,
    path_of: fn(&str) -> &str,
) -> Result<TensorMap, CommError> {
    let mut out = TensorMap::new();
    for (k, mut t) in map {
        if let Some(l) = sharding.layout(path_of(&k)) {
            t.data = l.unshard(&t.data, comm)?;
            t.shape[0] = l.rows;
        }
        out.insert(k, t);
    }
    Ok(out)
}
