#!/usr/bin/env bash
# Does the Slang compiler in PyPI's slangpy emit valid SPIR-V for bf16 cooperative matrices?
# (issue #27 item 1: "evaluate it"). Downloads slangpy's wheel (no install), builds a 70-line
# driver against its libslang-compiler, compiles probe.slang, lists the SPIR-V's capabilities and
# bf16 matrix types, and validates the module with the spirv-val of .tools/coopmat
# (scripts/fetch_coopmat_tools.py). Needs PyPI, g++ and unzip; touches nothing outside
# .tools/slang and its work folder.
#   bash scripts/slang_bf16_probe/run.sh [SLANGPY_VERSION]   (default 0.43.1)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
version="${1:-0.43.1}"
dest="$root/.tools/slang/slangpy-$version"
work="$dest/probe"
mkdir -p "$work"
if [[ ! -f "$dest/.complete" ]]; then
  python3 -m pip download --quiet --no-deps "slangpy==$version" -d "$dest"
  unzip -q -o "$dest"/slangpy-"$version"-*.whl 'slangpy/include/*' 'slangpy/libslang*' -d "$dest"
  touch "$dest/.complete"
fi
lib="$(ls "$dest"/slangpy/libslang-compiler.so.* | head -1)"
g++ -std=c++17 -O1 -I"$dest/slangpy/include" "$here/slangc_min.cpp" "$lib" \
  -Wl,-rpath,"$dest/slangpy" -o "$work/slangc_min"
"$work/slangc_min" "$here/probe.slang" "$work/probe.spv" 2>"$work/diagnostics.txt"
tools="$root/.tools/coopmat/cmeel.prefix"
export LD_LIBRARY_PATH="$tools/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
"$tools/bin/spirv-dis" "$work/probe.spv" -o "$work/probe.spvasm"
echo "compiler: $(basename "$lib") (slangpy $version)"
grep -E 'OpCapability (CooperativeMatrixKHR|BFloat16)|OpExtension "SPV_KHR_(bfloat16|cooperative_matrix)"|BFloat16KHR|OpTypeCooperativeMatrixKHR|OpCooperativeMatrixMulAddKHR' \
  "$work/probe.spvasm" | sed 's/^ */  /'
"$tools/bin/spirv-val" --target-env vulkan1.3 "$work/probe.spv"
echo "spirv-val ($("$tools/bin/spirv-val" --version | head -1)): valid for Vulkan 1.3"
