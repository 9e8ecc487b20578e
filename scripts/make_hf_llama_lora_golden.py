"""Writes the LoRA golden data of tests/train/hf_llama_lora_test.cpp: PEFT's LoRA on the
transformers checkpoints of scripts/make_hf_llama_golden.py, trained on crosstrain's batches.

Regenerate (seconds on a CPU; PEFT 0.13 and transformers 4.44 run on Debian's torch 1.13):
    /usr/bin/python3 -m venv --system-site-packages /tmp/hf
    /tmp/hf/bin/pip install transformers==4.44.2 jinja2 && /tmp/hf/bin/pip install --no-deps \
        peft==0.13.2 accelerate==0.34.2
    /tmp/hf/bin/python scripts/make_hf_llama_lora_golden.py

For each folder (hf_llama: q_proj, v_proj, o_proj, up_proj, down_proj with lora_dropout 0.1;
hf_qwen2: q_proj, k_proj, v_proj, gate_proj without dropout; r 4, alpha 16 in both):
get_peft_model(LlamaForCausalLM / Qwen2ForCausalLM.from_pretrained(folder), LoraConfig(...)),
its lora_A weights replaced by crosstrain's draws (LoraAdapters::init: adapter k of the table
from Philox stream <base table rows> + k, uniform in +-1/sqrt(in); lora_B zero as PEFT starts
it), its dropout modules replaced by crosstrain's masks (Device::dropout on Philox stream
2^48 + draw * sites + site, draw = the step; the mask is the only thing that differs from
PEFT's own nn.Dropout), STEPS AdamW steps (constant lr, weight decay 0.1 on every adapter,
clipping at 1.0 over the adapter gradients) on crosstrain's batches. Writes
<folder>/lora_golden.safetensors: losses [STEPS], grad_norms [STEPS] (before clipping), each
adapter's final value under its PEFT name, eval_loss_merged [1] (merge_and_unload's model on
harbour.txt, as `crosstrain eval`); and
<folder>/peft_lora/: the trained adapters as PEFT's save_pretrained writes them.
"""
import json
import os
import sys

import numpy as np
import peft
import torch
import transformers
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_hf_golden as hg  # noqa: E402
import make_hf_llama_golden as hl  # noqa: E402
import torch_gpt2 as tg  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
R, ALPHA, LR = 4, 16.0, 5e-3
SITES = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
         "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]  # Llama::lora_sites' order
DROPOUT_STREAM = 1 << 48


def base_table_rows(cfg):
    """Rows of crosstrain's llama_param_table for this config."""
    n = 1 + 7 * cfg.num_hidden_layers + (0 if cfg.tie_word_embeddings else 1)
    n += cfg.num_hidden_layers * (2 + (3 if getattr(cfg, "attention_bias", False) or
                                       cfg.model_type == "qwen2" else 0))
    return n + 1


