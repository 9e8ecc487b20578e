// teardown_probe: what every crosstrain process does at its end, reduced. Loads every backend,
// opens device 0 of each usable one, runs a matmul on each (checked against the host), closes the
// devices, and returns from main, which shuts the backends down (core/registry.h). With
// --no-shutdown it returns without shutdown_backends(): the backends are then left to the OS,
// never destroyed. Under CROSSTRAIN_TRACE_TEARDOWN=1 every backend, device and Vulkan instance
// says when it goes, and "main returned" marks the end of main; tests/tools/teardown_test.cpp
// checks that nothing goes after it. Prints "ok <id>" per device; exits 1 on a wrong product.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/registry.h"
#include "core/teardown_trace.h"

int main(int argc, char** argv) {
  const bool shutdown = !(argc > 1 && std::strcmp(argv[1], "--no-shutdown") == 0);
  std::optional<ct::ShutdownBackendsOnReturn> guard;
  if (shutdown) guard.emplace();
  int failures = 0;
  {
    std::vector<std::unique_ptr<ct::Device>> devices;  // all open at once, closed together
    for (const ct::BackendEntry& e : ct::backends()) {
      if (!e.backend || !e.error.empty()) {
        std::fprintf(stderr, "unavailable %s: %s\n", e.name.c_str(), e.error.c_str());
        continue;
      }
      if (e.backend->devices().empty()) continue;
      devices.push_back(e.backend->open(0));
    }
    // c [2,2] = a [2,3] b [3,2]
    const std::vector<float> a = {1, 2, 3, 4, 5, 6}, b = {7, 8, 9, 10, 11, 12};
    const std::vector<float> want = {58, 64, 139, 154};
    for (auto& d : devices) {
      ct::Tensor ta = d->empty({2, 3}, ct::DType::f32, ct::MemCategory::kActivations);
      ct::Tensor tb = d->empty({3, 2}, ct::DType::f32, ct::MemCategory::kActivations);
      ct::Tensor tc = d->empty({2, 2}, ct::DType::f32, ct::MemCategory::kActivations);
      d->upload(ta, a.data(), a.size() * sizeof(float));
      d->upload(tb, b.data(), b.size() * sizeof(float));
      d->matmul(tc, ta, tb, false, false);
      std::vector<float> got(4);
      d->download(got.data(), tc, got.size() * sizeof(float));
      bool ok = true;
      for (size_t i = 0; i < got.size(); ++i) ok = ok && std::fabs(got[i] - want[i]) < 1e-4f;
      std::fprintf(stderr, "%s %s\n", ok ? "ok" : "wrong product on", d->info().id().c_str());
      failures += ok ? 0 : 1;
    }
  }
  if (!shutdown) ct::trace_teardown("main returned");
  return failures ? 1 : 0;
}
