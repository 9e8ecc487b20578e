// Checkpoints: resume is bit-exact, `latest` finds the newest complete one, damaged or foreign
// checkpoints are refused with a message naming the file, and old ones are pruned.
#include "core/train/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/io/read_file.h"
#include "core/train/trainer.h"
#include "tests/train/train_test_util.h"

namespace ct {
namespace {
namespace fs = std::filesystem;

class Checkpoints : public ::testing::Test {
 protected:
  void SetUp() override { root_ = testing::fresh_temp_dir("ckpt"); }
  void TearDown() override { fs::remove_all(root_); }

  TrainArgs args(const std::string& out) const {
    TrainArgs a = testing::small_model_args(root_ / out);
    a.max_steps = 12;
    a.per_device_train_batch_size = 2;
    a.gradient_accumulation_steps = 2;
    a.learning_rate = 3e-3;
    a.warmup_steps = 2;
    return a;
  }
  fs::path root_;

  static void expect_refused(const TrainArgs& a, const std::string& mention) {
    try {
      train(a);
      FAIL() << "resume should have been refused (" << mention << ")";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(mention), std::string::npos) << e.what();
    }
  }
};

// K steps, then a second run resumes and trains K more: the same losses and weight bytes as 2K
// straight (constant schedule, so the first run's --max-steps does not change the rates).
TEST_F(Checkpoints, KPlusResumePlusKEqualsStraight) {
  TrainArgs straight = args("straight");
  straight.lr_scheduler_type = "constant";
  train(straight);
  TrainArgs first = args("resumed");
  first.lr_scheduler_type = "constant";
  first.max_steps = 6;
  first.save_steps = 3;
  train(first);
  ASSERT_EQ(list_checkpoints(first.output_dir).size(), 2u);
  TrainArgs second = first;
  second.max_steps = 12;
  second.save_steps = 0;
  second.resume_from_checkpoint = "latest";
  train(second);
  ASSERT_EQ(testing::read_metrics(second.output_dir).size(), 12u);
  testing::expect_same_run(straight.output_dir, second.output_dir);
}

// A run interrupted after its step-6 checkpoint (cosine schedule over 12 steps) and resumed in
// another folder finishes exactly like the uninterrupted one.
TEST_F(Checkpoints, InterruptedRunResumesExactly) {
  TrainArgs straight = args("straight");
  straight.save_steps = 6;
  train(straight);
  TrainArgs resumed = args("resumed");
  fs::create_directories(resumed.output_dir);
  fs::copy(fs::path(straight.output_dir) / "checkpoint-6",
           fs::path(resumed.output_dir) / "checkpoint-6", fs::copy_options::recursive);
  fs::copy(fs::path(straight.output_dir) / "metrics.jsonl",
           fs::path(resumed.output_dir) / "metrics.jsonl");
  resumed.resume_from_checkpoint = (fs::path(resumed.output_dir) / "checkpoint-6").string();
  train(resumed);
  ASSERT_EQ(testing::read_metrics(resumed.output_dir).size(), 12u);
  testing::expect_same_run(straight.output_dir, resumed.output_dir);
}

TEST_F(Checkpoints, LatestSkipsIncompleteAndLimitPrunes) {
  TrainArgs a = args("prune");
  a.save_steps = 2;
  a.save_total_limit = 2;
  train(a);
  std::vector<std::string> kept = list_checkpoints(a.output_dir);
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(fs::path(kept[0]).filename(), "checkpoint-10");
  EXPECT_EQ(fs::path(kept[1]).filename(), "checkpoint-12");
  for (const char* f : {"model.safetensors", "optimizer.safetensors", "config.json",
                        "trainer_state.json", "COMPLETE"})
    EXPECT_TRUE(fs::exists(fs::path(kept[1]) / f)) << f;
  // A folder that was being written when a run died has no marker: `latest` passes it over.
  fs::remove(fs::path(kept[1]) / kCheckpointMarker);
  EXPECT_EQ(resolve_checkpoint("latest", a.output_dir), kept[0]);
  EXPECT_THROW(resolve_checkpoint(kept[1], a.output_dir), Error);
}

TEST_F(Checkpoints, DamagedFilesAreRefused) {
  TrainArgs a = args("damaged");
  a.max_steps = 2;
  a.save_steps = 2;
  train(a);
  fs::path ck = fs::path(a.output_dir) / "checkpoint-2";
  fs::path backup = root_ / "backup";
  fs::copy(ck, backup, fs::copy_options::recursive);
  TrainArgs resume = args("damaged");
  resume.max_steps = 4;
  resume.resume_from_checkpoint = ck.string();

  auto restore = [&] {
    fs::remove_all(ck);
    fs::copy(backup, ck, fs::copy_options::recursive);
  };
  {  // one flipped bit in the weights
    std::fstream f(ck / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    char c;
    f.seekg(200);
    f.get(c);
    f.seekp(200);
    f.put(static_cast<char>(c ^ 0x10));
  }
  expect_refused(resume, "model.safetensors: SHA-256 mismatch");
  restore();
  fs::resize_file(ck / "optimizer.safetensors", fs::file_size(ck / "optimizer.safetensors") / 2);
  expect_refused(resume, "optimizer.safetensors");
  restore();
  fs::remove(ck / "config.json");
  expect_refused(resume, "config.json");
  restore();
  { std::ofstream(ck / "trainer_state.json", std::ios::app) << " "; }
  expect_refused(resume, "trainer_state.json");
  restore();
  TrainArgs other = resume;
  other.n_embd = 64;
  expect_refused(other, "different model");
  restore();
  train(resume);  // the intact checkpoint still resumes
}

}  // namespace
}  // namespace ct
