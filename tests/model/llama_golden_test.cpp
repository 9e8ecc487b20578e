// Llama against the golden state of Hugging Face transformers' LlamaForCausalLM written by
// scripts/make_llama_golden.py (llama-tiny: 6 layers, width 384, 6 heads with 2 KV heads, MLP
// 1024, untied head; seed 42, B=2, T=64): initial weights, logits, loss, every gradient and 5
// AdamW steps, on the CPU reference device and on every device of every backend, with GPT-2's
// tolerances (tests/common/golden_check.h).
#include "core/model/llama.h"
#include "tests/common/golden_check.h"
#include "tests/common/test_data_dir.h"

namespace ct {
namespace {

const std::string kGolden = ct::test::data_dir() + "/golden/llama_tiny_golden.safetensors";

TEST(ReferenceLlamaGolden, MatchesTransformers) {
  Llama model(test::ref(), LlamaConfig::preset("llama-tiny"));
  test::check_golden(test::ref(), model, kGolden, "cpu:1");
}

// Every device of every backend (tests/common/device_harness.h).
using LlamaGolden = test::DeviceTest;
TEST_P(LlamaGolden, MatchesTransformers) {
  Llama model(dev(), LlamaConfig::preset("llama-tiny"));
  test::check_golden(dev(), model, kGolden, id());
}
CT_INSTANTIATE_DEVICE_SUITE(LlamaGolden);

// The unfused attention, and gradient checkpointing (bitwise the same gradients), on the CPU.
TEST(Llama, UnfusedAttentionAndCheckpointingMatch) {
  Device& d = test::open_cached("cpu:0");
  const LlamaConfig cfg = LlamaConfig::preset("llama-tiny");
  const int B = 2, T = 33;
  std::vector<int32_t> tok(B * T), tgt(B * T);
  for (int i = 0; i < B * T; ++i) {
    tok[i] = (i * 37 + 11) % cfg.vocab_size;
    tgt[i] = (i * 53 + 7) % cfg.vocab_size;
  }
  Tensor tokens = d.empty({B, T}, DType::i32, MemCategory::kActivations);
  Tensor targets = d.empty({B, T}, DType::i32, MemCategory::kActivations);
  d.upload(tokens, tok.data(), tok.size() * 4);
  d.upload(targets, tgt.data(), tgt.size() * 4);
  auto run = [&](const ModelOptions& o, float* loss) {
    Llama m(d, cfg, true, o);
    m.init(7);
    d.download(loss, m.forward(tokens, &targets, B, T), sizeof(float));
    m.backward();
    return m.download_grads();
  };
  float l_fused, l_unfused, l_ckpt;
  const std::vector<float> g_fused = run({}, &l_fused);
  ModelOptions unfused;
  unfused.fused_attention = false;
  const std::vector<float> g_unfused = run(unfused, &l_unfused);
  ModelOptions ckpt;
  ckpt.gradient_checkpointing = true;
  const std::vector<float> g_ckpt = run(ckpt, &l_ckpt);
  EXPECT_NEAR(l_unfused, l_fused, 1e-6 * l_fused);
  double num = 0, den = 0;
  for (size_t i = 0; i < g_fused.size(); ++i) {
    num += double(g_unfused[i] - g_fused[i]) * (g_unfused[i] - g_fused[i]);
    den += double(g_fused[i]) * g_fused[i];
  }
  EXPECT_LT(num / den, 1e-10);
  EXPECT_EQ(l_ckpt, l_fused);
  EXPECT_EQ(g_ckpt, g_fused);  // bitwise
}

TEST(Llama, ActivationBytesMatchTheAllocation) {
  Device& d = test::open_cached("cpu:0");
  for (bool ckpt : {false, true})
    for (bool fused : {false, true}) {
      ModelOptions o;
      o.gradient_checkpointing = ckpt;
      o.fused_attention = fused;
      const LlamaConfig cfg = LlamaConfig::preset("llama-tiny");
      const int64_t before = d.memory().current[static_cast<size_t>(MemCategory::kActivations)];
      {
        Llama m(d, cfg, true, o);
        m.allocate_activations(3, 40);
        const int64_t used =
            d.memory().current[static_cast<size_t>(MemCategory::kActivations)] - before;
        EXPECT_EQ(used, Llama::activation_bytes(cfg, o, 3, 40)) << ckpt << fused;
      }
    }
}

}  // namespace
}  // namespace ct
