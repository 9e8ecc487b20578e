#!/usr/bin/env bash
# On a machine with an NVIDIA or AMD GPU: the conformance suites and the end-to-end parity tests
# on that GPU (and on its Vulkan driver), the GEMM benchmarks (cuBLASLt / rocBLAS, the own
# kernel, Vulkan), training tokens/s of tiny, gpt2 (batch 16) and smollm-135m in fp32, tf32 and
# bf16, PyTorch on the same GPU when it is importable (eager with SDPA and fused AdamW, and
# torch.compile), llm.c when given; a report written as it goes (a run cut short still reports):
#   <out>/report.md, report.json, steps.tsv, and every step's log; and <out>/bench-report/, the
#   versioned report of `crosstrain bench --report` (the one `crosstrain bench --merge` joins).
#
#   bash scripts/gpu-check.sh --bundle FILE [--llmc PATH] [--out DIR] [--budget S] [--quick]
#       runs everything from a bundle (scripts/bundle.sh: a .tar.xz, or its unpacked folder) with
#       no build: what a bare GPU machine can do (/work/shared/GPU.md)
#   bash scripts/gpu-check.sh [--llmc PATH] [--out DIR] [--budget S] [--quick]
#       builds here first (cmake's release preset with the GPU's plugin), then the same
#   --llmc PATH   llm.c's train_gpt2cu (or the folder holding it): gpt2 bf16 tokens/s beside it
#   --out DIR     where the report goes (default bench/gpu-check-<date>)
#   --budget S    seconds for all steps (default 450: one 8-minute call, unpacking included);
#                 each step runs under `timeout`, one that would not fit is skipped and says so
#   --quick       fewer steps and benchmark iterations
#   --check-only  check (and unpack) the bundle, then stop: no GPU needed
#   --unpack-dir DIR  where an archive is unpacked (DIR/crosstrain-bundle, kept); default: a
#                 temporary folder, removed at the end (the report keeps a copy of bundle.json)
# Steps run most telling first (the plan near the end: the native suite, gpt2 bf16 beside llm.c
# and PyTorch, Vulkan, GEMMs, --profile, then the rest), so that --budget cuts only the tail.
# Every step runs even when an earlier one failed; the exit status is 0 only when the GPU's
# suites passed. Without a GPU: exit 77 (skipped), after the bundle was checked.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# The backend plugin ABI this script's steps were written for (core/device.h kBackendAbiVersion;
# tests/tools/bundle_test.sh fails when they differ). A bundle built for another is refused.
expected_abi=16
bundle_format=1

bundle="" llmc="" out="" budget=450 quick=0 check_only=0 unpack=""
while (($#)); do
  case "$1" in
    --bundle) bundle="${2:?gpu-check: --bundle needs a file}"; shift 2 ;;
    --llmc) llmc="${2:?gpu-check: --llmc needs a path}"; shift 2 ;;
    --out) out="${2:?gpu-check: --out needs a folder}"; shift 2 ;;
    --budget) budget="${2:?gpu-check: --budget needs seconds}"; shift 2 ;;
    --quick) quick=1; shift ;;
    --check-only) check_only=1; shift ;;
    --unpack-dir) unpack="${2:?gpu-check: --unpack-dir needs a folder}"; shift 2 ;;
    -h|--help) sed -n '2,25p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "gpu-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
start=$(date +%s)
deadline=$((start + budget))
[ -n "$out" ] || out="bench/gpu-check-$(date -u +%Y%m%d-%H%M%S)"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
refuse() { echo "gpu-check: refusing --bundle '$bundle': $*" >&2; exit 2; }
log() { echo "gpu-check: $*" | tee -a "$out/gpu-check.log"; }

