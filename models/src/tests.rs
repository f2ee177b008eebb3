use crate::decoder::logical_axes;
use crate::init::param_id;
use crate::*;
use burn::module::{Module, ModuleVisitor, Param};
use burn::prelude::*;

fn cpu() -> Device {
    Device::flex()
}

#[test]
fn lazily_built_models_have_the_analytic_parameter_count() {
    // Lazy init: even 405B is only shapes here.
    for family in registry::FAMILIES {
        for f in family.flavors {
            let args = (family.flavor)(f).unwrap();
            let m = Transformer::new(&args, 0, &cpu());
            assert_eq!(m.num_params(), args.num_params(), "flavor {f}");
            let specs = m.param_specs();
            // Dense blocks: 2 norms, 4 attention, 3 FFN weights; MoE blocks: router, 3 stacked
            // expert weights, the balancing bias, and 3 shared-expert weights (if any) instead
            // of the FFN; QK-norm: 2 more per block; latent attention: wq (or wq_a, q_a_norm,
            // wq_b), wkv_a, kv_a_norm, wkv_b, wo instead of the 4.
            let moe = 5 + if args.moe.as_ref().is_some_and(|m| m.num_shared_experts > 0) { 3 } else { 0 };
            let qk = if args.qk_norm { 2 } else { 0 };
            let attn = args.mla.as_ref().map_or(4, |m| if m.q_lora_rank > 0 { 7 } else { 5 });
            let per_block: usize =
                (0..args.n_layers).map(|l| qk + attn + 2 + if args.is_moe_layer(l) { moe } else { 3 }).sum();
            assert_eq!(specs.len(), 2 + per_block + usize::from(!args.tie_word_embeddings), "{}/{f}", family.name);
        }
    }
}

#[test]
fn every_parameter_declares_axes_matching_its_shape() {
    for (family, flavor) in [("llama3", "8B"), ("llama3", "moe_debug"), ("qwen3", "0.6B"), ("qwen3", "30B-A3B")] {
        let args = (crate::registry::family(family).unwrap().flavor)(flavor).unwrap();
        let m = Transformer::new(&args, 0, &cpu());
        let moe = args.moe.clone().unwrap_or(MoeArgs {
            num_experts: 0,
            top_k: 0,
            n_group: 1,
            topk_group: 1,
            hidden_dim: 0,
            num_shared_experts: 0,
            n_dense_layers: 0,
            score_func: ScoreFunc::Softmax,
            route_norm: false,
            route_scale: 1.0,
            load_balance_coeff: 0.0,
            aux_loss_alpha: 0.0,
        });
        for s in m.param_specs() {
            assert_eq!(s.axes.len(), s.shape.len(), "{s}");
            for (axis, &n) in s.axes.iter().zip(&s.shape) {
                let expect = match axis {
                    LogicalAxis::Vocab => args.vocab_size,
                    LogicalAxis::Embed => args.dim,
                    LogicalAxis::Heads if args.mla.is_some() => {
                        let m = args.mla.as_ref().unwrap();
                        args.n_heads
                            * match s.path.rsplit('.').nth(1).unwrap() {
                                "wkv_b" => m.qk_nope_head_dim + m.v_head_dim,
                                "wo" => m.v_head_dim,
                                _ => m.qk_head_dim(),
                            }
                    }
                    LogicalAxis::Heads => args.n_heads * args.head_dim(),
                    LogicalAxis::KvHeads => args.n_kv_heads * args.head_dim(),
                    LogicalAxis::Mlp => args.ffn_hidden_dim(),
                    LogicalAxis::HeadDim => args.head_dim(),
                    LogicalAxis::Latent => {
                        let m = args.mla.as_ref().unwrap();
                        match s.path.rsplit('.').nth(1).unwrap() {
                            "wq_a" | "q_a_norm" | "wq_b" => m.q_lora_rank,
                            "wkv_a" => m.kv_lora_rank + m.qk_rope_head_dim,
                            _ => m.kv_lora_rank,
                        }
                    }
                    LogicalAxis::Experts => moe.num_experts,
                    LogicalAxis::ExpertMlp if s.path.contains("shared") => moe.hidden_dim * moe.num_shared_experts,
                    LogicalAxis::ExpertMlp => moe.hidden_dim,
                };
                assert_eq!(n, expect, "{s}");
            }
        }
    }
    assert_eq!(logical_axes("layers.0.attention.wq.weight"), Some(vec![LogicalAxis::Embed, LogicalAxis::Heads]));
    assert_eq!(logical_axes("layers.0.attention.bogus"), None);
}

