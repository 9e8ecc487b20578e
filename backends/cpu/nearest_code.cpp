#include "backends/cpu/nearest_code.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <mutex>

#include "backends/cpu/kernels.h"

namespace ct::cpu {
namespace {

float from_key(uint32_t k) {
  const uint32_t b = (k & 0x80000000u) ? (k ^ 0x80000000u) : ~k;
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}

// #{i < n : a[i] < x} for ascending a.
int count_below(const float* a, int n, float x) {
  return static_cast<int>(std::lower_bound(a, a + n, x, [](float c, float v) { return c < v; }) -
                          a);
}

}  // namespace

NearestCode::NearestCode(const float* code) : first_(size_t{1} << (32 - kKeyShift)) {
  const float inf = std::numeric_limits<float>::infinity();
  std::copy(code, code + 256, code_.begin());
  // T[i]: the last float of [code[i-1], code[i]] (in key order) where quantize_nearest's test
  // for lo = i, x - code[i-1] <= code[i] - x, still holds; it holds at code[i-1] itself.
  for (int i = 1; i < 256; ++i) {
    const float a = code[i - 1], c = code[i];
    auto keeps_lower = [&](uint32_t k) {
      const float x = from_key(k);
      return x - a <= c - x;
    };
    uint32_t lo = key(a), hi = key(c);  // invariant: keeps_lower(lo); the answer is in [lo, hi]
    while (lo < hi) {
      const uint32_t mid = lo + (hi - lo + 1) / 2;
      if (keeps_lower(mid))
        lo = mid;
      else
        hi = mid - 1;
    }
    thresholds_[static_cast<size_t>(i - 1)] = from_key(lo);
  }
  std::fill(thresholds_.begin() + 255, thresholds_.end(), inf);
  // Per interval: the count at its lowest float, and how much it grows up to its highest. NaN
  // keys count as the infinity beside them (a NaN's count is never used).
  auto count_at_key = [&](uint32_t k) {
    return count_below(thresholds_.data(), 255, from_key(std::clamp(k, key(-inf), key(inf))));
  };
  const uint32_t intervals = uint32_t{1} << (32 - kKeyShift);
  for (uint32_t p = 0; p < intervals; ++p) {
    const uint32_t lowest = p << kKeyShift, highest = lowest | ((uint32_t{1} << kKeyShift) - 1);
    const int c = count_at_key(lowest);
    first_[p] = c;
    span_ = std::max(span_, count_at_key(highest) - c);
  }
}

uint8_t NearestCode::lookup_any(float x) const {
  return span_ > kMaxSpan ? quantize_nearest(code_.data(), x) : lookup(x, span_);
}

void NearestCode::encode(const float* values, float absmax, uint8_t* out, int64_t n) const {
  if (!(absmax > 0.0f)) {  // the reference's x = 0 for the whole block (also for a NaN absmax)
    std::fill(out, out + n, (*this)(0.0f));
    return;
  }
  if (span_ > 1) {
    for (int64_t j = 0; j < n; ++j) out[j] = lookup_any(values[j] / absmax);
    return;
  }
  // lookup(x, 1) over raw pointers, so that GCC vectorises it (two gathers, a compare, a
  // blend); the scalar form pays a mispredicted branch about every other value.
  const float* t = thresholds_.data();
  const int32_t* first = first_.data();
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    const float x = values[j] / absmax;
    const int base = first[key(x) >> kKeyShift];
    const int r = base + (t[base] < x ? 1 : 0);
    out[j] =
        static_cast<uint8_t>(r & -static_cast<int>(x == x));  // NaN -> 0; a mask, not
                                                              // `?:`, which GCC leaves a branch
  }
}

std::shared_ptr<const NearestCode> NearestCode::cached(const float* code) {
  constexpr size_t kKeep = 8;  // the two dynamic codes in practice
  static std::mutex mu;
  static std::deque<std::shared_ptr<const NearestCode>> tables;
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& t : tables)
    if (std::memcmp(t->code_.data(), code, sizeof t->code_) == 0) return t;
  if (tables.size() == kKeep) tables.pop_front();  // users hold their own reference
  tables.push_back(std::make_shared<const NearestCode>(code));
  return tables.back();
}

}  // namespace ct::cpu
