// End to end on the Vulkan device: the tiny model trained 50 steps on cpu and on vulkan from one
// seed gives the same loss at every step (1e-4 relative); a step is at most 2 queue submits; a
// lost device stops training with a clear error and leaves the previous checkpoint intact.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/train/checkpoint.h"
#include "core/train/train_args.h"
#include "core/train/trainer.h"
#include "tests/vulkan/vulkan_fixture.h"

namespace ct::vktest {
namespace {

namespace fs = std::filesystem;

// The tiny preset at block size 64, batch 1 (keeps the test fast), logging every step.
TrainArgs tiny_args(const std::string& backend, const std::string& dir, int64_t steps) {
  TrainArgs a;
  a.model = "tiny";
  a.block_size = 64;
  a.per_device_train_batch_size = 1;
  a.max_steps = steps;
  a.warmup_steps = 5;
  a.logging_steps = 1;
  a.eval_steps = 0;
  a.max_eval_batches = 1;
  a.sample_tokens = 0;
  a.progress_bar = false;
  a.seed = 1234;
  a.backend = backend;
  a.output_dir = dir;
  return a;
}

std::string fresh_dir(const std::string& name) {
  fs::path d =
      fs::temp_directory_path() / ("ct_vk_train_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d.string();
}

std::vector<double> losses(const std::string& dir) {
  std::vector<double> v;
  std::ifstream in(fs::path(dir) / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("loss")) v.push_back(j["loss"].get<double>());
  }
  return v;
}

using TrainTest = VulkanTest;

TEST_F(TrainTest, TinyFiftyStepsMatchCpuAndFewSubmits) {
  const int64_t steps = 50;
  std::string dc = fresh_dir("cpu"), dv = fresh_dir("vk");
  train(tiny_args("cpu", dc, steps));
  TrainArgs va = tiny_args("vulkan", dv, steps);
  va.profile = true;
  ::testing::internal::CaptureStdout();
  train(va);
  std::string out = ::testing::internal::GetCapturedStdout();
  std::vector<double> lc = losses(dc), lv = losses(dv);
  ASSERT_EQ(lc.size(), static_cast<size_t>(steps));
  ASSERT_EQ(lv.size(), static_cast<size_t>(steps));
  double worst = 0;
  for (int64_t i = 0; i < steps; ++i) {
    double rel = std::abs(lv[i] - lc[i]) / std::abs(lc[i]);
    worst = std::max(worst, rel);
    EXPECT_LE(rel, 1e-4) << "step " << i + 1 << ": cpu " << lc[i] << ", vulkan " << lv[i];
  }
  std::printf("  max relative loss difference over %lld steps: %.3g (first %.6f, last %.6f)\n",
              static_cast<long long>(steps), worst, lv.front(), lv.back());
  // "... N queue submits over F flushes": the trainer flushes once per step.
  auto pos = out.find(" queue submits over ");
  ASSERT_NE(pos, std::string::npos) << out;
  auto start = out.rfind(' ', pos - 1);
  unsigned long long submits = std::stoull(out.substr(start + 1, pos - start - 1));
  unsigned long long flushes = std::stoull(out.substr(pos + 20));
  EXPECT_EQ(flushes, static_cast<unsigned long long>(steps));
  EXPECT_LE(submits, 2 * flushes) << out;
  EXPECT_NE(out.find("matmul_"), std::string::npos) << out;  // the per-op table
  std::printf("  %llu queue submits over %llu steps\n", submits, flushes);
  fs::remove_all(dc);
  fs::remove_all(dv);
}

TEST_F(TrainTest, DeviceLostKeepsPreviousCheckpoint) {
  std::string d = fresh_dir("lost");
  TrainArgs a = tiny_args("vulkan", d, 8);
  a.save_steps = 2;
  setenv("CROSSTRAIN_VK_INJECT_DEVICE_LOST", "5", 1);  // a submit after checkpoint-2
  std::string what;
  try {
    train(a);
  } catch (const Error& e) {
    what = e.what();
  }
  unsetenv("CROSSTRAIN_VK_INJECT_DEVICE_LOST");
  EXPECT_NE(what.find("Vulkan device lost"), std::string::npos) << what;
  EXPECT_NE(what.find("no further work is submitted"), std::string::npos) << what;
  std::vector<std::string> cps = list_checkpoints(d);
  ASSERT_FALSE(cps.empty()) << "no checkpoint survived";
  EXPECT_EQ(fs::path(cps.back()).filename().string(), "checkpoint-2");
  // Intact: training resumes from it (hashes checked on load) on the CPU.
  TrainArgs r = tiny_args("cpu", d, 3);
  r.resume_from_checkpoint = cps.back();
  EXPECT_NO_THROW(train(r));
  fs::remove_all(d);
}

// Checkpoints are backend-neutral: a run checkpointed on one backend and resumed on the other
// continues like the uninterrupted run (same data position, schedule and optimizer state), in
// both directions, within the cross-backend loss tolerance.
TEST_F(TrainTest, ResumeAcrossBackends) {
  for (const auto& [first, second] : {std::pair<std::string, std::string>{"cpu", "vulkan"},
                                      std::pair<std::string, std::string>{"vulkan", "cpu"}}) {
    std::string straight = fresh_dir("x_straight_" + first), split = fresh_dir("x_split_" + first);
    train(tiny_args(first, straight, 6));
    TrainArgs a = tiny_args(first, split, 6);
    a.save_steps = 3;
    train(a);
    fs::remove_all(fs::path(split) / "checkpoint-6");
    TrainArgs b = tiny_args(second, split, 6);
    b.resume_from_checkpoint = (fs::path(split) / "checkpoint-3").string();
    train(b);
    std::vector<double> want = losses(straight), got = losses(split);
    ASSERT_EQ(want.size(), 6u);
    ASSERT_EQ(got.size(), 6u) << first << " -> " << second;
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(got[i], want[i], 1e-4 * std::abs(want[i]))
          << first << " -> " << second << ", step " << i + 1;
    fs::remove_all(straight);
    fs::remove_all(split);
  }
}

// --offload-optimizer on the Vulkan device (state and update on the host, weights uploaded):
// the synchronous schedule equals the on-device optimizer on vulkan, and the delayed update
// (--offload-delayed-update) follows the same trajectory on vulkan as on cpu, its host update
// overlapping the device's next step.
TEST_F(TrainTest, OffloadedOptimizerOnVulkan) {
  const int64_t steps = 6;
  auto run = [&](const std::string& backend, const std::string& name, bool offload, bool delayed) {
    std::string dir = fresh_dir(name);
    TrainArgs a = tiny_args(backend, dir, steps);
    a.offload_optimizer = offload;
    a.offload_delayed_update = delayed;
    train(a);
    return dir;
  };
  std::string on_device = run("vulkan", "off_dev", false, false);
  std::string sync = run("vulkan", "off_sync", true, false);
  std::string delayed_vk = run("vulkan", "off_dpu_vk", true, true);
  std::string delayed_cpu = run("cpu", "off_dpu_cpu", true, true);
  std::vector<double> dev = losses(on_device), syn = losses(sync), dvk = losses(delayed_vk),
                      dcpu = losses(delayed_cpu);
  ASSERT_EQ(dev.size(), static_cast<size_t>(steps));
  ASSERT_EQ(syn.size(), dev.size());
  ASSERT_EQ(dvk.size(), dev.size());
  ASSERT_EQ(dcpu.size(), dev.size());
  for (size_t i = 0; i < dev.size(); ++i) {
    EXPECT_NEAR(syn[i], dev[i], 1e-4 * std::abs(dev[i])) << "sync offload, step " << i + 1;
    EXPECT_NEAR(dvk[i], dcpu[i], 1e-4 * std::abs(dcpu[i]))
        << "delayed vulkan vs cpu, step " << i + 1;
  }
  EXPECT_NE(dvk[2], syn[2]) << "the delayed schedule should differ from step 3 on";
  double overlap = 0;
  std::ifstream in(fs::path(delayed_vk) / "metrics.jsonl");
  for (std::string line; std::getline(in, line);)
    overlap += nlohmann::json::parse(line).value("offload_overlap_s", 0.0);
  EXPECT_GT(overlap, 0.0) << "the host update never ran while the device computed";
  for (const std::string& d : {on_device, sync, delayed_vk, delayed_cpu}) fs::remove_all(d);
}

}  // namespace
}  // namespace ct::vktest
