#include "core/train/schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace ct {

LrSchedule parse_lr_schedule(const std::string& name) {
  if (name == "cosine") return LrSchedule::kCosine;
  if (name == "linear") return LrSchedule::kLinear;
  if (name == "constant" || name == "constant_with_warmup") return LrSchedule::kConstant;
  fail(ErrorKind::kInvalidArgument,
       "--lr-scheduler-type: unknown scheduler '" + name + "' (choose cosine, linear or constant)");
}

const char* lr_schedule_name(LrSchedule s) {
  switch (s) {
    case LrSchedule::kCosine:
      return "cosine";
    case LrSchedule::kLinear:
      return "linear";
    case LrSchedule::kConstant:
      return "constant";
  }
  return "?";
}

double lr_at(LrSchedule s, double base_lr, int64_t step, int64_t warmup_steps,
             int64_t total_steps) {
  if (step < warmup_steps)
    return base_lr * static_cast<double>(step) /
           static_cast<double>(std::max<int64_t>(1, warmup_steps));
  if (s == LrSchedule::kConstant) return base_lr;
  double progress = static_cast<double>(step - warmup_steps) /
                    static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
  progress = std::clamp(progress, 0.0, 1.0);
  if (s == LrSchedule::kLinear) return base_lr * (1.0 - progress);
  return base_lr * 0.5 * (1.0 + std::cos(M_PI * progress));
}

}  // namespace ct
