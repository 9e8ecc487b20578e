# What a bundle leaves to the target machine (sourced by scripts/bundle.sh and
# tests/tools/bundle_test.sh, so the packer and its check agree): the base system's C and C++
# runtime, and the GPU stack that comes with the driver / CUDA / ROCm.
is_base() {
  case "$1" in
    linux-vdso.so.*|ld-linux*.so.*|libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*) return 0 ;;
    libstdc++.so.*|libgcc_s.so.*) return 0 ;;
  esac
  return 1
}
is_gpu_stack() {
  case "$1" in
    libcuda.so*|libcudart.so*|libcublas.so*|libcublasLt.so*|libnvidia-*|libnvrtc*) return 0 ;;
    libamdhip64.so*|libhiprtc*|librocblas.so*|libhsa-runtime64.so*|libamd_comgr.so*|librocm*) return 0 ;;
  esac
  return 1
}
