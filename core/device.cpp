#include "core/device.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace ct {

AdamWSchedule adamw_schedule(const AdamWHyper& hp) {
  CT_REQUIRE(hp.step >= 1 && hp.step <= (int64_t{1} << 24),
             "adamw_schedule: step " + std::to_string(hp.step) + " outside [1, 2^24]");
  const double t = static_cast<double>(hp.step);
  return {hp.lr, static_cast<float>(hp.step),
          static_cast<float>(1.0 - std::pow(static_cast<double>(hp.beta1), t)),
          static_cast<float>(1.0 - std::pow(static_cast<double>(hp.beta2), t))};
}

const char* mem_category_name(MemCategory c) {
  switch (c) {
    case MemCategory::kWeights:
      return "weights";
    case MemCategory::kGrads:
      return "grads";
    case MemCategory::kOptimizer:
      return "optimizer";
    case MemCategory::kActivations:
      return "activations";
    case MemCategory::kWorkspace:
      return "workspace";
  }
  return "?";
}

const char* device_type_name(DeviceType t) {
  switch (t) {
    case DeviceType::kCpu:
      return "cpu";
    case DeviceType::kIntegratedGpu:
      return "integrated-gpu";
    case DeviceType::kDiscreteGpu:
      return "discrete-gpu";
    case DeviceType::kVirtualGpu:
      return "virtual-gpu";
    case DeviceType::kOther:
      return "other";
  }
  return "?";
}

void MemoryTracker::on_alloc(MemCategory c, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  int i = static_cast<int>(c);
  s_.current[i] += static_cast<int64_t>(bytes);
  s_.peak[i] = std::max(s_.peak[i], s_.current[i]);
  s_.total_current += static_cast<int64_t>(bytes);
  s_.total_peak = std::max(s_.total_peak, s_.total_current);
}

void MemoryTracker::on_free(MemCategory c, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  s_.current[static_cast<int>(c)] -= static_cast<int64_t>(bytes);
  s_.total_current -= static_cast<int64_t>(bytes);
}

MemoryStats MemoryTracker::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return s_;
}

void MemoryTracker::reset_peaks() {
  std::lock_guard<std::mutex> lock(mu_);
  s_.peak = s_.current;
  s_.total_peak = s_.total_current;
}

Tensor Device::empty(const Shape& shape, DType dtype, MemCategory category) {
  Tensor t;
  t.dtype = dtype;
  t.shape = shape;
  t.strides = contiguous_strides(shape);
  size_t bytes = std::max<size_t>(t.nbytes(), 1);
  t.buffer = allocate(bytes, category);
  return t;
}

bool Event::done() const {
  return device_ == nullptr || device_->event_done(*this);
}

void Event::wait() const {
  if (device_) device_->wait_event(*this);
}

void Device::begin_capture() {
  fail(ErrorKind::kUnsupported, info().id() + " has no graphs (begin_capture)");
}
int64_t Device::end_capture() {
  fail(ErrorKind::kUnsupported, info().id() + " has no graphs (end_capture)");
}
void Device::replay_graph(int64_t graph) {
  (void)graph;
  fail(ErrorKind::kUnsupported, info().id() + " has no graphs (replay_graph)");
}
void Device::release_graph(int64_t graph) {
  (void)graph;
  fail(ErrorKind::kUnsupported, info().id() + " has no graphs (release_graph)");
}

Event Device::download_async(void* host, const Tensor& src, size_t bytes) {
  CT_REQUIRE(src.defined(), "download_async: source is undefined");
  CT_REQUIRE(&src.buffer->device() == this, "download_async: source " + src.describe() + " is on " +
                                                src.buffer->device().info().id() + ", not on " +
                                                info().id());
  CT_REQUIRE(src.is_contiguous(),
             "download_async: source " + src.describe() + " is not contiguous");
  CT_REQUIRE(bytes <= src.nbytes(),
             "download_async: " + std::to_string(bytes) + " bytes exceed " + src.describe());
  CT_REQUIRE(host != nullptr || bytes == 0, "download_async: host pointer is null");
  if (bytes == 0) return Event(this, 0);
  return download_async_kernel(host, src, bytes);
}

}  // namespace ct
