// PLACEHOLDER: launchers that throw until the kernels are written (work in progress).
#include <stdexcept>

#include "backends/gpu/kernels.h"

namespace ct::gpu {

void fill_pattern(const Ctx& cx, void* dst, std::int64_t n, int width, std::uint32_t pattern) { throw std::logic_error("fill_pattern: not written yet (placeholder)"); }
void convert(const Ctx& cx, void* dst, Elem dst_elem, const void* src, Elem src_elem, std::int64_t n) { throw std::logic_error("convert: not written yet (placeholder)"); }
void add(const Ctx& cx, float* out, const float* a, const void* b, Elem b_elem, std::int64_t n) { throw std::logic_error("add: not written yet (placeholder)"); }
void accumulate(const Ctx& cx, float* dst, const float* src, std::int64_t n) { throw std::logic_error("accumulate: not written yet (placeholder)"); }
void scale(const Ctx& cx, float* t, float s, std::int64_t n) { throw std::logic_error("scale: not written yet (placeholder)"); }

}  // namespace ct::gpu
