#!/usr/bin/env bash
# The real cooperative-matrix modules' shared memory is synchronised by their barriers alone
# (scripts/spv_workgroup_noncoherent.py, run on each after glslang): every built module needs no
# further change; a fresh compile of one carries glslang's per-access MakePointerAvailable /
# MakePointerVisible on shared memory, loses them to the script, still passes spirv-val, and
# then has MakeAvailable | MakeVisible on every barrier's workgroup-memory semantics.
#   bash tests/vulkan/noncoherent_test.sh BUILD_DIR SOURCE_DIR TOOLS_PREFIX PYTHON3
# Exit 77 (skipped) where the build has no real coopmat modules.
set -euo pipefail
build=$1 src=$2 tools=$3 py=$4
spv=$build/generated/vulkan/spv
script=$src/scripts/spv_workgroup_noncoherent.py
mods=("$spv"/matmul_cm_*.spv "$spv"/flash_cm_*.spv)
[[ -e ${mods[0]} ]] || { echo "no real coopmat modules in $spv"; exit 77; }
glslang=glslangValidator val=spirv-val dis=spirv-dis
if [[ -x $tools/bin/glslangValidator ]]; then
  export LD_LIBRARY_PATH=$tools/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  glslang=$tools/bin/glslangValidator val=$tools/bin/spirv-val dis=$tools/bin/spirv-dis
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
for m in "${mods[@]}"; do
  out=$("$py" "$script" --verbose "$m" "$tmp/again.spv" 2>&1)
  if [[ $out != *": 0 accesses and barriers changed"* ]]; then
    echo "FAIL $(basename "$m") was built without the rewrite: $out"
    fail=1
  fi
done
# barrier semantics: every OpControlBarrier / OpMemoryBarrier's last operand, a %uint_N constant
barriers_ok() {
  "$dis" "$1" | awk '/OpControlBarrier|OpMemoryBarrier/ { s = $NF; sub(/^%uint_/, "", s);
    if (s !~ /^[0-9]+$/ || (int(s / 8192) % 4) != 3) bad++ } END { exit bad > 0 }'
}
"$glslang" -V --target-env vulkan1.3 -I"$src/shaders" -DFA_FWD -DH_F16 --quiet \
  -o "$tmp/fresh.spv" "$src/shaders/flash_attention_coopmat.comp"
before=$("$dis" "$tmp/fresh.spv" | grep -c 'MakePointerAvailable\|MakePointerVisible' || true)
out=$("$py" "$script" --verbose "$tmp/fresh.spv" "$tmp/patched.spv" 2>&1)
after=$("$dis" "$tmp/patched.spv" | grep -c 'MakePointerAvailable\|MakePointerVisible' || true)
echo "fresh flash_cm_fwd_f16: $before per-access operations -> $after; $out"
[[ $before -gt 0 && $after -eq 0 ]] || { echo "FAIL: the rewrite left per-access operations"; fail=1; }
"$val" --target-env vulkan1.3 "$tmp/patched.spv" || { echo "FAIL: spirv-val"; fail=1; }
barriers_ok "$tmp/patched.spv" || { echo "FAIL: a barrier without MakeAvailable | MakeVisible"; fail=1; }
barriers_ok "$tmp/fresh.spv" && { echo "FAIL: the fresh module's barriers had them already"; fail=1; }
exit $fail
