"""Writes tests/data/hf_gpt2/lora_golden.safetensors: LoRA fine-tuning of the PyTorch GPT-2 in
tests/data/hf_gpt2 (scripts/make_hf_golden.py), computed by PyTorch with an adapter written
here the way PEFT defines it for GPT-2's Conv1D layers:
    y = x @ W + b + (alpha / r) * (x @ A^T) @ B^T,   A [r, in], B [out, r]
the base frozen (requires_grad False), A and B trained by AdamW. tests/train/lora_test.cpp
trains the same adapters with crosstrain and compares.

Regenerate (Debian's python3-torch):
    /usr/bin/python3 scripts/make_lora_golden.py

Setup: r 4, alpha 16, target modules c_attn and c_proj (attention and MLP projection), on both
layers; A drawn as crosstrain's GPT2::init_lora draws it (Philox stream 28 + k for adapter k of
the table, uniform in +-1/sqrt(in)), B zero; STEPS AdamW steps (lr 5e-3 constant, betas
0.9/0.999, eps 1e-8, weight decay 0.1 on every adapter, global-norm clipping at 1.0 over the
adapter gradients) on crosstrain's batches (seed 42, B 4, T 32, the first 90 % of harbour.txt).
Holds: losses [STEPS], grad_norms [STEPS] (before clipping), and the final value of each adapter
under its PEFT name ("base_model.model.transformer.h.0.attn.c_attn.lora_A.weight", ...);
grads_step2.<name>: the adapter gradients of step 2 (step 1's A gradient is zero: B starts at 0).
"""
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_hf_golden as hg  # noqa: E402
import torch_gpt2 as tg  # noqa: E402

OUT = os.path.join(hg.OUT, "lora_golden.safetensors")
R, ALPHA, TARGETS = 4, 16.0, ["c_attn", "c_proj"]
STEPS, LR = 5, 5e-3
MODULES = [("attn.c_attn", 1, 3), ("attn.c_proj", 1, 1), ("mlp.c_fc", 1, 4), ("mlp.c_proj", 4, 1)]


def targeted(module):
    return any(module == t or module.endswith("." + t) for t in TARGETS)


def load_base():
    model = tg.GPT2(hg.CFG)
    tensors, _ = tg.load_safetensors(os.path.join(hg.OUT, "model.safetensors"))
    named = dict(model.named_parameters())
    with torch.no_grad():
        for name, p in named.items():
            p.copy_(torch.from_numpy(tensors["transformer." + name]))
            p.requires_grad_(False)
    return model


def add_lora(model):
    """Adapters in crosstrain's table order; returns [(name, parameter)]."""
    C, scaling = hg.CFG.n_embd, ALPHA / R
    n_base = len(tg.param_table(hg.CFG))
    adapters, k = [], 0
    for l, block in enumerate(model.h):
        for module, in_c, out_c in MODULES:
            name = f"h.{l}.{module}"
            if not targeted(name):
                continue
            d_in, d_out = in_c * C, out_c * C
            bound = np.float32(1.0) / np.sqrt(np.float32(d_in))
            u = tg.philox_uniform(hg.SEED, n_base + k, R * d_in)
            a = torch.nn.Parameter(torch.from_numpy(
                (bound * (np.float32(2.0) * u - np.float32(1.0))).reshape(R, d_in)))
            b = torch.nn.Parameter(torch.zeros(d_out, R))
            k += 2
            layer = getattr(getattr(block, module.split(".")[0]), module.split(".")[1])
            base_forward = layer.forward

            def forward(x, base_forward=base_forward, a=a, b=b):
                return base_forward(x) + scaling * ((x @ a.t()) @ b.t())

            layer.forward = forward
            adapters += [(name + ".lora_A.weight", a), (name + ".lora_B.weight", b)]
    return adapters


def main():
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    model = load_base()
    adapters = add_lora(model)
    params = [p for _, p in adapters]
    opt = torch.optim.AdamW([{"params": params, "weight_decay": hg.WEIGHT_DECAY}], lr=LR,
                            betas=(0.9, 0.999), eps=1e-8)
    tokens = np.frombuffer(open(hg.TEXT, "rb").read(), dtype=np.uint8).astype(np.int64)
    n_val = int(round(len(tokens) * hg.VAL_FRACTION))
    train = tokens[:len(tokens) - n_val]
    losses, norms, out = [], [], {}
    for k in range(STEPS):
        opt.zero_grad(set_to_none=False)
        x, y = hg.batch(train, k)
        _, loss = model(x, y)
        loss.backward()
        if k == 1:
            for name, p in adapters:
                out["grads_step2.base_model.model.transformer." + name] = p.grad.numpy().copy()
        norms.append(torch.nn.utils.clip_grad_norm_(params, hg.MAX_GRAD_NORM).item())
        opt.step()
        losses.append(loss.item())
    for name, p in adapters:
        out["base_model.model.transformer." + name] = p.detach().numpy().copy()
    out["losses"] = np.array(losses, np.float32)
    out["grad_norms"] = np.array(norms, np.float32)
    meta = {"r": R, "lora_alpha": ALPHA, "target_modules": json.dumps(TARGETS), "steps": STEPS,
            "learning_rate": LR, "torch": torch.__version__}
    tg.save_safetensors(OUT, out, meta)
    print(json.dumps({"losses": losses, "grad_norms": norms}))


if __name__ == "__main__":
    main()
