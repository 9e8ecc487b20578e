// Causal multi-head self-attention forward and backward.
// With bufferDeviceAddress (every device this backend meets in practice): per batch element,
// strided batched GEMMs over the heads (gemm(), the matmul shaders) and a row-wise softmax
// (attention_softmax.comp): S = scale q k^T, att = causal softmax(S), out = att v; backward
// datt = dout v^T, dpre = att (datt - rowsum(att datt)) scale, dq = dpre k, dk = dpre^T q,
// dv = att^T dout. Otherwise attention.comp, one invocation per (b, h, t) row.
// Work is split over batches so that att [b, NH, T, T] and qkv [b, T, 3C] fit one binding.
// 16 bits (core/device.h: qkv, out, att, dout, dqkv all the same h; GEMM path only): computed as
// the CPU does -- fp32 throughout from the widened inputs, rounding only the outputs. Forward:
// the scores and probabilities live in an f32 workspace (softmax _f16/_bf16 also writes the
// rounded att), out = att_f32 v; backward: datt/dpre f32 as before, att read as 16 bits.
#include <cmath>

#include "backends/vulkan/ops/op_util.h"

namespace ct::vk {

struct AttentionPush {
  uint32_t rows, T, C, NH;
  float scale;
  uint32_t oo, oatt, oqkv, odo, os;
};
CT_VK_PUSH_SIZE(AttentionPush, attention_fwd);
CT_VK_PUSH_MEMBER(AttentionPush, attention_fwd, rows);
CT_VK_PUSH_MEMBER(AttentionPush, attention_fwd, T);
CT_VK_PUSH_MEMBER(AttentionPush, attention_fwd, C);
CT_VK_PUSH_MEMBER(AttentionPush, attention_fwd, NH);
CT_VK_PUSH_MEMBER(AttentionPush, attention_fwd, scale);
CT_VK_PUSH_MEMBER(AttentionPush, attention_fwd, oo);
CT_VK_PUSH_MEMBER(AttentionPush, attention_fwd, oatt);
CT_VK_PUSH_MEMBER(AttentionPush, attention_fwd, oqkv);
CT_VK_PUSH_MEMBER(AttentionPush, attention_fwd, odo);
CT_VK_PUSH_MEMBER(AttentionPush, attention_fwd, os);
struct SoftmaxPush {
  uint32_t rows, T;
  float scale;
  uint32_t oatt, od, att_lo, att_hi, d_lo, d_hi;
};
CT_VK_PUSH_SIZE(SoftmaxPush, attention_softmax_fwd);
CT_VK_PUSH_MEMBER(SoftmaxPush, attention_softmax_fwd, oatt);
CT_VK_PUSH_MEMBER(SoftmaxPush, attention_softmax_fwd, d_hi);
static_assert(refl::attention_softmax_bwd::kPushSize == refl::attention_softmax_fwd::kPushSize);
static_assert(refl::attention_softmax_fwd_bf16::kPushSize ==
              refl::attention_softmax_fwd::kPushSize);
static_assert(refl::attention_softmax_bwd_f16::kPushSize == refl::attention_softmax_fwd::kPushSize);

static_assert(refl::attention_bwd_q::kPushSize == refl::attention_fwd::kPushSize &&
              refl::attention_bwd_kv::kPushSize == refl::attention_fwd::kPushSize);

namespace {
constexpr int64_t kMaxHeadSize = 128;  // MAX_HS in attention.comp

struct AttShape {
  int64_t B, T, C, NH, hs;
};

// out (or dout) [B,T,C] and qkv [B,T,3C], checked by core/op_checks.cpp; the head size is this
// backend's own limit.
AttShape attention_shape(const char* op, const Tensor& qkv, int n_head) {
  AttShape s{qkv.shape[0], qkv.shape[1], qkv.shape[2] / 3, n_head, 0};
  s.hs = s.C / n_head;
  if (s.hs > kMaxHeadSize)
    fail(ErrorKind::kUnsupported, std::string(op) + ": head size " + std::to_string(s.hs) +
                                      " exceeds the Vulkan kernel's limit of 128");
  return s;
}

// Batches per dispatch so every per-batch operand fits one binding.
int64_t batch_chunk(const VulkanDevice& d, const AttShape& s) {
  int64_t per = std::max({s.NH * s.T * s.T, 3 * s.T * s.C, int64_t{1}});
  int64_t bc = d.max_elems(4) / per;
  CT_REQUIRE(bc >= 1, "attention: one batch row (att " + std::to_string(s.NH * s.T * s.T) +
                          " floats) exceeds maxStorageBufferRange");
  return bc;
}
}  // namespace

// Bound b with its first element moved by `elems`.
Bound shifted(Bound b, int64_t elems) {
  b.first += static_cast<uint32_t>(elems);
  return b;
}

SoftmaxPush softmax_push(const Bound& att, const Bound& d, int64_t rows, int64_t T, float scale) {
  return SoftmaxPush{u32(rows),
                     u32(T),
                     scale,
                     att.first,
                     d.first,
                     static_cast<uint32_t>(att.addr),
                     static_cast<uint32_t>(att.addr >> 32),
                     static_cast<uint32_t>(d.addr),
                     static_cast<uint32_t>(d.addr >> 32)};
}
void VulkanDevice::attention_forward_kernel(const Tensor& out, const Tensor& att, const Tensor& qkv,
                                            int n_head) {
  AttShape s = attention_shape("attention_forward", qkv, n_head);
  float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.hs)));
  int64_t bc = batch_chunk(*this, s);
  const int64_t T = s.T, C = s.C, NH = s.NH, hs = s.hs;
  const DType dt = qkv.dtype;
  const bool h16 = is_h(dt);
  if (has_bda()) {
    Tensor sw;  // 16 bits: the f32 scores / probabilities of one batch element
    Bound bs;
    if (h16) sw = workspace({NH * T * T}, DType::f32), bs = bind(sw);
    for (int64_t b = 0; b < s.B; ++b) {
      Bound bq = bind(qkv, b * T * 3 * C, T * 3 * C);
      Bound ba = bind(att, b * NH * T * T, NH * T * T);
      Bound bo = bind(out, b * T * C, T * C);
      Bound bp = h16 ? bs : ba;  // where the f32 probabilities are formed
      GemmCall g;                // att[h] = q[h] k[h]^T (scaled in the softmax)
      g.batch = NH, g.M = T, g.N = T, g.K = hs;
      g.a = bq, g.sa = {hs, 3 * C, 1};
      g.b = shifted(bq, C), g.sb = {hs, 1, 3 * C};
      g.c = bp, g.sc = {T * T, T, 1}, g.bias = bp;
      g.ta = g.tb = dt;
      gemm(g);
      auto gr = grid(NH * T, 64);
      if (h16)
        dispatch(h_variant(dt, ShaderId::attention_softmax_fwd, ShaderId::attention_softmax_fwd_f16,
                           ShaderId::attention_softmax_fwd_bf16),
                 {bs, ba}, softmax_push(bs, ba, NH * T, T, scale), gr[0], gr[1]);
      else
        dispatch(ShaderId::attention_softmax_fwd, {ba}, softmax_push(ba, ba, NH * T, T, scale),
                 gr[0], gr[1]);
      GemmCall o;  // out[:, h] = att[h] v[h]
      o.batch = NH, o.M = T, o.N = hs, o.K = T;
      o.a = bp, o.sa = {T * T, T, 1};
      o.b = shifted(bq, 2 * C), o.sb = {hs, 3 * C, 1};
      o.c = bo, o.sc = {hs, C, 1}, o.bias = bo;
      o.tb = o.tc = dt;
      gemm(o);
    }
    return;
  }
  CT_CHECK(!h16, "attention: 16-bit needs bufferDeviceAddress");
  for (int64_t b0 = 0; b0 < s.B; b0 += bc) {
    int64_t nb = std::min(bc, s.B - b0);
    int64_t rows = nb * s.NH * s.T;
    Bound bo = bind(out, b0 * s.T * s.C, nb * s.T * s.C);
    Bound ba = bind(att, b0 * s.NH * s.T * s.T, rows * s.T);
    Bound bq = bind(qkv, b0 * s.T * 3 * s.C, nb * s.T * 3 * s.C);
    auto g = grid(rows, 64);
    dispatch(ShaderId::attention_fwd, {bo, ba, bq},
             AttentionPush{u32(rows), u32(s.T), u32(s.C), u32(s.NH), scale, bo.first, ba.first,
                           bq.first, 0, 0},
             g[0], g[1]);
  }
}

