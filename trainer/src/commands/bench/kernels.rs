//! `titan-rs bench kernels`: every fused kernel on the configured device, first checked against
//! its composed-ops reference (largest error relative to the largest reference value), then
//! timed; the bytes each call must move and the FLOPs it must do give GB/s and TFLOP/s, set
//! against the device's ceilings when given (an H200: ≈ 4 300 GB/s, ≈ 790 bf16 TFLOP/s).

use anyhow::Result;
use burn::prelude::*;
use std::time::Instant;
use titan_models::ModelArgs;

/// One kernel's result.
#[derive(serde::Serialize)]
pub struct KernelRow {
    pub name: String,
    pub shape: String,
    pub rel_err: f32,
    pub fused_ms: f64,
    pub reference_ms: f64,
    pub gbs: f64,
    pub tflops: f64,
}

/// The shapes: those of a `flavor` training step of `batch × seq` tokens.
pub struct Shapes {
    pub batch: usize,
    pub seq: usize,
    pub args: ModelArgs,
}

fn random<const D: usize>(shape: [usize; D], device: &Device) -> Tensor<D> {
    Tensor::random(shape, burn::tensor::Distribution::Normal(0.0, 1.0), device)
}

fn rel_err<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> f32 {
    let scale: f32 = b.clone().abs().max().into_scalar();
    let diff: f32 = (a - b).abs().max().into_scalar();
    diff / scale.max(1e-12)
}

/// Mean milliseconds per call of `f` (after a warm-up call), waiting for the device at the end.
fn time<const D: usize>(iters: usize, f: &dyn Fn() -> Tensor<D>) -> f64 {
    let sync = |t: Tensor<D>| {
        let _: f32 = t.flatten::<1>(0, D - 1).slice([0..1]).into_scalar();
    };
    sync(f());
    let start = Instant::now();
    let mut last = None;
    for _ in 0..iters {
        last = Some(f());
    }
    sync(last.expect("iters >= 1"));
    start.elapsed().as_secs_f64() * 1e3 / iters as f64
}

/// Checks and times one kernel: `fused` and `reference` compute the same tensor.
fn row<const D: usize>(
    name: &str,
    shape: String,
    iters: usize,
    bytes: f64,
    flops: f64,
    fused: &dyn Fn() -> Tensor<D>,
    reference: &dyn Fn() -> Tensor<D>,
) -> KernelRow {
    let rel_err = rel_err(fused(), reference());
    let (fused_ms, reference_ms) = (time(iters, fused), time(iters, reference));
    let s = fused_ms / 1e3;
    KernelRow {
        name: name.into(),
        shape,
        rel_err,
        fused_ms,
        reference_ms,
        gbs: bytes / s / 1e9,
        tflops: flops / s / 1e12,
    }
}

