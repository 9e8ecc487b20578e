// matmul_bias_gelu and matmul_gelu_backward (core/device.h), the GELU in a GEMM's epilogue, on
// every device and dtype (f32, f16, bf16), every transpose, edges off every tile size:
//   - against the same device's unfused ops (matmul, then gelu_forward / gelu_backward): the same
//     bits where the device's own kernels run the product; where a vendor library's epilogue
//     does (cuBLASLt on CUDA), within the contract's bound (gelu_epilogue_rel_tol);
//   - against the reference (whose fused ops are the unfused ones by construction).
// On the GPU devices (simt, simt64, cuda, hip) also the own kernels' epilogues with matrix tiles
// on and the library off (CT_GPU_TILES=1, CT_GPU_GEMM=own, as gemm_tc_test.cpp): gemm_tc_kernel
// for rows aligned to 16 bytes, gemm_tile_kernel else, bit for bit against the unfused ops there.
#include <algorithm>
#include <cmath>
#include <memory>
#include <sstream>

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
