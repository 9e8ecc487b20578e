#!/usr/bin/env bash
# On a machine with an NVIDIA or AMD GPU: first the figures, `crosstrain bench --report` on the
# GPU (and on its Vulkan driver): GEMMs (cuBLASLt / rocBLAS and the own kernel), ops, training
# tokens/s per precision, the loss against the CPU, memory, PyTorch (eager, and torch.compile
# unless --quick) and llm.c beside it, in the report's own format (report.md, report.json,
# charts: what `crosstrain bench --merge` joins); then what that report does not do: the
# conformance suites on the GPU (test_ops and test_model; test_ops and test_vulkan through
# Vulkan), the driver and Vulkan-loader diagnostics, a gpt2 bf16 `--profile`, the bundle.
#
#   bash scripts/gpu-check.sh --bundle FILE [--llmc PATH] [--out DIR] [--budget S] [--quick]
#       runs everything from a bundle (scripts/bundle.sh: a .tar.xz, or its unpacked folder) with
#       no build: what a bare GPU machine can do (/work/shared/GPU.md)
#   bash scripts/gpu-check.sh [--llmc PATH] [--out DIR] [--budget S] [--quick]
#       builds here first (cmake's release preset with the GPU's plugin), then the same
#   --llmc PATH   llm.c's train_gpt2cu (or the folder holding it): gpt2 bf16 tokens/s beside it
#   --out DIR     where everything goes (default bench/gpu-check-<date>)
#   --budget S    seconds for all steps (default 450: one 8-minute call, unpacking included);
#                 each step runs under `timeout`, one that would not fit is skipped and says so
#   --quick       the report's quick preset (`bench --quick`: tiny and gpt2, fp32 and bf16,
#                 6 steps, 3 timed calls per kernel; PyTorch eager only): ~3 minutes on an H100
#                 by run 2 of bench/gpu-check-20261127-h100 (step times), not yet timed there
#                 (without it: tiny, gpt2 and smollm-135m in every precision, torch.compile too)
#   --devices LIST  measure and test these devices instead of the GPU found (cpu:0,simt:0,
#                 vulkan:0): the same check run dry on a machine without a GPU
#   --no-suites   the report only
#   --pack        at the end, leave at most 8 files in --out: report.md, report.json, its charts,
#                 steps.tsv, gpu-check.log, and logs.tar.gz (everything else)
#   --check-only  check (and unpack) the bundle, then stop: no GPU needed
#   --unpack-dir DIR  where an archive is unpacked (DIR/crosstrain-bundle, kept); default: a
#                 temporary folder, removed at the end (--out keeps a copy of bundle.json)
#   -- ARGS       passed to `crosstrain bench --report` after the script's own (the last wins):
#                 e.g. -- --models tiny --steps 2
# The report runs first (at most the budget less two minutes kept for the suites), written after
# each device (a run cut short still leaves one): one of the native devices with the peers, one
# of the Vulkan devices, merged into --out (report.md, report.json, charts; native/, vulkan/). Every step runs even when an earlier one
# failed; the exit status is 0 only when the suites passed. Without a GPU (and no --devices):
# exit 77 (skipped), after the bundle was checked.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# The backend plugin ABI this script's steps were written for (core/device.h kBackendAbiVersion;
# tests/tools/bundle_test.sh fails when they differ). A bundle built for another is refused.
expected_abi=20
bundle_format=1

bundle="" llmc="" out="" budget=450 quick=0 check_only=0 unpack="" devices="" suites=1 pack=0
report_args=()
while (($#)); do
  case "$1" in
    --bundle) bundle="${2:?gpu-check: --bundle needs a file}"; shift 2 ;;
    --llmc) llmc="${2:?gpu-check: --llmc needs a path}"; shift 2 ;;
    --out) out="${2:?gpu-check: --out needs a folder}"; shift 2 ;;
    --budget) budget="${2:?gpu-check: --budget needs seconds}"; shift 2 ;;
    --quick) quick=1; shift ;;
    --devices) devices="${2:?gpu-check: --devices needs a list}"; shift 2 ;;
    --no-suites) suites=0; shift ;;
    --pack) pack=1; shift ;;
    --check-only) check_only=1; shift ;;
    --unpack-dir) unpack="${2:?gpu-check: --unpack-dir needs a folder}"; shift 2 ;;
    --) shift; report_args=("$@"); break ;;
    -h|--help) sed -n '2,36p' "${BASH_SOURCE[0]}"; exit 0 ;;
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
  for f in crosstrain test_ops test_model; do
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
if [ -z "$backend" ] && [ -z "$devices" ]; then
  log "no NVIDIA (nvidia-smi) or AMD (/dev/kfd + rocminfo) GPU on this machine: skipped (--devices runs it dry on others)"
  exit 77
