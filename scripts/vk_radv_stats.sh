#!/usr/bin/env bash
# What Mesa's RADV compiler (ACO) makes of the Vulkan backend's attention and coopmat shaders for
# AMD GPUs this machine does not have: RADV's "null hardware" (RADV_FORCE_FAMILY) compiles
# pipelines without a GPU, and bench/vk_shader_stats prints their statistics (VGPRs, spills,
# scratch a workgroup, instructions). The specializations are those the backend picks there:
# the scalar flash attention's plain modules and _u modules at head sizes 64 and 128 (2 and 4
# invocations a row; ops/flash_attention.cpp), the coopmat GEMM's 128 and 64 tiles and the coopmat
# flash kernels at subgroup 64 with 4 subgroups (ops/matmul.cpp, coopmat.cpp; RDNA3 only: RDNA2 has
# no cooperative matrices). Compiled, never run. For each pipeline: VGPRs, spills, scratch, the
# static instruction count, and for the GEMM the k loop's instructions per WMMA and its waits for
# LDS accesses (its body once; the coopmat GEMM's loop has no inner loops).
#
#   bash scripts/vk_radv_stats.sh [BUILD_DIR] [FAMILY ...]    # default: build navi21 navi31
set -euo pipefail
build=${1:-build}
shift || true
families=("$@")
[[ ${#families[@]} -gt 0 ]] || families=(navi21 navi31)
spv=$build/generated/vulkan/spv
icd=/usr/share/vulkan/icd.d/radeon_icd.json
[[ -x $build/bin/vk_shader_stats ]] || { echo "vk_shader_stats: not built in $build" >&2; exit 2; }
[[ -f $icd ]] || { echo "no RADV ICD ($icd): apt install mesa-vulkan-drivers" >&2; exit 2; }

# The _u modules with the host's lanes a row (specialization constants 1, 2: 2 lanes and 128
# invocations up to head size 64, 4 and 256 past it) and full subgroups.
scalar=()
for k in fwd bwd_q bwd_kv; do
  scalar+=("$spv/flash_${k}_bf16.spv" "$spv/flash_${k}_u_bf16.spv:spec=64,2,128:full"
           "$spv/flash_${k}_u_bf16.spv:spec=128,4,256:full")
done
# The GEMM's 128 and 64 tiles with 16-byte loads of a and b (VA = VB = 1) and 4-element stores
# of c (VC = 1), the last three constants: at subgroup 64 the 128 tile is 2 x 2 subgroups of
# 64 x 64; at subgroup 32 (the host's rule for drivers that require it) 2 x 4 of 64 x 32, shown
# beside the 2 x 2 it avoids.
coopmat=()
for m in matmul_cm_hhf_f16 matmul_cm_hhh_f16 matmul_cm_hhf_bf16; do
  coopmat+=("$spv/$m.spv:spec=256,16,16,16,2,2,4,4,32,1,1,1:sg=64:full"
            "$spv/$m.spv:spec=256,16,16,16,2,2,2,2,32,1,1,1:sg=64:full"
            "$spv/$m.spv:spec=256,16,16,16,2,4,4,2,32,1,1,1:sg=32:full"
            "$spv/$m.spv:spec=128,16,16,16,2,2,4,4,32,1,1,1:sg=32:full")
done
# The attention's tiles as plan_flash_cm picks them for RDNA3's 64 KiB at head size 64 and
# subgroup 64: forward 4 subgroups x 64 keys a step, dq and dk/dv 4 x 32 (dq's 4 x 64 would need
# 80 KiB).
coopmat+=("$spv/flash_cm_fwd_f16.spv:spec=256,16,16,16,4,1,64,64,1:sg=64:full")
for k in bwd_q bwd_kv; do
  coopmat+=("$spv/flash_cm_${k}_f16.spv:spec=256,16,16,16,4,1,32,64,1:sg=64:full")
done

summary() {  # one line a pipeline: the statistics that say where the rows live
  python3 -c '
import re, sys
for line in sys.stdin:
    if line.startswith("#"):
        print(line.rstrip()); continue
    name, _, rest = line.partition(": ")
    d = dict(re.findall(r" ?([A-Za-z ]+?) (-?[0-9.]+);", rest))
    if "VGPRs" not in d:
        print(line.rstrip()); continue
    print("%-58s VGPRs %4s  spilled %4s  scratch %7s  instructions %6s" % (
        name, d["VGPRs"], d.get("Spilled VGPRs"), d.get("Scratch size"), d.get("Instructions")))'
}

for fam in "${families[@]}"; do
  mods=("${scalar[@]}")
  [[ $fam == navi3* ]] && mods+=("${coopmat[@]}")
  RADV_FORCE_FAMILY=$fam VK_ICD_FILENAMES=$icd "$build/bin/vk_shader_stats" "${mods[@]}" 2>&1 |
    grep -v "ac_compute_device_uuid" | summary
done
# The coopmat GEMM's k loop on RDNA3: instructions around its WMMAs (the loop's body once).
if [[ " ${families[*]} " == *" navi31 "* ]]; then
  echo "# coopmat GEMM k loop, navi31 (scripts/radv_loops.py)"
  for mod in "${coopmat[@]}"; do
    [[ $mod == *matmul_cm_* ]] || continue
    echo "${mod#$spv/}"
    RADV_DEBUG=shaders RADV_FORCE_FAMILY=navi31 VK_ICD_FILENAMES=$icd "$build/bin/vk_shader_stats" \
      "$mod" 2>&1 | python3 "$(dirname "$0")/radv_loops.py" | grep "WMMA" | grep -v " 0 WMMA"
  done
fi
