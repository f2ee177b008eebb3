#!/bin/sh
# Context parallelism on this machine: debugmodel at seq_len 8192 (one sequence per step) with
# CP 1, 2 and 4 (thread ranks), ROUNDS alternating rounds of STEPS steps each. Prints, per CP
# degree, the median step time (steps after the first), tokens/s, the logging rank's share of
# time inside collectives (the ring's send/recv and the other reductions), the process's peak
# memory, and the planned activation memory per rank (`titan-rs plan`); then, with mpirun (a
# binary built with `--features mpi`), the same as processes: rank 0's own peak memory.
#   scripts/cp_bench.sh [ROUNDS] [STEPS]
set -eu
cd "$(dirname "$0")/.."
. scripts/bench_env.sh
ARGS="--config configs/llama_debug.toml --training.seq_len 8192 --training.local_batch_size 1 --training.global_batch_size 1 --parallelism.data_parallel_shard_degree 1 --validation.enable false --checkpoint.enable false --metrics.log_freq 1 --metrics.save_loss_curve false --training.steps $STEPS"
for round in $(seq "$ROUNDS"); do
    for cp in 1 2 4; do
        RUST_LOG=warn "$BIN" train $ARGS --parallelism.context_parallel_degree "$cp" --job.dump_folder "$OUT/r$round-cp$cp" >/dev/null
        if command -v mpirun >/dev/null; then
            RUST_LOG=warn mpirun --allow-run-as-root --oversubscribe -np "$cp" "$BIN" train $ARGS --parallelism.context_parallel_degree "$cp" --job.dump_folder "$OUT/mpi-r$round-cp$cp" >/dev/null
        fi
    done
done
for cp in 1 2 4; do
    act=$("$BIN" plan $ARGS --parallelism.context_parallel_degree "$cp" | sed -n 's/.*activations \([0-9.]*\) (.*/\1/p' | head -1)
    python3 - "$OUT" "$cp" "$act" <<'PY'
import glob, json, statistics, sys
out, cp, act = sys.argv[1], sys.argv[2], sys.argv[3]
steps, shares, peaks = [], [], []
for kind, pattern in [("threads", "r*"), ("mpi", "mpi-r*")]:
    steps, shares, peaks = [], [], []
    for f in glob.glob(f"{out}/{pattern}-cp{cp}/metrics.jsonl"):
        rows = [json.loads(l) for l in open(f) if '"loss"' in l]
        for r in rows[1:]:
            steps.append(r["step_time_s"]); shares.append(r["comm_time_s"] / r["step_time_s"])
        peaks.append(max(r["peak_memory_gib"] for r in rows))
    if not steps:
        continue
    med = statistics.median(steps)
    peak = "process peak (all ranks)" if kind == "threads" else "rank 0's process peak"
    print(f"CP {cp} {kind}: step {med:.2f} s [{min(steps):.2f}-{max(steps):.2f}], {8192 / med:.0f} tokens/s, "
          f"collectives {100 * statistics.median(shares):.0f}% of rank 0's step, {peak} {max(peaks):.2f} GiB, "
          f"planned activations per rank {act} GiB")
PY
done
