#include "core/train/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace ct {

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (std::fabs(v) >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  auto s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  return buf;
}

std::string format_count(double v) {
  auto n = static_cast<long long>(std::llround(v));
  std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return (n < 0 ? "-" : "") + out;
}

ProgressBar::ProgressBar(int64_t first_step, int64_t total, bool enabled, std::FILE* out)
    : first_(first_step),
      total_(total),
      step_(first_step),
      tty_(enabled && isatty(fileno(out))),
      out_(out),
      start_(std::chrono::steady_clock::now()),
      last_draw_() {}

ProgressBar::~ProgressBar() {
  finish();
}

void ProgressBar::update(int64_t step, double loss, double tokens_per_s, int64_t memory_bytes) {
  step_ = step;
  loss_ = loss;
  tps_ = tokens_per_s;
  mem_ = memory_bytes;
  draw(false);
}

void ProgressBar::println(const std::string& line) {
  if (tty_) std::fprintf(out_, "\r\033[2K");
  std::fprintf(out_, "%s\n", line.c_str());
  if (tty_) draw(true);
  std::fflush(out_);
}

void ProgressBar::draw(bool force) {
  if (!tty_ || finished_) return;
  auto now = std::chrono::steady_clock::now();
  if (!force && now - last_draw_ < std::chrono::milliseconds(100) && step_ < total_) return;
  last_draw_ = now;
  double elapsed = std::chrono::duration<double>(now - start_).count();
  int64_t done = step_ - first_;
  double eta =
      done > 0 ? elapsed / static_cast<double>(done) * static_cast<double>(total_ - step_) : NAN;
  constexpr int kWidth = 24;
  int filled = total_ > 0 ? static_cast<int>(kWidth * step_ / total_) : 0;
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(kWidth, '.');
  std::fprintf(out_, "\r\033[2K[%s] step %lld/%lld  loss %.4f  %s tok/s  ETA %s  mem %s",
               bar.c_str(), static_cast<long long>(step_), static_cast<long long>(total_), loss_,
               format_count(tps_).c_str(), format_duration(eta).c_str(),
               format_bytes(mem_).c_str());
  std::fflush(out_);
}

void ProgressBar::finish() {
  if (tty_ && !finished_) {
    draw(true);
    std::fprintf(out_, "\n");
    std::fflush(out_);
  }
  finished_ = true;
}

ByteProgress::ByteProgress(std::string label, int64_t total_bytes, bool enabled, std::FILE* out)
    : label_(std::move(label)),
      total_(total_bytes),
      tty_(enabled && isatty(fileno(out))),
      out_(out),
      start_(std::chrono::steady_clock::now()),
      last_draw_() {}

ByteProgress::~ByteProgress() {
  finish();
}

void ByteProgress::update(int64_t done_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  done_ = done_bytes;
  if (tty_ && !finished_) draw(false);
}

void ByteProgress::draw(bool force) {
  auto now = std::chrono::steady_clock::now();
  if (!force && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double rate = elapsed > 0 ? static_cast<double>(done_) / elapsed : 0;
  const double eta = rate > 0 ? static_cast<double>(total_ - done_) / rate : NAN;
  constexpr int kWidth = 24;
  const int filled = total_ > 0 ? static_cast<int>(kWidth * done_ / total_) : kWidth;
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(kWidth, '.');
  std::fprintf(out_, "%s[%s] %s  %.1f/%.1f MB  %.1f MB/s  %s %s", tty_ ? "\r\033[2K" : "",
               bar.c_str(), label_.c_str(), static_cast<double>(done_) / 1e6,
               static_cast<double>(total_) / 1e6, rate / 1e6, finished_ ? "in" : "ETA",
               format_duration(finished_ ? elapsed : eta).c_str());
  std::fflush(out_);
}

void ByteProgress::finish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  finished_ = true;
  done_ = std::max(done_, int64_t{0});
  draw(true);  // on a terminal the final bar, else the one summary line
  std::fprintf(out_, "\n");
  std::fflush(out_);
}

}  // namespace ct