struct IdCheck(Vec<String>, usize);
impl ModuleVisitor for IdCheck {
    fn enter_module(&mut self, n: &str, _: &str) {
        self.0.push(n.into())
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.0.pop();
    }
    fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
        assert_eq!(p.id, param_id(&self.0.join(".")), "{}", self.0.join("."));
        self.1 += 1;
    }
}

#[test]
fn param_ids_are_derived_from_module_paths() {
    let m = Transformer::new(&ModelArgs::flavor("tiny").unwrap(), 0, &cpu());
    let mut c = IdCheck(vec![], 0);
    m.visit(&mut c);
    assert_eq!(c.1, 2 + 9 * 2 + 1);
    let names: Vec<String> = m.param_specs().into_iter().map(|s| s.path).collect();
    assert_eq!(names[0], "tok_embeddings.weight");
    assert_eq!(names[1], "layers.0.attention_norm.weight");
    assert!(names.contains(&"layers.1.feed_forward.w2.weight".to_string()));
    assert_eq!(names.last().unwrap(), "output.weight");
}

fn tokens(b: usize, t: usize, vocab: usize, device: &Device) -> Tensor<2, Int> {
    let ids: Vec<i64> = (0..b * t).map(|i| ((i * 7919 + 13) % vocab) as i64).collect();
    Tensor::from_data(TensorData::new(ids, [b, t]), device)
}

#[test]
fn forward_shapes_and_initial_loss_near_ln_vocab() {
    let args = ModelArgs::flavor("debugmodel").unwrap();
    let m = Transformer::new(&args, 42, &cpu());
    let (b, t) = (2, 32);
    let x = tokens(b, t + 1, args.vocab_size, &cpu());
    let inp = x.clone().slice([0..b, 0..t]);
    let tgt = x.slice([0..b, 1..t + 1]);
    let logits = m.forward(inp);
    assert_eq!(logits.dims(), [b, t, args.vocab_size]);
    let loss: f32 = loss::cross_entropy_sum(logits, tgt).into_scalar::<f32>() / (b * t) as f32;
    let ln_v = (args.vocab_size as f32).ln();
    // Output std dim^-1/2 on unit-RMS features: logits ~ N(0,1), so E[loss] ≈ ln V + 1/2.
    assert!((loss - ln_v).abs() < 1.0, "initial loss {loss} vs ln V {ln_v}");
}

#[test]
fn attention_is_causal() {
    let args = ModelArgs::flavor("tiny").unwrap();
    let m = Transformer::new(&args, 1, &cpu());
    let a = tokens(1, 8, args.vocab_size, &cpu());
    let mut ids: Vec<i64> = a.to_data().convert::<i64>().try_to_vec::<i64>().unwrap();
    ids[7] = (ids[7] + 1) % args.vocab_size as i64;
    let b = Tensor::<2, Int>::from_data(TensorData::new(ids, [1, 8]), &cpu());
    let la: Vec<f32> = m.forward(a).slice([0..1, 0..7]).into_data().try_to_vec::<f32>().unwrap();
    let lb: Vec<f32> = m.forward(b).slice([0..1, 0..7]).into_data().try_to_vec::<f32>().unwrap();
    assert_eq!(la, lb, "changing the last token changed earlier logits");
}

