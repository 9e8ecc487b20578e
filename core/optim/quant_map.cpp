#include "core/optim/quant_map.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace ct {
namespace {

std::array<float, 256> build(bool is_signed) {
  constexpr int kExponentBits = 7;
  std::vector<double> data;
  for (int k = 0; k < kExponentBits; ++k) {
    const int intervals = is_signed ? (1 << k) : (1 << (k + 1));
    const double scale = std::pow(10.0, k - (kExponentBits - 1));
    for (int j = 0; j < intervals; ++j) {
      // Midpoint of the j-th interval of `intervals` equal parts of [0.1, 1].
      double lo = 0.1 + 0.9 * j / intervals, hi = 0.1 + 0.9 * (j + 1) / intervals;
      double mid = (lo + hi) / 2.0;
      data.push_back(scale * mid);
      if (is_signed) data.push_back(-scale * mid);
    }
  }
  data.push_back(0.0);
  data.push_back(1.0);
  std::array<float, 256> out{};
  std::vector<float> f(data.begin(), data.end());
  std::sort(f.begin(), f.end());
  std::copy(f.begin(), f.end(), out.begin());
  return out;
}

}  // namespace

const std::array<float, 256>& dynamic_map_signed() {
  static const std::array<float, 256> m = build(true);
  return m;
}

const std::array<float, 256>& dynamic_map_unsigned() {
  static const std::array<float, 256> m = build(false);
  return m;
}

}  // namespace ct
