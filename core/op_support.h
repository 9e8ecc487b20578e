// The whole mixed-precision table of core/device.h as one predicate: f32 for every op; f16/bf16
// for the ops the table lets take a 16-bit tensor; fill and copy for any dtype; u8 for the 8-bit
// optimizer's state. A backend that runs every op of the table answers supports() with it.
#pragma once

#include "core/device.h"

namespace ct {

inline bool precision_table_allows(OpKind op, DType dtype) {
  if (op == OpKind::kFill || op == OpKind::kCopy || dtype == DType::f32) return true;
  if (op == OpKind::kAdamW8bit && dtype == DType::u8) return true;
  if (dtype != DType::f16 && dtype != DType::bf16) return false;
  switch (op) {
    case OpKind::kAdd:
    case OpKind::kEmbedding:  // forward tables only
    case OpKind::kMatmul:
    case OpKind::kLayerNorm:
    case OpKind::kRMSNorm:
    case OpKind::kSwiGLU:
    case OpKind::kRope:
    case OpKind::kBiasGrad:
    case OpKind::kAttention:
    case OpKind::kGelu:
    case OpKind::kDropout:
    case OpKind::kCrossEntropy:
      return true;
    default:
      return false;
  }
}

}  // namespace ct
