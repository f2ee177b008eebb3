#!/bin/sh
# Mixture of experts on this machine: the moe_1B flavor (≈ 1.0 B parameters, ≈ 0.30 B active
# per token) against a dense Llama with the same active parameters (same dim, layers, heads and
# vocabulary; its FFN widened to match), one rank each, and moe_1B under expert parallelism 2
# (two thread ranks, dp_shard 2, the same global batch). ROUNDS alternating rounds of STEPS steps
# at seq_len 256 × 2 sequences per step; medians over the steps after each run's first, with
# ranges. Prints tokens/s, tokens/s × active parameters (training work per second, the fair
# comparison of the two), and under EP 2 the share of rank 0's step spent in the expert
# all-to-alls and in all collectives.
#   scripts/moe_bench.sh [ROUNDS] [STEPS]
set -eu
cd "$(dirname "$0")/.."
. scripts/bench_env.sh
# The dense twin: moe_1B's shape with an FFN as wide as one token's active experts.
mkdir -p "$OUT/dense"
cp assets/tokenizer/tokenizer.json "$OUT/dense/"
cat > "$OUT/dense/config.json" <<JSON
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 12,
 "num_attention_heads": 16, "num_key_value_heads": 8, "intermediate_size": 7104, "vocab_size": 2048,
 "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": false, "hidden_act": "silu",
 "max_position_embeddings": 8192}
JSON
ARGS="--config configs/llama_debug.toml --training.seq_len 256 --training.global_batch_size 2 --validation.enable false --checkpoint.enable false --metrics.log_freq 1 --metrics.save_loss_curve false --training.steps $STEPS --lr_scheduler.warmup_steps 2"
DENSE="--model.flavor hf --model.hf_assets_path $OUT/dense --parallelism.data_parallel_shard_degree 1 --training.local_batch_size 2"
MOE="--model.flavor moe_1B --parallelism.data_parallel_shard_degree 1 --training.local_batch_size 2"
EP2="--model.flavor moe_1B --parallelism.data_parallel_shard_degree 2 --parallelism.expert_parallel_degree 2 --training.local_batch_size 1"
for round in $(seq "$ROUNDS"); do
    for kind in dense moe ep2; do
        case $kind in dense) X=$DENSE ;; moe) X=$MOE ;; ep2) X=$EP2 ;; esac
        RUST_LOG=warn "$BIN" train $ARGS $X --job.dump_folder "$OUT/r$round-$kind" > "$OUT/r$round-$kind.log"
    done
done
dense_params=$(sed -n 's/^model llama3\/hf: \([0-9]*\) parameters.*/\1/p' "$OUT/r1-dense.log")
moe_active=$(sed -n 's/.*, \([0-9]*\) active per token.*/\1/p' "$OUT/r1-moe.log")
moe_total=$(sed -n 's/^model llama3\/moe_1B: \([0-9]*\) parameters.*/\1/p' "$OUT/r1-moe.log")
python3 - "$OUT" "$dense_params" "$moe_active" "$moe_total" <<'PY'
import glob, json, statistics, sys
out, dense_n, moe_active, moe_total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
tokens = 2 * 256
def rows(kind):
    r = []
    for f in sorted(glob.glob(f"{out}/r*-{kind}/metrics.jsonl")):
        r += [json.loads(l) for l in open(f) if '"loss"' in l][1:]
    return r
active = {"dense": dense_n, "moe": moe_active, "ep2": moe_active}
res = {}
for kind, name in [("dense", "dense twin (1 rank)"), ("moe", "moe_1B (1 rank)"), ("ep2", "moe_1B EP 2 (2 ranks)")]:
    r = rows(kind)
    tps = [tokens / x["step_time_s"] for x in r]
    med = statistics.median(tps)
    res[kind] = med
    line = (f"{name}: {med:.0f} tokens/s [{min(tps):.0f}-{max(tps):.0f}], "
            f"{med * active[kind] / 1e9:.1f} G active-parameter-tokens/s")
    if kind == "ep2":
        a2a = statistics.median(x.get("all_to_all_time_s", 0) / x["step_time_s"] for x in r)
        comm = statistics.median(x["comm_time_s"] / x["step_time_s"] for x in r)
        line += f", all-to-all {100 * a2a:.1f}% of rank 0's step (all collectives {100 * comm:.1f}%)"
    print(line)
print(f"parameters: dense twin {dense_n / 1e6:.1f} M; moe_1B {moe_total / 1e6:.1f} M total, {moe_active / 1e6:.1f} M active")
print(f"tokens/s per active parameter, moe_1B / dense twin: {res['moe'] * moe_active / (res['dense'] * dense_n):.2f}x (EP 2: {res['ep2'] * moe_active / (res['dense'] * dense_n):.2f}x)")
PY
