// NearestCode (the fast 8-bit code search of the CPU fast kernel) gives quantize_nearest's byte
// for every value: millions of random floats of several shapes, every interval boundary of its
// table, the codes, their neighbours and the midpoints between them, zeros, infinities and NaNs;
// through operator() and through encode() (the vectorised per-block path, with its division);
// for both dynamic codes and for other sorted tables (wider spans, and one too wide to use).
#include "backends/cpu/nearest_code.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backends/cpu/kernels.h"
#include "core/optim/quant_map.h"
#include "core/philox.h"

namespace ct {
namespace {

using cpu::NearestCode;
using cpu::quantize_nearest;

float from_bits(uint32_t b) {
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}
uint32_t bits_of(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}

// Values worth checking for `code`: edge cases, the codes, the midpoints between neighbours (and
// a few ulps either side), the lowest and highest float of every interval of the table, and
// 4M random values: uniform in [-1, 1], log-uniform magnitudes 1e-12..1 of either sign, and
// raw random bit patterns (any float, NaNs and denormals included).
std::vector<float> probe_values(const float* code) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> xs = {0.0f,
                           -0.0f,
                           1.0f,
                           -1.0f,
                           2.0f,
                           -2.0f,
                           inf,
                           -inf,
                           std::numeric_limits<float>::quiet_NaN(),
                           -std::numeric_limits<float>::quiet_NaN(),
                           from_bits(0x7f800001u),
                           from_bits(0xffc00001u),
                           std::numeric_limits<float>::denorm_min(),
                           -std::numeric_limits<float>::denorm_min(),
                           std::numeric_limits<float>::min(),
                           -std::numeric_limits<float>::min(),
                           std::numeric_limits<float>::max(),
                           -std::numeric_limits<float>::max(),
                           1e-7f,
                           -1e-7f,
                           0.5f,
                           -0.5f,
                           0.1f,
                           -0.1f};
  for (int i = 0; i < 256; ++i) {
    xs.push_back(code[i]);
    float c = code[i];
    for (int d = 0; d < 3; ++d) c = std::nextafter(c, inf), xs.push_back(c);
    c = code[i];
    for (int d = 0; d < 3; ++d) c = std::nextafter(c, -inf), xs.push_back(c);
    if (i < 255) {
      // The midpoint in float and in double rounded, and the ulps around it: the tie rule.
      float mids[2] = {(code[i] + code[i + 1]) / 2.0f,
                       static_cast<float>((static_cast<double>(code[i]) + code[i + 1]) / 2.0)};
      for (float m : mids) {
        xs.push_back(m);
        float up = m, down = m;
        for (int d = 0; d < 4; ++d) {
          up = std::nextafter(up, inf), down = std::nextafter(down, -inf);
          xs.push_back(up), xs.push_back(down);
        }
      }
    }
  }
  for (uint32_t p = 0; p < (1u << (32 - NearestCode::kKeyShift)); ++p) {  // interval ends
    const uint32_t lo_key = p << NearestCode::kKeyShift,
                   hi_key = lo_key | ((1u << NearestCode::kKeyShift) - 1);
    for (uint32_t k : {lo_key, hi_key})
      xs.push_back(from_bits((k & 0x80000000u) ? (k ^ 0x80000000u) : ~k));
  }
  Philox rng(7, 0);
  const uint64_t n = 1u << 20;
  for (uint64_t i = 0; i < n; ++i) {
    xs.push_back(2.0f * rng.uniform(4 * i) - 1.0f);
    const float mag = std::pow(10.0f, -12.0f * rng.uniform(4 * i + 1));
    xs.push_back(rng.u32(4 * i + 2) & 1 ? mag : -mag);
    xs.push_back(from_bits(rng.u32(4 * i + 3)));
  }
  for (uint64_t i = 0; i < n; ++i) xs.push_back(rng.normal(4 * n + i) * 0.3f);
  return xs;
}

// Every probe through operator(), and through encode() both on the normalised values (absmax 1)
// and on values scaled up by a block absmax (encode divides them back, as the kernel does).
void expect_same_as_search(const float* code, const NearestCode& nc) {
  std::vector<float> xs = probe_values(code);
  size_t bad = 0;
  for (float x : xs) {
    const uint8_t want = quantize_nearest(code, x), got = nc(x);
    if (got != want && ++bad <= 5)
      ADD_FAILURE() << "x = " << x << " (bits " << std::hex << bits_of(x) << std::dec
                    << "): " << int(got) << " instead of " << int(want);
  }
  EXPECT_EQ(bad, 0u) << "of " << xs.size() << " values";

  std::vector<uint8_t> out(xs.size());
  nc.encode(xs.data(), 1.0f, out.data(), static_cast<int64_t>(xs.size()));
  bad = 0;
  for (size_t i = 0; i < xs.size(); ++i) bad += out[i] != quantize_nearest(code, xs[i] / 1.0f);
  EXPECT_EQ(bad, 0u) << "encode, absmax 1";

  const float absmax = 3.7f;  // blocks of 256 as the kernel sees them
  std::vector<float> scaled(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) scaled[i] = xs[i] * absmax;
  bad = 0;
  for (size_t b = 0; b < xs.size(); b += 256) {
    const int64_t len = static_cast<int64_t>(std::min<size_t>(256, xs.size() - b));
    nc.encode(scaled.data() + b, absmax, out.data() + b, len);
    for (int64_t j = 0; j < len; ++j)
      bad += out[b + j] != quantize_nearest(code, scaled[b + j] / absmax);
  }
  EXPECT_EQ(bad, 0u) << "encode, absmax " << absmax;
  nc.encode(scaled.data(), 0.0f, out.data(), 256);  // an all-zero block: everything is x = 0
  for (int j = 0; j < 256; ++j) ASSERT_EQ(out[j], quantize_nearest(code, 0.0f));
}

TEST(NearestCode, SignedDynamicCodeMatchesTheSearch) {
  const NearestCode nc(dynamic_map_signed().data());
  EXPECT_EQ(nc.span(), 1);  // the fast path: one candidate per interval
  expect_same_as_search(dynamic_map_signed().data(), nc);
}

TEST(NearestCode, UnsignedDynamicCodeMatchesTheSearch) {
  const NearestCode nc(dynamic_map_unsigned().data());
  EXPECT_EQ(nc.span(), 1);
  expect_same_as_search(dynamic_map_unsigned().data(), nc);
}

TEST(NearestCode, OtherSortedTablesMatchTheSearch) {
  // Uniform codes in [0, 0.1] (span 2: two codes in some intervals near 0.1) and a cluster of
  // 256 consecutive floats (span 256: beyond the candidate padding, the binary-search fallback).
  std::vector<float> linear(256), cluster(256);
  for (int i = 0; i < 256; ++i) linear[i] = 0.1f * static_cast<float>(i) / 255.0f;
  cluster[0] = 0.75f;
  for (int i = 1; i < 256; ++i) cluster[i] = std::nextafter(cluster[i - 1], 2.0f);
  for (const auto* code : {&linear, &cluster}) {
    const NearestCode nc(code->data());
    EXPECT_GT(nc.span(), 1);
    expect_same_as_search(code->data(), nc);
  }
}

TEST(NearestCode, CachedTablesAreSharedPerCode) {
  auto a = NearestCode::cached(dynamic_map_signed().data());
  auto b = NearestCode::cached(dynamic_map_signed().data());
  auto c = NearestCode::cached(dynamic_map_unsigned().data());
  EXPECT_EQ(a.get(), b.get());
  EXPECT_NE(a.get(), c.get());
}

}  // namespace
}  // namespace ct
