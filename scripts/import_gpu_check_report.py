#!/usr/bin/env python3
"""Converts the report of the first gpu-check runs (scripts/gpu-check.sh before it ran
`crosstrain bench --report`: its own report.json, "gpu-check report v0") into a crosstrain report
(format "crosstrain-report" v1, tools/crosstrain/report_format.h), so that `crosstrain bench
--merge` joins those figures with the reports of other machines:

    python3 scripts/import_gpu_check_report.py RUN_DIR [--out FILE] [--host NAME] [--date DATE]

RUN_DIR holds the old report.json, bundle.json (the bundle's manifest: its commit and build) and
gpu.txt (nvidia-smi's name, driver, memory). The result (default RUN_DIR/crosstrain-report.json)
keeps what v0 measured: training tokens/s and the last loss of each run (crosstrain's device,
PyTorch eager and torch.compile, llm.c), and the GEMM tables of the library and the own kernel.
It says where it came from ("imported_from"), and its build is the bundle's. v0 did not record
the run's date (--date; default: the bundle's date), the host (--host; default "gpu-check"),
the batch (gpu-check.sh's of the time: tiny 4 x 256, gpt2 16 x 1024, smollm-135m 4 x 2048), the
compiler, the op times or the memory. Its tokens/s are medians of the steps after the first
three (v1: after the first). MFU and GEMM efficiency are left to `--merge`, which fills them
from the merging crosstrain's table of known peaks. Only the standard library.
"""
import argparse
import json
import os
import sys

V0 = "gpu-check report v0"
BATCH = {"tiny": (4, 256), "gpt2": (16, 1024), "smollm-135m": (4, 2048)}
PRECISIONS = ["fp32", "tf32", "bf16", "fp16"]


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"{path}: cannot read it as JSON ({e})")


def split_key(key):
    """"gpt2-bf16-compile" -> ("gpt2", "bf16", True); "smollm-135m-bf16" -> (..., False)."""
    compile_ = key.endswith("-compile")
    if compile_:
        key = key[: -len("-compile")]
    model, precision = key.rsplit("-", 1)
    return model, precision, compile_


def gemm_rows(rows, own):
    out = []
    for g in rows:
        shape = g["shape"].split(" (")[0]  # "qkv (B*T=8192)" -> "qkv"
        row = {"model": "gpt2", "shape": shape, "layout": g["layout"].upper(), "M": g["M"],
               "N": g["N"], "K": g["K"], "dtype": g["dtype"], "gflops": g["gflops"],
               "ms": g["median_s"] * 1e3, "path": "own" if own else "library",
               "implementation": g.get("path", "")}
        if own:
            row["variant"] = "own kernel (CT_GPU_GEMM=own)"
        out.append(row)
    return out


def convert(run_dir, host, date, out):
    old_path = os.path.join(run_dir, "report.json")
    old = load(old_path)
    if "suites" not in old or "train" not in old or "format" in old:
        sys.exit(f"{old_path}: not a {V0} (gpu_check_report.py's report.json)")
    bundle = load(os.path.join(run_dir, "bundle.json"))
    gpu = old.get("gpu", "")
    try:
        with open(os.path.join(run_dir, "gpu.txt")) as f:
            gpu = f.read().strip() or gpu
    except OSError:
        pass
    name = gpu.split(",")[0].strip() or "unknown GPU"
    backend = old.get("backend", "cuda")
    commit = bundle.get("git_commit", "unknown")[:12] + ("-dirty" if bundle.get("git_dirty") else "")

    train = []
    for r in old["train"].values():
        if not r.get("tokens_per_s"):
            continue
        batch, block = BATCH.get(r["model"], (0, 0))
        row = {"model": r["model"], "precision": r["precision"], "batch": batch,
               "block_size": block, "steps": r["steps"], "tokens_per_s": r["tokens_per_s"]}
        if r.get("last_loss") is not None:
            row["loss"] = r["last_loss"]
        train.append(row)
    memory = [{"model": r["model"], "technique": "fp32" if r["precision"] == "fp32"
               else r["precision"] + " mixed precision", "bytes": r["peak_bytes"]}
              for r in old["train"].values() if r.get("peak_bytes")]
    precisions = [p for p in PRECISIONS if any(t["precision"] == p for t in train)]
    gemm = old.get("gemm", {})
    device = {"label": f"{backend}:0", "id": f"{backend}:0", "backend": backend, "name": name,
              "kind": "discrete-gpu", "precisions": precisions, "status": "ok",
              "gemm": gemm_rows(gemm.get("library", []), False) + gemm_rows(gemm.get("own", []), True),
              "ops": [], "train": train, "memory": memory}

    peers = []
    for key, r in sorted(old.get("pytorch", {}).items()):
        if not r.get("tokens_per_s"):
            continue
        model, precision, compile_ = split_key(key)
        p = {"peer": "pytorch compile" if compile_ else "pytorch eager", "version": r.get("torch", ""),
             "device": "cuda", "model": model, "precision": precision,
             "tokens_per_s": r["tokens_per_s"]}
        if r.get("last_loss") is not None:
            p["loss"] = r["last_loss"]
        peers.append(p)
    for key, r in sorted(old.get("llmc", {}).items()):
        if r.get("tokens_per_s"):
            model, precision, _ = split_key(key)
            peers.append({"peer": "llm.c", "version": "train_gpt2cu", "device": "cuda",
                          "model": model, "precision": precision, "tokens_per_s": r["tokens_per_s"]})

    return {
        "format": "crosstrain-report", "version": 1,
        "build": {"commit": commit, "compiler": "unknown (not in the v0 report)",
                  "build_type": bundle.get("build_type", "unknown"),
                  "backend_abi": bundle.get("backend_abi", 0)},
        "date": date or bundle.get("bundle_date", ""),
        "host": {"name": host},
        "imported_from": {"format": V0,  # the file, from the folder of the converted one
                          "file": os.path.relpath(old_path, os.path.dirname(os.path.abspath(out))),
                          "converter": "scripts/import_gpu_check_report.py",
                          "gpu": gpu, "note": "tokens/s: the median of the steps after the first three"},
        "devices": [device], "peers": peers, "cpu_reference": [],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("--out", default="", help="default: RUN_DIR/crosstrain-report.json")
    ap.add_argument("--host", default="gpu-check", help="the host's name in the report")
    ap.add_argument("--date", default="", help="when it ran (default: the bundle's date)")
    a = ap.parse_args()
    out = a.out or os.path.join(a.run_dir, "crosstrain-report.json")
    report = convert(a.run_dir, a.host, a.date, out)
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    d = report["devices"][0]
    print(f"wrote {out}: {d['name']}, {len(d['train'])} training runs, {len(d['gemm'])} GEMMs, "
          f"{len(report['peers'])} peer runs")


if __name__ == "__main__":
    main()
