#!/usr/bin/env python3
"""Makes the Qwen3 and DeepSeek-V3 Hugging Face fixtures of tests/hf.rs with transformers itself (run once; the
small outputs are committed so CI needs no PyTorch):

  tests/fixtures/hf/qwen3_tied_bf16/     tiny random Qwen3ForCausalLM: 4 heads of 32 on hidden 64
                                         (head_dim independent of hidden / heads), 2 kv heads,
                                         QK-norm, tied embeddings, bfloat16 in one file, the
                                         config as transformers 5 writes it (`rope_parameters`)
  tests/fixtures/hf/qwen3_moe_sharded/   tiny random Qwen3MoeForCausalLM: 8 experts of 32, top 2,
                                         norm_topk_prob, untied, float32 in several shards, the
                                         Hub's config shape (top-level `rope_theta`, `num_experts`)
  tests/fixtures/hf/qwen3_yarn/          tiny random Qwen3ForCausalLM with YaRN rope scaling
                                         (factor 4 over an original context of 16, so the 40-token
                                         references use it), untied, bfloat16, the Hub's shape
                                         (`rope_scaling` with `rope_type` "yarn")
  tests/fixtures/hf/deepseek_v3_tiny/    tiny random DeepseekV3ForCausalLM: latent attention (query
                                         rank 32, key/value rank 32, heads of 16 + 8 RoPE, values
                                         16, interleaved RoPE rows), YaRN with mscale_all_dim, the
                                         first layer dense, 8 experts in 4 groups (best 2), top 2,
                                         1 shared, routed scale 2.5, a nonzero correction bias;
                                         bfloat16

Each folder holds reference.json (token ids, transformers' loss with labels = ids, and its greedy
continuation of a prompt) and reference.safetensors (its float32 logits).

  python3 scripts/family_fixtures.py [OUT_DIR] [NAME...]   the fixtures (all, or those named)
  python3 scripts/family_fixtures.py --counts      parameter counts of the published configs
  python3 scripts/family_fixtures.py --check DIR   load a titan-rs export with transformers: no
                                                  missing / unexpected keys, print its loss
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
PUBLISHED = {
    "0.6B": dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, intermediate_size=3072, tie_word_embeddings=True),
    "1.7B": dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16, intermediate_size=6144, tie_word_embeddings=True),
    "4B": dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, intermediate_size=9728, tie_word_embeddings=True),
    "8B": dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, intermediate_size=12288, tie_word_embeddings=False),
    "14B": dict(hidden_size=5120, num_hidden_layers=40, num_attention_heads=40, intermediate_size=17408, tie_word_embeddings=False),
    "32B": dict(hidden_size=5120, num_hidden_layers=64, num_attention_heads=64, intermediate_size=25600, tie_word_embeddings=False),
}
PUBLISHED_MOE = {
    "30B-A3B": dict(hidden_size=2048, num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, intermediate_size=6144, moe_intermediate_size=768),
    "235B-A22B": dict(hidden_size=4096, num_hidden_layers=94, num_attention_heads=64, num_key_value_heads=4, intermediate_size=12288, moe_intermediate_size=1536),
}


def counts():
    common = dict(vocab_size=151936, head_dim=128, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    with torch.device("meta"):
        for name, c in PUBLISHED.items():
            m = Qwen3ForCausalLM(Qwen3Config(num_key_value_heads=8, **common, **c))
            print(f'("{name}", {sum(p.numel() for p in m.parameters())}),')
        for name, c in PUBLISHED_MOE.items():
            m = Qwen3MoeForCausalLM(Qwen3MoeConfig(num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, tie_word_embeddings=False, **common, **c))
            print(f'("{name}", {sum(p.numel() for p in m.parameters())}),')


def reference(d, model_cls):
    ref = model_cls.from_pretrained(d, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 2048, (2, 40), generator=g)
    with torch.no_grad():
        out = ref(input_ids=ids, labels=ids)
        greedy = ref.generate(ids[:1, :8], max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=None)
    json.dump(
        {"input_ids": ids.tolist(), "loss": out.loss.item(), "greedy_prompt": ids[0, :8].tolist(), "greedy": greedy[0, 8:].tolist()},
        open(os.path.join(d, "reference.json"), "w"),
    )
    save_file({"logits": out.logits.float().contiguous()}, os.path.join(d, "reference.safetensors"))
    return out.loss.item()


def randomise(model):
    with torch.no_grad():
        for p in model.parameters():  # larger than the default init, so the outputs differ a lot
            p.normal_(0.0, 0.08)
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(1.0)


COMMON = dict(vocab_size=2048, hidden_size=64, head_dim=32, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, intermediate_size=128, rms_norm_eps=1e-6, max_position_embeddings=256,
              rope_parameters={"rope_type": "default", "rope_theta": 1e6})


def hub_shape(d, **edit):
    """Rewrites the config.json in `d` as the Hub has it: top-level rope_theta and rope_scaling."""
    path = os.path.join(d, "config.json")
    c = json.load(open(path))
    rope = c.pop("rope_parameters")
    c["rope_theta"] = rope.pop("rope_theta")
    c["rope_scaling"] = rope if rope.get("rope_type", "default") != "default" else None
    for k, v in edit.items():
        c[k] = c.pop(v)
    json.dump(c, open(path, "w"), indent=2)


def save(out, name, model, dtype, cls, shard=False, hub=None):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    model.to(dtype).save_pretrained(d, max_shard_size="200KB" if shard else "50GB")
    if hub is not None:
        hub_shape(d, **hub)
    print(name, sorted(os.listdir(d)), "loss", reference(d, cls))


def tied_bf16(out):
    torch.manual_seed(1234)
    m = Qwen3ForCausalLM(Qwen3Config(tie_word_embeddings=True, **COMMON)).eval()
    randomise(m)
    save(out, "qwen3_tied_bf16", m, torch.bfloat16, Qwen3ForCausalLM)


def moe_sharded(out):
    torch.manual_seed(4321)
    m = Qwen3MoeForCausalLM(Qwen3MoeConfig(tie_word_embeddings=False, num_experts=8, num_experts_per_tok=2,
                                           moe_intermediate_size=32, norm_topk_prob=True, **COMMON)).eval()
    randomise(m)
    save(out, "qwen3_moe_sharded", m, torch.float32, Qwen3MoeForCausalLM, shard=True, hub={"num_experts": "num_local_experts"})


def yarn(out):
    torch.manual_seed(99)
    rope = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 16}
    m = Qwen3ForCausalLM(Qwen3Config(tie_word_embeddings=False, **{**COMMON, "rope_parameters": rope})).eval()
    randomise(m)
    save(out, "qwen3_yarn", m, torch.bfloat16, Qwen3ForCausalLM, hub={})


def deepseek_v3(out):
    torch.manual_seed(7)
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
            "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}
    cfg = DeepseekV3Config(vocab_size=2048, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                           num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4,
                           q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                           n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=2, n_shared_experts=1,
                           routed_scaling_factor=2.5, norm_topk_prob=True, rms_norm_eps=1e-6, max_position_embeddings=256,
                           tie_word_embeddings=False, rope_parameters=rope, num_nextn_predict_layers=0)
    m = DeepseekV3ForCausalLM(cfg).eval()
    randomise(m)
    with torch.no_grad():  # a nonzero correction bias (a buffer), so its mapping counts
        for layer in m.model.layers[1:]:
            layer.mlp.gate.e_score_correction_bias.normal_(0.0, 0.1)
    save(out, "deepseek_v3_tiny", m, torch.bfloat16, DeepseekV3ForCausalLM)


FIXTURES = {"qwen3_tied_bf16": tied_bf16, "qwen3_moe_sharded": moe_sharded, "qwen3_yarn": yarn, "deepseek_v3_tiny": deepseek_v3}


def check(d):
    m, info = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    ids = torch.randint(0, m.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        loss = m(input_ids=ids, labels=ids).loss.item()
    print(json.dumps({"class": type(m).__name__, "loading_problems": bad, "loss": loss}))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--counts"]:
        counts()
    elif sys.argv[1:2] == ["--check"]:
        check(sys.argv[2])
    else:
        out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "tests", "fixtures", "hf")
        for name in sys.argv[2:] or FIXTURES:
            FIXTURES[name](out)
