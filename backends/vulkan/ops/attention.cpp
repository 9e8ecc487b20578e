// Causal self-attention forward and backward, with grouped-query attention: NKV key/value heads,
// query head h reading kv head h / G (G = NH / NKV; G = 1 is plain multi-head attention), qkv
// rows [C3] = q (NH heads of hs) | k (NKV heads) | v (NKV heads), C3 = C + 2 NKV hs.
// With bufferDeviceAddress (every device this backend meets in practice): per batch element,
// strided batched GEMMs over the heads (gemm(), the matmul shaders) and a row-wise softmax
// (attention_softmax.comp): S = scale q k^T, att = causal softmax(S), out = att v; backward
// datt = dout v^T, dpre = att (datt - rowsum(att datt)) scale, dq = dpre k, dk = dpre^T q,
// dv = att^T dout. A GEMM's batch stride is uniform, so a product that pairs query head h with
// kv head h / G runs as G GEMMs, the g-th over the query heads j G + g (batch j < NKV); dk and
// dv of kv head j sum over g: G GEMMs chained through beta (g = 0 writes, the next accumulate),
// in order, so the result is deterministic. Otherwise attention.comp, one invocation per
// (b, h, t) row (the dk/dv kernel one per (b, j, u), looping over the group's query heads).
// Work is split over batches so that att [b, NH, T, T] and qkv [b, T, C3] fit one binding.
// 16 bits (core/device.h: qkv, out, att, dout, dqkv all the same h; GEMM path only): computed as
// the CPU does -- fp32 throughout from the widened inputs, rounding only the outputs. Forward:
// the scores and probabilities live in an f32 workspace (softmax _f16/_bf16 also writes the
// rounded att), out = att_f32 v; backward: datt/dpre f32 as before, att read as 16 bits. With
// G > 1 the backward gathers the gradient of a batch element in an f32 slab [T, C3] (the GEMMs
// read q and k from an f32 copy of qkv: dpre is f32, and the GEMM takes no f32 x 16-bit -> f32
// product) and rounds it into dqkv once, so a kv head's sum over its group is never rounded
// part way.
#include <cmath>

#include "backends/vulkan/ops/op_util.h"

namespace ct::vk {

struct AttentionPush {
  uint32_t rows, T, C, NH, NKV;
  float scale;
  uint32_t oo, oatt, oqkv, odo, os;
};
CT_VK_PUSH_SIZE(AttentionPush, attention_fwd);
CT_VK_PUSH_MEMBER(AttentionPush, attention_fwd, rows);
CT_VK_PUSH_MEMBER(AttentionPush, attention_fwd, T);
CT_VK_PUSH_MEMBER(AttentionPush, attention_fwd, C);
CT_VK_PUSH_MEMBER(AttentionPush, attention_fwd, NH);
CT_VK_PUSH_MEMBER(AttentionPush, attention_fwd, NKV);
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
  int64_t B, T, C, NH, NKV, hs, C3, G;
};

// out (or dout) [B,T,C] and qkv [B,T,C3], checked by core/op_checks.cpp; the head size is this
// backend's own limit.
AttShape attention_shape(const char* op, const Tensor& out, const Tensor& qkv, int n_head,
                         int n_kv_head) {
  AttShape s{qkv.shape[0], qkv.shape[1], out.shape[2], n_head, n_kv_head, 0, qkv.shape[2], 0};
  s.hs = s.C / n_head;
  s.G = s.NH / s.NKV;
  if (s.hs > kMaxHeadSize)
    fail(ErrorKind::kUnsupported, std::string(op) + ": head size " + std::to_string(s.hs) +
                                      " exceeds the Vulkan kernel's limit of 128");
  return s;
}

