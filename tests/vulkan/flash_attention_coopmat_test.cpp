// The cooperative-matrix flash attention (shaders/flash_attention_coopmat.comp) through its
// emulated build (CROSSTRAIN_VK_FLASH=cme: the fragments in shared memory), which runs on
// lavapipe: the staging (f16 as stored, bf16 scaled by a power of two a tile), the fragment
// offsets and strides, the forward's one-pass softmax (its row rescaling in the emulated form;
// the real build's stride-0 load and element-wise product are checked by the start-up self-test
// on the device), the causal and ragged masks, the dS scaling and the epilogues are the code the
// VK_KHR_cooperative_matrix build runs. Against the CPU reference (fp32, from the same 16-bit
// inputs): out, lse and the q, k and v parts of dqkv each within a normalised MSE of 2e-5
// (kTolCm; measured: at most 1.8e-6 (bf16 dk), out 4.4e-7 (bf16), f16 1.4e-7; the fused
// attention's threshold on every other device is 5e-4, which a bf16 run without the staging's
// scaling passes for dv at 3.2e-4) on ragged T, grouped-query and multi-query heads, B = 2, head
// sizes 64 and 32, f16 and bf16 (with values past f16's range), two fragment shapes and forced
// small tiles (several blocks and streamed tiles a call); the same bits run after run; a call the
// kernels do not take (head size 40) runs on the scalar shaders. The forward of the last rows only
// (the key/value cache's) gives the whole window's rows bit for bit. --profile's report names the
// shaders that ran.
#include <cmath>

#include "tests/common/half_compare.h"
#include "tests/vulkan/flash_case.h"
#include "tests/vulkan/vulkan_fixture.h"

