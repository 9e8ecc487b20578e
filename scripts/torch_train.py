"""Trains scripts/torch_gpt2.py's GPT-2 in plain PyTorch (fp32, CPU) the way `crosstrain train`
does, and reports per-step throughput: the PyTorch side of bench/train_bench.py (CPU) and of
scripts/gpu-check.sh (--device cuda).

Same model layout as crosstrain (torch_gpt2.GPT2), same data (crosstrain's default: the
byte-tokenised Debian fortunes folder, files read in crosstrain's order, the first 90 % for
training), same step: forward, mean cross-entropy, backward, global-norm clip at 1.0, AdamW with
crosstrain's two parameter groups (weight decay 0.1 on matrices and embeddings), and the loss read
back to the host every step (crosstrain logs every step in the benchmark, which syncs too).

    /usr/bin/python3 scripts/torch_train.py --model tiny --batch 4 --steps 12 --threads 2 \
        [--json out.json] [--philox-init]

On a GPU (scripts/gpu-check.sh), the fast PyTorch setup beside crosstrain: --device cuda --sdpa
(F.scaled_dot_product_attention) --fused-adamw [--tf32 | --bf16] [--compile].

The Llama-family presets (llama-tiny, smollm-135m: core/model/llama_config.cpp) run Hugging Face
transformers' LlamaForCausalLM instead (attention "sdpa" where the torch has
scaled_dot_product_attention, else "eager"); that needs transformers beside torch, e.g. a venv
with --system-site-packages and `pip install transformers==4.44.2` for Debian's torch 1.13.

--time-limit SECONDS (0: none) is the run's wall-time budget, counted from the script's start
(importing torch and building the model included): the run stops after the step that crosses it
and says so ("stopped_early" in the JSON). `crosstrain bench --report` gives it its
--peer-time-limit.

Prints one line per step and, with --json, writes {"steps": [{"step", "seconds", "tokens",
"tokens_per_s", "loss"}, ...], "steps_requested", "time_limit_s", "stopped_early", ...}.
Initialisation defaults to torch's normal(0, 0.02) (the speed does not depend on the values);
--philox-init reproduces crosstrain's exact weights (slow in numpy for the 124M model). Run with
/usr/bin/python3 (Debian's python3-torch).
"""
import argparse
import json
import math
import os
import resource
import sys
import time

START = time.monotonic()  # --time-limit counts from here: importing torch takes seconds

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt2  # noqa: E402

DEFAULT_DATA = "/usr/share/games/fortunes"


def load_text(path):
    """Bytes of a file, or of a folder like core/data/text_dataset.cpp's load_folder: regular
    non-hidden files (recursively, sorted by path), skipping *.dat, symlinks, empty files and
    files with NUL bytes, each ended with a newline."""
    if os.path.isfile(path):
        with open(path, "rb") as f:
            return f.read()
    files = []
    for root, dirs, names in os.walk(path):
        dirs[:] = [d for d in dirs if not d.startswith(".")
                   and not os.path.islink(os.path.join(root, d))]
        for n in names:
            p = os.path.join(root, n)
            if n.startswith(".") or n.endswith(".dat") or os.path.islink(p) or not os.path.isfile(p):
                continue
            files.append(p)
    out = bytearray()
    for p in sorted(files):
        with open(p, "rb") as f:
            t = f.read()
        if not t or b"\0" in t:
            continue
        out += t
        if not t.endswith(b"\n"):
            out += b"\n"
    return bytes(out)


# crosstrain's Llama-family presets, as transformers LlamaConfig arguments.
LLAMA_PRESETS = {
    "llama-tiny": dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=6,
                       num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256,
                       vocab_size=256, tie_word_embeddings=False),
    "smollm-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                        num_attention_heads=9, num_key_value_heads=3,
                        max_position_embeddings=2048, vocab_size=49152,
                        tie_word_embeddings=True),
}


def make_llama(name):
    from transformers import LlamaConfig, LlamaForCausalLM
    attn = "sdpa" if hasattr(F, "scaled_dot_product_attention") else "eager"
    cfg = LlamaConfig(rms_norm_eps=1e-5, rope_theta=10000.0, attention_bias=False,
                      bos_token_id=None, eos_token_id=None, attn_implementation=attn,
                      **LLAMA_PRESETS[name])
    return LlamaForCausalLM(cfg)


