// Helpers shared by the op files: shader variants by dtype and splitting work over
// maxStorageBufferRange-sized chunks. (Arguments are checked in core: core/op_checks.cpp.)
#pragma once

#include <algorithm>
#include <string>

#include "backends/vulkan/vk_device.h"
#include "core/error.h"

namespace ct::vk {

inline bool is_h(DType d) {
  return d == DType::f16 || d == DType::bf16;
}

// The variant of a ct_vk_shader_h() family (backends/vulkan/CMakeLists.txt) for dtype d.
inline ShaderId h_variant(DType d, ShaderId f32, ShaderId f16, ShaderId bf16) {
  return d == DType::f16 ? f16 : d == DType::bf16 ? bf16 : f32;
}

// Calls fn(start, count) over [0, n) in chunks that one binding of `esize`-byte elements can
// always cover (elementwise ops on tensors beyond maxStorageBufferRange).
template <class F>
void for_each_chunk(const VulkanDevice& dev, int64_t n, size_t esize, F&& fn) {
  int64_t chunk = dev.max_elems(esize);
  for (int64_t s = 0; s < n; s += chunk) fn(s, std::min(chunk, n - s));
}

inline uint32_t u32(int64_t v) {
  return static_cast<uint32_t>(v);
}

}  // namespace ct::vk
