// matmul_bias_gelu and matmul_gelu_backward (core/device.h), the GELU in a GEMM's epilogue, on
// every device and dtype (f32, f16, bf16), every transpose, edges off every tile size:
//   - against the same device's unfused ops (matmul, then gelu_forward / gelu_backward): the same
//     bits where the device's own kernels run the product; where a vendor library's epilogue
//     does (cuBLASLt on CUDA), within the contract's bound (gelu_epilogue_rel_tol);
//   - against the reference (whose fused ops are the unfused ones by construction).
// On the GPU devices (simt, simt64, cuda, hip) also the own kernels' epilogues with matrix tiles
// on and the library off (CT_GPU_TILES=1, CT_GPU_GEMM=own, as gemm_tc_test.cpp): gemm_tc_kernel
// for rows aligned to 16 bytes, gemm_tile_kernel else, bit for bit against the unfused ops there.
// On Vulkan the epilogue runs in the GEMM shaders (their push constant epi): the
// device's counters must show the fused path ran, and each GEMM family that takes the ops (the
// tiled shaders, the register-block ones, the emulated coopmat build; split-k through
// matmul_splitk.comp; a long K in pieces chained through beta, the GELU on the last) gives the
// unfused ops' bits too.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/common/half_compare.h"

namespace ct::test {
namespace {

struct Case {
  int64_t M, N, K;
  bool ta, tb;
  uint64_t seed;
  std::string name(DType dt) const {
    std::ostringstream os;
    os << dtype_name(dt) << " " << M << "x" << N << "x" << K << (ta ? " ta" : "")
       << (tb ? " tb" : "");
    return os.str();
  }
};

// Off every tile (64, 128, 32-deep slices) and a single element; the second and third have rows
// of 16 bytes in 16-bit (the tensor-core kernel's), the others not.
const Case kCases[] = {{37, 45, 29, false, false, 1},
                       {40, 48, 32, false, true, 2},
                       {24, 136, 16, true, false, 3},
                       {1, 1, 1, true, true, 4},
                       {70, 66, 33, false, false, 5}};

struct Result {
  Vec main, extra;  // forward: pre, out; backward: dpre, and the unfused run's product g then pre
  std::vector<uint8_t> main_raw, extra_raw;
};

Shape a_shape(const Case& c) {
  return c.ta ? Shape{c.K, c.M} : Shape{c.M, c.K};
}
Shape b_shape(const Case& c) {
  return c.tb ? Shape{c.N, c.K} : Shape{c.K, c.N};
}

// pre (=) a b + bias, out (=) gelu(pre); the products spread over the GELU's curve (|pre| ~ 2).
Result forward(Device& d, const Case& c, DType dt, bool fused) {
  const float s = 2.0f / std::sqrt(static_cast<float>(c.K));
  Tensor a = up_as(d, a_shape(c), randn(c.M * c.K, c.seed, s), dt);
  Tensor b = up_as(d, b_shape(c), randn(c.K * c.N, c.seed + 1), dt);
  Tensor bias = upload(d, {c.N}, randn(c.N, c.seed + 2, 0.5f));
  Tensor pre = up_as(d, {c.M, c.N}, Vec(c.M * c.N, NAN), dt);
  Tensor out = up_as(d, {c.M, c.N}, Vec(c.M * c.N, NAN), dt);
  if (fused) {
    d.matmul_bias_gelu(out, pre, a, b, c.ta, c.tb, bias);
  } else {
    d.matmul(pre, a, b, c.ta, c.tb, 1.0f, 0.0f, &bias);
    d.gelu_forward(out.reshape({c.M * c.N}), pre.reshape({c.M * c.N}));
  }
  return {download_h(d, pre), download_h(d, out), raw_download(d, pre), raw_download(d, out)};
}

// dpre (=) gelu_backward(pre, a b), a the output's gradient and b the weight (c_proj's dgrad).
Result backward(Device& d, const Case& c, DType dt, bool fused) {
  const float s = 1.0f / std::sqrt(static_cast<float>(c.K));
  Tensor a = up_as(d, a_shape(c), randn(c.M * c.K, c.seed + 3), dt);
  Tensor b = up_as(d, b_shape(c), randn(c.K * c.N, c.seed + 4, s), dt);
  Tensor pre = up_as(d, {c.M, c.N}, randn(c.M * c.N, c.seed + 5, 2.0f), dt);
  Tensor dpre = up_as(d, {c.M, c.N}, Vec(c.M * c.N, NAN), dt);
  Tensor g = up_as(d, {c.M, c.N}, Vec(c.M * c.N, 0.0f), dt);
  if (fused) {
    d.matmul_gelu_backward(dpre, a, b, c.ta, c.tb, pre);
  } else {
    d.matmul(g, a, b, c.ta, c.tb);
    d.gelu_backward(dpre.reshape({c.M * c.N}), pre.reshape({c.M * c.N}), g.reshape({c.M * c.N}));
  }
  Result r{download_h(d, dpre), download_h(d, g), raw_download(d, dpre), raw_download(d, g)};
  const Vec p = download_h(d, pre);
  r.extra.insert(r.extra.end(), p.begin(), p.end());
  return r;
}

double gelu64(double x) {
  const double s = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(s * (x + 0.044715 * x * x * x)));
}
double gelu_grad64(double x) {
  const double s = std::sqrt(2.0 / M_PI), t = std::tanh(s * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * s * (1.0 + 3.0 * 0.044715 * x * x);
}

// Whether the device's products go to a vendor library first (its "gemm" row names one).
bool library_gemm(const Device& d) {
  for (const auto& [k, v] : d.info().extra)
    if (k == "gemm") return v.rfind("own", 0) != 0;
  return false;
}

bool gpu_device_backend(const std::string& b) {
  return b == "simt" || b == "simt64" || b == "cuda" || b == "hip";
}

// The Vulkan device's GELU-epilogue dispatches by path ("gelu_epilogue:tiled", ...), and
// "gelu_composed" (the two-op composition), from its counters.
std::map<std::string, int64_t> gelu_counts(Device& d) {
  std::map<std::string, int64_t> out;
  for (const auto& [k, v] : d.counters())
    if (k.rfind("gelu_", 0) == 0) out[k] = v;
  return out;
}
int64_t fused_total(const std::map<std::string, int64_t>& c) {
  int64_t n = 0;
  for (const auto& [k, v] : c)
    if (k.rfind("gelu_epilogue:", 0) == 0) n += v;
  return n;
}
int64_t count_of(const std::map<std::string, int64_t>& c, const std::string& k) {
  auto it = c.find(k);
  return it == c.end() ? 0 : it->second;
}

// CROSSTRAIN_VK_STRICT_MATH: the Vulkan device runs the GELU shader's strict twin, and the fused
// ops as the composition (the GEMM shaders have no twins).
bool vk_strict_math() {
  const char* v = std::getenv("CROSSTRAIN_VK_STRICT_MATH");
  return v && *v && std::string(v) != "0";
}

// An environment variable for a scope (the Vulkan device reads its GEMM overrides per call).
struct ScopedEnv {
  const char* name;
  ScopedEnv(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~ScopedEnv() { unsetenv(name); }
};

// The fused result of d against d's unfused ops: the same bytes on the own kernels, the
// contract's bound on a library.
void expect_matches_unfused(Device& d, const Case& c, DType dt, const std::string& where) {
  const std::string nm = c.name(dt) + " on " + where;
  const double rel = gelu_epilogue_rel_tol(dt);
  {
    const Result f = forward(d, c, dt, true), u = forward(d, c, dt, false);
    if (!library_gemm(d)) {
      EXPECT_EQ(f.main_raw, u.main_raw) << "pre, " << nm;
      EXPECT_EQ(f.extra_raw, u.extra_raw) << "out, " << nm;
    } else {
      EXPECT_TRUE(close_nmse(f.main, u.main, kTolGemm, "pre vs unfused, " + nm));
      for (size_t i = 0; i < f.main.size(); ++i)
        EXPECT_LE(std::abs(f.extra[i] - gelu64(f.main[i])), rel * std::abs(f.main[i]) + 1e-6)
            << "out[" << i << "] vs gelu(pre), " << nm;
    }
  }
  const Result f = backward(d, c, dt, true), u = backward(d, c, dt, false);
  if (!library_gemm(d)) {
    EXPECT_EQ(f.main_raw, u.main_raw) << "dpre, " << nm;
  } else {
    const size_t n = f.main.size();
    for (size_t i = 0; i < n; ++i) {
      const double g = u.extra[i], pre = u.extra[n + i];
      EXPECT_LE(std::abs(f.main[i] - g * gelu_grad64(pre)), rel * std::abs(g) + 1e-6)
          << "dpre[" << i << "] vs gelu_backward(pre, g), " << nm;
    }
  }
}

using MatmulGelu = DeviceTest;

TEST_P(MatmulGelu, MatchesUnfusedOpsAndReference) {
  const auto before = gelu_counts(dev());
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    if (!dev().supports(OpKind::kMatmul, dt) || !dev().supports(OpKind::kGelu, dt)) continue;
    for (const Case& c : kCases) {
      expect_matches_unfused(dev(), c, dt, id());
      const std::string nm = c.name(dt) + " on " + id();
      // In 16 bits the reference's products may round an element one ulp the other way (it sums
      // in fp64): NMSE ~1e-9 even on cpu:0, whose f32 results must match to 1e-11.
      const double t = dt == DType::f32 ? tol(Tol::kGemm) : std::max(tol(Tol::kGemm), 1e-6);
      const Result f = forward(dev(), c, dt, true), r = forward(ref(), c, dt, true);
      EXPECT_TRUE(close_nmse(f.main, r.main, t, "pre vs ref, " + nm));
      EXPECT_TRUE(close_nmse(f.extra, r.extra, t, "out vs ref, " + nm));
      const Result fb = backward(dev(), c, dt, true), rb = backward(ref(), c, dt, true);
      EXPECT_TRUE(close_nmse(fb.main, rb.main, t, "dpre vs ref, " + nm));
    }
  }
  if (GetParam().backend == "vulkan") {
    // every fused call above ran its GELU in a GEMM epilogue: 3 per case and dtype (twice
    // against the unfused ops, once against the reference), forward and backward
    const auto after = gelu_counts(dev());
    const int64_t fused = fused_total(after) - fused_total(before),
                  composed = count_of(after, "gelu_composed") - count_of(before, "gelu_composed");
    EXPECT_EQ(vk_strict_math() ? fused : composed, 0);
    EXPECT_GE(vk_strict_math() ? composed : fused, int64_t(2 * std::size(kCases)));
  }
}

// Vulkan: each GEMM family that can take the fused ops, forced in turn (CROSSTRAIN_VK_MATMUL),
// with split-k (CROSSTRAIN_VK_SPLITK=3: the GELU in matmul_splitk.comp, after the sum), bit for
// bit against the unfused ops, and the counters naming the path that ran. (The device's default
// family runs in the case above.) Few shapes: each family x layout x dtype is a pipeline lavapipe
// compiles in this process.
TEST_P(MatmulGelu, VulkanEpilogueFamilies) {
  if (GetParam().backend != "vulkan")
    GTEST_SKIP() << "the Vulkan GEMM families; " << id() << " is covered above";
  if (vk_strict_math()) GTEST_SKIP() << "strict math: the fused ops run as the composition";
  const Case deep{37, 45, 100, false, true, 6};  // K = 100: 3 slices of 48, 48 and 4 (tbk 16)
  // a^T with K > 512: on a CPU-type device (lavapipe) two GEMMs chained through beta, the
  // epilogue on the second only; kCases[2]'s pipeline (a along m, K % 16 == 0)
  const Case chained{24, 136, 608, true, false, 7};
  struct Family {
    const char* matmul;  // CROSSTRAIN_VK_MATMUL (nullptr: the device's default)
    const char* splitk;  // CROSSTRAIN_VK_SPLITK (nullptr: the rule, none at these sizes)
    std::vector<std::pair<DType, Case>> runs;
    const char* path;  // the counter that must grow (nullptr: any, as the device chooses)
  };
  const Family families[] = {
      {"tiled", nullptr, {{DType::f32, kCases[4]}, {DType::bf16, kCases[1]}}, "tiled"},
      {"tiled", "3", {{DType::f32, deep}, {DType::f16, deep}}, "splitk"},
      {"reg", nullptr, {{DType::f16, kCases[2]}}, "reg"},
      {"cme", nullptr, {{DType::f16, kCases[0]}, {DType::bf16, kCases[2]}}, "coopmat"},
      {"cme", "3", {{DType::bf16, deep}}, "splitk"},
      {nullptr, nullptr, {{DType::f32, chained}}, nullptr},
  };
  for (const Family& f : families) {
    std::unique_ptr<ScopedEnv> kind, split;
    if (f.matmul) kind = std::make_unique<ScopedEnv>("CROSSTRAIN_VK_MATMUL", f.matmul);
    if (f.splitk) split = std::make_unique<ScopedEnv>("CROSSTRAIN_VK_SPLITK", f.splitk);
    const auto before = gelu_counts(dev());
    const std::string what =
        std::string(f.matmul ? f.matmul : "default") + (f.splitk ? ", split-k" : "");
    for (const auto& [dt, c] : f.runs)
      expect_matches_unfused(dev(), c, dt, id() + " (" + what + ")");
    const auto after = gelu_counts(dev());
    const int64_t fused = fused_total(after) - fused_total(before);
    EXPECT_EQ(fused, int64_t(2 * f.runs.size())) << what;
    if (f.path) {
      const std::string key = std::string("gelu_epilogue:") + f.path;
      EXPECT_EQ(count_of(after, key) - count_of(before, key), fused)
          << "another path than " << f.path << " ran under " << what;
    }
  }
}

// The own kernels' epilogues on the matrix tiles, bit for bit against the unfused ops there.
TEST_P(MatmulGelu, OwnTileKernelsMatchUnfusedOps) {
  if (!gpu_device_backend(GetParam().backend))
    GTEST_SKIP() << "the own GEMM kernels' epilogues are the GPU devices'; " << id()
                 << " is covered above";
  std::unique_ptr<Device> tiled =
      open_device_with_env(id(), {{"CT_GPU_TILES", "1"}, {"CT_GPU_GEMM", "own"}});
  tiled->set_profiling(true);
  for (DType dt : {DType::f16, DType::bf16})
    for (const Case& c : {kCases[1], kCases[2], kCases[4]})
      expect_matches_unfused(*tiled, c, dt, id() + " with tiles");
  const std::string report = tiled->profile_report();
  for (const char* path :
       {"matmul_bias_gelu: own", "matmul_gelu_backward: own", "gemm_tc_kernel", "gemm_tile_kernel"})
    EXPECT_NE(report.find(path), std::string::npos) << path << " not in\n" << report;
  EXPECT_NO_THROW(tiled->synchronize());
}

// The same with split-k (CT_GPU_SPLITK=3): the epilogues run in the kernel that adds the ranges'
// partial products, bit for bit against the unfused ops there (whose products split alike). K of
// 3 and 5 slices (1+1+1, 2+2+1), rows of 16 bytes.
TEST_P(MatmulGelu, OwnTileKernelsWithSplitKMatchUnfusedOps) {
  if (!gpu_device_backend(GetParam().backend))
    GTEST_SKIP() << "the own GEMM kernels' epilogues are the GPU devices'; " << id()
                 << " is covered above";
  std::unique_ptr<Device> tiled = open_device_with_env(
      id(), {{"CT_GPU_TILES", "1"}, {"CT_GPU_GEMM", "own"}, {"CT_GPU_SPLITK", "3"}});
  tiled->set_profiling(true);
  for (DType dt : {DType::f16, DType::bf16})
    for (const Case& c : {Case{40, 48, 96, false, true, 6}, Case{24, 136, 136, true, false, 7}})
      expect_matches_unfused(*tiled, c, dt, id() + " with tiles and split-k");
  const std::string report = tiled->profile_report();
  for (const char* path : {"matmul_bias_gelu: own", "matmul_gelu_backward: own",
                           "gemm_tc_kernel (gemm_tc.cu, 128x128 tiles, split-k 3)"})
    EXPECT_NE(report.find(path), std::string::npos) << path << " not in\n" << report;
  EXPECT_NO_THROW(tiled->synchronize());
}

CT_INSTANTIATE_DEVICE_SUITE(MatmulGelu);

// The reference's fused ops against fp64: out = gelu(pre) of the pre it stored, dpre = g
// gelu'(pre).
TEST(ReferenceMatmulGelu, MatchesFp64) {
  const Case c = kCases[4];
  const Result f = forward(ref(), c, DType::f32, true);
  VecD want(f.main.size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = gelu64(f.main[i]);
  EXPECT_TRUE(close_nmse(f.extra, want, kTolF64, "out vs fp64 gelu(pre)"));
  const Result u = backward(ref(), c, DType::f32, false), b = backward(ref(), c, DType::f32, true);
  const size_t n = b.main.size();
  VecD dwant(n);
  for (size_t i = 0; i < n; ++i) dwant[i] = u.extra[i] * gelu_grad64(u.extra[n + i]);
  EXPECT_TRUE(close_nmse(b.main, dwant, kTolF64, "dpre vs fp64 g gelu'(pre)"));
}

}  // namespace
}  // namespace ct::test
