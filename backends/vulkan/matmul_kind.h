// Which matmul.comp family a device gets by default: one rule, used by the matmul op and by
// `crosstrain devices` (which prints it), so the listing cannot disagree with what runs. And
// when a GEMM is split along k (plan_splitk), a rule the tests check on GPU-like inputs.
#pragma once

#include <algorithm>
#include <cstdint>

namespace ct::vk {

enum class MmKind { kVsg, kVsg64, kVec, kReg, kTiled };

// GPUs: shared-memory tiles. CPU-type devices (lavapipe): register blocks read through device
// addresses (vec), with subgroups of 8 sharing a's rows (vsg), with vec4s read as 64-bit pairs
// where shaderInt64 is there (vsg64); without device addresses, plain register blocks (reg).
inline MmKind default_mm_kind(bool cpu_like, bool bda, bool sg8, bool int64) {
  if (!cpu_like) return MmKind::kTiled;
  if (!bda) return MmKind::kReg;
  if (!sg8) return MmKind::kVec;
  return int64 ? MmKind::kVsg64 : MmKind::kVsg;
}

inline const char* describe(MmKind k) {
  switch (k) {
    case MmKind::kVsg64:
      return "vsg64 (8x8 register blocks, subgroup-shared rows of a, 64-bit loads)";
    case MmKind::kVsg:
      return "vsg (8x8 register blocks, subgroup-shared rows of a)";
    case MmKind::kVec:
      return "vec (8x8 register blocks, vec4 loads through device addresses)";
    case MmKind::kReg:
      return "reg (8x8 register blocks)";
    case MmKind::kTiled:
      return "tiled (shared-memory tiles: 128x128 with 8x8 register blocks on discrete GPUs, "
             "64x64 with 4x4 elsewhere; vec4 loads)";
  }
  return "?";
}

// Split-k on GPUs (not CPU-type devices, whose cores one workgroup row already fills): a product
// with fewer than kSplitGroups workgroups and K >= 2048 (the weight gradients of small models:
// dW = x^T dout with M, N = the width, K = batch x tokens) runs as S slices of K, at least 1024
// deep, into f32 partials, added in order by matmul_splitk.comp; S aims at 2 x kSplitGroups
// workgroups, at most 16, and the partials must fit one binding (`limit` elements) and S x batch
// the grid's z (max_s). `forced` > 0 (CROSSTRAIN_VK_SPLITK=S) forces S within those bounds;
// `tbk` is the k the shader stages per step (every slice but the last is a multiple of it).
inline constexpr int64_t kSplitGroups = 128;
struct SplitK {
  uint32_t S = 1;
  uint32_t kchunk = 0;
};
inline SplitK plan_splitk(bool cpu_like, int forced, int64_t groups, int64_t K, int64_t tbk,
                          int64_t max_s, int64_t part_elems, int64_t limit) {
  int64_t S = 1;
  if (forced > 0)
    S = forced;
  else if (!cpu_like && groups < kSplitGroups && K >= 2048)
    S = std::min<int64_t>({(2 * kSplitGroups + groups - 1) / groups, K / 1024, 16});
  S = std::max<int64_t>(1, std::min<int64_t>({S, (K + tbk - 1) / tbk, max_s}));
  while (S > 1 && S * part_elems > limit) --S;
  // kchunk: whole tbk steps; S again, as the rounding may leave the last slices empty
  const int64_t kchunk = ((K + S - 1) / S + tbk - 1) / tbk * tbk;
  S = (K + kchunk - 1) / kchunk;
  return {static_cast<uint32_t>(S), static_cast<uint32_t>(S > 1 ? kchunk : K)};
}

// The tiled GEMM's shape (matmul.comp MM_TILED specialization constants): a TBM x TBN tile of
// c per workgroup, k staged TBK deep, a TRM x TRN register block per invocation. Discrete GPUs:
// 128 x 128 with 8 x 8 blocks (256 invocations, 64 accumulators each; 17 KiB of shared memory),
// where the product has at least kBigTiledGroups such tiles -- fewer would leave multiprocessors
// idle -- else 64 x 64 with 4 x 4 (256 invocations; 8.5 KiB), the shape for integrated GPUs
// and CPU-type devices. `forced` 64 or 128 (CROSSTRAIN_VK_TILED) overrides the size.
// Required subgroup size: Intel GPUs compile compute shaders at SIMD8, 16 or 32 by their own
// heuristic; a GEMM with 16 to 64 accumulators an invocation is held at 16 where the device
// lets a pipeline require it (VK_EXT_subgroup_size_control with compute in
// requiredSubgroupSizeStages), so the register file holds it without spills. 0: the driver's
// choice. `forced_sg` (CROSSTRAIN_VK_TILED_SG) requires that size instead where allowed.
inline constexpr int64_t kBigTiledGroups = 256;
struct TiledConfig {
  uint32_t tbm = 64, tbn = 64, tbk = 16, trm = 4, trn = 4;  // trm, trn multiples of 4
  uint32_t subgroup = 0;
  uint32_t invocations() const { return (tbm / trm) * (tbn / trn); }
};
inline TiledConfig tiled_config(bool discrete, int64_t groups128, int forced, uint32_t vendor,
                                bool sg_control, uint32_t sg_min, uint32_t sg_max,
                                uint32_t forced_sg) {
  TiledConfig c;
  if (forced == 128 || (forced == 0 && discrete && groups128 >= kBigTiledGroups))
    c.tbm = c.tbn = 128, c.trm = c.trn = 8;
  const uint32_t want = forced_sg ? forced_sg : vendor == 0x8086 ? 16 : 0;
  if (want && sg_control && want >= sg_min && want <= sg_max) c.subgroup = want;
  return c;
}

}  // namespace ct::vk
