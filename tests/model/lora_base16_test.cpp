// LoRA under a 16-bit policy holds the frozen base in 16 bits only (GPT2::base16(),
// Llama::base16()): no f32 master on the device, weight memory as base_weight_bytes says, and
// the same bits as a full bf16 model whose master already holds the 16-bit values (so that
// nothing but where the base lives differs).
#include <gtest/gtest.h>

#include <vector>

#include "core/dtype.h"
#include "core/model/gpt2.h"
#include "core/model/llama.h"
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

constexpr int kB = 2, kT = 16;

// `lora` (base16, adapters just initialised) and `full` (the same base, rounded, as its master)
// give the same loss bit for bit -- B = 0: the adapted model is the base -- and the frozen 16-bit
// base trains its adapters (the backward reads it).
void expect_base_loss_and_adapter_grads(Device& dev, Model& lora, Model& full) {
  auto tokens = randint(kB * kT, 3, 50), targets = randint(kB * kT, 4, 50);
  std::vector<float> loss;
  for (Model* m : {&lora, &full}) {
    m->allocate_activations(kB, kT);
    Tensor in = upload_i32(dev, {kB, kT}, tokens), tg = upload_i32(dev, {kB, kT}, targets);
    loss.push_back(download(dev, m->forward(in, &tg, kB, kT))[0]);
  }
  EXPECT_EQ(loss[0], loss[1]);
  lora.zero_grad();
  Tensor in = upload_i32(dev, {kB, kT}, tokens), tg = upload_i32(dev, {kB, kT}, targets);
  lora.forward(in, &tg, kB, kT);
  lora.backward();
  double sum = 0;
  for (float g : download(dev, lora.trainable_grads())) sum += std::abs(g);
  EXPECT_GT(sum, 0.0);
}

TEST(LoraBase16, NoF32MasterAndTheBitsOfTheRoundedModel) {
  for (Precision prec : {Precision::kBf16, Precision::kFp16}) {
    const PrecisionPolicy pp = PrecisionPolicy::make(prec);
    SCOPED_TRACE(pp.name());
    ModelOptions lo;
    lo.policy = pp;
    lo.lora.r = 4;
    lo.lora.target_modules = {"c_attn", "c_fc"};
    ModelOptions full;
    full.policy = pp;

    // Weights with non-trivial LayerNorm and bias values, rounded to the 16-bit type for the
    // full model (its f32 master then equals the base16 model's widened base).
    const int64_t n = small_config().num_parameters();
    std::vector<float> w = randn(static_cast<size_t>(n), 5, 0.05f), rounded(w.size());
    for (size_t i = 0; i < w.size(); ++i)
      rounded[i] =
          prec == Precision::kBf16 ? bf16_to_f32(f32_to_bf16(w[i])) : f16_to_f32(f32_to_f16(w[i]));

    const auto kW = static_cast<size_t>(MemCategory::kWeights);
    const int64_t before = ref().memory().current[kW];
    GPT2 a(ref(), small_config(), /*with_grads=*/true, lo);
    const int64_t weights = ref().memory().current[kW] - before;
    EXPECT_TRUE(a.base16());
    EXPECT_FALSE(a.params_flat().defined());
    const int64_t na = GPT2::lora_parameter_count(small_config(), lo.lora);
    EXPECT_EQ(weights, GPT2::base_weight_bytes(small_config(), lo) + na * (4 + 2));
    EXPECT_LT(GPT2::base_weight_bytes(small_config(), lo), n * 4);  // below an f32 copy alone
    a.init(1);                                                      // adapters: A random, B zero
    a.upload_params(w);
    EXPECT_EQ(a.download_params(), rounded);  // held as the 16-bit values

    GPT2 b(ref(), small_config(), /*with_grads=*/true, full);
    EXPECT_FALSE(b.base16());
    b.upload_params(rounded);

    expect_base_loss_and_adapter_grads(ref(), a, b);
  }
}

// The same for a Llama with q/k/v biases (Qwen2-style, so the widened no-decay region holds
// biases as well as norms) and adapters on fused and unfused projections.
TEST(LoraBase16, LlamaNoF32MasterAndTheBitsOfTheRoundedModel) {
  LlamaConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = 32;
  c.intermediate_size = 48;
  c.block_size = 16;
  c.vocab_size = 50;
  c.attention_bias = true;
  for (Precision prec : {Precision::kBf16, Precision::kFp16}) {
    const PrecisionPolicy pp = PrecisionPolicy::make(prec);
    SCOPED_TRACE(pp.name());
    ModelOptions lo;
    lo.policy = pp;
    lo.lora.r = 4;
    lo.lora.target_modules = {"k_proj", "o_proj", "up_proj"};
    ModelOptions full;
    full.policy = pp;
    const int64_t n = c.num_parameters();
    std::vector<float> w = randn(static_cast<size_t>(n), 6, 0.05f), rounded(w.size());
    for (size_t i = 0; i < w.size(); ++i)
      rounded[i] =
          prec == Precision::kBf16 ? bf16_to_f32(f32_to_bf16(w[i])) : f16_to_f32(f32_to_f16(w[i]));

    const auto kW = static_cast<size_t>(MemCategory::kWeights);
    const int64_t before = ref().memory().current[kW];
    Llama a(ref(), c, /*with_grads=*/true, lo);
    const int64_t weights = ref().memory().current[kW] - before;
    EXPECT_TRUE(a.base16());
    EXPECT_FALSE(a.params_flat().defined());
    EXPECT_EQ(weights, Llama::base_weight_bytes(c, lo) +
                           LoraAdapters::weight_bytes(Llama::lora_sites(c), lo.lora, pp.compute));
    EXPECT_LT(Llama::base_weight_bytes(c, lo), n * 4);  // below an f32 copy alone
    a.init(1);
    a.upload_params(w);
    EXPECT_EQ(a.download_params(), rounded);

    Llama b(ref(), c, /*with_grads=*/true, full);
    EXPECT_FALSE(b.base16());
    b.upload_params(rounded);
    expect_base_loss_and_adapter_grads(ref(), a, b);
  }
}

}  // namespace
}  // namespace ct::test
