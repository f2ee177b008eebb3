#!/usr/bin/env python3
"""Straggler detection across network-namespace hosts (issue 34's benchmark; root, iproute2,
OpenMPI, a release build with `--features mpi`).

2 hosts x 2 MPI ranks (scripts/netns_hosts.sh), `tiny` FSDP 4, four cases in turn:
plain links; host 1's link shaped (`tc tbf rate 100mbit`: every collective waits on it); rank 3
computing 0.2 s more per step (`debug.slow_rank`); both. Reported per case: median step time and
collective time (rank 0's metrics), and which ranks the detector named (`"stragglers"` in
metrics.jsonl) from which step. The detector compares compute time, so a slow link is expected
to raise everyone's collective time and name nobody, and a slow rank to be named with its host.

    sudo python3 scripts/straggler_bench.py [--steps 12]
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

from titan_binary import ROOT, binary

HARNESS = os.path.join(ROOT, "scripts/netns_hosts.sh")
PREFIX = "sbench"


def sh(*args, **kw):
    return subprocess.run([HARNESS, *args], check=True, **kw)


def run(steps, hostfile, extra):
    with tempfile.TemporaryDirectory() as dump:
        os.chmod(dump, 0o777)
        cmd = [HARNESS, "mpirun", PREFIX, "--hostfile", hostfile, "-np", "4", binary(), "train", "--config",
               "configs/llama_debug.toml", "--model.flavor", "tiny", "--training.steps", str(steps), "--metrics.log_freq", "2",
               "--parallelism.data_parallel_shard_degree", "4", "--training.local_batch_size", "2",
               "--validation.enable", "false", "--checkpoint.enable", "false", "--metrics.save_loss_curve", "false",
               "--fault.straggler_windows", "2", "--job.dump_folder", dump, *extra]
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "RUST_LOG": "warn"})
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
        lines = [json.loads(l) for l in open(os.path.join(dump, "metrics.jsonl"))]
    steps_ = [l for l in lines if "step_time_s" in l and l["step"] > 2]
    named = [(l["step"], s) for l in lines for s in l.get("stragglers", [])]
    return {
        "step": statistics.median(l["step_time_s"] for l in steps_),
        "comm": statistics.median(l["comm_time_s"] for l in steps_),
        "named": named,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    a = ap.parse_args()
    sh("up", PREFIX, "2")
    try:
        with tempfile.NamedTemporaryFile("w", suffix=".hosts", delete=False) as f:
            f.write(sh("hostfile", PREFIX, "2", "2", capture_output=True, text=True).stdout)
        os.chmod(f.name, 0o644)
        slow = ["--debug.slow_rank", "3", "--debug.slow_seconds", "0.2"]
        rows = []
        for name, shaped, extra in [("plain links", False, []), ("host 1 link at 100 Mbit/s", True, []),
                                    ("rank 3 +0.2 s compute", False, slow), ("both", True, slow)]:
            args = ["shape", PREFIX, "1", "tbf", "rate", "100mbit", "burst", "64kb", "latency", "100ms"]
            sh(*(args if shaped else ["shape", PREFIX, "1", "pfifo_fast"]))
            r = run(a.steps, f.name, extra)
            first = r["named"][0] if r["named"] else None
            who = "nobody" if not first else f"rank {first[1].get('rank')} (host {first[1].get('host')}) from step {first[0]}"
            rows.append(f"| {name} | {r['step']:.3f} | {r['comm']:.3f} | {who} |")
            print(rows[-1], flush=True)
            if first:
                print("   ", json.dumps(first[1]))
        print("\n| case | step time s | collective time s | named straggler |\n|---|---|---|---|")
        print("\n".join(rows))
    finally:
        sh("down", PREFIX)


if __name__ == "__main__":
    main()
