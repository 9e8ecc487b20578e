// matmul with f16/bf16 operands through the own tensor-core GEMM (backends/gpu/kernels/gemm_tc.cu)
// on the GPU devices (simt, simt64, cuda, hip) against the reference: every transpose, M and N
// not multiples of the 128 x 128 block tile, K not a multiple of the 32-deep slice (K = 1 too),
// more than one block tile, bias, alpha/beta, batches (a or b broadcast), f32 and 16-bit c; the
// same bits run after run; and the calls it does not take (unaligned rows, f32) on matmul.cu's
// kernels with the right results. --profile's report names the path every case took.
//
// The path needs Ctx::matrix_tiles, which the SIMT backends leave off by default; and on CUDA/HIP
// the vendor library runs these GEMMs unless CT_GPU_GEMM=own. Both variables are read when a
// device opens, so these cases open a device of their own with CT_GPU_TILES=1 and CT_GPU_GEMM=own
// (and restore them afterwards) instead of the harness's shared one. Kept small: on the SIMT
// runtime every matrix instruction is a round of fiber switches.
#include <cstdlib>
#include <memory>
#include <sstream>

#include "tests/common/half_compare.h"

namespace ct::test {
namespace {

bool gpu_device_backend(const std::string& b) {
  return b == "simt" || b == "simt64" || b == "cuda" || b == "hip";
}

struct TcGemmCase {
  int64_t batch, M, N, K;
  bool ta, tb;
  bool a_batched, b_batched;  // false: a 2-D operand broadcast over the batch
  float alpha, beta;
  bool bias;
  DType ab, c;
  uint64_t seed;
  std::string name() const {
    std::ostringstream os;
    os << dtype_name(ab) << " -> " << dtype_name(c) << " batch " << batch << " " << M << "x" << N
       << "x" << K << (ta ? " ta" : "") << (tb ? " tb" : "") << (a_batched ? "" : " a-bcast")
       << (b_batched ? "" : " b-bcast") << " alpha " << alpha << " beta " << beta
       << (bias ? " bias" : "");
    return os.str();
  }
};

// Runs c on d (a placed `a_offset` elements past an aligned start); the result and its bytes.
std::pair<Vec, std::vector<uint8_t>> run(Device& d, const TcGemmCase& c, int64_t a_offset = 0) {
  const int64_t na = (c.a_batched ? c.batch : 1) * c.M * c.K;
  const int64_t nb = (c.b_batched ? c.batch : 1) * c.K * c.N;
  const Vec a = randn(na, c.seed), b = randn(nb, c.seed + 1);
  const Vec c0 = randn(c.batch * c.M * c.N, c.seed + 2), bias = randn(c.N, c.seed + 3);
  auto shape = [&](bool batched, int64_t r, int64_t k) {
    return batched && c.batch > 1 ? Shape{c.batch, r, k} : Shape{r, k};
  };
  const Shape as = shape(c.a_batched, c.ta ? c.K : c.M, c.ta ? c.M : c.K);
  const Shape bs = shape(c.b_batched, c.tb ? c.N : c.K, c.tb ? c.K : c.N);
  Tensor ta = up_as(d, as, a, c.ab);
  if (a_offset) {
    ta = d.empty(Shape{as.numel() + a_offset}, c.ab, MemCategory::kActivations)
             .slice_flat(a_offset, as);
    Tensor t = up_as(d, as, a, c.ab);
    d.copy(ta, t);
  }
  Tensor tb = up_as(d, bs, b, c.ab);
  Tensor tc = up_as(d, c.batch > 1 ? Shape{c.batch, c.M, c.N} : Shape{c.M, c.N}, c0, c.c);
  Tensor tbias = upload(d, {c.N}, bias);
  d.matmul(tc, ta, tb, c.ta, c.tb, c.alpha, c.beta, c.bias ? &tbias : nullptr);
  return {download_h(d, tc), raw_download(d, tc)};
}

constexpr DType kBf = DType::bf16, kF16 = DType::f16, kF32 = DType::f32;

// Each transpose with an edge in every dimension (one block tile, one to three slices); K = 1
// (a^T b: rows along m and n, so still aligned); more than one block tile in m and n; batches
// with a or b broadcast; alpha, beta and bias; f32 and 16-bit c; 7 and 9 slices.
const TcGemmCase kCases[] = {
    {1, 40, 24, 72, false, false, true, true, 1.0f, 0.0f, false, kBf, kF32, 11},
    {1, 24, 40, 48, false, true, true, true, 0.5f, 0.25f, true, kF16, kF32, 12},
    {1, 40, 16, 40, true, false, true, true, 1.0f, 1.0f, true, kBf, kBf, 13},
    {1, 16, 40, 24, true, true, true, true, -1.5f, 0.0f, false, kF16, kF16, 14},
    {1, 24, 32, 1, true, false, true, true, 1.0f, 0.5f, true, kBf, kF32, 15},
    {1, 136, 144, 16, false, true, true, true, 1.0f, 0.0f, true, kBf, kBf, 16},
    {3, 16, 24, 40, false, true, true, false, 1.0f, 0.0f, true, kBf, kF32, 17},
    {2, 24, 16, 32, true, false, false, true, 0.75f, 0.5f, false, kF16, kF16, 18},
    // More 32-deep slices than the kernel stages (4 on CUDA): each stage of the ring reused.
    {1, 136, 40, 264, false, false, true, true, 1.0f, 0.0f, true, kBf, kBf, 19},
    {1, 40, 136, 200, true, true, true, true, 1.0f, 0.5f, false, kF16, kF32, 20},
};

class GemmTensorCores : public DeviceTest {
 protected:
  void SetUp() override {
    DeviceTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (!gpu_device_backend(GetParam().backend))
      GTEST_SKIP() << "the own tensor-core GEMM is a GPU-device kernel; " << id()
                   << " has its own GEMMs";
    tiled_ = open_device_with_env(id(), {{"CT_GPU_TILES", "1"}, {"CT_GPU_GEMM", "own"}});
    tiled_->set_profiling(true);
  }
  void TearDown() override {
    if (tiled_) {
      EXPECT_NO_THROW(tiled_->synchronize());
    }
    tiled_.reset();
    DeviceTest::TearDown();
  }
  // Runs c on the reference and the tiled device; checks the result and that `path` ran.
  std::vector<uint8_t> check(const TcGemmCase& c, const std::string& path, int64_t a_offset = 0) {
    tiled_->set_profiling(false);
    tiled_->set_profiling(true);  // a fresh report
    const auto [want, _] = run(ref(), c);
    auto [got, raw] = run(*tiled_, c, a_offset);
    const std::string nm = c.name() + " on " + id() + " with tiles";
    EXPECT_TRUE(close_nmse(got, want, tol(Tol::kGemm), nm));
    const std::string report = tiled_->profile_report();
    EXPECT_NE(report.find("matmul: own"), std::string::npos) << nm << "\n" << report;
    EXPECT_NE(report.find(path), std::string::npos)
        << nm << ": expected \"" << path << "\" in the profile:\n"
        << report;
    return raw;
  }
  std::unique_ptr<Device> tiled_;
};

TEST_P(GemmTensorCores, MatchesReference) {
  for (const TcGemmCase& c : kCases) check(c, "gemm_tc_kernel");
}

// Two runs, the same bits: every output has one owner summing k in a fixed order.
TEST_P(GemmTensorCores, Deterministic) {
  const TcGemmCase& c = kCases[1];
  EXPECT_TRUE(check(c, "gemm_tc_kernel") == check(c, "gemm_tc_kernel"))
      << c.name() << " on " << id() << ": two runs differ";
}

// What the tensor-core kernel does not take runs on matmul.cu's kernels, named in the profile.
TEST_P(GemmTensorCores, OtherCallsTakeTheGeneralKernels) {
  // K = 20: a's rows (M x K) and b^T's are 40 bytes, not a multiple of 16.
  check({1, 24, 16, 20, false, true, true, true, 1.0f, 0.0f, true, kBf, kF32, 21},
        "gemm_tile_kernel (matmul.cu, 64x64 tiles): a's rows are not 16-byte aligned");
  // b (K x N) with N = 20.
  check({1, 16, 20, 24, true, false, true, true, 1.0f, 0.5f, false, kF16, kF16, 22},
        "gemm_tile_kernel (matmul.cu, 64x64 tiles): b's rows are not 16-byte aligned");
  // a one element past an aligned start.
  check({1, 16, 24, 32, false, false, true, true, 1.0f, 0.0f, false, kBf, kF32, 23},
        "gemm_tile_kernel (matmul.cu, 64x64 tiles): a's rows are not 16-byte aligned", 1);
  check({1, 16, 24, 32, false, false, true, true, 1.0f, 0.0f, true, kF32, kF32, 24},
        "gemm_kernel (matmul.cu, scalar): f32 inputs");
}

// Split-k (CT_GPU_SPLITK=3: three k ranges where a batch-1 product has three 32-deep slices or
// more; the partial products in the device's scratch memory, then their sum and the epilogue):
// every transpose, alpha/beta/bias, f32 and 16-bit c, the last range shorter (K 200: 3+3+1
// slices, K 136: 2+2+1) or ragged (K 72), one block tile and several; the same bits run after
// run; a batch and a product of one slice do not split.
TEST_P(GemmTensorCores, SplitKMatchesReference) {
  tiled_ = open_device_with_env(
      id(), {{"CT_GPU_TILES", "1"}, {"CT_GPU_GEMM", "own"}, {"CT_GPU_SPLITK", "3"}});
  tiled_->set_profiling(true);
  const std::string split = "gemm_tc_kernel (gemm_tc.cu, 128x128 tiles, split-k 3)";
  const TcGemmCase cases[] = {
      {1, 40, 24, 72, false, false, true, true, 1.0f, 0.0f, false, kBf, kF32, 31},
      {1, 24, 40, 200, false, true, true, true, 0.5f, 0.25f, true, kF16, kF32, 32},
      {1, 136, 16, 96, true, false, true, true, 1.0f, 1.0f, true, kBf, kBf, 33},
      {1, 16, 136, 136, true, true, true, true, -1.5f, 0.5f, false, kF16, kF16, 34},
      {1, 136, 144, 264, false, true, true, true, 1.0f, 1.0f, true, kBf, kF32, 35},
  };
  for (const TcGemmCase& c : cases) check(c, split);
  EXPECT_TRUE(check(cases[1], split) == check(cases[1], split))
      << cases[1].name() << " on " << id() << ": two runs differ";
  check({3, 16, 24, 200, false, true, true, false, 1.0f, 0.0f, true, kBf, kF32, 36},
        "gemm_tc_kernel (gemm_tc.cu, 128x128 tiles)  ");  // a batch: not split
  check({1, 16, 24, 32, false, true, true, true, 1.0f, 0.0f, true, kBf, kF32, 37},
        "gemm_tc_kernel (gemm_tc.cu, 128x128 tiles)  ");  // one slice: not split
}

CT_INSTANTIATE_DEVICE_SUITE(GemmTensorCores);

}  // namespace
}  // namespace ct::test
