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

void StreamClock::wait_all() {
  for (poll(); stamped_ < marks_.size(); poll()) std::this_thread::yield();
}

}  // namespace ct::dist
