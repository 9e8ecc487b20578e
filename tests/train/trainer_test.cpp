// End-to-end training on the CPU backend with a small GPT: the loss falls, the run is
// reproducible, and the files written load back.
#include "core/train/trainer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/data/text_dataset.h"
#include "core/data/tokenizer.h"
#include "core/error.h"
#include "core/registry.h"
#include "core/train/evaluate.h"
#include "core/train/model_files.h"
#include "core/train/schedule.h"
#include "tests/train/train_test_util.h"

namespace ct {
namespace {
namespace fs = std::filesystem;

using testing::read_metrics;

fs::path temp_dir(const std::string& name) {
  return testing::fresh_temp_dir("train_" + name);
}

TrainArgs small_args(const fs::path& out) {
  TrainArgs a = testing::small_model_args(out);
  a.max_steps = 60;
  a.per_device_train_batch_size = 4;
  a.learning_rate = 3e-3;
  a.warmup_steps = 5;
  a.logging_steps = 10;
  a.eval_steps = 30;
  a.max_eval_batches = 16;
  a.sample_tokens = 16;
  return a;
}

TEST(Trainer, LossFallsAndFilesAreWritten) {
  fs::path out = temp_dir("falls");
  TrainSummary s = train(small_args(out));
  EXPECT_EQ(s.steps, 60);
  EXPECT_LT(s.final_loss, s.first_loss - 1.0)
      << "first " << s.first_loss << " final " << s.final_loss;
  EXPECT_TRUE(std::isfinite(s.eval_loss));
  EXPECT_EQ(s.sample.size(), std::string("The ").size() + 16);

  auto recs = read_metrics(out);
  ASSERT_EQ(recs.size(), 6u);
  for (size_t i = 0; i < recs.size(); ++i) {
    const auto& r = recs[i];
    EXPECT_EQ(r["step"].get<int64_t>(), static_cast<int64_t>(10 * (i + 1)));
    for (const char* key : {"loss", "lr", "grad_norm", "tokens_per_s"})
      EXPECT_TRUE(r.contains(key)) << key;
    for (const char* key : {"weights", "grads", "optimizer", "activations", "workspace"})
      EXPECT_GT(r["memory"][key].get<int64_t>(), 0) << key;
    EXPECT_EQ(r.contains("eval_loss"), r["step"] == 30 || r["step"] == 60);
  }
  // AdamW keeps two fp32 moments per parameter.
  EXPECT_EQ(recs[0]["memory"]["optimizer"].get<int64_t>(),
            2 * recs[0]["memory"]["weights"].get<int64_t>());

  ASSERT_TRUE(fs::exists(out / "model.safetensors"));
  ASSERT_TRUE(fs::exists(out / "config.json"));
  auto device = open_device("cpu");
  auto model = load_model(out.string(), *device);
  EXPECT_EQ(model->hf_config()["n_layer"], 2);
  EXPECT_EQ(model->block_size(), 32);
  // The saved model reproduces the validation loss the trainer reported (same windows).
  std::vector<int32_t> tokens = ByteTokenizer().encode(load_text(small_args(out).data));
  TokenSplit split = split_train_val(tokens, 0.1, 33);
  model->allocate_activations(4, 32);
  EvalResult ev = evaluate(*model, split.val, 32, 4, 16);
  EXPECT_NEAR(ev.loss, s.eval_loss, 1e-6);
  fs::remove_all(out);
}

TEST(Trainer, SameSeedSameLosses) {
  fs::path a = temp_dir("seed_a"), b = temp_dir("seed_b"), c = temp_dir("seed_c");
  TrainArgs args = small_args(a);
  args.max_steps = 20;
  args.logging_steps = 1;
  args.sample_tokens = 0;
  train(args);
  args.output_dir = b.string();
  train(args);
  args.output_dir = c.string();
  args.seed = 7;
  train(args);
  auto ra = read_metrics(a), rb = read_metrics(b), rc = read_metrics(c);
  ASSERT_EQ(ra.size(), 20u);
  ASSERT_EQ(rb.size(), 20u);
  bool differs = false;
  for (size_t i = 0; i < ra.size(); ++i) {
    EXPECT_EQ(ra[i]["loss"].get<double>(), rb[i]["loss"].get<double>()) << "step " << i + 1;
    EXPECT_EQ(ra[i]["grad_norm"].get<double>(), rb[i]["grad_norm"].get<double>())
        << "step " << i + 1;
    differs |= ra[i]["loss"].get<double>() != rc[i]["loss"].get<double>();
  }
  EXPECT_TRUE(differs) << "another seed should give other losses";
  for (const auto& d : {a, b, c}) fs::remove_all(d);
}

TEST(Trainer, BadInputWritesNothing) {
  fs::path out = temp_dir("bad");
  TrainArgs args = small_args(out);
  args.n_head = 5;  // does not divide 32
  EXPECT_THROW(train(args), Error);
  args = small_args(out);
  args.data = (out.parent_path() / "no_such_file.txt").string();
  EXPECT_THROW(train(args), Error);
  args = small_args(out);
  args.lr_scheduler_type = "exponential";
  EXPECT_THROW(train(args), Error);
  args = small_args(out);
  args.attention = "flash";
  EXPECT_THROW(train(args), Error);
  EXPECT_FALSE(fs::exists(out));
}

TEST(Schedule, WarmupThenDecay) {
  EXPECT_DOUBLE_EQ(lr_at(LrSchedule::kCosine, 1.0, 0, 10, 110), 0.0);
  EXPECT_DOUBLE_EQ(lr_at(LrSchedule::kCosine, 1.0, 5, 10, 110), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(LrSchedule::kCosine, 1.0, 10, 10, 110), 1.0);
  EXPECT_NEAR(lr_at(LrSchedule::kCosine, 1.0, 60, 10, 110), 0.5, 1e-12);
  EXPECT_NEAR(lr_at(LrSchedule::kCosine, 1.0, 110, 10, 110), 0.0, 1e-12);
  EXPECT_DOUBLE_EQ(lr_at(LrSchedule::kLinear, 1.0, 60, 10, 110), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(LrSchedule::kConstant, 1.0, 60, 10, 110), 1.0);
  EXPECT_THROW(parse_lr_schedule("step"), Error);
}

}  // namespace
}  // namespace ct
