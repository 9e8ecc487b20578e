// fp16 dynamic loss scaling through the trainer: overflowing steps are skipped without touching
// parameters or optimizer state, the scale backs off, training then proceeds; a loss that stays
// non-finite stops the run with a diagnostic. Plus the scaler's own schedule.
#include "core/amp/loss_scaler.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/io/safetensors.h"
#include "core/model/gpt2.h"
#include "core/registry.h"
#include "core/train/trainer.h"
#include "tests/train/train_test_util.h"

namespace ct {
namespace {
namespace fs = std::filesystem;

TEST(LossScaler, GrowsAfterIntervalAndBacksOffOnOverflow) {
  LossScalerConfig c;
  c.growth_interval = 3;
  LossScaler s(true, c);
  EXPECT_EQ(s.scale(), 65536.0f);
  s.update(false, 1);
  s.update(false, 2);
  EXPECT_EQ(s.scale(), 65536.0f);
  s.update(false, 3);
  EXPECT_EQ(s.scale(), 131072.0f);
  s.update(true, 4);
  EXPECT_EQ(s.scale(), 65536.0f);
  EXPECT_EQ(s.skipped_steps(), 1);
  s.update(false, 5);
  s.update(false, 6);
  EXPECT_EQ(s.scale(), 65536.0f) << "an overflow restarts the growth interval";
  LossScaler off(false);
  EXPECT_EQ(off.scale(), 1.0f);
}

TEST(LossScaler, SkippedStepsLeaveWeightsAndStateUntouched) {
  fs::path out = testing::fresh_temp_dir("scaler");
  TrainArgs a = testing::small_model_args(out);
  a.fp16 = true;
  a.fp16_init_scale = 1099511627776.0;  // 2^40: every early gradient overflows fp16
  a.max_steps = 30;
  a.per_device_train_batch_size = 2;
  a.save_steps = 5;
  a.learning_rate = 3e-3;
  a.warmup_steps = 0;
  TrainSummary s = train(a);
  auto recs = testing::read_metrics(out);
  ASSERT_EQ(recs.size(), 30u);
  // Steps 1..5 all overflowed: skipped, scale halved each time.
  EXPECT_EQ(recs[4]["skipped_steps"].get<int64_t>(), 5);
  EXPECT_EQ(recs[4]["loss_scale"].get<double>(), 1099511627776.0 / 32);
  EXPECT_LT(recs.back()["skipped_steps"].get<int64_t>(), 30)
      << "the scale should come down to a usable value";
  EXPECT_LT(s.final_loss, s.first_loss);

  // After 5 skipped steps the checkpoint holds exactly the initial weights and zero moments.
  auto dev = make_cpu_device(false);
  GPT2Config cfg = GPT2Config::preset("tiny");
  cfg.n_layer = a.n_layer;
  cfg.n_head = a.n_head;
  cfg.n_embd = a.n_embd;
  cfg.block_size = a.block_size;
  GPT2 init(*dev, cfg, false);
  init.init(a.seed);
  auto expected = init.download_param_map();
  SafetensorsFile w = read_safetensors((out / "checkpoint-5" / "model.safetensors").string());
  for (const auto& [name, values] : expected)
    EXPECT_EQ(std::memcmp(w.data(name).data(), values.data(), values.size() * sizeof(float)), 0)
        << name;
  SafetensorsFile o = read_safetensors((out / "checkpoint-5" / "optimizer.safetensors").string());
  for (const auto& name : o.names()) {
    auto bytes = o.data(name);
    bool all_zero = true;
    for (std::byte b : bytes) all_zero &= b == std::byte{0};
    EXPECT_TRUE(all_zero) << name << " changed during skipped steps";
  }
  fs::remove_all(out);
}

TEST(LossScaler, PersistentOverflowStopsWithDiagnostic) {
  fs::path out = testing::fresh_temp_dir("scaler_stop");
  TrainArgs a = testing::small_model_args(out);
  a.fp16 = true;
  a.fp16_init_scale = 1e38;  // would take ~110 halvings: the run gives up after 40
  a.max_steps = 60;
  a.per_device_train_batch_size = 1;
  try {
    train(a);
    FAIL() << "expected the run to stop";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp16 training stopped"), std::string::npos) << e.what();
  }
  fs::remove_all(out);
}

}  // namespace
}  // namespace ct
