// The conformance harness: every op test runs on every device the registry lists, against the
// CPU reference device (cpu:1, fp64 accumulation) as the oracle.
//
// Devices under test: each device of each backend in ct::backends() (core/registry.h) except the
// reference itself, named cpu_0, vulkan_0, ... in test names. A backend that is listed but
// unusable (or that this build made and the registry cannot find) is an entry of its own,
// e.g. vulkan_unavailable, whose cases are SKIPPED with the reason -- except for the backends
// this build was configured to test (CT_EXPECTED_BACKENDS, set by tests/CMakeLists.txt; CI runs
// Vulkan on lavapipe): those FAIL with the reason, never skip.
//
// Add an op: add its cases to the table of its family's file (tests/ops/<family>_test.cpp) or,
// for a new family, one file there with `using Family = DeviceTest;`, TEST_P cases and
// CT_INSTANTIATE_DEVICE_SUITE(Family). Compare against ref() with close_nmse(..., tol(kind)).
// Add a backend: nothing here. Build its plugin beside the test binaries; the registry lists it
// and every suite runs on it (add it to CT_EXPECTED_BACKENDS so that CI fails if it goes
// missing). A plugin exporting `uint64_t crosstrain_<backend>_validation_messages()` gets the
// Vulkan treatment: any message counted during a case fails it.
//
// Tolerances (normalised MSE, sum((got-want)^2) / sum(want^2)):
//   a device of another backend than the reference: 1e-7 (kTol), 5e-4 for matmul/attention
//     (kTolGemm); 16-bit outputs are checked where the case says (mixed-precision suite).
//   a device of the reference's own backend (cpu:0): 1e-11 for both -- both sides compute the
//     same maths in f32 or better -- and the checks that the CPU backend promises bit for bit.
//   The reference against fp64 forwards here: kTolF64; reference backwards against fp64
//     central differences: kTolGrad (those run on the reference only, in Reference* suites).
// NaN on one side only, or an inf the other side does not have with the same sign, fails.
#pragma once

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "core/op_support.h"
#include "core/philox.h"
#include "core/registry.h"
#include "tests/common/test_data.h"

