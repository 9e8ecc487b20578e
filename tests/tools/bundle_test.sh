#!/usr/bin/env bash
# The GPU check's bundle (scripts/bundle.sh) runs away from the build: packed from the build tree
# into a temporary folder (--no-compress; gpu-check.sh unpacks a small archive of it), then run
# from there with an empty LD_LIBRARY_PATH and the temporary folder as the working directory:
# `crosstrain devices`, the GELU op tests, the optimizer golden test (its data found beside the
# binary: gone from the bundle, the test fails), a 2-step `crosstrain train`. Every ELF file's
# libraries resolve to the bundle, to the base system (glibc, libstdc++, libgcc_s) or to the GPU
# stack (which may be missing here); no RUNPATH points outside the bundle. gpu-check.sh refuses a
# file that is not a bundle, a folder without a manifest and a manifest of another backend ABI,
# and expects the ABI of core/device.h; it runs dry on cpu:0 (the report only) and packs its output.
#   bash tests/tools/bundle_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$(cd "$1" && pwd)"
src="$(cd "$2" && pwd)"
command -v patchelf >/dev/null || { echo "patchelf is missing (scripts/setup.sh installs it): skipped"; exit 77; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
t0=$(date +%s.%N)
lap() { echo "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%5.1f", b - a }')s $*"; }

# ---- the ABI the script expects is core/device.h's ---------------------------------------------
abi="$(sed -n 's/.*kBackendAbiVersion = \([0-9][0-9]*\);.*/\1/p' "$src/core/device.h")"
script_abi="$(sed -n 's/^expected_abi=\([0-9][0-9]*\)$/\1/p' "$src/scripts/gpu-check.sh")"
[ -n "$abi" ] && [ "$abi" = "$script_abi" ] ||
  fail "scripts/gpu-check.sh expects backend ABI '$script_abi', core/device.h says '$abi': update expected_abi"

# ---- pack: the folder (xz takes minutes on the full bundle: the archive path is checked on a
# small archive of the same manifest below) -----------------------------------------------------
bash "$src/scripts/bundle.sh" --build-dir "$build" --no-compress "$tmp/bundle"
top="$tmp/bundle"
[ -x "$top/bin/crosstrain" ] || fail "no bin/crosstrain in the bundle"
grep -q "\"backend_abi\": $abi," "$top/bundle.json" || fail "bundle.json lacks \"backend_abi\": $abi"
for f in $(sed -n 's/.*"path": "\([^"]*\)".*/\1/p' "$top/bundle.json"); do
  [ -f "$top/$f" ] || fail "bundle.json lists $f, which is not in the bundle"
done
bash "$src/scripts/gpu-check.sh" --bundle "$top" --check-only --out "$tmp/gc" ||
  fail "gpu-check.sh --check-only refused the bundle folder bundle.sh made"
# An archive as bundle.sh writes it (crosstrain-bundle/ at the top), with what the check reads.
small="$tmp/small/crosstrain-bundle"
mkdir -p "$small/bin"
cp "$top/bundle.json" "$small/"
cp "$top/bin/crosstrain" "$top/bin/test_ops" "$top/bin/test_model" "$top/bin/device_gemm_bench" "$small/bin/"
XZ_OPT=-0 tar -C "$tmp/small" -cJf "$tmp/small.tar.xz" crosstrain-bundle
bash "$src/scripts/gpu-check.sh" --bundle "$tmp/small.tar.xz" --check-only --out "$tmp/gc2" \
  --unpack-dir "$tmp/unpacked" ||
  fail "gpu-check.sh --check-only refused an archive of the bundle"
cmp -s "$top/bin/crosstrain" "$tmp/unpacked/crosstrain-bundle/bin/crosstrain" ||
  fail "gpu-check.sh did not unpack the archive into --unpack-dir/crosstrain-bundle"
lap "unpacked: $(find "$top" -type f | wc -l) files"

# ---- every ELF file resolves its libraries inside the bundle or to the allowed system ones ----
source "$src/scripts/bundle_libs.sh"
n_elf=0
while IFS= read -r f; do
  head -c4 "$f" | grep -q $'\x7fELF' || continue
  n_elf=$((n_elf + 1))
  rp="$(readelf -d "$f" | sed -n 's/.*(R\(UN\)\{0,1\}PATH).*\[\(.*\)\]/\2/p')"
  case "$rp" in
    '$ORIGIN'|'$ORIGIN:$ORIGIN/../lib') ;;
    *) fail "${f#"$top/"} has RUNPATH '$rp'" ;;
  esac
  # The HIP plugin's own libraries (ROCm) are the GPU stack's: not followed.
  case "$(basename "$f")" in libcrosstrain_backend_hip.so) continue ;; esac
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    case "$path" in "$top"/*) continue ;; esac
    is_base "$name" && continue
    is_gpu_stack "$name" && continue
    fail "${f#"$top/"}: $name resolves to '$path', outside the bundle"
  done < <(env -i PATH=/usr/bin:/bin ldd "$f" 2>/dev/null)
done < <(find "$top" -type f \( -path '*/bin/*' -o -path '*/lib/*' \) ! -path '*/test-data/*')
((n_elf >= 8)) || fail "only $n_elf ELF files in the bundle"
if grep -rlF "$build" "$top/bin" "$top/lib" >/dev/null 2>&1; then
  fail "bundle files name the build tree $build: $(grep -rlF "$build" "$top/bin" "$top/lib" | head -3)"
fi
lap "ldd: $n_elf ELF files resolve inside the bundle or to the base system"

# ---- run from the copy: empty LD_LIBRARY_PATH, the temporary folder as working directory ------
cd "$tmp"
run() { env -i PATH=/usr/bin:/bin HOME="$tmp" LD_LIBRARY_PATH= OMP_NUM_THREADS=2 \
          OMP_WAIT_POLICY=passive "$@"; }
# Libraries loaded at run time (dlopen: the Vulkan loader, oneDNN) come from the bundle too: the
# dynamic linker's own trace (LD_DEBUG=libs) names every library it initialises.
from_bundle() {  # from_bundle TRACE: every library initialised that the bundle has is the bundle's
  local lib
  for lib in "$top"/lib/*; do
    if grep -E "calling init: .*/$(basename "$lib")\$" "$1" | grep -qv "calling init: $top/"; then
      fail "$(basename "$lib") was loaded from outside the bundle: $(grep "calling init: .*$(basename "$lib")" "$1" | head -1)"
    fi
  done
}
run LD_DEBUG=libs LD_DEBUG_OUTPUT="$tmp/ld-devices" "$top/bin/crosstrain" devices >"$tmp/devices.txt" 2>&1 ||
  { cat "$tmp/devices.txt"; fail "crosstrain devices"; }
