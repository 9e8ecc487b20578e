// crossentropy_forward / crossentropy_backward, including in place (dlogits aliasing logits),
// and crossentropy_forward_backward (both in one pass, in place): every device against the
// reference; the reference against fp64 and central differences; rows with padding columns
// (valid < Vp: a vocabulary padded to an aligned width), f32 and 16-bit.
#include <cstring>

#include "tests/common/device_harness.h"
#include "tests/common/fp64_ops.h"
#include "tests/common/half_compare.h"

namespace ct::test {
namespace {

std::pair<Vec, Vec> run(Device& d, int64_t N, int64_t V, const Vec& logits,
                        const std::vector<int32_t>& targets, float dloss, bool in_place) {
  Tensor tl = upload(d, {N, V}, logits), tt = upload_i32(d, {N}, targets);
  Tensor loss = upload(d, {N}, Vec(N, NAN));
  d.crossentropy_forward(loss, tl, tt, V);
  Tensor dl = in_place ? tl : upload(d, {N, V}, Vec(N * V, NAN));
  d.crossentropy_backward(dl, tl, tt, V, dloss);
  return {download(d, loss), download(d, dl)};
}

struct CeCase {
  int64_t N, V;
  uint64_t seed;
  bool finite_differences;
  float scale;         // logits of scale 4 make some rows confident (loss near 0)
  float dominant = 0;  // when non-zero: logits[5], a dominant logit
};
const CeCase kCases[] = {
    {7, 13, 1, true, 1.0f},
    {1, 2, 2, true, 1.0f},
    {1, 2, 2, false, 4.0f},
    {5, 3, 5, false, 4.0f},
    {3, 1, 3, false, 4.0f},  // a single class: loss 0, gradient 0
    {23, 1001, 90, false, 3.0f, 80.0f},
    {4, 50257, 4, false, 4.0f},  // GPT-2 vocabulary rows
};

struct CeInputs {
  Vec logits;
  std::vector<int32_t> targets;
  float dloss;
};
CeInputs inputs(const CeCase& c) {
  CeInputs in{randn(c.N * c.V, c.seed, c.scale),
              randint(c.N, c.seed + 1, static_cast<int32_t>(c.V)), 1.0f / static_cast<float>(c.N)};
  if (c.dominant != 0) in.logits[5] = c.dominant;
  return in;
}

using CrossEntropy = DeviceTest;

TEST_P(CrossEntropy, MatchesReferenceAlsoInPlace) {
  for (const CeCase& c : kCases) {
    // A few classes at scale 1: the gradients cancel to tiny values; the CPU backend matches its
    // reference there to 1e-11, other backends are held to the cases with V > 13.
    if (c.V <= 13 && !same_backend_as_ref()) continue;
    CeInputs in = inputs(c);
    auto [rl, rd] = run(ref(), c.N, c.V, in.logits, in.targets, in.dloss, false);
    auto [fl, fdl] = run(dev(), c.N, c.V, in.logits, in.targets, in.dloss, false);
    std::string nm = " N" + std::to_string(c.N) + " V" + std::to_string(c.V) + " on " + id();
    EXPECT_TRUE(close_nmse(fl, rl, tol(), "loss vs ref" + nm));
    EXPECT_TRUE(close_nmse(fdl, rd, tol(), "dlogits vs ref" + nm));
    for (Device* d : {&ref(), &dev()}) {
      auto [il, id] = run(*d, c.N, c.V, in.logits, in.targets, in.dloss, true);
      EXPECT_TRUE(close_nmse(id, rd, tol(), "in-place dlogits " + d->info().id() + nm));
    }
  }
}

TEST_P(CrossEntropy, LargeLogitsStayFinite) {
  Vec logits = {1000.0f, -1000.0f, 0.0f, 88.0f, 89.0f, -200.0f};
  std::vector<int32_t> t = {0, 2};
  auto [rl, rd] = run(ref(), 2, 3, logits, t, 1.0f, false);
  auto [fl, fd] = run(dev(), 2, 3, logits, t, 1.0f, false);
  EXPECT_TRUE(close_nmse(fl, rl, tol(), "loss"));
  EXPECT_TRUE(close_nmse(fd, rd, tol(), "dlogits"));
  EXPECT_NEAR(rl[0], 0.0f, 1e-6);
}

// Padded rows: logits [N, Vp] of which the first V columns are the classes. The padding holds
// garbage (huge values, NaN, inf) that the forward must not read; the backward writes it as
// exactly 0. Each device: the padded rows give the bits of the same rows without padding
// (valid == Vp), in f32 and 16 bits, also in place; and they match the reference's.
struct PadCase {
  int64_t N, V, Vp;
};
const PadCase kPadCases[] = {
    {7, 13, 128}, {3, 1, 128}, {5, 1001, 1024}, {9, 200, 256}, {2, 50257, 50304},
};

Vec padded(const Vec& compact, int64_t N, int64_t V, int64_t Vp) {
  const float junk[] = {1e30f, NAN, INFINITY, -INFINITY, 88.0f, -1e30f};
  Vec out(static_cast<size_t>(N * Vp));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < Vp; ++i)
      out[n * Vp + i] = i < V ? compact[n * V + i] : junk[(n + i) % 6];
  return out;
}

struct PadResult {
  Vec loss, dlogits, dlogits_in_place;  // dlogits [N, Vp] as floats (16-bit widened)
};
PadResult run_padded(Device& d, DType dt, int64_t N, int64_t V, int64_t Vp, const Vec& logits,
                     const std::vector<int32_t>& targets, float dloss) {
  Tensor tl = up_as(d, {N, Vp}, logits, dt), tt = upload_i32(d, {N}, targets);
  Tensor loss = upload(d, {N}, Vec(N, NAN));
  d.crossentropy_forward(loss, tl, tt, V);
  Tensor dl = up_as(d, {N, Vp}, Vec(N * Vp, NAN), dt);
  d.crossentropy_backward(dl, tl, tt, V, dloss);
  PadResult r{download(d, loss), download_h(d, dl), {}};
  d.crossentropy_backward(tl, tl, tt, V, dloss);
  r.dlogits_in_place = download_h(d, tl);
  return r;
}

TEST_P(CrossEntropy, PaddingColumnsAreNotClassesAndGetZeroGradients) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    if (!dev().supports(OpKind::kCrossEntropy, dt) || !ref().supports(OpKind::kCrossEntropy, dt))
      continue;
    for (const PadCase& c : kPadCases) {
      if (c.V <= 13 && !same_backend_as_ref()) continue;  // as MatchesReferenceAlsoInPlace
      const std::string nm = std::string(" ") + dtype_name(dt) + " N" + std::to_string(c.N) + " V" +
                             std::to_string(c.V) + " Vp" + std::to_string(c.Vp);
      Vec compact = randn(c.N * c.V, 70 + c.V, 3.0f);
      if (dt != DType::f32) compact = download_h(ref(), up_as(ref(), {c.N * c.V}, compact, dt));
      const auto targets = randint(c.N, 71 + c.V, static_cast<int32_t>(c.V));
      const float dloss = 1.0f / static_cast<float>(c.N);
      const Vec logits = padded(compact, c.N, c.V, c.Vp);
      PadResult got[2];
      int k = 0;
      for (Device* d : {&ref(), &dev()}) {
        const std::string on = nm + " on " + d->info().id();
        PadResult p = run_padded(*d, dt, c.N, c.V, c.Vp, logits, targets, dloss);
        // the same rows without padding, valid == Vp
        PadResult u = run_padded(*d, dt, c.N, c.V, c.V, compact, targets, dloss);
        EXPECT_EQ(p.loss, u.loss) << "loss" << on;
        bool zeros = true, same = true;
        for (int64_t n = 0; n < c.N; ++n)
          for (int64_t i = 0; i < c.Vp; ++i) {
            const float a = p.dlogits[n * c.Vp + i], b = p.dlogits_in_place[n * c.Vp + i];
            if (i >= c.V) {
              zeros = zeros && a == 0.0f && !std::signbit(a) && b == 0.0f && !std::signbit(b);
            } else {
              const float w = u.dlogits[n * c.V + i];
              same = same && (a == w || (std::isnan(a) && std::isnan(w))) && a == b;
            }
          }
        EXPECT_TRUE(zeros) << "dlogits of the padding columns are not all +0" << on;
        EXPECT_TRUE(same) << "dlogits of the classes differ from the unpadded rows'" << on;
        got[k++] = std::move(p);
      }
      EXPECT_TRUE(close_nmse(got[1].loss, got[0].loss, tol(), "loss vs ref" + nm));
      EXPECT_TRUE(close_nmse(got[1].dlogits, got[0].dlogits, dt == DType::f32 ? tol() : 1e-4,
                             "dlogits vs ref" + nm));
    }
  }
}

