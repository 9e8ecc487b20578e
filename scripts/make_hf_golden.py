"""Writes tests/data/hf_gpt2/: a small GPT-2 saved by PyTorch in the layout `transformers`
writes, and what PyTorch computes with it -- the golden data of tests/train/hf_finetune_test.cpp,
which starts crosstrain from this folder (--model-name-or-path) and compares.

Regenerate (seconds on a CPU; Debian's python3-torch, as `bash scripts/setup.sh --torch`
installs):
    /usr/bin/python3 scripts/make_hf_golden.py

The folder:
  config.json        as transformers' GPT2Config.save_pretrained writes it (dropout 0.1, bos/eos
                     50256 -- outside this 256-token vocabulary, as transformers leaves them)
  model.safetensors  GPT2LMHeadModel names: "transformer." prefix, the tied "lm_head.weight"
                     stored too, and the causal-mask buffers older transformers saved
  golden.json        eval_loss of the model on tests/data/text/harbour.txt (consecutive
                     windows of T, as `crosstrain eval`); the training loss of each of STEPS
                     AdamW steps on crosstrain's batches (BatchLoader: Philox start positions,
                     first 90 % of the tokens), constant lr, clipping at 1.0, weight decay 0.1
                     on matrices and embeddings; and the eval loss after them.
The weights are drawn with torch's generator (not crosstrain's Philox init): the model is
PyTorch's from the first byte. PyTorch runs without dropout (crosstrain has none).
"""
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt2 as tg  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "hf_gpt2")
TEXT = os.path.join(ROOT, "tests", "data", "text", "harbour.txt")
CFG = tg.GPT2Config(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=256)
B, T, STEPS, SEED = 4, 32, 4, 42
LR, WEIGHT_DECAY, MAX_GRAD_NORM, VAL_FRACTION = 1e-3, 0.1, 1.0, 0.1
DATA_STREAM = 0x44415441_00000001  # core/data/batch_loader.h kBatchLoaderStream


def hf_config():
    return {
        "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
        "attn_pdrop": 0.1, "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256,
        "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
        "n_ctx": CFG.block_size, "n_embd": CFG.n_embd, "n_head": CFG.n_head, "n_inner": None,
        "n_layer": CFG.n_layer, "n_positions": CFG.block_size, "reorder_and_upcast_attn": False,
        "resid_pdrop": 0.1, "scale_attn_by_inverse_layer_idx": False, "scale_attn_weights": True,
        "summary_activation": None, "summary_first_dropout": 0.1, "summary_proj_to_labels": True,
        "summary_type": "cls_index", "summary_use_proj": True, "torch_dtype": "float32",
        "transformers_version": "4.46.3", "use_cache": True, "vocab_size": CFG.vocab_size,
    }


def eval_loss(model, tokens):
    """Mean loss over consecutive windows (crosstrain's evaluate: every window weighted by T)."""
    n = (len(tokens) - 1) // T
    x = torch.from_numpy(tokens[:n * T].reshape(n, T).copy())
    y = torch.from_numpy(tokens[1:n * T + 1].reshape(n, T).copy())
    with torch.no_grad():
        losses = [model(x[i:i + B], y[i:i + B])[1].item() * len(x[i:i + B])
                  for i in range(0, n, B)]
    return float(np.sum(losses) / n)


def batch(train, k):
    """crosstrain's BatchLoader::make_batch(k)."""
    words = tg.philox_blocks(SEED, DATA_STREAM, k * B, B)
    starts = len(train) - T
    rows = []
    for b in range(B):
        x = int(words[b, 0]) | int(words[b, 1]) << 32
        s = (x * starts) >> 64
        rows.append(train[s:s + T + 1])
    rows = np.stack(rows)
    return torch.from_numpy(rows[:, :T].copy()), torch.from_numpy(rows[:, 1:].copy())


def main():
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    torch.manual_seed(1234)
    model = tg.GPT2(CFG)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, 0.01)  # non-zero, so a bias that is not loaded shows
            elif "ln_" in name:
                p.normal_(1.0, 0.05)
            else:
                p.normal_(0.0, 0.02)
    os.makedirs(OUT, exist_ok=True)
    tensors = {}
    for name, p in model.named_parameters():
        tensors["transformer." + name] = p.detach().numpy().astype(np.float32)
    mask = np.tril(np.ones((CFG.block_size, CFG.block_size), np.float32))[None, None]
    for l in range(CFG.n_layer):
        tensors[f"transformer.h.{l}.attn.bias"] = mask
        tensors[f"transformer.h.{l}.attn.masked_bias"] = np.array(-1e4, np.float32)
    tensors["lm_head.weight"] = tensors["transformer.wte.weight"]
    tg.save_safetensors(os.path.join(OUT, "model.safetensors"), tensors, {"format": "pt"})
    with open(os.path.join(OUT, "config.json"), "w") as f:
        json.dump(hf_config(), f, indent=2, sort_keys=True)
        f.write("\n")

    tokens = np.frombuffer(open(TEXT, "rb").read(), dtype=np.uint8).astype(np.int64)
    before = eval_loss(model, tokens)
    n_val = int(round(len(tokens) * VAL_FRACTION))
    train = tokens[:len(tokens) - n_val]
    opt = torch.optim.AdamW(model.param_groups(WEIGHT_DECAY), lr=LR, betas=(0.9, 0.999),
                            eps=1e-8)
    losses = []
    for k in range(STEPS):
        opt.zero_grad(set_to_none=False)
        x, y = batch(train, k)
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        opt.step()
        losses.append(loss.item())
    after = eval_loss(model, tokens)
    golden = {"eval_loss": before, "train_losses": losses, "eval_loss_after": after,
              "B": B, "T": T, "steps": STEPS, "seed": SEED, "learning_rate": LR,
              "weight_decay": WEIGHT_DECAY, "max_grad_norm": MAX_GRAD_NORM,
              "validation_split": VAL_FRACTION, "torch": torch.__version__}
    with open(os.path.join(OUT, "golden.json"), "w") as f:
        json.dump(golden, f, indent=2)
        f.write("\n")
    print(json.dumps(golden))


if __name__ == "__main__":
    main()