fi

if [ -z "$bundle" ]; then
  repo="$(cd "$here/.." && pwd)"
  bin="$repo/build/bin"
  data=""  # crosstrain's built-in default (Debian's fortunes)
  [ -d /usr/share/games/fortunes ] || data="$repo/tests/data/text/harbour.txt"
  if [ -n "$backend" ]; then
    log "building (release preset, $backend plugin)"
    opts=(-DCT_BACKEND_CUDA=OFF -DCT_BACKEND_HIP=OFF)
    [ "$backend" = cuda ] && opts=(-DCT_BACKEND_CUDA=ON -DCT_BACKEND_HIP=OFF)
    [ "$backend" = hip ] && opts=(-DCT_BACKEND_CUDA=OFF -DCT_BACKEND_HIP=ON)
    (cd "$repo" && cmake --preset release "${opts[@]}" && cmake --build --preset release -j"$(nproc)") \
      >"$out/build.log" 2>&1 || { log "the build failed: $out/build.log"; exit 1; }
  else  # a dry run: the build as it is
    [ -x "$bin/crosstrain" ] || { log "no $bin/crosstrain: build first (or give --bundle)"; exit 2; }
  fi
fi
data_flag=()
[ -n "$data" ] && data_flag=(--data "$data")

# ---- the environment of every crosstrain process ---------------------------------------------
# The bundle's own RUNPATHs; cuBLASLt is found by the CUDA plugin itself ($CUDA_HOME,
# /usr/local/cuda/lib64), so CUDA's folder stays off the path of the PyTorch peers, which run as
# the report's children with their own CUDA libraries. Vulkan without the Khronos validation layer
# (not installed on a bare GPU machine), on the GPU's own driver.
libpath=""
[ "$backend" = hip ] && [ -d /opt/rocm/lib ] && libpath=/opt/rocm/lib
[ -z "$bundle" ] && [ -n "${LD_LIBRARY_PATH:-}" ] && libpath="${libpath:+$libpath:}$LD_LIBRARY_PATH"
ct_env=(env CROSSTRAIN_VK_VALIDATION=0 VK_INSTANCE_LAYERS= OMP_WAIT_POLICY=passive)
icd=""
if [ -n "$backend" ]; then
  # The GPU vendor's Vulkan driver (its ICD manifest), so that the loader opens no other. Images
  # differ in where they keep it and whether the library it names is on the loader's path: each
  # manifest found is tried (`crosstrain devices` must list a GPU through it), the first that
  # works is used; the driver's own folder (/usr/local/nvidia/lib64) is added to the path.
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
  ct_env+=(LD_LIBRARY_PATH="$libpath")
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
elif [ -n "$libpath" ]; then
  ct_env+=(LD_LIBRARY_PATH="$libpath")
fi
# Line-buffered output: a process that crashes in exit() (the Vulkan plugin on the NVIDIA driver:
# /work/shared/GPU.md) would otherwise lose what it printed into a log file.
if command -v stdbuf >/dev/null 2>&1; then ct_env=(stdbuf -oL -eL "${ct_env[@]}"); fi

# ---- steps -------------------------------------------------------------------------------------
steps="$out/steps.tsv"
printf 'step\tstatus\texit\tseconds\tlog\n' >"$steps"
# step NAME MAX_SECONDS LOG COMMAND...: runs COMMAND under timeout (at most MAX_SECONDS, less
# when the budget has less left; skipped under 10 s) and records it.
step() {
  local name="$1" max="$2" logf="$3" left t t0 rc status
  shift 3
  left=$((deadline - $(date +%s)))
  if ((left < 10)); then
    printf '%s\tskipped (time budget)\t-\t0\t-\n' "$name" >>"$steps"
    log "$name: skipped, ${left}s left of the ${budget}s budget"
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
  log "$name: $status"
}

step devices 30 devices.txt "${ct_env[@]}" "$bin/crosstrain" devices
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null ||
  rocminfo 2>/dev/null | grep -m1 'Marketing Name' || true; } >"$out/gpu.txt"