// Batches per dispatch so every per-batch operand fits one binding.
int64_t batch_chunk(const VulkanDevice& d, const AttShape& s) {
  int64_t per = std::max({s.NH * s.T * s.T, s.T * s.C3, int64_t{1}});
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
                                            int n_head, int n_kv_head) {
  AttShape s = attention_shape("attention_forward", out, qkv, n_head, n_kv_head);
  float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.hs)));
  int64_t bc = batch_chunk(*this, s);
  const int64_t T = s.T, C = s.C, NH = s.NH, NKV = s.NKV, hs = s.hs, C3 = s.C3, G = s.G;
  const DType dt = qkv.dtype;
  const bool h16 = is_h(dt);
  if (has_bda()) {
    Tensor sw;  // 16 bits: the f32 scores / probabilities of one batch element
    Bound bs;
    if (h16) sw = workspace({NH * T * T}, DType::f32), bs = bind(sw);
    for (int64_t b = 0; b < s.B; ++b) {
      Bound bq = bind(qkv, b * T * C3, T * C3);
      Bound ba = bind(att, b * NH * T * T, NH * T * T);
      Bound bo = bind(out, b * T * C, T * C);
      Bound bp = h16 ? bs : ba;  // where the f32 probabilities are formed
      for (int64_t g = 0; g < G; ++g) {
        GemmCall sg;  // att[h] = q[h] k[j]^T for h = j G + g (scaled in the softmax)
        sg.batch = NKV, sg.M = T, sg.N = T, sg.K = hs;
        sg.a = shifted(bq, g * hs), sg.sa = {G * hs, C3, 1};
        sg.b = shifted(bq, C), sg.sb = {hs, 1, C3};
        sg.c = shifted(bp, g * T * T), sg.sc = {G * T * T, T, 1}, sg.bias = sg.c;
        sg.ta = sg.tb = dt;
        gemm(sg);
      }
      auto gr = grid(NH * T, 64);
      if (h16)
        dispatch(h_variant(dt, ShaderId::attention_softmax_fwd, ShaderId::attention_softmax_fwd_f16,
                           ShaderId::attention_softmax_fwd_bf16),
                 {bs, ba}, softmax_push(bs, ba, NH * T, T, scale), gr[0], gr[1]);
      else
        dispatch(ShaderId::attention_softmax_fwd, {ba}, softmax_push(ba, ba, NH * T, T, scale),
                 gr[0], gr[1]);
      for (int64_t g = 0; g < G; ++g) {
        GemmCall o;  // out[:, h] = att[h] v[j] for h = j G + g
        o.batch = NKV, o.M = T, o.N = hs, o.K = T;
        o.a = shifted(bp, g * T * T), o.sa = {G * T * T, T, 1};
        o.b = shifted(bq, C + NKV * hs), o.sb = {hs, C3, 1};
        o.c = shifted(bo, g * hs), o.sc = {G * hs, C, 1}, o.bias = o.c;
        o.tb = o.tc = dt;
        gemm(o);
      }
    }
    return;
  }
  CT_CHECK(!h16, "attention: 16-bit needs bufferDeviceAddress");
  for (int64_t b0 = 0; b0 < s.B; b0 += bc) {
    int64_t nb = std::min(bc, s.B - b0);
    int64_t rows = nb * NH * T;
    Bound bo = bind(out, b0 * T * C, nb * T * C);
    Bound ba = bind(att, b0 * NH * T * T, rows * T);
    Bound bq = bind(qkv, b0 * T * C3, nb * T * C3);
    auto g = grid(rows, 64);
    dispatch(ShaderId::attention_fwd, {bo, ba, bq},
             AttentionPush{u32(rows), u32(T), u32(C), u32(NH), u32(NKV), scale, bo.first, ba.first,
                           bq.first, 0, 0},
             g[0], g[1]);
  }
}

