// Helpers shared by the op files: argument checks and splitting work over
// maxStorageBufferRange-sized chunks.
#pragma once

#include <algorithm>
#include <string>

#include "backends/vulkan/vk_device.h"
#include "core/error.h"

namespace ct::vk {

inline void require_f32(const Tensor& t, const char* op, const char* name) {
  CT_REQUIRE(t.defined(), std::string(op) + ": " + name + " is undefined");
  if (t.dtype == DType::f16 || t.dtype == DType::bf16)  // allowed by the contract, not here yet
    fail(ErrorKind::kUnsupported, std::string(op) + ": " + name + " is " + dtype_name(t.dtype) +
                                      "; the Vulkan backend runs this op in f32 only");
  CT_REQUIRE(t.dtype == DType::f32,
             std::string(op) + ": " + name + " must be f32, got " + t.describe());
  CT_REQUIRE(t.is_contiguous(), std::string(op) + ": " + name + " must be contiguous");
}

inline bool is_h(DType d) { return d == DType::f16 || d == DType::bf16; }

// A tensor that core/device.h's mixed-precision table allows in f32 or 16 bits: f32, or f16/bf16
// where the device supports `kind` for it (kUnsupported otherwise, as the contract asks).
inline void require_flt(const VulkanDevice& dev, const Tensor& t, OpKind kind, const char* op,
                        const char* name) {
  CT_REQUIRE(t.defined(), std::string(op) + ": " + name + " is undefined");
  if (is_h(t.dtype) && !dev.supports(kind, t.dtype))
    fail(ErrorKind::kUnsupported, std::string(op) + ": " + name + " is " + dtype_name(t.dtype) +
                                      ", which this Vulkan device does not support for the op");
  CT_REQUIRE(t.dtype == DType::f32 || is_h(t.dtype),
             std::string(op) + ": " + name + " must be f32, f16 or bf16, got " + t.describe());
  CT_REQUIRE(t.is_contiguous(), std::string(op) + ": " + name + " must be contiguous");
}

// The variant of a ct_vk_shader_h() family (backends/vulkan/CMakeLists.txt) for dtype d.
inline ShaderId h_variant(DType d, ShaderId f32, ShaderId f16, ShaderId bf16) {
  return d == DType::f16 ? f16 : d == DType::bf16 ? bf16 : f32;
}

inline void require_same_dtype(const Tensor& a, const Tensor& b, const char* op, const char* an,
                               const char* bn) {
  CT_REQUIRE(a.dtype == b.dtype, std::string(op) + ": " + an + " " + a.describe() + " and " + bn +
                                     " " + b.describe() + " must share one dtype");
}

inline void require_dtype(const Tensor& t, DType d, const char* op, const char* name) {
  CT_REQUIRE(t.defined(), std::string(op) + ": " + name + " is undefined");
  CT_REQUIRE(t.dtype == d, std::string(op) + ": " + name + " must be " + dtype_name(d) +
                               ", got " + t.describe());
  CT_REQUIRE(t.is_contiguous(), std::string(op) + ": " + name + " must be contiguous");
}

inline void require_numel(const Tensor& t, int64_t n, const char* op, const char* name) {
  CT_REQUIRE(t.numel() == n, std::string(op) + ": " + name + " " + t.describe() + " must have " +
                                 std::to_string(n) + " elements");
}

// Calls fn(start, count) over [0, n) in chunks that one binding of `esize`-byte elements can
// always cover (elementwise ops on tensors beyond maxStorageBufferRange).
template <class F>
void for_each_chunk(const VulkanDevice& dev, int64_t n, size_t esize, F&& fn) {
  int64_t chunk = dev.max_elems(esize);
  for (int64_t s = 0; s < n; s += chunk) fn(s, std::min(chunk, n - s));
}

inline uint32_t u32(int64_t v) { return static_cast<uint32_t>(v); }

}  // namespace ct::vk
