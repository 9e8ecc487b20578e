// crossentropy_forward / crossentropy_backward, including in place (dlogits aliasing logits).
#include "tests/ops/op_test_util.h"

namespace ct::test {
namespace {

std::pair<Vec, Vec> run(Device& d, int64_t N, int64_t V, const Vec& logits,
                        const std::vector<int32_t>& targets, float dloss, bool in_place) {
  Tensor tl = upload(d, {N, V}, logits), tt = upload_i32(d, {N}, targets);
  Tensor loss = upload(d, {N}, Vec(N, NAN));
  d.crossentropy_forward(loss, tl, tt);
  Tensor dl = in_place ? tl : upload(d, {N, V}, Vec(N * V, NAN));
  d.crossentropy_backward(dl, tl, tt, dloss);
  return {download(d, loss), download(d, dl)};
}

// Logits of scale 4 make some rows confident (loss near 0), where precision is hardest.
void check(int64_t N, int64_t V, uint64_t seed, bool fd, float scale = 4.0f) {
  Vec logits = randn(N * V, seed, scale);
  auto targets = randint(N, seed + 1, static_cast<int32_t>(V));
  float dloss = 1.0f / static_cast<float>(N);
  auto [rl, rd] = run(ref_dev(), N, V, logits, targets, dloss, false);
  auto [fl, fdl] = run(fast_dev(), N, V, logits, targets, dloss, false);
  std::string nm = " N" + std::to_string(N) + " V" + std::to_string(V);
  EXPECT_TRUE(close_nmse(rl, f64::crossentropy(to_d(logits), targets, N, V), kTolF64,
                         "loss ref vs fp64" + nm));
  EXPECT_TRUE(close_nmse(fl, rl, kTolFast, "loss fast vs ref" + nm));
  EXPECT_TRUE(close_nmse(fdl, rd, kTolFast, "dlogits fast vs ref" + nm));
  for (Device* d : {&ref_dev(), &fast_dev()}) {
    auto [il, id] = run(*d, N, V, logits, targets, dloss, true);
    EXPECT_TRUE(close_nmse(id, rd, kTolFast, "in-place dlogits " + d->info().name + nm));
  }
  if (fd) {
    VecD g(static_cast<size_t>(N), dloss);
    VecD num = numeric_grad([&](const VecD& x) { return f64::crossentropy(x, targets, N, V); },
                            to_d(logits), g);
    EXPECT_TRUE(close_nmse(rd, num, kTolGrad, "dlogits ref vs finite differences" + nm));
  }
}

TEST(CrossEntropy, OddSizesWithFiniteDifferences) {
  check(7, 13, 1, true, 1.0f);
  check(1, 2, 2, true, 1.0f);
  check(1, 2, 2, false);
  check(5, 3, 5, false);
  check(3, 1, 3, false);  // a single class: loss 0, gradient 0
}

TEST(CrossEntropy, GptVocabularyRows) { check(4, 50257, 4, false); }

TEST(CrossEntropy, LargeLogitsStayFinite) {
  Vec logits = {1000.0f, -1000.0f, 0.0f, 88.0f, 89.0f, -200.0f};
  std::vector<int32_t> t = {0, 2};
  auto [rl, rd] = run(ref_dev(), 2, 3, logits, t, 1.0f, false);
  auto [fl, fd] = run(fast_dev(), 2, 3, logits, t, 1.0f, false);
  EXPECT_TRUE(close_nmse(fl, rl, kTolFast, "loss"));
  EXPECT_TRUE(close_nmse(fd, rd, kTolFast, "dlogits"));
  EXPECT_NEAR(rl[0], 0.0f, 1e-6);
}

TEST(CrossEntropy, RejectsOutOfRangeTargets) {
  for (Device* d : {&ref_dev(), &fast_dev()}) {
    Tensor tl = upload(*d, {2, 5}, Vec(10, 0.0f)), tt = upload_i32(*d, {2}, {1, 5});
    Tensor loss = upload(*d, {2}, Vec(2, 0.0f));
    try {
      d->crossentropy_forward(loss, tl, tt);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("targets[1] = 5"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace ct::test