# ---- the bundle: checked before anything else (no GPU needed for that) -----------------------
if [ -n "$bundle" ]; then
  if [ -d "$bundle" ]; then
    top="$(cd "$bundle" && pwd)"
    [ -f "$top/bundle.json" ] || refuse "the folder has no bundle.json manifest (found: $(ls "$top" | head -5 | tr '\n' ' '))"
  elif [ -f "$bundle" ]; then
    # Unpacked into a fresh folder of its own: a foreign archive leaves nothing elsewhere.
    dest="$unpack"
    [ -n "$dest" ] || dest="${TMPDIR:-/tmp}"
    mkdir -p "$dest"
    scratch="$(mktemp -d "$dest/crosstrain-bundle.XXXXXX")"
    trap 'rm -rf "$scratch"' EXIT
    if ! err="$(tar -C "$scratch" -xJf "$bundle" 2>&1)"; then
      refuse "not an xz-compressed tar archive (tar: $(echo "$err" | head -2 | tr '\n' ' '); file: $(file -b "$bundle" 2>/dev/null || echo '?'))"
    fi
    top="$scratch/crosstrain-bundle"
    if [ ! -f "$top/bundle.json" ]; then
      found="$(cd "$scratch" && find . -maxdepth 2 | sed -n '2,6p' | tr '\n' ' ')"
      refuse "no crosstrain-bundle/bundle.json manifest in the archive (found: ${found:-nothing})"
    fi
    if [ -n "$unpack" ]; then  # kept: moved to DIR/crosstrain-bundle
      rm -rf "$unpack/crosstrain-bundle"
      mv "$top" "$unpack/crosstrain-bundle"
      top="$(cd "$unpack/crosstrain-bundle" && pwd)"
    fi
  else
    refuse "no such file"
  fi
  format="$(sed -n 's/^ *"format": *\([0-9][0-9]*\).*/\1/p' "$top/bundle.json" | head -1)"
  abi="$(sed -n 's/^ *"backend_abi": *\([0-9][0-9]*\).*/\1/p' "$top/bundle.json" | head -1)"
  [ "$format" = "$bundle_format" ] || refuse "bundle.json has format '${format:-none}', this script reads format $bundle_format"
  [ "$abi" = "$expected_abi" ] || refuse "bundle.json says backend ABI '${abi:-none}', this gpu-check expects $expected_abi (make the bundle from the same commit: scripts/bundle.sh)"
  for f in crosstrain test_ops test_model device_gemm_bench; do
    [ -x "$top/bin/$f" ] || refuse "bin/$f is missing from it"
  done
  bin="$top/bin"
  data="$top/data/fortunes"
  cp "$top/bundle.json" "$out/bundle.json"
  log "bundle $bundle: commit $(sed -n 's/^ *"git_commit": *"\(.*\)".*/\1/p' "$top/bundle.json"), ABI $abi, in $top"
fi
if ((check_only)); then
  [ -n "$bundle" ] || { echo "gpu-check: --check-only checks a --bundle" >&2; exit 2; }
  exit 0
fi

backend=""
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  backend=cuda
elif [ -e /dev/kfd ] && command -v rocminfo >/dev/null 2>&1 && rocminfo 2>/dev/null | grep -q gfx; then
  backend=hip
fi
if [ -z "$backend" ]; then
  log "no NVIDIA (nvidia-smi) or AMD (/dev/kfd + rocminfo) GPU on this machine: skipped"
  exit 77
fi

if [ -z "$bundle" ]; then
  repo="$(cd "$here/.." && pwd)"
  log "building (release preset, $backend plugin)"
  opts=(-DCT_BACKEND_CUDA=OFF -DCT_BACKEND_HIP=OFF)
  [ "$backend" = cuda ] && opts=(-DCT_BACKEND_CUDA=ON -DCT_BACKEND_HIP=OFF)
  [ "$backend" = hip ] && opts=(-DCT_BACKEND_CUDA=OFF -DCT_BACKEND_HIP=ON)
  (cd "$repo" && cmake --preset release "${opts[@]}" && cmake --build --preset release -j"$(nproc)") \
    >"$out/build.log" 2>&1 || { log "the build failed: $out/build.log"; exit 1; }
  bin="$repo/build/bin"
  data=""  # crosstrain's built-in default (Debian's fortunes)
  [ -d /usr/share/games/fortunes ] || data="$repo/tests/data/text/harbour.txt"
