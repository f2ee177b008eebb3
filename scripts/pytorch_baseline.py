#!/usr/bin/env python3
"""The PyTorch eager baseline of `titan-rs bench train` on the debugmodel: Hugging Face's Llama
(sdpa attention) with the debugmodel's shape, AdamW, fp32, the same tokens per step.

    pip install torch transformers
    python3 scripts/pytorch_baseline.py [--batch 8 --seq 256 --warmup 2 --steps 10 --threads 2]

Prints tokens/s. Run it next to `titan-rs bench train --config configs/llama_debug.toml
--training.seq_len 256 --training.local_batch_size 8` to compare on the same machine.
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
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    # titan-rs's debugmodel: dim 256, 6 layers, 16 heads, vocab 2048, SwiGLU hidden 768.
    cfg = LlamaConfig(
        vocab_size=2048,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=6,
        num_attention_heads=16,
        num_key_value_heads=16,
        max_position_embeddings=a.seq,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    x = torch.randint(0, cfg.vocab_size, (a.batch, a.seq + 1))
    inputs, labels = x[:, :-1], x[:, 1:]

    def step():
        logits = model(input_ids=inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab_size), labels.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(a.warmup):
        step()
    start = time.perf_counter()
    for _ in range(a.steps):
        step()
    dt = (time.perf_counter() - start) / a.steps
    print(f"pytorch {torch.__version__} eager, HF Llama sdpa: step {dt:.3f} s, {a.batch * a.seq / dt:.0f} tokens/s")


if __name__ == "__main__":
    main()
