//! Where a training step's time goes: forward, loss and backward of the debugmodel at 8×256,
//! with the fused attention kernel and with Burn's composed attention.
//! `cargo run --release --example prof`

use burn::prelude::*;
use std::time::Instant;
use titan_models::{loss::cross_entropy_sum, ModelArgs, Transformer};

fn main() {
    let dev = Device::flex().autodiff();
    let args = ModelArgs::flavor("debugmodel").unwrap();
    let (b, t) = (8, 256);
    let ids: Vec<i64> = (0..b * (t + 1)).map(|i| ((i * 7919) % 2048) as i64).collect();
    let x = Tensor::<2, Int>::from_data(TensorData::new(ids, [b, t + 1]), &dev);
    {
        use titan_kernels::attention::cpu;
        let n = cpu::Dims::square(b, 16, 16, t, 16);
        let len = b * 16 * t * 16;
        let x: Vec<f32> = (0..len).map(|i| ((i * 7919 % 1000) as f32) / 1000.0 - 0.5).collect();
        let starts = vec![0i64; b * t];
        let vis = cpu::Starts { starts: &starts, t };
        let t0 = Instant::now();
        let (o, lse) = cpu::forward(&x, &x, &x, &vis, n, 0.25);
        let t1 = Instant::now();
        let _ = cpu::backward(&x, &x, &x, &vis, &o, &lse, &x, n, 0.25);
        println!(
            "fused attention kernel alone, one layer: forward {:.3}s backward {:.3}s",
            (t1 - t0).as_secs_f64(),
            t1.elapsed().as_secs_f64()
        );
    }
    for fused in [true, false] {
        let m = Transformer::new(&args, 0, &dev).with_fused_attention(fused);
        for it in 0..3 {
            let t0 = Instant::now();
            let logits = m.forward(x.clone().slice([0..b, 0..t]));
            let _: f32 = logits.clone().slice([0..1, 0..1, 0..1]).into_scalar();
            let t1 = Instant::now();
            let loss = cross_entropy_sum(logits, x.clone().slice([0..b, 1..t + 1]));
            let _: f32 = loss.clone().into_scalar();
            let t2 = Instant::now();
            drop(loss.backward());
            let t3 = Instant::now();
            println!(
                "attention {:9} iter {it}: forward {:.3}s  loss {:.3}s  backward {:.3}s  total {:.3}s",
                if fused { "fused" } else { "reference" },
                (t1 - t0).as_secs_f64(),
                (t2 - t1).as_secs_f64(),
                (t3 - t2).as_secs_f64(),
                (t3 - t0).as_secs_f64()
            );
        }
    }
}
