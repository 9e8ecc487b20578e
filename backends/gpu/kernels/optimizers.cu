// PLACEHOLDER: launchers that throw until the kernels are written (work in progress).
#include <stdexcept>

#include "backends/gpu/kernels.h"

namespace ct::gpu {

void adamw(const Ctx& cx, float* param, const float* grad, float* m, float* v,
           const float* grad_norm, std::int64_t n, const AdamArgs& h) {
  throw std::logic_error("adamw: not written yet (placeholder)");
}
void sgd(const Ctx& cx, float* param, const float* grad, float* momentum_buf,
         const float* grad_norm, std::int64_t n, const SgdArgs& h) {
  throw std::logic_error("sgd: not written yet (placeholder)");
}
void lion(const Ctx& cx, float* param, const float* grad, float* m, const float* grad_norm,
          std::int64_t n, const LionArgs& h) {
  throw std::logic_error("lion: not written yet (placeholder)");
}
void adamw_8bit(const Ctx& cx, float* param, const float* grad, std::uint8_t* m_q,
                std::uint8_t* v_q, float* m_absmax, float* v_absmax, const float* qmap_signed,
                const float* qmap_unsigned, const float* grad_norm, std::int64_t n,
                const AdamArgs& h) {
  throw std::logic_error("adamw_8bit: not written yet (placeholder)");
}
std::size_t adafactor_workspace(std::int64_t R, std::int64_t C) {
  return 0;
}
void adafactor(const Ctx& cx, float* param, const float* grad, float* row, float* col, float* v,
               float* exp_avg, const float* grad_norm, std::int64_t R, std::int64_t C,
               const AdafactorArgs& h, void* workspace) {
  throw std::logic_error("adafactor: not written yet (placeholder)");
}

}  // namespace ct::gpu
