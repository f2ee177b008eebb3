#!/usr/bin/env python3
"""Reads titan-rs's TensorBoard event files with TensorBoard's own reader and prints every
scalar series; exits non-zero if a file does not load or a series is missing.

    pip install tensorboard
    titan-rs train --config configs/llama_debug.toml --metrics.enable_tensorboard true
    python3 scripts/check_tensorboard.py outputs/llama_debug/tb

Expected tags: loss_metrics/global_avg_loss, grad_norm, lr, throughput(tps), tflops, mfu(%),
memory/rss(GiB), memory/max_rss(GiB), time_metrics/step_time(s), time_metrics/comm_share(%)
and, with validation on, validation_metrics/loss.
"""
import math
import os
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

REQUIRED = ["loss_metrics/global_avg_loss", "grad_norm", "lr", "throughput(tps)", "tflops", "memory/rss(GiB)"]


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "outputs"
    runs = sorted({d for d, _, files in os.walk(root) for f in files if f.startswith("events.out.tfevents.")})
    if not runs:
        sys.exit(f"no event files under {root}")
    for run in runs:
        acc = EventAccumulator(run, size_guidance={"scalars": 0})
        acc.Reload()
        tags = acc.Tags()["scalars"]
        missing = [t for t in REQUIRED if t not in tags]
        if missing:
            sys.exit(f"{run}: missing {missing}; has {tags}")
        print(run)
        for tag in sorted(tags):
            events = acc.Scalars(tag)
            if not all(math.isfinite(e.value) for e in events):
                sys.exit(f"{run}: {tag} has non-finite values")
            print(f"  {tag:32s} {len(events):4d} points, steps {events[0].step}..{events[-1].step}, "
                  f"first {events[0].value:.5g}, last {events[-1].value:.5g}")
    print(f"ok: {len(runs)} run(s) read by TensorBoard's EventAccumulator")


if __name__ == "__main__":
    main()
