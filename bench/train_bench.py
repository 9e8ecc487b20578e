#!/usr/bin/python3
"""End-to-end training throughput: crosstrain's CPU backend against plain PyTorch (fp32).

For each configuration (default: `tiny` batch 4x256, `gpt2` 124M batch 1x1024) and each repeat,
runs `crosstrain train` and scripts/torch_train.py on the same model, batch, data and optimizer,
alternating which goes first so that machine noise lands on both; reads per-step tokens/s
(crosstrain: metrics.jsonl with --logging-steps 1; PyTorch: its per-step timings), drops the
first warm-up steps of every run, and reports the median over all remaining steps of all repeats.
The same run measures OpenBLAS sgemm on a representative shape (bench/gemm_bench --shape) and
reports the model FLOP/s as a fraction of it.

    /usr/bin/python3 bench/train_bench.py [--repeats 3] [--json out.json] [--markdown out.md]

Model FLOPs per trained token (forward + backward):
    6 * N_mm + 12 * n_layer * T * n_embd
N_mm = all parameters except the position embedding (wpe is a lookup; wte counts because it is
the tied LM head's matrix); the second term is QK^T and AV over the full T x T (not halved for the
causal mask), as in the PaLM appendix / nanoGPT's estimate_mfu. LayerNorm, GELU, softmax, AdamW
are not counted.

It is a benchmark, not a test: bars are printed as PASS/FAIL and it exits 0 either way (non-zero
only if a run itself fails). See bench/README.md.
"""
import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PRESETS = {  # n_layer, n_head, n_embd, block_size, vocab_size (core/model/gpt2.cpp presets)
    "tiny": (6, 6, 384, 256, 256),
    "gpt2": (12, 12, 768, 1024, 50257),
    "gpt2-medium": (24, 16, 1024, 1024, 50257),
}
# crosstrain / PyTorch tokens/s: fp32 (the foundation issue), bf16 mixed precision against
# PyTorch's bf16 autocast (the mixed-precision issue: at least as fast).
BARS_BY_PRECISION = {"fp32": {"tiny": 1.5, "gpt2": 1.2}, "bf16": {"tiny": 1.0, "gpt2": 1.0}}
BARS = BARS_BY_PRECISION["fp32"]


def num_params(model):
    L, _, C, T, V = PRESETS[model]
    return V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C


