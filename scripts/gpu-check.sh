#!/usr/bin/env bash
# On a machine with an NVIDIA or AMD GPU: build, run the conformance suites and the end-to-end
# parity tests on that GPU, benchmark the GEMM (the own kernel against cuBLASLt / rocBLAS) and
# training throughput (tiny and gpt2; PyTorch beside it when installed); where the GPU also has a
# Vulkan driver, the same on Vulkan (its conformance suites, the coopmat verdict, the coopmat and
# tiled GEMMs against the library, tokens/s against the native backend); and write a report:
#   bench/gpu-check-<date>/report.md and report.json (plus the raw logs).
# Without a GPU it says so and exits 77 (skipped).
#   bash scripts/gpu-check.sh [--quick]      --quick: fewer benchmark iterations and steps
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
quick=0
[ "${1:-}" = "--quick" ] && quick=1

backend=""
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  backend=cuda
elif [ -e /dev/kfd ] && command -v rocminfo >/dev/null 2>&1 && rocminfo 2>/dev/null | grep -q gfx; then
  backend=hip
fi
if [ -z "$backend" ]; then
  echo "gpu-check: no NVIDIA (nvidia-smi) or AMD (/dev/kfd + rocminfo) GPU on this machine: skipped"
  exit 77
fi

out="bench/gpu-check-$(date -u +%Y%m%d-%H%M%S)"
mkdir -p "$out"
log() { echo "gpu-check: $*" | tee -a "$out/gpu-check.log"; }

log "building (release preset, $backend plugin)"
opts=(-DCT_BACKEND_CUDA=OFF -DCT_BACKEND_HIP=OFF)
[ "$backend" = cuda ] && opts=(-DCT_BACKEND_CUDA=ON -DCT_BACKEND_HIP=OFF)
[ "$backend" = hip ] && opts=(-DCT_BACKEND_CUDA=OFF -DCT_BACKEND_HIP=ON)
cmake --preset release "${opts[@]}" >"$out/configure.log" 2>&1
cmake --build --preset release -j"$(nproc)" >"$out/build.log" 2>&1
build/bin/crosstrain devices >"$out/devices.txt" 2>&1
build/bin/crosstrain devices --json >"$out/devices.json" 2>&1
if ! grep -q "^  $backend:0" "$out/devices.txt"; then
  log "the $backend backend lists no device:"; grep "^$backend" "$out/devices.txt" | tee -a "$out/gpu-check.log"
  exit 1
fi

log "conformance suites and end-to-end parity on ${backend}:0"
set +e
build/bin/test_ops --gtest_filter="*/${backend}_0" --gtest_output="json:$out/test_ops.json" \
  >"$out/test_ops.log" 2>&1
ops_rc=$?
build/bin/test_model --gtest_filter="*/${backend}_0" --gtest_output="json:$out/test_model.json" \
  >"$out/test_model.log" 2>&1
model_rc=$?
set -e

iters=20; steps=50
[ "$quick" = 1 ] && iters=5 && steps=10
log "GEMM: cuBLASLt/rocBLAS, then the own kernel"
build/bin/device_gemm_bench --device "${backend}:0" --iters "$iters" --json "$out/gemm_library.json" \
  >"$out/gemm_library.txt" 2>&1
CT_GPU_GEMM=own build/bin/device_gemm_bench --device "${backend}:0" --iters "$iters" \
  --json "$out/gemm_own.json" >"$out/gemm_own.txt" 2>&1

log "training throughput"
for model in tiny gpt2; do
  for prec in "" --bf16; do
    tag="${model}${prec:+-bf16}"
    set +e
    build/bin/crosstrain train --backend "${backend}:0" --model "$model" --max-steps "$steps" \
      --eval-steps 0 --sample-tokens 0 --no-progress $prec --output-dir "$out/run-$tag" \
      >"$out/train-$tag.log" 2>&1
    set -e
  done