def llama_param_groups(model, weight_decay):
    """crosstrain's groups: weight decay on matrices and the embedding, not on norms/biases."""
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": rest, "weight_decay": 0.0}]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--block-size", type=int, default=0, help="sequence length (0: the preset's)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data", default=DEFAULT_DATA)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--max-grad-norm", type=float, default=1.0)
    ap.add_argument("--philox-init", action="store_true")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast (torch.autocast('cpu'))")
    ap.add_argument("--json", default="")
    ap.add_argument("--device", default="cpu",
                    help="cpu, or cuda (NVIDIA, and AMD through ROCm builds of PyTorch)")
    ap.add_argument("--sdpa", action="store_true",
                    help="GPT-2 attention through F.scaled_dot_product_attention (torch >= 2.0)")
    ap.add_argument("--fused-adamw", action="store_true",
                    help="torch.optim.AdamW(fused=True) (one kernel per step on a GPU)")
    ap.add_argument("--tf32", action="store_true", help="TF32 matmuls (CUDA)")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the model (the first steps include the compilation)")
    ap.add_argument("--time-limit", type=float, default=0.0,
                    help="seconds from the start: stop after the step that crosses it (0: none)")
    args = ap.parse_args()
    dev = torch.device(args.device)

    torch.set_num_threads(args.threads)
    if args.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(args.seed)
    llama = args.model in LLAMA_PRESETS
    cfg = None if llama else torch_gpt2.GPT2Config.preset(args.model)
    B, T = args.batch, (args.block_size or (LLAMA_PRESETS[args.model]["max_position_embeddings"]
                                            if llama else cfg.block_size))

    data = np.frombuffer(load_text(args.data), dtype=np.uint8).astype(np.int64)
    train = torch.from_numpy(data[: len(data) - int(round(len(data) * 0.1))])

    if llama:
        model = make_llama(args.model)
    else:
        model = torch_gpt2.GPT2(cfg)
    if llama:
        pass  # transformers' own init: normal(0, 0.02), norms 1
    elif args.philox_init:
        torch_gpt2.philox_init(model, args.seed)
    else:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, 0.02)
                elif ".ln_" in name or name.startswith("ln_f"):
                    p.fill_(1.0 if name.endswith(".weight") else 0.0)
                else:
                    p.zero_()
    if args.sdpa and not llama:
        for m in model.modules():
            if isinstance(m, torch_gpt2.Attention):
                m.sdpa = True
    model.to(dev)
    model.train()
    groups = llama_param_groups(model, args.weight_decay) if llama else \
        model.param_groups(args.weight_decay)
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.999), eps=1e-8,
                            **({"fused": True} if args.fused_adamw else {}))
    n_params = sum(p.numel() for p in model.parameters())
    step_model = torch.compile(model) if args.compile else model
    attention = f", attention {model.config._attn_implementation}" if llama else \
        (", attention sdpa" if args.sdpa else "")
    options = "".join(f", {o}" for o, on in (("tf32", args.tf32), ("bf16 autocast", args.bf16),
                                              ("fused AdamW", args.fused_adamw),
                                              ("torch.compile", args.compile)) if on)
    print(f"torch {torch.__version__}: {args.model} ({n_params:,} parameters{attention}), "
          f"batch {B} x {T}, {args.threads} threads, {args.steps} steps on {dev}{options}", flush=True)

    gen = torch.Generator().manual_seed(args.seed)
    records = []
    stopped_early = False
    for step in range(1, args.steps + 1):
        starts = torch.randint(0, len(train) - T - 1, (B,), generator=gen)
        idx = starts[:, None] + torch.arange(T + 1)[None, :]
        window = train[idx]
        x, y = window[:, :-1].contiguous().to(dev), window[:, 1:].contiguous().to(dev)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=args.bf16):
            if llama:
                logits = step_model(input_ids=x, use_cache=False).logits
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))
            else:
                _, loss = step_model(x, y)
        loss.backward()
        if args.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        opt.step()
        loss_value = loss.item()  # waits for the device
        dt = time.perf_counter() - t0
        if not math.isfinite(loss_value):
            raise SystemExit(f"loss is {loss_value} at step {step}")
        rec = {"step": step, "seconds": dt, "tokens": B * T, "tokens_per_s": B * T / dt,
               "loss": loss_value}
        records.append(rec)
        print(f"step {step:4d}/{args.steps}  loss {loss_value:.4f}  {dt * 1e3:8.1f} ms  "
              f"{B * T / dt:10.1f} tok/s", flush=True)
        elapsed = time.monotonic() - START
        if args.time_limit > 0 and elapsed > args.time_limit and step < args.steps:
            stopped_early = True
            print(f"stopped after step {step} of {args.steps}: {elapsed:.1f} s, past the time "
                  f"limit of {args.time_limit:g} s", flush=True)
            break
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"peak RSS {peak / 2**30:.2f} GiB", flush=True)
    # The GPU's peak: what PyTorch's caching allocator handed out (the tensors), as crosstrain's
    # device accounting counts its own; None on the CPU.
    peak_dev = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None
    if peak_dev is not None:
        print(f"peak device memory {peak_dev / 2**30:.2f} GiB (max_memory_allocated)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "device": str(dev), "batch": B, "block_size": T,
                       "threads": args.threads, "torch": torch.__version__,
                       "sdpa": args.sdpa, "fused_adamw": args.fused_adamw, "tf32": args.tf32,
                       "bf16": args.bf16, "compile": args.compile,
                       "num_parameters": n_params,
                       "peak_rss_bytes": peak, "peak_device_bytes": peak_dev,
                       "steps_requested": args.steps, "time_limit_s": args.time_limit,
                       "stopped_early": stopped_early, "steps": records}, f, indent=1)


if __name__ == "__main__":
    main()
