#!/usr/bin/env python3
"""Makes the Hugging Face fixtures of tests/hf.rs with transformers itself (run once; the small
outputs are committed so CI needs no PyTorch):

  tests/fixtures/hf/tied_bf16/      tiny random LlamaForCausalLM: GQA (4 heads, 2 kv heads), tied
                                    embeddings, rope_scaling llama3, bfloat16 weights in one
                                    model.safetensors, config.json as transformers 5 writes it
                                    (`rope_parameters`)
  tests/fixtures/hf/untied_sharded/ the same shape untied, float32, split into several
                                    safetensors files with model.safetensors.index.json, and a
                                    config.json in the Hub's Llama-3.x shape (top-level
                                    `rope_theta` + `rope_scaling`)

Each folder also holds reference.json: fixed token ids and transformers' loss on them (labels =
ids, mean cross-entropy of the next token), and reference.safetensors: its float32 logits.
Usage: python3 scripts/hf_fixture.py [OUT_DIR]   (needs torch, transformers, safetensors)
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

from family_fixtures import randomise

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "hf")


def make(name, tied, dtype, shard):
    torch.manual_seed(1234 if tied else 4321)
    cfg = LlamaConfig(
        vocab_size=2048,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        max_position_embeddings=256,
        tie_word_embeddings=tied,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    )
    model = LlamaForCausalLM(cfg).eval()
    randomise(model)
    model = model.to(dtype)
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, max_shard_size="200KB" if shard else "50GB")
    if not tied:  # the Hub's Llama-3.x config shape
        path = os.path.join(d, "config.json")
        c = json.load(open(path))
        rope = c.pop("rope_parameters")
        c["rope_theta"] = rope.pop("rope_theta")
        c["rope_scaling"] = rope
        json.dump(c, open(path, "w"), indent=2)
    # Reference outputs in float32 from the weights as stored, loaded as a user would (a bf16
    # model cast back with .float() would keep bf16-rounded RoPE frequencies).
    ref = LlamaForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 2048, (2, 40), generator=g)
    with torch.no_grad():
        out = ref(input_ids=ids, labels=ids)
    json.dump({"input_ids": ids.tolist(), "loss": out.loss.item()}, open(os.path.join(d, "reference.json"), "w"))
    save_file({"logits": out.logits.float().contiguous()}, os.path.join(d, "reference.safetensors"))
    print(name, sorted(os.listdir(d)), "loss", out.loss.item())


make("tied_bf16", tied=True, dtype=torch.bfloat16, shard=False)
make("untied_sharded", tied=False, dtype=torch.float32, shard=True)
