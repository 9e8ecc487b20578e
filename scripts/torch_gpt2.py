"""A plain-PyTorch GPT-2 with crosstrain's parameter names, layout and initialisation.

- Parameter names and shapes are Hugging Face's GPT2Model ones (no "transformer." prefix):
  wte.weight [V,C], wpe.weight [block,C], h.{i}.ln_1.*, h.{i}.attn.c_attn.weight [C,3C] (Conv1D
  layout [in,out]), ..., ln_f.*; the LM head is tied to wte; GELU is the tanh form; eps 1e-5.
- `param_table(cfg)` lists the tensors in crosstrain's flat-buffer order (decayed group first);
  `philox_init(model, seed)` reproduces GPT2::init (core/model/gpt2.cpp) from the same
  Philox4x32-10 stream (core/philox.h): identical uniform bits, Box-Muller in float32.
- `load_safetensors` / `save_safetensors` read and write safetensors files by hand (no package).

Used by scripts/make_golden.py (the golden test) and by the benchmarks (the same model trained in
PyTorch). Needs only torch and numpy; run with /usr/bin/python3 (Debian's python3-torch).
"""
import json
import math
import struct
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


# ---------------------------------------------------------------------------------------------
# Config


@dataclass
class GPT2Config:
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    block_size: int = 1024
    vocab_size: int = 50257
    layer_norm_epsilon: float = 1e-5

    @staticmethod
    def preset(name):
        presets = {
            "tiny": GPT2Config(6, 6, 384, 256, 256),
            "gpt2": GPT2Config(12, 12, 768, 1024, 50257),
            "gpt2-medium": GPT2Config(24, 16, 1024, 1024, 50257),
        }
        if name not in presets:
            raise ValueError(f"unknown model preset '{name}' (presets: {', '.join(presets)})")
        return presets[name]

    @staticmethod
    def from_hf_json(j):
        return GPT2Config(j["n_layer"], j["n_head"], j["n_embd"], j["n_positions"],
                          j["vocab_size"], j.get("layer_norm_epsilon", 1e-5))


# ---------------------------------------------------------------------------------------------
# Model


class Conv1D(nn.Module):
    """HF's Conv1D: y = x @ weight + bias with weight stored [in, out]."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        # x is (B,T,in)
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(
            *x.shape[:-1], self.weight.shape[1])


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = Conv1D(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = Conv1D(cfg.n_embd, cfg.n_embd)
        # True: F.scaled_dot_product_attention (torch >= 2.0) instead of the explicit softmax;
        # the same function, set by scripts/torch_train.py --sdpa.
        self.sdpa = False

    def forward(self, x):
        # x is (B,T,C)
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B,NH,T,hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        if self.sdpa:  # PyTorch's fused kernel (flash / memory-efficient on a GPU)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B,NH,T,T)
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = att @ v
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = Conv1D(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = Conv1D(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.attn = Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.h = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)

    def forward(self, tokens, targets=None):
        """tokens, targets (B,T) int64. Returns logits (B,T,V) and the mean loss (or None)."""
        B, T = tokens.shape
        pos = torch.arange(T, device=tokens.device)
        x = self.wte(tokens) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied LM head
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1))
        return logits, loss

    def param_groups(self, weight_decay):
        """AdamW groups like crosstrain's (and HF Trainer's): decay matmul weights and
        embeddings, not biases or LayerNorm parameters."""
        named = dict(self.named_parameters())
        table = param_table(self.cfg)
        decay = [named[name] for name, _, d in table if d]
        rest = [named[name] for name, _, d in table if not d]
        return [{"params": decay, "weight_decay": weight_decay},
                {"params": rest, "weight_decay": 0.0}]


# ---------------------------------------------------------------------------------------------
# Parameter table: crosstrain's flat-buffer order (core/model/gpt2.cpp, gpt2_param_table)


def param_table(cfg):
    """[(name, shape, decay)] in flat order: the decayed group first, then the rest."""
    C, V = cfg.n_embd, cfg.vocab_size
    t = [("wte.weight", (V, C), True), ("wpe.weight", (cfg.block_size, C), True)]
    for l in range(cfg.n_layer):
        t += [(f"h.{l}.attn.c_attn.weight", (C, 3 * C), True),
              (f"h.{l}.attn.c_proj.weight", (C, C), True),
              (f"h.{l}.mlp.c_fc.weight", (C, 4 * C), True),
              (f"h.{l}.mlp.c_proj.weight", (4 * C, C), True)]
    for l in range(cfg.n_layer):
        t += [(f"h.{l}.ln_1.weight", (C,), False), (f"h.{l}.ln_1.bias", (C,), False),
              (f"h.{l}.attn.c_attn.bias", (3 * C,), False),
              (f"h.{l}.attn.c_proj.bias", (C,), False),
              (f"h.{l}.ln_2.weight", (C,), False), (f"h.{l}.ln_2.bias", (C,), False),
              (f"h.{l}.mlp.c_fc.bias", (4 * C,), False),
              (f"h.{l}.mlp.c_proj.bias", (C,), False)]
    t += [("ln_f.weight", (C,), False), ("ln_f.bias", (C,), False)]
    return t


# ---------------------------------------------------------------------------------------------
# Philox4x32-10 and the GPT-2 initialisation (core/philox.h)

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_MASK32 = np.uint64(0xFFFFFFFF)


def philox4x32(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 on uint32 counter arrays with a scalar key; returns four uint32 arrays."""
    c = [np.asarray(x, dtype=np.uint64) for x in (c0, c1, c2, c3)]
    k0, k1 = int(k0), int(k1)
    for _ in range(10):
        p0 = _M0 * c[0]
        p1 = _M1 * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ np.uint64(k0), p1 & _MASK32,
             (p0 >> np.uint64(32)) ^ c[3] ^ np.uint64(k1), p0 & _MASK32]
        k0 = (k0 + _W0) & 0xFFFFFFFF
        k1 = (k1 + _W1) & 0xFFFFFFFF
    return [x.astype(np.uint32) for x in c]


