//! Muon's update equals the reference written from the published algorithm
//! (`scripts/muon_reference.py`, float64; fixture `tests/fixtures/muon/reference.json`), through
//! the optimizer container a training step uses, for a wide and a tall matrix (Burn's
//! `[in, out]` layout, so the fan-in/fan-out rule is read the right way round) and stacked
//! experts, with both learning-rate rules and with and without Nesterov.

use crate::config::{MuonAdjustLr, Optimizer, OptimizerName};
use crate::optim::Optimizers;
use crate::rank::parallelize::Placement;
use burn::module::{Module, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use serde_json::Value;

#[derive(Module, Debug)]
struct Mats {
    a: Param<Tensor<2>>,
    b: Param<Tensor<2>>,
    experts: Param<Tensor<3>>,
}

fn values(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

fn tensor<const D: usize>(v: &Value, shape: &Value, device: &Device) -> Tensor<D> {
    let shape: Vec<usize> = shape.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
    Tensor::from_data(TensorData::new(values(v), shape), device)
}

#[test]
fn muon_update_equals_the_reference_implementation() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/muon/reference.json");
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let device = Device::flex().autodiff();
    let inner = Device::flex();
    for case in fixture["cases"].as_array().unwrap() {
        let lr = case["lr"].as_f64().unwrap();
        let cfg = Optimizer {
            name: OptimizerName::Muon,
            lr,
            weight_decay: case["weight_decay"].as_f64().unwrap(),
            muon_momentum: case["momentum"].as_f64().unwrap(),
            muon_nesterov: case["nesterov"].as_bool().unwrap(),
            muon_adjust_lr_fn: case["adjust_lr_fn"].as_str().unwrap().parse::<MuonAdjustLr>().unwrap(),
            ..Optimizer::default()
        };
        let shapes = &case["shapes"];
        let p = &case["params"];
        let mut model = Mats {
            a: Param::from_tensor(tensor(&p["a"], &shapes["a"], &device)),
            b: Param::from_tensor(tensor(&p["b"], &shapes["b"], &device)),
            experts: Param::from_tensor(tensor(&p["experts"], &shapes["experts"], &device)),
        };
        let mut opt = Optimizers::new(&cfg, true).unwrap();
        for (step, g) in case["grads"].as_array().unwrap().iter().enumerate() {
            let mut grads = GradientsParams::new();
            grads.register::<2>(model.a.id, tensor(&g["a"], &shapes["a"], &inner));
            grads.register::<2>(model.b.id, tensor(&g["b"], &shapes["b"], &inner));
            grads.register::<3>(model.experts.id, tensor(&g["experts"], &shapes["experts"], &inner));
            model = opt.step(model, grads, lr, 1.0, &Placement::default(), &device).unwrap();
            let want = &case["after_each_step"][step];
            let got = [
                ("a", model.a.val().into_data()),
                ("b", model.b.val().into_data()),
                ("experts", model.experts.val().into_data()),
            ];
            for (name, data) in got {
                let got = data.try_into_vec::<f32>().unwrap();
                let err = got.iter().zip(values(&want[name])).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
                assert!(
                    err < 2e-5,
                    "{} step {}: {name} differs from the reference by {err}",
                    case["adjust_lr_fn"],
                    step + 1
                );
            }
        }
        // The state is the momentum buffer, shaped like each parameter.
        let state = opt.state_dict(&model);
        assert_eq!(
            state.keys().collect::<Vec<_>>(),
            ["momentum_buffer.a", "momentum_buffer.b", "momentum_buffer.experts"]
        );
        assert_eq!(state["momentum_buffer.experts"].shape, vec![3, 6, 4]);
    }
}

/// A parameter group with learning rate 0 and no weight decay leaves its parameters exactly as
/// they were; the others move (AdamW here, for the group test without Muon).
#[test]
fn a_group_with_zero_learning_rate_freezes_its_parameters() {
    let device = Device::flex().autodiff();
    let inner = Device::flex();
    let cfg = Optimizer {
        param_groups: vec![crate::config::ParamGroup {
            pattern: "^b$".into(),
            optimizer: None,
            lr: Some(0.0),
            weight_decay: Some(0.0),
        }],
        ..Optimizer::default()
    };
    let ones = |shape: [usize; 2]| Tensor::<2>::ones(shape, &device);
    let model = Mats {
        a: Param::from_tensor(ones([2, 3])),
        b: Param::from_tensor(ones([3, 2])),
        experts: Param::from_tensor(Tensor::<3>::ones([1, 2, 2], &device)),
    };
    let mut opt = Optimizers::new(&cfg, true).unwrap();
    let mut grads = GradientsParams::new();
    grads.register::<2>(model.a.id, Tensor::<2>::ones([2, 3], &inner));
    grads.register::<2>(model.b.id, Tensor::<2>::ones([3, 2], &inner));
    let model = opt.step(model, grads, cfg.lr, 1.0, &Placement::default(), &device).unwrap();
    let b = model.b.val().into_data().try_into_vec::<f32>().unwrap();
    assert!(b.iter().all(|&x| x == 1.0), "{b:?}");
    let a = model.a.val().into_data().try_into_vec::<f32>().unwrap();
    assert!(a.iter().all(|&x| x < 1.0), "{a:?}");
    assert_eq!(opt.state_dict(&model).len(), 4, "AdamW moments of a and b; experts had no gradient");
}
