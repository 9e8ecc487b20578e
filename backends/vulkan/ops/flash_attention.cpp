// Fused causal self-attention (core/device.h flash_attention_*), forward and backward: the
// shaders of flash_attention.comp, one dispatch per batch element and kernel (workgroups of 64
// rows x heads). Only lse [B,NH,T] is saved; the backward keeps D = rowsum(dout * out) in an f32
// workspace [NH,T] between its two kernels. qkv, out, dout, dqkv f32 or all the same 16-bit type
// (the _f16 / _bf16 variants), computed in fp32. Grouped-query attention: qkv rows [C3] =
// q (NH heads) | k (NKV heads) | v (NKV heads), C3 = C + 2 NKV hs, query head h reading kv head
// h / (NH / NKV); the dk/dv kernel runs per kv head (workgroups of 64 key rows x NKV), each
// invocation summing over the group's query heads in order (no atomics, deterministic).
// The forward may take the last rows only (out [B,Tq,C], lse [B,NH,Tq]: positions T - Tq .. T - 1
// of qkv [B,T,C3]; sampling's key/value cache): the push block's odo slot (unused by the forward)
// carries q0 = T - Tq, and only the query blocks holding rows >= q0 run.
//
// Cooperative-matrix kernels (flash_attention_coopmat.comp, same contract): 16-bit tensors with
// head sizes 16..128 in steps of 16 take them where the coopmat GEMM is in use on the device
// (its gate and start-up self-test) and these kernels passed their part of that self-test
// (against the scalar shaders; the `coopmat GEMM` line says "flash attention on coopmat" or why
// not: ops/matmul.cpp), in the
// VK_KHR_cooperative_matrix build, or in the emulated one where that stands in
// (CROSSTRAIN_VK_COOPMAT=emulate). CROSSTRAIN_VK_FLASH=cme forces the emulated build (fragment
// shape CROSSTRAIN_VK_CM_FRAG, 16x16x16 by default; tests), =scalar the scalar shaders, =unrolled
// the scalar shaders' unrolled modules (scalar_flash: what GPUs run) on any device;
// CROSSTRAIN_VK_FLASH_TILE=NW,KT forces the tile (subgroups, streamed rows a step). Everything
// else -- f32, other head sizes, a fragment shape or shared memory the tiles do not fit -- takes
// the scalar shaders; `--profile` names the shaders that ran (flash_cm_* / flash_cme_* /
// flash_*).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backends/vulkan/ops/op_util.h"
#include "core/dtype.h"
#include "core/philox.h"

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
CT_VK_PUSH_MEMBER(FlashPush, flash_fwd, odo);  // FWD: q0
CT_VK_PUSH_MEMBER(FlashPush, flash_fwd, od);
CT_VK_PUSH_SIZE(FlashPush, flash_fwd_f16);
CT_VK_PUSH_SIZE(FlashPush, flash_fwd_bf16);
CT_VK_PUSH_SIZE(FlashPush, flash_bwd_q);
CT_VK_PUSH_SIZE(FlashPush, flash_bwd_q_f16);
CT_VK_PUSH_SIZE(FlashPush, flash_bwd_q_bf16);
CT_VK_PUSH_SIZE(FlashPush, flash_bwd_kv);
CT_VK_PUSH_SIZE(FlashPush, flash_bwd_kv_f16);
CT_VK_PUSH_SIZE(FlashPush, flash_bwd_kv_bf16);

CT_VK_PUSH_SIZE(FlashPush, flash_cme_fwd_f16);
CT_VK_PUSH_MEMBER(FlashPush, flash_cme_fwd_f16, odo);
CT_VK_PUSH_SIZE(FlashPush, flash_cme_bwd_q_bf16);
CT_VK_PUSH_SIZE(FlashPush, flash_cme_bwd_kv_f16);
CT_VK_PUSH_MEMBER(FlashPush, flash_cme_bwd_kv_f16, od);