grep -q "cpu:0" "$tmp/devices.txt" || fail "crosstrain devices lists no cpu:0: $(cat "$tmp/devices.txt")"
cat "$tmp"/ld-devices.* >"$tmp/ld-devices.txt"
from_bundle "$tmp/ld-devices.txt"
if [ -f "$top/bin/libcrosstrain_backend_vulkan.so" ]; then
  grep -qE "calling init: $top/(bin/../)?lib/libvulkan.so.1$" "$tmp/ld-devices.txt" ||
    fail "crosstrain devices did not load the bundle's libvulkan.so.1"
fi
lap "crosstrain devices (the bundle's Vulkan loader)"
gelu='ReferenceGelu.*:On/Gelu.*'  # every device: cpu, simt, simt64, vulkan (lavapipe)
run "$top/bin/test_ops" --gtest_filter="$gelu" --gtest_brief=1 >"$tmp/gelu.txt" 2>&1 ||
  { tail -30 "$tmp/gelu.txt"; fail "test_ops --gtest_filter='$gelu' from the bundle"; }
grep -q "PASSED.*[1-9][0-9]* test" "$tmp/gelu.txt" || fail "test_ops ran no Gelu test"
lap "test_ops Gelu: $(sed -n 's/.*PASSED.*\] \([0-9]*\) test.*/\1/p' "$tmp/gelu.txt") passed"
golden='ReferenceOptimizerGolden.*'
run "$top/bin/test_ops" --gtest_filter="$golden" >"$tmp/golden.txt" 2>&1 ||
  { tail -20 "$tmp/golden.txt"; fail "test_ops --gtest_filter='$golden' from the bundle"; }
grep -q "PASSED.*[1-9][0-9]* test" "$tmp/golden.txt" || fail "no test matched $golden"
mv "$top/bin/test-data/optim" "$tmp/optim-aside"
if run "$top/bin/test_ops" --gtest_filter="$golden" >"$tmp/golden2.txt" 2>&1; then
  fail "test_ops $golden passed without the bundle's test-data/optim: it read another copy"