/// Every kernel at `shapes` on `device` (forward passes; attention, RMSNorm and the linear
/// layer also forward + backward; AdamW and the gradient norm's sum of squares).
pub fn bench_kernels(device: &Device, shapes: &Shapes, iters: usize) -> Result<Vec<KernelRow>> {
    let (b, t, a) = (shapes.batch, shapes.seq, &shapes.args);
    let (d, h, kv, hd, f, v) = (a.dim, a.n_heads, a.n_kv_heads, a.head_dim(), a.ffn_hidden_dim(), a.vocab_size);
    let (n, word) = (b * t, 4.0);
    let mut rows = Vec::new();

    let (x, w) = (random([b, t, d], device), random([d], device));
    let norm = |fused: bool| titan_kernels::rms_norm(x.clone(), w.clone(), 1e-5, fused);
    let norm_row = |name: &str| {
        row(name, format!("{b}×{t}×{d}"), iters, word * (2 * n * d + d) as f64, (4 * n * d) as f64, &|| norm(true), &|| norm(false))
    };
    rows.push(norm_row("rms_norm"));

    let (g, u) = (random([b, t, f], device), random([b, t, f], device));
    rows.push(row(
        "silu_mul",
        format!("{b}×{t}×{f}"),
        iters,
        word * (3 * n * f) as f64,
        (5 * n * f) as f64,
        &|| titan_kernels::silu_mul(g.clone(), u.clone(), true),
        &|| titan_kernels::silu_mul(g.clone(), u.clone(), false),
    ));

    let q = random([b, h, t, hd], device);
    let (cos, sin) = (random([1, 1, t, hd], device), random([1, 1, t, hd], device));
    rows.push(row(
        "rope",
        format!("{b}×{h}×{t}×{hd}"),
        iters,
        word * (2 * n * h * hd + 2 * t * hd) as f64,
        (3 * n * h * hd) as f64,
        &|| titan_kernels::rope(q.clone(), cos.clone(), sin.clone(), true),
        &|| titan_kernels::rope(q.clone(), cos.clone(), sin.clone(), false),
    ));

    let (k, vv) = (random([b, kv, t, hd], device), random([b, kv, t, hd], device));
    let causal_flops = 4.0 * (b * h * hd) as f64 * (t * (t + 1) / 2) as f64;
    let reference_attention = |q: Tensor<4>, k: Tensor<4>, v: Tensor<4>| titan_kernels::attention(q, k, v, None, false);
    rows.push(row(
        "attention fwd",
        format!("b{b} h{h} kv{kv} t{t} d{hd}"),
        iters,
        word * (2 * n * h * hd + 2 * n * kv * hd) as f64,
        causal_flops,
        &|| titan_kernels::causal_attention(q.clone(), k.clone(), vv.clone()),
        &|| reference_attention(q.clone(), k.clone(), vv.clone()),
    ));
    // Forward + backward: the gradient of q (timing includes dk, dv, which backward computes too).
    let ad = device.clone().autodiff();
    let lift = |x: &Tensor<4>| Tensor::<4>::from_data(x.to_data(), &ad).require_grad();
    let (qa, ka, va) = (lift(&q), lift(&k), lift(&vv));
    let grad_q = |o: Tensor<4>| o.sum().backward();
    rows.push(row(
        "attention fwd+bwd",
        format!("b{b} h{h} kv{kv} t{t} d{hd}"),
        iters,
        word * (6 * n * h * hd + 4 * n * kv * hd) as f64,
        3.5 * causal_flops,
        &|| qa.grad(&grad_q(titan_kernels::causal_attention(qa.clone(), ka.clone(), va.clone()))).expect("dq"),
        &|| qa.grad(&grad_q(reference_attention(qa.clone(), ka.clone(), va.clone()))).expect("dq"),
    ));
    // Block-causal over packed documents of `doc` tokens (`model.attn_mask_type =
    // "block_causal"`): the fused kernel skips the key tiles before each query tile's documents;
    // the reference masks the full `T × T` scores. 256-token documents (at least 4 per row).
    let doc = 256.min(t / 4).max(1);
    let starts: Vec<i64> = (0..b * t).map(|i| ((i % t) / doc * doc) as i64).collect();
    let starts = Tensor::<2, Int>::from_data(TensorData::new(starts, [b, t]), &ad);
    let doc_tokens: usize = (0..t).step_by(doc).map(|s| doc.min(t - s)).map(|l| l * (l + 1) / 2).sum();
    let block = |fused: bool| {
        let o = titan_kernels::attention(qa.clone(), ka.clone(), va.clone(), Some(starts.clone()), fused);
        qa.grad(&grad_q(o)).expect("dq")
    };
    rows.push(row(
        "block-causal attention fwd+bwd",
        format!("b{b} h{h} kv{kv} t{t} d{hd}, documents of {doc}"),
        iters,
        word * (6 * n * h * hd + 4 * n * kv * hd) as f64,
        3.5 * 4.0 * (b * h * hd * doc_tokens) as f64,
        &|| block(true),
        &|| block(false),
    ));

    // The linear layer (SwiGLU's w1 shape), forward + backward: y = x·w, dx = dy·wᵀ, dw = xᵀ·dy;
    // on the CPU the fused path splits each product into one output panel per thread.
    let lift2 = |x: Tensor<2>| Tensor::<2>::from_data(x.to_data(), &ad).require_grad();
    let (xl, wl) = (lift2(random([n, d], device)), lift2(random([d, f], device)));
    // A random upstream gradient (`Σ y ∘ r`), not the broadcast ones of a plain sum.
    let r = Tensor::<2>::from_data(random([n, f], device).to_data(), &ad);
    let grad_w = |fused: bool| {
        let y = titan_kernels::linear(xl.clone(), wl.clone(), fused);
        wl.grad(&(y * r.clone()).sum().backward())
    };
    rows.push(row(
        "linear fwd+bwd",
        format!("{n}×{d}·{d}×{f}"),
        iters,
        word * (3 * (n * d + d * f + n * f)) as f64,
        (6 * n * d * f) as f64,
        &|| grad_w(true).expect("dw"),
        &|| grad_w(false).expect("dw"),
    ));

    // The routed experts of an MoE layer (the model's, else 8 experts of f/4, top 2): the
    // tokens' copies sorted by expert with uneven group sizes, `y = x·w[g]` per group, forward
    // + backward (dx and dw). The reference is one Burn matmul per expert.
    let (e, top, eh) = a.moe.as_ref().map_or((8, 2, f / 4), |m| (m.num_experts, m.top_k, m.hidden_dim));
    let rows_total = n * top;
    let weights: Vec<usize> = (0..e).map(|g| 1 + (g * 7 + 3) % 5).collect();
    let wsum: usize = weights.iter().sum();
    let mut sizes: Vec<usize> = weights.iter().map(|&w| rows_total * w / wsum).collect();
    sizes[0] += rows_total - sizes.iter().sum::<usize>();
    let lift3 = |x: Tensor<3>| Tensor::<3>::from_data(x.to_data(), &ad).require_grad();
    let (xg, wg) = (lift2(random([rows_total, d], device)), lift3(random([e, d, eh], device)));
    let rg = Tensor::<2>::from_data(random([rows_total, eh], device).to_data(), &ad);
    let grouped = |fused: bool| {
        let y = titan_kernels::grouped_matmul(xg.clone(), wg.clone(), &sizes, fused);
        wg.grad(&(y * rg.clone()).sum().backward())
    };
    rows.push(row(
        "grouped expert GEMM fwd+bwd",
        format!("{rows_total}×{d} over {e} experts ·{d}×{eh}"),
        iters,
        word * (3 * (rows_total * d + e * d * eh + rows_total * eh)) as f64,
        (6 * rows_total * d * eh) as f64,
        &|| grouped(true).expect("dw"),
        &|| grouped(false).expect("dw"),
    ));

    let logits = random([b, t, v], device);
    let targets = Tensor::<2, Int>::random([b, t], burn::tensor::Distribution::Uniform(0.0, v as f64), device);
    let loss = |fused: bool| titan_kernels::cross_entropy_sum(logits.clone(), targets.clone(), fused);
    let loss_row = |name: &str| {
        row(name, format!("{b}×{t}×{v}"), iters, word * (n * v) as f64, (4 * n * v) as f64, &|| loss(true), &|| loss(false))
    };
    rows.push(loss_row("cross_entropy"));

    // RMSNorm forward + backward: the weight's gradient (`dx` comes with it; on GPUs `dw` is
    // titan-rs's column sum of the per-row partials). Bytes: x read and y written, then x and
    // dy read and dx written.
    let lift1 = |x: Tensor<1>| Tensor::<1>::from_data(x.to_data(), &ad).require_grad();
    let lift_x = |x: &Tensor<3>| Tensor::<3>::from_data(x.to_data(), &ad).require_grad();
    let (xr, wr) = (lift_x(&x), lift1(w.clone()));
    let rr = Tensor::<3>::from_data(random([b, t, d], device).to_data(), &ad);
    let norm_dw = |fused: bool| {
        let y = titan_kernels::rms_norm(xr.clone(), wr.clone(), 1e-5, fused);
        wr.grad(&(y * rr.clone()).sum().backward()).expect("dw")
    };
    let norm_bwd_row = |name: &str| {
        row(name, format!("{b}×{t}×{d}"), iters, word * (5 * n * d) as f64, (10 * n * d) as f64, &|| norm_dw(true), &|| {
            norm_dw(false)
        })
    };
    rows.push(norm_bwd_row("rms_norm fwd+bwd"));
    // On GPU devices the row reductions also as one thread per row, the variant the first
    // kernels were (the default, one cube per row, is above; training measures both).
    if titan_kernels::on_cube(device) {
        titan_kernels::force_row_variant(Some(false));
        rows.push(norm_row("rms_norm, one thread per row"));
        rows.push(norm_bwd_row("rms_norm fwd+bwd, one thread per row"));
        rows.push(loss_row("cross_entropy, one thread per row"));
        titan_kernels::force_row_variant(None);
    }

    // AdamW and the gradient norm's Σ x² over the model's largest parameter (the embedding,
    // `vocab × dim`), the update applied again and again to its own results as training does
    // (so every output is used). AdamW moves 7 floats an element (4 read, 3 written).
    let np = v * d;
    let h = crate::optim::adamw::AdamWConfig { beta1: 0.9, beta2: 0.95, eps: 1e-8, fused: true }
        .step_scalars(10, 3e-4, 0.1, 0.5);
    let start = || (random([np], device), random([np], device), random([np], device).abs());
    let g = random([np], device);
    let (fused_state, reference_state) = (std::cell::RefCell::new(start()), std::cell::RefCell::new(start()));
    *reference_state.borrow_mut() = fused_state.borrow().clone();
    let adamw = |fused: bool| {
        let state = if fused { &fused_state } else { &reference_state };
        let (p, m, vs) = state.borrow().clone();
        let next = titan_kernels::adamw(p, g.clone(), m, vs, h, fused);
        *state.borrow_mut() = next.clone();
        next.0
    };
    rows.push(row("adamw", format!("{np}"), iters, word * (7 * np) as f64, (12 * np) as f64, &|| adamw(true), &|| adamw(false)));
    let sum_squares = || match titan_kernels::start_sum_squares(g.clone()) {
        titan_kernels::SumSquares::Device(s) => s,
        titan_kernels::SumSquares::Host(s) => Tensor::<1>::from_data(TensorData::new(vec![s as f32], [1]), device),
    };
    let mut squares =
        row("sum of squares", format!("{np}"), iters, word * np as f64, (2 * np) as f64, &sum_squares, &|| {
            g.clone().square().sum()
        });
    // Checked against the exact (f64) sum, not Burn's (still the timed reference): on the
    // software adapter Burn's sum came out wrong past ≈ 2¹⁸ elements.
    let values: Vec<f32> = g.to_data().convert::<f32>().try_into_vec::<f32>().expect("f32 values");
    let exact: f64 = values.iter().map(|&x| x as f64 * x as f64).sum();
    let ours = sum_squares().into_scalar::<f32>() as f64;
    squares.rel_err = ((ours - exact).abs() / exact.max(1.0)) as f32;
    rows.push(squares);
    Ok(rows)
}

