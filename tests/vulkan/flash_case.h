// The fused attention's cases for the Vulkan tests (flash_attention_coopmat_test.cpp,
// flash_attention_unrolled_test.cpp): a shape, dtype and seed, and one forward and backward of it
// on a device with the outputs as values and as bytes.
#pragma once

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "tests/common/half_compare.h"
#include "tests/vulkan/vulkan_fixture.h"

namespace ct::vktest {

struct FlashCase {
  int64_t B, T, NH, NKV, hs;
  DType dt;
  uint64_t seed;
  float vscale = 1.0f, dscale = 1.0f;  // v's and dout's values multiplied by these
  float qscale = 1.0f;                 // and q's
  int tiny_every = 0;      // > 0: every tiny_every-th value of qkv and dout also times 2^-32
  float odd_scale = 1.0f;  // the odd-indexed values of qkv and dout also times this
  int64_t C() const { return NH * hs; }
  int64_t W() const { return C() + 2 * NKV * hs; }  // qkv's row
  std::string name() const {
    std::ostringstream os;
    os << dtype_name(dt) << " B" << B << " T" << T << " NH" << NH << " NKV" << NKV << " hs" << hs;
    if (vscale != 1.0f) os << " v x" << vscale << " dout x" << dscale;
    if (qscale != 1.0f) os << " q x" << qscale;
    if (tiny_every > 0) os << " every " << tiny_every << "th x 2^-32";
    if (odd_scale != 1.0f) os << " odd x" << odd_scale;
    return os.str();
  }
};

struct FlashOut {
  Vec out, lse, dqkv;
  std::vector<uint8_t> raw;  // the bytes of out, lse and dqkv
};

inline FlashOut run_flash(Device& d, const FlashCase& c) {
  Vec qkv = randn(c.B * c.T * c.W(), c.seed), dout = randn(c.B * c.T * c.C(), c.seed + 1);
  for (size_t i = 0; i < qkv.size(); ++i) {
    if (int64_t(i) % c.W() >= c.C() + c.NKV * c.hs) qkv[i] *= c.vscale;
    if (int64_t(i) % c.W() < c.C()) qkv[i] *= c.qscale;
  }
  for (float& x : dout) x *= c.dscale;
  for (size_t i = 1; i < qkv.size(); i += 2) qkv[i] *= c.odd_scale;
  for (size_t i = 1; i < dout.size(); i += 2) dout[i] *= c.odd_scale;
  if (c.tiny_every > 0) {
    for (size_t i = 0; i < qkv.size(); i += c.tiny_every) qkv[i] = std::ldexp(qkv[i], -32);
    for (size_t i = 0; i < dout.size(); i += c.tiny_every) dout[i] = std::ldexp(dout[i], -32);
  }
  Tensor tq = up_as(d, {c.B, c.T, c.W()}, qkv, c.dt), td = up_as(d, {c.B, c.T, c.C()}, dout, c.dt);
  Tensor to = d.empty({c.B, c.T, c.C()}, c.dt, MemCategory::kActivations);
  Tensor tl = d.empty({c.B, c.NH, c.T}, DType::f32, MemCategory::kActivations);
  Tensor tdq = d.empty({c.B, c.T, c.W()}, c.dt, MemCategory::kActivations);
  d.fill(to, NAN);  // every element written: no NaN may remain
  d.fill(tl, NAN);
  d.fill(tdq, NAN);
  const int nh = static_cast<int>(c.NH), nkv = static_cast<int>(c.NKV);
  d.flash_attention_forward(to, tl, tq, nh, nkv);
  d.flash_attention_backward(tdq, td, tq, to, tl, nh, nkv);
  FlashOut r{download_h(d, to), download(d, tl), download_h(d, tdq), {}};
  for (const Tensor* t : {&to, &tl, &tdq}) {
    std::vector<uint8_t> b = raw_download(d, *t);
    r.raw.insert(r.raw.end(), b.begin(), b.end());
  }
  return r;
}

}  // namespace ct::vktest
