// End to end on every device under test (tests/common/device_harness.h): the tiny model (and
// llama-tiny) trained from one seed on the device and on cpu:0 gives the same loss at every step
// (1e-4 relative); a checkpoint written on one resumes on the other like the uninterrupted run;
// the offloaded optimizer, synchronous and delayed, follows the same trajectory. The 50-step
// run trains the whole tiny preset (on simt64 its first 2 layers); the suites that train many
// times (each technique, resume, offload, the device chain) its first 2 layers
// (shallow_tiny_args: the same shapes per layer).
// cpu:0 is the baseline of these runs, so on a device of the cpu backend they are skipped (they
// would compare cpu:0 with itself). A device that batches its queue submits (it prints "N queue
// submits over F flushes" with --profile) keeps a step to at most 2 submits.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/train/train_args.h"
#include "core/train/trainer.h"
#include "tests/common/device_harness.h"
#include "tests/common/tiny_training.h"

namespace ct::test {
namespace {

namespace fs = std::filesystem;

const char* const kBaseline = "cpu:0";

class TrainParity : public DeviceTest {
 protected:
  void SetUp() override {
    DeviceTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (dut_same_backend_as_ref())
      GTEST_SKIP() << id() << " is of the baseline's backend (" << kBaseline
                   << " is what the other devices are compared with)";
  }
};

TEST_P(TrainParity, TinyFiftyStepsMatchCpu) {
  const int64_t steps = 50;
  // simt64 runs the kernels of simt at another warp width (the op suites check every kernel at
  // it): there the 50 steps train the preset's first 2 layers, the same shapes and code.
  auto args = dev().info().backend == "simt64" ? shallow_tiny_args : tiny_args;
  std::string dc = fresh_dir("cpu"), dd = fresh_dir("dut");
  train(args(kBaseline, dc, steps));
  TrainArgs da = args(id(), dd, steps);
  da.profile = true;
  ::testing::internal::CaptureStdout();
  train(da);
  std::string out = ::testing::internal::GetCapturedStdout();
  std::vector<double> lc = logged_losses(dc), ld = logged_losses(dd);
  ASSERT_EQ(lc.size(), static_cast<size_t>(steps));
  ASSERT_EQ(ld.size(), static_cast<size_t>(steps));
  double worst = 0;
  for (int64_t i = 0; i < steps; ++i) {
    double rel = std::abs(ld[i] - lc[i]) / std::abs(lc[i]);
    worst = std::max(worst, rel);
    EXPECT_LE(rel, 1e-4) << "step " << i + 1 << ": cpu " << lc[i] << ", " << id() << " " << ld[i];
  }
  std::printf("  %s: max relative loss difference over %lld steps: %.3g (first %.6f, last %.6f)\n",
              id().c_str(), static_cast<long long>(steps), worst, ld.front(), ld.back());
  // A training step leaves the host free: where the device counts the times the host waited for
  // it (Device::counters, in metrics.jsonl), each logged step adds only the log's own two reads,
  // the loss and the gradient norm (#26: no host synchronisation in a step but the logged loss).
  std::vector<int64_t> waits;
  {
    std::ifstream in(fs::path(dd) / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.contains("host_waits"))
        waits.push_back(j["host_waits"].get<int64_t>());
    }
  }
  if (!waits.empty()) {
    ASSERT_EQ(waits.size(), static_cast<size_t>(steps));
    for (size_t i = 1; i < waits.size(); ++i)
      EXPECT_EQ(waits[i] - waits[i - 1], 2)
          << "host waits in step " << i + 1 << " on " << id() << " (logged every step)";
  }
  // "... N queue submits over F flushes": the trainer flushes once per step. Vulkan records into
  // command buffers and must report it (and its per-op table).
  auto pos = out.find(" queue submits over ");
  if (dev().info().backend == "vulkan") {
    ASSERT_NE(pos, std::string::npos) << out;
    EXPECT_NE(out.find("matmul_"), std::string::npos) << out;  // the per-op table
  }
  if (pos != std::string::npos) {
    auto start = out.rfind(' ', pos - 1);
    unsigned long long submits = std::stoull(out.substr(start + 1, pos - start - 1));
    unsigned long long flushes = std::stoull(out.substr(pos + 20));
    EXPECT_EQ(flushes, static_cast<unsigned long long>(steps));
    EXPECT_LE(submits, 2 * flushes) << out;
    std::printf("  %llu queue submits over %llu steps\n", submits, flushes);
  }
  fs::remove_all(dc);
  fs::remove_all(dd);
}

// The Llama family (llama-tiny: RMSNorm, rotary embeddings, grouped-query attention, SwiGLU,
// untied head) through the same trainer: the same loss at every step as on cpu:0.
TEST_P(TrainParity, LlamaTinyMatchesCpu) {
  const int64_t steps = 12;
  std::string dc = fresh_dir("llama_cpu"), dd = fresh_dir("llama_dut");
  TrainArgs ca = tiny_args(kBaseline, dc, steps), da = tiny_args(id(), dd, steps);
  ca.model = da.model = "llama-tiny";
  train(ca);
  train(da);
  std::vector<double> lc = logged_losses(dc), ld = logged_losses(dd);
  ASSERT_EQ(lc.size(), static_cast<size_t>(steps));
  ASSERT_EQ(ld.size(), static_cast<size_t>(steps));
  double worst = 0;
  for (int64_t i = 0; i < steps; ++i) {
    double rel = std::abs(ld[i] - lc[i]) / std::abs(lc[i]);
    worst = std::max(worst, rel);
    EXPECT_LE(rel, 1e-4) << "step " << i + 1 << ": cpu " << lc[i] << ", " << id() << " " << ld[i];
  }
  std::printf("  llama-tiny on %s: max relative loss difference over %lld steps: %.3g\n",
              id().c_str(), static_cast<long long>(steps), worst);
  fs::remove_all(dc);
  fs::remove_all(dd);
}

// A vocabulary that is not a multiple of 128 (300: the LM head padded to 384 rows on every
// device, core/model/model_base.h), GPT-2's tied head and the Llama family's untied one, small
// models for a few steps: the same loss at every step as on cpu:0.
TEST_P(TrainParity, PaddedVocabularyMatchesCpu) {
  const int64_t steps = 6;
  for (const char* model : {"tiny", "llama-tiny"}) {
    SCOPED_TRACE(model);
    std::string dc = fresh_dir("pad_cpu"), dd = fresh_dir("pad_dut");
    TrainArgs ca = tiny_args(kBaseline, dc, steps), da = tiny_args(id(), dd, steps);
    for (TrainArgs* a : {&ca, &da}) {
      a->model = model;
      a->vocab_size = 300;
      a->n_layer = 2;
      a->n_head = 2;
      a->n_embd = 64;
      a->block_size = 32;
    }
    train(ca);
    train(da);
    std::vector<double> lc = logged_losses(dc), ld = logged_losses(dd);
    ASSERT_EQ(lc.size(), static_cast<size_t>(steps));
    ASSERT_EQ(ld.size(), static_cast<size_t>(steps));
    for (int64_t i = 0; i < steps; ++i)
      EXPECT_LE(std::abs(ld[i] - lc[i]) / std::abs(lc[i]), 1e-4)
          << "step " << i + 1 << ": cpu " << lc[i] << ", " << id() << " " << ld[i];
    fs::remove_all(dc);
    fs::remove_all(dd);
  }
}

// Checkpoints are backend-neutral: a run checkpointed on one device and resumed on the other
// continues like the uninterrupted run (same data position, schedule and optimizer state), in
// both directions, within the cross-backend loss tolerance.
TEST_P(TrainParity, ResumeAcrossBackends) {
  for (const auto& [first, second] : {std::pair<std::string, std::string>{kBaseline, id()},
                                      std::pair<std::string, std::string>{id(), kBaseline}}) {
    std::string tag = first == kBaseline ? "from_cpu" : "to_cpu";
    std::string straight = fresh_dir("x_straight_" + tag), split = fresh_dir("x_split_" + tag);
    train(shallow_tiny_args(first, straight, 6));
    TrainArgs a = shallow_tiny_args(first, split, 6);
    a.save_steps = 3;
    train(a);
    fs::remove_all(fs::path(split) / "checkpoint-6");
    TrainArgs b = shallow_tiny_args(second, split, 6);
    b.resume_from_checkpoint = (fs::path(split) / "checkpoint-3").string();
    train(b);
    std::vector<double> want = logged_losses(straight), got = logged_losses(split);
    ASSERT_EQ(want.size(), 6u);
    ASSERT_EQ(got.size(), 6u) << first << " -> " << second;
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(got[i], want[i], 1e-4 * std::abs(want[i]))
          << first << " -> " << second << ", step " << i + 1;
    fs::remove_all(straight);
    fs::remove_all(split);
  }
}

// Every training technique on the device follows the CPU's trajectory: each optimizer, bf16 and
// fp16 mixed precision, gradient accumulation and gradient checkpointing, 6 steps each. fp32
// runs agree within the cross-backend loss tolerance (1e-4 relative; Lion 1e-3, see below);
// 16-bit ones within 1e-2, the bound the mixed-precision suites hold a 16-bit run to against
// fp32.
TEST_P(TrainParity, EveryTechniqueMatchesCpu) {
  struct Variant {
    const char* name;
    void (*set)(TrainArgs&);
    double tol;
  };
  const Variant variants[] = {
      {"sgd", [](TrainArgs& a) { a.optim = "sgd"; }, 1e-4},
      // Lion steps by lr * sign(c): a rounding difference in c near 0 flips a whole step, so
      // its runs agree less closely (measured 5e-5 on simt and vulkan) than the others'.
      {"lion", [](TrainArgs& a) { a.optim = "lion"; }, 1e-3},
      {"adamw_8bit", [](TrainArgs& a) { a.optim = "adamw_8bit"; }, 1e-4},
      {"adafactor", [](TrainArgs& a) { a.optim = "adafactor"; }, 1e-4},
      {"accumulation", [](TrainArgs& a) { a.gradient_accumulation_steps = 2; }, 1e-4},
      {"checkpointing", [](TrainArgs& a) { a.gradient_checkpointing = true; }, 1e-4},
      {"bf16", [](TrainArgs& a) { a.bf16 = true; }, 1e-2},
      {"fp16", [](TrainArgs& a) { a.fp16 = true; }, 1e-2},
  };
  // simt64 runs the kernels of simt at another warp width: the op suites and the 50-step run
  // check that width; the eight technique runs (over two minutes there) would repeat simt's.
  if (dev().info().backend == "simt64")
    GTEST_SKIP() << "the techniques run on simt:0; simt64 differs in warp width only";
  const int64_t steps = 6;
  for (const Variant& v : variants) {
    std::string dc = fresh_dir(std::string("tech_cpu_") + v.name);
    std::string dd = fresh_dir(std::string("tech_dut_") + v.name);
    TrainArgs ac = shallow_tiny_args(kBaseline, dc, steps), ad = shallow_tiny_args(id(), dd, steps);
    v.set(ac);
    v.set(ad);
    train(ac);
    train(ad);
    std::vector<double> lc = logged_losses(dc), ld = logged_losses(dd);
    ASSERT_EQ(lc.size(), static_cast<size_t>(steps)) << v.name;
    ASSERT_EQ(ld.size(), static_cast<size_t>(steps)) << v.name;
    double worst = 0;
    for (int64_t i = 0; i < steps; ++i) {
      double rel = std::abs(ld[i] - lc[i]) / std::abs(lc[i]);
      worst = std::max(worst, rel);
      EXPECT_LE(rel, v.tol) << v.name << ", step " << i + 1 << ": cpu " << lc[i] << ", " << id()
                            << " " << ld[i];
    }
    std::printf("  %s %s: max relative loss difference %.3g over %lld steps\n", id().c_str(),
                v.name, worst, static_cast<long long>(steps));
    fs::remove_all(dc);
    fs::remove_all(dd);
  }
}

// The tensor-core paths in training (#26): on simt and simt64, a device opened with
// CT_GPU_TILES=1 and CT_GPU_SPLITK=2 runs every 16-bit GEMM through gemm_tc_kernel with split-k
// (2 k ranges into the device's scratch, then their sum with the epilogue) and the fused
// attention through flash_attention_tc.cu (mma.sync and ldmatrix, or MFMA at warp 64, as the
// runtime's collectives, cp.async landing at its waits); bf16 training with them follows cpu:0
// within the 16-bit runs' 1e-2, and the profile names both paths. (The op suites check each kernel
// at both warp sizes; this is their use by the model: workspaces, the step's graph, the scratch
// shared with other ops.)
TEST_P(TrainParity, MatrixTilePathsTrainLikeCpu) {
  const std::string& backend = dev().info().backend;
  if (backend != "simt" && backend != "simt64")
    GTEST_SKIP() << "the matrix-tile paths in training run on the SIMT runtime (the op suites "
                    "check the kernels on every GPU device)";
  const int64_t steps = 4;
  std::string dc = fresh_dir("tiles_cpu"), dd = fresh_dir("tiles_dut");
  TrainArgs ac = shallow_tiny_args(kBaseline, dc, steps), ad = shallow_tiny_args(id(), dd, steps);
  ac.bf16 = ad.bf16 = true;
  ad.profile = true;
  train(ac);
  setenv("CT_GPU_TILES", "1", 1);
  setenv("CT_GPU_SPLITK", "2", 1);
  ::testing::internal::CaptureStdout();
  train(ad);
  const std::string out = ::testing::internal::GetCapturedStdout();
  unsetenv("CT_GPU_TILES");
  unsetenv("CT_GPU_SPLITK");
  std::vector<double> lc = logged_losses(dc), ld = logged_losses(dd);
  ASSERT_EQ(lc.size(), static_cast<size_t>(steps));
  ASSERT_EQ(ld.size(), static_cast<size_t>(steps));
  double worst = 0;
  for (int64_t i = 0; i < steps; ++i) {
    const double rel = std::abs(ld[i] - lc[i]) / std::abs(lc[i]);
    worst = std::max(worst, rel);
    EXPECT_LE(rel, 1e-2) << "step " << i + 1 << ": cpu " << lc[i] << ", " << id() << " " << ld[i];
  }
  for (const char* path :
       {"gemm_tc_kernel (gemm_tc.cu, 128x128 tiles, split-k 2)",
        "flash_attention_forward: matrix tiles", "flash_attention_backward: matrix tiles"})
    EXPECT_NE(out.find(path), std::string::npos) << path << " not in the profile:\n" << out;
  std::printf(
      "  %s with matrix tiles and split-k: max relative loss difference %.3g over %lld "
      "steps\n",
      id().c_str(), worst, static_cast<long long>(steps));
  fs::remove_all(dc);
  fs::remove_all(dd);
}

// --offload-optimizer on the device (state and update on the host, weights uploaded): the
// synchronous schedule equals the on-device optimizer, and the delayed update
// (--offload-delayed-update) follows the same trajectory as on cpu:0, each host update in flight
// across the device's next step.
TEST_P(TrainParity, OffloadedOptimizer) {
  const int64_t steps = 6;
  auto run = [&](const std::string& backend, const std::string& name, bool offload, bool delayed) {
    std::string dir = fresh_dir(name);
    TrainArgs a = shallow_tiny_args(backend, dir, steps);
    a.offload_optimizer = offload;
    a.offload_delayed_update = delayed;
    train(a);
    return dir;
  };
  std::string on_device = run(id(), "off_dev", false, false);
  std::string sync = run(id(), "off_sync", true, false);
  std::string delayed_dut = run(id(), "off_dpu_dut", true, true);
  std::string delayed_cpu = run(kBaseline, "off_dpu_cpu", true, true);
  std::vector<double> dev_l = logged_losses(on_device), syn = logged_losses(sync),
                      dd = logged_losses(delayed_dut), dcpu = logged_losses(delayed_cpu);
  ASSERT_EQ(dev_l.size(), static_cast<size_t>(steps));
  ASSERT_EQ(syn.size(), dev_l.size());
  ASSERT_EQ(dd.size(), dev_l.size());
  ASSERT_EQ(dcpu.size(), dev_l.size());
  for (size_t i = 0; i < dev_l.size(); ++i) {
    EXPECT_NEAR(syn[i], dev_l[i], 1e-4 * std::abs(dev_l[i])) << "sync offload, step " << i + 1;
    EXPECT_NEAR(dd[i], dcpu[i], 1e-4 * std::abs(dcpu[i]))
        << "delayed " << id() << " vs cpu, step " << i + 1;
  }
  EXPECT_NE(dd[2], syn[2]) << "the delayed schedule should differ from step 3 on";
  // The overlap, by the order of events rather than the clock (on a fast GPU the device step may
  // end before the host update starts): the updates of steps 2..5 were each launched before,
  // and joined only after, the next step's wait for the device; step 1 is synchronous and the
  // update of the last step is joined by finish() with no device step in between.
  auto overlapped = [](const std::string& dir) {
    int64_t n = 0;
    std::ifstream in(fs::path(dir) / "metrics.jsonl");
    for (std::string line; std::getline(in, line);)
      n += nlohmann::json::parse(line).value("offload_overlapped_updates", int64_t{0});
    return n;
  };
  EXPECT_EQ(overlapped(delayed_dut), steps - 2)
      << "a delayed host update was not in flight across the next step's device work";
  EXPECT_EQ(overlapped(sync), 0) << "the synchronous schedule overlaps nothing";
  for (const std::string& d : {on_device, sync, delayed_dut, delayed_cpu}) fs::remove_all(d);
}

CT_INSTANTIATE_DEVICE_SUITE(TrainParity);

// One run handed from device to device: 3 steps on cpu:0, checkpoint, 3 more on simt (the GPU
// kernel sources on the CPU SIMT runtime), checkpoint, the last 3 on Vulkan; the losses are those
// of the uninterrupted run on cpu:0. Both backends are built by every configuration that tests
// them (CT_EXPECTED_BACKENDS), so a missing one fails rather than skips.
TEST(TrainChain, CpuThenSimtThenVulkanResumesLikeOneRun) {
  for (const char* b : {"simt", "vulkan"}) {
    const BackendEntry* e = backend_entry(b);
    if (!e || !e->error.empty()) {
      if (backend_expected(b)) FAIL() << b << " is unavailable: " << (e ? e->error : "not found");
      GTEST_SKIP() << b << " is not part of this build";
    }
  }
  std::string straight = fresh_dir("chain_straight"), split = fresh_dir("chain_split");
  train(shallow_tiny_args(kBaseline, straight, 9));
  const char* legs[] = {kBaseline, "simt:0", "vulkan:0"};
  for (int leg = 0; leg < 3; ++leg) {
    TrainArgs a = shallow_tiny_args(legs[leg], split, 3 * (leg + 1));
    a.save_steps = 3;
    if (leg > 0)
      a.resume_from_checkpoint =
          (fs::path(split) / ("checkpoint-" + std::to_string(3 * leg))).string();
    train(a);
  }
  std::vector<double> want = logged_losses(straight), got = logged_losses(split);
  ASSERT_EQ(want.size(), 9u);
  ASSERT_EQ(got.size(), 9u);
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-4 * std::abs(want[i]))
        << "step " << i + 1 << " (on " << legs[i / 3] << ")";
  fs::remove_all(straight);
  fs::remove_all(split);
}

}  // namespace
}  // namespace ct::test
