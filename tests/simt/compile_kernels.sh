#!/usr/bin/env bash
# Compiles every kernel source under backends/gpu/kernels with a GPU compiler, the same files the
# SIMT runtime runs on the CPU. Exit 77 (ctest: skipped) when the compiler is not installed.
#   compile_kernels.sh nvcc|hipcc SOURCE_DIR
set -euo pipefail
compiler=$1 src=$2
case "$compiler" in
  nvcc) exe=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
        flags=(-std=c++20 -arch=sm_80 -Xcompiler=-Wall)
        # The matrix instructions: portable mma + ldmatrix (sm_75), PTX mma.sync (sm_80, sm_90).
        matrix_flags=(-std=c++20 -Xcompiler=-Wall -gencode=arch=compute_75,code=sm_75
                      -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90,code=sm_90) ;;
  hipcc) exe=$(command -v hipcc || echo /opt/rocm/bin/hipcc)
         flags=(-std=c++20 --offload-arch=gfx90a --offload-arch=gfx1030 -Wall)
         matrix_flags=("${flags[@]}") ;;
  *) echo "unknown compiler $compiler" >&2; exit 2 ;;
esac
if [ ! -x "$exe" ]; then
  echo "$compiler not available: kernels not compiled for it (skipped)"
  exit 77
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for cu in "$src"/backends/gpu/kernels/*.cu; do
  echo "$compiler ${cu#$src/}"
  "$exe" "${flags[@]}" -I"$src" -c "$cu" -o "$out/$(basename "$cu" .cu).o"
done
# Every entry point of backends/gpu/matrix_ops.h (the kernels use only some).
echo "$compiler tests/simt/matrix_ops_compile.cu"
"$exe" "${matrix_flags[@]}" -I"$src" -c "$src/tests/simt/matrix_ops_compile.cu" -o "$out/matrix_ops.o"
