use burn::prelude::*;
use std::time::Instant;
use titan_models::{loss::cross_entropy_sum, ModelArgs, Transformer};

fn main() {
    let dev = Device::flex().autodiff();
    let args = ModelArgs::flavor("debugmodel").unwrap();
    let m = Transformer::new(&args, 0, &dev);
    let (b, t) = (8, 256);
    let ids: Vec<i64> = (0..b * (t + 1)).map(|i| ((i * 7919) % 2048) as i64).collect();
    let x = Tensor::<2, Int>::from_data(TensorData::new(ids, [b, t + 1]), &dev);
    for it in 0..3 {
        let t0 = Instant::now();
        let logits = m.forward(x.clone().slice([0..b, 0..t]));
        let _: f32 = logits.clone().slice([0..1, 0..1, 0..1]).into_scalar();
        let t1 = Instant::now();
        let loss = cross_entropy_sum(logits, x.clone().slice([0..b, 1..t + 1]));
        let _: f32 = loss.clone().into_scalar();
        let t2 = Instant::now();
        let g = loss.backward();
        let t3 = Instant::now();
        drop(g);
        println!("it {it}: fwd {:.3}s loss {:.3}s bwd {:.3}s", (t1 - t0).as_secs_f64(), (t2 - t1).as_secs_f64(), (t3 - t2).as_secs_f64());
    }
    // attention alone
    let q = Tensor::<4>::random([b, 16, t, 16], burn::tensor::Distribution::Default, &dev).require_grad();
    for it in 0..2 {
        let t0 = Instant::now();
        let o = burn::tensor::module::attention(q.clone(), q.clone(), q.clone(), None, None, burn::tensor::ops::AttentionModuleOptions { is_causal: true, ..Default::default() });
        let s = o.sum();
        let _: f32 = s.clone().into_scalar();
        let t1 = Instant::now();
        let _g = s.backward();
        println!("attn {it}: fwd {:.3}s bwd {:.3}s", (t1 - t0).as_secs_f64(), t1.elapsed().as_secs_f64());
    }
    let a = Tensor::<2>::random([2048, 256], burn::tensor::Distribution::Default, &Device::flex());
    let w = Tensor::<2>::random([256, 768], burn::tensor::Distribution::Default, &Device::flex());
    let t0 = Instant::now();
    for _ in 0..10 { let _: f32 = a.clone().matmul(w.clone()).slice([0..1,0..1]).into_scalar(); }
    let dt = t0.elapsed().as_secs_f64() / 10.0;
    println!("matmul 2048x256x768: {:.2} ms, {:.1} GFLOP/s", dt * 1e3, 2.0 * 2048.0 * 256.0 * 768.0 / dt / 1e9);
}
