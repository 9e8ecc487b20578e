// matmul (all transposes, batch and broadcast, bias, alpha/beta), its GELU epilogues and
// bias_backward.
// Shaders: matmul.comp (MM_REG for CPU-like devices, MM_TILED for GPUs), matmul_coopmat.comp
// (its emulated build, on request), bias_backward.comp.
// Operands larger than maxStorageBufferRange are split over batch, M, N and (with beta
// chaining) K until every binding fits.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "backends/vulkan/matmul_kind.h"
#include "backends/vulkan/ops/op_util.h"
#include "core/dtype.h"
#include "core/philox.h"

namespace ct::vk {

struct MatmulPush {
  uint32_t M, N, K;
  uint32_t oa, sam, sak, sab;
  uint32_t ob, sbk, sbn, sbb;
  uint32_t oc, scm, scb;
  uint32_t obias, has_bias;
  float alpha, beta;
  uint32_t a_lo, a_hi, b_lo, b_hi;
  uint32_t c_lo, c_hi, c_vec;
  uint32_t ksplit, kchunk;
  uint32_t oe, epi;
};
CT_VK_PUSH_SIZE(MatmulPush, matmul_reg);
CT_VK_PUSH_MEMBER(MatmulPush, matmul_reg, M);
CT_VK_PUSH_MEMBER(MatmulPush, matmul_reg, N);
CT_VK_PUSH_MEMBER(MatmulPush, matmul_reg, K);
CT_VK_PUSH_MEMBER(MatmulPush, matmul_reg, oa);
CT_VK_PUSH_MEMBER(MatmulPush, matmul_reg, sam);
CT_VK_PUSH_MEMBER(MatmulPush, matmul_reg, sak);
CT_VK_PUSH_MEMBER(MatmulPush, matmul_reg, sab);
CT_VK_PUSH_MEMBER(MatmulPush, matmul_reg, ob);
CT_VK_PUSH_MEMBER(MatmulPush, matmul_reg, sbk);
CT_VK_PUSH_MEMBER(MatmulPush, matmul_reg, sbn);
CT_VK_PUSH_MEMBER(MatmulPush, matmul_reg, sbb);
CT_VK_PUSH_MEMBER(MatmulPush, matmul_reg, oc);
CT_VK_PUSH_MEMBER(MatmulPush, matmul_reg, scm);
CT_VK_PUSH_MEMBER(MatmulPush, matmul_reg, scb);
CT_VK_PUSH_MEMBER(MatmulPush, matmul_reg, obias);
CT_VK_PUSH_MEMBER(MatmulPush, matmul_reg, has_bias);
CT_VK_PUSH_MEMBER(MatmulPush, matmul_reg, alpha);
CT_VK_PUSH_MEMBER(MatmulPush, matmul_reg, beta);
CT_VK_PUSH_MEMBER(MatmulPush, matmul_reg, a_lo);
CT_VK_PUSH_MEMBER(MatmulPush, matmul_reg, b_hi);
CT_VK_PUSH_MEMBER(MatmulPush, matmul_reg, c_vec);
CT_VK_PUSH_MEMBER(MatmulPush, matmul_tiled, ksplit);
CT_VK_PUSH_MEMBER(MatmulPush, matmul_tiled, kchunk);
CT_VK_PUSH_MEMBER(MatmulPush, matmul_cme_hhf_f16, ksplit);
CT_VK_PUSH_MEMBER(MatmulPush, matmul_cme_hhf_f16, kchunk);
CT_VK_PUSH_MEMBER(MatmulPush, matmul_reg, oe);
CT_VK_PUSH_MEMBER(MatmulPush, matmul_tiled, oe);
CT_VK_PUSH_MEMBER(MatmulPush, matmul_cme_hhh_f16, oe);
CT_VK_PUSH_MEMBER(MatmulPush, matmul_reg, epi);
CT_VK_PUSH_MEMBER(MatmulPush, matmul_tiled, epi);
CT_VK_PUSH_MEMBER(MatmulPush, matmul_cme_hhh_f16, epi);
static_assert(refl::matmul_vec_kn::kPushSize == refl::matmul_reg::kPushSize);
static_assert(refl::matmul_tiled::kPushSize == refl::matmul_reg::kPushSize);
static_assert(refl::matmul_vsg_kn::kPushSize == refl::matmul_reg::kPushSize);
static_assert(refl::matmul_vsg64_kn::kPushSize == refl::matmul_reg::kPushSize);
static_assert(refl::matmul_vsg_ss_hhh_bf16::kPushSize == refl::matmul_reg::kPushSize);
static_assert(refl::matmul_tiled_fhh_f16::kPushSize == refl::matmul_reg::kPushSize);
static_assert(refl::matmul_cme_hhh_bf16::kPushSize == refl::matmul_reg::kPushSize);
static_assert(refl::matmul_cme_hhf_f16::kPushSize == refl::matmul_reg::kPushSize);

struct SplitkPush {
  uint32_t M, N, batch, S;
  uint32_t opart, oc, scm, scb;
  uint32_t obias, has_bias;
  float alpha, beta;
  uint32_t oe, epi;
};
CT_VK_PUSH_SIZE(SplitkPush, matmul_splitk);
CT_VK_PUSH_SIZE(SplitkPush, matmul_splitk_bf16);
CT_VK_PUSH_MEMBER(SplitkPush, matmul_splitk, S);
CT_VK_PUSH_MEMBER(SplitkPush, matmul_splitk, opart);
CT_VK_PUSH_MEMBER(SplitkPush, matmul_splitk, has_bias);
CT_VK_PUSH_MEMBER(SplitkPush, matmul_splitk, beta);
CT_VK_PUSH_MEMBER(SplitkPush, matmul_splitk_f16, oe);
CT_VK_PUSH_MEMBER(SplitkPush, matmul_splitk_f16, epi);

struct BiasGradPush {
  uint32_t M, N, odb, odo, R;
};
CT_VK_PUSH_SIZE(BiasGradPush, bias_backward);
CT_VK_PUSH_MEMBER(BiasGradPush, bias_backward, M);
CT_VK_PUSH_MEMBER(BiasGradPush, bias_backward, N);
CT_VK_PUSH_MEMBER(BiasGradPush, bias_backward, odb);
CT_VK_PUSH_MEMBER(BiasGradPush, bias_backward, odo);
CT_VK_PUSH_MEMBER(BiasGradPush, bias_backward, R);
CT_VK_PUSH_SIZE(BiasGradPush, bias_backward_f16);
CT_VK_PUSH_SIZE(BiasGradPush, bias_backward_bf16);

namespace {

// Element strides of one operand: element (z, i, j) at z*sb + i*si + j*sj.
struct Strides {
  int64_t sb, si, sj;
};

// A sub-problem: batches [z0, z0+zc), rows [m0, m0+mc), columns [n0, n0+nc), depth [k0, k0+kc).
struct Box {
  int64_t z0, zc, m0, mc, n0, nc, k0, kc;
};

// First element and element count spanned by (z, i, j) ranges.
std::pair<int64_t, int64_t> span(const Strides& s, int64_t z0, int64_t zc, int64_t i0, int64_t ic,
                                 int64_t j0, int64_t jc) {
  int64_t first = z0 * s.sb + i0 * s.si + j0 * s.sj;
  int64_t last = (z0 + zc - 1) * s.sb + (i0 + ic - 1) * s.si + (j0 + jc - 1) * s.sj;
  return {first, last - first + 1};
}

// CROSSTRAIN_VK_MATMUL=vsg64|vsg|vec|reg|tiled overrides the per-device choice
// (default_mm_kind(), matmul_kind.h); the tests run every variant.
// vsg: MM_VEC with MM_SG (a subgroup of 8 shares a's loads), where has_sg8().
// vsg64: vsg reading f32 operands' vec4s as two 64-bit words (B_U64), the default where the
// device also has shaderInt64: lavapipe gathers each component of a per-lane load on its own, and
// a 64-bit component brings two floats per gather (+8-12% when introduced; measurements in
// backends/vulkan/README.md).

// CROSSTRAIN_VK_MATMUL=cme: the emulated build of the cooperative-matrix GEMM
// (matmul_coopmat.comp with CM_EMU) for products of two 16-bit operands (hhf, hhh), with the
// fragment shape of CROSSTRAIN_VK_CM_FRAG=MxNxK (16x16x16 by default; cm8e and cm16e are
// 8x8x8 and 16x16x16); every other product takes the device's default. The emulation runs
// anywhere, so the coopmat kernel's tiling, indexing, split-k and edges are tested on lavapipe.
struct CmEmulation {
  bool on = false;
  CmShape frag;
};
CmEmulation coopmat_emulation() {
  const char* v = std::getenv("CROSSTRAIN_VK_MATMUL");
  if (!v || !*v) return {};
  if (std::strcmp(v, "cm8e") == 0) return {true, {8, 8, 8}};
  if (std::strcmp(v, "cm16e") == 0) return {true, {16, 16, 16}};
  if (std::strcmp(v, "cme") != 0) return {};
  CmShape f;
  const char* e = std::getenv("CROSSTRAIN_VK_CM_FRAG");
  CT_REQUIRE(parse_cm_frag(e, &f), std::string("CROSSTRAIN_VK_CM_FRAG=") + e +
                                       ": expected MxNxK with sides 8, 16 or 32 (e.g. 8x16x16)");
  return {true, f};
}
// A test or benchmark override: the integer in `name`, or 0 where unset.
int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : 0;
}
// [combo hhf, hhh][f16, bf16]: the emulated build, specialized like the real one.
constexpr ShaderId kCmEmuIds[2][2] = {
    {ShaderId::matmul_cme_hhf_f16, ShaderId::matmul_cme_hhf_bf16},
    {ShaderId::matmul_cme_hhh_f16, ShaderId::matmul_cme_hhh_bf16}};
#if defined(CT_VK_COOPMAT)
// ... and the VK_KHR_cooperative_matrix build (f16 fragments; bf16 staged as scaled f16).
constexpr ShaderId kCmIds[2][2] = {{ShaderId::matmul_cm_hhf_f16, ShaderId::matmul_cm_hhf_bf16},
                                   {ShaderId::matmul_cm_hhh_f16, ShaderId::matmul_cm_hhh_bf16}};
#endif

// The coopmat GEMM's workgroup: warps_m x warps_n subgroups, each a wm x wn block of fragments,
// k staged tbk deep. 128 x 128 tiles where the product still has at least kBigTileGroups of
// them, else 64 x 64 (2 x 2 subgroups of 32 x 32; CROSSTRAIN_VK_CM_TILE=64|128 forces one). The
// 128 tile is 2 x 2 subgroups of 64 x 64 where that is at most kCmAccPerLane accumulator floats
// a lane (subgroups of 64: AMD RDNA3), else 2 x 4 of 64 x 32 (subgroups of 32: NVIDIA, and the
// emulated build): 64 x 64 at subgroup 32 is 128 floats a lane (bf16 twice that, with its k-step
// temporaries), past NVIDIA's 255 registers with bf16, and RADV compiling for RDNA3 at subgroup
// 32 put f16's in scratch (16 KiB a workgroup) where 2 x 4 needs 144 VGPRs and bf16's 240, none
// spilled (scripts/vk_radv_stats.sh).
struct CmPlan {
  uint32_t warps_m = 2, warps_n = 2, wm = 32, wn = 32, tbk = 32;
  int64_t tile_m() const { return warps_m * wm; }
  int64_t tile_n() const { return warps_n * wn; }
};
constexpr int64_t kBigTileGroups = 256;
constexpr uint32_t kCmAccPerLane = 64;

MmKind pick_kind(const VulkanDevice& d) {
  if (const char* v = std::getenv("CROSSTRAIN_VK_MATMUL"); v && *v) {
    if (std::strcmp(v, "vsg") == 0) return d.has_sg8() ? MmKind::kVsg : MmKind::kVec;
    if (std::strcmp(v, "vsg64") == 0)
      return d.has_sg8() ? (d.has_int64() ? MmKind::kVsg64 : MmKind::kVsg) : MmKind::kVec;
    if (std::strcmp(v, "vec") == 0) return MmKind::kVec;
    if (std::strcmp(v, "reg") == 0) return MmKind::kReg;
    if (std::strcmp(v, "tiled") == 0) return MmKind::kTiled;
  }
  return default_mm_kind(d.cpu_like(), d.has_bda(), d.has_sg8(), d.has_int64());
}

// matmul_vec_<a><b>: how each operand is read (see matmul.comp), indexed [a mode][b mode] with
// a: 0 = along k, 1 = along m, 2 = scalar; b: 0 = along n, 1 = along k, 2 = scalar.
constexpr ShaderId kVecIds[3][3] = {
    {ShaderId::matmul_vec_kn, ShaderId::matmul_vec_kk, ShaderId::matmul_vec_ks},
    {ShaderId::matmul_vec_mn, ShaderId::matmul_vec_mk, ShaderId::matmul_vec_ms},
    {ShaderId::matmul_vec_sn, ShaderId::matmul_vec_sk, ShaderId::matmul_vec_ss}};
// vsg64: b along n or k read as 64-bit pairs (no scalar-b variant: those take vsg).
// [a mode][b mode] of a 64-bit-load family, b along n or k only.
#define CT_U64_IDS(fam)                                               \
  {                                                                   \
    {ShaderId::matmul_##fam##_kn, ShaderId::matmul_##fam##_kk},       \
        {ShaderId::matmul_##fam##_mn, ShaderId::matmul_##fam##_mk}, { \
      ShaderId::matmul_##fam##_sn, ShaderId::matmul_##fam##_sk        \
    }                                                                 \
  }
constexpr ShaderId kVsg64Ids[3][2] = CT_U64_IDS(vsg64);
// The same with two 4-deep k steps per loop iteration (MM_KU = 2), for K % 8 == 0: lavapipe
// blends and spills each loop-carried accumulator once per iteration. When introduced (8-row
// blocks), vulkan_gemm_bench, idle, three runs against the 4-deep loop: 1024x384x1536 59.0-61.5
// vs 52.3-56.4 GFLOP/s, 512^3 50.8-55.7 vs 45.5-53.1; the K = 384 shapes within noise.
constexpr ShaderId kVsg64k8Ids[3][2] = CT_U64_IDS(vsg64k8);
#undef CT_U64_IDS
// a along m (a^T rows 4 KB and more apart, tn products such as dW = x^T dout): four 4-deep k
// steps per iteration where K % 16 == 0. vulkan_gemm_bench --layout tn, idle, 3 A/B runs
// against k8: tiny shapes +0-5% (one run +9-10%); for nn and nt it was -3..+1%, so only here.
constexpr ShaderId kVsg64k16MIds[2] = {ShaderId::matmul_vsg64k16_mn, ShaderId::matmul_vsg64k16_mk};
constexpr ShaderId kVsgIds[3][3] = {
    {ShaderId::matmul_vsg_kn, ShaderId::matmul_vsg_kk, ShaderId::matmul_vsg_ks},
    {ShaderId::matmul_vsg_mn, ShaderId::matmul_vsg_mk, ShaderId::matmul_vsg_ms},
    {ShaderId::matmul_vsg_sn, ShaderId::matmul_vsg_sk, ShaderId::matmul_vsg_ss}};

// 16-bit variants (backends/vulkan/CMakeLists.txt), [combo hhf, hhh, fhh][f16, bf16].
#define CT_VSG_H(sfx)                                                                              \
  {                                                                                                \
    {ShaderId::matmul_vsg_kn_##sfx, ShaderId::matmul_vsg_kk_##sfx, ShaderId::matmul_vsg_ks_##sfx}, \
        {ShaderId::matmul_vsg_mn_##sfx, ShaderId::matmul_vsg_mk_##sfx,                             \
         ShaderId::matmul_vsg_ms_##sfx},                                                           \
    {                                                                                              \
      ShaderId::matmul_vsg_sn_##sfx, ShaderId::matmul_vsg_sk_##sfx, ShaderId::matmul_vsg_ss_##sfx  \
    }                                                                                              \
  }
constexpr ShaderId kVsgH[3][2][3][3] = {{CT_VSG_H(hhf_f16), CT_VSG_H(hhf_bf16)},
                                        {CT_VSG_H(hhh_f16), CT_VSG_H(hhh_bf16)},
                                        {CT_VSG_H(fhh_f16), CT_VSG_H(fhh_bf16)}};
#undef CT_VSG_H
constexpr ShaderId kRegH[3][2] = {{ShaderId::matmul_reg_hhf_f16, ShaderId::matmul_reg_hhf_bf16},
                                  {ShaderId::matmul_reg_hhh_f16, ShaderId::matmul_reg_hhh_bf16},
                                  {ShaderId::matmul_reg_fhh_f16, ShaderId::matmul_reg_fhh_bf16}};
constexpr ShaderId kTiledH[3][2] = {
    {ShaderId::matmul_tiled_hhf_f16, ShaderId::matmul_tiled_hhf_bf16},
    {ShaderId::matmul_tiled_hhh_f16, ShaderId::matmul_tiled_hhh_bf16},
    {ShaderId::matmul_tiled_fhh_f16, ShaderId::matmul_tiled_fhh_bf16}};

// vec4 loads along an operand's dimension with unit stride need every vec4 to start at a
// multiple of 4 elements: the base, the batch stride and the other dimension's stride.
// `unit` is the stride-1 dimension's extent (rows of 4 must not straddle it).
// The bound range's address must be aligned to 4 elements too (16 bytes f32, 8 bytes 16-bit).
bool vec_ok(const Bound& bd, size_t esize, int64_t sbatch, int64_t sother, int64_t unit_extent) {
  return bd.first % 4 == 0 && bd.addr % (4 * esize) == 0 && sbatch % 4 == 0 && sother % 4 == 0 &&
         unit_extent % 4 == 0;
}

// The tiled GEMM's vec4s and the coopmat GEMM's 16-byte groups read through the binding itself
// (no device addresses), so the bound range's offset must be aligned too: `width` elements a
// load, every group aligned (the binding's offset, the first element, the other strides) and the
// unit-stride extent a multiple of `width`, so that each group lies wholly inside or outside.
bool binding_vec_ok(const Bound& bd, size_t esize, int64_t sbatch, int64_t sother,
                    int64_t unit_extent, int64_t width) {
  return bd.offset % (width * esize) == 0 && bd.first % width == 0 && sbatch % width == 0 &&
         sother % width == 0 && unit_extent % width == 0;
}
bool tiled_vec_ok(const Bound& bd, size_t esize, int64_t sbatch, int64_t sother,
                  int64_t unit_extent) {
  return binding_vec_ok(bd, esize, sbatch, sother, unit_extent, 4);
}
// The coopmat epilogue's stores of 4 elements of a row of c (matmul_coopmat.comp's VC): every
// row starts at a multiple of 4 elements of a binding aligned to 4 of them (groups that cross N
// are written element by element, so N itself may be anything).
bool c_vec4_ok(const Bound& bd, size_t esize, int64_t sbatch, int64_t srow) {
  return bd.offset % (4 * esize) == 0 && bd.first % 4 == 0 && sbatch % 4 == 0 && srow % 4 == 0;
}

}  // namespace

void VulkanDevice::matmul_kernel(const Tensor& c, const Tensor& a, const Tensor& b,
                                 const MatmulDims& d, bool trans_a, bool trans_b, float alpha,
                                 float beta, const Tensor* bias) {
  matmul_split(c, a, b, d, trans_a, trans_b, alpha, beta, bias, GemmCall::Epilogue::kNone, nullptr);
}

void VulkanDevice::matmul_split(const Tensor& c, const Tensor& a, const Tensor& b,
                                const MatmulDims& d, bool trans_a, bool trans_b, float alpha,
                                float beta, const Tensor* bias, GemmCall::Epilogue epi,
                                const Tensor* ep) {
  const int64_t M = d.M, N = d.N, K = d.K, batch = d.batch;
  std::string shapes = " (c " + c.describe() + ", a " + a.describe() + (trans_a ? "^T" : "") +
                       ", b " + b.describe() + (trans_b ? "^T" : "") + ")";
  if (batch == 0 || M == 0 || N == 0) return;
  Strides sa =
      trans_a ? Strides{d.a_batched ? M * K : 0, 1, M} : Strides{d.a_batched ? M * K : 0, K, 1};
  Strides sb =
      trans_b ? Strides{d.b_batched ? K * N : 0, 1, K} : Strides{d.b_batched ? K * N : 0, N, 1};
  Strides sc{M * N, N, 1};
  int64_t limit = max_elems(4);
  // CPU-type devices: K runs in pieces chained through beta like the range splits below, at most
  // 512 with a transposed (dW = x^T dout), 768 for a b with N >= 768. With K large every
  // workgroup walks thousands of pages of a^T (rows a whole row of x apart) and of b (rows N
  // apart), the eight subgroups one after another, and the TLB does not hold them. Lavapipe,
  // idle A/B of vulkan_gemm_bench: tn 384x1536x1024 50.8 -> 63.5 GFLOP/s, 768x3072x1024 47.5 ->
  // 56.3; nn 1024x768x3072 59.3 -> 65.5, 1024x1536x1536 48.8 -> 56.3, 1024x3072x1536 47.6 ->
  // 54.4; shorter K unchanged. Pieces of 512 for every layout measured -9..+12% (nt and short
  // K lose), so only these two.
  // Not with a 16-bit c: each piece would round c to 16 bits, and the contract rounds once.
  const int64_t kmax = !cpu_like() || is_h(c.dtype) ? K
                       : trans_a                    ? 512
                       : !trans_b && N >= 768       ? 768
                                                    : K;

  // Records one sub-problem, or splits it until every operand fits one binding. `last`: the
  // piece finishes its elements' sums (not the first part of a k split), so it adds the bias
  // and runs the epilogue.
  auto run = [&](auto&& self, const Box& x, float beta_x, bool last) -> void {
    auto [a0, an] = span(sa, x.z0, x.zc, x.m0, x.mc, x.k0, x.kc);
    auto [b0, bnum] = span(sb, x.z0, x.zc, x.k0, x.kc, x.n0, x.nc);
    auto [c0, cn] = span(sc, x.z0, x.zc, x.m0, x.mc, x.n0, x.nc);
    int64_t worst = std::max({an, bnum, cn});
    auto split_k = [&] {  // the second half accumulates onto the first; bias, epilogue last
      Box lo = x, hi = x;
      lo.kc = x.kc / 2, hi.k0 = x.k0 + lo.kc, hi.kc = x.kc - lo.kc;
      self(self, lo, beta_x, false);
      self(self, hi, 1.0f, last);
    };
    if (worst <= limit && x.kc > kmax) return split_k();
    if (worst > limit) {
      Box lo = x, hi = x;
      if (x.zc > 1) {
        lo.zc = x.zc / 2, hi.z0 = x.z0 + lo.zc, hi.zc = x.zc - lo.zc;
      } else if (cn > limit || (an > limit && !trans_a && x.mc > 1) ||
                 (bnum > limit && trans_b && x.nc > 1)) {
        // rows or columns of c: split the larger extent
        if ((x.mc >= x.nc && x.mc > 1) || x.nc == 1)
          lo.mc = x.mc / 2, hi.m0 = x.m0 + lo.mc, hi.mc = x.mc - lo.mc;
        else
          lo.nc = x.nc / 2, hi.n0 = x.n0 + lo.nc, hi.nc = x.nc - lo.nc;
      } else if (an > limit && x.mc > 1 && !trans_a) {
        lo.mc = x.mc / 2, hi.m0 = x.m0 + lo.mc, hi.mc = x.mc - lo.mc;
      } else if (x.kc > 1) {
        return split_k();
      } else if (x.mc > 1) {
        lo.mc = x.mc / 2, hi.m0 = x.m0 + lo.mc, hi.mc = x.mc - lo.mc;
      } else if (x.nc > 1) {
        lo.nc = x.nc / 2, hi.n0 = x.n0 + lo.nc, hi.nc = x.nc - lo.nc;
      } else {
        fail(ErrorKind::kUnsupported, "matmul: cannot split to fit maxStorageBufferRange" + shapes);
      }
      self(self, lo, beta_x, last);
      self(self, hi, beta_x, last);
      return;
    }
    GemmCall g;
    g.batch = x.zc, g.M = x.mc, g.N = x.nc, g.K = x.kc;
    g.a = bind(a, a0, an), g.b = bind(b, b0, bnum), g.c = bind(c, c0, cn);
    g.sa = {sa.sb, sa.si, sa.sj}, g.sb = {sb.sb, sb.si, sb.sj}, g.sc = {sc.sb, sc.si, 1};
    g.has_bias = bias && last;
    if (last && ep) g.epi = epi, g.ep = bind(*ep, c0, cn);
    g.bias = g.has_bias ? bind(*bias, x.n0, x.nc) : g.c;
    g.alpha = alpha, g.beta = beta_x;
    g.ta = a.dtype, g.tb = b.dtype, g.tc = c.dtype;
    gemm(g);
  };
  if (K == 0) {  // c = beta * c: there is nothing to multiply
    CT_REQUIRE(!bias, "matmul: K = 0 with a bias is not supported on Vulkan" + shapes);
    if (beta == 0.0f)
      fill(c, 0.0f);
    else if (c.dtype == DType::f32)
      scale(c, beta);
    else
      fail(ErrorKind::kUnsupported, "matmul: K = 0 with beta != 0 and a 16-bit c" + shapes);
    return;
  }
  run(run, Box{0, batch, 0, M, 0, N, 0, K}, beta, true);
}

void VulkanDevice::gemm(const GemmCall& g) {
  MmKind kind = pick_kind(*this);
  // 16-bit combination: -1 all f32; 0 hhf (a, b h; c f32), 1 hhh, 2 fhh (a f32; b, c h)
  int combo = -1;
  const DType h = g.tb;
  if (g.ta == DType::f32 && g.tb == DType::f32 && g.tc == DType::f32)
    combo = -1;
  else if (is_h(g.ta) && g.tb == g.ta && g.tc == DType::f32)
    combo = 0;
  else if (is_h(g.ta) && g.tb == g.ta && g.tc == g.ta)
    combo = 1;
  else if (g.ta == DType::f32 && is_h(g.tb) && g.tc == g.tb)
    combo = 2;
  else
    CT_CHECK(false, "gemm: unsupported operand dtype combination");
  const int hi = h == DType::bf16 ? 1 : 0;
  // Cooperative-matrix GEMM for two 16-bit operands: the emulated build (CROSSTRAIN_VK_MATMUL=
  // cme|cm8e|cm16e, or CROSSTRAIN_VK_COOPMAT=emulate standing in for the real one), or the
  // VK_KHR_cooperative_matrix build once the start-up self-test passed -- for bf16 products once
  // its bf16 part did too (cm_force_ overrides while it runs).
  const CmEmulation emu = coopmat_emulation();
  bool cm = false, cm_emu = false;
  CmShape frag;
  if (combo == 0 || combo == 1) {
    if (emu.on) {
      cm = cm_emu = true, frag = emu.frag;
    } else if (cm_force_ > 0 || (cm_force_ == 0 && cm_ok_)) {
      cm_emu = cm_emulated_;
      cm = hi == 0 || cm_force_ > 0 || cm_bf16_ok_;
      frag = cm_emu ? CmShape{16, 16, 16} : cm_gate_.shape;
    }
  }
  if (combo >= 0 && kind == MmKind::kVec) kind = MmKind::kReg;    // no MM_VEC 16-bit variants
  if (combo >= 0 && kind == MmKind::kVsg64) kind = MmKind::kVsg;  // f32 only
  // TM, TN of matmul.comp: 64 x 64 (8 x 8 invocations, 8 x 8 blocks), MM_SG too.
  int64_t tm = 64, tn = 64;
  CT_CHECK(g.sc[2] == 1, "gemm: c must have unit column stride");
  MatmulPush p{};
  p.M = u32(g.M), p.N = u32(g.N), p.K = u32(g.K);
  p.oa = g.a.first, p.sam = u32(g.sa[1]), p.sak = u32(g.sa[2]), p.sab = u32(g.sa[0]);
  p.ob = g.b.first, p.sbk = u32(g.sb[1]), p.sbn = u32(g.sb[2]), p.sbb = u32(g.sb[0]);
  p.oc = g.c.first, p.scm = u32(g.sc[1]), p.scb = u32(g.sc[0]);
  p.obias = g.bias.first, p.has_bias = g.has_bias ? 1u : 0u;
  p.alpha = g.alpha, p.beta = g.beta;
  p.ksplit = 1, p.kchunk = p.K;
  const bool has_epi = g.epi != GemmCall::Epilogue::kNone;
  const Bound& ep = has_epi ? g.ep : g.c;  // binding 4: c again where unused
  p.oe = ep.first, p.epi = static_cast<uint32_t>(g.epi);
  ShaderId id = kind == MmKind::kReg ? ShaderId::matmul_reg : ShaderId::matmul_tiled;
  if (combo >= 0) id = kind == MmKind::kTiled ? kTiledH[combo][hi] : kRegH[combo][hi];
  if (!cm && (kind == MmKind::kVec || kind == MmKind::kVsg || kind == MmKind::kVsg64) &&
      has_bda()) {
    p.a_lo = static_cast<uint32_t>(g.a.addr), p.a_hi = static_cast<uint32_t>(g.a.addr >> 32);
    p.b_lo = static_cast<uint32_t>(g.b.addr), p.b_hi = static_cast<uint32_t>(g.b.addr >> 32);
    p.c_lo = static_cast<uint32_t>(g.c.addr), p.c_hi = static_cast<uint32_t>(g.c.addr >> 32);
    p.c_vec = g.tc == DType::f32 && g.c.addr % 16 == 0 && g.c.first % 4 == 0 && g.sc[1] % 4 == 0 &&
              g.sc[0] % 4 == 0;
    int am = 2, bm = 2;
    size_t ea = dtype_size(g.ta), eb = dtype_size(g.tb);
    if (g.sa[2] == 1 && vec_ok(g.a, ea, g.sa[0], g.sa[1], g.K))
      am = 0;  // along k
    else if (g.sa[1] == 1 && vec_ok(g.a, ea, g.sa[0], g.sa[2], g.M))
      am = 1;  // along m
    if (g.sb[2] == 1 && vec_ok(g.b, eb, g.sb[0], g.sb[1], g.N))
      bm = 0;  // along n
    else if (g.sb[1] == 1 && vec_ok(g.b, eb, g.sb[0], g.sb[2], g.K))
      bm = 1;  // along k
    id = combo >= 0                                                     ? kVsgH[combo][hi][am][bm]
         : kind == MmKind::kVsg64 && bm < 2 && am == 1 && g.K % 16 == 0 ? kVsg64k16MIds[bm]
         : kind == MmKind::kVsg64 && bm < 2 && g.K % 8 == 0             ? kVsg64k8Ids[am][bm]
         : kind == MmKind::kVsg64 && bm < 2                             ? kVsg64Ids[am][bm]
         : kind == MmKind::kVsg || kind == MmKind::kVsg64               ? kVsgIds[am][bm]
                                                                        : kVecIds[am][bm];
  }
  const PipelineSpec* spec = nullptr;
  PipelineSpec pspec;
  // split-k: the variant whose c is f32 writes the partials (hhf for hhh; fhh is not split)
  ShaderId part_id = id;
  bool splittable = false;
  // tiles of 128 x 128 the product has: the rule for the big coopmat and tiled workgroups
  const int64_t groups128 = g.batch * ((g.M + 127) / 128) * ((g.N + 127) / 128);
  if (cm) {  // whole tiles of c per workgroup, edges zero-filled in the shader
    CmPlan pl;
    const int forced = cm_tile_force_ ? cm_tile_force_ : env_int("CROSSTRAIN_VK_CM_TILE");
    // the emulated build's f32 tiles: 128 x 128 with k 32 deep overflow 32 KiB of shared memory
    const uint32_t sg = cm_emu ? 32 : pd_.subgroup_size, esz = cm_emu ? 4 : 2;
    if (forced == 128 || (forced == 0 && groups128 >= kBigTileGroups)) {
      pl.wm = pl.wn = 64;
      if (pl.wm * pl.wn / sg > kCmAccPerLane) pl.warps_n = 4, pl.wn = 32;
    }
    auto shared_bytes = [&] {  // As, Bs, Cw and (bf16) the two tile maxima
      return (pl.tile_m() + pl.tile_n()) * (pl.tbk + 16 / esz) * esz +
             int64_t(pl.warps_m) * pl.warps_n * frag.m * frag.n * 4 + 8;
    };
    if (shared_bytes() > pd_.props.limits.maxComputeSharedMemorySize && frag.k <= 16) pl.tbk = 16;
    CT_CHECK(shared_bytes() <= pd_.props.limits.maxComputeSharedMemorySize,
             "gemm: coopmat tile exceeds the device's shared memory");
    // 16-byte loads (8 elements) where aligned, as the tiled GEMM's vec4s (matmul_coopmat.comp's
    // VA, VB): a along k (row-major) or m (transposed), b along n or k
    uint32_t va = 0, vb = 0;
    if (g.sa[2] == 1 && binding_vec_ok(g.a, 2, g.sa[0], g.sa[1], g.K, 8))
      va = 1;
    else if (g.sa[1] == 1 && binding_vec_ok(g.a, 2, g.sa[0], g.sa[2], g.M, 8))
      va = 2;
    if (g.sb[2] == 1 && binding_vec_ok(g.b, 2, g.sb[0], g.sb[1], g.N, 8))
      vb = 1;
    else if (g.sb[1] == 1 && binding_vec_ok(g.b, 2, g.sb[0], g.sb[2], g.K, 8))
      vb = 2;
    pspec.n = 12;
    pspec.v = {pl.warps_m * pl.warps_n * sg,
               frag.m,
               frag.n,
               frag.k,
               pl.warps_m,
               pl.warps_n,
               pl.wm / frag.m,
               pl.wn / frag.n,
               pl.tbk,
               va,
               vb,
               c_vec4_ok(g.c, dtype_size(g.tc), g.sc[0], g.sc[1]) ? 1u : 0u};
    if (!cm_emu) pspec.required_subgroup = sg, pspec.full_subgroups = true;
    spec = &pspec;
#if defined(CT_VK_COOPMAT)
    id = cm_emu ? kCmEmuIds[combo][hi] : kCmIds[combo][hi];
    part_id = cm_emu ? kCmEmuIds[0][hi] : kCmIds[0][hi];
#else
    CT_CHECK(cm_emu, "gemm: no coopmat modules in this build");
    id = kCmEmuIds[combo][hi];
    part_id = kCmEmuIds[0][hi];
#endif
    tm = pl.tile_m(), tn = pl.tile_n();
    splittable = true;
  } else if (kind == MmKind::kTiled) {
    const TiledConfig tc = tiled_config(info_.type == DeviceType::kDiscreteGpu, groups128,
                                        env_int("CROSSTRAIN_VK_TILED"), pd_.props.vendorID,
                                        pd_.subgroup_control, pd_.subgroup_min, pd_.subgroup_max,
                                        static_cast<uint32_t>(env_int("CROSSTRAIN_VK_TILED_SG")));
    // vec4 staging where every vec4 is aligned (tiled_vec_ok) and the stride-1 extent is a
    // multiple of 4: a along k (row-major) or m (transposed), b along n or k
    const size_t ea = dtype_size(g.ta), eb = dtype_size(g.tb);
    uint32_t va = 0, vb = 0;
    if (g.sa[2] == 1 && tiled_vec_ok(g.a, ea, g.sa[0], g.sa[1], g.K))
      va = 1;
    else if (g.sa[1] == 1 && tiled_vec_ok(g.a, ea, g.sa[0], g.sa[2], g.M))
      va = 2;
    if (g.sb[2] == 1 && tiled_vec_ok(g.b, eb, g.sb[0], g.sb[1], g.N))
      vb = 1;
    else if (g.sb[1] == 1 && tiled_vec_ok(g.b, eb, g.sb[0], g.sb[2], g.K))
      vb = 2;
    pspec.n = 8;
    pspec.v = {tc.invocations(), tc.tbm, tc.tbn, tc.tbk, tc.trm, tc.trn, va, vb};
    pspec.required_subgroup = tc.subgroup;
    spec = &pspec;
    tm = tc.tbm, tn = tc.tbn;
    // split-k partials through the variant with an f32 c (none for fhh: not split)
    part_id = combo < 0 ? ShaderId::matmul_tiled : kTiledH[0][hi];
    splittable = combo != 2;
  }
  uint32_t gx = u32((g.N + tn - 1) / tn), gy = u32((g.M + tm - 1) / tm);
  CT_CHECK(gx <= max_groups_x() && g.batch <= 65535, "matmul grid too large");
  SplitK sk;
  if (splittable) {
    const int forced = splitk_force_ ? splitk_force_ : env_int("CROSSTRAIN_VK_SPLITK");
    const int64_t tbk = cm ? pspec.v[8] : pspec.v[3];  // k staged per step
    sk = plan_splitk(cpu_like(), forced, int64_t(gx) * gy * g.batch, g.K, tbk, 65535 / g.batch,
                     g.batch * g.M * g.N, max_elems(4));
  }
  // The epilogue (push constant epi) in the dispatch that finishes the sums: this one, or with
  // split-k matmul_splitk.comp's; the partials take none.
  if (has_epi) {
    const char* path = sk.S > 1                 ? "splitk"
                       : cm                     ? "coopmat"
                       : kind == MmKind::kTiled ? "tiled"
                       : kind == MmKind::kReg   ? "reg"
                                                : "vec";
    ++gelu_counts_[std::string("gelu_epilogue:") + path];
  }
  if (sk.S <= 1) {
    dispatch(id, spec, {g.c, g.a, g.b, g.bias, ep}, p, gx, gy, u32(g.batch));
    return;
  }
  // Split-k: S slices of K into f32 partials [batch * S][M][N], then their ordered sum with the
  // epilogue (alpha, beta, bias, c's dtype) by matmul_splitk.comp.
  Tensor part = empty({int64_t(sk.S) * g.batch * g.M * g.N}, DType::f32, MemCategory::kWorkspace);
  const Bound pb = bind(part);
  MatmulPush pp = p;
  pp.oc = pb.first, pp.scm = u32(g.N), pp.scb = u32(g.M * g.N);
  pp.has_bias = 0, pp.alpha = 1.0f, pp.beta = 0.0f;
  pp.ksplit = sk.S, pp.kchunk = sk.kchunk, pp.oe = pb.first, pp.epi = 0;
  PipelineSpec part_spec;
  if (spec) {  // the coopmat epilogue's VC for the partials' rows (the tiled GEMM has none)
    part_spec = *spec;
    if (cm) part_spec.v[11] = c_vec4_ok(pb, 4, g.M * g.N, g.N) ? 1u : 0u;
  }
  dispatch(part_id, spec ? &part_spec : nullptr, {pb, g.a, g.b, pb, pb}, pp, gx, gy,
           u32(g.batch * sk.S));
  SplitkPush r{u32(g.M),     u32(g.N),     u32(g.batch), sk.S,    pb.first, g.c.first, u32(g.sc[1]),
               u32(g.sc[0]), g.bias.first, p.has_bias,   g.alpha, g.beta,   ep.first,  p.epi};
  auto grd = grid(uint64_t(g.batch) * g.M * g.N, 256);
  dispatch(h_variant(g.tc, ShaderId::matmul_splitk, ShaderId::matmul_splitk_f16,
                     ShaderId::matmul_splitk_bf16),
           {g.c, pb, g.has_bias ? g.bias : pb, ep}, r, grd[0], grd[1]);
}

// Start-up self-test of the cooperative-matrix GEMM (the real build, or the emulated one under
// CROSSTRAIN_VK_COOPMAT=emulate): on ragged shapes in every layout, with bias, beta and 16-bit c,
// both workgroup tiles and split-k, its products must equal the default GEMM's within 1e-3 of the
// largest |c| (f16 products are exact in fp32; only the order of the sums differs); then on a
// n^3 f16 product (median of 3; n = 2048 on a GPU, 256 on a CPU device) it must not be slower.
// Then bf16 products, whose tiles the shader stages as f16 scaled by a power of two per tile: a
// scaled by 2^20 and b by 2^-20 and the reverse (past f16's range both ways), split-k (through
// the hhf partials) and hhh on the 128 x 128 tile, within the same 1e-3 of the host's products
// (no reference pipelines to compile at start-up; a bf16 c may also differ by its rounding);
// else bf16 GEMMs keep the default GEMM (the reason in the verdict line).
// CROSSTRAIN_VK_COOPMAT_INJECT=wrong perturbs its results, =bf16wrong (in a list) only the bf16
// ones (the tests of this test). Returns the verdict with its reason.
bool VulkanDevice::coopmat_self_test(std::string* why) {
  struct Shape3 {
    int64_t M, N, K;
    bool ta, tb, bias;
    float beta;
    bool c16;
    int tile, splitk;  // forced (0: the rule)
  };
  const Shape3 shapes[] = {{37, 53, 29, false, false, false, 0.0f, false, 0, 0},
                           {130, 67, 70, true, false, true, 0.5f, false, 0, 0},
                           {65, 9, 100, false, true, false, 0.0f, true, 0, 0},
                           {128, 128, 64, true, true, true, 0.25f, true, 0, 0},
                           {150, 140, 40, false, true, true, 0.5f, false, 128, 0},
                           {70, 60, 130, true, false, true, 0.75f, true, 0, 3}};
  const char* inject = std::getenv("CROSSTRAIN_VK_COOPMAT_INJECT");
  const bool wrong = inject && std::strcmp(inject, "wrong") == 0;
  const bool bf16_wrong = inject && std::strstr(inject, "bf16wrong") != nullptr;
  struct Restore {
    VulkanDevice& d;
    ~Restore() { d.cm_force_ = d.cm_tile_force_ = d.splitk_force_ = 0; }
  } restore{*this};
  // vals (where given): the values as stored (16-bit ones widened)
  auto host_tensor = [&](const ct::Shape& s, DType dt, uint64_t seed, float scale = 1.0f,
                         std::vector<double>* vals = nullptr) {
    Philox rng(seed, 7);
    std::vector<uint16_t> bits(static_cast<size_t>(s.numel()));
    std::vector<float> f32(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) {
      const float v = rng.normal(i) * scale;
      bits[i] = dt == DType::bf16 ? f32_to_bf16(v) : f32_to_f16(v);
      f32[i] = v;
    }
    if (vals)
      for (size_t i = 0; i < bits.size(); ++i)
        vals->push_back(dt == DType::f32    ? f32[i]
                        : dt == DType::bf16 ? bf16_to_f32(bits[i])
                                            : f16_to_f32(bits[i]));
    Tensor t = empty(s, dt, MemCategory::kWorkspace);
    if (dt == DType::f32)
      upload(t, f32.data(), f32.size() * 4);
    else
      upload(t, bits.data(), bits.size() * 2);
    return t;
  };
  // Each shape's products through the coopmat GEMM (alpha 1.01 where perturb) and the default
  // one -- or (on_host) the host's, in double: no reference pipelines to compile -- a and b of
  // dtype h scaled by sa, sb; false and the reason in *out on the first that differ.
  uint64_t seed = 1;
  auto agree = [&](std::span<const Shape3> list, DType h, float sa, float sb, bool perturb,
                   bool on_host, std::string* out) {
    for (const Shape3& s : list) {
      std::vector<double> va, vb, vbias, vc;
      Tensor a = host_tensor(s.ta ? ct::Shape{s.K, s.M} : ct::Shape{s.M, s.K}, h, seed++, sa, &va);
      Tensor b = host_tensor(s.tb ? ct::Shape{s.N, s.K} : ct::Shape{s.K, s.N}, h, seed++, sb, &vb);
      Tensor bias = host_tensor({s.N}, DType::f32, seed++, 1.0f, &vbias);
      const DType tc = s.c16 ? h : DType::f32;
      Tensor c0 = host_tensor({s.M, s.N}, tc, seed);
      Tensor c1 = host_tensor({s.M, s.N}, tc, seed++, 1.0f, &vc);
      const size_t n = static_cast<size_t>(s.M * s.N);
      std::vector<float> r0(n), r1(n);
      if (on_host) {
        for (int64_t i = 0; i < s.M; ++i)
          for (int64_t j = 0; j < s.N; ++j) {
            double acc = 0;
            for (int64_t k = 0; k < s.K; ++k)
              acc += va[s.ta ? k * s.M + i : i * s.K + k] * vb[s.tb ? j * s.K + k : k * s.N + j];
            // a 16-bit c adds the bias rounded to its dtype (round_to(f32, x) is x)
            acc += s.beta * vc[i * s.N + j] + (s.bias ? round_to(tc, float(vbias[j])) : 0.0);
            r0[i * s.N + j] = float(acc);
          }
      } else {
        cm_force_ = -1;
        matmul(c0, a, b, s.ta, s.tb, 1.0f, s.beta, s.bias ? &bias : nullptr);
      }
      cm_force_ = 1, cm_tile_force_ = s.tile, splitk_force_ = s.splitk;
      matmul(c1, a, b, s.ta, s.tb, perturb ? 1.01f : 1.0f, s.beta, s.bias ? &bias : nullptr);
      std::vector<uint16_t> bits(n);
      auto get = [&](const Tensor& t, std::vector<float>& out) {
        if (tc == DType::f32) {
          download(out.data(), t, n * 4);
          return;
        }
        download(bits.data(), t, n * 2);
        for (size_t i = 0; i < n; ++i)
          out[i] = h == DType::bf16 ? bf16_to_f32(bits[i]) : f16_to_f32(bits[i]);
      };
      if (!on_host) get(c0, r0);
      get(c1, r1);
      // The host's products are exact before c's rounding: a 16-bit c may differ from them by
      // its half ulp, up to 2^-8 |c| for bf16 (2^-11 f16), which is left out of err.
      const double half_ulp = !on_host || tc == DType::f32 ? 0.0
                              : tc == DType::bf16          ? 0x1p-8
                                                           : 0x1p-11;
      double top = 0, err = 0;
      for (size_t i = 0; i < n; ++i) {
        top = std::max(top, std::fabs(double(r0[i])));
        const double d = std::fabs(double(r1[i]) - r0[i]);
        err = std::isnan(d) ? INFINITY
                            : std::max(err, std::max(0.0, d - half_ulp * std::fabs(r0[i])));
      }
      if (!(err <= 1e-3 * std::max(top, 1.0))) {
        char line[200];
        std::snprintf(line, sizeof line,
                      "wrong products: |diff| %.3g (max |c| %.3g) at %ldx%ldx%ld %s (tile %d, "
                      "split-k %d)",
                      err, top, long(s.M), long(s.N), long(s.K), dtype_name(h), s.tile, s.splitk);
        *out = line;
        return false;
      }
    }
    return true;
  };
  if (!agree(shapes, DType::f16, 1.0f, 1.0f, wrong, false, why)) return false;
  const DType h = DType::f16;
  // Speed: an n^3 hhf product, median of 3, against the GEMM this device takes otherwise. On a
  // GPU n = 2048: at 512^3 a fast one finishes either GEMM in microseconds, so the times are
  // those of a submit and a fence, not of the GEMMs (and 512^3 is 16 workgroups of 128 x 128,
  // too few to fill it). A CPU device (lavapipe) takes 256: milliseconds there already.
  const int64_t n = info_.type == DeviceType::kCpu ? 256 : 2048;
  Tensor a = host_tensor({n, n}, h, 90), b = host_tensor({n, n}, h, 91);
  Tensor c = empty({n, n}, DType::f32, MemCategory::kWorkspace);
  auto time_it = [&](int force) {
    cm_force_ = force, cm_tile_force_ = splitk_force_ = 0;
    matmul(c, a, b, false, false);  // warm-up: pipeline creation
    synchronize();
    std::vector<double> t;
    for (int i = 0; i < 3; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      matmul(c, a, b, false, false);
      synchronize();
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    return 2.0 * double(n) * double(n) * double(n) / t[1] * 1e-9;
  };
  // CROSSTRAIN_VK_COOPMAT_INJECT=fast (or a list naming it): the speed comparison is skipped and
  // taken as passed (the tests' way to an emulated build in use on lavapipe, where it is far
  // slower).
  const bool fast = inject && std::strstr(inject, "fast") != nullptr;
  const double base = fast ? 0 : time_it(-1), coop = fast ? 0 : time_it(1);
  char line[160];
  const std::string what = cm_emulated_ ? "emulated coopmat" : "coopmat " + cm_gate_.shape.str();
  std::snprintf(line, sizeof line, "%s %.1f GFLOP/s against %.1f (default GEMM, %ld^3 f16)",
                what.c_str(), coop, base, long(n));
  *why = fast ? what + ", speed not compared (CROSSTRAIN_VK_COOPMAT_INJECT=fast)" : line;
  if (coop < base) {
    *why = "slower: " + *why;
    return false;
  }
  *why = "self-test passed, " + *why;
  // bf16: values past f16's range both ways (2^20 x 2^-20 and the reverse), so a driver or a
  // staging that loses the per-tile scale fails here, and bf16 GEMMs keep the default GEMM.
  const Shape3 bf16_shapes[] = {{70, 60, 130, true, false, true, 0.75f, true, 0, 3},
                                {150, 140, 40, false, true, true, 0.5f, true, 128, 0}};
  std::string bf16_why;
  const std::span<const Shape3> bf16_list(bf16_shapes);
  if (agree(bf16_list.first(1), DType::bf16, 0x1p20f, 0x1p-20f, bf16_wrong, true, &bf16_why) &&
      agree(bf16_list.last(1), DType::bf16, 0x1p-20f, 0x1p20f, bf16_wrong, true, &bf16_why))
    *why += std::string("; ") + kGemmBf16CmInUse + " (f16 tiles scaled per tile)";
  else
    *why += "; bf16 products on the default GEMM: " + bf16_why;
  // The flash attention kernels: in use where they agree with the scalar shaders (the verdict
  // line says which; coopmat_start reads it back from the cached line).
  std::string attention;
  if (coopmat_flash_self_test(&attention))
    *why +=
        std::string("; ") + kFlashCmInUse + " for f16 and bf16, head sizes 16..128 in steps of 16";
  else
    *why += "; flash attention on the scalar shaders: " + attention;
  return true;
}

void VulkanDevice::add_column_partials(const Bound& dst, const Bound& partial, int64_t chunks,
                                       int64_t N) {
  auto g = grid(N, 256);
  dispatch(ShaderId::bias_backward, {dst, partial},
           BiasGradPush{u32(chunks), u32(N), dst.first, partial.first, 0}, g[0], g[1]);
}

// Two passes (add_column_partials): partials of kColumnRows rows, then their ordered sum.
void VulkanDevice::bias_backward_kernel(const Tensor& dbias, const Tensor& dout) {
  int64_t N = dbias.numel();
  if (N == 0) return;
  int64_t M = dout.numel() / N;
  if (M == 0) return;
  int64_t rows = std::max<int64_t>(1, max_elems(4) / N);
  rows = std::min(rows, kColumnRows * 65535);  // a piece's chunks fit grid z
  rows = std::max<int64_t>(kColumnRows, rows / kColumnRows * kColumnRows);
  const int64_t chunks = (M + kColumnRows - 1) / kColumnRows;
  Tensor part = workspace({chunks * N}, DType::f32);
  const ShaderId id = h_variant(dout.dtype, ShaderId::bias_backward, ShaderId::bias_backward_f16,
                                ShaderId::bias_backward_bf16);
  auto g = grid(N, 256);
  for (int64_t m0 = 0; m0 < M; m0 += rows) {
    const int64_t mr = std::min(rows, M - m0), pc = (mr + kColumnRows - 1) / kColumnRows;
    Bound bp = bind(part, m0 / kColumnRows * N, pc * N), bo = bind(dout, m0 * N, mr * N);
    dispatch(id, {bp, bo}, BiasGradPush{u32(mr), u32(N), bp.first, bo.first, u32(kColumnRows)},
             g[0], g[1], u32(pc));
  }
  add_column_partials(bind(dbias), bind(part), chunks, N);
}

// The GELU epilogues in the GEMM shaders (matmul.comp, matmul_coopmat.comp, matmul_splitk.comp:
// their push constant epi), on the pieces of a split product that finish their sums:
// the unfused ops' bits, with one dispatch and none of the GELU shader's reads and writes of the
// [M, N] tensors. Core's composition (matmul, then the GELU shader) where the device runs the
// CT_STRICT_MATH twins (CROSSTRAIN_VK_STRICT_MATH: the GEMMs have none, the GELU shader has), and
// for K = 0 (no product to take an epilogue).
void VulkanDevice::matmul_bias_gelu_kernel(const Tensor& out, const Tensor& pre, const Tensor& a,
                                           const Tensor& b, const MatmulDims& d, bool trans_a,
                                           bool trans_b, const Tensor& bias) {
  if (!strict_twin_.empty() || d.K == 0) {
    ++gelu_counts_["gelu_composed"];
    Device::matmul_bias_gelu_kernel(out, pre, a, b, d, trans_a, trans_b, bias);
    return;
  }
  matmul_split(pre, a, b, d, trans_a, trans_b, 1.0f, 0.0f, &bias, GemmCall::Epilogue::kGeluForward,
               &out);
}

void VulkanDevice::matmul_gelu_backward_kernel(const Tensor& dpre, const Tensor& a, const Tensor& b,
                                               const MatmulDims& d, bool trans_a, bool trans_b,
                                               const Tensor& pre) {
  if (!strict_twin_.empty() || d.K == 0) {
    ++gelu_counts_["gelu_composed"];
    Device::matmul_gelu_backward_kernel(dpre, a, b, d, trans_a, trans_b, pre);
    return;
  }
  matmul_split(dpre, a, b, d, trans_a, trans_b, 1.0f, 0.0f, nullptr,
               GemmCall::Epilogue::kGeluBackward, &pre);
}

}  // namespace ct::vk
