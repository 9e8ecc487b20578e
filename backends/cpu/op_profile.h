// --profile on the CPU devices: wall time per public op (ops run eagerly on the calling thread,
// so the time between an op's begin and end is its cost), the part of it spent widening 16-bit
// tensors to f32 and rounding results back (the staging of cpu_device.cpp), and which path ran
// the matmuls with 16-bit operands.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

namespace ct::cpu {

class OpProfile {
 public:
  // From `on`: counting starts afresh; off: nothing is counted (the calls below cost a branch).
  void enable(bool on);
  bool enabled() const { return on_; }

  // The outermost scope of a public op (core/op_checks.cpp nests ops that call ops).
  void begin(const char* op);
  void end();
  // Seconds of 16-bit staging inside the open op.
  void add_staging(double seconds) { staging_s_ += seconds; }
  // One call of a named kernel path ("matmul bf16: widened to f32").
  void count_path(const std::string& path);

  // The table: op, calls, total ms, mean us, share, of which staging ms; then the paths.
  std::string report(const std::string& device_id) const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Row {
    int64_t calls = 0;
    double seconds = 0, staging_s = 0;
  };
  bool on_ = false;
  int depth_ = 0;
  const char* open_ = nullptr;
  Clock::time_point t0_, start_;
  double staging_s_ = 0;
  std::map<std::string, Row> rows_;
  std::map<std::string, int64_t> paths_;
};

}  // namespace ct::cpu