namespace {
constexpr int64_t kFlashMaxHeadSize = 128;  // MAX_HS in flash_attention.comp
constexpr uint32_t kFlashRows = 64;         // ROWS

// [kernel][f16, bf16]: the emulated build, and the VK_KHR_cooperative_matrix one.
constexpr ShaderId kFlashCmeIds[3][2] = {
    {ShaderId::flash_cme_fwd_f16, ShaderId::flash_cme_fwd_bf16},
    {ShaderId::flash_cme_bwd_q_f16, ShaderId::flash_cme_bwd_q_bf16},
    {ShaderId::flash_cme_bwd_kv_f16, ShaderId::flash_cme_bwd_kv_bf16}};
#if defined(CT_VK_COOPMAT)
constexpr ShaderId kFlashCmIds[3][2] = {
    {ShaderId::flash_cm_fwd_f16, ShaderId::flash_cm_fwd_bf16},
    {ShaderId::flash_cm_bwd_q_f16, ShaderId::flash_cm_bwd_q_bf16},
    {ShaderId::flash_cm_bwd_kv_f16, ShaderId::flash_cm_bwd_kv_bf16}};
#endif

// out (or dout) [B,T,C]: hs = C / n_head.
int64_t flash_head_size(const char* op, const Tensor& out, int n_head) {
  const int64_t hs = out.shape[2] / n_head;
  if (hs > kFlashMaxHeadSize)
    fail(ErrorKind::kUnsupported, std::string(op) + ": head size " + std::to_string(hs) +
                                      " exceeds the Vulkan kernel's limit of 128");
  return hs;
}

// [kernel][f32, f16, bf16]: the scalar shaders, plain and with the loops over the head unrolled.
constexpr ShaderId kFlashIds[3][3] = {
    {ShaderId::flash_fwd, ShaderId::flash_fwd_f16, ShaderId::flash_fwd_bf16},
    {ShaderId::flash_bwd_q, ShaderId::flash_bwd_q_f16, ShaderId::flash_bwd_q_bf16},
    {ShaderId::flash_bwd_kv, ShaderId::flash_bwd_kv_f16, ShaderId::flash_bwd_kv_bf16}};
constexpr ShaderId kFlashUnrolledIds[3][3] = {
    {ShaderId::flash_fwd_u, ShaderId::flash_fwd_u_f16, ShaderId::flash_fwd_u_bf16},
    {ShaderId::flash_bwd_q_u, ShaderId::flash_bwd_q_u_f16, ShaderId::flash_bwd_q_u_bf16},
    {ShaderId::flash_bwd_kv_u, ShaderId::flash_bwd_kv_u_f16, ShaderId::flash_bwd_kv_u_bf16}};

// The scalar shader of `kernel` for a call of head size hs, and its specialization (HS_SPEC): on
// a GPU the _u module (the loops over the head unrolled) specialized to hs, so the rows can live
// in registers. The _u modules hold a row in L invocations (FA_PAIR: subgroup shuffles;
// specialization constants 1 and 2: L and the workgroup's 64 L invocations): L = 2 up to head
// size 64, 4 past it (flash_lanes), so an invocation holds at most 32 elements of each of its
// rows (the dk/dv kernel's k, v, dk, dv: 128 floats; RADV's ACO for RDNA2 and RDNA3,
// bench/vk_shader_stats: with one invocation a row the dk/dv kernel at head size 64 spilled 133
// VGPRs, 34 KiB of scratch a workgroup, at 128 722 and 130 KiB; with two at 128 200 and 50 KiB;
// now none at either). A device without subgroup shuffles takes the plain modules. Else, and on a
// CPU device, the plain module with HS_SPEC 0 (the bound read at run time: one pipeline for every
// head size, where lavapipe's JIT takes seconds for each unrolled one).
// CROSSTRAIN_VK_FLASH=unrolled takes the _u modules for every kernel on any device (the tests, on
// lavapipe), CROSSTRAIN_VK_FLASH_LANES=2|4 forces L. The pipelines ask for full subgroups where
// the device can be asked (`full`: computeFullSubgroups, and the workgroup a multiple of the
// largest subgroup size), so that the shader's subgroup numbering covers every row
// (flash_attention.comp).
uint32_t flash_lanes(int64_t hs) {
  if (const char* e = std::getenv("CROSSTRAIN_VK_FLASH_LANES"); e && *e) {
    CT_REQUIRE(std::strcmp(e, "2") == 0 || std::strcmp(e, "4") == 0,
               std::string("CROSSTRAIN_VK_FLASH_LANES=") + e + ": expected 2 or 4");
    return static_cast<uint32_t>(std::atoi(e));
  }
  return hs > 64 ? 4u : 2u;
}
bool lanes_full(const PhysicalDevice& pd, uint32_t lanes) {
  return pd.full_subgroups && pd.subgroup_max > 0 && (kFlashRows * lanes) % pd.subgroup_max == 0;
}
void scalar_flash(int kernel, DType dt, int64_t hs, const PhysicalDevice& pd, bool cpu,
                  ShaderId* id, PipelineSpec* spec) {
  const char* env = std::getenv("CROSSTRAIN_VK_FLASH");
  const bool unrolled = (!cpu || (env && std::strcmp(env, "unrolled") == 0)) && pd.subgroup_shuffle;
  const int di = dt == DType::f16 ? 1 : dt == DType::bf16 ? 2 : 0;
  *id = unrolled ? kFlashUnrolledIds[kernel][di] : kFlashIds[kernel][di];
  *spec = PipelineSpec{};
  spec->n = 1;
  spec->v[0] = unrolled ? static_cast<uint32_t>(hs) : 0u;
  if (unrolled) {
    const uint32_t lanes = flash_lanes(hs);
    spec->n = 3;
    spec->v[1] = lanes;
    spec->v[2] = kFlashRows * lanes;
    spec->full_subgroups = lanes_full(pd, lanes);
  }
}
}  // namespace