// crossentropy_forward_backward over the same padded rows: in place, its losses and its
// dlogits are those of the two ops on the same device, and those of the reference.
PadResult run_fused(Device& d, DType dt, int64_t N, int64_t V, int64_t Vp, const Vec& logits,
                    const std::vector<int32_t>& targets, float dloss) {
  Tensor tl = up_as(d, {N, Vp}, logits, dt), tt = upload_i32(d, {N}, targets);
  Tensor loss = upload(d, {N}, Vec(N, NAN));
  d.crossentropy_forward_backward(loss, tl, tt, V, dloss);
  return {download(d, loss), download_h(d, tl), {}};
}

bool same_bits(const Vec& a, const Vec& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_P(CrossEntropy, ForwardBackwardInOnePassEqualsTheTwoOps) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    if (!dev().supports(OpKind::kCrossEntropy, dt) || !ref().supports(OpKind::kCrossEntropy, dt))
      continue;
    const double dtol = dt == DType::f32 ? tol() : 1e-4;  // as the padded two-op case
    for (const PadCase& c : kPadCases) {
      if (c.V <= 13 && !same_backend_as_ref()) continue;  // as MatchesReferenceAlsoInPlace
      const std::string nm = std::string(" ") + dtype_name(dt) + " N" + std::to_string(c.N) + " V" +
                             std::to_string(c.V) + " Vp" + std::to_string(c.Vp) + " on " + id();
      Vec compact = randn(c.N * c.V, 80 + c.V, 3.0f);
      if (dt != DType::f32) compact = download_h(ref(), up_as(ref(), {c.N * c.V}, compact, dt));
      const auto targets = randint(c.N, 81 + c.V, static_cast<int32_t>(c.V));
      const float dloss = 0.75f / static_cast<float>(c.N);
      const Vec logits = padded(compact, c.N, c.V, c.Vp);
      const PadResult two = run_padded(dev(), dt, c.N, c.V, c.Vp, logits, targets, dloss);
      const PadResult one = run_fused(dev(), dt, c.N, c.V, c.Vp, logits, targets, dloss);
      const PadResult want = run_fused(ref(), dt, c.N, c.V, c.Vp, logits, targets, dloss);
      bool zeros = true;
      for (int64_t n = 0; n < c.N; ++n)
        for (int64_t i = c.V; i < c.Vp; ++i) {
          const float a = one.dlogits[n * c.Vp + i];
          zeros = zeros && a == 0.0f && !std::signbit(a);
        }
      EXPECT_TRUE(zeros) << "dlogits of the padding columns are not all +0" << nm;
      // The same statistics and arithmetic as the two ops, on every device: the same bits.
      EXPECT_TRUE(same_bits(one.loss, two.loss)) << "loss vs the two ops" << nm;
      EXPECT_TRUE(same_bits(one.dlogits, two.dlogits_in_place)) << "dlogits vs the two ops" << nm;
      EXPECT_TRUE(close_nmse(one.loss, want.loss, tol(), "loss vs ref" + nm));
      EXPECT_TRUE(close_nmse(one.dlogits, want.dlogits, dtol, "dlogits vs ref" + nm));
    }
  }
}