/// The largest error relative to the reference's largest value a kernel may have to pass its
/// check (float32 on any device).
pub const CHECK_TOLERANCE: f32 = 1e-4;

/// Writes the rows as JSON: the device, the peaks, and per kernel its check (`checked`: error
/// within [`CHECK_TOLERANCE`]) and timings.
pub fn write_json(path: &std::path::Path, rows: &[KernelRow], device: &str, peaks: Option<(f64, f64)>) -> Result<()> {
    let kernels: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            let mut v = serde_json::to_value(r).expect("a kernel row serialises");
            v["checked"] = serde_json::json!(r.rel_err.is_finite() && r.rel_err <= CHECK_TOLERANCE);
            if let Some((gbs, tflops)) = peaks {
                v["share_of_peak_bandwidth"] = serde_json::json!(r.gbs / gbs);
                v["share_of_peak_tflops"] = serde_json::json!(r.tflops / tflops);
            }
            v
        })
        .collect();
    let out = serde_json::json!({
        "device": device,
        "adapter": crate::device::selected_adapter(),
        "peak_gbs": peaks.map(|p| p.0),
        "peak_tflops": peaks.map(|p| p.1),
        "tolerance": CHECK_TOLERANCE,
        "kernels": kernels,
    });
    std::fs::write(path, serde_json::to_string_pretty(&out)?)
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))
}

/// Prints the rows as a Markdown table; `peaks = (GB/s, TFLOP/s)` adds the share of each.
pub fn print_table(rows: &[KernelRow], device: &str, peaks: Option<(f64, f64)>) {
    println!("kernels on {device} (float32; error relative to the largest reference value)");
    println!("| kernel | shape | rel. error | fused ms | reference ms | speed-up | GB/s | TFLOP/s |");
    println!("|---|---|---|---|---|---|---|---|");
    for r in rows {
        let share = |x: f64, peak: f64| format!(" ({:.1} %)", 100.0 * x / peak);
        let (gb, tf) = match peaks {
            Some((g, t)) => (share(r.gbs, g), share(r.tflops, t)),
            None => (String::new(), String::new()),
        };
        println!(
            "| {} | {} | {:.1e} | {:.3} | {:.3} | {:.2}× | {:.1}{gb} | {:.3}{tf} |",
            r.name,
            r.shape,
            r.rel_err,
            r.fused_ms,
            r.reference_ms,
            r.reference_ms / r.fused_ms,
            r.gbs,
            r.tflops
        );
    }
}