fi
data_flag=()
[ -n "$data" ] && data_flag=(--data "$data")

# ---- the environment of every crosstrain process ---------------------------------------------
# Only the bundle's own RUNPATHs, plus CUDA's cuBLASLt. Vulkan without the Khronos validation
# layer (not installed on a bare GPU machine), on the GPU's own driver.
libpath=""
[ -d /usr/local/cuda/lib64 ] && libpath=/usr/local/cuda/lib64
[ -d /opt/rocm/lib ] && libpath="${libpath:+$libpath:}/opt/rocm/lib"
[ -z "$bundle" ] && [ -n "${LD_LIBRARY_PATH:-}" ] && libpath="${libpath:+$libpath:}$LD_LIBRARY_PATH"
# The GPU vendor's Vulkan driver (its ICD manifest), so that the loader opens no other. Images
# differ in where they keep it and whether the library it names is on the loader's path: each
# manifest found is tried (`crosstrain devices` must list a GPU through it), the first that works
# is used; the driver's own folder (/usr/local/nvidia/lib64) is added to the library path.
icd=""
icd_names=(nvidia_icd)
[ "$backend" = hip ] && icd_names=(amd_icd radeon_icd)
for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
  [ -d "$d" ] && libpath="${libpath:+$libpath:}$d"
done
# NVIDIA's Vulkan driver library needs libglvnd (libGLdispatch) and X11: the bundle's copies
# (lib/glvnd) where the system has none, last on the path.
if [ -n "$bundle" ] && [ -d "$top/lib/glvnd" ] && ! ldconfig -p 2>/dev/null | grep -q 'libGLdispatch.so.0 '; then
  libpath="${libpath:+$libpath:}$top/lib/glvnd"
  log "libGLdispatch.so.0 is not installed: the bundle's lib/glvnd is on the library path"
fi
ct_env=(env CROSSTRAIN_VK_VALIDATION=0 VK_INSTANCE_LAYERS= OMP_WAIT_POLICY=passive LD_LIBRARY_PATH="$libpath")
icd_tried=()
for d in /usr/share/vulkan/icd.d /etc/vulkan/icd.d /usr/local/share/vulkan/icd.d \
  /usr/local/nvidia/share/vulkan/icd.d /usr/local/nvidia/etc/vulkan/icd.d; do
  for n in "${icd_names[@]}"; do
    for f in "$d/$n"*.json; do
      [ -f "$f" ] && [ -z "$icd" ] || continue
      icd_tried+=("$f")
      if "${ct_env[@]}" VK_DRIVER_FILES="$f" VK_ICD_FILENAMES="$f" CROSSTRAIN_BACKENDS=vulkan \
        timeout 30 "$bin/crosstrain" devices 2>/dev/null |
        grep -qE '^ *vulkan:[0-9]+ .*\[(discrete|integrated)-gpu\]'; then
        icd="$f"
      fi
    done
  done
done
if [ -n "$icd" ]; then
  ct_env+=(VK_DRIVER_FILES="$icd" VK_ICD_FILENAMES="$icd")
  log "Vulkan driver: $icd"