def crosstrain_mask(seed, stream, shape, p):
    """Device::dropout's keep-and-scale factors for elements [0, numel) of a row-major shape."""
    n = int(np.prod(shape))
    words = tg.philox_blocks(seed, stream, 0, (n + 3) // 4).reshape(-1)[:n]
    threshold = np.uint32(round(p * (1 << 24)))
    scale = np.float32(1.0) / np.float32(1.0 - p)
    return torch.from_numpy(np.where((words >> np.uint32(8)) >= threshold, scale,
                                     np.float32(0.0)).astype(np.float32).reshape(shape))


class CrosstrainDropout(torch.nn.Module):
    """The adapter input's dropout with crosstrain's mask for the current draw (None: off)."""
    state = {"draw": None, "sites": 0}

    def __init__(self, site, p):
        super().__init__()
        self.site, self.p = site, p

    def forward(self, x):
        draw = CrosstrainDropout.state["draw"]
        if draw is None:
            return x
        stream = DROPOUT_STREAM + draw * CrosstrainDropout.state["sites"] + self.site
        return x * crosstrain_mask(hg.SEED, stream, tuple(x.shape), self.p)


def run(folder, targets, dropout):
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager")
    cfg = model.config
    lc = peft.LoraConfig(r=R, lora_alpha=ALPHA, target_modules=targets, lora_dropout=dropout,
                         bias="none", task_type="CAUSAL_LM")
    model = peft.get_peft_model(model, lc)
    modules = dict(model.named_modules())
    adapters, k = [], base_table_rows(cfg)
    CrosstrainDropout.state["sites"] = cfg.num_hidden_layers * len(SITES)
    with torch.no_grad():
        for l in range(cfg.num_hidden_layers):
            for s, site in enumerate(SITES):
                if site.split(".")[1] not in targets:
                    continue
                name = f"model.layers.{l}.{site}"
                layer = modules["base_model.model." + name]
                a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
                d_in = a.shape[1]
                bound = np.float32(1.0) / np.sqrt(np.float32(d_in))
                u = tg.philox_uniform(hg.SEED, k, R * d_in)
                a.copy_(torch.from_numpy((bound * (np.float32(2.0) * u - np.float32(1.0)))
                                         .reshape(R, d_in)))
                b.zero_()
                k += 2
                if dropout > 0:
                    layer.lora_dropout["default"] = CrosstrainDropout(
                        l * len(SITES) + s, dropout)
                adapters += [("base_model.model." + name + ".lora_A.weight", a),
                             ("base_model.model." + name + ".lora_B.weight", b)]
    params = [p for _, p in adapters]
    assert len(params) == len([p for p in model.parameters() if p.requires_grad])
    opt = torch.optim.AdamW([{"params": params, "weight_decay": hg.WEIGHT_DECAY}], lr=LR,
                            betas=(0.9, 0.999), eps=1e-8)
    tokens = np.frombuffer(open(hg.TEXT, "rb").read(), dtype=np.uint8).astype(np.int64)
    n_val = int(round(len(tokens) * hg.VAL_FRACTION))
    train = tokens[:len(tokens) - n_val]
    losses, norms, out = [], [], {}
    model.train()
    for step in range(hg.STEPS):
        opt.zero_grad(set_to_none=False)
        CrosstrainDropout.state["draw"] = step
        x, y = hg.batch(train, step)
        logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 y.reshape(-1))
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(params, hg.MAX_GRAD_NORM).item())
        opt.step()
        losses.append(loss.item())
    CrosstrainDropout.state["draw"] = None
    for name, p in adapters:
        out[name] = p.detach().numpy().copy()
    for m in dict(model.named_modules()).values():  # PEFT's own dropout back before saving
        if hasattr(m, "lora_dropout") and "default" in m.lora_dropout:
            m.lora_dropout["default"] = torch.nn.Dropout(dropout) if dropout > 0 else \
                torch.nn.Identity()
    model.peft_config["default"].base_model_name_or_path = os.path.relpath(folder, ROOT)
    model.save_pretrained(os.path.join(folder, "peft_lora"))
    os.remove(os.path.join(folder, "peft_lora", "README.md"))  # PEFT's model card template
    model.eval()
    merged = model.merge_and_unload()
    out["losses"] = np.array(losses, np.float32)
    out["grad_norms"] = np.array(norms, np.float32)
    out["eval_loss_merged"] = np.array([hl.eval_loss(merged, tokens)], np.float32)
    meta = {"r": str(R), "lora_alpha": str(ALPHA), "target_modules": json.dumps(targets),
            "lora_dropout": str(dropout), "steps": str(hg.STEPS), "learning_rate": str(LR),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "peft": peft.__version__}
    tg.save_safetensors(os.path.join(folder, "lora_golden.safetensors"), out, meta)
    print(folder, json.dumps({"losses": losses, "grad_norms": norms,
                              "eval_loss_merged": float(out["eval_loss_merged"][0])}))


def main():
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    data = os.path.join(ROOT, "tests", "data")
    run(os.path.join(data, "hf_llama"), ["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"],
        0.1)
    run(os.path.join(data, "hf_qwen2"), ["q_proj", "k_proj", "v_proj", "gate_proj"], 0.0)


if __name__ == "__main__":
    main()