# The devices checked: the GPU's native device and its Vulkan device, or --devices.
if [ -n "$devices" ]; then
  IFS=, read -r -a checked <<<"$devices"
else
  checked=("$backend:0")
  vk="$(grep -E '^ *vulkan:[0-9]+ .*\[(discrete|integrated)-gpu\]' "$out/devices.txt" | head -1 | awk '{print $1}' || true)"
  [ -n "$vk" ] && checked+=("$vk")
  grep -qE "^ *$backend:0" "$out/devices.txt" || log "the $backend backend lists no device: see $out/devices.txt"
fi

# ---- 1. the report: every figure, peers beside ------------------------------------------------
py="${CROSSTRAIN_PYTHON:-python3}"
peers=""
if "$py" -c 'import torch' >/dev/null 2>&1; then
  peers=pytorch
  ((quick)) || peers=pytorch,pytorch-compile
else
  log "PyTorch is not importable by $py (CROSSTRAIN_PYTHON names another): no PyTorch peer"
fi
args=(--batch 16)
if ((quick)); then
  args+=(--quick)
else
  args+=(--models tiny,gpt2,smollm-135m --steps 8 --iters 5)
fi
# The Vulkan devices in a report of their own, after the others' (with the peers): a Vulkan driver
# that brings the process down (the NVIDIA driver's exit crash, /work/shared/GPU.md) takes only
# its own figures along. The two are merged into --out.
native=() vulkan=() reports=()
for d in "${checked[@]}"; do
  if [[ "$d" == vulkan:* ]]; then vulkan+=("$d"); else native+=("$d"); fi
