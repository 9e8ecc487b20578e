// Dynamic loss scaling for fp16 with PyTorch GradScaler's semantics and defaults: the loss is
// multiplied by `scale` before backward; afterwards the gradients are unscaled and checked in one
// pass; a step with an inf/NaN gradient is skipped (parameters and optimizer state untouched)
// and the scale halves; after `growth_interval` clean steps in a row the scale doubles.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

#include "core/device.h"

namespace ct {

struct LossScalerConfig {
  float init_scale = 65536.0f;
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  int64_t growth_interval = 2000;
  // A run stops once this many steps in a row had non-finite gradients: at that point the
  // scale has fallen by 2^N, so the loss itself is non-finite rather than merely overflowing.
  int64_t max_consecutive_skips = 40;
};

class LossScaler {
 public:
  explicit LossScaler(bool enabled, LossScalerConfig config = {});
  bool enabled() const { return enabled_; }
  float scale() const { return enabled_ ? scale_ : 1.0f; }

  // Unscales `grads` (f32) in place and reports whether any element is inf/NaN. Reads one flag
  // back from the device (a host wait, as PyTorch's GradScaler.step does). Disabled: returns
  // false without touching anything.
  bool unscale_and_check(Device& device, const Tensor& grads);
  // Moves the scale after a step: backoff when found_inf, growth after growth_interval clean
  // steps. Throws Error(kInvalidArgument) with a diagnostic after max_consecutive_skips.
  void update(bool found_inf, int64_t step);

  int64_t skipped_steps() const { return skipped_; }
  nlohmann::json state() const;
  void load_state(const nlohmann::json& j);

 private:
  bool enabled_;
  LossScalerConfig config_;
  float scale_;
  int64_t growth_tracker_ = 0;
  int64_t skipped_ = 0;
  int64_t consecutive_skips_ = 0;
  Tensor flag_;
};

}  // namespace ct
