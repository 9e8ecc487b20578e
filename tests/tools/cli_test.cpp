// The crosstrain binary as a user meets it: bad input exits 2 with a message naming the flag or
// file and writes nothing; eval prints JSON; devices lists the CPU, and the coopmat verdict.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/common/test_data_dir.h"
#include "tests/tools/cli_run.h"

namespace {
namespace fs = std::filesystem;

using ct::test::ProcResult;
ProcResult run(const std::string& args) {
  return ct::test::run_crosstrain(args);
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("crosstrain_cli_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    out_ = (dir_ / "out").string();
    data_ = ct::test::data_dir() + "/text/harbour.txt";
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string small() const {
    return "train --no-progress --n-layer 1 --n-head 2 --n-embd 16 --block-size 16 --max-steps 3 "
           "--sample-tokens 0 --data " +
           data_ + " --output-dir " + out_;
  }
  void expect_rejected(const std::string& args, const std::string& mention) {
    ProcResult r = run(args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(mention), std::string::npos)
        << "message should name '" << mention << "':\n"
        << r.output;
    EXPECT_FALSE(fs::exists(out_)) << args << " wrote " << out_;
  }
  fs::path dir_;
  std::string out_, data_;
};

TEST_F(Cli, MissingDataFile) {
  expect_rejected(small() + " --data /no/such/file.txt", "/no/such/file.txt");
}

TEST_F(Cli, EmptyDataFile) {
  std::string empty = (dir_ / "empty.txt").string();
  std::ofstream(empty).close();
  expect_rejected(small() + " --data " + empty, "empty.txt");
}

TEST_F(Cli, NonNumericFlag) {
  expect_rejected(small() + " --max-steps abc", "max-steps");
}
TEST_F(Cli, OutOfRangeFlag) {
  expect_rejected(small() + " --max-steps -3", "--max-steps");
}
TEST_F(Cli, OutOfRangeLearningRate) {
  expect_rejected(small() + " --learning-rate -1", "--learning-rate");
}
TEST_F(Cli, HeadsMustDivideWidth) {
  expect_rejected(small() + " --n-head 3", "--n-head");
}
TEST_F(Cli, UnknownModel) {
  expect_rejected(small() + " --model gpt5", "gpt5");
}
TEST_F(Cli, UnknownBackend) {
  expect_rejected(small() + " --backend tpu", "tpu");
}
TEST_F(Cli, UnknownScheduler) {
  expect_rejected(small() + " --lr-scheduler-type step", "--lr-scheduler-type");
}
TEST_F(Cli, DelayedUpdateNeedsOffload) {
  expect_rejected(small() + " --offload-delayed-update", "--offload-optimizer");
}
TEST_F(Cli, DeviceIndexOutOfRange) {
  expect_rejected(small() + " --backend cpu:9", "cpu:0");
}
// A GPU backend that cannot run here (no device, no driver, or not built) is named with the
// reason and the devices that are available; exit 2, nothing written. Every machine lacks at
// least one of CUDA and HIP; where both run, there is nothing to check.
TEST_F(Cli, UnavailableGpuBackendNamesWhyAndWhatIsAvailable) {
  ProcResult devices = run("devices --json");
  ASSERT_EQ(devices.status, 0) << devices.output;
  auto j = nlohmann::json::parse(devices.output);
  std::string missing;
  for (const auto& b : j)
    if ((b["backend"] == "cuda" || b["backend"] == "hip") && !b["available"].get<bool>())
      missing = b["backend"];
  if (missing.empty()) GTEST_SKIP() << "CUDA and HIP both run here";
  expect_rejected(small() + " --backend " + missing, "unavailable");
  ProcResult r = run(small() + " --backend " + missing);
  EXPECT_NE(r.output.find("available: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("cpu:0"), std::string::npos) << r.output;
}
// --backend auto: cuda > hip > discrete Vulkan > integrated Vulkan > cpu:0, never the test-only
// simt backends; the choice is printed.
TEST_F(Cli, AutoPicksTheFirstUsableInOrderAndSaysSo) {
  ProcResult devices = run("devices --json");
  ASSERT_EQ(devices.status, 0) << devices.output;
  auto j = nlohmann::json::parse(devices.output);
  std::string want = "cpu:0";
  int best = 4;
  for (const auto& b : j) {
    if (!b["available"].get<bool>()) continue;
    for (const auto& d : b["devices"]) {
      std::string name = b["backend"], type = d.value("type", "");
      int rank = name == "cuda" ? 0 : name == "hip" ? 1 : 99;
      if (name == "vulkan" && type == "discrete-gpu") rank = 2;
      if (name == "vulkan" && type == "integrated-gpu") rank = 3;
      if (rank < best) {
        best = rank;
        want = d["id"].get<std::string>();
      }
    }
  }
  ProcResult r = run(small() + " --backend auto");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("--backend auto: " + want), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("--backend auto: simt"), std::string::npos) << r.output;
}

TEST_F(Cli, UnderscoreFlagsAndEvalJson) {
  ProcResult t = run(small() + " --max_steps 4 --per_device_train_batch_size 2");
  ASSERT_EQ(t.status, 0) << t.output;
  EXPECT_NE(t.output.find("validation loss"), std::string::npos) << t.output;
  ProcResult e = run("eval --model-path " + out_ + " --data " + data_);
  ASSERT_EQ(e.status, 0) << e.output;
  auto j = nlohmann::json::parse(e.output);
  // harbour.txt holds 1417 bytes: floor((1417 - 1) / 16) = 88 windows of 16 targets.
  EXPECT_EQ(j["tokens"].get<int64_t>(), 88 * 16);
  EXPECT_GT(j["eval_loss"].get<double>(), 0.0);
  EXPECT_LT(j["eval_loss"].get<double>(), 6.0);
  ProcResult g = run("generate --model-path " + out_ + " --prompt Hello --max-new-tokens 5");
  EXPECT_EQ(g.status, 0) << g.output;
  EXPECT_EQ(g.output.rfind("Hello", 0), 0u) << g.output;
  // --stats: one JSON line after the text; without the cache the same text
  ProcResult gs =
      run("generate --model-path " + out_ + " --prompt Hello --max-new-tokens 5 --stats");
  ASSERT_EQ(gs.status, 0) << gs.output;
  const size_t nl = gs.output.find('\n');
  ASSERT_NE(nl, std::string::npos) << gs.output;
  EXPECT_EQ(gs.output.substr(0, nl + 1), g.output) << gs.output;
  auto st = nlohmann::json::parse(gs.output.substr(nl + 1));
  EXPECT_EQ(st["prompt_tokens"].get<int>(), 5);  // byte-level: "Hello"
  EXPECT_EQ(st["new_tokens"].get<int>(), 5);
  EXPECT_TRUE(st["kv_cache"].get<bool>());
  EXPECT_GT(st["decode_tokens_per_s"].get<double>(), 0.0);
  ProcResult gn =
      run("generate --model-path " + out_ + " --prompt Hello --max-new-tokens 5 --no-kv-cache");
  ASSERT_EQ(gn.status, 0) << gn.output;
  EXPECT_EQ(gn.output, g.output);
  // --bf16: the products on a bf16 copy of the weights (the text may differ in its tokens)
  ProcResult gb =
      run("generate --model-path " + out_ + " --prompt Hello --max-new-tokens 5 --bf16 --stats");
  ASSERT_EQ(gb.status, 0) << gb.output;
  EXPECT_EQ(gb.output.rfind("Hello", 0), 0u) << gb.output;
  EXPECT_NE(gb.output.find("\"precision\":\"bf16\""), std::string::npos) << gb.output;
  EXPECT_EQ(run("generate --model-path " + out_ + " --prompt Hello --bf16 --fp16").status, 2);
  ProcResult bad = run("eval --model-path " + (dir_ / "nothing").string() + " --data " + data_);
  EXPECT_EQ(bad.status, 2) << bad.output;
}

TEST_F(Cli, PrepareDataThenTrainAndEvalOnTokenFiles) {
  const std::string tok = (dir_ / "harbour.tok").string();
  const std::string bpe = ct::test::data_dir() + "/bpe";
  ProcResult p = run("prepare-data --tokenizer " + bpe + " --data " + data_ + " --output " + tok);
  ASSERT_EQ(p.status, 0) << p.output;
  EXPECT_NE(p.output.find("tokens from 1417 bytes"), std::string::npos) << p.output;
  // BPE ids reach 1110: a byte-level vocabulary of 256 refuses the file by name and offset
  expect_rejected(small() + " --data " + tok, "vocabulary size 256");
  expect_rejected(small() + " --data " + tok, tok);
  ProcResult t = run(small() + " --vocab-size 1111 --data " + tok);
  ASSERT_EQ(t.status, 0) << t.output;
  EXPECT_NE(t.output.find("llm.c tokens"), std::string::npos) << t.output;
  ProcResult e = run("eval --model-path " + out_ + " --data " + tok);
  ASSERT_EQ(e.status, 0) << e.output;
  EXPECT_GT(nlohmann::json::parse(e.output)["tokens"].get<int64_t>(), 0);

  // nanoGPT: raw uint16 tokens in a .bin (here the bytes of the text, byte-level ids)
  fs::remove_all(out_);
  const std::string bin = (dir_ / "train.bin").string();
  {
    std::ifstream in(data_, std::ios::binary);
    std::ofstream out(bin, std::ios::binary);
    for (char c; in.get(c);) {
      const unsigned char b = static_cast<unsigned char>(c);
      out.put(static_cast<char>(b)).put('\0');
    }
  }
  ProcResult n = run(small() + " --data " + bin);
  ASSERT_EQ(n.status, 0) << n.output;
  EXPECT_NE(n.output.find("nanoGPT tokens"), std::string::npos) << n.output;
  fs::remove_all(out_);
  std::ofstream(bin, std::ios::app).put('x');  // an odd byte count
  expect_rejected(small() + " --data " + bin, "odd");
  expect_rejected(
      "prepare-data --tokenizer " + dir_.string() + " --data " + data_ + " --output " + out_,
      "--tokenizer");
}

TEST_F(Cli, DevicesJsonListsCpu) {
  ProcResult r = run("devices --json");
  ASSERT_EQ(r.status, 0) << r.output;
  auto j = nlohmann::json::parse(r.output);
  ASSERT_TRUE(j.is_array());
  EXPECT_EQ(j[0]["backend"], "cpu");
  EXPECT_TRUE(j[0]["available"].get<bool>());
  EXPECT_EQ(j[0]["devices"][0]["id"], "cpu:0");
}

// The coopmat GEMM's verdict in `crosstrain devices` (issue #24: it said "pending the start-up
// self-test" even after training had run it). Lavapipe has no coopmat; the emulated build stands
// in (CROSSTRAIN_VK_COOPMAT=emulate) and goes through the same gate, self-test and cache. The
// first listing finds no verdict cached, opens the device, runs the self-test and shows its
// verdict; the second shows the cached one without opening it.
TEST_F(Cli, DevicesShowsTheCoopmatVerdictNeverPending) {
  if (std::string(CT_EXPECTED_BACKENDS).find("vulkan") == std::string::npos)
    GTEST_SKIP() << "this build has no Vulkan backend";
  std::vector<std::string> set;
  auto put = [&](const char* k, const std::string& v) {
    setenv(k, v.c_str(), 1);
    set.push_back(k);
  };
#ifdef CT_VK_LAVAPIPE_ICD
  if (!std::getenv("VK_DRIVER_FILES") && !std::getenv("VK_ICD_FILENAMES")) {
    put("VK_DRIVER_FILES", CT_VK_LAVAPIPE_ICD);
    put("VK_ICD_FILENAMES", CT_VK_LAVAPIPE_ICD);
  }
#endif
  // Mesa's shader cache stays where it was (a cold one compiles every pipeline anew).
  if (!std::getenv("MESA_SHADER_CACHE_DIR")) {
    const char* xdg = std::getenv("XDG_CACHE_HOME");
    const char* home = std::getenv("HOME");
    put("MESA_SHADER_CACHE_DIR",
        xdg && *xdg ? std::string(xdg) : std::string(home ? home : "/tmp") + "/.cache");
  }
  const char* old_xdg = std::getenv("XDG_CACHE_HOME");
  const std::string saved_xdg = old_xdg ? old_xdg : "";
  setenv("XDG_CACHE_HOME", (dir_ / "cache").c_str(), 1);
  put("CROSSTRAIN_VK_COOPMAT", "emulate");
  auto coopmat_line = [](const std::string& out) {
    const size_t dev = out.find("vulkan:0 ");
    const std::string key = "coopmat GEMM: ";
    const size_t at = dev == std::string::npos ? dev : out.find(key, dev);
    if (at == std::string::npos) return std::string();
    return out.substr(at + key.size(), out.find('\n', at) - at - key.size());
  };
  const ProcResult first = run("devices"), second = run("devices");
  for (const std::string& k : set) unsetenv(k.c_str());
  if (old_xdg)
    setenv("XDG_CACHE_HOME", saved_xdg.c_str(), 1);
  else
    unsetenv("XDG_CACHE_HOME");

  ASSERT_EQ(first.status, 0) << first.output;
  const std::string verdict = coopmat_line(first.output);
  EXPECT_NE(first.output.find("vulkan:0: opening it to settle"), std::string::npos) << first.output;
  // Correct, and on lavapipe far slower than the default GEMM: rejected as slower.
  EXPECT_EQ(verdict.rfind("not used: slower: emulated coopmat ", 0), 0u) << first.output;
  EXPECT_EQ(verdict.find("pending"), std::string::npos) << verdict;

  ASSERT_EQ(second.status, 0) << second.output;
  const std::string cached = coopmat_line(second.output);
  EXPECT_EQ(second.output.find("opening it to settle"), std::string::npos) << second.output;
  EXPECT_EQ(cached.rfind(verdict + " (cached: " + (dir_ / "cache").string(), 0), 0u)
      << "first: " << verdict << "\nsecond: " << cached;
}

}  // namespace