namespace ct::test {

inline constexpr double kTolF64 = 1e-12;   // reference vs the fp64 forwards below
inline constexpr double kTolGrad = 1e-9;   // reference backward vs fp64 central differences
inline constexpr double kTolSame = 1e-11;  // a device of the reference's backend vs reference
inline constexpr double kTol = 1e-7;       // another backend: elementwise/normalisation/loss
inline constexpr double kTolGemm = 5e-4;   // another backend: matmul and attention

enum class Tol { kElementwise, kGemm };

using Vec = std::vector<float>;
using VecD = std::vector<double>;

// ---- the device list -----------------------------------------------------------------------

struct DeviceCase {
  std::string backend;    // "cpu", "vulkan", ...
  int index = -1;         // -1: the backend is unavailable
  std::string why;        // why it is unavailable ("" when usable)
  bool expected = false;  // this build must be able to test it: unavailable fails, never skips
  std::string spec() const { return backend + ":" + std::to_string(index); }
  std::string test_name() const {
    return index < 0 ? backend + "_unavailable" : backend + "_" + std::to_string(index);
  }
};
inline void PrintTo(const DeviceCase& c, std::ostream* os) {
  *os << c.test_name();
}

// Before anything opens Vulkan: pins the loader to lavapipe (CT_VK_LAVAPIPE_ICD, found at
// configure time) unless the environment already chose a driver, and turns the Khronos
// validation layer on (CT_VK_VALIDATION) unless the environment says otherwise. True when
// pinned here.
inline bool prepare_environment() {
  static const bool pinned = [] {
#ifdef CT_VK_VALIDATION
    setenv("VK_INSTANCE_LAYERS", "VK_LAYER_KHRONOS_validation", 0);
    setenv("CROSSTRAIN_VK_VALIDATION", "1", 0);
#endif
#ifdef CT_VK_LAVAPIPE_ICD
    if (std::getenv("VK_DRIVER_FILES") || std::getenv("VK_ICD_FILENAMES")) return false;
    setenv("VK_DRIVER_FILES", CT_VK_LAVAPIPE_ICD, 1);
    setenv("VK_ICD_FILENAMES", CT_VK_LAVAPIPE_ICD, 1);  // loaders before 1.3.207
    return true;
#else
    return false;
#endif
  }();
  return pinned;
}

inline bool backend_expected(const std::string& name) {
#ifdef CT_EXPECTED_BACKENDS
  std::stringstream ss(CT_EXPECTED_BACKENDS);
  for (std::string n; std::getline(ss, n, ',');)
    if (n == name) return true;
#endif
  return name == "cpu";
}

// The backends whose devices this process can run, read from --gtest_filter; empty: all of them.
// ctest runs every case in a process of its own (--gtest_filter=On/Gelu.MatchesReference/cpu_0),
// and loading the backends the filter rules out costs that process most of its start-up (lavapipe
// and LLVM loaded and a Vulkan instance created under the validation layer, ~0.1 s; several times
// that under ASan; once per case). A pattern whose last part is <backend>_<index>,
// <backend>_unavailable or <backend>_* names that backend; when every positive pattern does, the
// process needs those backends and cpu (the reference) only. Anything else keeps all of them.
inline std::vector<std::string> backends_named_by_filter() {
  std::string f = GTEST_FLAG_GET(filter);
  f = f.substr(0, f.find('-'));  // the positive patterns
  std::vector<std::string> names;
  std::stringstream ss(f);
  for (std::string p; std::getline(ss, p, ':');) {
    if (p.empty()) continue;
    const size_t slash = p.rfind('/');
    if (slash == std::string::npos) return {};
    const std::string param = p.substr(slash + 1);
    const size_t us = param.rfind('_');
    if (us == std::string::npos || us == 0) return {};
    const std::string backend = param.substr(0, us), rest = param.substr(us + 1);
    const bool index = !rest.empty() && rest.find_first_not_of("0123456789") == std::string::npos;
    if (backend.find_first_of("*?") != std::string::npos ||
        !(index || rest == "*" || rest == "unavailable"))
      return {};
    names.push_back(backend);
  }
  if (!names.empty()) names.push_back("cpu");
  return names;
}

// The registry, loading only the backends the filter leaves (CROSSTRAIN_BACKENDS, set for the
// loading alone so that processes a test starts see the environment they were given). gtest
// evaluates the suites' device lists after parsing its flags, so the filter is known here.
inline const std::vector<BackendEntry>& registry() {
  prepare_environment();
  static const bool loaded = [] {
    std::string only;
    for (const auto& n : backends_named_by_filter()) only += (only.empty() ? "" : ",") + n;
    const bool set_here = !only.empty() && !std::getenv("CROSSTRAIN_BACKENDS");
    if (set_here) setenv("CROSSTRAIN_BACKENDS", only.c_str(), 1);
    (void)backends();
    if (set_here) unsetenv("CROSSTRAIN_BACKENDS");
    return true;
  }();
  (void)loaded;
  return backends();
}

inline const BackendEntry* backend_entry(const std::string& name) {
  for (const auto& e : registry())
    if (e.name == name) return &e;
  return nullptr;
}

// Every device under test, computed once per process (of the backends the filter leaves).
inline const std::vector<DeviceCase>& devices_under_test() {
  static const std::vector<DeviceCase> list = [] {
    const std::vector<std::string> only = backends_named_by_filter();
    auto wanted = [&](const std::string& backend) {
      return only.empty() || std::find(only.begin(), only.end(), backend) != only.end();
    };
    std::vector<DeviceCase> v;
    const std::string hint =
        " -- on a machine without a GPU install lavapipe (Debian: mesa-vulkan-drivers) and the "
        "Vulkan loader (libvulkan1)";
    auto why_hint = [&](const std::string& backend) {
      return backend == "vulkan" ? hint : std::string();
    };
    for (const auto& e : registry()) {
      if (!wanted(e.name)) continue;
      DeviceCase c;
      c.backend = e.name;
      c.expected = backend_expected(e.name);
      if (!e.backend || !e.error.empty()) {
        c.why = "the " + e.name + " backend is unavailable: " + e.error + why_hint(e.name);
        v.push_back(c);
        continue;
      }
      auto devs = e.backend->devices();
      if (devs.empty()) {
        c.why = "the " + e.name + " backend lists no devices" + why_hint(e.name);
        v.push_back(c);
      }
      for (const auto& d : devs) {
        if (e.name == "cpu" && d.index == 1) continue;  // the reference itself
        c.index = d.index;
        v.push_back(c);
      }
    }
#ifdef CT_EXPECTED_BACKENDS
    std::stringstream ss(CT_EXPECTED_BACKENDS);
    for (std::string n; std::getline(ss, n, ',');) {
      if (n.empty() || !wanted(n) || backend_entry(n)) continue;
      DeviceCase c;
      c.backend = n;
      c.expected = true;
      c.why = "libcrosstrain_backend_" + n + ".so was not found beside the test binary (" +
              executable_dir() + ")" + why_hint(n);
      v.push_back(c);
    }
#endif
    return v;
  }();
  return list;
}

inline std::string device_param_name(const ::testing::TestParamInfo<DeviceCase>& info) {
  return info.param.test_name();
}

// Devices are opened once per process and kept (a Vulkan device is costly to open) until the
// test main calls shutdown_backends(), which closes them first; never by a static destructor.
inline Device& open_cached(const std::string& spec) {
  struct Cache {
    std::mutex mu;
    std::map<std::string, std::unique_ptr<Device>> open;
  };
  static Cache* cache = [] {
    auto* c = new Cache();  // leaked: see above
    at_backend_shutdown([c] {
      std::lock_guard<std::mutex> lock(c->mu);
      c->open.clear();
    });
    return c;
  }();
  std::lock_guard<std::mutex> lock(cache->mu);
  auto& d = cache->open[spec];
  if (!d) d = open_device(spec);
  return *d;
}

// The oracle: the CPU reference device.
inline Device& ref() {
  return open_cached("cpu:1");
}

// Messages counted by a backend's validation hook (Vulkan: CROSSTRAIN_VK_VALIDATION=1).
inline uint64_t validation_messages(const std::string& backend) {
  const BackendEntry* e = backend_entry(backend);
  if (!e || e->path.empty() || e->path[0] == '(') return 0;
  void* h = dlopen(e->path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (!h) return 0;
  using Fn = uint64_t (*)();
  auto fn =
      reinterpret_cast<Fn>(dlsym(h, ("crosstrain_" + backend + "_validation_messages").c_str()));
  if (!fn && backend == "vulkan")
    fn = reinterpret_cast<Fn>(dlsym(h, "crosstrain_vk_validation_messages"));
  uint64_t n = fn ? fn() : 0;
  dlclose(h);
  return n;
}

// ---- host <-> device -------------------------------------------------------------------------

inline Tensor upload(Device& d, const Shape& s, const Vec& v,
                     MemCategory c = MemCategory::kActivations) {
  Tensor t = d.empty(s, DType::f32, c);
  EXPECT_EQ(static_cast<size_t>(s.numel()), v.size()) << "upload " << s.str();
  d.upload(t, v.data(), v.size() * sizeof(float));
  return t;
}
inline Tensor upload_i32(Device& d, const Shape& s, const std::vector<int32_t>& v) {
  Tensor t = d.empty(s, DType::i32, MemCategory::kActivations);
  d.upload(t, v.data(), v.size() * sizeof(int32_t));
  return t;
}
inline Vec download(Device& d, const Tensor& t) {
  return testdata::download_as<float>(d, t);
}
inline std::vector<int32_t> download_i32(Device& d, const Tensor& t) {
  return testdata::download_as<int32_t>(d, t);
}
template <class T>
std::vector<T> download_as(Device& d, const Tensor& t) {
  return testdata::download_as<T>(d, t);
}
inline std::vector<uint8_t> raw_download(Device& d, const Tensor& t) {
  std::vector<uint8_t> v(t.nbytes());
  d.download(v.data(), t, v.size());
  return v;
}

// Seeded inputs (Philox streams 17, 23, 29 of `seed`).
inline Vec randn(size_t n, uint64_t seed, float scale = 1.0f) {
  return testdata::randn(n, seed, scale, 17);
}
inline Vec uniform(size_t n, uint64_t seed, float lo, float hi) {
  return testdata::uniform(n, seed, lo, hi, 23);
}
inline std::vector<int32_t> randint(size_t n, uint64_t seed, int32_t hi) {
  return testdata::randint(n, seed, hi, 29);
}
inline VecD to_d(const Vec& v) {
  return VecD(v.begin(), v.end());
}

// ---- the comparison --------------------------------------------------------------------------

// Normalised MSE of got against want; fails on a length mismatch, a NaN on one side only, or
// an inf that the other side does not have with the same sign. CT_PRINT_NMSE=1 prints each.
template <typename W>
::testing::AssertionResult close_nmse(const Vec& got, const std::vector<W>& want, double tol,
                                      const std::string& what = "") {
  if (got.size() != want.size())
    return ::testing::AssertionFailure()
           << what << ": size " << got.size() << " vs " << want.size();
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    double g = got[i], w = static_cast<double>(want[i]);
    if (std::isnan(g) != std::isnan(w) || ((std::isinf(g) || std::isinf(w)) && g != w))
      return ::testing::AssertionFailure()
             << what << ": non-finite mismatch at " << i << ": got " << g << ", want " << w;
    if (std::isnan(g) || std::isinf(g)) continue;
    num += (g - w) * (g - w);
    den += w * w;
  }
  double e = den > 0 ? num / den : num;
  if (std::getenv("CT_PRINT_NMSE"))
    std::printf("  nmse %-50s %.3g (tol %.0e)\n", what.c_str(), e, tol);
  if (e <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": normalised MSE " << e << " > " << tol;
}

// d/dx of L(x) = sum_j g_j f(x)_j by central differences in fp64.
inline VecD numeric_grad(const std::function<VecD(const VecD&)>& f, VecD x, const VecD& g,
                         double h = 1e-6) {
  VecD grad(x.size());
  auto dot = [&](const VecD& y) {
    double s = 0.0;
    for (size_t j = 0; j < y.size(); ++j) s += g[j] * y[j];
    return s;
  };
  for (size_t i = 0; i < x.size(); ++i) {
    double x0 = x[i];
    x[i] = x0 + h;
    double lp = dot(f(x));
    x[i] = x0 - h;
    double lm = dot(f(x));
    x[i] = x0;
    grad[i] = (lp - lm) / (2.0 * h);
  }
  return grad;
}

// ---- the device under test -------------------------------------------------------------------

// The device of the running DeviceTest case (set by its SetUp), for helpers outside the fixture.
inline Device*& current_device() {
  static Device* d = nullptr;
  return d;
}
inline Device& dut() {
  if (!current_device()) throw std::logic_error("dut() outside a DeviceTest case");
  return *current_device();
}
inline std::string dut_id() {
  return dut().info().id();
}
// True on a device of the reference's own backend (cpu:0): the tight tolerances and the checks
// that backend promises bit for bit.
inline bool dut_same_backend_as_ref() {
  return dut().info().backend == ref().info().backend;
}
inline double dut_tol(Tol t = Tol::kElementwise) {
  if (dut_same_backend_as_ref()) return kTolSame;
  return t == Tol::kGemm ? kTolGemm : kTol;
}

// The same host data on the device under test and the reference.
struct Pair {
  Tensor d, r;  // device under test, reference
};
inline Pair both(const Shape& s, const Vec& v) {
  return {upload(dut(), s, v), upload(ref(), s, v)};
}
inline Pair both_i32(const Shape& s, const std::vector<int32_t>& v) {
  return {upload_i32(dut(), s, v), upload_i32(ref(), s, v)};
}
inline Pair both_empty(const Shape& s, DType dt = DType::f32) {
  return {dut().empty(s, dt, MemCategory::kActivations),
          ref().empty(s, dt, MemCategory::kActivations)};
}
inline ::testing::AssertionResult same(const Pair& p, double t, const std::string& what) {
  return close_nmse(download(dut(), p.d), download(ref(), p.r), t, what + " on " + dut_id());
}

// ---- the fixture -----------------------------------------------------------------------------

// A case on one device under test. Unavailable: skipped with the reason, or failed when the
// build expects the backend. Any validation message during the case fails it.
class DeviceTest : public ::testing::TestWithParam<DeviceCase> {
 protected:
  void SetUp() override {
    const DeviceCase& c = GetParam();
    if (c.index < 0) {
      if (c.expected) FAIL() << c.why;
      GTEST_SKIP() << c.why;
    }
    current_device() = &open_cached(c.spec());
    messages_before_ = validation_messages(c.backend);
  }
  void TearDown() override {
    const DeviceCase& c = GetParam();
    if (c.index < 0) return;
    EXPECT_NO_THROW(dev().synchronize());
    EXPECT_EQ(validation_messages(c.backend), messages_before_)
        << c.backend << " validation layer messages";
    current_device() = nullptr;
  }

  Device& dev() const { return open_cached(GetParam().spec()); }
  std::string id() const { return GetParam().spec(); }
  bool same_backend_as_ref() const { return dut_same_backend_as_ref(); }
  double tol(Tol t = Tol::kElementwise) const { return dut_tol(t); }

  // Why the device cannot run (op, dtype), or "" if it can.
  std::string unsupported(OpKind op, DType dt) const {
    if (dev().supports(op, dt)) return "";
    return id() + " does not support op " + op_kind_name(op) + " on " + dtype_name(dt);
  }

  // Why a tensor of `bytes` (and its copies: the reference's and the host's) cannot be made
  // here, or "" if it can.
  std::string cannot_hold(int64_t bytes, int copies = 4) const {
    const DeviceInfo& i = dev().info();
    if (i.max_allocation_bytes > 0 && bytes > i.max_allocation_bytes)
      return id() + " cannot allocate " + std::to_string(bytes) + " bytes in one buffer";
    int64_t host = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
    if (bytes * copies > host / 2)
      return "a tensor past " + id() + "'s binding range (" +
             std::to_string(i.max_buffer_range_bytes) + " bytes) would need " +
             std::to_string(bytes * copies) + " bytes here, more than half the machine's " +
             std::to_string(host);
    return "";
  }

  uint64_t messages_before_ = 0;
};

// Skips the case (with the reason) when the device lacks (op, dtype).
#define CT_REQUIRE_SUPPORT(op, dt)                 \
  do {                                             \
    std::string ct_why_ = unsupported(op, dt);     \
    if (!ct_why_.empty()) GTEST_SKIP() << ct_why_; \
  } while (0)

// Instantiates a DeviceTest suite over every device under test (names On/Suite.Case/cpu_0).
#define CT_INSTANTIATE_DEVICE_SUITE(Suite)                                                   \
  INSTANTIATE_TEST_SUITE_P(On, Suite, ::testing::ValuesIn(::ct::test::devices_under_test()), \
                           ::ct::test::device_param_name)

}  // namespace ct::test