#[test]
fn gqa_and_mha_both_run_and_get_gradients() {
    let args = ModelArgs::flavor("tiny").unwrap();
    assert!(args.n_kv_heads < args.n_heads);
    let dev = cpu().autodiff();
    let m = Transformer::new(&args, 3, &dev);
    let x = tokens(2, 9, args.vocab_size, &dev);
    let loss = loss::cross_entropy_sum(m.forward(x.clone().slice([0..2, 0..8])), x.slice([0..2, 1..9]));
    let grads = loss.backward();
    let g = m.layers[0].attention.as_ref().unwrap().wk.weight.grad(&grads).expect("wk has a gradient");
    assert_eq!(g.dims(), [64, 32]);
    let gn: f32 = g.square().sum().into_scalar();
    assert!(gn > 0.0 && gn.is_finite());
}

#[test]
fn fused_and_reference_attention_train_the_same() {
    // Whole-model check of the fused kernel: loss and every gradient agree with Burn's ops.
    let args = ModelArgs::flavor("tiny").unwrap();
    let dev = cpu().autodiff();
    let x = tokens(2, 17, args.vocab_size, &dev);
    let run = |fused: bool| {
        let m = Transformer::new(&args, 9, &dev).with_fused_attention(fused);
        let loss = loss::cross_entropy_sum(m.forward(x.clone().slice([0..2, 0..16])), x.clone().slice([0..2, 1..17]));
        let l: f32 = loss.clone().into_scalar();
        let g = loss.backward();
        let gq: Vec<f32> =
            m.layers[1].attention.as_ref().unwrap().wq.weight.grad(&g).unwrap().into_data().try_to_vec().unwrap();
        (l, gq)
    };
    let ((lf, gf), (lr, gr)) = (run(true), run(false));
    assert!((lf - lr).abs() <= 1e-5 * lr.abs(), "loss {lf} vs {lr}");
    let scale = gr.iter().fold(0f32, |m, x| m.max(x.abs()));
    let err = gf.iter().zip(&gr).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(err <= 1e-5 * scale, "wq grad error {err} vs scale {scale}");
}

/// The whole model on a packed row with block-causal attention gives each document the logits
/// it gets alone (fused kernel and reference path alike), whether RoPE positions restart per
/// document or not: RoPE scores depend only on relative positions, so the restart changes
/// rounding, not the function. Causal attention over the same row does not.
#[test]
fn block_causal_model_sees_each_document_alone() {
    use crate::decoder::StageInput;
    let args = ModelArgs::flavor("tiny").unwrap();
    let dev = cpu();
    let eos = 5i64;
    let docs: [Vec<i64>; 3] = [vec![11, 12, 13, eos], vec![21, 22, eos], vec![31, 32, 33, 34, 35]];
    let packed: Vec<i64> = docs.concat();
    let t = packed.len();
    let logits = |m: &Transformer, ids: &[i64], mask: Option<DocumentMask>| -> Vec<f32> {
        let d = mask.map(|mask| mask.documents(ids, 1, ids.len()));
        let x = Tensor::<2, Int>::from_data(TensorData::new(ids.to_vec(), [1, ids.len()]), &dev);
        m.forward_stage(StageInput::Tokens(x), ids.len(), d.as_ref()).into_data().try_to_vec::<f32>().unwrap()
    };
    let v = args.vocab_size;
    for fused in [true, false] {
        let m = Transformer::new(&args, 4, &dev).with_fused_attention(fused).with_fused_kernels(fused);
        for restart in [true, false] {
            let all = logits(&m, &packed, Some(DocumentMask { eos, restart_positions: restart }));
            assert_eq!(all.len(), t * v);
            let mut s = 0;
            for (n, doc) in docs.iter().enumerate() {
                let alone = logits(&m, doc, None);
                let part = &all[s * v..(s + doc.len()) * v];
                let err = part.iter().zip(&alone).fold(0f32, |e, (a, b)| e.max((a - b).abs()));
                assert!(err < 1e-5, "fused {fused}, restart {restart}: document {n} differs by {err}");
                s += doc.len();
            }
        }
        // Causal attention over the same row: later documents see earlier ones.
        let causal = logits(&m, &packed, None);
        let alone = logits(&m, &docs[1], None);
        let err = causal[4 * v..7 * v].iter().zip(&alone).fold(0f32, |e, (a, b)| e.max((a - b).abs()));
        assert!(err > 1e-3, "causal attention ignored the previous document");
    }
}

