// Helpers shared by the trainer tests: fresh temporary folders, a small model's settings, and
// reading back what a run wrote.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/io/read_file.h"
#include "core/train/train_args.h"
#include "tests/common/test_data_dir.h"

namespace ct::testing {
namespace fs = std::filesystem;

// An empty folder named after the running test (and `tag`), unique to this process.
inline fs::path fresh_temp_dir(const std::string& tag) {
  std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  for (char& c : test) c = c == '/' ? '_' : c;
  fs::path p = fs::temp_directory_path() /
               ("crosstrain_" + tag + "_" + std::to_string(getpid()) + "_" + test);
  fs::remove_all(p);
  return p;
}

// A 2-layer, 32-wide GPT on the committed English test text, quiet and quick.
inline TrainArgs small_model_args(const fs::path& output_dir) {
  TrainArgs a;
  a.model = "tiny";
  a.n_layer = 2;
  a.n_head = 2;
  a.n_embd = 32;
  a.block_size = 32;
  a.data = ct::test::data_dir() + "/text/harbour.txt";
  a.output_dir = output_dir.string();
  a.logging_steps = 1;
  a.eval_steps = 0;
  a.max_eval_batches = 2;
  a.sample_tokens = 0;
  a.progress_bar = false;
  return a;
}

// The records of <dir>/metrics.jsonl, in order.
inline std::vector<nlohmann::json> read_metrics(const fs::path& dir) {
  std::ifstream f(dir / "metrics.jsonl");
  std::vector<nlohmann::json> recs;
  for (std::string line; std::getline(f, line);) recs.push_back(nlohmann::json::parse(line));
  return recs;
}

// Two runs are the same run: equal loss at every logged step and identical final weight bytes.
inline void expect_same_run(const fs::path& a, const fs::path& b) {
  auto ra = read_metrics(a), rb = read_metrics(b);
  ASSERT_EQ(ra.size(), rb.size());
  for (size_t i = 0; i < ra.size(); ++i)
    EXPECT_EQ(ra[i]["loss"].get<double>(), rb[i]["loss"].get<double>()) << "record " << i;
  EXPECT_TRUE(read_file_bytes((a / "model.safetensors").string()) ==
              read_file_bytes((b / "model.safetensors").string()))
      << "the final weights differ";
}

}  // namespace ct::testing