void VulkanDevice::attention_backward_kernel(const Tensor& dqkv, const Tensor& dout,
                                             const Tensor& qkv, const Tensor& att, int n_head) {
  AttShape s = attention_shape("attention_backward", qkv, n_head);
  float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.hs)));
  int64_t bc = batch_chunk(*this, s);
  const int64_t T = s.T, C = s.C, NH = s.NH, hs = s.hs;
  const DType dt = qkv.dtype;
  CT_CHECK(has_bda() || !is_h(dt), "attention: 16-bit needs bufferDeviceAddress");
  if (has_bda()) {
    Tensor datt = workspace({NH * T * T}, DType::f32);  // one batch element at a time
    Bound bd = bind(datt);
    for (int64_t b = 0; b < s.B; ++b) {
      Bound bq = bind(qkv, b * T * 3 * C, T * 3 * C);
      Bound bdq = bind(dqkv, b * T * 3 * C, T * 3 * C);
      Bound ba = bind(att, b * NH * T * T, NH * T * T);
      Bound bo = bind(dout, b * T * C, T * C);
      GemmCall g;  // datt[h] = dout[:, h] v[h]^T
      g.batch = NH, g.M = T, g.N = T, g.K = hs;
      g.a = bo, g.sa = {hs, C, 1};
      g.b = shifted(bq, 2 * C), g.sb = {hs, 1, 3 * C};
      g.c = bd, g.sc = {T * T, T, 1}, g.bias = bd;
      g.ta = g.tb = dt;
      gemm(g);
      auto gr = grid(NH * T, 64);
      dispatch(h_variant(dt, ShaderId::attention_softmax_bwd, ShaderId::attention_softmax_bwd_f16,
                         ShaderId::attention_softmax_bwd_bf16),
               {ba, bd}, softmax_push(ba, bd, NH * T, T, scale), gr[0], gr[1]);
      GemmCall dq;  // dq[h] = dpre[h] k[h]
      dq.batch = NH, dq.M = T, dq.N = hs, dq.K = T;
      dq.a = bd, dq.sa = {T * T, T, 1};
      dq.b = shifted(bq, C), dq.sb = {hs, 3 * C, 1};
      dq.c = bdq, dq.sc = {hs, 3 * C, 1}, dq.bias = bdq;
      dq.tb = dq.tc = dt;  // dpre f32
      gemm(dq);
      GemmCall dk = dq;  // dk[h] = dpre[h]^T q[h]
      dk.a = bd, dk.sa = {T * T, 1, T};
      dk.b = bq, dk.sb = {hs, 3 * C, 1};
      dk.c = shifted(bdq, C), dk.bias = dk.c;
      gemm(dk);
      GemmCall dv = dq;  // dv[h] = att[h]^T dout[:, h]
      dv.a = ba, dv.sa = {T * T, 1, T};
      dv.b = bo, dv.sb = {hs, C, 1};
      dv.c = shifted(bdq, 2 * C), dv.bias = dv.c;
      dv.ta = dt;  // att
      gemm(dv);
    }
    return;
  }
  Tensor rowsum = workspace({s.B * s.NH * s.T}, DType::f32);
  for (int64_t b0 = 0; b0 < s.B; b0 += bc) {
    int64_t nb = std::min(bc, s.B - b0);
    int64_t rows = nb * s.NH * s.T;
    Bound bd = bind(dqkv, b0 * s.T * 3 * s.C, nb * s.T * 3 * s.C);
    Bound ba = bind(att, b0 * s.NH * s.T * s.T, rows * s.T);
    Bound bq = bind(qkv, b0 * s.T * 3 * s.C, nb * s.T * 3 * s.C);
    Bound bo = bind(dout, b0 * s.T * s.C, nb * s.T * s.C);
    Bound bs = bind(rowsum, b0 * s.NH * s.T, rows);
    AttentionPush p{u32(rows), u32(s.T), u32(s.C), u32(s.NH), scale,
                    bd.first,  ba.first, bq.first, bo.first,  bs.first};
    auto g = grid(rows, 64);
    dispatch(ShaderId::attention_bwd_q, {bd, ba, bq, bo, bs}, p, g[0], g[1]);
    dispatch(ShaderId::attention_bwd_kv, {bd, ba, bq, bo, bs}, p, g[0], g[1]);
  }
}

}  // namespace ct::vk
