#!/usr/bin/env python3
"""Activation checkpointing benchmark: peak memory and tokens/s of `small` at seq_len 2048 under
`activation_checkpoint.mode` none / full / selective ("2" and "op"), side by side in one run.

The modes alternate within each round (none, full, selective, none, ...) so the machine's noise
falls on all of them alike; each run trains a few steps in a fresh process. Reported per mode:
the median and range over rounds of tokens/s (median of the steps after the first), of the
process's peak resident memory less its runtime before the model (`peak_memory_gib -
runtime_memory_gib`), and of the activation part of it (that, less the 16 bytes per parameter of
float32 parameters, gradients and AdamW moments).

usage: scripts/ac_bench.py [--rounds 3] [--steps 4] [--flavor small] [--seq-len 2048] [--batch 1]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from titan_binary import binary

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = {
    "none": ["--activation_checkpoint.mode", "none"],
    "full": ["--activation_checkpoint.mode", "full"],
    "selective 2": ["--activation_checkpoint.mode", "selective", "--activation_checkpoint.selective_ac_option", "2"],
    "selective op": ["--activation_checkpoint.mode", "selective", "--activation_checkpoint.selective_ac_option", "op"],
}


def run(args, mode):
    with tempfile.TemporaryDirectory() as dump:
        cmd = [binary(), "train", "--config", "configs/llama_debug.toml", "--model.flavor", args.flavor,
               "--training.seq_len", str(args.seq_len), "--training.local_batch_size", str(args.batch),
               "--training.steps", str(args.steps), "--metrics.log_freq", "1", "--validation.enable", "false",
               "--checkpoint.enable", "false", "--metrics.save_loss_curve", "false", "--job.dump_folder", dump,
               *MODES[mode]]
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "RUST_LOG": "warn"})
        lines = [json.loads(l) for l in open(os.path.join(dump, "metrics.jsonl"))]
    lines = [l for l in lines if "loss" in l]
    tps = statistics.median(l["tokens_per_s"] for l in lines[1:])
    peak = max(l["peak_memory_gib"] for l in lines) - lines[0]["runtime_memory_gib"]
    state = 4 * (lines[0]["param_bytes"]) / 2**30  # params + grads (= params) + AdamW (2x params)
    return tps, peak, peak - state, [l["loss"] for l in lines]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--flavor", default="small")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch", type=int, default=1)
    args = p.parse_args()
    results = {m: [] for m in MODES}
    losses = {}
    for r in range(args.rounds):
        for mode in MODES:
            tps, peak, act, loss = run(args, mode)
            results[mode].append((tps, peak, act))
            losses.setdefault(mode, loss)
            print(f"round {r + 1} {mode:12s} tokens/s {tps:8.1f}  peak {peak:.3f} GiB  activations {act:.3f} GiB",
                  file=sys.stderr)
    same = all(losses[m] == losses["none"] for m in MODES)
    print(f"{args.flavor}, seq_len {args.seq_len}, batch {args.batch}, {args.rounds} rounds x {args.steps} steps; "
          f"losses identical across modes: {same}")
    print("| mode | tokens/s median (range) | step time vs none | peak memory GiB median (range) | activation memory GiB | activations vs none |")
    print("|---|---|---|---|---|---|")
    base_tps = statistics.median(t for t, _, _ in results["none"])
    base_act = statistics.median(a for _, _, a in results["none"])
    for mode, rs in results.items():
        tps = [t for t, _, _ in rs]
        peak = [m for _, m, _ in rs]
        act = [a for _, _, a in rs]
        mt, mp, ma = statistics.median(tps), statistics.median(peak), statistics.median(act)
        print(f"| {mode} | {mt:.0f} ({min(tps):.0f}–{max(tps):.0f}) | {base_tps / mt:.2f}× | "
              f"{mp:.2f} ({min(peak):.2f}–{max(peak):.2f}) | {ma:.2f} | {base_act / ma:.1f}× smaller |")


if __name__ == "__main__":
    main()
