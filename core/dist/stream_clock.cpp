#include "core/dist/stream_clock.h"

#include <thread>

namespace ct::dist {

size_t StreamClock::mark() {
  marks_.push_back({device_.record_event(), {}});
  poll();
  return marks_.size() - 1;
}

void StreamClock::poll() {
  for (; stamped_ < marks_.size(); ++stamped_) {
    if (!device_.event_done(marks_[stamped_].event)) return;
    marks_[stamped_].at = Clock::now();
  }
}

bool StreamClock::wait_all(double timeout_s) {
  const Clock::time_point start = Clock::now();
  for (poll(); stamped_ < marks_.size(); poll()) {
    if (timeout_s > 0 && std::chrono::duration<double>(Clock::now() - start).count() > timeout_s)
      return false;
    std::this_thread::yield();
  }
  return true;
}

}  // namespace ct::dist