else
  log "Vulkan: no manifest listed a GPU (tried: ${icd_tried[*]:-none found}; the loader's account: vulkan_loader.log)"
  for f in "${icd_tried[@]}"; do
    echo "== $f: $(tr -d '\n' <"$f" | head -c 300)"
    "${ct_env[@]}" VK_DRIVER_FILES="$f" VK_LOADER_DEBUG=error,warn,driver CROSSTRAIN_BACKENDS=vulkan \
      timeout 30 "$bin/crosstrain" devices 2>&1 | grep -v '^  cpu:\|^            ' | head -60
    lib="$(sed -n 's/.*"library_path" *: *"\([^"]*\)".*/\1/p' "$f")"
    echo "-- $lib: $(ldconfig -p | grep -F "$lib" | head -2 | tr '\n' ' ')"
    p="$(ldconfig -p | awk -v n="$lib" '$1 == n { print $NF; exit }')"
    [ -n "$p" ] && LD_LIBRARY_PATH="$libpath" ldd "$p" | grep -i 'not found'
  done >"$out/vulkan_loader.log" 2>&1 || true
fi
# Line-buffered output: a process that crashes in exit() (the Vulkan plugin on the NVIDIA driver:
# /work/shared/GPU.md) would otherwise lose what it printed into a log file.
if command -v stdbuf >/dev/null 2>&1; then ct_env=(stdbuf -oL -eL "${ct_env[@]}"); fi

# ---- steps -------------------------------------------------------------------------------------
steps="$out/steps.tsv"
printf 'step\tstatus\texit\tseconds\tlog\n' >"$steps"
report() {
  python3 "$here/gpu_check_report.py" "$out" "$backend" "${vk:-}" "${icd:-}" \
    >/dev/null 2>"$out/report.err" || log "the report failed: $out/report.err"
}
# step NAME MAX_SECONDS LOG COMMAND...: runs COMMAND under timeout (at most MAX_SECONDS, less
# when the budget has less left; skipped under 10 s), records it, rewrites the report.
step() {
  local name="$1" max="$2" logf="$3" left t t0 rc status
  shift 3
  left=$((deadline - $(date +%s)))
  if ((left < 10)); then
    printf '%s\tskipped (time budget)\t-\t0\t-\n' "$name" >>"$steps"
    log "$name: skipped, ${left}s left of the ${budget}s budget"
    report
    return 0
  fi
  t=$((max < left ? max : left))
  log "$name (at most ${t}s)"
  t0=$(date +%s.%N)
  set +e
  timeout -k 5 "$t" "$@" >"$out/$logf" 2>&1
  rc=$?
  set -e
  case "$rc" in
    0) status=ok ;;
    124|137) status="timed out after ${t}s" ;;
    139) status="SIGSEGV" ;;
    *) status=failed ;;
  esac
  printf '%s\t%s\t%s\t%.1f\t%s\n' "$name" "$status" "$rc" \
    "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')" "$logf" >>"$steps"
  report
}

step devices 30 devices.txt "${ct_env[@]}" "$bin/crosstrain" devices
"${ct_env[@]}" timeout 30 "$bin/crosstrain" devices --json >"$out/devices.json" 2>/dev/null || true
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null ||
  rocminfo 2>/dev/null | grep -m1 'Marketing Name' || true; } >"$out/gpu.txt"
vk="$(grep -E '^ *vulkan:[0-9]+ .*\[(discrete|integrated)-gpu\]' "$out/devices.txt" | head -1 | awk '{print $1}' || true)"
if ! grep -qE "^ *$backend:0" "$out/devices.txt"; then
  log "the $backend backend lists no device: see $out/devices.txt"
fi

tests() {  # tests SUITE DEVICE MAX_SECONDS
  local tag="$1_${2/:/_}"
  step "$1 on $2" "$3" "$tag.log" "${ct_env[@]}" "$bin/$1" --gtest_filter="*/${2/:/_}" \
    --gtest_output="json:$out/$tag.json"
}

# Training tokens/s: the median of the steps after the first three (metrics.jsonl, one record a
# step); the run's weights are deleted (only the numbers are kept).
train() {  # train DEVICE MODEL BATCH STEPS PRECISION MAX_SECONDS
  local dev="$1" model="$2" batch="$3" n="$4" prec="$5" max="$6" tag flags=()
  tag="train-${dev/:/_}-$model-$prec"
  [ "$prec" = bf16 ] && flags=(--bf16)
  [ "$prec" = tf32 ] && flags=(--tf32)
  step "crosstrain $model $prec on $dev" "$max" "$tag.log" "${ct_env[@]}" "$bin/crosstrain" train \
    --backend "$dev" --model "$model" --per-device-train-batch-size "$batch" --max-steps "$n" \
    --logging-steps 1 --eval-steps 0 --max-eval-batches 1 --sample-tokens 0 --no-progress \
    "${flags[@]}" "${data_flag[@]}" --output-dir "$out/$tag"
  find "$out/$tag" -name '*.safetensors' -delete 2>/dev/null || true
}
# --profile of a short gpt2 bf16 run: the kernel path of every op and the GEMMs the library
# refused (in profile-*.log; not a tokens/s figure: the report reads train-* only).
profile() {  # profile DEVICE MAX_SECONDS
  local dev="$1" tag="profile-${1/:/_}-gpt2-bf16"
  step "crosstrain gpt2 bf16 --profile on $dev" "$2" "$tag.log" "${ct_env[@]}" "$bin/crosstrain" \
    train --backend "$dev" --model gpt2 --per-device-train-batch-size 16 --max-steps 4 \
    --logging-steps 1 --eval-steps 0 --max-eval-batches 1 --sample-tokens 0 --no-progress --bf16 \
    --profile "${data_flag[@]}" --output-dir "$out/$tag"
  rm -rf "$out/$tag"
}
s_tiny=30 s_gpt2=12 s_smol=10 iters=10
((quick)) && s_tiny=10 s_gpt2=8 s_smol=6 iters=3

