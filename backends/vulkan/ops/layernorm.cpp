// LayerNorm forward (alone or after a residual add) and backward, fp32 statistics,
// deterministic. out and r (forward) and dout (backward) may be f16/bf16 (rounded to nearest
// even on store); everything else is f32.
// Shader: layernorm.comp.
#include "backends/vulkan/ops/op_util.h"

namespace ct::vk {

struct LnFwdPush {
  uint32_t N, C;
  float eps;
  uint32_t oo, om, ors, ox, ow, ob;
};
CT_VK_PUSH_SIZE(LnFwdPush, layernorm_fwd);
CT_VK_PUSH_MEMBER(LnFwdPush, layernorm_fwd, N);
CT_VK_PUSH_MEMBER(LnFwdPush, layernorm_fwd, C);
CT_VK_PUSH_MEMBER(LnFwdPush, layernorm_fwd, eps);
CT_VK_PUSH_MEMBER(LnFwdPush, layernorm_fwd, oo);
CT_VK_PUSH_MEMBER(LnFwdPush, layernorm_fwd, om);
CT_VK_PUSH_MEMBER(LnFwdPush, layernorm_fwd, ors);
CT_VK_PUSH_MEMBER(LnFwdPush, layernorm_fwd, ox);
CT_VK_PUSH_MEMBER(LnFwdPush, layernorm_fwd, ow);
CT_VK_PUSH_MEMBER(LnFwdPush, layernorm_fwd, ob);
CT_VK_PUSH_SIZE(LnFwdPush, layernorm_fwd_f16);
CT_VK_PUSH_SIZE(LnFwdPush, layernorm_fwd_bf16);

struct LnResPush {
  uint32_t N, C;
  float eps;
  uint32_t oo, om, ors, ox, ow, ob, ores, orin;
};
CT_VK_PUSH_SIZE(LnResPush, residual_layernorm_fwd);
CT_VK_PUSH_MEMBER(LnResPush, residual_layernorm_fwd, N);
CT_VK_PUSH_MEMBER(LnResPush, residual_layernorm_fwd, C);
CT_VK_PUSH_MEMBER(LnResPush, residual_layernorm_fwd, eps);
CT_VK_PUSH_MEMBER(LnResPush, residual_layernorm_fwd, oo);
CT_VK_PUSH_MEMBER(LnResPush, residual_layernorm_fwd, om);
CT_VK_PUSH_MEMBER(LnResPush, residual_layernorm_fwd, ors);
CT_VK_PUSH_MEMBER(LnResPush, residual_layernorm_fwd, ox);
CT_VK_PUSH_MEMBER(LnResPush, residual_layernorm_fwd, ow);
CT_VK_PUSH_MEMBER(LnResPush, residual_layernorm_fwd, ob);
CT_VK_PUSH_MEMBER(LnResPush, residual_layernorm_fwd, ores);
CT_VK_PUSH_MEMBER(LnResPush, residual_layernorm_fwd, orin);
CT_VK_PUSH_SIZE(LnResPush, residual_layernorm_fwd_f16);
CT_VK_PUSH_SIZE(LnResPush, residual_layernorm_fwd_bf16);

struct LnDxPush {
  uint32_t N, C, odx, odo, ox, ow, om, ors;
};
CT_VK_PUSH_SIZE(LnDxPush, layernorm_bwd_dx);
CT_VK_PUSH_MEMBER(LnDxPush, layernorm_bwd_dx, N);
CT_VK_PUSH_MEMBER(LnDxPush, layernorm_bwd_dx, C);
CT_VK_PUSH_MEMBER(LnDxPush, layernorm_bwd_dx, odx);
CT_VK_PUSH_MEMBER(LnDxPush, layernorm_bwd_dx, odo);
CT_VK_PUSH_MEMBER(LnDxPush, layernorm_bwd_dx, ox);
CT_VK_PUSH_MEMBER(LnDxPush, layernorm_bwd_dx, ow);
CT_VK_PUSH_MEMBER(LnDxPush, layernorm_bwd_dx, om);
CT_VK_PUSH_MEMBER(LnDxPush, layernorm_bwd_dx, ors);
CT_VK_PUSH_SIZE(LnDxPush, layernorm_bwd_dx_f16);
CT_VK_PUSH_SIZE(LnDxPush, layernorm_bwd_dx_bf16);

struct LnDwPush {
  uint32_t N, C, odw, odb, odo, ox, om, ors, R;
};
CT_VK_PUSH_SIZE(LnDwPush, layernorm_bwd_dwdb);
CT_VK_PUSH_MEMBER(LnDwPush, layernorm_bwd_dwdb, N);
CT_VK_PUSH_MEMBER(LnDwPush, layernorm_bwd_dwdb, C);
CT_VK_PUSH_MEMBER(LnDwPush, layernorm_bwd_dwdb, odw);
CT_VK_PUSH_MEMBER(LnDwPush, layernorm_bwd_dwdb, odb);
CT_VK_PUSH_MEMBER(LnDwPush, layernorm_bwd_dwdb, odo);
CT_VK_PUSH_MEMBER(LnDwPush, layernorm_bwd_dwdb, ox);
CT_VK_PUSH_MEMBER(LnDwPush, layernorm_bwd_dwdb, om);
CT_VK_PUSH_MEMBER(LnDwPush, layernorm_bwd_dwdb, ors);
CT_VK_PUSH_MEMBER(LnDwPush, layernorm_bwd_dwdb, R);
CT_VK_PUSH_SIZE(LnDwPush, layernorm_bwd_dwdb_f16);
CT_VK_PUSH_SIZE(LnDwPush, layernorm_bwd_dwdb_bf16);

// Rows per dispatch so that [rows, C] fits one binding.
static int64_t row_chunk(const VulkanDevice& d, int64_t C) {
  return std::max<int64_t>(1, d.max_elems(4) / std::max<int64_t>(C, 1));
}

void VulkanDevice::layernorm_forward_kernel(const Tensor& out, const Tensor& mean,
                                            const Tensor& rstd, const Tensor& x, const Tensor& w,
                                            const Tensor& b, float eps) {
  int64_t C = x.shape[-1], N = C ? x.numel() / C : 0;
  int64_t rows = row_chunk(*this, C);
  Bound bw = bind(w), bb = bind(b);
  for (int64_t r0 = 0; r0 < N; r0 += rows) {
    int64_t nr = std::min(rows, N - r0);
    Bound bo = bind(out, r0 * C, nr * C), bm = bind(mean, r0, nr), br = bind(rstd, r0, nr),
          bx = bind(x, r0 * C, nr * C);
    auto g = grid(norm_row_groups(nr), 1);
    dispatch(
        h_variant(out.dtype, ShaderId::layernorm_fwd, ShaderId::layernorm_fwd_f16,
                  ShaderId::layernorm_fwd_bf16),
        {bo, bm, br, bx, bw, bb},
        LnFwdPush{u32(nr), u32(C), eps, bo.first, bm.first, br.first, bx.first, bw.first, bb.first},
        g[0], g[1]);
  }
}

void VulkanDevice::residual_layernorm_forward_kernel(const Tensor& residual, const Tensor& out,
                                                     const Tensor& mean, const Tensor& rstd,
                                                     const Tensor& x, const Tensor& r,
                                                     const Tensor& w, const Tensor& b, float eps) {
  int64_t C = x.shape[-1], N = C ? x.numel() / C : 0;
  int64_t rows = row_chunk(*this, C);
  Bound bw = bind(w), bb = bind(b);
  for (int64_t r0 = 0; r0 < N; r0 += rows) {
    int64_t nr = std::min(rows, N - r0);
    Bound bo = bind(out, r0 * C, nr * C), bm = bind(mean, r0, nr), br = bind(rstd, r0, nr),
          bx = bind(x, r0 * C, nr * C), bres = bind(residual, r0 * C, nr * C),
          bin = bind(r, r0 * C, nr * C);
    auto g = grid(norm_row_groups(nr), 1);
    dispatch(h_variant(out.dtype, ShaderId::residual_layernorm_fwd,
                       ShaderId::residual_layernorm_fwd_f16, ShaderId::residual_layernorm_fwd_bf16),
             {bo, bm, br, bx, bw, bb, bres, bin},
             LnResPush{u32(nr), u32(C), eps, bo.first, bm.first, br.first, bx.first, bw.first,
                       bb.first, bres.first, bin.first},
             g[0], g[1]);
  }
}

void VulkanDevice::layernorm_backward_kernel(const Tensor& dx, const Tensor& dw, const Tensor& db,
                                             const Tensor& dout, const Tensor& x, const Tensor& w,
                                             const Tensor& mean, const Tensor& rstd) {
  int64_t C = x.shape[-1], N = C ? x.numel() / C : 0;
  if (N == 0) return;
  int64_t rows = row_chunk(*this, C);
  // dw, db in two passes (add_column_partials): pieces of whole kColumnRows-row chunks
  rows = std::min(rows, kColumnRows * 65535);
  rows = std::max<int64_t>(kColumnRows, rows / kColumnRows * kColumnRows);
  const int64_t chunks = (N + kColumnRows - 1) / kColumnRows;
  Tensor part = workspace({2 * chunks * C}, DType::f32);  // dw's partials, then db's
  Bound bw = bind(w);
  for (int64_t r0 = 0; r0 < N; r0 += rows) {
    int64_t nr = std::min(rows, N - r0);
    Bound bdx = bind(dx, r0 * C, nr * C), bdo = bind(dout, r0 * C, nr * C),
          bx = bind(x, r0 * C, nr * C), bm = bind(mean, r0, nr), br = bind(rstd, r0, nr);
    auto g = grid(norm_row_groups(nr), 1);
    dispatch(
        h_variant(dout.dtype, ShaderId::layernorm_bwd_dx, ShaderId::layernorm_bwd_dx_f16,
                  ShaderId::layernorm_bwd_dx_bf16),
        {bdx, bdo, bx, bw, bm, br},
        LnDxPush{u32(nr), u32(C), bdx.first, bdo.first, bx.first, bw.first, bm.first, br.first},
        g[0], g[1]);
    auto gc = grid(C, 256);
    const int64_t k0 = r0 / kColumnRows, pc = (nr + kColumnRows - 1) / kColumnRows;
    Bound bpw = bind(part, k0 * C, pc * C), bpb = bind(part, (chunks + k0) * C, pc * C);
    dispatch(h_variant(dout.dtype, ShaderId::layernorm_bwd_dwdb, ShaderId::layernorm_bwd_dwdb_f16,
                       ShaderId::layernorm_bwd_dwdb_bf16),
             {bpw, bpb, bdo, bx, bm, br},
             LnDwPush{u32(nr), u32(C), bpw.first, bpb.first, bdo.first, bx.first, bm.first,
                      br.first, u32(kColumnRows)},
             gc[0], gc[1], u32(pc));
  }
  add_column_partials(bind(dw), bind(part, 0, chunks * C), chunks, C);
  add_column_partials(bind(db), bind(part, chunks * C, chunks * C), chunks, C);
}

}  // namespace ct::vk
