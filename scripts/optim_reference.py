#!/usr/bin/python3
"""Independent references for crosstrain's optimizer ops, and the golden file they write.

    /usr/bin/python3 scripts/optim_reference.py [tests/data/optim/optim_golden.json]

AdamW and SGD come from PyTorch (torch.optim.AdamW / torch.optim.SGD, fp32). Lion, Adafactor
(Hugging Face transformers.optimization.Adafactor semantics) and the block-wise 8-bit AdamW with
bitsandbytes' dynamic code are written here in plain numpy from their papers' / libraries'
descriptions, state kept in fp32 between steps as the libraries do. Each case runs a few steps
on small tensors (odd sizes, a partial 8-bit block) and records every step's parameters and
state; tests/ops/optimizer_golden_test.cpp replays them on both CPU devices.
"""
import json
import math
import sys

import numpy as np
import torch

F32 = np.float32


# ---- the dynamic 8-bit code -------------------------------------------------------------------
def dynamic_map(signed):
    data = []
    for k in range(7):
        intervals = 2 ** k if signed else 2 ** (k + 1)
        scale = 10.0 ** (k - 6)
        for j in range(intervals):
            lo = 0.1 + 0.9 * j / intervals
            hi = 0.1 + 0.9 * (j + 1) / intervals
            mid = (lo + hi) / 2.0
            data.append(scale * mid)
            if signed:
                data.append(-scale * mid)
    data += [0.0, 1.0]
    assert len(data) == 256
    return np.sort(np.array(data, dtype=np.float64).astype(F32))


def nearest(code, x):
    """Index of the code value nearest to each x (lower index on a tie)."""
    hi = np.searchsorted(code, x, side="left")  # first code >= x
    hi = np.clip(hi, 1, 255)
    lo = hi - 1
    pick_lo = (x - code[lo]) <= (code[hi] - x)
    idx = np.where(pick_lo, lo, hi)
    idx = np.where(x <= code[0], 0, idx)
    idx = np.where(x > code[255], 255, idx)
    return idx.astype(np.uint8)


def clip_of(h, grad_norm):
    if h.get("max_grad_norm", 0) > 0:
        return min(1.0, float(F32(h["max_grad_norm"])) / (float(F32(grad_norm)) + 1e-6))
    return 1.0


# ---- numpy references ---------------------------------------------------------------------------
def lion_step(p, g, st, h, t, gn):
    g = g.astype(np.float64) * clip_of(h, gn)
    b1, b2, lr, wd = (float(F32(h[k])) for k in ("beta1", "beta2", "lr", "weight_decay"))
    m = st["m"].astype(np.float64)
    c = b1 * m + (1 - b1) * g
    p = p.astype(np.float64) * (1 - lr * wd) - lr * np.sign(c)
    st["m"] = (b2 * m + (1 - b2) * g).astype(F32)
    return p.astype(F32)


def adamw8_step(p, g, st, h, t, gn, qs, qu):
    g = g.astype(np.float64) * clip_of(h, gn)
    b1, b2, lr, wd, eps = (float(F32(h[k])) for k in ("beta1", "beta2", "lr", "weight_decay", "eps"))
    n = p.size
    blk = np.arange(n) // 256
    m = b1 * (qs[st["m_q"]].astype(np.float64) * st["m_absmax"][blk]) + (1 - b1) * g
    v = b2 * (qu[st["v_q"]].astype(np.float64) * st["v_absmax"][blk]) + (1 - b2) * g * g
    p = p.astype(np.float64)
    p = p - lr * wd * p
    p = p - lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
    m32, v32 = m.astype(F32), v.astype(F32)
    nb = (n + 255) // 256
    ma = np.array([np.abs(m32[b * 256:(b + 1) * 256]).max() for b in range(nb)], dtype=F32)
    va = np.array([v32[b * 256:(b + 1) * 256].max() for b in range(nb)], dtype=F32)
    xm = np.where(ma[blk] > 0, m32 / np.where(ma[blk] > 0, ma[blk], F32(1)), F32(0)).astype(F32)
    xv = np.where(va[blk] > 0, v32 / np.where(va[blk] > 0, va[blk], F32(1)), F32(0)).astype(F32)
    st.update(m_q=nearest(qs, xm), v_q=nearest(qu, xv), m_absmax=ma, v_absmax=va)
    return p.astype(F32)