gemm() {  # gemm KIND: library | own | vulkan
  case "$1" in
    library) step "GEMM library on $backend:0" 60 gemm_library.log "${ct_env[@]}" \
               "$bin/device_gemm_bench" --device "$backend:0" --iters "$iters" \
               --json "$out/gemm_library.json" ;;
    own) step "GEMM own kernel on $backend:0" 60 gemm_own.log "${ct_env[@]}" CT_GPU_GEMM=own \
           "$bin/device_gemm_bench" --device "$backend:0" --iters "$iters" \
           --json "$out/gemm_own.json" ;;
    vulkan) [ -n "$vk" ] && step "GEMM on $vk" 60 gemm_vulkan.log "${ct_env[@]}" \
              "$bin/device_gemm_bench" --device "$vk" --iters "$iters" --json "$out/gemm_vulkan.json" ;;
  esac
  return 0
}

# PyTorch on the same GPU, same models, batch and data (scripts/torch_train.py).
have_torch=0
if python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
  have_torch=1
  python3 -c 'import torch; print("torch", torch.__version__)' >"$out/torch_version.txt" 2>&1
else
  echo "not importable, or it does not see the GPU" >"$out/torch_version.txt"
fi
torch_run() {  # torch_run TAG MAX_SECONDS ARGS...
  ((have_torch)) || return 0
  local tag="$1" max="$2"
  shift 2
  step "PyTorch $tag" "$max" "torch-$tag.log" python3 "$here/torch_train.py" --device cuda \
    "${data_flag[@]}" --json "$out/torch-$tag.json" "$@"
}

# llm.c (train_gpt2cu, bf16, random d12 init) on the same text, byte-tokenised into its format.
llmc_run() {
  [ -n "$llmc" ] || return 0
  local exe="$llmc"
  [ -d "$exe" ] && exe="$exe/train_gpt2cu"
  if [ ! -x "$exe" ]; then
    printf 'llm.c\tfailed\t-\t0\t-\n' >>"$steps"
    log "--llmc $llmc: no executable train_gpt2cu there"
    return 0
  fi
  python3 - "${data:-/usr/share/games/fortunes}" "$out/llmc_tokens.bin" <<'PY'
import os, struct, sys
src, dst = sys.argv[1:]
if os.path.isdir(src):
    names = sorted(n for n in os.listdir(src) if not n.startswith(".") and not n.endswith(".dat")
                   and os.path.isfile(os.path.join(src, n)) and not os.path.islink(os.path.join(src, n)))
    text = b"".join(open(os.path.join(src, n), "rb").read() for n in names)
else:
    text = open(src, "rb").read()
header = [20240520, 1, len(text)] + [0] * 253   # llm.c's token file: 256 int32, then uint16
with open(dst, "wb") as f:
    f.write(struct.pack("<256i", *header))
    tokens = bytearray(2 * len(text))
    tokens[0::2] = text
    f.write(tokens)
PY
  step "llm.c gpt2 bf16" 90 llmc-gpt2-bf16.log "$exe" -i "$out/llmc_tokens.bin" \
    -j "$out/llmc_tokens.bin" -e d12 -b 16 -t 1024 -x $((s_gpt2 + 8)) -v 100000 -s 100000 -n 0 \
    -o "$out/llmc-out"  # -v/-s 0 divide by zero in llm.c: a period past the run's steps instead
}

