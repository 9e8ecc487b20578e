// Graphs (core/device.h: begin_capture, end_capture, replay_graph, release_graph) on every device
// under test that has them (DeviceInfo::graphs: the SIMT runtime and Vulkan in CI, CUDA and HIP
// on a GPU); the others must refuse with Error(kUnsupported). A replay runs the recorded ops again
// with the arguments they had at capture, on the buffers they had, and gives the bits of running
// them one by one; a call CUDA refuses on a capturing stream throws naming it and invalidates the
// capture.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "core/device.h"
#include "core/error.h"
#include "tests/common/device_harness.h"

namespace ct::test {
namespace {

class Graph : public DeviceTest {
 protected:
  void SetUp() override {
    DeviceTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (!dev().info().graphs) {
      EXPECT_EQ(kind([&] { dev().begin_capture(); }), ErrorKind::kUnsupported);
      GTEST_SKIP() << id() << " has no graphs";
    }
  }
  static ErrorKind kind(const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.kind();
    }
    return ErrorKind::kInternal;  // nothing thrown
  }
  // The message of the error `f` throws ("" when it throws none).
  static std::string message(const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  // A few ops of different kinds on x, w: a matmul (the GEMM library where the device has one),
  // an elementwise op, a reduction with scratch, a device-to-device copy and an accumulation.
  void ops(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& sum,
           const Tensor& acc) {
    dev().matmul(y, x, w, false, true);
    dev().scale(y, 0.5f);
    dev().sum(sum, y, 1.0f / 64.0f);
    dev().copy(acc.slice_flat(0, {16}), y.slice_flat(0, {16}));
    dev().accumulate(acc, y.slice_flat(16, {acc.numel()}));
  }
};

TEST_P(Graph, ReplaysGiveTheBitsOfTheOpsRunOneByOne) {
  Device& d = dev();
  const Vec xv = randn(8 * 32, 1), wv = randn(16 * 32, 2);
  Tensor x = upload(d, {8, 32}, xv), w = upload(d, {16, 32}, wv);
  auto fresh = [&](const Shape& s) {
    Tensor t = d.empty(s, DType::f32, MemCategory::kActivations);
    d.fill(t, 0.0f);
    return t;
  };
  // One by one, three times (acc accumulates across the rounds).
  Tensor y = fresh({8, 16}), sum = fresh({1}), acc = fresh({64});
  for (int i = 0; i < 3; ++i) ops(y, x, w, sum, acc);
  const Vec want_y = download(d, y), want_sum = download(d, sum), want_acc = download(d, acc);

  // Captured once (nothing runs), then replayed three times.
  Tensor gy = fresh({8, 16}), gsum = fresh({1}), gacc = fresh({64});
  const int64_t replays_before = d.counters().at("graph_replays");
  d.begin_capture();
  ops(gy, x, w, gsum, gacc);
  const int64_t graph = d.end_capture();
  ASSERT_GT(graph, 0);
  EXPECT_EQ(download(d, gacc), Vec(64, 0.0f)) << "a captured op ran at capture";
  for (int i = 0; i < 3; ++i) d.replay_graph(graph);
  EXPECT_EQ(d.counters().at("graph_replays") - replays_before, 3);
  EXPECT_EQ(download(d, gy), want_y);
  EXPECT_EQ(download(d, gsum), want_sum);
  EXPECT_EQ(download(d, gacc), want_acc);

  // The graph reads its inputs at replay: new values uploaded into x give new results.
  d.upload(x, wv.data(), 8 * 32 * sizeof(float));
  d.fill(gacc, 0.0f);
  d.replay_graph(graph);
  Tensor ry = fresh({8, 16}), rsum = fresh({1}), racc = fresh({64});
  ops(ry, x, w, rsum, racc);
  EXPECT_EQ(download(d, gacc), download(d, racc));
  d.release_graph(graph);
  EXPECT_EQ(kind([&] { d.replay_graph(graph); }), ErrorKind::kInvalidArgument);
}

// The graph owns every buffer its ops use: a tensor dropped after capture (or made and dropped
// during it) keeps its memory until the graph is released, so a buffer allocated meanwhile never
// gets its address and the replay's writes land nowhere else.
TEST_P(Graph, BuffersAGraphUsesStayItsOwnUntilReleased) {
  Device& d = dev();
  const int64_t n = 4096;
  Tensor src = upload(d, {n}, randn(static_cast<size_t>(n), 3));
  Tensor out = d.empty({n}, DType::f32, MemCategory::kActivations);
  const int64_t before = d.memory().total_current;
  int64_t graph = 0;
  {
    Tensor tmp = d.empty({n}, DType::f32, MemCategory::kActivations);  // dropped below
    d.begin_capture();
    Tensor inner = d.empty({n}, DType::f32, MemCategory::kActivations);  // made in the capture
    d.copy(tmp, src);
    d.scale(tmp, 2.0f);
    d.copy(inner, tmp);
    d.add(out, inner, src);  // 3 src
    graph = d.end_capture();
  }
  // The two dropped tensors' buffers are the graph's now: new tensors of their size get others.
  Tensor a = d.empty({n}, DType::f32, MemCategory::kActivations);
  Tensor b = d.empty({n}, DType::f32, MemCategory::kActivations);
  d.fill(a, 7.0f);
  d.fill(b, 7.0f);
  d.replay_graph(graph);
  EXPECT_EQ(download(d, a), Vec(static_cast<size_t>(n), 7.0f));
  EXPECT_EQ(download(d, b), Vec(static_cast<size_t>(n), 7.0f));
  const Vec s = download(d, src), o = download(d, out);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(o[i], s[i] * 2.0f + s[i]) << "element " << i;
  const int64_t bytes = n * static_cast<int64_t>(sizeof(float));
  EXPECT_EQ(d.memory().total_current - before, 4 * bytes) << "tmp, inner (the graph's), a, b";
  d.release_graph(graph);
  EXPECT_EQ(d.memory().total_current - before, 2 * bytes) << "a, b";
}

// adamw_groups reads its learning rate and step from the schedule tensor when it runs, so one
// graph of it replays every step of a schedule: the schedule uploaded before each replay (outside
// the graph), the bits of the op run one by one with the same uploads.
TEST_P(Graph, AdamWGroupsReplaysReadTheScheduleUploadedBeforeThem) {
  Device& d = dev();
  const int64_t n = 3000;
  AdamWGroups gr;
  gr.count = 2;
  gr.ranges[0] = {0, 2000, true};
  gr.ranges[1] = {2000, 999, false};
  const Vec p0 = randn(n, 20), g0 = randn(n, 21);
  AdamWHyper hp;
  hp.weight_decay = 0.1f;
  hp.max_grad_norm = 1.0f;
  auto set_step = [&](const Tensor& sched, int s) {
    hp.step = s;
    hp.lr = 1e-2f / static_cast<float>(s);
    const AdamWSchedule v = adamw_schedule(hp);
    d.upload(sched, &v, sizeof v);
  };
  Vec results[2];
  for (int graphed = 0; graphed < 2; ++graphed) {
    Tensor p = upload(d, {n}, p0), g = upload(d, {n}, g0), m = upload(d, {n}, Vec(n, 0.0f));
    Tensor v = upload(d, {n}, Vec(n, 0.0f)), gn = upload(d, {1}, {4.0f});
    Tensor sched = d.empty({kAdamWScheduleLen}, DType::f32, MemCategory::kOptimizer);
    int64_t graph = 0;
    if (graphed) {
      d.begin_capture();
      d.adamw_groups(p, g, m, v, gn, sched, gr, hp);
      graph = d.end_capture();
    }
    for (int s = 1; s <= 3; ++s) {
      set_step(sched, s);
      if (graphed)
        d.replay_graph(graph);
      else
        d.adamw_groups(p, g, m, v, gn, sched, gr, hp);
    }
    if (graph) d.release_graph(graph);
    results[graphed] = download(d, p);
  }
  EXPECT_EQ(results[1], results[0]);
  EXPECT_NE(results[0], p0);
}

// Each call CUDA refuses on a capturing stream throws, naming the call and the rule, and
// invalidates the capture: end_capture() leaves capture and throws, naming the first refusal.
// The device works as before afterwards.
TEST_P(Graph, ForbiddenCallsDuringCaptureThrowAndInvalidateIt) {
  Device& d = dev();
  Tensor t = upload(d, {4}, {1, 2, 3, 4});
  float host[4] = {};
  const std::pair<const char*, std::function<void()>> refused[] = {
      {"synchronize", [&] { d.synchronize(); }},
      {"download", [&] { d.download(host, t, sizeof host); }},
      {"download_async", [&] { (void)d.download_async(host, t, sizeof host); }},
      {"upload", [&] { d.upload(t, host, sizeof host); }},
      {"record_event", [&] { (void)d.record_event(); }},
      {"begin_capture", [&] { d.begin_capture(); }},
  };
  for (const auto& [call, f] : refused) {
    SCOPED_TRACE(call);
    d.begin_capture();
    d.scale(t, 2.0f);
    const std::string what = message(f);
    EXPECT_NE(what.find(std::string(": ") + call), std::string::npos) << what;
    EXPECT_NE(what.find(" during a graph capture: "), std::string::npos) << what;
    const char* rule = d.info().backend == "vulkan" ? "CUDA and HIP refuse the same calls"
                                                    : "cudaErrorStreamCaptureUnsupported";
    EXPECT_NE(what.find(rule), std::string::npos) << what;
    const std::string ended = message([&] { (void)d.end_capture(); });
    EXPECT_NE(ended.find("the graph capture was invalidated by " + std::string(call)),
              std::string::npos)
        << ended;
  }
  EXPECT_EQ(kind([&] { (void)d.end_capture(); }), ErrorKind::kInvalidArgument);  // none open
  // Nothing captured ran: t is as uploaded, and the device runs ops again.
  EXPECT_EQ(download(d, t), (Vec{1, 2, 3, 4}));
  d.scale(t, 2.0f);
  EXPECT_EQ(download(d, t), (Vec{2, 4, 6, 8}));
}

CT_INSTANTIATE_DEVICE_SUITE(Graph);

}  // namespace
}  // namespace ct::test
