// flash_attention_forward / flash_attention_backward through the matrix-tile kernels
// (backends/gpu/kernels/flash_attention_tc.cu) on the GPU devices (simt, simt64, cuda, hip):
// against the reference for head sizes 64 and 128, GQA, T not a multiple of the tiles, f16 and
// bf16, and f32 under TF32 (Device::set_allow_tf32: the m16n8k8 .tf32 tile at warp 32); the same
// bits run after run; and the calls the tile kernels do not take (head size, f32 without TF32,
// f32 at warp 64, alignment) on the general kernels, with the right results; the forward of the
// last rows (the whole window's rows, bit for bit). --profile's report names the path every case
// took, with the reason where it is the general kernels.
//
// The tile path needs Ctx::matrix_tiles, which the SIMT backends leave off by default (the
// scalar form of the tile is slow on the CPU). CT_GPU_TILES=1 turns it on; the runtime reads it
// when a device opens, so these cases open a device of their own with the variable set (and
// restore it afterwards) instead of the harness's shared one.
#include <cstdlib>
#include <memory>
#include <sstream>

#include "tests/common/half_compare.h"

namespace ct::test {
namespace {

bool gpu_device_backend(const std::string& b) {
  return b == "simt" || b == "simt64" || b == "cuda" || b == "hip";
}

// v as `dt` into t (16-bit: rounded to nearest even).
void upload_into(Device& d, const Tensor& t, const Vec& v) {
  if (t.dtype == DType::f32) {
    d.upload(t, v.data(), v.size() * sizeof(float));
    return;
  }
  std::vector<uint16_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) bits[i] = to_h(v[i], t.dtype);
  d.upload(t, bits.data(), bits.size() * 2);
}

struct TcCase {
  int64_t B, T, NH, NKV, hs;
  DType dt;
  uint64_t seed;
  int64_t C() const { return NH * hs; }
  int64_t W() const { return C() + 2 * NKV * hs; }  // qkv's row
  std::string name() const {
    std::ostringstream os;
    os << dtype_name(dt) << " B" << B << " T" << T << " NH" << NH << " NKV" << NKV << " hs" << hs;
    return os.str();
  }
};

struct TcOut {
  Vec out, lse, dqkv;
  std::vector<uint8_t> raw;  // the bytes of out, lse and dqkv
};

// Forward and backward of c on d; `misalign` places qkv one element past an aligned start.
TcOut run(Device& d, const TcCase& c, bool misalign = false) {
  const Vec qkv = randn(c.B * c.T * c.W(), c.seed), dout = randn(c.B * c.T * c.C(), c.seed + 1);
  const Shape sq{c.B, c.T, c.W()}, so{c.B, c.T, c.C()};
  Tensor tq = d.empty(sq, c.dt, MemCategory::kActivations);
  if (misalign)
    tq = d.empty(Shape{sq.numel() + 8}, c.dt, MemCategory::kActivations).slice_flat(1, sq);
  upload_into(d, tq, qkv);
  Tensor td = d.empty(so, c.dt, MemCategory::kActivations);
  upload_into(d, td, dout);
  Tensor to = d.empty(so, c.dt, MemCategory::kActivations);
  Tensor tl = d.empty({c.B, c.NH, c.T}, DType::f32, MemCategory::kActivations);
  Tensor tdq = d.empty(sq, c.dt, MemCategory::kActivations);
  d.fill(tdq, NAN);  // (=): what was there must not matter
  const int nh = static_cast<int>(c.NH), nkv = static_cast<int>(c.NKV);
  d.flash_attention_forward(to, tl, tq, nh, nkv);
  d.flash_attention_backward(tdq, td, tq, to, tl, nh, nkv);
  TcOut r{download_h(d, to), download(d, tl), download_h(d, tdq), {}};
  for (const Tensor* t : {&to, &tl, &tdq}) {
    std::vector<uint8_t> b = raw_download(d, *t);
    r.raw.insert(r.raw.end(), b.begin(), b.end());
  }
  return r;
}

// Head sizes 64 and 128; plain, grouped (2 query heads a kv head) and multi-query attention;
// T past one tile and mid-tile (40), past a block and mid-tile (77), a single row (1); f16 and
// bf16. The 16-bit forward at head size 64 runs 128-row blocks (two m-tiles a warp): 130 and 200
// are past one of them, mid-tile, with 3 and 4 key tiles.
const TcCase kTcCases[] = {
    {2, 40, 2, 2, 64, DType::bf16, 41},  {2, 77, 4, 2, 64, DType::f16, 42},
    {2, 77, 4, 1, 64, DType::bf16, 43},  {2, 40, 2, 2, 128, DType::f16, 44},
    {2, 77, 4, 2, 128, DType::bf16, 45}, {2, 40, 4, 1, 128, DType::f16, 46},
    {2, 1, 4, 2, 64, DType::bf16, 47},   {1, 130, 2, 2, 64, DType::f16, 48},
    {1, 200, 2, 1, 64, DType::bf16, 49},
};

// f32 under TF32: grouped and multi-query attention, head sizes 64 and 128 (128 stages 32 keys a
// tile in f32: T = 130 is past four key tiles and two query blocks, mid-tile), small enough for
// the SIMT runtime (one fiber round per m16n8k8 tile).
const TcCase kTf32Cases[] = {
    {2, 77, 4, 2, 64, DType::f32, 61},
    {1, 130, 2, 1, 128, DType::f32, 62},
};

// The TF32 cases' normalised MSE bound against the f32 reference. TF32 keeps 10 explicit mantissa
// bits: rounding to nearest errs by at most u = 2^-11 relative, so a product of two rounded
// operands by at most 2u (the f32 accumulation adds ~2^-24, negligible), and the normalised MSE
// of a sum of such products -- the mean squared relative error of its terms -- by (2u)^2 = 2^-20.
// Attention chains such sums (S = Q K^T feeds exp, then P V; in the backward dP - D cancels
// where dP is close to D, then dS K), so the bound allows 16 (2u)^2 = 2^-16 ~ 1.5e-5: a
// root-mean-square error of 2^-8 relative, four times one product's worst. One key dropped or
// misplaced in a row of ~77 is an error near 1/77 in that row, far past it; the 16-bit cases'
// kTolGemm (5e-4) is 30 times looser.
constexpr double kTolTf32 = 1.0 / 65536;

class FlashAttentionTiles : public DeviceTest {
 protected:
  void SetUp() override {
    DeviceTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (!gpu_device_backend(GetParam().backend))
      GTEST_SKIP() << "the matrix-tile flash attention kernels are a GPU-device path; " << id()
                   << " has its own kernels";
    tiled_ = open_device_with_env(id(), {{"CT_GPU_TILES", "1"}});  // matrix tiles on
    tiled_->set_profiling(true);
  }
  void TearDown() override {
    if (tiled_) {
      EXPECT_NO_THROW(tiled_->synchronize());
    }
    tiled_.reset();
    DeviceTest::TearDown();
  }
  // Runs c on the reference and the tiled device; checks the results (normalised MSE up to t,
  // kTolGemm when 0) and that `path` ran.
  TcOut check(const TcCase& c, const std::string& path, bool misalign = false, double t = 0) {
    tiled_->set_profiling(false);
    tiled_->set_profiling(true);  // a fresh report
    TcOut r = run(ref(), c), f = run(*tiled_, c, misalign);
    const std::string nm = c.name() + " on " + id() + " with tiles";
    if (t == 0) t = tol(Tol::kGemm);
    EXPECT_TRUE(close_nmse(f.out, r.out, t, "out vs ref " + nm));
    EXPECT_TRUE(close_nmse(f.lse, r.lse, t, "lse vs ref " + nm));
    EXPECT_TRUE(close_nmse(f.dqkv, r.dqkv, t, "dqkv vs ref " + nm));
    const std::string report = tiled_->profile_report();
    for (const char* op : {"flash_attention_forward: ", "flash_attention_backward: "})
      EXPECT_NE(report.find(op + path), std::string::npos)
          << nm << ": expected \"" << op << path << "\" in the profile:\n"
          << report;
    return f;
  }
  // Where f32 runs once TF32 is allowed: the tile at warp 32 where the device takes TF32 (the
  // SIMT runtime, CUDA where info().tf32), else the general kernels, saying why.
  std::string tf32_path() const {
    const std::string& b = GetParam().backend;
    if (b == "simt64") return "general kernels (flash_attention.cu): f32 at warp 64";
    if (b == "simt" || tiled_->info().tf32) return "matrix tiles";
    return "general kernels (flash_attention.cu): f32 without TF32";
  }
  std::unique_ptr<Device> tiled_;
};

TEST_P(FlashAttentionTiles, MatchesReference) {
  for (const TcCase& c : kTcCases) check(c, "matrix tiles");
}

// f32 with TF32 allowed: the TF32 tile where the device has it, within kTolTf32 of the f32
// reference.
TEST_P(FlashAttentionTiles, F32UnderTf32MatchesReference) {
  tiled_->set_allow_tf32(true);
  for (const TcCase& c : kTf32Cases) check(c, tf32_path(), false, kTolTf32);
}

// Two runs, the same bits (out, lse, dqkv): every output has one owner summing in a fixed order.
// (MatchesReference and F32UnderTf32MatchesReference check these cases' values.)
TEST_P(FlashAttentionTiles, Deterministic) {
  tiled_->set_allow_tf32(true);
  for (TcCase c : {kTcCases[2], kTcCases[5], kTf32Cases[0]}) {
    c.B = 1;  // the bits of one batch element show it as well as two's
    TcOut a = run(*tiled_, c), b = run(*tiled_, c);
    EXPECT_TRUE(a.raw == b.raw) << c.name() << " on " << id() << ": two runs differ";
  }
  EXPECT_NE(tiled_->profile_report().find("flash_attention_backward: matrix tiles"),
            std::string::npos)
      << tiled_->profile_report();
}

// The forward of the last Tq rows (sampling's key/value cache: out [B,Tq,C], lse [B,NH,Tq])
// gives the whole window's rows T - Tq .. T - 1 bit for bit: the same query blocks, sums and
// order, only those holding the rows launched. Tq = 1 (one block a head), from mid-block (40 of
// 77: rows 0 .. 36 of the first block are computed but must not be stored) and 13 (at hs 128 and
// in f32 a 64-row block's start); bf16 hs 64 with two batch elements (a stray store of batch 1
// would land in batch 0's rows), f16 hs 128 multi-query, f32 under TF32 (the tile at warp 32, the
// general kernels on simt64), f16 hs 64 at T 200 (the rows in the second 128-row block, which
// alone is launched). Guard elements on both sides of out and lse must stay as filled.
TEST_P(FlashAttentionTiles, LastRowsAreTheWholeWindowsRows) {
  tiled_->set_allow_tf32(true);
  constexpr int64_t kGuard = 64;  // elements each side (keeps out 16-byte aligned)
  const TcCase cases[] = {{2, 77, 2, 2, 64, DType::bf16, 71},
                          {1, 77, 2, 1, 128, DType::f16, 72},
                          {1, 77, 2, 1, 64, DType::f32, 73},
                          {1, 200, 2, 1, 64, DType::f16, 74}};  // rows in a second 128-row block
  for (const TcCase& c : cases) {
    const Vec qkv = randn(c.B * c.T * c.W(), c.seed);
    Tensor tq = tiled_->empty({c.B, c.T, c.W()}, c.dt, MemCategory::kActivations);
    upload_into(*tiled_, tq, qkv);
    // out, lse of `rows` rows inside NaN-filled buffers with kGuard elements either side; the
    // bytes of the whole buffers.
    auto forward = [&](int64_t rows) {
      const Shape so{c.B, rows, c.C()}, sl{c.B, c.NH, rows};
      Tensor bo = tiled_->empty({so.numel() + 2 * kGuard}, c.dt, MemCategory::kActivations);
      Tensor bl = tiled_->empty({sl.numel() + 2 * kGuard}, DType::f32, MemCategory::kActivations);
      tiled_->fill(bo, NAN);
      tiled_->fill(bl, NAN);
      tiled_->flash_attention_forward(bo.slice_flat(kGuard, so), bl.slice_flat(kGuard, sl), tq,
                                      static_cast<int>(c.NH), static_cast<int>(c.NKV));
      return std::make_pair(raw_download(*tiled_, bo), raw_download(*tiled_, bl));
    };
    const auto whole = forward(c.T);
    const size_t eo = dtype_size(c.dt), el = sizeof(float);
    for (int64_t Tq : {int64_t{1}, int64_t{13}, int64_t{40}}) {
      const std::string nm = c.name() + " Tq" + std::to_string(Tq) + " on " + id() + " with tiles";
      // the whole window's buffers' guards and rows T - Tq .. T - 1, as the Tq-row buffers
      std::vector<uint8_t> wo(whole.first.begin(), whole.first.begin() + kGuard * eo);
      std::vector<uint8_t> wl(whole.second.begin(), whole.second.begin() + kGuard * el);
      for (int64_t b = 0; b < c.B; ++b) {
        const auto o = whole.first.begin() + kGuard * eo;
        wo.insert(wo.end(), o + (b * c.T + c.T - Tq) * c.C() * eo, o + (b + 1) * c.T * c.C() * eo);
        for (int64_t h = 0; h < c.NH; ++h) {
          const auto l = whole.second.begin() + (kGuard + (b * c.NH + h) * c.T) * el;
          wl.insert(wl.end(), l + (c.T - Tq) * el, l + c.T * el);
        }
      }
      wo.insert(wo.end(), whole.first.end() - kGuard * eo, whole.first.end());
      wl.insert(wl.end(), whole.second.end() - kGuard * el, whole.second.end());
      const auto got = forward(Tq);
      EXPECT_TRUE(got.first == wo) << nm << ": out (or its guards) differs from the whole window's";
      EXPECT_TRUE(got.second == wl)
          << nm << ": lse (or its guards) differs from the whole window's";
    }
  }
  const std::string report = tiled_->profile_report();
  EXPECT_NE(report.find("flash_attention_forward: matrix tiles"), std::string::npos) << report;
}

// What the tile kernels do not take runs on the general kernels, named in the profile. f32
// without TF32 gives the general kernels' bits exactly (those of the harness's device, whose
// tiles are off or whose TF32 is).
TEST_P(FlashAttentionTiles, OtherCallsTakeTheGeneralPath) {
  check({2, 40, 4, 2, 32, DType::bf16, 51}, "general kernels (flash_attention.cu): head size 32");
  const TcCase f32{1, 40, 2, 2, 64, DType::f32, 52};
  const TcOut tiled = check(f32, "general kernels (flash_attention.cu): f32 without TF32");
  EXPECT_TRUE(tiled.raw == run(dev(), f32).raw)
      << f32.name() << " on " << id() << ": f32 without TF32 differs from the general kernels";
  check({1, 40, 2, 1, 64, DType::f16, 53},
        "general kernels (flash_attention.cu): an operand not 16-byte aligned", true);
}

CT_INSTANTIATE_DEVICE_SUITE(FlashAttentionTiles);

}  // namespace
}  // namespace ct::test