CT_INSTANTIATE_DEVICE_SUITE(CrossEntropy);

// The reference's fused op is its two ops, bit for bit (so the fp64 and finite-difference checks
// of the two hold for it), rows of the unpadded cases and of the padded ones alike.
TEST(ReferenceCrossEntropy, ForwardBackwardIsTheTwoOpsBitForBit) {
  for (const CeCase& c : kCases) {
    CeInputs in = inputs(c);
    auto [rl, rd] = run(ref(), c.N, c.V, in.logits, in.targets, in.dloss, true);
    PadResult one = run_fused(ref(), DType::f32, c.N, c.V, c.V, in.logits, in.targets, in.dloss);
    std::string nm = " N" + std::to_string(c.N) + " V" + std::to_string(c.V);
    EXPECT_EQ(one.loss, rl) << "loss" << nm;
    EXPECT_EQ(one.dlogits, rd) << "dlogits" << nm;
  }
}

TEST(ReferenceCrossEntropy, MatchesFp64AndFiniteDifferences) {
  for (const CeCase& c : kCases) {
    CeInputs in = inputs(c);
    auto [rl, rd] = run(ref(), c.N, c.V, in.logits, in.targets, in.dloss, false);
    std::string nm = " N" + std::to_string(c.N) + " V" + std::to_string(c.V);
    EXPECT_TRUE(close_nmse(rl, f64::crossentropy(to_d(in.logits), in.targets, c.N, c.V), kTolF64,
                           "loss ref vs fp64" + nm));
    if (!c.finite_differences) continue;
    VecD g(static_cast<size_t>(c.N), in.dloss);
    VecD num =
        numeric_grad([&](const VecD& x) { return f64::crossentropy(x, in.targets, c.N, c.V); },
                     to_d(in.logits), g);
    EXPECT_TRUE(close_nmse(rd, num, kTolGrad, "dlogits ref vs finite differences" + nm));
  }
}

TEST(CpuCrossEntropy, RejectsOutOfRangeTargets) {
  // The limit is the number of classes, not the row length: a target in the padding is an error.
  for (const char* spec : {"cpu:1", "cpu:0"}) {
    Device& d = open_cached(spec);
    Tensor tl = upload(d, {2, 8}, Vec(16, 0.0f)), tt = upload_i32(d, {2}, {1, 5});
    Tensor loss = upload(d, {2}, Vec(2, 0.0f));
    for (int op : {0, 1, 2}) {
      try {
        if (op == 0) d.crossentropy_forward(loss, tl, tt, 5);
        if (op == 1) d.crossentropy_backward(tl, tl, tt, 5, 1.0f);
        if (op == 2) d.crossentropy_forward_backward(loss, tl, tt, 5, 1.0f);
        ADD_FAILURE() << "no error";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("targets[1] = 5 is out of range [0, 5)"),
                  std::string::npos)
            << e.what();
      }
    }
  }
}

}  // namespace
}  // namespace ct::test