done
# PyTorch beside it, on the same GPU, same models, batch and steps (scripts/torch_train.py: the
# same GPT-2 step in eager PyTorch, fp32 and bf16 autocast), when a PyTorch that sees the GPU is
# installed.
torch_note="not installed (or it does not see the GPU): no comparison"
if python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  torch_note="$(python3 -c 'import torch; print("torch", torch.__version__)') on the same GPU"
  log "PyTorch: $torch_note"
  for model in tiny gpt2; do
    for prec in "" --bf16; do
      tag="${model}${prec:+-bf16}"
      set +e
      python3 scripts/torch_train.py --device cuda --model "$model" --batch 4 --steps "$steps" \
        $prec --json "$out/torch-$tag.json" >"$out/torch-$tag.log" 2>&1
      set -e
    done
  done
fi

# The same GPU through Vulkan (issue #12's figures), where a Vulkan GPU device is listed.
vk="$(grep -E '^  vulkan:[0-9]+ .*\[(discrete|integrated)-gpu\]' "$out/devices.txt" | head -1 | awk '{print $1}' || true)"
if [ -n "$vk" ]; then
  log "Vulkan on $vk: conformance suites, GEMM (coopmat where its self-test passed, tiled), training"
  set +e
  build/bin/test_ops --gtest_filter="*/${vk/:/_}" --gtest_output="json:$out/test_ops_vulkan.json" \
    >"$out/test_ops_vulkan.log" 2>&1
  build/bin/test_vulkan --gtest_output="json:$out/test_vulkan.json" >"$out/test_vulkan.log" 2>&1
  build/bin/device_gemm_bench --device "$vk" --iters "$iters" --json "$out/gemm_vulkan.json" \
    >"$out/gemm_vulkan.txt" 2>&1
  CROSSTRAIN_VK_COOPMAT=0 build/bin/device_gemm_bench --device "$vk" --iters "$iters" \
    --json "$out/gemm_vulkan_tiled.json" >"$out/gemm_vulkan_tiled.txt" 2>&1
  for model in tiny gpt2; do
    for prec in "" --bf16; do
      tag="${model}${prec:+-bf16}"
      build/bin/crosstrain train --backend "$vk" --model "$model" --max-steps "$steps" \
        --eval-steps 0 --sample-tokens 0 --no-progress $prec --output-dir "$out/run-vulkan-$tag" \
        >"$out/vulkan-train-$tag.log" 2>&1
    done
  done
  set -e
  build/bin/crosstrain devices 2>&1 | grep -E "coopmat GEMM|matmul variant" >"$out/vulkan_coopmat.txt" || true
fi

python3 - "$out" "$backend" "$ops_rc" "$model_rc" "$torch_note" <<'PY'
import json, os, re, sys
out, backend, ops_rc, model_rc, torch_note = sys.argv[1:]
def tests(name):
    p = os.path.join(out, name)
    if not os.path.exists(p): return {"ran": False}
    j = json.load(open(p))
    return {"ran": True, "tests": j.get("tests", 0), "failures": j.get("failures", 0),
            "disabled": j.get("disabled", 0)}
def gemm(name):
    p = os.path.join(out, name)
    return json.load(open(p))["rows"] if os.path.exists(p) else []
lib, own = gemm("gemm_library.json"), gemm("gemm_own.json")
throughput = {}
for f in sorted(os.listdir(out)):
    m = re.match(r"train-(.*)\.log$", f)
    if not m: continue
    t = re.findall(r"throughput\s+([\d,.]+) tokens/s", open(os.path.join(out, f)).read())
    throughput[m.group(1)] = float(t[-1].replace(",", "")) if t else None