def philox_blocks(seed, stream, first_block, count):
    """Words of blocks [first_block, first_block+count) of stream `stream`: uint32 (count, 4)."""
    b = np.arange(first_block, first_block + count, dtype=np.uint64)
    words = philox4x32(b & _MASK32, b >> np.uint64(32),
                       np.full(count, stream & 0xFFFFFFFF, np.uint64),
                       np.full(count, stream >> 32, np.uint64),
                       seed & 0xFFFFFFFF, seed >> 32)
    return np.stack(words, axis=1)


def uint_to_unit_float(x):
    """(0,1) float32 from the top 24 bits, centred in the bucket (as core/philox.h)."""
    return ((x >> np.uint32(8)).astype(np.float32) + np.float32(0.5)) * np.float32(1.0 / 16777216.0)


def philox_uniform(seed, stream, n):
    words = philox_blocks(seed, stream, 0, (n + 3) // 4).reshape(-1)[:n]
    return uint_to_unit_float(words)


def philox_normal(seed, stream, n):
    """Elements [0,n) of Philox(seed, stream).normal(): Box-Muller in float32 over words (0,1)
    and (2,3) of block i//2. log and cos are evaluated in float64 and rounded to float32 (glibc's
    logf/cosf are within an ulp of that)."""
    nb = (n + 1) // 2
    w = philox_blocks(seed, stream, 0, nb)
    u = uint_to_unit_float(w)  # (nb, 4) float32
    u1 = u[:, [0, 2]].reshape(-1)[:n]
    u2 = u[:, [1, 3]].reshape(-1)[:n]
    log_u1 = np.log(u1.astype(np.float64)).astype(np.float32)
    r = np.sqrt(np.float32(-2.0) * log_u1)
    angle = np.float32(6.2831853071795864) * u2
    return r * np.cos(angle.astype(np.float64)).astype(np.float32)


def philox_init(model, seed):
    """GPT2::init: tensor k of param_table gets 0.02 * normal(seed, stream k) for matrices and
    embeddings (residual projections also / sqrt(2 n_layer)); biases 0; LayerNorm weights 1."""
    cfg = model.cfg
    named = dict(model.named_parameters())
    proj_scale = np.float32(1.0) / np.sqrt(np.float32(2.0 * cfg.n_layer))
    with torch.no_grad():
        for k, (name, shape, decay) in enumerate(param_table(cfg)):
            p = named[name]
            assert tuple(p.shape) == shape, (name, p.shape, shape)
            if decay:
                std = np.float32(0.02)
                if name.endswith("attn.c_proj.weight") or name.endswith("mlp.c_proj.weight"):
                    std = std * proj_scale
                values = std * philox_normal(seed, k, int(np.prod(shape)))
                p.copy_(torch.from_numpy(values.reshape(shape)))
            elif ".ln_" in name or name.startswith("ln_f"):
                p.fill_(1.0 if name.endswith(".weight") else 0.0)
            else:
                p.zero_()


def flat_params(model):
    """All parameters as one float32 numpy vector in crosstrain's flat order."""
    named = dict(model.named_parameters())
    return np.concatenate([named[n].detach().cpu().float().numpy().reshape(-1)
                           for n, _, _ in param_table(model.cfg)])


def flat_grads(model):
    named = dict(model.named_parameters())
    return np.concatenate([named[n].grad.detach().cpu().float().numpy().reshape(-1)
                           for n, _, _ in param_table(model.cfg)])


# ---------------------------------------------------------------------------------------------
# safetensors, by hand

_ST_DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I32": np.int32,
              "I64": np.int64, "U8": np.uint8, "I8": np.int8}
_ST_NAMES = {np.dtype(v): k for k, v in _ST_DTYPES.items()}


def load_safetensors(path):
    """{name: numpy array} and the metadata dict. BF16 is widened to float32."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = raw[8 + n:]
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        if info["dtype"] == "BF16":
            bits = np.frombuffer(data[b:e], dtype=np.uint16).astype(np.uint32) << 16
            arr = bits.view(np.float32)
        else:
            arr = np.frombuffer(data[b:e], dtype=_ST_DTYPES[info["dtype"]])
        out[name] = arr.reshape(info["shape"]).copy()
    return out, meta


def save_safetensors(path, tensors, metadata=None):
    """tensors: {name: numpy array} (written in the given order); metadata: {str: str}."""
    header, chunks, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        blob = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": _ST_NAMES[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        chunks.append(blob)
        offset += len(blob)
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * (-len(hjson) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for c in chunks:
            f.write(c)


def load_crosstrain_checkpoint(model, path):
    """Loads a crosstrain/HF-named safetensors file into `model` (a "transformer." prefix and an
    untied "lm_head.weight" are accepted)."""
    tensors, _ = load_safetensors(path)
    state = {}
    for name, arr in tensors.items():
        if name.startswith("transformer."):
            name = name[len("transformer."):]
        if name == "lm_head.weight" or name.endswith(".attn.bias") or name.endswith(".masked_bias"):
            continue
        state[name] = torch.from_numpy(arr.astype(np.float32))
    model.load_state_dict(state, strict=True)
    return model
