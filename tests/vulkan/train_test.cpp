// Vulkan-only end to end: a lost device stops training with a clear error and leaves the previous
// checkpoint intact. (Loss parity with the CPU, resume across backends and the offloaded optimizer
// run on every device: tests/model/train_parity_test.cpp.)
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/train/checkpoint.h"
#include "core/train/train_args.h"
#include "core/train/trainer.h"
#include "tests/common/tiny_training.h"
#include "tests/vulkan/vulkan_fixture.h"

namespace ct::vktest {
namespace {

namespace fs = std::filesystem;

using TrainTest = VulkanTest;

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

}  // namespace
}  // namespace ct::vktest