// The coopmat kernel for `kernel` on a 16-bit call with head size hs, or false (the scalar
// shaders): the rule in this file's header. Fills the shader, its specialization and the rows a
// workgroup takes.
bool VulkanDevice::flash_cm(int kernel, DType dt, int64_t hs, ShaderId* id, PipelineSpec* spec,
                            uint32_t* rows) {
  if (!is_h(dt)) return false;
  const char* env = std::getenv("CROSSTRAIN_VK_FLASH");
  const std::string mode = env ? env : "";
  bool emu = false;
  CmShape frag;
  if (mode == "cme") {
    const char* e = std::getenv("CROSSTRAIN_VK_CM_FRAG");
    CT_REQUIRE(parse_cm_frag(e, &frag),
               std::string("CROSSTRAIN_VK_CM_FRAG=") + e +
                   ": expected MxNxK with sides 8, 16 or 32 (e.g. 8x16x16)");
    emu = true;
  } else if (mode == "scalar" || mode == "unrolled" || cm_force_ < 0 ||
             (cm_force_ == 0 && !cm_flash_ok_)) {
    return false;
  } else {
    emu = cm_emulated_;
    frag = emu ? CmShape{16, 16, 16} : cm_gate_.shape;
  }
  uint32_t force_nw = 0, force_kt = 0;
  if (const char* t = std::getenv("CROSSTRAIN_VK_FLASH_TILE"); t && *t) {
    char tail = 0;
    CT_REQUIRE(std::sscanf(t, "%u,%u%c", &force_nw, &force_kt, &tail) == 2 &&
                   (force_nw == 1 || force_nw == 2 || force_nw == 4) &&
                   (force_kt == 16 || force_kt == 32 || force_kt == 64),
               std::string("CROSSTRAIN_VK_FLASH_TILE=") + t +
                   ": expected NW,KT with NW 1, 2 or 4 and KT 16, 32 or 64");
  }
  const uint32_t lanes = emu ? 32 : pd_.subgroup_size;
  const FlashCmPlan pl = plan_flash_cm(
      kernel, frag, lanes, pd_.props.limits.maxComputeSharedMemorySize, hs, force_nw, force_kt);
  if (!pl.ok) {
    CT_REQUIRE(!force_nw, "CROSSTRAIN_VK_FLASH_TILE: " + pl.why);
    return false;
  }
  const int hi = dt == DType::bf16 ? 1 : 0;
#if defined(CT_VK_COOPMAT)
  *id = emu ? kFlashCmeIds[kernel][hi] : kFlashCmIds[kernel][hi];
#else
  CT_CHECK(emu, "flash attention: no coopmat modules in this build");
  *id = kFlashCmeIds[kernel][hi];
#endif
  spec->n = 9;  // v[8]: VEC, per dispatch (flash_cm_vec)
  spec->v = {pl.nw * lanes, frag.m, frag.n, frag.k, pl.nw, pl.frm, pl.kt, u32(hs), 0};
  if (!emu) spec->required_subgroup = lanes, spec->full_subgroups = true;
  *rows = pl.rows;
  return true;
}

