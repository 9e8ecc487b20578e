"""Writes tests/data/golden/tiny_golden.safetensors, the PyTorch golden state that
tests/model/gpt2_golden_test.cpp checks crosstrain's GPT-2 against.

Regenerate (a few seconds on a CPU):
    /usr/bin/python3 scripts/make_golden.py            # from the repository root
    /usr/bin/python3 scripts/make_golden.py --out other.safetensors

What it holds (all F32 or I32; the tiny preset at seed 42, crosstrain's Philox init):
  tokens, targets           [B,T] i32: bytes of a fixed English text, targets shifted by one
  sample_index              [S] i32: strided indices into the flat parameter buffer (table order),
                            ~256 per tensor; sample_tensor [S] i32: the tensor each belongs to
  init_sum                  [P] per-tensor sum of the initial weights (computed in float64)
  init_sample               [S] initial weights at sample_index
  logits                    [B,T,V] float32 forward
  loss                      [1] float32;  loss_f64 [1]: the same in float64 (rounded to f32)
  grad_norm                 [P] per-tensor L2 norm of the float32 gradients (norm in float64)
  grad_norm_f64             [P] the same from a float64 forward/backward
  grad_sample               [S] float32 gradients at sample_index
  adamw_losses              [5] loss before each of 5 AdamW steps (lr 1e-3, betas 0.9/0.999,
                            eps 1e-8, weight decay 0.1 on the decay group, 0 on the rest, global
                            grad-norm clipping at 1.0 like torch.nn.utils.clip_grad_norm_);
                            the first is `loss`.  adamw_losses_f64 [5]: the same run in float64
  adamw_grad_norms          [5] the global gradient norm before clipping, each step
  final_sample              [S] weights after the 5 steps, at sample_index
The metadata holds the config, seed, tensor names (table order) and the text.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt2 as tg  # noqa: E402

TEXT = ("It was the best of times, it was the worst of times, it was the age of wisdom, it was "
        "the age of foolishness, it was the epoch of belief, it was the epoch of incredulity, it "
        "was the season of Light, it was the season of Darkness.")
SEED = 42
B, T = 2, 64
STEPS = 5
ADAMW = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
WEIGHT_DECAY = 0.1
MAX_GRAD_NORM = 1.0
SAMPLES_PER_TENSOR = 256


def sample_indices(table):
    """Strided sample of each tensor (~SAMPLES_PER_TENSOR, first and spread to the end)."""
    idx, owner, offset = [], [], 0
    for k, (_, shape, _) in enumerate(table):
        n = int(np.prod(shape))
        stride = max(1, -(-n // SAMPLES_PER_TENSOR))  # ceil
        local = np.arange(0, n, stride)
        idx.append(offset + local)
        owner.append(np.full(len(local), k))
        offset += n
    return np.concatenate(idx).astype(np.int32), np.concatenate(owner).astype(np.int32)


def train_run(cfg, dtype, tokens, targets):
    """Init, forward/backward, then STEPS AdamW steps; returns a dict of numpy results."""
    torch.manual_seed(0)  # nothing random is used; fixed anyway
    model = tg.GPT2(cfg)
    tg.philox_init(model, SEED)
    model = model.to(dtype)  # float64: exactly the float32 initial values, widened
    out = {"init": tg.flat_params(model)}
    groups = model.param_groups(WEIGHT_DECAY)
    opt = torch.optim.AdamW(groups, **ADAMW)
    losses, norms = [], []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=False)
        logits, loss = model(tokens, targets)
        loss.backward()
        if step == 0:
            out["logits"] = logits.detach().float().numpy()
            out["loss"] = loss.item()
            named = dict(model.named_parameters())
            out["grads"] = [named[n].grad.detach().double().clone().numpy().reshape(-1)
                            for n, _, _ in tg.param_table(cfg)]
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        losses.append(loss.item())
        norms.append(norm.item())
        opt.step()
    out["losses"] = np.array(losses)
    out["norms"] = np.array(norms)
    out["final"] = tg.flat_params(model)
    return out


def golden_tensors(table, r32, r64, tokens, targets):
    """The golden file's tensors from a float32 and a float64 train_run (see the docstring)."""
    sidx, sowner = sample_indices(table)
    sizes = [int(np.prod(s)) for _, s, _ in table]
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    init = r32["init"]
    init_sum = [init[offsets[k]:offsets[k + 1]].astype(np.float64).sum() for k in range(len(table))]
    grad_flat = np.concatenate(r32["grads"])
    grad_norm = [np.sqrt((g * g).sum()) for g in r32["grads"]]
    grad_norm64 = [np.sqrt((g * g).sum()) for g in r64["grads"]]

    f32 = lambda x: np.asarray(x, dtype=np.float32)  # noqa: E731
    tensors = {
        "tokens": tokens.numpy().astype(np.int32),
        "targets": targets.numpy().astype(np.int32),
        "sample_index": sidx,
        "sample_tensor": sowner,
        "init_sum": f32(init_sum),
        "init_sample": f32(init[sidx]),
        "logits": f32(r32["logits"]),
        "loss": f32([r32["loss"]]),
        "loss_f64": f32([r64["loss"]]),
        "grad_norm": f32(grad_norm),
        "grad_norm_f64": f32(grad_norm64),
        "grad_sample": f32(grad_flat[sidx]),
        "adamw_losses": f32(r32["losses"]),
        "adamw_losses_f64": f32(r64["losses"]),
        "adamw_grad_norms": f32(r32["norms"]),
        "final_sample": f32(r32["final"][sidx]),
    }
    return tensors


def write_golden(path, tensors, metadata, r32, r64):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tg.save_safetensors(path, tensors, metadata)
    print(f"wrote {path} ({os.path.getsize(path)} bytes): loss {r32['loss']:.6f} "
          f"(f64 {r64['loss']:.6f}), adamw losses {np.round(r32['losses'], 6).tolist()}")
    print("max |loss32 - loss64| over steps:", np.abs(r32["losses"] - r64["losses"]).max())
    n32 = np.array([np.sqrt((g * g).sum()) for g in r32["grads"]])
    n64 = np.array([np.sqrt((g * g).sum()) for g in r64["grads"]])
    print("max rel grad-norm diff f32 vs f64:", (np.abs(n32 - n64) / n64).max())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--out", default=os.path.join(root, "tests/data/golden/tiny_golden.safetensors"))
    args = ap.parse_args()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

    cfg = tg.GPT2Config.preset("tiny")
    table = tg.param_table(cfg)
    data = np.frombuffer(TEXT.encode("ascii"), dtype=np.uint8).astype(np.int64)
    assert len(data) >= B * T + 1, len(data)
    tokens = torch.from_numpy(data[:B * T].reshape(B, T).copy())
    targets = torch.from_numpy(data[1:B * T + 1].reshape(B, T).copy())

    r32 = train_run(cfg, torch.float32, tokens, targets)
    r64 = train_run(cfg, torch.float64, tokens, targets)

    tensors = golden_tensors(table, r32, r64, tokens, targets)
    metadata = {
        "format": "crosstrain-golden-v1",
        "preset": "tiny",
        "config": json.dumps(cfg.__dict__),
        "seed": str(SEED),
        "batch": json.dumps([B, T]),
        "param_names": json.dumps([n for n, _, _ in table]),
        "adamw": json.dumps(dict(ADAMW, weight_decay=WEIGHT_DECAY, max_grad_norm=MAX_GRAD_NORM,
                                 steps=STEPS)),
        "text": TEXT,
        "torch": torch.__version__,
    }
    write_golden(args.out, tensors, metadata, r32, r64)

if __name__ == "__main__":
    main()