namespace ct::vktest {
namespace {

// P and dS go through f16 fragments (the CUDA tile kernels' through the element type), the rest
// is f32: far below kTolGemm (5e-4), so the tighter bound catches lost precision too.
constexpr double kTolCm = 2e-5;

struct ScopedEnv {
  const char* name;
  ScopedEnv(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~ScopedEnv() { unsetenv(name); }
};

// Columns [from, to) of each row of `row` elements.
Vec columns(const Vec& v, int64_t row, int64_t from, int64_t to) {
  Vec r;
  for (size_t i = 0; i < v.size(); ++i)
    if (int64_t(i) % row >= from && int64_t(i) % row < to) r.push_back(v[i]);
  return r;
}

class FlashCoopmat : public VulkanTest {
 protected:
  void SetUp() override {
    VulkanTest::SetUp();
    if (HasFatalFailure()) return;
    setenv("CROSSTRAIN_VK_FLASH", "cme", 1);
    vk().set_profiling(true);  // the profile names the shaders that ran
  }
  void TearDown() override {
    unsetenv("CROSSTRAIN_VK_FLASH");
    vk().set_profiling(false);
    VulkanTest::TearDown();
  }
  // Runs c on the reference and vulkan:0; checks the results and that the shaders named
  // `<family>fwd_<dtype>`, `<family>bwd_q_...` and `<family>bwd_kv_...` ran.
  FlashOut check(const FlashCase& c, const std::string& family = "flash_cme_") {
    vk().set_profiling(false);
    vk().set_profiling(true);  // a fresh report
    FlashOut r = run_flash(ref(), c), f = run_flash(vk(), c);
    const std::string nm = c.name() + " (" + family + "*)";
    EXPECT_TRUE(close_nmse(f.out, r.out, kTolCm, "out vs ref " + nm));
    EXPECT_TRUE(close_nmse(f.lse, r.lse, kTolCm, "lse vs ref " + nm));
    const int64_t W = c.W(), kv = c.NKV * c.hs;
    const char* part[3] = {"dq", "dk", "dv"};
    const int64_t edge[4] = {0, c.C(), c.C() + kv, W};
    for (int p = 0; p < 3; ++p)
      EXPECT_TRUE(close_nmse(columns(f.dqkv, W, edge[p], edge[p + 1]),
                             columns(r.dqkv, W, edge[p], edge[p + 1]), kTolCm,
                             std::string(part[p]) + " vs ref " + nm));
    const std::string report = vk().profile_report();
    for (const char* k : {"fwd_", "bwd_q_", "bwd_kv_"}) {
      const std::string shader = family + k + dtype_name(c.dt);
      EXPECT_NE(report.find(shader), std::string::npos) << nm << ": " << shader << "\n" << report;
    }
    return f;
  }
};

// f16 at gpt2's head size 64: 2 query heads a kv head, T = 37 ends mid-tile in every kernel.
// A second run gives the same bits: every output has one owner summing in a fixed order (the dS
// tile's maximum is an integer atomicMax, the same whatever the order).
TEST_F(FlashCoopmat, F16HeadSize64GroupedRaggedMatchesReferenceAndRepeats) {
  const FlashCase c{2, 37, 4, 2, 64, DType::f16, 600};
  const FlashOut a = check(c), b = run_flash(vk(), c);
  EXPECT_TRUE(a.raw == b.raw) << c.name() << ": two runs differ";
}

// bf16 at head size 32, one kv head for three query heads, v x 2^20 and dout x 2^-20: outside
// f16's range (65504, 2^-24) without the per-tile power-of-two scaling of the staged tiles.
TEST_F(FlashCoopmat, Bf16HeadSize32MultiQueryPastF16Range) {
  check({2, 37, 3, 1, 32, DType::bf16, 610, 1048576.0f, 1.0f / 1048576.0f});
}

// Scores spanning hundreds (q x 64: a row's scaled scores ~N(0, 64^2)): the forward's row
// statistics, split over several invocations a row, must combine their partial maxima before any
// exponential (exp of a score past another part's maximum by more than 88 overflows).
TEST_F(FlashCoopmat, ScoresSpanningHundredsKeepTheRowStatistics) {
  check({1, 70, 2, 1, 64, DType::f16, 615, 1.0f, 1.0f, 64.0f});
}

// The staging's two forms, 8 elements a load (every head slice's rows 16-byte aligned: these
// cases) and one element a load (CROSSTRAIN_VK_FLASH_VEC=0, for unaligned tensors), stage the same
// f16 values: out, lse and dqkv bit for bit. bf16 with q x 2^20 and dout x 2^-20 (every tile
// scaled), every 7th value 2^-32 of the rest (below f16's normals after the tile's scaling:
// rounded by pack2, not converted by packHalf2x16), the odd-indexed ones x 16 (each tile's largest
// |x| is in a word's upper half: a maximum that missed those would overflow f16).
TEST_F(FlashCoopmat, EightElementLoadsStageTheSameValues) {
  for (const FlashCase& c :
       {FlashCase{2, 37, 4, 2, 64, DType::f16, 660},
        FlashCase{2, 45, 3, 1, 32, DType::bf16, 661, 1.0f, 0x1p-20f, 0x1p20f, 7, 16.0f}}) {
    const FlashOut vec = run_flash(vk(), c);
    FlashOut one;
    {
      ScopedEnv off("CROSSTRAIN_VK_FLASH_VEC", "0");
      one = run_flash(vk(), c);
    }
    EXPECT_TRUE(vec.raw == one.raw) << c.name();
  }
}

// The backward's batch elements side by side: every dq dispatch of the batch, then every dk/dv
// dispatch, with one barrier between (each element's D has its own range of the workspace, so the
// dq dispatches of different elements write disjoint ranges), not two an element (one shared D
// row ordered each element's dq after the previous element's dk/dv). The device's barrier count
// (the profile's last line) across one backward of B = 4, on the coopmat kernels and the scalar
// shaders: 3 -- the one between the passes, one ordering the first dispatch after the previous
// submission and one the read-back's synchronisation adds (the element-by-element order: 9).
int barriers_of(const std::string& report) {
  const size_t at = report.find(" barriers,");
  if (at == std::string::npos) return -1;
  size_t from = report.rfind(", ", at);
  return std::atoi(report.c_str() + from + 2);
}

TEST_F(FlashCoopmat, BackwardRunsTheBatchElementsBetweenTwoBarriers) {
  for (const char* path : {"cme", "scalar"}) {
    ScopedEnv flash("CROSSTRAIN_VK_FLASH", path);
    const FlashCase c{4, 40, 2, 1, 32, DType::f16, 670};
    Vec qkv = randn(c.B * c.T * c.W(), c.seed), dout = randn(c.B * c.T * c.C(), c.seed + 1);
    Tensor tq = up_as(vk(), {c.B, c.T, c.W()}, qkv, c.dt);
    Tensor td = up_as(vk(), {c.B, c.T, c.C()}, dout, c.dt);
    Tensor to = vk().empty({c.B, c.T, c.C()}, c.dt, MemCategory::kActivations);
    Tensor tl = vk().empty({c.B, c.NH, c.T}, DType::f32, MemCategory::kActivations);
    Tensor tdq = vk().empty({c.B, c.T, c.W()}, c.dt, MemCategory::kActivations);
    vk().flash_attention_forward(to, tl, tq, 2, 1);
    const int before = barriers_of(vk().profile_report());  // synchronises
    vk().flash_attention_backward(tdq, td, tq, to, tl, 2, 1);
    const int after = barriers_of(vk().profile_report());
    ASSERT_GE(before, 0) << vk().profile_report();
    EXPECT_LE(after - before, 3) << path << ": " << after - before << " barriers for B = 4";
    // and the results: the case's reference comparison
    if (std::string(path) == "cme") check(c);
  }
}

// Intel's 8x16x16 fragments (two fragment rows a subgroup) and a forced tile of 2 subgroups and
// 16 streamed rows: T = 45 is two query blocks of 32 and three key tiles, the last ragged.
TEST_F(FlashCoopmat, OblongFragmentsAndSmallTiles) {
  ScopedEnv frag("CROSSTRAIN_VK_CM_FRAG", "8x16x16");
  ScopedEnv tile("CROSSTRAIN_VK_FLASH_TILE", "2,16");
  check({1, 45, 2, 1, 64, DType::f16, 620});
}

// The forward of the last Tq rows (sampling's key/value cache: out [B,Tq,C], lse [B,NH,Tq], the
// positions T - Tq .. T - 1) equals the rows of the same build's whole-window forward bit for bit:
// the workgroups start at the block holding T - Tq and compute it whole, storing only the rows
// from T - Tq on. A bf16 block's Q staging scale is the block's: q of rows 0 .. 7 is x 2^24 here,
// which rounds the small q of the block's other rows (a block started at T - Tq would not).
// Tq = 1, Tq = T - 20 (row 20 is mid-block for blocks of 16, 32 or 64, later blocks follow) and
// Tq = T; B = 2; on the pipelines of the cases above (f16 with the forced 32-row blocks, two at
// T = 45; bf16 past f16's range on the default tile, T = 77).
TEST_F(FlashCoopmat, LastRowsAreTheWholeWindowsRowsBitForBit) {
  auto forward = [](const FlashCase& c, int64_t Tq) {
    Vec qkv = randn(c.B * c.T * c.W(), c.seed);
    for (size_t i = 0; i < qkv.size(); ++i) {
      if (int64_t(i) % c.W() >= c.C() + c.NKV * c.hs) qkv[i] *= c.vscale;
      if (c.dt == DType::bf16 && int64_t(i) % c.W() < c.C() && int64_t(i) / c.W() % c.T < 8)
        qkv[i] *= 16777216.0f;
    }
    Tensor tq = up_as(vk(), {c.B, c.T, c.W()}, qkv, c.dt);
    Tensor to = vk().empty({c.B, Tq, c.C()}, c.dt, MemCategory::kActivations);
    Tensor tl = vk().empty({c.B, c.NH, Tq}, DType::f32, MemCategory::kActivations);
    vk().fill(to, NAN);  // every row written: no NaN may remain (NaN != NaN below)
    vk().fill(tl, NAN);
    vk().flash_attention_forward(to, tl, tq, static_cast<int>(c.NH), static_cast<int>(c.NKV));
    return std::make_pair(download_h(vk(), to), download(vk(), tl));
  };
  auto check_last_rows = [&](const FlashCase& c) {
    vk().set_profiling(false);
    vk().set_profiling(true);  // a fresh report
    const auto whole = forward(c, c.T);
    for (int64_t Tq : {int64_t{1}, c.T - 20, c.T}) {
      Vec want_o, want_l;  // the whole window's rows T - Tq .. T - 1
      for (int64_t b = 0; b < c.B; ++b) {
        want_o.insert(want_o.end(), whole.first.begin() + (b * c.T + c.T - Tq) * c.C(),
                      whole.first.begin() + (b + 1) * c.T * c.C());
        for (int64_t h = 0; h < c.NH; ++h)
          want_l.insert(want_l.end(), whole.second.begin() + (b * c.NH + h) * c.T + c.T - Tq,
                        whole.second.begin() + (b * c.NH + h + 1) * c.T);
      }
      const auto got = forward(c, Tq);
      EXPECT_EQ(got.first, want_o) << "out, " << c.name() << " Tq " << Tq;
      EXPECT_EQ(got.second, want_l) << "lse, " << c.name() << " Tq " << Tq;
    }
    const std::string shader = std::string("flash_cme_fwd_") + dtype_name(c.dt);
    EXPECT_NE(vk().profile_report().find(shader), std::string::npos) << vk().profile_report();
  };
  {
    ScopedEnv frag("CROSSTRAIN_VK_CM_FRAG", "8x16x16");
    ScopedEnv tile("CROSSTRAIN_VK_FLASH_TILE", "2,16");
    check_last_rows({2, 45, 2, 1, 64, DType::f16, 650});
  }
  check_last_rows({2, 77, 3, 1, 32, DType::bf16, 660, 1048576.0f});
}

// A head size that is no multiple of 16 takes the scalar shaders, with the same results.
TEST_F(FlashCoopmat, OtherHeadSizesTakeTheScalarShaders) {
  check({1, 21, 2, 1, 40, DType::f16, 640}, "flash_");
  EXPECT_EQ(vk().profile_report().find("flash_cme_"), std::string::npos) << vk().profile_report();
}

}  // namespace
}  // namespace ct::vktest
