#include "core/amp/loss_scaler.h"

#include <string>

#include "core/error.h"

namespace ct {

LossScaler::LossScaler(bool enabled, LossScalerConfig config)
    : enabled_(enabled), config_(config), scale_(config.init_scale) {}

bool LossScaler::unscale_and_check(Device& device, const Tensor& grads) {
  if (!enabled_) return false;
  if (!flag_.defined()) flag_ = device.empty({1}, DType::i32, MemCategory::kWorkspace);
  device.fill(flag_, 0.0f);
  device.unscale_check(grads, flag_, 1.0f / scale_);
  int32_t found = 0;
  device.download(&found, flag_, sizeof found);
  return found != 0;
}

void LossScaler::update(bool found_inf, int64_t step) {
  if (!enabled_) return;
  if (found_inf) {
    scale_ *= config_.backoff_factor;
    growth_tracker_ = 0;
    ++skipped_;
    if (++consecutive_skips_ >= config_.max_consecutive_skips)
      fail(ErrorKind::kInvalidArgument,
           "fp16 training stopped at step " + std::to_string(step) +
               ": the gradients were inf/NaN for " + std::to_string(consecutive_skips_) +
               " steps in a row (loss scale now " + std::to_string(scale_) +
               "), so the loss itself is not finite; try a lower --learning-rate or --bf16");
    return;
  }
  consecutive_skips_ = 0;
  if (++growth_tracker_ >= config_.growth_interval) {
    scale_ *= config_.growth_factor;
    growth_tracker_ = 0;
  }
}

nlohmann::json LossScaler::state() const {
  return {{"enabled", enabled_},
          {"scale", scale_},
          {"growth_tracker", growth_tracker_},
          {"skipped_steps", skipped_},
          {"consecutive_skips", consecutive_skips_},
          {"growth_factor", config_.growth_factor},
          {"backoff_factor", config_.backoff_factor},
          {"growth_interval", config_.growth_interval}};
}

void LossScaler::load_state(const nlohmann::json& j) {
  if (!enabled_ || !j.is_object() || !j.value("enabled", false)) return;
  scale_ = j.at("scale").get<float>();
  growth_tracker_ = j.at("growth_tracker").get<int64_t>();
  skipped_ = j.at("skipped_steps").get<int64_t>();
  consecutive_skips_ = j.value("consecutive_skips", int64_t{0});
}

}  // namespace ct
