// The cooperative-matrix GEMM (shaders/matmul_coopmat.comp) through its emulated build
// (CROSSTRAIN_VK_MATMUL=cme with CROSSTRAIN_VK_CM_FRAG=MxNxK: the fragments in shared memory),
// which runs on lavapipe: the tiling, the fragment offsets and strides, the zero-filled edges,
// split-k and the epilogue of the coopmat kernel are the same code, specialized the same way.
// Against the CPU reference on shapes that are no multiple of the tile, the k slice or the
// fragment, in every transpose, with batches, broadcast b, alpha/beta/bias, c f32 (hhf) and
// 16-bit (hhh), f16 and bf16; square fragments and the drivers' oblong ones (Intel 8x16x16,
// NVIDIA 16x8x16), both workgroup tiles and split-k.
#include <cmath>
#include <optional>

#include "tests/common/half_compare.h"
#include "tests/vulkan/vulkan_fixture.h"

namespace ct::vktest {
namespace {

struct Frag {
  const char* kind;  // CROSSTRAIN_VK_CM_FRAG
  DType h;
};
void PrintTo(const Frag& f, std::ostream* os) {
  *os << f.kind << " " << dtype_name(f.h);
}

// Sets an environment variable for a scope.
struct ScopedEnv {
  const char* name;
  ScopedEnv(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~ScopedEnv() { unsetenv(name); }
};

class CoopmatEmulated : public VulkanTest, public ::testing::WithParamInterface<Frag> {
 protected:
  void SetUp() override {
    VulkanTest::SetUp();
    if (HasFatalFailure()) return;
    setenv("CROSSTRAIN_VK_MATMUL", "cme", 1);
    setenv("CROSSTRAIN_VK_CM_FRAG", GetParam().kind, 1);
    vk().set_profiling(true);  // the profile names the shaders that ran
  }
  void TearDown() override {
    unsetenv("CROSSTRAIN_VK_MATMUL");
    unsetenv("CROSSTRAIN_VK_CM_FRAG");
    vk().set_profiling(false);
    VulkanTest::TearDown();
  }
};

struct Case {
  int64_t batch, M, N, K;
  bool ta, tb, bias, b2d;
  float alpha, beta;
  bool c16;
};

// a's and b's values: randn times sa (sb), and where spread > 0 element i also times
// 2^(spread * (i % 7 - 3)) (magnitudes 2^(6 spread) apart within a tile).
Vec values(size_t n, uint64_t seed, float scale, int spread) {
  Vec v = randn(n, seed, scale);
  if (spread > 0)
    for (size_t i = 0; i < n; ++i) v[i] = std::ldexp(v[i], spread * (int(i % 7) - 3));
  return v;
}

void run_case(const Case& k, DType h, uint64_t seed, const char* kind, bool split = false,
              float sa = 1.0f, float sb = 1.0f, int spread = 0) {
  auto shp = [&](bool two_d, int64_t r, int64_t c) {
    return k.batch > 1 && !two_d ? Shape{k.batch, r, c} : Shape{r, c};
  };
  Shape shape_a = k.ta ? shp(false, k.K, k.M) : shp(false, k.M, k.K);
  Shape shape_b = k.tb ? shp(k.b2d, k.N, k.K) : shp(k.b2d, k.K, k.N);
  Shape sc = shp(false, k.M, k.N);
  const DType tc = k.c16 ? h : DType::f32;
  Pair a = both_as(shape_a, values(shape_a.numel(), seed, sa, spread), h);
  Pair b = both_as(shape_b, values(shape_b.numel(), seed + 1, sb, spread), h);
  Pair c = both_as(sc, randn(sc.numel(), seed + 2), tc);
  Pair bs = both({k.N}, randn(k.N, seed + 3));
  vk().matmul(c.d, a.d, b.d, k.ta, k.tb, k.alpha, k.beta, k.bias ? &bs.d : nullptr);
  ref().matmul(c.r, a.r, b.r, k.ta, k.tb, k.alpha, k.beta, k.bias ? &bs.r : nullptr);
  std::string what = std::string(kind) + " " + dtype_name(h) + " b" + std::to_string(k.batch) +
                     " " + std::to_string(k.M) + "x" + std::to_string(k.N) + "x" +
                     std::to_string(k.K) + (k.ta ? " ta" : "") + (k.tb ? " tb" : "") +
                     (k.bias ? " bias" : "") + (k.b2d ? " b 2-D" : "") + " c " + dtype_name(tc);
  if (sa != 1.0f || sb != 1.0f || spread) {
    char buf[80];
    std::snprintf(buf, sizeof buf, " a x %g b x %g spread %d", sa, sb, spread);
    what += buf;
  }
  // split-k: the partials come from the c f32 build, then matmul_splitk adds them
  const std::string shader =
      std::string("matmul_cme_") + (k.c16 && !split ? "hhh_" : "hhf_") + dtype_name(h);
  const std::string report = vk().profile_report();
  EXPECT_NE(report.find(shader), std::string::npos) << what << ": " << shader;
  EXPECT_EQ(report.find("matmul_splitk") != std::string::npos, split) << what << "\n" << report;
  vk().set_profiling(false);  // a fresh profile for the next case
  vk().set_profiling(true);
  // Products of 16-bit values are exact in fp32; only the order of the fp32 sums differs.
  if (tc == DType::f32)
    EXPECT_TRUE(same(c, 1e-5, what));
  else
    EXPECT_TRUE(same_h(c, what, 1e-5));
}

TEST_P(CoopmatEmulated, EveryTransposeOnRaggedEdges) {
  uint64_t seed = 300;
  for (int tr = 0; tr < 4; ++tr) {
    const bool ta = tr & 1, tb = tr & 2;
    // one partial tile; K not a multiple of the fragment or of the 32-deep slice
    run_case({1, 37, 53, 29, ta, tb, false, false, 1.0f, 0.0f, false}, GetParam().h, seed++,
             GetParam().kind);
    // several tiles each way, the last ones partial; K two slices and a bit
    run_case({1, 130, 67, 70, ta, tb, tr == 1, false, 0.5f, tr == 2 ? 0.75f : 0.0f, tr == 3},
             GetParam().h, seed++, GetParam().kind);
  }
}

TEST_P(CoopmatEmulated, BatchesBroadcastAndTinyShapes) {
  const DType h = GetParam().h;
  const char* kind = GetParam().kind;
  run_case({3, 19, 23, 41, false, false, true, true, 1.0f, 0.0f, false}, h, 320, kind);    // b 2-D
  run_case({2, 64, 64, 64, true, true, false, false, 1.0f, 0.5f, true}, h, 321, kind);     // whole
  run_case({1, 1, 1, 1, false, false, true, false, 1.0f, 1.0f, false}, h, 322, kind);      // 1x1x1
  run_case({2, 65, 9, 8, false, true, false, false, -2.0f, 0.0f, true}, h, 323, kind);     // K = 8
  run_case({1, 8, 130, 100, true, false, true, false, 0.25f, 0.5f, false}, h, 324, kind);  // wide
}

// beta = 0 never reads c, which may hold NaN.
TEST_P(CoopmatEmulated, BetaZeroIgnoresNaNInC) {
  const DType h = GetParam().h;
  Pair a = both_as({5, 6}, randn(30, 40), h), b = both_as({6, 7}, randn(42, 41), h);
  Pair c = both({5, 7}, Vec(35, NAN));
  vk().matmul(c.d, a.d, b.d, false, false, 1.0f, 0.0f);
  ref().matmul(c.r, a.r, b.r, false, false, 1.0f, 0.0f);
  EXPECT_TRUE(same(c, 1e-5, "beta = 0 over NaN"));
}

// The 128 x 128 workgroup tile (64 x 64 a subgroup; k staged 16 deep in the emulated build's f32
// shared memory) and split-k (S slices of K into f32 partials, summed in order with the epilogue
// by matmul_splitk), as the self-test and GPUs run them.
TEST_P(CoopmatEmulated, BigTilesAndSplitK) {
  const DType h = GetParam().h;
  const char* kind = GetParam().kind;
  {
    ScopedEnv tile("CROSSTRAIN_VK_CM_TILE", "128");
    run_case({1, 150, 140, 40, false, true, true, false, 1.0f, 0.5f, false}, h, 330, kind);
    run_case({2, 130, 200, 70, true, false, false, false, 0.5f, 0.0f, true}, h, 331, kind);
  }
  {
    ScopedEnv splitk("CROSSTRAIN_VK_SPLITK", "3");  // kchunk 64: slices 64, 64 and 2 deep
    run_case({1, 70, 60, 130, true, false, true, false, 1.0f, 0.75f, true}, h, 332, kind, true);
    run_case({3, 37, 53, 300, false, true, false, true, -1.0f, 0.5f, false}, h, 333, kind, true);
  }
  {
    ScopedEnv tile("CROSSTRAIN_VK_CM_TILE", "128");
    ScopedEnv splitk("CROSSTRAIN_VK_SPLITK", "4");
    run_case({1, 129, 131, 257, false, false, true, false, 1.0f, 0.0f, true}, h, 334, kind, true);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fragments, CoopmatEmulated,
    ::testing::Values(Frag{"8x8x8", DType::f16}, Frag{"8x8x8", DType::bf16},
                      Frag{"16x16x16", DType::f16}, Frag{"16x16x16", DType::bf16},
                      Frag{"8x16x16", DType::f16}, Frag{"16x8x16", DType::bf16}),
    [](const auto& info) {
      std::string n = std::string(info.param.kind) + "_" + dtype_name(info.param.h);
      for (char& ch : n)
        if (ch == 'x') ch = '_';
      return n;
    });

// bf16 tiles are staged as f16 scaled by a power of two per tile (the shader's header): values
// far outside f16's range (2^20 overflows f16, 2^-20 is below its normal range; 2^-60 and 2^60
// far past either) and tiles whose magnitudes span 2^24 (within the 2^28 the rule keeps exact)
// must give the CPU reference's products -- exact products, fp32 sums -- in every transpose,
// hhf and hhh, batches, the 128 x 128 tile and split-k. One fragment shape (8x8x8: the cheapest
// cold compile on lavapipe); the other suites run bf16 on the rest.
class CoopmatEmulatedBf16 : public VulkanTest {
 protected:
  void SetUp() override {
    VulkanTest::SetUp();
    if (HasFatalFailure()) return;
    setenv("CROSSTRAIN_VK_MATMUL", "cme", 1);
    setenv("CROSSTRAIN_VK_CM_FRAG", "8x8x8", 1);
    vk().set_profiling(true);
  }
  void TearDown() override {
    unsetenv("CROSSTRAIN_VK_MATMUL");
    unsetenv("CROSSTRAIN_VK_CM_FRAG");
    vk().set_profiling(false);
    VulkanTest::TearDown();
  }
};

TEST_F(CoopmatEmulatedBf16, ValuesPastF16sRange) {
  const DType h = DType::bf16;
  const char* kind = "8x8x8";
  uint64_t seed = 340;
  for (int tr = 0; tr < 4; ++tr) {
    const bool ta = tr & 1, tb = tr & 2;
    run_case({1, 37, 53, 29, ta, tb, tr == 1, false, 1.0f, tr == 2 ? 0.5f : 0.0f, (tr & 1) != 0}, h,
             seed++, kind, false, 0x1p20f, 0x1p-20f);
  }
  run_case({2, 19, 23, 41, true, false, true, false, 1.0f, 0.0f, true}, h, seed++, kind, false,
           0x1p-60f, 0x1p60f);
  // both x 2^-60: the k-step's products come back by 2^-148, past one normal power of two
  run_case({1, 24, 16, 40, false, false, false, false, 1.0f, 0.0f, false}, h, seed++, kind, false,
           0x1p-60f, 0x1p-60f);
  run_case({1, 37, 53, 29, false, true, false, false, 0.5f, 0.0f, false}, h, seed++, kind, false,
           0x1p10f, 0x1p-30f, 4);
  {
    ScopedEnv splitk("CROSSTRAIN_VK_SPLITK", "3");
    run_case({2, 30, 20, 130, false, false, true, false, 1.0f, 0.75f, true}, h, seed++, kind, true,
             0x1p-20f, 0x1p20f, 4);
  }
  {
    ScopedEnv tile("CROSSTRAIN_VK_CM_TILE", "128");
    run_case({1, 140, 130, 40, true, true, false, false, 1.0f, 0.0f, false}, h, seed++, kind, false,
             0x1p20f, 0x1p20f);
  }
}

// Tiles whose largest |x| changes from k-step to k-step: the shader keeps the scales its
// running sum is in while each new tile's largest |x| lands in [2^14, 2^16) under them, and
// otherwise adds that sum into the f32 accumulator and starts the new tiles' scales. Column k
// of a and row k of b scaled by 2^E(k) and 2^F(k), jumps of 2^9 every 5 k and 2^3 every 3 k
// (not aligned with the k-steps; a step's tile then spans 2^36 > 2^28, so its smallest
// elements are rounded, within the rule's bound), and a slow growth of 2^(k / 6) that stays in
// the window for a few steps: the reference's fp32 products and sums, hhf and hhh, both tiles
// and split-k (a slice starts its own scales).
TEST_F(CoopmatEmulatedBf16, TileScalesChangingAlongK) {
  const DType h = DType::bf16;
  struct Kcase {
    int64_t M, N, K;
    bool ta, tb, c16;
    int form;  // 0: jumps; 1: slow growth
    const char* tile;
    const char* splitk;
  };
  const Kcase cases[] = {{37, 29, 150, false, false, false, 0, nullptr, nullptr},
                         {24, 40, 160, true, true, true, 0, nullptr, nullptr},
                         {30, 21, 200, false, true, false, 1, nullptr, nullptr},
                         {130, 140, 96, true, false, false, 0, "128", nullptr},
                         {20, 30, 260, false, false, false, 0, nullptr, "3"}};
  uint64_t seed = 370;
  for (const Kcase& kc : cases) {
    auto e_of = [&](int64_t k) {
      return kc.form == 0 ? static_cast<int>((k / 5) % 5 - 2) * 9 : static_cast<int>(k / 6) - 16;
    };
    auto f_of = [&](int64_t k) { return kc.form == 0 ? static_cast<int>((k / 3) % 4) * 3 : 0; };
    Shape sa = kc.ta ? Shape{kc.K, kc.M} : Shape{kc.M, kc.K};
    Shape sb = kc.tb ? Shape{kc.N, kc.K} : Shape{kc.K, kc.N};
    Vec va = randn(sa.numel(), seed, 1.0f), vb = randn(sb.numel(), seed + 1, 1.0f);
    for (int64_t m = 0; m < kc.M; ++m)
      for (int64_t k = 0; k < kc.K; ++k) {
        float& x = kc.ta ? va[k * kc.M + m] : va[m * kc.K + k];
        x = std::ldexp(x, e_of(k));
      }
    for (int64_t k = 0; k < kc.K; ++k)
      for (int64_t n = 0; n < kc.N; ++n) {
        float& x = kc.tb ? vb[n * kc.K + k] : vb[k * kc.N + n];
        x = std::ldexp(x, f_of(k));
      }
    std::optional<ScopedEnv> tile, split;
    if (kc.tile) tile.emplace("CROSSTRAIN_VK_CM_TILE", kc.tile);
    if (kc.splitk) split.emplace("CROSSTRAIN_VK_SPLITK", kc.splitk);
    const DType tc = kc.c16 ? h : DType::f32;
    Pair a = both_as(sa, va, h), b = both_as(sb, vb, h);
    Pair c = both_as({kc.M, kc.N}, Vec(kc.M * kc.N, 0.0f), tc);
    vk().matmul(c.d, a.d, b.d, kc.ta, kc.tb, 1.0f, 0.0f, nullptr);
    ref().matmul(c.r, a.r, b.r, kc.ta, kc.tb, 1.0f, 0.0f, nullptr);
    const std::string what = "bf16 " + std::to_string(kc.M) + "x" + std::to_string(kc.N) + "x" +
                             std::to_string(kc.K) + (kc.ta ? " ta" : "") + (kc.tb ? " tb" : "") +
                             (kc.form ? " growing" : " jumps") + (kc.tile ? " tile 128" : "") +
                             (kc.splitk ? " split-k" : "") + " c " + dtype_name(tc);
    const std::string report = vk().profile_report();
    EXPECT_NE(report.find("matmul_cme_"), std::string::npos) << what << "\n" << report;
    vk().set_profiling(false);
    vk().set_profiling(true);
    if (tc == DType::f32)
      EXPECT_TRUE(same(c, 1e-5, what));
    else
      EXPECT_TRUE(same_h(c, what, 1e-5));
    seed += 2;
  }
}

// 16-byte loads (matmul_coopmat.comp's VA and VB: 8 elements a load where the unit-stride
// extent is a multiple of 8 and everything is aligned): shapes that take them in every layout
// (a along k or m, b along n or k), with one operand aligned and the other not, with batches and
// broadcast b, split-k over slices that are multiples of 8, and the 128 tile (2 x 4 subgroups of
// 64 x 32 at the emulation's subgroup of 32); bf16 past f16's range. The ragged shapes above
// take the one-element loads.
class CoopmatEmulatedLoads : public VulkanTest {
 protected:
  void SetUp() override {
    VulkanTest::SetUp();
    if (HasFatalFailure()) return;
    setenv("CROSSTRAIN_VK_MATMUL", "cme", 1);
    vk().set_profiling(true);
  }
  void TearDown() override {
    unsetenv("CROSSTRAIN_VK_MATMUL");
    vk().set_profiling(false);
    VulkanTest::TearDown();
  }
};

TEST_F(CoopmatEmulatedLoads, SixteenByteGroupsInEveryLayout) {
  uint64_t seed = 360;
  for (DType h : {DType::f16, DType::bf16}) {
    const char* kind = h == DType::f16 ? "16x16x16" : "8x8x8";
    ScopedEnv frag("CROSSTRAIN_VK_CM_FRAG", kind);
    const float sa = h == DType::bf16 ? 0x1p20f : 1.0f, sb = 1.0f / sa;
    for (int tr = 0; tr < 4; ++tr) {
      const bool ta = tr & 1, tb = tr & 2;
      run_case(
          {2, 40, 48, 64, ta, tb, tr == 1, tr == 3, 1.0f, tr == 2 ? 0.5f : 0.0f, (tr & 1) != 0}, h,
          seed++, kind, false, sa, sb);
    }
    run_case({1, 48, 37, 64, false, false, true, false, 1.0f, 0.0f, false}, h, seed++, kind, false,
             sa, sb);  // a by 8, b one by one
    run_case({1, 37, 40, 48, true, true, false, false, 0.5f, 0.0f, true}, h, seed++, kind, false,
             sb, sa);  // a one by one, b by 8 along k
    {
      ScopedEnv splitk("CROSSTRAIN_VK_SPLITK", "3");
      run_case({1, 48, 40, 264, false, false, true, false, 1.0f, 0.75f, false}, h, seed++, kind,
               true, sa, sb);
    }
    {
      ScopedEnv tile("CROSSTRAIN_VK_CM_TILE", "128");
      run_case({1, 136, 144, 48, true, false, false, false, 1.0f, 0.0f, true}, h, seed++, kind,
               false, sa, sb);
    }
  }
}

// The GELU epilogues (matmul_bias_gelu's forward with its pre-activation, matmul_gelu_backward)
// on the coopmat path, whose epilogue writes c 4 elements of a row at a time where c's rows are
// aligned (VC) and one by one where not, and reads them back in the same form for the GELU:
// 16-bit c (both epilogues take the inputs' dtype) against the CPU reference, N a multiple of 4
// and not (the groups that cross N), f16 and bf16, the 128 tile.
TEST_F(CoopmatEmulatedLoads, GeluEpiloguesInEitherStoreForm) {
  struct G {
    int64_t M, N, K;
    bool ta, tb;
    const char* tile;
  };
  const G cases[] = {{40, 48, 32, false, false, nullptr},
                     {37, 42, 24, true, false, nullptr},
                     {29, 37, 40, false, true, nullptr},
                     {136, 132, 32, false, false, "128"}};
  uint64_t seed = 390;
  for (DType h : {DType::f16, DType::bf16}) {
    ScopedEnv frag("CROSSTRAIN_VK_CM_FRAG", h == DType::f16 ? "16x16x16" : "8x8x8");
    for (const G& c : cases) {
      std::optional<ScopedEnv> tile;
      if (c.tile) tile.emplace("CROSSTRAIN_VK_CM_TILE", c.tile);
      const Shape sa = c.ta ? Shape{c.K, c.M} : Shape{c.M, c.K};
      const Shape sb = c.tb ? Shape{c.N, c.K} : Shape{c.K, c.N};
      const std::string what = std::string(dtype_name(h)) + " " + std::to_string(c.M) + "x" +
                               std::to_string(c.N) + "x" + std::to_string(c.K) +
                               (c.ta ? " ta" : "") + (c.tb ? " tb" : "") +
                               (c.tile ? " tile 128" : "");
      const float s = 2.0f / std::sqrt(static_cast<float>(c.K));
      Pair a = both_as(sa, randn(sa.numel(), seed, s), h);
      Pair b = both_as(sb, randn(sb.numel(), seed + 1), h);
      Pair bias = both({c.N}, randn(c.N, seed + 2, 0.5f));
      Pair pre = both_as({c.M, c.N}, Vec(c.M * c.N, NAN), h);
      Pair out = both_as({c.M, c.N}, Vec(c.M * c.N, NAN), h);
      vk().matmul_bias_gelu(out.d, pre.d, a.d, b.d, c.ta, c.tb, bias.d);
      ref().matmul_bias_gelu(out.r, pre.r, a.r, b.r, c.ta, c.tb, bias.r);
      const std::string report = vk().profile_report();
      EXPECT_NE(report.find("matmul_cme_hhh_"), std::string::npos) << what << "\n" << report;
      EXPECT_TRUE(same_h(pre, what + " pre", 1e-3));
      EXPECT_TRUE(same_h(out, what + " gelu", 1e-3));
      // the backward: dpre = gelu'(pre) (a b), pre the forward's
      Pair dpre = both_as({c.M, c.N}, Vec(c.M * c.N, NAN), h);
      vk().matmul_gelu_backward(dpre.d, a.d, b.d, c.ta, c.tb, pre.d);
      ref().matmul_gelu_backward(dpre.r, a.r, b.r, c.ta, c.tb, pre.r);
      EXPECT_TRUE(same_h(dpre, what + " gelu backward", 1e-3));
      vk().set_profiling(false);
      vk().set_profiling(true);
      seed += 3;
    }
  }
}

}  // namespace
}  // namespace ct::vktest
