#!/usr/bin/env python3
"""Writes tests/data/llama/rope.json: the rotary tables transformers' Llama computes (inverse
frequencies and cos/sin at a few positions) for a plain config and a llama3-scaled one, so
tests/model/llama_config_test.cpp checks LlamaConfig::rope_tables against transformers itself.

Needs transformers (any 4.4x) and torch:
  python3 -m venv --system-site-packages /tmp/hf && /tmp/hf/bin/pip install transformers==4.44.2
  /tmp/hf/bin/python scripts/make_llama_rope_golden.py
"""
import json
import pathlib

import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

POSITIONS = [0, 1, 7, 100, 255, 1000, 2047]


def case(name, max_positions, **kw):
    cfg = LlamaConfig(hidden_size=384, num_attention_heads=6, num_key_value_heads=2,
                      intermediate_size=1024, num_hidden_layers=1, vocab_size=256,
                      max_position_embeddings=max_positions, **kw)
    kind = (cfg.rope_scaling or {}).get("rope_type", "default")
    inv_freq, _ = ROPE_INIT_FUNCTIONS[kind](cfg, "cpu")
    rope = LlamaRotaryEmbedding(config=cfg)
    x = torch.zeros(1, dtype=torch.float32)
    pos = torch.tensor([POSITIONS])
    cos, sin = rope(x, pos)
    half = cfg.hidden_size // cfg.num_attention_heads // 2
    return {
        "name": name,
        "config": cfg.to_diff_dict(),
        "inv_freq": inv_freq.tolist(),
        "positions": POSITIONS,
        "cos": cos[0, :, :half].tolist(),
        "sin": sin[0, :, :half].tolist(),
    }


def main():
    out = pathlib.Path(__file__).resolve().parent.parent / "tests/data/llama/rope.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    cases = [
        case("default", 2048, rope_theta=10000.0),
        case("llama3", 131072, rope_theta=500000.0,
             rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    ]
    out.write_text(json.dumps(cases, indent=1) + "\n")
    print("wrote", out)


if __name__ == "__main__":
    main()
