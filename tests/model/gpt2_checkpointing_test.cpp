// Gradient checkpointing: gradients, loss and logits bitwise those of a run without it (on both
// CPU devices, with accumulation), generate still works, and the activation memory the device
// accounts is exactly GPT2::activation_bytes, checkpointed or not.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/model/gpt2.h"

namespace ct {
namespace {

constexpr int kActs = static_cast<int>(MemCategory::kActivations);

GPT2Config config_with_layers(int n_layer) {
  GPT2Config c;
  c.n_layer = n_layer;
  c.n_head = 4;
  c.n_embd = 64;
  c.block_size = 32;
  c.vocab_size = 97;
  return c;
}

Tensor upload_tokens(Device& dev, int B, int T, int vocab, int salt) {
  std::vector<int32_t> v(size_t(B) * T);
  for (int i = 0; i < B * T; ++i) v[i] = (i * 7 + salt * 13 + (i * i) % 11) % vocab;
  Tensor t = dev.empty({B, T}, DType::i32, MemCategory::kActivations);
  dev.upload(t, v.data(), v.size() * sizeof(int32_t));
  return t;
}

struct RunResult {
  std::vector<float> losses, logits, grads;
};

// Two accumulated micro-batches (the second at a different B,T) and the grads they leave.
RunResult run(Device& dev, bool checkpointing) {
  const GPT2Config c = config_with_layers(3);
  ModelOptions o;
  o.gradient_checkpointing = checkpointing;
  GPT2 model(dev, c, true, o);
  model.init(11);
  model.zero_grad();
  RunResult r;
  const int shapes[2][2] = {{3, 20}, {2, 32}};
  for (int k = 0; k < 2; ++k) {
    const int B = shapes[k][0], T = shapes[k][1];
    Tensor tokens = upload_tokens(dev, B, T, c.vocab_size, 1 + k);
    Tensor targets = upload_tokens(dev, B, T, c.vocab_size, 5 + k);
    float loss;
    dev.download(&loss, model.forward(tokens, &targets, B, T), sizeof loss);
    r.losses.push_back(loss);
    std::vector<float> logits(size_t(B) * T * c.vocab_size);
    dev.download(logits.data(), model.logits(), logits.size() * sizeof(float));
    r.logits.insert(r.logits.end(), logits.begin(), logits.end());
    model.backward(0.5f);
  }
  r.grads = model.download_grads();
  return r;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class GPT2Checkpointing : public ::testing::TestWithParam<bool> {};

TEST_P(GPT2Checkpointing, GradientsAreBitwiseIdentical) {
  auto dev = make_cpu_device(GetParam());
  RunResult plain = run(*dev, false), ckpt = run(*dev, true);
  EXPECT_TRUE(bitwise_equal(plain.losses, ckpt.losses));
  EXPECT_TRUE(bitwise_equal(plain.logits, ckpt.logits));
  ASSERT_EQ(plain.grads.size(), ckpt.grads.size());
  size_t differing = 0;
  for (size_t i = 0; i < plain.grads.size(); ++i)
    differing += std::memcmp(&plain.grads[i], &ckpt.grads[i], sizeof(float)) != 0;
  EXPECT_EQ(differing, 0u) << "of " << plain.grads.size() << " gradients";
  double max_abs = 0;
  for (float g : plain.grads) max_abs = std::max(max_abs, double(std::fabs(g)));
  EXPECT_GT(max_abs, 0.0);
}

INSTANTIATE_TEST_SUITE_P(CpuDevices, GPT2Checkpointing, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Reference" : "Fast"; });

TEST(GPT2CheckpointingMemory, GenerateAndForwardWithoutTargetsWork) {
  auto dev = make_cpu_device(false);
  const GPT2Config c = config_with_layers(2);
  ModelOptions o;
  o.gradient_checkpointing = true;
  GPT2 ckpt(*dev, c, true, o), plain(*dev, c, false);
  ckpt.init(5);
  plain.init(5);
  SampleOptions so;
  so.top_k = 10;
  so.seed = 3;
  EXPECT_EQ(ckpt.generate({1, 2, 3}, 40, so), plain.generate({1, 2, 3}, 40, so));
  Tensor tokens = upload_tokens(*dev, 2, 8, c.vocab_size, 0);
  EXPECT_FALSE(ckpt.forward(tokens, nullptr, 2, 8).defined());
  EXPECT_THROW(ckpt.backward(), Error);
}

// Allocates the activations of a model and returns the kActivations bytes they added.
int64_t accounted_activation_bytes(Device& dev, const GPT2Config& c, const ModelOptions& o,
                                   bool with_grads, int B, int T) {
  GPT2 model(dev, c, with_grads, o);
  const int64_t before = dev.memory().current[kActs];
  model.allocate_activations(B, T);
  return dev.memory().current[kActs] - before;
}

TEST(GPT2CheckpointingMemory, AccountingMatchesThePredictionExactly) {
  auto dev = make_cpu_device(false);
  const GPT2Config c = config_with_layers(12);
  const int B = 2, T = 32;
  for (bool ckpt : {false, true})
    for (bool with_grads : {false, true}) {
      ModelOptions o;
      o.gradient_checkpointing = ckpt;
      EXPECT_EQ(accounted_activation_bytes(*dev, c, o, with_grads, B, T),
                GPT2::activation_bytes(c, o, B, T, with_grads))
          << "checkpointing " << ckpt << " with_grads " << with_grads;
    }
  ASSERT_EQ(dev->memory().current[kActs], 0);

  ModelOptions plain, ckpt;
  ckpt.gradient_checkpointing = true;
  const double ratio = double(GPT2::activation_bytes(c, plain, B, T)) /
                       double(GPT2::activation_bytes(c, ckpt, B, T));
  // 12 layers: 12 sets of block internals become one; the residual stream and head remain.
  EXPECT_GT(ratio, 5.0) << ratio;
}

TEST(GPT2CheckpointingMemory, BackwardAllocatesNothingAndPeakIsThePrediction) {
  auto dev = make_cpu_device(false);
  const GPT2Config c = config_with_layers(4);
  const int B = 2, T = 16;
  Tensor tokens = upload_tokens(*dev, B, T, c.vocab_size, 1);
  Tensor targets = upload_tokens(*dev, B, T, c.vocab_size, 2);
  const int64_t inputs = dev->memory().current[kActs];
  ModelOptions o;
  o.gradient_checkpointing = true;
  GPT2 model(*dev, c, true, o);
  model.init(1);
  model.allocate_activations(B, T);
  dev->reset_memory_peaks();
  model.forward(tokens, &targets, B, T);
  model.backward();
  dev->synchronize();
  EXPECT_EQ(dev->memory().peak[kActs] - inputs, GPT2::activation_bytes(c, o, B, T));
}

TEST(GPT2CheckpointingMemory, Gpt2At4x1024) {
  const GPT2Config c = GPT2Config::preset("gpt2");
  // The unfused attention (the probabilities stored), whose block sizes are worked out below;
  // the fused one at the end.
  ModelOptions plain, ckpt, bf16, bf16_ckpt;
  plain.fused_attention = ckpt.fused_attention = false;
  bf16.fused_attention = bf16_ckpt.fused_attention = false;
  ckpt.gradient_checkpointing = bf16_ckpt.gradient_checkpointing = true;
  bf16.policy = bf16_ckpt.policy = PrecisionPolicy::make(Precision::kBf16);
  const int64_t a = GPT2::activation_bytes(c, plain, 4, 1024);
  const int64_t b = GPT2::activation_bytes(c, ckpt, 4, 1024);
  const int64_t d = GPT2::activation_bytes(c, bf16, 4, 1024);
  const int64_t e = GPT2::activation_bytes(c, bf16_ckpt, 4, 1024);
  const double mib = 1024.0 * 1024.0;
  std::printf(
      "gpt2 B=4 T=1024 activations: fp32 %.1f MiB, fp32+checkpointing %.1f MiB (%.2fx less); "
      "bf16 %.1f MiB, bf16+checkpointing %.1f MiB (%.2fx less)\n",
      a / mib, b / mib, double(a) / b, d / mib, e / mib, double(d) / e);
  // One fp32 block's internals at B=4, T=1024, C=768, 12 heads, by hand: ln1, atty, attproj,
  // ln2, fcproj 5*4096*768*4 + qkv 4096*2304*4 + att 4*12*1024*1024*4 + fch, fch_gelu
  // 2*4096*3072*4 + residual2 4096*768*4 + four LayerNorm statistics 4*4096*4 = 415,301,632 B;
  // checkpointing keeps 1 of the 12.
  EXPECT_EQ(a - b, 11 * int64_t{415'301'632});
  // The logits (B*T*V) and the residual stream stay: 3.96x for fp32.
  EXPECT_GT(double(a) / b, 3.9);
  EXPECT_LT(d, a);
  // Fused attention keeps lse (4*12*1024*4 B) instead of att: 214,171,648 B a block.
  ModelOptions fused, fused_ckpt;
  fused_ckpt.gradient_checkpointing = true;
  const int64_t f = GPT2::activation_bytes(c, fused, 4, 1024);
  const int64_t g = GPT2::activation_bytes(c, fused_ckpt, 4, 1024);
  EXPECT_EQ(f - g, 11 * int64_t{214'171'648});
  EXPECT_EQ(a - f, 12 * (int64_t{415'301'632} - 214'171'648));
}

}  // namespace
}  // namespace ct
