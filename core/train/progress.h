// Human-facing progress: a one-line bar redrawn in place on a terminal, plain lines otherwise.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

namespace ct {

std::string format_bytes(int64_t bytes);      // "312.4 MiB"
std::string format_duration(double seconds);  // "1:05:09" or "2:03"
std::string format_count(double v);           // "12,345"

class ProgressBar {
 public:
  // total: number of steps; enabled: draw on a terminal (stderr must be a tty to draw at all).
  ProgressBar(int64_t first_step, int64_t total, bool enabled, std::FILE* out = stderr);
  ~ProgressBar();
  // Redraw with the latest figures (rate-limited to ~10 Hz on a terminal).
  void update(int64_t step, double loss, double tokens_per_s, int64_t memory_bytes);
  // Print a full line above the bar (log records, eval results) without breaking it.
  void println(const std::string& line);
  void finish();
  bool drawing() const { return tty_; }

 private:
  void draw(bool force);
  int64_t first_, total_, step_ = 0;
  double loss_ = 0, tps_ = 0;
  int64_t mem_ = 0;
  bool tty_;
  bool finished_ = false;
  std::FILE* out_;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

// A bar for work counted in bytes (tokenizing a corpus): "[####....] 12.3/27.0 MB  31.2 MB/s
// ETA 0:02". Thread-safe update(); drawn only when enabled and `out` is a terminal, else one
// summary line at finish().
class ByteProgress {
 public:
  ByteProgress(std::string label, int64_t total_bytes, bool enabled, std::FILE* out = stderr);
  ~ByteProgress();
  void update(int64_t done_bytes);
  void finish();

 private:
  void draw(bool force);
  std::string label_;
  int64_t total_, done_ = 0;
  bool tty_, finished_ = false;
  std::FILE* out_;
  std::chrono::steady_clock::time_point start_, last_draw_;
  std::mutex mu_;
};

}  // namespace ct