/// The MoE flavors' counts, total and active, match their parameters; `moe_1B` is ≈ 1 B total
/// and ≈ 0.3 B active, and FLOPs count only the active ones.
#[test]
fn moe_flavors_count_total_and_active_parameters() {
    for f in ["moe_debug", "moe_1B"] {
        let a = ModelArgs::flavor(f).unwrap();
        let m = Transformer::new(&a, 0, &cpu());
        assert_eq!(m.num_params(), a.num_params(), "{f}");
        let moe = a.moe.clone().unwrap();
        let expert = 3 * a.dim * moe.hidden_dim;
        let routed_unused = (moe.num_experts - moe.top_k) * expert + moe.num_experts;
        let moe_layers = a.n_layers - moe.n_dense_layers;
        assert_eq!(a.num_params() - a.num_active_params(), moe_layers * routed_unused, "{f}");
    }
    let a = ModelArgs::flavor("moe_1B").unwrap();
    let (total, active) = (a.num_params() as f64 / 1e9, a.num_active_params() as f64 / 1e9);
    assert!(
        (0.95..1.05).contains(&total) && (0.28..0.32).contains(&active),
        "moe_1B: {total} B total, {active} B active"
    );
    let dense = ModelArgs::flavor("debugmodel").unwrap();
    assert_eq!(dense.num_active_params(), dense.num_params());
    let flops_params = (a.flops_per_token(0) / 6.0) as usize;
    assert_eq!(flops_params, a.num_active_params() - a.vocab_size * a.dim);
}

/// One MoE layer equals its definition computed token by token: the top-k experts by
/// score + bias, their SwiGLU outputs weighted by the (normalised) scores, plus the shared
/// experts — with the grouped kernel and with the per-expert reference, softmax and sigmoid.
#[test]
fn moe_layer_equals_the_per_token_definition() {
    use crate::moe::MoE;
    for (score, norm, fused) in
        [(ScoreFunc::Softmax, false, true), (ScoreFunc::Sigmoid, true, true), (ScoreFunc::Softmax, false, false)]
    {
        let mut a = ModelArgs::flavor("moe_debug").unwrap();
        a.dim = 32;
        let cfg =
            MoeArgs { score_func: score, route_norm: norm, route_scale: 1.5, hidden_dim: 24, ..a.moe.clone().unwrap() };
        let dev = cpu();
        let layer = MoE::new(&a, &cfg, 3, "layers.1.moe", 0.02, &dev).with_fused(fused);
        // A bias that changes the choice of some tokens.
        let bias: Vec<f32> = (0..cfg.num_experts).map(|e| if e == 5 { 0.05 } else { 0.0 }).collect();
        let layer = MoE {
            expert_bias: Param::from_tensor(Tensor::from_data(TensorData::new(bias.clone(), [cfg.num_experts]), &dev)),
            ..layer
        };
        let x = Tensor::<3>::random([2, 5, 32], burn::tensor::Distribution::Normal(0.0, 1.0), &dev);
        let y = layer.forward(x.clone(), &Hooks::default());
        let host = |t: Tensor<2>| t.into_data().try_into_vec::<f32>().unwrap();
        let flat = x.reshape([10, 32]);
        let logits = host(flat.clone().matmul(layer.router.gate.weight.val()));
        let w = |p: &Param<Tensor<3>>, e: usize| {
            let [_, i, o] = p.val().dims();
            p.val().narrow(0, e, 1).reshape([i, o])
        };
        let ex = &layer.experts;
        let mut expect = Vec::new();
        for t in 0..10 {
            let row = &logits[t * 8..(t + 1) * 8];
            let scores: Vec<f32> = match score {
                ScoreFunc::Softmax => {
                    let m = row.iter().cloned().fold(f32::MIN, f32::max);
                    let z: f32 = row.iter().map(|v| (v - m).exp()).sum();
                    row.iter().map(|v| (v - m).exp() / z).collect()
                }
                ScoreFunc::Sigmoid => row.iter().map(|v| 1.0 / (1.0 + (-v).exp())).collect(),
            };
            let mut order: Vec<usize> = (0..8).collect();
            order.sort_by(|&p, &q| (scores[q] + bias[q]).total_cmp(&(scores[p] + bias[p])));
            let top = &order[..cfg.top_k];
            let sum: f32 = top.iter().map(|&e| scores[e]).sum();
            let xt = flat.clone().narrow(0, t, 1);
            let mut out = layer.shared_experts.as_ref().unwrap().w2.forward(
                burn::tensor::activation::silu(layer.shared_experts.as_ref().unwrap().w1.forward(xt.clone()))
                    * layer.shared_experts.as_ref().unwrap().w3.forward(xt.clone()),
            );
            for &e in top {
                let g = if norm { scores[e] / sum } else { scores[e] } * 1.5;
                let h =
                    burn::tensor::activation::silu(xt.clone().matmul(w(&ex.w1, e))) * xt.clone().matmul(w(&ex.w3, e));
                out = out + h.matmul(w(&ex.w2, e)).mul_scalar(g);
            }
            expect.extend(host(out));
        }
        let got = host(y.reshape([10, 32]));
        let err = got.iter().zip(&expect).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert!(err < 1e-5, "{score:?} norm {norm} fused {fused}: max error {err}");
    }
}

