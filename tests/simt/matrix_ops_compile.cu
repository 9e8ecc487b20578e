// Every entry point of backends/gpu/matrix_ops.h in one kernel, for tests/simt/compile_kernels.sh:
// nvcc builds it for sm_70 (the portable forms), sm_75 (ldmatrix), sm_80 and sm_90 (mma.sync),
// hipcc for gfx90a (MFMA) and gfx1030 (the portable forms). Never launched.
#include "backends/gpu/matrix_ops.h"

template <int WARP>
__global__ void CT_LAUNCH_BOUNDS(WARP) matrix_ops_all(float* out, const std::uint32_t* in) {
  CT_CHECK_LAUNCH_BOUNDS(WARP);
  CT_SHARED(std::uint16_t, tile, 4 * 8 * 8);
  const int lane = threadIdx.x;
  for (int i = lane; i < 4 * 8 * 8; i += WARP) tile[i] = static_cast<std::uint16_t>(in[i]);
  __syncthreads();
  // cp.async: the second half of the tile again from `in`, 16 bytes a lane (zeros from lane 8).
  if (lane < 16) ct_cp_async_16(tile + 128 + 8 * lane, in + 4 * lane, lane < 8 ? 16 : 0);
  ct_cp_async_commit();
  ct_cp_async_wait<0>();
  __syncthreads();
  const void* row = tile + 8 * (lane % 32);
  std::uint32_t r1[1], r2[2], r4[4], s1[1], s2[2], s4[4];
  ct_ldmatrix_x1(r1, row);
  ct_ldmatrix_x2(r2, row);
  ct_ldmatrix_x4(r4, row);
  ct_ldmatrix_x1_trans(s1, row);
  ct_ldmatrix_x2_trans(s2, row);
  ct_ldmatrix_x4_trans(s4, row);
  const std::uint32_t a[4] = {r4[0], r4[1], r4[2] ^ r1[0] ^ s1[0], r4[3] ^ r2[1] ^ s2[1]};
  const std::uint32_t b[2] = {s4[0] ^ r2[0], s4[1] ^ s2[0]};
  const std::uint32_t a2[2] = {s4[2], s4[3]};
  float c[4] = {0, 0, 0, 0}, c16[16] = {};
  ct_mma_m16n8k16_f16(c, a, b, c);
  ct_mma_m16n8k16_bf16(c, a, b, c);
  ct_mma_m16n8k8_tf32(c, a, b, c);
  if constexpr (WARP == 64) {
    ct_mfma_32x32x8_f16(c16, a2, b, c16);
    ct_mfma_32x32x8_bf16(c16, a2, b, c16);
    ct_mfma_16x16x16_f16(c, a2, b, c);
    ct_mfma_16x16x16_bf16(c, a2, b, c);
  }
  for (int i = 0; i < 4; ++i) out[lane * 20 + i] = ct_f32_to_tf32(c[i]);
  for (int i = 0; i < 16; ++i) out[lane * 20 + 4 + i] = c16[i];
}

template __global__ void matrix_ops_all<32>(float*, const std::uint32_t*);
#if !defined(CT_GPU_CUDA)
template __global__ void matrix_ops_all<64>(float*, const std::uint32_t*);
#endif