def adafactor_step(p, g, st, h, t, gn):
    """transformers.optimization.Adafactor.step for one tensor, fp32 state."""
    g = g.astype(np.float64) * clip_of(h, gn)
    p64 = p.astype(np.float64)
    rms = lambda x: math.sqrt(float(np.mean(x * x)))
    rho = float(F32(h["lr"]))
    if h["relative_step"]:
        rho = min(1e-6 * t if h["warmup_init"] else 1e-2, 1.0 / math.sqrt(t))
    scale = max(float(F32(h["eps2"])), rms(p64)) if h["scale_parameter"] else 1.0
    lr_t = rho * scale
    b2t = 1.0 - t ** float(F32(h["decay_rate"]))
    u = g * g + float(F32(h["eps1"]))
    if p.ndim >= 2:
        row = (b2t * st["row"] + (1 - b2t) * u.mean(axis=-1)).astype(F32)
        col = (b2t * st["col"] + (1 - b2t) * u.mean(axis=-2)).astype(F32)
        st["row"], st["col"] = row, col
        r = row.astype(np.float64)
        upd = g / np.sqrt(r / r.mean())[:, None] / np.sqrt(col.astype(np.float64))[None, :]
    else:
        st["v"] = (b2t * st["v"] + (1 - b2t) * u).astype(F32)
        upd = g / np.sqrt(st["v"].astype(np.float64))
    upd = upd / max(1.0, rms(upd) / float(F32(h["clip_threshold"])))
    upd = upd * lr_t
    b1 = float(F32(h["beta1"]))
    if b1 > 0:
        upd = b1 * st["exp_avg"] + (1 - b1) * upd
        st["exp_avg"] = upd.astype(F32)
    p64 = p64 - float(F32(h["weight_decay"])) * lr_t * p64
    return (p64 - upd).astype(F32)


# ---- PyTorch references -------------------------------------------------------------------------
def torch_run(kind, p0, grads, h, gn):
    p = torch.nn.Parameter(torch.tensor(p0))
    if kind == "adamw":
        opt = torch.optim.AdamW([p], lr=h["lr"], betas=(h["beta1"], h["beta2"]), eps=h["eps"],
                                weight_decay=h["weight_decay"])
    else:
        opt = torch.optim.SGD([p], lr=h["lr"], momentum=h["momentum"], dampening=h["dampening"],
                              weight_decay=h["weight_decay"], nesterov=h["nesterov"])
    out = []
    for g in grads:
        p.grad = torch.tensor(g) * clip_of(h, gn)
        opt.step()
        s = opt.state[p]
        state = {}
        if kind == "adamw":
            state = {"m": s["exp_avg"].numpy().copy(), "v": s["exp_avg_sq"].numpy().copy()}
        elif h["momentum"] != 0:
            state = {"buf": s["momentum_buffer"].numpy().copy()}
        out.append((p.detach().numpy().copy(), state))
    return out


