// Events and asynchronous downloads (core/device.h, "stream"), on every device under test
// (tests/common/device_harness.h): eager ones (cpu, simt: every op has finished when its call
// returns) and queued ones (Vulkan batches with fences, on lavapipe under the validation layer;
// CUDA and HIP streams).
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "core/registry.h"
#include "tests/common/device_harness.h"

namespace ct::test {
namespace {

class Stream : public DeviceTest {
 protected:
  Device& d() { return dev(); }
  Tensor up(const Vec& v) { return upload(d(), {static_cast<int64_t>(v.size())}, v); }
  // No queue of its own: ops run before their call returns, so events are complete at once.
  bool eager() { return d().native_stream() == nullptr; }
};

TEST_P(Stream, EventAfterAChainOfOpsCompletesWithTheRightData) {
  const size_t n = 100003;  // odd: no multiple of any workgroup size
  Vec x = randn(n, 1), y = randn(n, 2);
  Tensor tx = up(x), ty = up(y);
  Tensor out = d().empty({static_cast<int64_t>(n)}, DType::f32, MemCategory::kActivations);
  d().add(out, tx, ty);     // x + y
  d().scale(out, 2.0f);     // 2 (x + y)
  d().accumulate(out, tx);  // 2 (x + y) + x
  d().accumulate(out, ty);  // 2 (x + y) + x + y
  Event e = d().record_event();
  EXPECT_EQ(e.device(), &d());
  e.wait();
  EXPECT_TRUE(e.done());
  Vec got(n, -1.0f);
  d().download_async(got.data(), out, n * sizeof(float)).wait();
  for (size_t i = 0; i < n; ++i)
    ASSERT_FLOAT_EQ(got[i], (x[i] + y[i]) * 2.0f + x[i] + y[i]) << "element " << i;
}

TEST_P(Stream, DownloadAsyncSeesItsPointInTheStreamWithSeveralOutstanding) {
  const int64_t n = 4099;
  Tensor t = d().empty({n}, DType::f32, MemCategory::kActivations);
  Tensor u = d().empty({n}, DType::f32, MemCategory::kActivations);
  std::vector<Vec> host(5, Vec(static_cast<size_t>(n), -7.0f));
  std::vector<Event> ev;
  d().fill(t, 1.0f);
  ev.push_back(d().download_async(host[0].data(), t, n * sizeof(float)));
  d().fill(t, 2.0f);  // overwrites the source of the download still in flight
  ev.push_back(d().download_async(host[1].data(), t, n * sizeof(float)));
  d().scale(t, 3.0f);
  d().copy(u, t);
  d().fill(t, 0.5f);
  ev.push_back(d().download_async(host[2].data(), u, n * sizeof(float)));
  ev.push_back(d().download_async(host[3].data(), t, 5 * sizeof(float)));  // a prefix only
  ev.push_back(d().download_async(host[4].data(), t.slice_flat(n - 3, {3}), 3 * sizeof(float)));
  // Waiting on the last completes (and lands) the earlier ones too: one in-order stream.
  ev.back().wait();
  for (const Event& e : ev) EXPECT_TRUE(e.done());
  const float want[3] = {1.0f, 2.0f, 6.0f};
  for (int k = 0; k < 3; ++k)
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(host[k][i], want[k]) << "download " << k << " at " << i;
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(host[3][i], i < 5 ? 0.5f : -7.0f) << i;
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(host[4][i], i < 3 ? 0.5f : -7.0f) << i;
}

TEST_P(Stream, DownloadAsyncReturnsBeforeTheWorkIsDone) {
  // A product that takes a while on any device the tests run on (lavapipe: tens of ms), then a
  // download of its result. On an asynchronous device the call returns while the product runs,
  // and the host memory is written only once the event is seen complete.
  const int64_t m = 384;
  Vec a = randn(m * m, 3, 0.05f);
  Tensor ta = upload(d(), {m, m}, a);
  Tensor c = d().empty({m, m}, DType::f32, MemCategory::kActivations);
  Tensor c2 = d().empty({m, m}, DType::f32, MemCategory::kActivations);
  d().synchronize();
  for (int r = 0; r < 8; ++r) {
    d().matmul(c, ta, ta, false, false);
    d().matmul(c2, c, ta, false, false);
  }
  Vec got(static_cast<size_t>(m * m), -7.0f);
  auto t0 = std::chrono::steady_clock::now();
  Event e = d().download_async(got.data(), c2, got.size() * sizeof(float));
  auto t1 = std::chrono::steady_clock::now();
  bool untouched = got.front() == -7.0f && got.back() == -7.0f;
  bool done_at_once = e.done();
  e.wait();
  auto t2 = std::chrono::steady_clock::now();
  if (!eager()) {
    // Nothing lands in host memory before the event is observed complete.
    EXPECT_TRUE(untouched || done_at_once);
    if (d().info().backend == "vulkan" && d().info().type == DeviceType::kCpu) {
      // lavapipe: the products take tens of ms, so the call visibly returns first (a real GPU
      // may finish them before the host looks).
      EXPECT_FALSE(done_at_once) << "download_async waited for 16 products of " << m << "^3";
      EXPECT_TRUE(untouched);
    }
  } else {
    EXPECT_TRUE(done_at_once);  // eager: the copy is made before the call returns
    EXPECT_FALSE(untouched);
  }
  std::printf("[ info ] %s: download_async returned after %.2f ms, data after %.2f ms\n",
              id().c_str(), std::chrono::duration<double, std::milli>(t1 - t0).count(),
              std::chrono::duration<double, std::milli>(t2 - t0).count());
  Vec want = download(d(), c2);  // the synchronous path agrees byte for byte
  ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
}

TEST_P(Stream, EventsAcrossFlush) {
  const int64_t n = 1000;
  Tensor t = d().empty({n}, DType::f32, MemCategory::kActivations);
  EXPECT_TRUE(d().record_event().done());  // nothing enqueued since the last wait
  d().fill(t, 1.0f);
  Event e1 = d().record_event();
  d().flush();
  d().scale(t, 4.0f);
  Event e2 = d().record_event();  // may sit in a batch not yet submitted
  d().scale(t, 0.5f);
  Vec h2(static_cast<size_t>(n), 0.0f);
  Event e3 = d().download_async(h2.data(), t, n * sizeof(float));
  d().flush();
  d().scale(t, 10.0f);
  Event e4 = d().record_event();
  e1.wait();
  EXPECT_TRUE(e1.done());
  e4.wait();
  EXPECT_TRUE(e2.done());
  EXPECT_TRUE(e3.done());
  EXPECT_TRUE(e4.done());
  for (float v : h2) ASSERT_EQ(v, 2.0f);
  EXPECT_TRUE(Event().done());  // a default event is complete
  Event().wait();
  // Polling alone makes progress: done() submits what the event waits for.
  d().fill(t, 3.0f);
  Event e5 = d().record_event();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!e5.done()) ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "never completed";
  EXPECT_EQ(download(d(), t)[n - 1], 3.0f);
  // synchronize() lands outstanding downloads as well.
  Vec h3(3, 0.0f);
  d().download_async(h3.data(), t, 3 * sizeof(float));
  d().synchronize();
  EXPECT_EQ(h3, Vec(3, 3.0f));
}

TEST_P(Stream, StreamWaitOrdersAfterAnotherDevicesEvent) {
  auto other = open_device("cpu:1");
  Tensor src = other->empty({4}, DType::f32, MemCategory::kActivations);
  other->fill(src, 9.0f);
  Event on_other = other->record_event();
  d().stream_wait(on_other);
  EXPECT_TRUE(on_other.done());
  Vec h(4, 0.0f);
  Event mine = other->download_async(h.data(), src, 4 * sizeof(float));
  d().stream_wait(mine);
  EXPECT_EQ(h, Vec(4, 9.0f));
  d().stream_wait(d().record_event());  // this device's own: already ordered
}

TEST_P(Stream, NativeStreamAndArgumentChecks) {
  const std::string backend = d().info().backend;
  if (backend == "vulkan" || backend == "cuda" || backend == "hip")
    EXPECT_NE(d().native_stream(), nullptr);  // the VkQueue, cudaStream_t, hipStream_t
  else
    EXPECT_EQ(d().native_stream(), nullptr);  // eager (cpu, simt): no queue
  Tensor t = d().empty({4, 6}, DType::f32, MemCategory::kActivations);
  d().fill(t, 1.0f);
  Vec h(64, 0.0f);
  auto kind = [&](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return e.kind();
    }
    return ErrorKind::kInternal;
  };
  Tensor tt = t;  // a transposed view: not contiguous
  tt.shape = {6, 4};
  tt.strides = {1, 6};
  EXPECT_EQ(kind([&] { d().download_async(h.data(), tt, 24 * sizeof(float)); }),
            ErrorKind::kInvalidArgument);
  EXPECT_EQ(kind([&] { d().download_async(h.data(), t, 25 * sizeof(float)); }),
            ErrorKind::kInvalidArgument);
  EXPECT_EQ(kind([&] { d().download_async(nullptr, t, 4); }), ErrorKind::kInvalidArgument);
  auto other = open_device("cpu:1");
  Tensor elsewhere = other->empty({4}, DType::f32, MemCategory::kActivations);
  EXPECT_EQ(kind([&] { d().download_async(h.data(), elsewhere, 4); }), ErrorKind::kInvalidArgument);
  EXPECT_TRUE(d().download_async(nullptr, t, 0).done());  // nothing to copy
}

CT_INSTANTIATE_DEVICE_SUITE(Stream);

}  // namespace
}  // namespace ct::test