namespace {
// The backward's D workspace: at most this many bytes (batch elements in groups).
constexpr int64_t kFlashDBytes = int64_t(64) << 20;

// The coopmat kernels' VEC: 16-byte loads of a head slice's rows where every row starts 16 bytes
// aligned in each bound tensor (binding offset, first element, row length; head offsets are
// multiples of the head size, itself a multiple of 16). CROSSTRAIN_VK_FLASH_VEC=0 turns them off
// (the tests compare both forms).
uint32_t flash_cm_vec(std::initializer_list<std::pair<const Bound*, int64_t>> rows) {
  if (const char* v = std::getenv("CROSSTRAIN_VK_FLASH_VEC"); v && std::strcmp(v, "0") == 0)
    return 0;
  for (const auto& [b, row] : rows)
    if (b->offset % 16 != 0 || b->first % 8 != 0 || row % 8 != 0) return 0;
  return 1;
}
}  // namespace

void VulkanDevice::flash_attention_forward_kernel(const Tensor& out, const Tensor& lse,
                                                  const Tensor& qkv, int n_head, int n_kv_head) {
  const int64_t hs = flash_head_size("flash_attention_forward", out, n_head);
  const int64_t B = qkv.shape[0], T = qkv.shape[1], C = out.shape[2], C3 = qkv.shape[2];
  const int64_t Tq = out.shape[1], q0 = T - Tq;  // out's and lse's rows: positions q0 .. T - 1
  const int64_t NH = n_head, NKV = n_kv_head;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hs)));
  PipelineSpec spec;
  ShaderId id;
  uint32_t rows = kFlashRows;
  const bool cm = flash_cm(kFlashCmFwd, qkv.dtype, hs, &id, &spec, &rows);
  if (!cm) scalar_flash(kFlashCmFwd, qkv.dtype, hs, pd_, cpu_like(), &id, &spec);
  // the query blocks from the one holding row q0 (the shaders start there)
  const uint32_t gx = u32((T + rows - 1) / rows - q0 / rows);
  for (int64_t b = 0; b < B; ++b) {
    Bound bo = bind(out, b * Tq * C, Tq * C), bl = bind(lse, b * NH * Tq, NH * Tq);
    Bound bq = bind(qkv, b * T * C3, T * C3);
    if (cm) spec.v[8] = flash_cm_vec({{&bq, C3}});
    dispatch(id, &spec, {bo, bl, bq},
             FlashPush{u32(T), u32(C), u32(NH), u32(NKV), scale, bo.first, bl.first, bq.first,
                       u32(q0), 0, 0},
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
  const DType dt = qkv.dtype;
  ShaderId q_id, kv_id;
  PipelineSpec q_spec, kv_spec;
  uint32_t q_rows = kFlashRows, kv_rows = kFlashRows;
  // both kernels on one path (the D workspace is shared; either pair is consistent)
  bool cm = flash_cm(kFlashCmBwdQ, dt, hs, &q_id, &q_spec, &q_rows);
  if (cm && !flash_cm(kFlashCmBwdKv, dt, hs, &kv_id, &kv_spec, &kv_rows))
    cm = false, q_rows = kFlashRows;
  if (!cm) {
    scalar_flash(kFlashCmBwdQ, dt, hs, pd_, cpu_like(), &q_id, &q_spec);
    scalar_flash(kFlashCmBwdKv, dt, hs, pd_, cpu_like(), &kv_id, &kv_spec);
  }
  const uint32_t q_gx = u32((T + q_rows - 1) / q_rows), kv_gx = u32((T + kv_rows - 1) / kv_rows);
  // D (dout . out) of each batch element of a group: the dq dispatches of the group's elements
  // write disjoint ranges (dqkv's dq, D) and read the rest, so no barrier separates them and a
  // GPU may run them side by side (one element's dispatch is T / rows x NH workgroups: gpt2's
  // 16 x 12 would leave most of a large GPU idle); then one barrier (dqkv, D) and the dk/dv
  // dispatches, likewise. Groups of batch elements keep D's workspace within kFlashDBytes.
  const int64_t per_b = NH * T;
  const int64_t group =
      std::max<int64_t>(1, std::min<int64_t>(B, kFlashDBytes / (per_b * int64_t(sizeof(float)))));
  Tensor dsave = workspace({group * per_b}, DType::f32);
  for (int64_t b0 = 0; b0 < B; b0 += group) {
    const int64_t nb = std::min(group, B - b0);
    for (int pass = 0; pass < 2; ++pass) {
      for (int64_t b = b0; b < b0 + nb; ++b) {
        Bound bdq = bind(dqkv, b * T * C3, T * C3), bl = bind(lse, b * NH * T, NH * T);
        Bound bq = bind(qkv, b * T * C3, T * C3), bd = bind(dout, b * T * C, T * C);
        Bound bo = bind(out, b * T * C, T * C), bD = bind(dsave, (b - b0) * per_b, per_b);
        const FlashPush p{u32(T),   u32(C),   u32(NH),  u32(NKV), scale,   bdq.first,
                          bl.first, bq.first, bd.first, bo.first, bD.first};
        if (cm) q_spec.v[8] = kv_spec.v[8] = flash_cm_vec({{&bq, C3}, {&bd, C}});
        if (pass == 0)
          dispatch(q_id, &q_spec, {bdq, bl, bq, bd, bo, bD}, p, q_gx, u32(NH));  // .y: query head
        else
          dispatch(kv_id, &kv_spec, {bdq, bl, bq, bd, bo, bD}, p, kv_gx, u32(NKV));  // .y: kv head
      }
    }
  }
}

// Part of the coopmat self-test (ops/matmul.cpp, once the GEMM passed; a failure keeps the
// attention on the scalar shaders and the GEMM on coopmat): the coopmat flash
// attention kernels against the scalar shaders, forward and backward, on ragged shapes with
// grouped-query heads -- f16 at head size 64, bf16 at 32 with values past f16's range (v x 2^20,
// dout x 2^-20: the bf16 staging rule) -- within 1e-2 of the largest |out| or |dqkv| and 1e-3 of
// the largest |lse| (f16 P and dS against the scalar shaders' f32). CROSSTRAIN_VK_COOPMAT_INJECT=
// wrong_attention perturbs its outputs (the test of this test).
bool VulkanDevice::coopmat_flash_self_test(std::string* why) {
  struct Case {
    int64_t T, NH, NKV, hs;
    DType dt;
    float vscale, dscale;
  };
  const Case cases[] = {{37, 4, 2, 64, DType::f16, 1.0f, 1.0f},
                        {37, 2, 1, 32, DType::bf16, 1048576.0f, 1.0f / 1048576.0f}};
  const char* inject = std::getenv("CROSSTRAIN_VK_COOPMAT_INJECT");
  const bool wrong = inject && std::strstr(inject, "wrong_attention") != nullptr;
  const int saved = cm_force_;
  uint64_t seed = 100;
  for (const Case& c : cases) {
    const int64_t C = c.NH * c.hs, C3 = C + 2 * c.NKV * c.hs;
    // n normal values as c.dt, those at (i % row) >= from times vs
    auto host = [&](int64_t n, int64_t row, int64_t from, float vs) {
      Philox rng(seed++, 7);
      std::vector<uint16_t> bits(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        const float x = rng.normal(static_cast<uint64_t>(i)) * (i % row >= from ? vs : 1.0f);
        bits[static_cast<size_t>(i)] = c.dt == DType::bf16 ? f32_to_bf16(x) : f32_to_f16(x);
      }
      return bits;
    };
    const std::vector<uint16_t> hq = host(c.T * C3, C3, C + c.NKV * c.hs, c.vscale);
    const std::vector<uint16_t> hd = host(c.T * C, C, 0, c.dscale);
    Tensor qkv = empty({1, c.T, C3}, c.dt, MemCategory::kWorkspace);
    Tensor dout = empty({1, c.T, C}, c.dt, MemCategory::kWorkspace);
    upload(qkv, hq.data(), hq.size() * 2);
    upload(dout, hd.data(), hd.size() * 2);
    std::vector<float> res[2][3];  // [scalar, coopmat][out, lse, dqkv]
    for (int path = 0; path < 2; ++path) {
      cm_force_ = path == 0 ? -1 : 1;
      Tensor out = empty({1, c.T, C}, c.dt, MemCategory::kWorkspace);
      Tensor lse = empty({1, c.NH, c.T}, DType::f32, MemCategory::kWorkspace);
      Tensor dqkv = empty({1, c.T, C3}, c.dt, MemCategory::kWorkspace);
      flash_attention_forward(out, lse, qkv, int(c.NH), int(c.NKV));
      flash_attention_backward(dqkv, dout, qkv, out, lse, int(c.NH), int(c.NKV));
      auto get16 = [&](const Tensor& t, std::vector<float>& v) {
        std::vector<uint16_t> b(static_cast<size_t>(t.numel()));
        download(b.data(), t, b.size() * 2);
        v.resize(b.size());
        for (size_t i = 0; i < b.size(); ++i)
          v[i] = c.dt == DType::bf16 ? bf16_to_f32(b[i]) : f16_to_f32(b[i]);
      };
      get16(out, res[path][0]);
      res[path][1].resize(static_cast<size_t>(lse.numel()));
      download(res[path][1].data(), lse, res[path][1].size() * 4);
      get16(dqkv, res[path][2]);
    }
    cm_force_ = saved;
    if (wrong)
      for (float& v : res[1][0]) v *= 1.05f;
    const char* names[3] = {"out", "lse", "dqkv"};
    const double tols[3] = {1e-2, 1e-3, 1e-2};
    for (int k = 0; k < 3; ++k) {
      double top = 0, err = 0;
      for (size_t i = 0; i < res[0][k].size(); ++i) {
        top = std::max(top, std::fabs(double(res[0][k][i])));
        const double d = std::fabs(double(res[1][k][i]) - res[0][k][i]);
        err = std::isnan(d) ? INFINITY : std::max(err, d);
      }
      if (!(err <= tols[k] * top) || top == 0) {
        char line[200];
        std::snprintf(line, sizeof line,
                      "wrong attention: %s |diff| %.3g (max %.3g) at %s T %ld, %ld heads on %ld, "
                      "head size %ld",
                      names[k], err, top, dtype_name(c.dt), long(c.T), long(c.NH), long(c.NKV),
                      long(c.hs));
        *why = line;
        return false;
      }
    }
  }
  return true;
}

}  // namespace ct::vk
