#!/usr/bin/env python3
"""The PyTorch eager baseline of `titan-rs bench train`: Hugging Face's Llama (sdpa attention)
with a titan-rs flavor's shape (default: the debugmodel), AdamW, gradient clipping, the same
tokens per step; float32, or bfloat16/float16 autocast (float32 master weights, as titan-rs's
`training.mixed_precision_param`), on the CPU or a CUDA GPU.

    pip install torch transformers
    python3 scripts/pytorch_baseline.py [--batch 8 --seq 256 --warmup 2 --steps 10 --threads 2]
        [--dim 256 --layers 6 --heads 16 --kv-heads 16 --ffn 768 --vocab 2048 --rope-theta 5e5]
        [--device cpu|cuda] [--dtype float32|bfloat16|float16]

Prints tokens/s. `titan-rs bench train --config F --baseline pytorch --rounds 3` runs it with the
config's shape, alternating with its own measurement, and reports both medians and the ratio.
"""
import argparse
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=16)
    p.add_argument("--ffn", type=int, default=768)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--rope-theta", type=float, default=500000.0)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=a.vocab,
        hidden_size=a.dim,
        intermediate_size=a.ffn,
        num_hidden_layers=a.layers,
        num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads,
        max_position_embeddings=a.seq,
        rope_theta=a.rope_theta,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    dev = torch.device(a.device)
    model = LlamaForCausalLM(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    x = torch.randint(0, cfg.vocab_size, (a.batch, a.seq + 1), device=dev)
    inputs, labels = x[:, :-1], x[:, 1:]
    half = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(a.dtype)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def step():
        with torch.autocast(dev.type, dtype=half, enabled=half is not None):
            logits = model(input_ids=inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, cfg.vocab_size), labels.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(a.warmup):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(a.steps):
        step()
    sync()
    dt = (time.perf_counter() - start) / a.steps
    mem = f", peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB" if dev.type == "cuda" else ""
    print(f"pytorch {torch.__version__} eager on {a.device}, {a.dtype}, HF Llama sdpa: step {dt:.3f} s{mem}, {a.batch * a.seq / dt:.0f} tokens/s")


if __name__ == "__main__":
    main()
