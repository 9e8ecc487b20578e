// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"): a counter-based
// generator. The value for (key, counter) is a pure function, so every backend and every thread
// can produce the same stream element without shared state.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

namespace ct {

using PhiloxBlock = std::array<uint32_t, 4>;

inline PhiloxBlock philox4x32(PhiloxBlock ctr, std::array<uint32_t, 2> key) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(kM0) * ctr[0];
    uint64_t p1 = static_cast<uint64_t>(kM1) * ctr[2];
    ctr = {static_cast<uint32_t>(p1 >> 32) ^ ctr[1] ^ key[0], static_cast<uint32_t>(p1),
           static_cast<uint32_t>(p0 >> 32) ^ ctr[3] ^ key[1], static_cast<uint32_t>(p0)};
    key[0] += kW0;
    key[1] += kW1;
  }
  return ctr;
}

// Uniform in (0, 1): 24 random bits, centred in their bucket so 0 never occurs.
inline float uint_to_unit_float(uint32_t x) {
  return (static_cast<float>(x >> 8) + 0.5f) * (1.0f / 16777216.0f);
}

// Stream `stream` of seed `seed`: element i is a pure function of (seed, stream, i).
class Philox {
 public:
  Philox(uint64_t seed, uint64_t stream)
      : key_{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)},
        stream_lo_(static_cast<uint32_t>(stream)),
        stream_hi_(static_cast<uint32_t>(stream >> 32)) {}

  // Four uniform 32-bit words for block `block`.
  PhiloxBlock block(uint64_t block) const {
    return philox4x32(
        {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), stream_lo_, stream_hi_},
        key_);
  }
  uint32_t u32(uint64_t i) const { return block(i / 4)[i % 4]; }
  float uniform(uint64_t i) const { return uint_to_unit_float(u32(i)); }
  // Standard normal element i (Box-Muller over the block's words 0,1 or 2,3).
  float normal(uint64_t i) const {
    PhiloxBlock b = block(i / 2);
    int pair = static_cast<int>(i % 2);
    float u1 = uint_to_unit_float(b[2 * pair]);
    float u2 = uint_to_unit_float(b[2 * pair + 1]);
    float r = std::sqrt(-2.0f * std::log(u1));
    return r * std::cos(6.2831853071795864f * u2);
  }

 private:
  std::array<uint32_t, 2> key_;
  uint32_t stream_lo_, stream_hi_;
};

}  // namespace ct
