#!/usr/bin/env python3
"""Muon reference updates for the unit test of titan-rs's Muon (tests/fixtures/muon/reference.json).

Written from the published algorithm (Keller Jordan, "Muon: An optimizer for hidden layers in
neural networks", 2024; PyTorch's torch.optim.Muon documentation), in float64 numpy, on
matrices in PyTorch's [out, in] layout; the fixture stores them in titan-rs's (Burn's) [in, out]
layout, so the test also checks the fan-in/fan-out reading of the learning-rate adjustment.
When PyTorch (>= 2.9, torch.optim.Muon) is importable, its updates are checked against this
reference too (it runs Newton-Schulz in bfloat16, so only to ~1e-2).

    python3 scripts/muon_reference.py   # writes tests/fixtures/muon/reference.json
"""
import json
import pathlib

import numpy as np

A, B, C = 3.4445, -4.7750, 2.0315


def newton_schulz(g, steps=5, eps=1e-7):
    x = g.T if g.shape[0] > g.shape[1] else g
    x = x / max(np.linalg.norm(x), eps)
    for _ in range(steps):
        gram = x @ x.T
        x = A * x + (B * gram + C * gram @ gram) @ x
    return x.T if g.shape[0] > g.shape[1] else x


def adjusted_lr(lr, shape, rule):
    out_features, in_features = shape  # PyTorch layout
    if rule == "original":
        return lr * np.sqrt(max(1.0, out_features / in_features))
    return lr * 0.2 * np.sqrt(max(out_features, in_features))


def muon_step(w, g, buf, lr, wd, mu, nesterov, rule):
    """One step on a PyTorch-layout matrix; returns (w, buf)."""
    buf = mu * buf + g
    u = g + mu * buf if nesterov else buf
    o = newton_schulz(u)
    w = w * (1 - lr * wd) - adjusted_lr(lr, w.shape, rule) * o
    return w, buf


def run(case, rng):
    shapes = {"a": [8, 5], "b": [4, 12], "experts": [3, 6, 4]}  # titan-rs layout ([in, out])
    params = {k: rng.standard_normal(s) * 0.1 for k, s in shapes.items()}
    grads = [{k: rng.standard_normal(s) for k, s in shapes.items()} for _ in range(case["steps"])]
    w = {k: params[k].copy() for k in shapes}
    bufs = {k: np.zeros(s) for k, s in shapes.items()}
    after = []
    for step in range(case["steps"]):
        for k in shapes:
            mats = w[k] if w[k].ndim == 3 else w[k][None]
            gs = grads[step][k] if w[k].ndim == 3 else grads[step][k][None]
            bs = bufs[k] if w[k].ndim == 3 else bufs[k][None]
            new_w, new_b = [], []
            for m, gm, bm in zip(mats, gs, bs):
                # to PyTorch's [out, in] and back
                nw, nb = muon_step(m.T, gm.T, bm.T, case["lr"], case["weight_decay"], case["momentum"], case["nesterov"], case["adjust_lr_fn"])
                new_w.append(nw.T)
                new_b.append(nb.T)
            w[k] = np.stack(new_w) if w[k].ndim == 3 else new_w[0]
            bufs[k] = np.stack(new_b) if bufs[k].ndim == 3 else new_b[0]
        after.append({k: w[k].ravel().tolist() for k in shapes})
    flat = lambda d: {k: v.ravel().tolist() for k, v in d.items()}
    return {
        **case,
        "shapes": shapes,
        "params": flat(params),
        "grads": [flat(g) for g in grads],
        "after_each_step": after,
        "torch_checked": torch_check(case, shapes, params, grads, w),
    }


def torch_check(case, shapes, params, grads, want):
    try:
        import torch
        muon = torch.optim.Muon
    except (ImportError, AttributeError):
        return False
    for k, shape in shapes.items():
        if len(shape) != 2:
            continue
        p = torch.nn.Parameter(torch.tensor(params[k].T.copy(), dtype=torch.float32))
        opt = muon([p], lr=case["lr"], weight_decay=case["weight_decay"], momentum=case["momentum"],
                   nesterov=case["nesterov"], adjust_lr_fn=case["adjust_lr_fn"])
        for g in grads:
            p.grad = torch.tensor(g[k].T.copy(), dtype=torch.float32)
            opt.step()
        err = np.abs(p.detach().numpy().T - want[k]).max()
        assert err < 2e-2, f"torch.optim.Muon differs from the reference on {k} by {err}"
    return True


def main():
    rng = np.random.default_rng(7)
    cases = [
        dict(steps=3, lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=True, adjust_lr_fn="match_rms_adamw"),
        dict(steps=3, lr=0.01, weight_decay=0.0, momentum=0.9, nesterov=False, adjust_lr_fn="original"),
    ]
    out = pathlib.Path(__file__).resolve().parent.parent / "tests/fixtures/muon/reference.json"
    out.write_text(json.dumps({"cases": [run(c, rng) for c in cases]}, indent=None))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
