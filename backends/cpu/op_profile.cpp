// --profile on the CPU devices (op_profile.h).
#include "backends/cpu/op_profile.h"

#include <algorithm>
#include <cstdio>
#include <utility>
#include <vector>

namespace ct::cpu {

void OpProfile::enable(bool on) {
  if (on && !on_) {
    rows_.clear();
    paths_.clear();
    start_ = Clock::now();
  }
  on_ = on;
  depth_ = 0;
}

void OpProfile::begin(const char* op) {
  if (!on_ || depth_++ > 0) return;
  open_ = op;
  staging_s_ = 0;
  t0_ = Clock::now();
}

void OpProfile::end() {
  if (!on_ || depth_ == 0 || --depth_ > 0) return;
  Row& r = rows_[open_];
  r.calls += 1;
  r.seconds += std::chrono::duration<double>(Clock::now() - t0_).count();
  r.staging_s += staging_s_;
}

void OpProfile::count_path(const std::string& path) {
  if (on_) paths_[path] += 1;
}

std::string OpProfile::report(const std::string& device_id) const {
  const double wall_ms = 1e3 * std::chrono::duration<double>(Clock::now() - start_).count();
  std::vector<std::pair<std::string, Row>> rows(rows_.begin(), rows_.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  double total = 0, staging = 0;
  for (const auto& [op, r] : rows) total += r.seconds, staging += r.staging_s;
  std::string s = device_id + " profile: wall time per op (ops run eagerly on the host)\n";
  char line[256];
  std::snprintf(line, sizeof line, "  %-28s %9s %12s %10s %7s %12s\n", "op", "calls", "total ms",
                "mean us", "share", "16-bit ms");
  s += line;
  for (const auto& [op, r] : rows) {
    std::snprintf(line, sizeof line, "  %-28s %9lld %12.2f %10.1f %6.1f%% %12.2f\n", op.c_str(),
                  static_cast<long long>(r.calls), 1e3 * r.seconds,
                  r.calls ? 1e6 * r.seconds / static_cast<double>(r.calls) : 0.0,
                  total > 0 ? 100.0 * r.seconds / total : 0.0, 1e3 * r.staging_s);
    s += line;
  }
  std::snprintf(line, sizeof line,
                "  %-28s %9s %12.2f  (%.1f%% of the %.1f ms since profiling began)\n", "total", "",
                1e3 * total, wall_ms > 0 ? 1e5 * total / wall_ms : 0.0, wall_ms);
  s += line;
  std::snprintf(line, sizeof line,
                "  16-bit ms: widening 16-bit tensors to f32 and rounding results back, "
                "%.2f ms in all\n",
                1e3 * staging);
  s += line;
  if (!paths_.empty()) s += device_id + " profile: kernel path per op (calls)\n";
  for (const auto& [path, calls] : paths_) s += "  " + path + "  " + std::to_string(calls) + "\n";
  return s;
}

}  // namespace ct::cpu
