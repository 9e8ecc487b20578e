"""Writes tests/data/golden/llama_tiny_golden.safetensors, the golden state that
tests/model/llama_golden_test.cpp checks crosstrain's Llama against. The independent
implementation is Hugging Face transformers' LlamaForCausalLM (eager attention, float32 and
float64) on Debian's python3-torch; only the initial weights come from crosstrain's scheme
(Philox streams, scripts/torch_gpt2.py), so both sides start from the same numbers.

Regenerate (a few seconds on a CPU; transformers 4.44 still runs on Debian's torch 1.13):
    /usr/bin/python3 -m venv --system-site-packages /tmp/hf
    /tmp/hf/bin/pip install transformers==4.44.2
    /tmp/hf/bin/python scripts/make_llama_golden.py

The file holds what tiny_golden.safetensors holds for GPT-2 (scripts/make_golden.py: tokens,
targets, sampled initial weights and their sums, logits, loss, per-tensor gradient norms and
samples, 5 AdamW steps with losses, gradient norms and final weight samples), for the
llama-tiny preset (6 layers, width 384, 6 heads with 2 KV heads, MLP 1024, untied head) at
seed 42.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_golden as mg  # noqa: E402
import torch_gpt2 as tg  # noqa: E402

PRESET = dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=6,
              num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256,
              vocab_size=256, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
              attention_bias=False, bos_token_id=None, eos_token_id=None)


def param_table(cfg):
    """crosstrain's llama_param_table (core/model/llama.cpp): (name, shape, decay) in flat order."""
    C, V, F = cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size
    hd = C // cfg.num_attention_heads
    Q, KV = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    t = [("model.embed_tokens.weight", (V, C), True)]
    for l in range(cfg.num_hidden_layers):
        p = f"model.layers.{l}."
        t += [(p + "self_attn.q_proj.weight", (Q, C), True),
              (p + "self_attn.k_proj.weight", (KV, C), True),
              (p + "self_attn.v_proj.weight", (KV, C), True),
              (p + "self_attn.o_proj.weight", (C, Q), True),
              (p + "mlp.gate_proj.weight", (F, C), True),
              (p + "mlp.up_proj.weight", (F, C), True),
              (p + "mlp.down_proj.weight", (C, F), True)]
    if not cfg.tie_word_embeddings:
        t.append(("lm_head.weight", (V, C), True))
    for l in range(cfg.num_hidden_layers):
        p = f"model.layers.{l}."
        t += [(p + "input_layernorm.weight", (C,), False),
              (p + "post_attention_layernorm.weight", (C,), False)]
    t.append(("model.norm.weight", (C,), False))
    return t


def philox_init(model, table, seed):
    """Llama::init: 0.02 * Philox(seed, k).normal() for weights, RMSNorm weights 1."""
    named = dict(model.named_parameters())
    with torch.no_grad():
        for k, (name, shape, decay) in enumerate(table):
            p = named[name]
            assert tuple(p.shape) == shape, (name, p.shape, shape)
            if decay:
                values = np.float32(0.02) * tg.philox_normal(seed, k, int(np.prod(shape)))
                p.copy_(torch.from_numpy(values.reshape(shape)))
            else:
                p.fill_(1.0)


def flat(model, table, grads=False):
    named = dict(model.named_parameters())
    return np.concatenate([(named[n].grad if grads else named[n]).detach().double().numpy()
                           .reshape(-1) for n, _, _ in table])


def train_run(cfg, table, dtype, tokens, targets):
    model = LlamaForCausalLM(cfg)
    assert len(list(model.parameters())) == len(table)
    philox_init(model, table, mg.SEED)
    model = model.to(dtype)
    out = {"init": flat(model, table).astype(np.float32)}
    named = dict(model.named_parameters())
    decay = [named[n] for n, _, d in table if d]
    no_decay = [named[n] for n, _, d in table if not d]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": mg.WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}], **mg.ADAMW)
    losses, norms = [], []
    for step in range(mg.STEPS):
        opt.zero_grad(set_to_none=False)
        logits = model(input_ids=tokens).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 targets.reshape(-1))
        loss.backward()
        if step == 0:
            out["logits"] = logits.detach().float().numpy()
            out["loss"] = loss.item()
            out["grads"] = [named[n].grad.detach().double().clone().numpy().reshape(-1)
                            for n, _, _ in table]
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), mg.MAX_GRAD_NORM)
        losses.append(loss.item())
        norms.append(norm.item())
        opt.step()
    out["losses"] = np.array(losses)
    out["norms"] = np.array(norms)
    out["final"] = flat(model, table).astype(np.float32)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--out",
                    default=os.path.join(root, "tests/data/golden/llama_tiny_golden.safetensors"))
    args = ap.parse_args()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

    cfg = LlamaConfig(**PRESET, attn_implementation="eager")
    table = param_table(cfg)
    B, T = mg.B, mg.T
    data = np.frombuffer(mg.TEXT.encode("ascii"), dtype=np.uint8).astype(np.int64)
    tokens = torch.from_numpy(data[:B * T].reshape(B, T).copy())
    targets = torch.from_numpy(data[1:B * T + 1].reshape(B, T).copy())

    r32 = train_run(cfg, table, torch.float32, tokens, targets)
    r64 = train_run(cfg, table, torch.float64, tokens, targets)

    tensors = mg.golden_tensors(table, r32, r64, tokens, targets)
    metadata = {
        "format": "crosstrain-golden-v1",
        "preset": "llama-tiny",
        "config": json.dumps(cfg.to_diff_dict()),
        "seed": str(mg.SEED),
        "batch": json.dumps([B, T]),
        "param_names": json.dumps([n for n, _, _ in table]),
        "adamw": json.dumps(dict(mg.ADAMW, weight_decay=mg.WEIGHT_DECAY,
                                 max_grad_norm=mg.MAX_GRAD_NORM, steps=mg.STEPS)),
        "text": mg.TEXT,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    mg.write_golden(args.out, tensors, metadata, r32, r64)

if __name__ == "__main__":
    main()
