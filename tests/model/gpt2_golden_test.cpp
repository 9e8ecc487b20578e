// GPT-2 against the PyTorch golden state written by scripts/make_golden.py (tiny preset, seed 42,
// B=2, T=64): initial weights, logits, loss, every gradient, and 5 AdamW steps, on the CPU
// reference device and on every device of every backend (tolerances in
// tests/common/golden_check.h). The key part of attn.c_attn.bias is left out of the final
// weights: its gradient is exactly zero in exact arithmetic (softmax ignores a per-row
// constant). Measured on the CPU devices (fast / reference): weights 3.7e-9, logits 1.9e-6, loss
// 0, grad norms 1.3e-7, grad samples 2.3e-6 of max, AdamW losses 2.3e-6, step norms 9e-6, final
// weights 4.6e-6: 4-10x inside every bound.
#include "core/model/gpt2.h"
#include "tests/common/golden_check.h"
#include "tests/common/test_data_dir.h"

namespace ct {
namespace {

void check(Device& d, const std::string& label) {
  GPT2 model(d, GPT2Config::preset("tiny"));
  const int64_t C = model.config().n_embd;
  // The key third of h.{l}.attn.c_attn.bias: its gradient is zero up to rounding.
  auto key_bias = [C](const ParamInfo& p, int64_t flat_index) {
    if (p.name.find("attn.c_attn.bias") == std::string::npos) return false;
    const int64_t j = flat_index - p.offset;
    return j >= C && j < 2 * C;
  };
  test::check_golden(d, model, ct::test::data_dir() + "/golden/tiny_golden.safetensors", label,
                     key_bias);
}

TEST(ReferenceGPT2Golden, MatchesPyTorch) {
  check(test::ref(), "cpu:1");
}

// Every device of every backend (tests/common/device_harness.h).
using GPT2Golden = test::DeviceTest;
TEST_P(GPT2Golden, MatchesPyTorch) {
  check(dev(), id());
}
CT_INSTANTIATE_DEVICE_SUITE(GPT2Golden);

}  // namespace
}  // namespace ct