def numpy_run(kind, p0, grads, h, gn, qs, qu):
    p = p0.copy()
    n = p.size
    if kind == "lion":
        st = {"m": np.zeros_like(p)}
    elif kind == "adamw_8bit":
        nb = (n + 255) // 256
        st = {"m_q": np.full(n, int(np.searchsorted(qs, 0.0)), np.uint8),
              "v_q": np.zeros(n, np.uint8), "m_absmax": np.zeros(nb, F32),
              "v_absmax": np.zeros(nb, F32)}
    else:
        st = {"row": np.zeros(p.shape[0], F32), "col": np.zeros(p.shape[-1], F32)} if p.ndim >= 2 \
            else {"v": np.zeros_like(p)}
        if h["beta1"] > 0:
            st["exp_avg"] = np.zeros_like(p)
    out = []
    for t, g in enumerate(grads, start=1):
        if kind == "lion":
            p = lion_step(p, g, st, h, t, gn)
        elif kind == "adamw_8bit":
            p = adamw8_step(p.reshape(-1), g.reshape(-1), st, h, t, gn, qs, qu).reshape(p.shape)
        else:
            p = adafactor_step(p, g, st, h, t, gn)
        out.append((p.copy(), {k: v.copy() for k, v in st.items()}))
    return out


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "tests/data/optim/optim_golden.json"
    qs, qu = dynamic_map(True), dynamic_map(False)
    rng = np.random.default_rng(1234)
    adamw_h = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1, max_grad_norm=0)
    cases = [
        ("adamw", [7, 5], adamw_h),
        ("adamw", [33], dict(adamw_h, beta2=0.95, max_grad_norm=1.0)),
        ("sgd", [7, 5], dict(lr=0.05, momentum=0.9, dampening=0.0, weight_decay=0.01, nesterov=True,
                             max_grad_norm=0)),
        ("sgd", [33], dict(lr=0.05, momentum=0.8, dampening=0.1, weight_decay=0.0, nesterov=False,
                           max_grad_norm=1.0)),
        ("sgd", [9], dict(lr=0.1, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False,
                          max_grad_norm=0)),
        ("lion", [7, 5], dict(lr=1e-3, beta1=0.9, beta2=0.99, weight_decay=0.1, max_grad_norm=1.0)),
        ("adamw_8bit", [5, 120], dict(adamw_h, lr=1e-3)),
        ("adamw_8bit", [1000], dict(adamw_h, lr=1e-3, weight_decay=0.0, max_grad_norm=1.0)),
    ]
    af = dict(lr=1e-2, eps1=1e-30, eps2=1e-3, clip_threshold=1.0, decay_rate=-0.8, beta1=0.0,
              weight_decay=0.0, relative_step=False, scale_parameter=False, warmup_init=False,
              max_grad_norm=0)
    cases += [
        ("adafactor", [7, 5], dict(af, relative_step=True, scale_parameter=True)),
        ("adafactor", [33], dict(af, relative_step=True, scale_parameter=True, warmup_init=True)),
        ("adafactor", [6, 9], dict(af, beta1=0.9, weight_decay=0.1, max_grad_norm=1.0)),
        ("adafactor", [11], dict(af, beta1=0.9, weight_decay=0.1, clip_threshold=0.5)),
    ]
    steps, gn = 4, 3.0
    out = {"qmap_signed": [float(x) for x in qs], "qmap_unsigned": [float(x) for x in qu],
           "cases": []}
    for kind, shape, h in cases:
        p0 = rng.standard_normal(shape).astype(F32)
        grads = [(rng.standard_normal(shape) * 0.5).astype(F32) for _ in range(steps)]
        run = torch_run(kind, p0, grads, h, gn) if kind in ("adamw", "sgd") else \
            numpy_run(kind, p0, grads, h, gn, qs, qu)
        out["cases"].append({
            "op": kind, "shape": shape, "hyper": h, "grad_norm": gn,
            "param0": p0.reshape(-1).tolist(), "grads": [g.reshape(-1).tolist() for g in grads],
            "steps": [{"param": p.reshape(-1).tolist(),
                       "state": {k: np.asarray(v).reshape(-1).tolist() for k, v in st.items()}}
                      for p, st in run]})
    with open(path, "w") as f:
        json.dump(out, f)
    print(f"wrote {path}: {len(out['cases'])} cases x {steps} steps")


if __name__ == "__main__":
    main()
