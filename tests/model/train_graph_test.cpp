// The training step's graph (core/train/step_graph.h) on every device under test that has graphs
// (DeviceInfo::graphs: the SIMT runtime and Vulkan in CI, CUDA and HIP on a GPU): a run whose
// micro-batches are captured and replayed equals the run that launches every op on its own
// (--no-cuda-graph) bit for bit: the logged losses and gradient norms and the saved weights. A run
// replays every micro-batch but the first (which runs as it is; the second is captured, then
// replayed), and with AdamW every step's update but the first's (its own graph, the learning rate
// and step read from the device). Settings that change a kernel argument between micro-batches, or
// run host code in one, train without the graph and say why; optimizers that take the learning rate
// as a kernel argument run their update op by op and say why.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/train/step_graph.h"
#include "core/train/train_args.h"
#include "core/train/trainer.h"
#include "tests/common/device_harness.h"
#include "tests/common/tiny_training.h"

namespace ct::test {
namespace {

namespace fs = std::filesystem;

std::vector<nlohmann::json> records(const std::string& dir) {
  std::vector<nlohmann::json> v;
  std::ifstream in(fs::path(dir) / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) v.push_back(nlohmann::json::parse(line));
  return v;
}

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class TrainGraph : public DeviceTest {
 protected:
  void SetUp() override {
    DeviceTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (!dev().info().graphs) GTEST_SKIP() << id() << " has no graphs";
  }
  // simt64 runs the graphs of simt (the same runtime code) with kernels at another warp width,
  // which the op suites compare: the end-to-end runs are not repeated there (CI time).
  bool simt64() const { return dev().info().backend == "simt64"; }
  static constexpr const char* kSimt64 = "simt64: simt's graph code, run there (CI time)";
  // Trains `a` with and without the graph and compares the two runs. `update_refusal`: "" when
  // the update is replayed too, else a part of the reason it is not.
  void expect_same_with_and_without(TrainArgs a, const std::string& name,
                                    const std::string& update_refusal = "") {
    const std::string dg = fresh_dir(name + "_graph"), de = fresh_dir(name + "_eager");
    a.output_dir = dg;
    train(a);
    TrainArgs e = a;
    e.output_dir = de;
    e.cuda_graph = false;
    train(e);
    const std::vector<nlohmann::json> rg = records(dg), re = records(de);
    ASSERT_EQ(rg.size(), static_cast<size_t>(a.max_steps));
    ASSERT_EQ(re.size(), rg.size());
    for (size_t i = 0; i < rg.size(); ++i) {
      SCOPED_TRACE("step " + std::to_string(i + 1));
      EXPECT_EQ(rg[i]["loss"].get<double>(), re[i]["loss"].get<double>());
      EXPECT_EQ(rg[i]["grad_norm"].get<double>(), re[i]["grad_norm"].get<double>());
      EXPECT_EQ(rg[i]["step_graph"], "on");
      EXPECT_EQ(re[i]["step_graph"], "--no-cuda-graph");
      EXPECT_EQ(re[i]["update_graph"], "--no-cuda-graph");
      const std::string ug = rg[i]["update_graph"].get<std::string>();
      if (update_refusal.empty())
        EXPECT_EQ(ug, "on");
      else
        EXPECT_NE(ug.find(update_refusal), std::string::npos) << ug;
      // No host wait is added: a replay is enqueued like the ops it stands for.
      EXPECT_EQ(rg[i]["host_waits"], re[i]["host_waits"]);
    }
    // The trainer opens its own device: the counts are the run's. After step s, s x accumulation
    // micro-batches ran: the first as it is, every later one by a replay; and s updates, the
    // first as it is and the later ones replayed where the update has its graph.
    for (size_t i = 0; i < rg.size(); ++i) {
      const auto steps = static_cast<int64_t>(i + 1);
      const int64_t micro = steps * a.gradient_accumulation_steps;
      const int64_t updates = update_refusal.empty() ? steps - 1 : 0;
      EXPECT_EQ(rg[i]["graph_replays"].get<int64_t>(), micro - 1 + updates) << "step " << steps;
      EXPECT_EQ(re[i]["graph_replays"].get<int64_t>(), 0) << "step " << i + 1;
    }
    EXPECT_EQ(file_bytes(fs::path(dg) / "model.safetensors"),
              file_bytes(fs::path(de) / "model.safetensors"))
        << "the trained weights differ";
    fs::remove_all(dg);
    fs::remove_all(de);
  }
};

// GPT-2 (the tiny preset's shapes, 2 layers) with gradient accumulation and checkpointing: every
// micro-batch of a step replays the same graph, with its own inputs uploaded before.
TEST_P(TrainGraph, TinyWithAccumulationAndCheckpointingEqualsEager) {
  if (simt64()) GTEST_SKIP() << kSimt64;
  TrainArgs a = shallow_tiny_args(id(), "", 2);
  a.gradient_accumulation_steps = 2;
  a.gradient_checkpointing = true;
  expect_same_with_and_without(a, "graph_tiny");
}

// The Llama family in bf16 mixed precision: the graph reads the 16-bit compute weights that the
// update outside it refreshes every step.
TEST_P(TrainGraph, LlamaTinyBf16EqualsEager) {
  if (simt64()) GTEST_SKIP() << kSimt64;
  TrainArgs a = tiny_args(id(), "", 3);
  a.model = "llama-tiny";
  a.n_layer = 2;
  a.bf16 = true;
  expect_same_with_and_without(a, "graph_llama");
}

// Lion passes its learning rate to its kernel as an argument: the graph stops before the update,
// which runs op by op, with the same bits, and the reason is given.
TEST_P(TrainGraph, LionUpdatesOutsideTheGraphAndSaysWhy) {
  if (simt64()) GTEST_SKIP() << kSimt64;
  TrainArgs a = shallow_tiny_args(id(), "", 2);
  a.optim = "lion";
  a.learning_rate = 1e-4;
  expect_same_with_and_without(a, "graph_lion", "lion passes its learning rate and step");
}

// fp16's dynamic loss scale is a kernel argument that changes between steps: the run trains
// without the graph, says why in metrics.jsonl and replays nothing.
TEST_P(TrainGraph, Fp16TrainsWithoutTheGraphAndSaysWhy) {
  if (simt64()) GTEST_SKIP() << kSimt64;
  const std::string d = fresh_dir("graph_fp16");
  TrainArgs a = shallow_tiny_args(id(), d, 2);
  a.fp16 = true;
  train(a);
  const std::vector<nlohmann::json> r = records(d);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r.back()["graph_replays"], 0);
  EXPECT_NE(r.back()["step_graph"].get<std::string>().find("--fp16's dynamic loss scale"),
            std::string::npos)
      << r.back()["step_graph"];
  fs::remove_all(d);
}

// Where the runtime refuses a capture (a driver error, simulated here by the micro-batch failing
// while it is captured), nothing of the micro-batch has run: it runs as it is, and so does every
// later one, with the reason kept. A call the capture rules refuse is a bug and is thrown.
TEST_P(TrainGraph, ARefusedCaptureRunsTheMicroBatchAsItIs) {
  Device& d = dev();
  Tensor t = upload(d, {4}, {1, 2, 3, 4});
  StepGraph g(d, "");
  int calls = 0;
  auto micro_batch = [&] {
    d.scale(t, 2.0f);
    if (++calls == 2) fail(ErrorKind::kDevice, "cudaErrorStreamCaptureUnsupported (simulated)");
  };
  for (int i = 0; i < 3; ++i) g.run(micro_batch);  // eager, refused capture then eager, eager
  EXPECT_EQ(calls, 4);
  EXPECT_EQ(g.replays(), 0);
  EXPECT_NE(g.refusal().find("the capture failed: cudaErrorStreamCaptureUnsupported"),
            std::string::npos)
      << g.refusal();
  EXPECT_EQ(download(d, t), (Vec{8, 16, 24, 32}));  // three scales ran, the captured one did not

  StepGraph h(d, "");
  int n = 0;
  auto waits = [&] {
    d.scale(t, 0.5f);
    if (++n == 2) d.synchronize();  // refused while capturing
  };
  h.run(waits);
  try {
    h.run(waits);
    ADD_FAILURE() << "a synchronize during the capture was not refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("synchronize"), std::string::npos) << e.what();
  }
  EXPECT_EQ(download(d, t), (Vec{4, 8, 12, 16}));  // out of capture: the device runs ops again
}

// Each setting that rules the graph out, and the reason given.
TEST(StepGraphRefusal, NamesTheSettingThatRulesTheGraphOut) {
  DeviceInfo gpu;
  gpu.backend = "simt";
  gpu.graphs = true;
  TrainArgs a;
  EXPECT_EQ(step_graph_refusal(a, gpu, false, 1), "");
  DeviceInfo cpu = gpu;
  cpu.backend = "cpu";
  cpu.graphs = false;
  EXPECT_EQ(step_graph_refusal(a, cpu, false, 1), "cpu:0 has no graphs");
  auto refusal = [&](auto change, bool scaling, int world) {
    TrainArgs b = a;
    change(b);
    return step_graph_refusal(b, gpu, scaling, world);
  };
  EXPECT_EQ(refusal([](TrainArgs& b) { b.cuda_graph = false; }, false, 1), "--no-cuda-graph");
  EXPECT_NE(refusal([](TrainArgs& b) { b.profile = true; }, false, 1).find("--profile"),
            std::string::npos);
  EXPECT_NE(refusal([](TrainArgs&) {}, true, 1).find("--fp16"), std::string::npos);
  EXPECT_NE(refusal(
                [](TrainArgs& b) {
                  b.lora_r = 4;
                  b.lora_dropout = 0.1;
                },
                false, 1)
                .find("--lora-dropout"),
            std::string::npos);
  EXPECT_EQ(refusal([](TrainArgs& b) { b.lora_r = 4; }, false, 1), "");  // LoRA without dropout
  EXPECT_NE(refusal([](TrainArgs&) {}, false, 2).find("--no-ddp-overlap"), std::string::npos);
  EXPECT_EQ(refusal([](TrainArgs& b) { b.ddp_overlap = false; }, false, 2), "");
}

CT_INSTANTIATE_DEVICE_SUITE(TrainGraph);

}  // namespace
}  // namespace ct::test
