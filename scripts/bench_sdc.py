#!/usr/bin/env python3
"""Step-time cost of the silent-data-corruption check (`fault.sdc_check_interval`).

Runs `titan-rs train` on a config (default: debugmodel) with the check every `--every` steps and
without it, alternated `--rounds` times, and reads the step times from metrics.jsonl. Reports
the median time of a normal step, of a checked step, and the average overhead per step the check
costs at intervals 10 and 100 (checked-step extra time / interval / normal step).

    python3 scripts/bench_sdc.py --binary target/release/titan-rs --steps 12 --rounds 3
"""
import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path


def run(binary, config, steps, every, extra):
    with tempfile.TemporaryDirectory() as d:
        cmd = [binary, "train", "--config", config, "--training.steps", str(steps), "--metrics.log_freq", "1",
               "--checkpoint.enable", "false", "--validation.enable", "false", "--metrics.save_loss_curve", "false",
               "--job.dump_folder", d, "--fault.sdc_check_interval", str(every)] + extra
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        lines = [json.loads(l) for l in Path(d, "metrics.jsonl").read_text().splitlines()]
        return {v["step"]: v["step_time_s"] for v in lines if "step_time_s" in v}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--binary", default="target/release/titan-rs")
    p.add_argument("--config", default="configs/llama_debug.toml")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--every", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("extra", nargs="*", help="more overrides, e.g. --parallelism.data_parallel_shard_degree 2")
    a = p.parse_args()
    normal, checked, plain = [], [], []
    for _ in range(a.rounds):
        off = run(a.binary, a.config, a.steps, 0, a.extra)
        on = run(a.binary, a.config, a.steps, a.every, a.extra)
        # Step 1 compiles and warms up: left out.
        plain += [t for s, t in off.items() if s > 1]
        normal += [t for s, t in on.items() if s > 1 and s % a.every]
        checked += [t for s, t in on.items() if s > 1 and s % a.every == 0]
    base, check = statistics.median(plain), statistics.median(checked)
    print(f"step without the check: median {base:.3f} s (range {min(plain):.3f}-{max(plain):.3f}, {len(plain)} steps)")
    print(f"unchecked step with the check on: median {statistics.median(normal):.3f} s")
    print(f"checked step: median {check:.3f} s (range {min(checked):.3f}-{max(checked):.3f}, {len(checked)} steps), "
          f"{check / base:.2f}x a step")
    for interval in (10, 100):
        print(f"every {interval} steps: +{100 * (check - base) / interval / base:.1f} % step time on average")


if __name__ == "__main__":
    main()
