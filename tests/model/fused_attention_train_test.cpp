// The fused attention in training, on every device under test: the tiny model (its first 2
// layers, shallow_tiny_args) trained 20 steps with --attention fused and with --attention
// unfused on the same device gives the same loss at every step (1e-4 relative), and the activation
// memory predicted (and allocated: tests/core/memory_test.cpp holds the two together) falls by the
// attention matrices.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/model/gpt2.h"
#include "core/train/train_args.h"
#include "core/train/trainer.h"
#include "tests/common/device_harness.h"
#include "tests/common/tiny_training.h"

namespace ct::test {
namespace {

namespace fs = std::filesystem;

using FusedAttentionTraining = DeviceTest;

TEST_P(FusedAttentionTraining, TwentyStepsMatchTheUnfusedOps) {
  // simt64 runs the kernels of simt at another warp size; the op suites cover it (as in
  // TrainParity.EveryTechniqueMatchesCpu), and two more 20-step runs there cost CI a minute.
  if (dev().info().backend == "simt64") GTEST_SKIP() << "the op suites cover simt64";
  const int64_t steps = 20;
  std::string df = fresh_dir("fused"), du = fresh_dir("unfused");
  TrainArgs f = shallow_tiny_args(id(), df, steps);
  ASSERT_EQ(f.attention, "auto");  // the default: fused except on lavapipe
  f.attention = "fused";
  train(f);
  TrainArgs u = shallow_tiny_args(id(), du, steps);
  u.attention = "unfused";
  train(u);
  std::vector<double> lf = logged_losses(df), lu = logged_losses(du);
  ASSERT_EQ(lf.size(), static_cast<size_t>(steps));
  ASSERT_EQ(lu.size(), static_cast<size_t>(steps));
  double worst = 0;
  for (int64_t i = 0; i < steps; ++i) {
    const double rel = std::abs(lf[i] - lu[i]) / std::abs(lu[i]);
    worst = std::max(worst, rel);
    EXPECT_LE(rel, 1e-4) << "step " << i + 1 << ": unfused " << lu[i] << ", fused " << lf[i];
  }
  std::printf(
      "  %s: fused vs unfused attention, max relative loss difference over %lld steps: "
      "%.3g\n",
      id().c_str(), static_cast<long long>(steps), worst);
  fs::remove_all(df);
  fs::remove_all(du);
}

CT_INSTANTIATE_DEVICE_SUITE(FusedAttentionTraining);

TEST(FusedAttentionMemory, ActivationsFallByTheAttentionMatrices) {
  const GPT2Config cfg = GPT2Config::preset("gpt2");
  const int B = 4, T = 1024;
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    ModelOptions fused, unfused;
    fused.policy = unfused.policy = PrecisionPolicy::make(p);
    unfused.fused_attention = false;
    const int64_t h = static_cast<int64_t>(dtype_size(fused.policy.activations));
    const int64_t L = cfg.n_layer, NH = cfg.n_head;
    const int64_t a_fused = GPT2::activation_bytes(cfg, fused, B, T, true);
    const int64_t a_unfused = GPT2::activation_bytes(cfg, unfused, B, T, true);
    EXPECT_EQ(a_unfused - a_fused, L * B * NH * T * T * h - L * B * NH * T * 4);
    std::printf("  gpt2 %d x %d %s: activations %.2f GiB unfused, %.2f GiB fused\n", B, T,
                fused.policy.name().c_str(), static_cast<double>(a_unfused) / (1 << 30),
                static_cast<double>(a_fused) / (1 << 30));
  }
}

}  // namespace
}  // namespace ct::test