void VulkanDevice::attention_backward_kernel(const Tensor& dqkv, const Tensor& dout,
                                             const Tensor& qkv, const Tensor& att, int n_head,
                                             int n_kv_head) {
  AttShape s = attention_shape("attention_backward", dout, qkv, n_head, n_kv_head);
  float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.hs)));
  int64_t bc = batch_chunk(*this, s);
  const int64_t T = s.T, C = s.C, NH = s.NH, NKV = s.NKV, hs = s.hs, C3 = s.C3, G = s.G;
  const DType dt = qkv.dtype;
  CT_CHECK(has_bda() || !is_h(dt), "attention: 16-bit needs bufferDeviceAddress");
  if (has_bda()) {
    Tensor datt = workspace({NH * T * T}, DType::f32);  // one batch element at a time
    Bound bd = bind(datt);
    // 16 bits with G > 1: q, k read from an f32 copy of the batch element's qkv, the gradient
    // gathered in an f32 slab and rounded into dqkv at the end (the file comment).
    const bool slab = is_h(dt) && G > 1;
    Tensor q32, d32;
    Bound bq32, bd32;
    if (slab) {
      q32 = workspace({T * C3}, DType::f32), bq32 = bind(q32);
      d32 = workspace({T * C3}, DType::f32), bd32 = bind(d32);
    }
    const DType qt = slab ? DType::f32 : dt;  // q, k of the dq / dk products, and their c
    for (int64_t b = 0; b < s.B; ++b) {
      Bound bq = bind(qkv, b * T * C3, T * C3);
      Bound bdq = bind(dqkv, b * T * C3, T * C3);
      Bound ba = bind(att, b * NH * T * T, NH * T * T);
      Bound bo = bind(dout, b * T * C, T * C);
      for (int64_t g = 0; g < G; ++g) {
        GemmCall dg;  // datt[h] = dout[:, h] v[j]^T for h = j G + g
        dg.batch = NKV, dg.M = T, dg.N = T, dg.K = hs;
        dg.a = shifted(bo, g * hs), dg.sa = {G * hs, C, 1};
        dg.b = shifted(bq, C + NKV * hs), dg.sb = {hs, 1, C3};
        dg.c = shifted(bd, g * T * T), dg.sc = {G * T * T, T, 1}, dg.bias = dg.c;
        dg.ta = dg.tb = dt;
        gemm(dg);
      }
      auto gr = grid(NH * T, 64);
      dispatch(h_variant(dt, ShaderId::attention_softmax_bwd, ShaderId::attention_softmax_bwd_f16,
                         ShaderId::attention_softmax_bwd_bf16),
               {ba, bd}, softmax_push(ba, bd, NH * T, T, scale), gr[0], gr[1]);
      if (slab) copy_kernel(q32, qkv.slice_flat(b * T * C3, {T * C3}));
      const Bound qs = slab ? bq32 : bq;    // q and k of the dq / dk products
      const Bound dst = slab ? bd32 : bdq;  // where the gradient is formed
      for (int64_t g = 0; g < G; ++g) {
        GemmCall dq;  // dq[h] = dpre[h] k[j] for h = j G + g
        dq.batch = NKV, dq.M = T, dq.N = hs, dq.K = T;
        dq.a = shifted(bd, g * T * T), dq.sa = {G * T * T, T, 1};
        dq.b = shifted(qs, C), dq.sb = {hs, C3, 1};
        dq.c = shifted(dst, g * hs), dq.sc = {G * hs, C3, 1}, dq.bias = dq.c;
        dq.tb = dq.tc = qt;  // dpre f32
        gemm(dq);
      }
      for (int64_t g = 0; g < G; ++g) {
        GemmCall dk;  // dk[j] (+)= dpre[h]^T q[h] for h = j G + g
        dk.batch = NKV, dk.M = T, dk.N = hs, dk.K = T;
        dk.a = shifted(bd, g * T * T), dk.sa = {G * T * T, 1, T};
        dk.b = shifted(qs, g * hs), dk.sb = {G * hs, C3, 1};
        dk.c = shifted(dst, C), dk.sc = {hs, C3, 1}, dk.bias = dk.c;
        dk.beta = g == 0 ? 0.0f : 1.0f;
        dk.tb = dk.tc = qt;
        gemm(dk);
      }
      for (int64_t g = 0; g < G; ++g) {
        GemmCall dv;  // dv[j] (+)= att[h]^T dout[:, h] for h = j G + g
        dv.batch = NKV, dv.M = T, dv.N = hs, dv.K = T;
        dv.a = shifted(ba, g * T * T), dv.sa = {G * T * T, 1, T};
        dv.b = shifted(bo, g * hs), dv.sb = {G * hs, C, 1};
        dv.c = shifted(dst, C + NKV * hs), dv.sc = {hs, C3, 1}, dv.bias = dv.c;
        dv.beta = g == 0 ? 0.0f : 1.0f;
        dv.ta = dv.tb = dt;  // att, dout
        dv.tc = qt;
        gemm(dv);
      }
      if (slab) copy_kernel(dqkv.slice_flat(b * T * C3, {T * C3}), d32);
    }
    return;
  }
  Tensor rowsum = workspace({s.B * NH * T}, DType::f32);
  for (int64_t b0 = 0; b0 < s.B; b0 += bc) {
    int64_t nb = std::min(bc, s.B - b0);
    int64_t rows = nb * NH * T;
    Bound bd = bind(dqkv, b0 * T * C3, nb * T * C3);
    Bound ba = bind(att, b0 * NH * T * T, rows * T);
    Bound bq = bind(qkv, b0 * T * C3, nb * T * C3);
    Bound bo = bind(dout, b0 * T * C, nb * T * C);
    Bound bs = bind(rowsum, b0 * NH * T, rows);
    AttentionPush p{u32(rows), u32(T),   u32(C),   u32(NH),  u32(NKV), scale,
                    bd.first,  ba.first, bq.first, bo.first, bs.first};
    auto g = grid(rows, 64);
    dispatch(ShaderId::attention_bwd_q, {bd, ba, bq, bo, bs}, p, g[0], g[1]);
    // dk, dv: one invocation per (b, kv head j, key row u), summing over the group in order
    AttentionPush pkv = p;
    pkv.rows = u32(nb * NKV * T);
    auto gkv = grid(nb * NKV * T, 64);
    dispatch(ShaderId::attention_bwd_kv, {bd, ba, bq, bo, bs}, pkv, gkv[0], gkv[1]);
  }
}

}  // namespace ct::vk