done
reserve=0
((suites)) && reserve=120
report() {  # report NAME SECONDS_KEPT_FOR_LATER DEVICES ARGS...: one report into --out/NAME
  local name="$1" keep="$2" list="$3" max
  shift 3
  max=$((deadline - $(date +%s) - reserve - keep))
  ((max >= 60)) || max=60
  rm -rf "${out:?}/$name"
  step "crosstrain bench --report ($list)" "$max" "report-$name.log" "${ct_env[@]}" \
    CROSSTRAIN_PYTHON="$py" "$bin/crosstrain" bench --report "$out/$name" --devices "$list" \
    "${args[@]}" "$@" "${data_flag[@]}" "${report_args[@]}"
  [ -f "$out/$name/report.json" ] && reports+=("$out/$name/report.json")
  return 0
}
extra=()
[ -n "$peers" ] && extra+=(--peers "$peers")
[ -n "$llmc" ] && extra+=(--llmc "$llmc")
if ((${#native[@]})); then
  keep=0
  ((${#vulkan[@]})) && keep=90
  report native "$keep" "$(IFS=,; echo "${native[*]}")" "${extra[@]}"
fi
((${#vulkan[@]})) && report vulkan 0 "$(IFS=,; echo "${vulkan[*]}")"
if ((${#reports[@]})); then
  step "crosstrain bench --merge" 60 merge.log "${ct_env[@]}" CROSSTRAIN_PYTHON="$py" \
    "$bin/crosstrain" bench --merge "$out" "${reports[@]}"
else
  log "no report was written: see report-*.log"
fi

# ---- 2. the suites: the op conformance suite on every device checked, the model's end-to-end
# tests on the first, the Vulkan backend's own suite (coopmat self-test) where Vulkan is checked.
passed=1
# suite NAME MAX_SECONDS [FILTER]: a GoogleTest binary; its JSON says how it went.
suite() {
  local name="$1" max="$2" filter="${3:-*}" tag="$1${3:+_${3##*/}}"
  if [ ! -x "$bin/$name" ]; then
    log "$name: not in $bin"
    return 0
  fi
  rm -f "$out/$tag.json"
  step "$name${3:+ on ${3##*/}}" "$max" "$tag.log" "${ct_env[@]}" "$bin/$name" \
    --gtest_filter="$filter" --gtest_output="json:$out/$tag.json"
  local n f
  n="$(sed -n 's/^  "tests": \([0-9]*\),/\1/p' "$out/$tag.json" 2>/dev/null | head -1)"
  f="$(sed -n 's/^  "failures": \([0-9]*\),/\1/p' "$out/$tag.json" 2>/dev/null | head -1)"
  if [ -z "$n" ] || [ -z "$f" ]; then
    passed=0
    log "$tag: no test count (cut short, or it did not start): see $tag.log"
  elif [ "$f" != 0 ] || [ "$n" = 0 ]; then
    passed=0
    log "$tag: $n tests, $f failed: $(grep -o '^\[  FAILED  \] [^ ,]*\.[^ ,]*' "$out/$tag.log" | sort -u | cut -c14- | tr '\n' ' ')"
  else
    log "$tag: $n tests, none failed"
  fi
}
if ((suites)); then
  for d in "${checked[@]}"; do suite test_ops 120 "*/${d/:/_}"; done
  suite test_model 150 "*/${checked[0]/:/_}"
  for d in "${checked[@]}"; do
    if [[ "$d" == vulkan:* ]]; then
      suite test_vulkan 90
      break
    fi
  done
fi

# ---- 3. where a gpt2 bf16 step's ops and GEMMs run on the GPU (--profile: the kernel path of
# each op, the GEMMs the library refused), in profile.log.
if [ -n "$backend" ] && [ -z "$devices" ]; then
  step "crosstrain gpt2 bf16 --profile on $backend:0" 60 profile.log "${ct_env[@]}" \
    "$bin/crosstrain" train --backend "$backend:0" --model gpt2 --per-device-train-batch-size 16 \
    --max-steps 4 --logging-steps 1 --eval-steps 0 --max-eval-batches 1 --sample-tokens 0 \
    --no-progress --bf16 --profile "${data_flag[@]}" --output-dir "$out/profile-run"
  rm -rf "$out/profile-run"
  # The same for fp32 and TF32 (2026-11-27: 0.69x and 0.51x PyTorch's, ~130 ms a step behind it
  # in both): which ops take the time there, in profile-fp32.log and profile-tf32.log.
  for p in fp32 tf32; do
    flag=()
    [ "$p" = tf32 ] && flag=(--tf32)
    step "crosstrain gpt2 $p --profile on $backend:0" 45 "profile-$p.log" "${ct_env[@]}" \
      "$bin/crosstrain" train --backend "$backend:0" --model gpt2 --per-device-train-batch-size 16 \
      --max-steps 3 --logging-steps 1 --eval-steps 0 --max-eval-batches 1 --sample-tokens 0 \
      --no-progress --profile "${flag[@]}" "${data_flag[@]}" --output-dir "$out/profile-run"
    rm -rf "$out/profile-run"
  done
  # The own tensor-core GEMM against the library, product by product (gpt2's shapes at 8 x 1024
  # tokens, f32/f16/bf16): device_gemm_bench --compare runs each on a second device opened with
  # CT_GPU_GEMM=own CT_GPU_TILES=1 and gives the ratio (#26 item 4: at least 0.5x cuBLASLt).
  step "device_gemm_bench --compare on $backend:0" 90 gemm-compare.log "${ct_env[@]}" \
    "$bin/device_gemm_bench" --device "$backend:0" --compare --json "$out/gemm-compare.json"
  # The step graph's gain (each micro-batch's forward and backward replayed as one CUDA/HIP graph
  # launch, on by default): the same gpt2 bf16 run with and without it, tokens/s in each log.
  for g in graph no-graph; do
    flag=()
    [ "$g" = no-graph ] && flag=(--no-cuda-graph)
    step "crosstrain gpt2 bf16 ($g) on $backend:0" 60 "train-gpt2-bf16-$g.log" "${ct_env[@]}" \
      "$bin/crosstrain" train --backend "$backend:0" --model gpt2 --per-device-train-batch-size 16 \
      --max-steps 10 --logging-steps 1 --eval-steps 0 --max-eval-batches 1 --sample-tokens 0 \
      --no-progress --bf16 "${flag[@]}" "${data_flag[@]}" --output-dir "$out/graph-run"
    # Sampling from the trained gpt2: 256 tokens with the key/value cache (fp32, and --bf16) and
    # without it (every token a forward over the whole window); each log ends with --stats' JSON
    # (seconds to the first token, decode tokens/s); fp32's two texts are the same.
    if [ "$g" = graph ] && [ -f "$out/graph-run/model.safetensors" ]; then
      for c in kv-cache kv-cache-bf16 no-kv-cache; do
        flag=()
        [ "$c" = no-kv-cache ] && flag=(--no-kv-cache)
        [ "$c" = kv-cache-bf16 ] && flag=(--bf16)
        step "crosstrain generate gpt2, 256 tokens ($c) on $backend:0" 60 "generate-$c.log" \
          "${ct_env[@]}" "$bin/crosstrain" generate --backend "$backend:0" \
          --model-path "$out/graph-run" --prompt "The" --max-new-tokens 256 --stats "${flag[@]}"
      done
    fi
    rm -rf "$out/graph-run"
  done
fi

# ---- 4. data parallel's device collectives (--ddp-backend nccl: NCCL on cuda, RCCL on hip),
# loaded at run time. A world of one through the library (its communicator, in-place all-reduce
# and averaging on the device's stream) against the same run without it (--ddp-backend mpi: one
# process reduces nothing): the losses must be equal, bit for bit (a sum over one rank, times 1).
# Then 2 ranks on the one GPU through mpirun, where there is one (Open MPI is not in the bundle):
# with MPI through host memory, and with the library, which NCCL refuses by default (two ranks on
# one device: "Duplicate GPU detected"; no NCCL_* setting lifts it), so that step is expected to
# fail, saying so in its log; the host path's run is the 2-rank check.
if [ -n "$backend" ] && [ -z "$devices" ]; then
  lib=NCCL
  [ "$backend" = hip ] && lib=RCCL
  dp_run=("$bin/crosstrain" train --backend "$backend:0" --model tiny --per-device-train-batch-size 4
          --max-steps 6 --logging-steps 1 --eval-steps 0 --max-eval-batches 1 --sample-tokens 0
          --no-progress --gradient-accumulation-steps 2 --ddp-bucket-cap-mb 1 "${data_flag[@]}")
  losses() { sed -n 's/.*"loss":\([^,]*\),.*/\1/p' "$1/metrics.jsonl" 2>/dev/null; }
  step "world size 1 through $lib on $backend:0" 60 "ddp-$backend-world1.log" "${ct_env[@]}" \
    "${dp_run[@]}" --ddp-backend nccl --output-dir "$out/ddp-world1-nccl"
  step "world size 1, --ddp-backend mpi, on $backend:0" 60 "ddp-$backend-world1-mpi.log" \
    "${ct_env[@]}" "${dp_run[@]}" --ddp-backend mpi --output-dir "$out/ddp-world1-mpi"
  if ! grep -q "ddp backend nccl: $lib" "$out/ddp-$backend-world1.log" 2>/dev/null; then
    passed=0
    log "world size 1: the run did not say 'ddp backend nccl: $lib': see ddp-$backend-world1.log"
  elif [ -z "$(losses "$out/ddp-world1-nccl")" ] ||
    [ "$(losses "$out/ddp-world1-nccl")" != "$(losses "$out/ddp-world1-mpi")" ]; then
    passed=0
    log "world size 1: the losses through $lib differ from the run without it (or are missing)"
  else
    log "world size 1 through $lib: the same losses as without it, bit for bit"
  fi
  if command -v mpirun >/dev/null 2>&1; then
    mpi=(mpirun -np 2 --oversubscribe)
    [ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
    for b in mpi nccl; do
      step "2 ranks on $backend:0, --ddp-backend $b" 90 "ddp-$backend-2ranks-$b.log" \
        "${ct_env[@]}" "${mpi[@]}" "${dp_run[@]}" --ddp-backend "$b" \
        --output-dir "$out/ddp-2ranks-$b"
    done
    log "2 ranks with $lib on one GPU: $(grep -m1 -o 'Duplicate GPU[^"]*\|ddp backend nccl: [^(]*' \
      "$out/ddp-$backend-2ranks-nccl.log" 2>/dev/null || echo 'see the log')"
  else
    log "2 ranks on one GPU: skipped, no mpirun on this machine (Open MPI is not in the bundle)"
  fi
  rm -rf "$out"/ddp-world1-* "$out"/ddp-2ranks-*
fi

log "done in $(($(date +%s) - start))s: $out/report.md"
if ((pack)); then  # report.md/json, its charts, steps.tsv, gpu-check.log and the rest packed
  (cd "$out" && find . -mindepth 1 -maxdepth 1 ! -name report.md ! -name report.json \
    ! -name '*.png' ! -name steps.tsv ! -name gpu-check.log ! -name logs.tar.gz -printf '%P\n' |
    tar -czf logs.tar.gz -T - --remove-files)
fi
((passed)) || exit 1