torch_tps = {}
for f in sorted(os.listdir(out)):
    m = re.match(r"torch-(.*)\.json$", f)
    if not m: continue
    steps = [r["tokens_per_s"] for r in json.load(open(os.path.join(out, f)))["steps"]][3:]
    torch_tps[m.group(1)] = sorted(steps)[len(steps) // 2] if steps else None  # median, warm
devices = open(os.path.join(out, "devices.txt")).read()
report = {"backend": backend, "test_ops": tests("test_ops.json"), "test_model": tests("test_model.json"),
          "test_ops_exit": int(ops_rc), "test_model_exit": int(model_rc), "gemm_library": lib,
          "gemm_own": own, "tokens_per_s": throughput, "pytorch": torch_note,
          "pytorch_tokens_per_s": torch_tps}
json.dump(report, open(os.path.join(out, "report.json"), "w"), indent=2)
md = [f"# gpu-check on {backend}:0", "", "```", devices.strip(), "```", "",
      "## Tests", "", "| suite | tests | failures | exit |", "|---|---|---|---|"]
for s in ("test_ops", "test_model"):
    r = report[s]
    md.append(f"| {s} | {r.get('tests','-')} | {r.get('failures','-')} | {report[s + '_exit']} |")
md += ["", "## GEMM (GFLOP/s, median)", "", "| dtype | shape | library | own | own / library |", "|---|---|---|---|---|"]
for a, b in zip(lib, own):
    ratio = b["gflops"] / a["gflops"] if a["gflops"] else 0
    md.append(f"| {a['dtype']} | {a['shape']} {a['M']}x{a['N']}x{a['K']} | {a['gflops']:.0f} | {b['gflops']:.0f} | {ratio:.2f} |")
md += ["", "## Training throughput (tokens/s)", "", "| run | crosstrain | PyTorch | crosstrain / PyTorch |",
       "|---|---|---|---|"]
for k, v in throughput.items():
    t = torch_tps.get(k)
    ratio = f"{v / t:.2f}" if v and t else "-"
    md.append(f"| {k} | {v if v is not None else 'failed (see log)'} | {f'{t:.0f}' if t else '-'} | {ratio} |")
md += ["", f"PyTorch: {torch_note}", ""]
vk_lib, vk_tiled = gemm("gemm_vulkan.json"), gemm("gemm_vulkan_tiled.json")
if vk_lib:
    cm = open(os.path.join(out, "vulkan_coopmat.txt")).read().strip() if os.path.exists(
        os.path.join(out, "vulkan_coopmat.txt")) else ""
    md += ["## Vulkan on the same GPU", "", "```", cm, "```", "",
           "| suite | tests | failures |", "|---|---|---|"]
    for s in ("test_ops_vulkan", "test_vulkan"):
        r = tests(s + ".json")
        md.append(f"| {s} | {r.get('tests','-')} | {r.get('failures','-')} |")
    md += ["", "GEMM, GFLOP/s (default: coopmat for f16 where its self-test passed, else tiled; "
           "tiled: CROSSTRAIN_VK_COOPMAT=0). Targets: coopmat 60 %, tiled 30 % of the library.", "",
           "| dtype | shape | library | vulkan default | / library | vulkan tiled | / library |",
           "|---|---|---|---|---|---|---|"]
    for a, b, c in zip(lib, vk_lib, vk_tiled or vk_lib):
        r1 = b["gflops"] / a["gflops"] if a["gflops"] else 0
        r2 = c["gflops"] / a["gflops"] if a["gflops"] else 0
        md.append(f"| {a['dtype']} | {a['shape']} | {a['gflops']:.0f} | {b['gflops']:.0f} | {r1:.2f} | {c['gflops']:.0f} | {r2:.2f} |")
    md += ["", "| run | native | vulkan | vulkan / native |", "|---|---|---|---|"]
    for f in sorted(os.listdir(out)):
        m = re.match(r"vulkan-train-(.*)\.log$", f)
        if not m: continue
        t = re.findall(r"throughput\s+([\d,.]+) tokens/s", open(os.path.join(out, f)).read())
        v = float(t[-1].replace(",", "")) if t else None
        n = throughput.get(m.group(1))
        md.append(f"| {m.group(1)} | {n} | {v if v is not None else 'failed (see log)'} | {f'{v / n:.2f}' if v and n else '-'} |")
    report["vulkan"] = {"gemm": vk_lib, "gemm_tiled": vk_tiled, "coopmat": cm}
    json.dump(report, open(os.path.join(out, "report.json"), "w"), indent=2)
    md.append("")
open(os.path.join(out, "report.md"), "w").write("\n".join(md))
print("\n".join(md))
PY
log "report: $out/report.md"
[ "$ops_rc" = 0 ] && [ "$model_rc" = 0 ]
