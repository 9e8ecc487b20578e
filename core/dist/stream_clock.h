// When points of a device's stream were reached, on the host's clock: the timing of collectives
// enqueued on the stream (--ddp-backend nccl), which the host does not wait for. mark() records an
// event after everything enqueued so far; each mark is stamped with the host time at which it is
// first seen complete: at once on a device whose ops have run when they return (cpu, simt), else
// when poll() or wait_all() finds it done (a GPU: as early as the host looks, so the stamps lag
// the device by up to the time between polls; wait_all() polls continuously).
#pragma once

#include <chrono>
#include <cstddef>
#include <vector>

#include "core/device.h"

namespace ct::dist {

class StreamClock {
 public:
  using Clock = std::chrono::steady_clock;
  explicit StreamClock(Device& device) : device_(device) {}
  // A new mark after every op enqueued so far; its number.
  size_t mark();
  // Stamps the marks now complete, in order (the stream is in order: once one is not, the later
  // ones are not either).
  void poll();
  // Returns true once every mark is stamped (yielding the core between polls), false when that
  // took more than `timeout_s` seconds (<= 0: no limit).
  bool wait_all(double timeout_s = 0);
  Clock::time_point at(size_t mark) const { return marks_[mark].at; }
  void clear() { marks_.clear(), stamped_ = 0; }

 private:
  struct Mark {
    Event event;
    Clock::time_point at;
  };
  Device& device_;
  std::vector<Mark> marks_;
  size_t stamped_ = 0;  // marks_[0, stamped_) have their time
};

}  // namespace ct::dist
