// LoRA dropout (ModelOptions::lora.dropout): adapter gradients against central differences of the
// loss under the same masks (so the backward uses the forward's masks, also through the input
// gradient of a later layer's adapter), masks that change with the draw and vanish without one,
// gradient checkpointing bitwise equal, and the activation memory as predicted.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "core/model/gpt2.h"
#include "tests/common/device_harness.h"

namespace ct::test {
namespace {

GPT2Config small_config() {
  GPT2Config c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  c.block_size = 16;
  c.vocab_size = 50;
  return c;
}

ModelOptions lora_options(float dropout, bool checkpointing = false) {
  ModelOptions o;
  o.lora.r = 4;
  o.lora.alpha = 8;
  o.lora.target_modules = {"c_attn", "c_proj", "c_fc"};  // all four modules
  o.lora.dropout = dropout;
  o.gradient_checkpointing = checkpointing;
  return o;
}

constexpr int kB = 2, kT = 16;

class LoraDropout : public ::testing::Test {
 protected:
  void SetUp() override {
    tokens_ = randint(kB * kT, 3, 50);
    targets_ = randint(kB * kT, 4, 50);
  }
  // A model with weights from seed 1 and adapters (B non-zero) of scale 0.1 (larger ones make
  // the loss too curved for a central difference at this step).
  std::unique_ptr<GPT2> make(const ModelOptions& o) {
    auto m = std::make_unique<GPT2>(ref(), small_config(), /*with_grads=*/true, o);
    m->init(1);
    std::map<std::string, std::vector<float>> ad = m->download_lora_map();
    uint64_t s = 10;
    for (auto& [name, v] : ad) v = randn(v.size(), ++s, 0.1f);
    m->upload_lora(ad);
    m->allocate_activations(kB, kT);
    return m;
  }
  double loss(GPT2& m, int64_t draw) {
    Tensor in = upload_i32(ref(), {kB, kT}, tokens_), tg = upload_i32(ref(), {kB, kT}, targets_);
    m.set_lora_dropout_draw(7, draw);
    Tensor l = m.forward(in, &tg, kB, kT);
    m.set_lora_dropout_draw(7, -1);
    return download(ref(), l)[0];
  }
  std::vector<float> grads(GPT2& m, int64_t draw) {
    Tensor in = upload_i32(ref(), {kB, kT}, tokens_), tg = upload_i32(ref(), {kB, kT}, targets_);
    m.zero_grad();
    m.set_lora_dropout_draw(7, draw);
    m.forward(in, &tg, kB, kT);
    m.backward();
    m.set_lora_dropout_draw(7, -1);
    return download(ref(), m.trainable_grads());
  }
  std::vector<int32_t> tokens_, targets_;
};

TEST_F(LoraDropout, GradientsMatchFiniteDifferencesUnderTheSameMasks) {
  // (with the masks of another draw, every one of the checks below fails)
  auto m = make(lora_options(0.3f));
  const std::vector<float> g = grads(*m, 5);
  const float gmax = std::abs(*std::max_element(
      g.begin(), g.end(), [](float a, float b) { return std::abs(a) < std::abs(b); }));
  ASSERT_GT(gmax, 0.0f);
  int checked = 0;
  for (const ParamInfo& p : m->lora_params()) {
    // the element of this adapter with the largest gradient, and one more
    int64_t best = 0;
    for (int64_t j = 0; j < p.numel; ++j)
      if (std::abs(g[p.offset + j]) > std::abs(g[p.offset + best])) best = j;
    for (int64_t j : {best, (best + p.numel / 2) % p.numel}) {
      std::map<std::string, std::vector<float>> ad = m->download_lora_map();
      const float w0 = ad[p.name][static_cast<size_t>(j)], eps = 1e-2f;
      ad[p.name][static_cast<size_t>(j)] = w0 + eps;
      m->upload_lora(ad);
      const double lp = loss(*m, 5);
      ad[p.name][static_cast<size_t>(j)] = w0 - eps;
      m->upload_lora(ad);
      const double lm = loss(*m, 5);
      ad[p.name][static_cast<size_t>(j)] = w0;
      m->upload_lora(ad);
      const double fd = (lp - lm) / (2.0 * eps), an = g[p.offset + j];
      EXPECT_NEAR(an, fd, 3e-3 * gmax + 2e-2 * std::abs(fd)) << p.name << "[" << j << "]";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 2 * 2 * 4 * 2);  // 2 layers x 4 modules x (A, B) x 2 elements
}

TEST_F(LoraDropout, MasksFollowTheDrawAndVanishWithoutOne) {
  auto m = make(lora_options(0.3f));
  auto plain = make(lora_options(0.0f));
  const double l5 = loss(*m, 5), l6 = loss(*m, 6);
  EXPECT_EQ(l5, loss(*m, 5));  // a pure function of the draw
  EXPECT_NE(l5, l6);
  // no draw (evaluation): exactly the model without dropout
  EXPECT_EQ(loss(*m, -1), loss(*plain, -1));
  EXPECT_NE(l5, loss(*plain, -1));
  // dropout 0 ignores draws
  EXPECT_EQ(loss(*plain, 5), loss(*plain, -1));
  EXPECT_EQ(grads(*plain, 5), grads(*plain, -1));
}

TEST_F(LoraDropout, CheckpointingGivesTheSameGradientBits) {
  auto m = make(lora_options(0.2f));
  auto ck = make(lora_options(0.2f, /*checkpointing=*/true));
  EXPECT_EQ(grads(*m, 9), grads(*ck, 9));
}

TEST_F(LoraDropout, ActivationMemoryAsPredicted) {
  const int64_t before = ref().memory().current[static_cast<int>(MemCategory::kActivations)];
  auto m = make(lora_options(0.1f));
  const int64_t used = ref().memory().current[static_cast<int>(MemCategory::kActivations)] - before;
  EXPECT_EQ(used, GPT2::activation_bytes(small_config(), lora_options(0.1f), kB, kT, true));
  // the dropped-out input (B*T x 4C f32 with mlp.c_proj adapted) is what dropout adds
  EXPECT_EQ(GPT2::activation_bytes(small_config(), lora_options(0.1f), kB, kT, true) -
                GPT2::activation_bytes(small_config(), lora_options(0.0f), kB, kT, true),
            int64_t{kB} * kT * 4 * 32 * 4);
}

}  // namespace
}  // namespace ct::test