# ---- the plan, most telling first: a run cut short by --budget keeps the headline -----------
# 1. correctness of the native backend and the gpt2 bf16 comparison with its peers on this card;
tests test_ops "$backend:0" 120
train "$backend:0" gpt2 16 "$s_gpt2" bf16 60
llmc_run
torch_run gpt2-bf16 60 --model gpt2 --batch 16 --steps "$s_gpt2" --sdpa --fused-adamw --bf16
tests test_model "$backend:0" 150
# 2. the same GPU through Vulkan: training, its op suite and its own suite (coopmat self-test);
if [ -n "$vk" ]; then
  train "$vk" gpt2 16 6 bf16 60
  tests test_ops "$vk" 120
  if [ -x "$bin/test_vulkan" ]; then
    step "test_vulkan on $vk" 90 test_vulkan.log "${ct_env[@]}" "$bin/test_vulkan" \
      --gtest_output="json:$out/test_vulkan.json"
  fi
fi
# 3. GEMMs, and where a gpt2 step's GEMMs and attention run;
gemm library
gemm own
gemm vulkan
profile "$backend:0" 60
[ -n "$vk" ] && profile "$vk" 60
# 4. the other precisions and models, with their peers;
train "$backend:0" gpt2 16 "$s_gpt2" tf32 60
torch_run gpt2-tf32 60 --model gpt2 --batch 16 --steps "$s_gpt2" --sdpa --fused-adamw --tf32
train "$backend:0" gpt2 16 "$s_gpt2" fp32 60
torch_run gpt2-fp32 60 --model gpt2 --batch 16 --steps "$s_gpt2" --sdpa --fused-adamw
[ -n "$vk" ] && train "$vk" gpt2 16 6 fp32 60
train "$backend:0" smollm-135m 4 "$s_smol" bf16 60
if python3 -c 'import transformers' >/dev/null 2>&1; then
  torch_run smollm-135m-bf16 60 --model smollm-135m --batch 4 --steps "$s_smol" --fused-adamw --bf16
fi
for prec in fp32 tf32 bf16; do train "$backend:0" tiny 4 "$s_tiny" "$prec" 40; done
torch_run tiny-fp32 40 --model tiny --batch 4 --steps "$s_tiny" --sdpa --fused-adamw
# 5. what costs the most time last.
torch_run gpt2-bf16-compile 150 --model gpt2 --batch 16 --steps $((s_gpt2 + 8)) --sdpa \
  --fused-adamw --bf16 --compile
for prec in fp32 tf32; do train "$backend:0" smollm-135m 4 "$s_smol" "$prec" 60; done

# The versioned report (`crosstrain bench --report`, tools/crosstrain/report_format.h) of the GPU:
# GEMMs (the library and the own kernel), ops, tiny and gpt2 in every precision with the loss
# against the CPU's fp32 run, memory, PyTorch eager beside it where importable: the file that
# `crosstrain bench --merge` joins with other machines' reports. Last, so that the steps above
# keep their share of the budget (give --budget 700 to be sure it runs); they still write this
# script's own report (the suites, smollm-135m, torch.compile, llm.c, Vulkan) until they move
# into the versioned one.
peers=()
python3 -c 'import torch' >/dev/null 2>&1 && peers=(--peers "pytorch")
step "crosstrain bench --report" 240 bench-report.log "${ct_env[@]}" "$bin/crosstrain" bench \
  --report "$out/bench-report" --devices "$backend:0" --models tiny,gpt2 --batch 8 \
  --steps "$s_smol" --iters "$iters" "${data_flag[@]}" "${peers[@]}"

report
log "report: $out/report.md ($(($(date +%s) - start))s)"
python3 - "$out/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
sys.exit(0 if r.get("gpu_suites_passed") else 1)
PY
