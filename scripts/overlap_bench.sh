#!/bin/sh
# FSDP communication overlap across network hosts: `small` on FSDP 4, one MPI rank on each of 4
# network-namespace hosts (scripts/netns_hosts.sh: own network stack each, TCP over veth links,
# no shared memory), every host's link shaped to RATE (a tc token bucket), ROUNDS alternating
# rounds of overlap off / on, STEPS steps each. Prints, per setting, the median step time (steps
# after the second: the first has no gather order to prefetch by) with its range, and rank 0's
# exposed and hidden collective time (metrics.jsonl's `comm_exposed_s` / `comm_hidden_s`); then
# rank 0's peak memory with `fsdp_reshard_after_forward` never vs always, and what
# `titan-rs plan` says for both. Needs root, iproute2 and a binary built with `--features mpi`.
#   scripts/overlap_bench.sh [ROUNDS] [STEPS] [RATE]      (defaults 2, 5, 1gbit)
set -eu
cd "$(dirname "$0")/.."
RATE=${3:-1gbit}
. scripts/bench_env.sh
HOSTS=ovb$$
HOSTS=$(echo "$HOSTS" | cut -c1-6)
scripts/netns_hosts.sh up "$HOSTS" 4
trap 'scripts/netns_hosts.sh down "$HOSTS"; rm -rf "$OUT"' EXIT
scripts/netns_hosts.sh hostfile "$HOSTS" 4 1 > "$OUT/hostfile"
for i in 0 1 2 3; do
    scripts/netns_hosts.sh shape "$HOSTS" "$i" tbf rate "$RATE" burst 256kb latency 50ms
done
SHAPE="--model.flavor small --training.seq_len 512 --training.local_batch_size 1 --training.threads 1"
ARGS="train --config configs/llama_debug.toml $SHAPE --parallelism.data_parallel_shard_degree 4 --validation.enable false --checkpoint.enable false --metrics.log_freq 1 --metrics.save_loss_curve false --training.steps $STEPS"
run() { # dump-name flags...
    name=$1
    shift
    RUST_LOG=warn timeout 1200 scripts/netns_hosts.sh mpirun "$HOSTS" --hostfile "$OUT/hostfile" -np 4 \
        "$(realpath "$BIN")" $ARGS --job.dump_folder "$OUT/$name" "$@" >"$OUT/$name.log" 2>&1 ||
        { echo "run $name failed:"; tail -20 "$OUT/$name.log"; exit 1; }
}
for round in $(seq "$ROUNDS"); do
    run "r$round-off" --parallelism.overlap_collectives false
    run "r$round-on" --parallelism.overlap_collectives true
done
for reshard in never always; do
    run "mem-$reshard" --parallelism.fsdp_reshard_after_forward "$reshard"
done
echo "small, FSDP 4 over 4 namespace hosts, links shaped to $RATE, seq 512 x 1 per rank, $(date -u +%F), $(nproc) cores"
python3 - "$OUT" "$ROUNDS" <<'PY'
import glob, json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def rows(name):
    return [json.loads(l) for l in open(f"{out}/{name}/metrics.jsonl") if '"loss"' in l]
res = {}
for setting in ["off", "on"]:
    step, exp, hid = [], [], []
    for r in range(1, rounds + 1):
        for row in rows(f"r{r}-{setting}")[2:]:
            step.append(row["step_time_s"]); exp.append(row["comm_exposed_s"]); hid.append(row["comm_hidden_s"])
    m = statistics.median
    res[setting] = (m(step), m(exp), m(hid))
    print(f"overlap {setting:>3}: step {m(step):.2f} s [{min(step):.2f}-{max(step):.2f}] over {len(step)} steps; "
          f"collectives exposed {m(exp):.2f} s [{min(exp):.2f}-{max(exp):.2f}], hidden {m(hid):.2f} s [{min(hid):.2f}-{max(hid):.2f}]")
off, on = res["off"], res["on"]
print(f"on/off step time {on[0] / off[0]:.2f}; of the collective time with overlap ({on[1] + on[2]:.2f} s), "
      f"{100 * on[2] / max(on[1] + on[2], 1e-9):.0f}% hidden")
for reshard in ["never", "always"]:
    r = rows(f"mem-{reshard}")
    print(f"reshard {reshard:>6}: rank 0 peak {max(x['peak_memory_gib'] for x in r):.2f} GiB")
PY
for reshard in never always; do
    echo "plan, reshard $reshard: $("$BIN" plan --config configs/llama_debug.toml $SHAPE --parallelism.data_parallel_shard_degree 4 --parallelism.fsdp_reshard_after_forward $reshard | grep 'pp rank 0' | sed 's/ = .*//')"
done
