// Which matmul.comp family a device gets by default: one rule, used by the matmul op and by
// `crosstrain devices` (which prints it), so the listing cannot disagree with what runs.
#pragma once

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
      return "vsg64 (16x8 register blocks, subgroup-shared rows of a, 64-bit loads)";
    case MmKind::kVsg:
      return "vsg (16x8 register blocks, subgroup-shared rows of a)";
    case MmKind::kVec:
      return "vec (8x8 register blocks, vec4 loads through device addresses)";
    case MmKind::kReg:
      return "reg (8x8 register blocks)";
    case MmKind::kTiled:
      return "tiled (64x64 shared-memory tiles)";
  }
  return "?";
}

}  // namespace ct::vk
