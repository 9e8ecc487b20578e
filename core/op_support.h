// The op kinds of core/ops.def as a table: each kind's name and the element types core/device.h's
// mixed-precision table lets it take (f32 for every op; f16/bf16 for the ops the table lets take
// a 16-bit tensor; fill and copy any dtype; u8 for the 8-bit optimizer's state). A backend that
// runs every op of the table answers supports() with precision_table_allows(); one that lacks
// something answers it and then takes away what it lacks (backends/vulkan/vk_device.cpp).
#pragma once

#include <array>
#include <cstdint>

#include "core/device.h"

namespace ct {

// A set of DTypes, one bit each.
using DTypeMask = uint32_t;
constexpr DTypeMask dtype_bit(DType d) {
  return DTypeMask{1} << static_cast<int>(d);
}

struct OpKindInfo {
  const char* name = nullptr;  // "layernorm", as core/ops.def spells it
  DTypeMask dtypes = 0;        // what the precision table allows
};

namespace op_table_detail {
// The spellings of ops.def's dtypes column.
inline constexpr DTypeMask kF32 = dtype_bit(DType::f32);
inline constexpr DTypeMask kHalf = dtype_bit(DType::f16) | dtype_bit(DType::bf16);
inline constexpr DTypeMask kU8 = dtype_bit(DType::u8);
inline constexpr DTypeMask kAny = (DTypeMask{1} << kNumDTypes) - 1;

constexpr int count_kinds() {
  int n = 0;
#define CT_OP_KIND(kind, value, label, dtypes) ++n;
#include "core/ops.def"
  return n;
}
}  // namespace op_table_detail

inline constexpr int kNumOpKinds = op_table_detail::count_kinds();

// Indexed by the OpKind's value. ops.def's values must be 0 .. kNumOpKinds - 1, each once.
inline constexpr std::array<OpKindInfo, kNumOpKinds> kOpKinds = [] {
  using namespace op_table_detail;
  std::array<OpKindInfo, kNumOpKinds> t{};
#define CT_OP_KIND(kind, value, label, dtypes)                       \
  if (value < 0 || value >= kNumOpKinds || t[value].name != nullptr) \
    throw "core/ops.def: OpKind values must be 0 .. N-1, each once"; \
  t[value] = OpKindInfo{label, dtypes};
#include "core/ops.def"
  return t;
}();

inline const char* op_kind_name(OpKind op) {
  const int i = static_cast<int>(op);
  return i >= 0 && i < kNumOpKinds ? kOpKinds[static_cast<size_t>(i)].name : "unknown op kind";
}

// The whole mixed-precision table of core/device.h as one predicate.
inline bool precision_table_allows(OpKind op, DType dtype) {
  const int i = static_cast<int>(op);
  return i >= 0 && i < kNumOpKinds && (kOpKinds[static_cast<size_t>(i)].dtypes & dtype_bit(dtype));
}

}  // namespace ct
