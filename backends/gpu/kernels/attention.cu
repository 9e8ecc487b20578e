// PLACEHOLDER: launchers that throw until the kernels are written (work in progress).
#include <stdexcept>

#include "backends/gpu/kernels.h"

namespace ct::gpu {

void attention_forward(const Ctx& cx, void* out, void* att, const void* qkv, Elem e, std::int64_t B,
                       std::int64_t T, std::int64_t C, std::int64_t NH) {
  throw std::logic_error("attention_forward: not written yet (placeholder)");
}
std::size_t attention_backward_workspace(std::int64_t B, std::int64_t T, std::int64_t C,
                                         std::int64_t NH) {
  return 0;
}
void attention_backward(const Ctx& cx, void* dqkv, const void* dout, const void* qkv,
                        const void* att, Elem e, std::int64_t B, std::int64_t T, std::int64_t C,
                        std::int64_t NH, void* workspace) {
  throw std::logic_error("attention_backward: not written yet (placeholder)");
}

}  // namespace ct::gpu
