// A fast form of quantize_nearest (backends/cpu/kernels.h) for one fixed 8-bit code table: the
// same byte for every float, NaN and infinities included, without the 8-step binary search.
//
// quantize_nearest(code, x) takes lo = #{i : code[i] < x}, then lo - 1 when
// x - code[lo - 1] <= code[lo] - x (in float arithmetic), else lo (0 and 255 at the ends; 0 for
// NaN). On (code[i-1], code[i]] that choice is a monotone predicate of x (the left side rounds
// up with x, the right side down), so it flips from i-1 to i at one float: the threshold T[i],
// the largest x in [code[i-1], code[i]] for which the predicate holds. Hence for every x that is
// not NaN
//   quantize_nearest(code, x) = #{i in 1..255 : T[i] < x},
// a count over a sorted array. The count is found without a search: the floats are cut into
// 2^16 intervals by the top 16 bits of an order-preserving integer key (sign, exponent, 7
// mantissa bits); a table holds the count at each interval's lowest float, and at most `span`
// thresholds (1 for both dynamic codes) lie inside any interval, so the count for x is the
// table's entry plus span comparisons. Exact by construction; tested against the search.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

namespace ct::cpu {

class NearestCode {
 public:
  static constexpr int kKeyShift = 16;  // intervals = 2^(32 - kKeyShift)

  // code[256], sorted ascending (any such table). Builds the tables (~1 ms).
  explicit NearestCode(const float* code);
  // The tables for `code`, built once per distinct code and shared (thread-safe; the last few
  // distinct codes are kept).
  static std::shared_ptr<const NearestCode> cached(const float* code);

  // quantize_nearest(code, x).
  uint8_t operator()(float x) const { return span_ <= 1 ? lookup(x, 1) : lookup_any(x); }
  // out[j] = quantize_nearest(code, absmax > 0 ? values[j] / absmax : 0), j < n: the 8-bit
  // optimizer's per-block quantisation.
  void encode(const float* values, float absmax, uint8_t* out, int64_t n) const;
  int span() const { return span_; }

  // The order-preserving key: unsigned order of keys = float order (-0 just below +0; NaNs
  // beyond the infinities).
  static uint32_t key(float x) {
    uint32_t b;
    std::memcpy(&b, &x, 4);
    return b ^ (static_cast<uint32_t>(static_cast<int32_t>(b) >> 31) | 0x80000000u);
  }

 private:
  static constexpr int kMaxSpan = 8;
  // The count via the table and `span` >= span_ comparisons; NaN compares false everywhere and
  // is sent to 0 as quantize_nearest does.
  uint8_t lookup(float x, int span) const {
    const int base = first_[key(x) >> kKeyShift];
    int r = base;
    for (int k = 0; k < span; ++k) r += thresholds_[base + k] < x ? 1 : 0;
    return static_cast<uint8_t>(x == x ? r : 0);
  }
  // Spans above 1 (no dynamic code has one; any sorted table is accepted), or the binary search
  // when a table's span is too wide for the padding.
  uint8_t lookup_any(float x) const;

  std::array<float, 256> code_;
  // T[1..255] at [0, 255), then +inf padding (never < x) so `span` comparisons stay in bounds.
  std::array<float, 255 + kMaxSpan> thresholds_;
  // #{T < the interval's lowest float}. int32 rather than uint8 so that encode()'s loop
  // vectorises with gathers (256 KiB, of which the values an optimizer meets touch a few KiB).
  std::vector<int32_t> first_;
  int span_ = 0;
};

}  // namespace ct::cpu