fi
mv "$tmp/optim-aside" "$top/bin/test-data/optim"
lap "optimizer golden test reads bin/test-data"
run "$top/bin/crosstrain" train --backend cpu:0 --model tiny --n-layer 2 --n-embd 64 --n-head 2 \
  --block-size 64 --per-device-train-batch-size 2 --max-steps 2 --eval-steps 0 \
  --max-eval-batches 1 --sample-tokens 0 --no-progress --data "$top/data/fortunes" \
  --output-dir "$tmp/run" >"$tmp/train.txt" 2>&1 || { cat "$tmp/train.txt"; fail "crosstrain train"; }
run LD_DEBUG=libs LD_DEBUG_OUTPUT="$tmp/ld-train" "$top/bin/crosstrain" train --backend cpu:0 \
  --model tiny --n-layer 1 --n-embd 64 --n-head 2 --block-size 32 --per-device-train-batch-size 1 \
  --max-steps 1 --eval-steps 0 --max-eval-batches 1 --sample-tokens 0 --no-progress --bf16 \
  --data "$top/data/fortunes" --output-dir "$tmp/run-bf16" >/dev/null 2>&1 || fail "crosstrain train --bf16"
cat "$tmp"/ld-train.* >"$tmp/ld-train.txt"
from_bundle "$tmp/ld-train.txt"
grep -q "^steps  *2 " "$tmp/train.txt" || fail "crosstrain train did not run 2 steps: $(cat "$tmp/train.txt")"
lap "crosstrain train, 2 steps"
# The check itself, dry (no GPU: --devices cpu:0, no suites), its report at the smallest size,
# packed as a GPU machine's run returns it: at most 8 files, the report's among them.
run bash "$top/scripts/gpu-check.sh" --bundle "$top" --devices cpu:0 --no-suites --pack \
  --out "$tmp/dry" -- --models tiny --steps 1 --batch 1 --iters 1 --precisions fp32 \
  >"$tmp/dry.txt" 2>&1 || { cat "$tmp/dry.txt" "$tmp/dry/steps.tsv"; fail "gpu-check.sh --devices cpu:0 (a dry run)"; }
n_out="$(find "$tmp/dry" -mindepth 1 -maxdepth 1 | wc -l)"
((n_out <= 8)) || fail "gpu-check.sh --pack left $n_out files: $(ls "$tmp/dry" | tr '\n' ' ')"
grep -q '"format": "crosstrain-report"' "$tmp/dry/report.json" || fail "gpu-check.sh wrote no crosstrain report"
grep -q '^| tiny | fp32 | [0-9]' "$tmp/dry/report.md" || fail "the dry run's report has no tiny tokens/s: $(cat "$tmp/dry/report.md")"
# (grep reads the whole list: with pipefail, an early exit of grep -q could fail tar on SIGPIPE)
grep -qx 'report-native.log' <(tar -tzf "$tmp/dry/logs.tar.gz") || fail "logs.tar.gz lacks the report's log"
lap "gpu-check.sh, dry on cpu:0 (the report only, packed: $n_out files)"

# ---- gpu-check.sh refuses what is not a bundle -------------------------------------------------
refused() {  # refused WHAT EXPECTED_TEXT ARGS...
  local what="$1" want="$2" rc=0
  shift 2
  bash "$src/scripts/gpu-check.sh" --check-only --out "$tmp/refused" "$@" >"$tmp/refused.txt" 2>&1 || rc=$?
  [ "$rc" = 2 ] || fail "gpu-check.sh --bundle $what: exit $rc, not 2: $(cat "$tmp/refused.txt")"
  grep -qF "$want" "$tmp/refused.txt" || fail "gpu-check.sh --bundle $what: no '$want' in: $(cat "$tmp/refused.txt")"
}
echo "not a bundle" >"$tmp/notes.txt"
refused "a text file" "refusing --bundle '$tmp/notes.txt': not an xz-compressed tar archive" --bundle "$tmp/notes.txt"
mkdir -p "$tmp/empty/x"
tar -C "$tmp/empty" -cJf "$tmp/other.tar.xz" x
refused "an archive of something else" "no crosstrain-bundle/bundle.json manifest" --bundle "$tmp/other.tar.xz"
refused "a folder without a manifest" "the folder has no bundle.json manifest" --bundle "$tmp/empty"
mkdir -p "$tmp/old"
sed "s/\"backend_abi\": $abi,/\"backend_abi\": $((abi - 1)),/" "$top/bundle.json" >"$tmp/old/bundle.json"
refused "an older ABI's bundle" "bundle.json says backend ABI '$((abi - 1))', this gpu-check expects $abi" --bundle "$tmp/old"
refused "a missing file" "no such file" --bundle "$tmp/nothing.tar.xz"
lap "gpu-check.sh refuses 5 kinds of non-bundles"
