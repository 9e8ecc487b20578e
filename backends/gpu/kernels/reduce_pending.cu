// PLACEHOLDER: launchers that throw until the kernels are written (work in progress).
#include <stdexcept>

#include "backends/gpu/kernels.h"

namespace ct::gpu {

std::size_t reduce_workspace(std::int64_t n) { return 0; }
void sum(const Ctx& cx, float* out, const float* x, std::int64_t n, float scale, void* workspace) { throw std::logic_error("sum: not written yet (placeholder)"); }
void norm(const Ctx& cx, float* out, const float* x, std::int64_t n, void* workspace) { throw std::logic_error("norm: not written yet (placeholder)"); }
void check_finite(const Ctx& cx, std::int32_t* flag, const float* x, std::int64_t n) { throw std::logic_error("check_finite: not written yet (placeholder)"); }
void unscale_check(const Ctx& cx, float* x, std::int32_t* flag, float inv_scale, std::int64_t n) { throw std::logic_error("unscale_check: not written yet (placeholder)"); }

}  // namespace ct::gpu
