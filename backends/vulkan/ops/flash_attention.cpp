// Fused causal self-attention (core/device.h flash_attention_*), forward and backward: the
// shaders of flash_attention.comp, one dispatch per batch element and kernel (workgroups of 64
// rows x heads). Only lse [B,NH,T] is saved; the backward keeps D = rowsum(dout * out) in an f32
// workspace [NH,T] between its two kernels. qkv, out, dout, dqkv f32 or all the same 16-bit type
// (the _f16 / _bf16 variants), computed in fp32. Grouped-query attention: qkv rows [C3] =
// q (NH heads) | k (NKV heads) | v (NKV heads), C3 = C + 2 NKV hs, query head h reading kv head
// h / (NH / NKV); the dk/dv kernel runs per kv head (workgroups of 64 key rows x NKV), each
// invocation summing over the group's query heads in order (no atomics, deterministic).
#include <cmath>

#include "backends/vulkan/ops/op_util.h"

namespace ct::vk {

struct FlashPush {
  uint32_t T, C, NH, NKV;
  float scale;
  uint32_t oo, olse, oqkv, odo, oout, od;
};
CT_VK_PUSH_SIZE(FlashPush, flash_fwd);
CT_VK_PUSH_MEMBER(FlashPush, flash_fwd, T);
CT_VK_PUSH_MEMBER(FlashPush, flash_fwd, NH);
CT_VK_PUSH_MEMBER(FlashPush, flash_fwd, NKV);
CT_VK_PUSH_MEMBER(FlashPush, flash_fwd, scale);
CT_VK_PUSH_MEMBER(FlashPush, flash_fwd, oo);
CT_VK_PUSH_MEMBER(FlashPush, flash_fwd, od);
CT_VK_PUSH_SIZE(FlashPush, flash_fwd_f16);
CT_VK_PUSH_SIZE(FlashPush, flash_fwd_bf16);
CT_VK_PUSH_SIZE(FlashPush, flash_bwd_q);
CT_VK_PUSH_SIZE(FlashPush, flash_bwd_q_f16);
CT_VK_PUSH_SIZE(FlashPush, flash_bwd_q_bf16);
CT_VK_PUSH_SIZE(FlashPush, flash_bwd_kv);
CT_VK_PUSH_SIZE(FlashPush, flash_bwd_kv_f16);
CT_VK_PUSH_SIZE(FlashPush, flash_bwd_kv_bf16);

namespace {
constexpr int64_t kFlashMaxHeadSize = 128;  // MAX_HS in flash_attention.comp
constexpr uint32_t kFlashRows = 64;         // ROWS

// out (or dout) [B,T,C]: hs = C / n_head.
int64_t flash_head_size(const char* op, const Tensor& out, int n_head) {
  const int64_t hs = out.shape[2] / n_head;
  if (hs > kFlashMaxHeadSize)
    fail(ErrorKind::kUnsupported, std::string(op) + ": head size " + std::to_string(hs) +
                                      " exceeds the Vulkan kernel's limit of 128");
  return hs;
}
}  // namespace

void VulkanDevice::flash_attention_forward_kernel(const Tensor& out, const Tensor& lse,
                                                  const Tensor& qkv, int n_head, int n_kv_head) {
  const int64_t hs = flash_head_size("flash_attention_forward", out, n_head);
  const int64_t B = qkv.shape[0], T = qkv.shape[1], C = out.shape[2], C3 = qkv.shape[2];
  const int64_t NH = n_head, NKV = n_kv_head;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hs)));
  const uint32_t gx = u32((T + kFlashRows - 1) / kFlashRows);
  const ShaderId id =
      h_variant(qkv.dtype, ShaderId::flash_fwd, ShaderId::flash_fwd_f16, ShaderId::flash_fwd_bf16);
  for (int64_t b = 0; b < B; ++b) {
    Bound bo = bind(out, b * T * C, T * C), bl = bind(lse, b * NH * T, NH * T);
    Bound bq = bind(qkv, b * T * C3, T * C3);
    dispatch(
        id, {bo, bl, bq},
        FlashPush{u32(T), u32(C), u32(NH), u32(NKV), scale, bo.first, bl.first, bq.first, 0, 0, 0},
        gx, u32(NH));
  }
}

void VulkanDevice::flash_attention_backward_kernel(const Tensor& dqkv, const Tensor& dout,
                                                   const Tensor& qkv, const Tensor& out,
                                                   const Tensor& lse, int n_head, int n_kv_head) {
  const int64_t hs = flash_head_size("flash_attention_backward", dout, n_head);
  const int64_t B = qkv.shape[0], T = qkv.shape[1], C = dout.shape[2], C3 = qkv.shape[2];
  const int64_t NH = n_head, NKV = n_kv_head;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hs)));
  const uint32_t gx = u32((T + kFlashRows - 1) / kFlashRows);
  const DType dt = qkv.dtype;
  const ShaderId q_id =
      h_variant(dt, ShaderId::flash_bwd_q, ShaderId::flash_bwd_q_f16, ShaderId::flash_bwd_q_bf16);
  const ShaderId kv_id = h_variant(dt, ShaderId::flash_bwd_kv, ShaderId::flash_bwd_kv_f16,
                                   ShaderId::flash_bwd_kv_bf16);
  Tensor dsave = workspace({NH * T}, DType::f32);  // D of one batch element
  Bound bD = bind(dsave);
  for (int64_t b = 0; b < B; ++b) {
    Bound bdq = bind(dqkv, b * T * C3, T * C3), bl = bind(lse, b * NH * T, NH * T);
    Bound bq = bind(qkv, b * T * C3, T * C3), bd = bind(dout, b * T * C, T * C);
    Bound bo = bind(out, b * T * C, T * C);
    const FlashPush p{u32(T),   u32(C),   u32(NH),  u32(NKV), scale,   bdq.first,
                      bl.first, bq.first, bd.first, bo.first, bD.first};
    dispatch(q_id, {bdq, bl, bq, bd, bo, bD}, p, gx, u32(NH));    // .y: query head
    dispatch(kv_id, {bdq, bl, bq, bd, bo, bD}, p, gx, u32(NKV));  // .y: kv head
  }
}

}  // namespace ct::vk
