//! Under tensor parallelism the loss receives this rank's vocabulary slice of the logits — the
//! full `[B, T, vocab]` tensor is never formed — and the vocabulary-parallel loss equals the
//! single-rank cross-entropy.

use super::*;
use titan_models::{loss::cross_entropy_sum, ModelArgs, Transformer};
use titan_parallel::{run_ranks, MeshGroups};

#[test]
fn tensor_parallel_logits_are_vocab_slices_and_the_loss_is_the_full_one() {
    let args = ModelArgs::flavor("tiny").unwrap();
    let device = Device::flex().autodiff();
    let (b, t) = (2, 8);
    let ids = |off: i64| {
        let v: Vec<i64> = (0..(b * t) as i64).map(|i| (i * 397 + off) % args.vocab_size as i64).collect();
        Tensor::<2, Int>::from_data(TensorData::new(v, [b, t]), &device)
    };
    let full = Transformer::new(&args, 7, &device);
    let want: f32 = cross_entropy_sum(full.forward(ids(0)), ids(1)).into_scalar();
    // tiny has 2 kv heads, so 2 ranks; tp = 4 runs in the integration tests (debugmodel).
    for (tp, sp) in [(2, true), (2, false)] {
        run_ranks(tp, std::time::Duration::from_secs(60), |c| {
            let rank = RankContext::new(MeshGroups { tp: Some(Box::new(c)), ..MeshGroups::single() });
            let whole = RankModel { chunks: vec![Transformer::new(&args, 7, &device)] };
            let opts = ParallelOptions {
                sequence_parallel: sp,
                cp_rotate: titan_parallel::cp::Rotate::Ring,
                reshard_after_forward: true,
                ddp_overlap: false,
            };
            let (model, placement) = parallelize_llama(whole, &rank, opts);
            let logits = model.chunks[0].forward(ids(0));
            assert_eq!(logits.dims(), [b, t, args.vocab_size / tp], "what the loss receives");
            let got: f32 = placement.loss(logits, ids(1)).into_scalar();
            assert!((got - want).abs() <= 1e-5 * want.abs(), "tp {tp} sp {sp}: {got} vs {want}");
            Ok(())
        })
        .unwrap();
    }
}
