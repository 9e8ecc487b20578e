"""Writes tests/data/hf_llama/ and tests/data/hf_qwen2/: a small Llama and a small Qwen2 saved by
Hugging Face transformers itself (save_pretrained, safetensors) and what transformers computes
with them -- the golden data of tests/train/hf_llama_test.cpp, which starts crosstrain from
these folders (--model-name-or-path), evaluates and fine-tunes them, and compares.

Regenerate (seconds on a CPU; transformers 4.44 runs on Debian's torch 1.13):
    /usr/bin/python3 -m venv --system-site-packages /tmp/hf
    /tmp/hf/bin/pip install transformers==4.44.2
    /tmp/hf/bin/python scripts/make_hf_llama_golden.py

Each folder: config.json and model.safetensors as save_pretrained writes them (grouped-query
attention 4 heads / 2 KV heads; hf_llama: untied head, rope_theta 10000; hf_qwen2: q/k/v biases,
tied head, rope_theta 1e6; weights drawn by torch's generator -- norms around 1, not 1, biases
non-zero -- so nothing depends on crosstrain's init), and
golden.json: the eval loss on tests/data/text/harbour.txt (consecutive windows of T, as
`crosstrain eval`), the training loss of each of STEPS AdamW steps on crosstrain's batches
(BatchLoader: Philox start positions, first 90 % of the tokens; constant lr, clipping at 1.0,
weight decay 0.1 on matrices and embeddings), and the eval loss after them.
"""
import json
import os
import sys

import numpy as np
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_hf_golden as hg  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B, T, STEPS, SEED = hg.B, hg.T, hg.STEPS, hg.SEED


def eval_loss(model, tokens):
    n = (len(tokens) - 1) // T
    x = torch.from_numpy(tokens[:n * T].reshape(n, T).copy())
    y = torch.from_numpy(tokens[1:n * T + 1].reshape(n, T).copy())
    total = 0.0
    with torch.no_grad():
        for i in range(0, n, B):
            logits = model(input_ids=x[i:i + B]).logits
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     y[i:i + B].reshape(-1))
            total += loss.item() * len(x[i:i + B])
    return total / n


def make(out, model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.05)  # not all ones, so a norm that is not loaded shows
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.02)  # non-zero, so a bias that is not loaded shows
    model.save_pretrained(out, safe_serialization=True)

    tokens = np.frombuffer(open(hg.TEXT, "rb").read(), dtype=np.uint8).astype(np.int64)
    before = eval_loss(model, tokens)
    n_val = int(round(len(tokens) * hg.VAL_FRACTION))
    train = tokens[:len(tokens) - n_val]
    named = dict(model.named_parameters())
    decay = [p for n, p in named.items() if "norm" not in n and not n.endswith(".bias")]
    no_decay = [p for n, p in named.items() if "norm" in n or n.endswith(".bias")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": hg.WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}], lr=hg.LR,
                            betas=(0.9, 0.999), eps=1e-8)
    losses = []
    for k in range(STEPS):
        opt.zero_grad(set_to_none=False)
        x, y = hg.batch(train, k)
        logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), hg.MAX_GRAD_NORM)
        opt.step()
        losses.append(loss.item())
    after = eval_loss(model, tokens)
    golden = {"eval_loss": before, "train_losses": losses, "eval_loss_after": after,
              "B": B, "T": T, "steps": STEPS, "seed": SEED, "learning_rate": hg.LR,
              "weight_decay": hg.WEIGHT_DECAY, "max_grad_norm": hg.MAX_GRAD_NORM,
              "validation_split": hg.VAL_FRACTION, "torch": torch.__version__,
              "transformers": transformers.__version__}
    with open(os.path.join(out, "golden.json"), "w") as f:
        json.dump(golden, f, indent=2)
        f.write("\n")
    print(out, json.dumps(golden))


def main():
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    shape = dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                 vocab_size=256, rms_norm_eps=1e-5, bos_token_id=None, eos_token_id=None,
                 attn_implementation="eager")
    torch.manual_seed(1234)
    make(os.path.join(ROOT, "tests", "data", "hf_llama"),
         LlamaForCausalLM(LlamaConfig(rope_theta=10000.0, tie_word_embeddings=False, **shape)))
    torch.manual_seed(1235)
    make(os.path.join(ROOT, "tests", "data", "hf_qwen2"),
         Qwen2ForCausalLM(Qwen2Config(rope_theta=1000000.0, tie_word_embeddings=True,
                                      use_sliding_window=False, **shape)))


if __name__ == "__main__":
    main()