def flops_per_token(model):
    L, _, C, T, _ = PRESETS[model]
    return 6 * (num_params(model) - T * C) + 12 * L * T * C


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def cpu_busy_seconds():
    """Busy CPU-seconds of the whole machine so far (all processes), from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return (sum(v[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def wait_idle(limit_s, threshold=0.3):
    """Waits (up to limit_s) until the machine's busy CPUs over a 1 s sample drop below
    threshold; returns the last sample."""
    t_end = time.time() + limit_s
    while True:
        b0 = cpu_busy_seconds()
        time.sleep(1.0)
        busy = cpu_busy_seconds() - b0
        if busy < threshold or time.time() >= t_end:
            return busy
        time.sleep(4.0)


def run(cmd, env, log):
    """Runs cmd; returns (wall seconds, own CPU-seconds, machine busy CPU-seconds)."""
    t0, b0 = time.time(), cpu_busy_seconds()
    r0 = os.times()
    with open(log, "w") as f:
        p = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)
    r1 = os.times()
    wall, busy = time.time() - t0, cpu_busy_seconds() - b0
    own = (r1.children_user - r0.children_user) + (r1.children_system - r0.children_system)
    if p.returncode != 0:
        with open(log) as f:
            tail = f.read()[-3000:]
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}\n{tail}")
    return wall, own, busy


def run_crosstrain(a, model, batch, steps, env, work):
    out = os.path.join(work, f"ct_{model}")
    shutil.rmtree(out, ignore_errors=True)
    cmd = [a.crosstrain, "train", "--model", model, "--per-device-train-batch-size", str(batch),
           "--max-steps", str(steps), "--logging-steps", "1", "--warmup-steps", "0",
           "--no-progress", "--sample-tokens", "0", "--eval-steps", "0",
           "--max-eval-batches", "1", "--output-dir", out]
    if a.precision == "bf16":
        cmd += ["--bf16"]
    if a.data:
        cmd += ["--data", a.data]
    wall, own, busy = run(cmd, env, out + ".log")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    shutil.rmtree(out, ignore_errors=True)  # model.safetensors is 0.5 GB for gpt2
    return [r["tokens_per_s"] for r in recs], wall, own, busy


def run_torch(a, model, batch, steps, env, work):
    js = os.path.join(work, f"torch_{model}.json")
    cmd = [a.python, os.path.join(REPO, "scripts", "torch_train.py"), "--model", model,
           "--batch", str(batch), "--steps", str(steps), "--threads", str(a.threads), "--json", js]
    if a.precision == "bf16":
        cmd += ["--bf16"]
    if a.torch_fast:
        cmd += ["--sdpa", "--fused-adamw"]
    if a.data:
        cmd += ["--data", a.data]
    wall, own, busy = run(cmd, env, js + ".log")
    with open(js) as f:
        recs = json.load(f)["steps"]
    return [r["tokens_per_s"] for r in recs], wall, own, busy


def run_gemm(a, shape, env):
    """Median OpenBLAS GFLOP/s over the fwd/dx/dw layouts of one shape."""
    out = subprocess.run([a.gemm_bench, "--shape", shape, "--no-dnnl", "--reps", "5"], env=env,
                         capture_output=True, text=True, check=True).stdout
    vals = [float(m.group(1)) for m in re.finditer(r"^custom\s+\S+\s+\w+\s+([\d.]+)", out, re.M)]
    if len(vals) != 3:
        raise SystemExit(f"cannot parse gemm_bench output:\n{out}")
    return vals


def main():
    ap = argparse.ArgumentParser(description="crosstrain vs PyTorch end-to-end training benchmark")
    ap.add_argument("--crosstrain", default=os.path.join(REPO, "build", "bin", "crosstrain"))
    ap.add_argument("--gemm-bench", default=os.path.join(REPO, "build", "bin", "gemm_bench"))
    ap.add_argument("--python", default="/usr/bin/python3", help="interpreter with torch")
    ap.add_argument("--torch-fast", action="store_true",
                    help="PyTorch >= 2 with F.scaled_dot_product_attention and fused AdamW (the "
                         "peer #28 names; needs e.g. --python VENV/bin/python)")
    ap.add_argument("--configs", default="tiny,gpt2")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: crosstrain --bf16 against PyTorch's bf16 autocast")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tiny-batch", type=int, default=4)
    ap.add_argument("--tiny-steps", type=int, default=12)
    ap.add_argument("--gpt2-batch", type=int, default=1)
    ap.add_argument("--gpt2-steps", type=int, default=4)
    ap.add_argument("--warmup", default="tiny=2,gpt2=1",
                    help="steps dropped at the start of every run, per config")
    ap.add_argument("--data", default="", help="training text (default: crosstrain's default)")
    ap.add_argument("--wait-idle", type=float, default=0.0, metavar="S",
                    help="before each run, wait up to S seconds for the machine to go idle "
                         "(other processes < 0.3 CPU busy); on a shared machine")
    ap.add_argument("--json", default="")
    ap.add_argument("--markdown", default="")
    a = ap.parse_args()
    global BARS
    BARS = BARS_BY_PRECISION[a.precision]

    configs = [c for c in a.configs.split(",") if c]
    warm = {k: int(v) for k, v in (x.split("=") for x in a.warmup.split(","))}
    batch = {"tiny": a.tiny_batch, "gpt2": a.gpt2_batch}
    steps = {"tiny": a.tiny_steps, "gpt2": a.gpt2_steps}
    for c in configs:
        if c not in BARS:
            raise SystemExit(f"unknown config {c} (known: {', '.join(BARS)})")
        if steps[c] <= warm.get(c, 1):
            raise SystemExit(f"{c}: --{c}-steps must exceed its {warm.get(c, 1)} warm-up steps")
    for p in (a.crosstrain, a.gemm_bench):
        if not os.access(p, os.X_OK):
            raise SystemExit(f"{p} not found: build it (cmake --build build --target crosstrain gemm_bench)")

    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(a.threads), OPENBLAS_NUM_THREADS=str(a.threads))
    work = tempfile.mkdtemp(prefix="train_bench_")
    t_begin = time.time()
    load_before = open("/proc/loadavg").read().split()[:3]
    print(f"train_bench: {platform.node()}, {os.cpu_count()} CPUs, {a.threads} threads, "
          f"{a.repeats} repeats; loadavg {' '.join(load_before)}", flush=True)

    runs = []  # one record per process run
    gemm = {c: [] for c in configs}
    for rep in range(a.repeats):
        for ci, c in enumerate(configs):
            L, _, C, T, _ = PRESETS[c]
            shape = f"{batch[c] * T}x{C}x{4 * C}"  # the MLP c_fc layer of this config
            g = run_gemm(a, shape, env)
            gemm[c] += g
            order = ["crosstrain", "pytorch"] if (rep + ci) % 2 == 0 else ["pytorch", "crosstrain"]
            for fw in order:
                if a.wait_idle > 0:
                    wait_idle(a.wait_idle)
                la = loadavg()
                fn = run_crosstrain if fw == "crosstrain" else run_torch
                tps, wall, own, busy = fn(a, c, batch[c], steps[c], env, work)
                meas = tps[warm.get(c, 1):]
                # other processes' share of the machine during this run, in CPUs
                others = max(0.0, (busy - own) / wall)
                runs.append({"config": c, "framework": fw, "repeat": rep, "steps_tokens_per_s": tps,
                             "measured": meas, "median": statistics.median(meas), "wall_s": wall,
                             "loadavg_at_start": la, "other_cpus_busy": others})
                print(f"  rep {rep} {c:5s} {fw:10s} median {statistics.median(meas):9.1f} tok/s "
                      f"(steps: {', '.join(f'{x:.0f}' for x in tps)}); {wall:5.1f} s wall, "
                      f"other processes {others:.2f} CPUs busy", flush=True)
            print(f"  rep {rep} {c:5s} sgemm {shape}: {', '.join(f'{x:.0f}' for x in g)} GFLOP/s",
                  flush=True)

    results = []
    for c in configs:
        def pooled(fw):
            return [x for r in runs if r["config"] == c and r["framework"] == fw for x in r["measured"]]
        ct, pt = statistics.median(pooled("crosstrain")), statistics.median(pooled("pytorch"))
        fpt = flops_per_token(c)
        sg = statistics.median(gemm[c]) * 1e9
        ratio = ct / pt
        results.append({
            "config": c, "batch": batch[c], "block_size": PRESETS[c][3], "steps": steps[c],
            "warmup_steps_dropped": warm.get(c, 1), "num_parameters": num_params(c),
            "flops_per_token": fpt, "crosstrain_tokens_per_s": ct, "pytorch_tokens_per_s": pt,
            "ratio": ratio, "bar": BARS[c], "pass": ratio >= BARS[c], "precision": a.precision,
            "crosstrain_gflops": ct * fpt / 1e9, "pytorch_gflops": pt * fpt / 1e9,
            "sgemm_shape": f"{batch[c] * PRESETS[c][3]}x{PRESETS[c][2]}x{4 * PRESETS[c][2]}",
            "sgemm_gflops": sg / 1e9, "crosstrain_frac_of_sgemm": ct * fpt / sg,
            "pytorch_frac_of_sgemm": pt * fpt / sg,
            "crosstrain_run_medians": [r["median"] for r in runs if r["config"] == c and r["framework"] == "crosstrain"],
            "pytorch_run_medians": [r["median"] for r in runs if r["config"] == c and r["framework"] == "pytorch"],
        })

    load_after = open("/proc/loadavg").read().split()[:3]
    elapsed = time.time() - t_begin
    head = ("| config | batch | crosstrain tok/s | PyTorch tok/s | ratio | bar | verdict | "
            "crosstrain GFLOP/s (% sgemm) | PyTorch GFLOP/s (% sgemm) | sgemm GFLOP/s (shape) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        lines.append(
            f"| {r['config']} | {r['batch']}x{r['block_size']} | {r['crosstrain_tokens_per_s']:.1f} | "
            f"{r['pytorch_tokens_per_s']:.1f} | {r['ratio']:.2f}x | >= {r['bar']}x | "
            f"{'PASS' if r['pass'] else 'FAIL'} | {r['crosstrain_gflops']:.1f} "
            f"({100 * r['crosstrain_frac_of_sgemm']:.0f}%) | {r['pytorch_gflops']:.1f} "
            f"({100 * r['pytorch_frac_of_sgemm']:.0f}%) | {r['sgemm_gflops']:.0f} ({r['sgemm_shape']}) |")
    others = statistics.median([r["other_cpus_busy"] for r in runs])
    notes = [
        f"Median tokens/s over all post-warm-up steps of {a.repeats} alternating runs per framework; "
        f"{a.threads} threads; {a.precision}; AdamW + clip 1.0; byte-level data.",
        "Model FLOPs/token = 6*(params - wpe) + 12*n_layer*T*n_embd; sgemm = OpenBLAS, median of "
        "fwd/dx/dw layouts of the MLP c_fc shape.",
        f"loadavg before {' '.join(load_before)}, after {' '.join(load_after)}; median other-process "
        f"load during runs {others:.2f} CPUs; {elapsed:.0f} s total.",
    ]
    md = "\n".join(lines) + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    print("\n" + md)
    verdict = all(r["pass"] for r in results)
    for r in results:
        print(f"{r['config']}: crosstrain/PyTorch = {r['ratio']:.2f}x, bar {r['bar']}x: "
              f"{'PASS' if r['pass'] else 'FAIL'}")
    print(f"VERDICT: {'PASS' if verdict else 'FAIL'} (all bars)")
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(md)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"results": results, "runs": runs, "threads": a.threads,
                       "repeats": a.repeats, "loadavg_before": load_before,
                       "loadavg_after": load_after, "elapsed_s": elapsed,
                       "host": platform.node(), "pass": verdict}, f, indent=1)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