/// Aux-loss-free balancing: on a router skewed toward two experts, repeated bias steps bring
/// the max/mean load from ≈ 3 to near 1; a balanced load leaves the bias alone.
#[test]
fn balancing_bias_moves_a_skewed_router_toward_balance() {
    use crate::moe::{bias_update, imbalance, Routing};
    use rand::{Rng, SeedableRng};
    let (e, k, n) = (8, 2, 512);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    // Experts 0 and 1 score 0.3 higher on average.
    let scores: Vec<f32> = (0..n * e).map(|i| rng.gen::<f32>() * 0.2 + if i % e < 2 { 0.3 } else { 0.0 }).collect();
    let load =
        |bias: &[f32]| -> Vec<u64> { Routing::choose(&scores, bias, e, k).counts.iter().map(|&c| c as u64).collect() };
    let mut bias = vec![0f32; e];
    let before = imbalance(&load(&bias));
    for _ in 0..400 {
        bias = bias_update(&bias, &load(&bias), 1e-3);
    }
    let after = imbalance(&load(&bias));
    eprintln!("skewed router: max/mean load {before:.2} → {after:.2} after 400 bias steps");
    assert!(before > 3.5 && after < 1.25, "imbalance {before:.2} → {after:.2}");
    assert!(bias.iter().sum::<f32>().abs() < 1e-4, "the bias steps are centred: {bias:?}");
    assert_eq!(bias_update(&[0.1, -0.1], &[5, 5], 1e-3), vec![0.1, -0.1]);
}

/// Group-limited routing: 8 experts in 4 groups of 2, the best 2 groups by the sum of their two
/// scores; the top 2 experts come from those groups only, even when a single higher score sits
/// elsewhere. Without the limit the same scores choose that expert.
#[test]
fn group_limited_routing_chooses_within_the_best_groups() {
    use crate::moe::Routing;
    // Groups: {0,1} 0.9+0.0, {2,3} 0.5+0.5, {4,5} 0.46+0.46, {6,7} 0.1+0.1.
    let scores = [0.9, 0.0, 0.5, 0.5, 0.46, 0.46, 0.1, 0.1];
    let zero = [0.0; 8];
    assert_eq!(Routing::choose_grouped(&scores, &zero, 8, 2, (4, 2)).experts, vec![2, 3]);
    assert_eq!(Routing::choose(&scores, &zero, 8, 2).experts, vec![0, 2]);
    // The bias joins the group scores: +0.2 on expert 1 lifts group {0,1} to 1.1.
    let bias = [0.0, 0.2, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
    assert_eq!(Routing::choose_grouped(&scores, &bias, 8, 2, (4, 2)).experts, vec![0, 2]);
    assert_eq!(Routing::choose_grouped(&scores, &bias, 8, 2, (4, 1)).experts, vec![0, 1]);
}
