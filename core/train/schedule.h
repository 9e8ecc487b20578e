// Learning-rate schedules with linear warmup, as Hugging Face's get_*_schedule_with_warmup.
#pragma once

#include <cstdint>
#include <string>

namespace ct {

enum class LrSchedule { kCosine, kLinear, kConstant };

// "cosine" | "linear" | "constant" (also HF's "constant_with_warmup"); throws naming the flag.
LrSchedule parse_lr_schedule(const std::string& name);
const char* lr_schedule_name(LrSchedule s);

// Learning rate for optimizer step `step` (0-based: the lr used by the step that makes the
// (step+1)-th update) out of `total_steps`: base * step / warmup during warmup, then the decay.
double lr_at(LrSchedule s, double base_lr, int64_t step, int64_t warmup_steps, int64_t total_steps);

}  // namespace ct
