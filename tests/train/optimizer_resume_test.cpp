// Every optimizer through the trainer: a run resumed from a checkpoint is bit-exact with the
// straight run (state saved and restored with the checkpoint; with --offload-delayed-update too,
// since a checkpoint is a pipeline barrier); the synchronous offloaded optimizer gives the
// on-device results bit for bit on the CPU; each one lowers the loss on a small model.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/io/read_file.h"
#include "core/train/checkpoint.h"
#include "core/train/trainer.h"
#include "tests/train/train_test_util.h"

namespace ct {
namespace {
namespace fs = std::filesystem;

class OptimizerRuns : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { root_ = testing::fresh_temp_dir("optim"); }
  void TearDown() override { fs::remove_all(root_); }

  // "adamw_8bit+offload" -> --optim adamw_8bit --offload-optimizer
  TrainArgs args(const std::string& out) const {
    TrainArgs a = testing::small_model_args(root_ / out);
    std::string spec = GetParam();
    a.offload_optimizer = spec.find("+offload") != std::string::npos;
    a.offload_delayed_update = spec.find("+delayed") != std::string::npos;
    a.optim = spec.substr(0, spec.find('+'));
    a.sgd_momentum = 0.9;
    a.sgd_nesterov = true;
    a.adafactor_beta1 = 0.9;  // exercise the optional first moment too
    a.n_embd = 64;
    a.max_steps = 8;
    a.per_device_train_batch_size = 2;
    a.learning_rate = a.optim == "sgd" ? 0.05 : (a.optim == "lion" ? 3e-4 : 3e-3);
    a.warmup_steps = 2;
    a.max_eval_batches = 1;
    return a;
  }
  static std::vector<nlohmann::json> records(const std::string& dir) {
    return testing::read_metrics(dir);
  }
  static void expect_same(const std::string& a, const std::string& b) {
    testing::expect_same_run(a, b);
  }
  fs::path root_;
};

TEST_P(OptimizerRuns, ResumeIsBitExactAndLossFalls) {
  TrainArgs straight = args("straight");
  straight.save_steps = 4;
  TrainSummary s = train(straight);
  EXPECT_LT(s.final_loss, s.first_loss) << GetParam();
  auto recs = records(straight.output_dir);
  ASSERT_EQ(recs.size(), 8u);
  EXPECT_GT(recs.back()["optimizer_bytes_per_param"].get<double>(), 0.0);
  // A run interrupted after checkpoint-4, resumed in another folder.
  TrainArgs resumed = args("resumed");
  fs::create_directories(resumed.output_dir);
  fs::copy(fs::path(straight.output_dir) / "checkpoint-4",
           fs::path(resumed.output_dir) / "checkpoint-4", fs::copy_options::recursive);
  fs::copy(fs::path(straight.output_dir) / "metrics.jsonl",
           fs::path(resumed.output_dir) / "metrics.jsonl");
  resumed.resume_from_checkpoint = (fs::path(resumed.output_dir) / "checkpoint-4").string();
  train(resumed);
  expect_same(straight.output_dir, resumed.output_dir);
}

// The offloaded runs only.
class OffloadRuns : public OptimizerRuns {};

TEST_P(OffloadRuns, OffloadEqualsOnDevice) {
  TrainArgs off = args("offload");
  TrainArgs on = args("on_device");
  on.offload_optimizer = false;
  train(off);
  train(on);
  expect_same(off.output_dir, on.output_dir);
  auto r = records(off.output_dir).back();
  EXPECT_EQ(r["memory"]["optimizer"].get<int64_t>(), 0);
  EXPECT_GT(r["memory"]["optimizer_host"].get<int64_t>(), 0);
}

std::string param_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = info.param;
  for (char& c : n) c = c == '+' ? '_' : c;
  return n;
}
INSTANTIATE_TEST_SUITE_P(AllOptimizers, OptimizerRuns,
                         ::testing::Values("adamw", "adafactor", "adamw_8bit", "lion", "sgd",
                                           "adamw+offload", "adamw_8bit+offload",
                                           "adafactor+offload", "adamw+offload+delayed",
                                           "adamw_8bit+offload+delayed"),
                         param_name);
INSTANTIATE_TEST_SUITE_P(Offloaded, OffloadRuns,
                         ::testing::Values("adamw+offload", "adamw_8bit+offload",
                                           "adafactor+offload"),
                         param_name);

TEST(OptimizerCheckpoint, AnotherOptimizersStateIsRefused) {
  fs::path root =
      fs::temp_directory_path() / ("crosstrain_optim_refuse_" + std::to_string(getpid()));
  fs::remove_all(root);
  TrainArgs a = testing::small_model_args(root);
  a.n_layer = 1;
  a.block_size = 16;
  a.max_steps = 2;
  a.per_device_train_batch_size = 1;
  a.save_steps = 2;
  train(a);
  a.optim = "adamw_8bit";
  a.max_steps = 4;
  a.resume_from_checkpoint = "latest";
  try {
    train(a);
    FAIL() << "resuming adamw state with adamw_8bit should fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("adamw_8bit"), std::string::npos) << e.what();
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace ct
