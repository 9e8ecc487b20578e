"""Writes tests/data/hf_gpt2/finetuned_golden.json: the eval loss PyTorch computes with the models
crosstrain fine-tuned from tests/data/hf_gpt2 -- the full fine-tune's output folder, the LoRA run's
adapters merged by `crosstrain merge-lora`, and the same adapters applied unmerged to the base
the way PEFT defines them. tests/train/hf_finetune_test.cpp repeats the runs and checks that
crosstrain's eval of its outputs gives these losses.

Regenerate after a build (Debian's python3-torch):
    /usr/bin/python3 scripts/make_finetuned_golden.py [path/to/crosstrain]

PyTorch here is scripts/torch_gpt2.py (written against the GPT-2 paper and transformers' layout,
sharing no code with crosstrain); it reads each output folder's config.json and the
safetensors files with its own reader. The runs' settings are recorded in the JSON under their
TrainArgs names (the command line is the same names with dashes).
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_hf_golden as hg  # noqa: E402
import torch_gpt2 as tg  # noqa: E402

OUT = os.path.join(hg.OUT, "finetuned_golden.json")
COMMON = {"per_device_train_batch_size": hg.B, "seed": hg.SEED, "lr_scheduler_type": "constant",
          "warmup_steps": 0, "weight_decay": hg.WEIGHT_DECAY, "max_grad_norm": hg.MAX_GRAD_NORM,
          "validation_split": hg.VAL_FRACTION}
FULL = dict(COMMON, max_steps=6, learning_rate=2e-3)
LORA = dict(COMMON, max_steps=6, learning_rate=5e-3, lora_r=4, lora_alpha=16,
            lora_target_modules="c_attn,c_proj", lora_dropout=0.1)


def run(binary, *args):
    cmd = [binary, *map(str, args)]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def train(binary, out_dir, settings):
    flags = []
    for k, v in settings.items():
        flags += ["--" + k.replace("_", "-"), v]
    run(binary, "train", "--model-name-or-path", hg.OUT, "--data", hg.TEXT, "--output-dir",
        out_dir, "--sample-tokens", 0, "--no-progress", *flags)


def load_folder(folder):
    """A GPT-2 built from the folder's config.json with its model.safetensors loaded."""
    with open(os.path.join(folder, "config.json")) as f:
        c = json.load(f)
    assert c["model_type"] == "gpt2", c["model_type"]
    cfg = tg.GPT2Config(n_layer=c["n_layer"], n_head=c["n_head"], n_embd=c["n_embd"],
                        block_size=c["n_positions"], vocab_size=c["vocab_size"])
    return tg.load_crosstrain_checkpoint(tg.GPT2(cfg), os.path.join(folder, "model.safetensors"))


def apply_adapters(model, folder):
    """PEFT's LoRA on GPT-2's Conv1D layers, unmerged: y = x W + b + (alpha/r) (x A^T) B^T."""
    with open(os.path.join(folder, "adapter_config.json")) as f:
        c = json.load(f)
    assert c["peft_type"] == "LORA" and c["fan_in_fan_out"] is True
    scaling = c["lora_alpha"] / c["r"]
    tensors, _ = tg.load_safetensors(os.path.join(folder, "adapter_model.safetensors"))
    prefix = "base_model.model.transformer."
    modules = sorted({n[len(prefix):n.index(".lora_")] for n in tensors})
    for module in modules:  # "h.0.attn.c_attn"
        a = torch.from_numpy(tensors[prefix + module + ".lora_A.weight"])
        b = torch.from_numpy(tensors[prefix + module + ".lora_B.weight"])
        _, l, part, name = module.split(".")
        layer = getattr(getattr(model.h[int(l)], part), name)
        base_forward = layer.forward

        def forward(x, base_forward=base_forward, a=a, b=b):
            return base_forward(x) + scaling * ((x @ a.t()) @ b.t())

        layer.forward = forward
    return model, modules


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else os.path.join(hg.ROOT, "build", "bin",
                                                                 "crosstrain")
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    tokens = np.frombuffer(open(hg.TEXT, "rb").read(), dtype=np.uint8).astype(np.int64)
    with tempfile.TemporaryDirectory() as tmp:
        full, lora, merged = (os.path.join(tmp, n) for n in ("full", "lora", "merged"))
        train(binary, full, FULL)
        train(binary, lora, LORA)
        run(binary, "merge-lora", "--model-name-or-path", hg.OUT, "--adapter", lora,
            "--output-dir", merged)
        base_loss = hg.eval_loss(load_folder(hg.OUT), tokens)
        full_loss = hg.eval_loss(load_folder(full), tokens)
        merged_loss = hg.eval_loss(load_folder(merged), tokens)
        adapted, modules = apply_adapters(load_folder(hg.OUT), lora)
        unmerged_loss = hg.eval_loss(adapted, tokens)
    assert full_loss < base_loss and merged_loss < base_loss, (base_loss, full_loss, merged_loss)
    assert abs(merged_loss - unmerged_loss) < 1e-5 * unmerged_loss, (merged_loss, unmerged_loss)
    golden = {"B": hg.B, "T": hg.T, "base_eval_loss": base_loss,
              "full": {"args": FULL, "torch_eval_loss": full_loss},
              "lora": {"args": LORA, "modules": modules, "torch_eval_loss_merged": merged_loss,
                       "torch_eval_loss_unmerged": unmerged_loss},
              "torch": torch.__version__}
    with open(OUT, "w") as f:
        json.dump(golden, f, indent=2)
        f.write("\n")
    print(json.dumps(golden))


if __name__ == "__main__":
    main()
