// RMSNorm (Llama) forward (alone or after a residual add) and backward, fp32 statistics,
// deterministic. out and r (forward) and dout (backward) may be f16/bf16 (rounded to nearest
// even on store); everything else is f32.
// Shader: rmsnorm.comp.
#include "backends/vulkan/ops/op_util.h"

namespace ct::vk {

struct RmsFwdPush {
  uint32_t N, C;
  float eps;
  uint32_t oo, ors, ox, ow;
};
CT_VK_PUSH_SIZE(RmsFwdPush, rmsnorm_fwd);
CT_VK_PUSH_MEMBER(RmsFwdPush, rmsnorm_fwd, N);
CT_VK_PUSH_MEMBER(RmsFwdPush, rmsnorm_fwd, C);
CT_VK_PUSH_MEMBER(RmsFwdPush, rmsnorm_fwd, eps);
CT_VK_PUSH_MEMBER(RmsFwdPush, rmsnorm_fwd, oo);
CT_VK_PUSH_MEMBER(RmsFwdPush, rmsnorm_fwd, ors);
CT_VK_PUSH_MEMBER(RmsFwdPush, rmsnorm_fwd, ox);
CT_VK_PUSH_MEMBER(RmsFwdPush, rmsnorm_fwd, ow);
CT_VK_PUSH_SIZE(RmsFwdPush, rmsnorm_fwd_f16);
CT_VK_PUSH_SIZE(RmsFwdPush, rmsnorm_fwd_bf16);

struct RmsResPush {
  uint32_t N, C;
  float eps;
  uint32_t oo, ors, ox, ow, ores, orin;
};
CT_VK_PUSH_SIZE(RmsResPush, residual_rmsnorm_fwd);
CT_VK_PUSH_MEMBER(RmsResPush, residual_rmsnorm_fwd, N);
CT_VK_PUSH_MEMBER(RmsResPush, residual_rmsnorm_fwd, C);
CT_VK_PUSH_MEMBER(RmsResPush, residual_rmsnorm_fwd, eps);
CT_VK_PUSH_MEMBER(RmsResPush, residual_rmsnorm_fwd, oo);
CT_VK_PUSH_MEMBER(RmsResPush, residual_rmsnorm_fwd, ors);
CT_VK_PUSH_MEMBER(RmsResPush, residual_rmsnorm_fwd, ox);
CT_VK_PUSH_MEMBER(RmsResPush, residual_rmsnorm_fwd, ow);
CT_VK_PUSH_MEMBER(RmsResPush, residual_rmsnorm_fwd, ores);
CT_VK_PUSH_MEMBER(RmsResPush, residual_rmsnorm_fwd, orin);
CT_VK_PUSH_SIZE(RmsResPush, residual_rmsnorm_fwd_f16);
CT_VK_PUSH_SIZE(RmsResPush, residual_rmsnorm_fwd_bf16);

struct RmsDxPush {
  uint32_t N, C, odx, odo, ox, ow, ors;
};
CT_VK_PUSH_SIZE(RmsDxPush, rmsnorm_bwd_dx);
CT_VK_PUSH_MEMBER(RmsDxPush, rmsnorm_bwd_dx, N);
CT_VK_PUSH_MEMBER(RmsDxPush, rmsnorm_bwd_dx, C);
CT_VK_PUSH_MEMBER(RmsDxPush, rmsnorm_bwd_dx, odx);
CT_VK_PUSH_MEMBER(RmsDxPush, rmsnorm_bwd_dx, odo);
CT_VK_PUSH_MEMBER(RmsDxPush, rmsnorm_bwd_dx, ox);
CT_VK_PUSH_MEMBER(RmsDxPush, rmsnorm_bwd_dx, ow);
CT_VK_PUSH_MEMBER(RmsDxPush, rmsnorm_bwd_dx, ors);
CT_VK_PUSH_SIZE(RmsDxPush, rmsnorm_bwd_dx_f16);
CT_VK_PUSH_SIZE(RmsDxPush, rmsnorm_bwd_dx_bf16);

struct RmsDwPush {
  uint32_t N, C, odw, odo, ox, ors, R;
};
CT_VK_PUSH_SIZE(RmsDwPush, rmsnorm_bwd_dw);
CT_VK_PUSH_MEMBER(RmsDwPush, rmsnorm_bwd_dw, N);
CT_VK_PUSH_MEMBER(RmsDwPush, rmsnorm_bwd_dw, C);
CT_VK_PUSH_MEMBER(RmsDwPush, rmsnorm_bwd_dw, odw);
CT_VK_PUSH_MEMBER(RmsDwPush, rmsnorm_bwd_dw, odo);
CT_VK_PUSH_MEMBER(RmsDwPush, rmsnorm_bwd_dw, ox);
CT_VK_PUSH_MEMBER(RmsDwPush, rmsnorm_bwd_dw, ors);
CT_VK_PUSH_MEMBER(RmsDwPush, rmsnorm_bwd_dw, R);
CT_VK_PUSH_SIZE(RmsDwPush, rmsnorm_bwd_dw_f16);
CT_VK_PUSH_SIZE(RmsDwPush, rmsnorm_bwd_dw_bf16);

// Rows per dispatch so that [rows, C] fits one binding.
static int64_t rms_row_chunk(const VulkanDevice& d, int64_t C) {
  return std::max<int64_t>(1, d.max_elems(4) / std::max<int64_t>(C, 1));
}

void VulkanDevice::rmsnorm_forward_kernel(const Tensor& out, const Tensor& rstd, const Tensor& x,
                                          const Tensor& w, float eps) {
  int64_t C = x.shape[-1], N = C ? x.numel() / C : 0;
  int64_t rows = rms_row_chunk(*this, C);
  Bound bw = bind(w);
  for (int64_t r0 = 0; r0 < N; r0 += rows) {
    int64_t nr = std::min(rows, N - r0);
    Bound bo = bind(out, r0 * C, nr * C), br = bind(rstd, r0, nr), bx = bind(x, r0 * C, nr * C);
    auto g = grid(norm_row_groups(nr), 1);
    dispatch(h_variant(out.dtype, ShaderId::rmsnorm_fwd, ShaderId::rmsnorm_fwd_f16,
                       ShaderId::rmsnorm_fwd_bf16),
             {bo, br, bx, bw},
             RmsFwdPush{u32(nr), u32(C), eps, bo.first, br.first, bx.first, bw.first}, g[0], g[1]);
  }
}

void VulkanDevice::residual_rmsnorm_forward_kernel(const Tensor& residual, const Tensor& out,
                                                   const Tensor& rstd, const Tensor& x,
                                                   const Tensor& r, const Tensor& w, float eps) {
  int64_t C = x.shape[-1], N = C ? x.numel() / C : 0;
  int64_t rows = rms_row_chunk(*this, C);
  Bound bw = bind(w);
  for (int64_t r0 = 0; r0 < N; r0 += rows) {
    int64_t nr = std::min(rows, N - r0);
    Bound bo = bind(out, r0 * C, nr * C), br = bind(rstd, r0, nr), bx = bind(x, r0 * C, nr * C),
          bres = bind(residual, r0 * C, nr * C), bin = bind(r, r0 * C, nr * C);
    auto g = grid(norm_row_groups(nr), 1);
    dispatch(h_variant(out.dtype, ShaderId::residual_rmsnorm_fwd,
                       ShaderId::residual_rmsnorm_fwd_f16, ShaderId::residual_rmsnorm_fwd_bf16),
             {bo, br, bx, bw, bres, bin},
             RmsResPush{u32(nr), u32(C), eps, bo.first, br.first, bx.first, bw.first, bres.first,
                        bin.first},
             g[0], g[1]);
  }
}

void VulkanDevice::rmsnorm_backward_kernel(const Tensor& dx, const Tensor& dw, const Tensor& dout,
                                           const Tensor& x, const Tensor& w, const Tensor& rstd) {
  int64_t C = x.shape[-1], N = C ? x.numel() / C : 0;
  if (N == 0) return;
  int64_t rows = rms_row_chunk(*this, C);
  // dw in two passes (add_column_partials): pieces of whole kColumnRows-row chunks
  rows = std::min(rows, kColumnRows * 65535);
  rows = std::max<int64_t>(kColumnRows, rows / kColumnRows * kColumnRows);
  const int64_t chunks = (N + kColumnRows - 1) / kColumnRows;
  Tensor part = workspace({chunks * C}, DType::f32);
  Bound bw = bind(w);
  for (int64_t r0 = 0; r0 < N; r0 += rows) {
    int64_t nr = std::min(rows, N - r0);
    Bound bdx = bind(dx, r0 * C, nr * C), bdo = bind(dout, r0 * C, nr * C),
          bx = bind(x, r0 * C, nr * C), br = bind(rstd, r0, nr);
    auto g = grid(norm_row_groups(nr), 1);
    dispatch(h_variant(dout.dtype, ShaderId::rmsnorm_bwd_dx, ShaderId::rmsnorm_bwd_dx_f16,
                       ShaderId::rmsnorm_bwd_dx_bf16),
             {bdx, bdo, bx, bw, br},
             RmsDxPush{u32(nr), u32(C), bdx.first, bdo.first, bx.first, bw.first, br.first}, g[0],
             g[1]);
    auto gc = grid(C, 256);
    const int64_t pc = (nr + kColumnRows - 1) / kColumnRows;
    Bound bp = bind(part, r0 / kColumnRows * C, pc * C);
    dispatch(h_variant(dout.dtype, ShaderId::rmsnorm_bwd_dw, ShaderId::rmsnorm_bwd_dw_f16,
                       ShaderId::rmsnorm_bwd_dw_bf16),
             {bp, bdo, bx, br},
             RmsDwPush{u32(nr), u32(C), bp.first, bdo.first, bx.first, br.first, u32(kColumnRows)},
             gc[0], gc[1], u32(pc));
  }
  add_column_partials(bind(dw), bind(part), chunks, C);
}

}  // namespace ct::vk
