// The SIMT runtime's matrix instructions (backends/gpu/matrix_ops.h on SIMT, backends/simt/
// matrix.cpp) against the documents, lane by lane. The layouts below are this test's own
// transcription of the tables -- PTX's in the direction PTX writes them (lane, register ->
// row, column), AMD's in the direction its matrix instruction calculator prints them (element ->
// lane, item) -- and the instructions are probed through the runtime: one-hot A and B elements
// say which element each lane's register is taken as, a coded product says where each D element
// lands. Then whole products against a plain triple loop, the portable forms (HIP, older CUDA)
// against the collectives, ldmatrix's registers, cp.async's landing at the wait, and the misuse
// the runtime reports.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backends/gpu/kernels/mma.h"
#include "backends/gpu/matrix_ops.h"
#include "backends/gpu/numeric.h"

namespace {

using ct::gpu::launch;
using ct::gpu::layout::RowCol;

// --- the documents' tables, transcribed here ------------------------------------------------

// One instruction's layout as tables: [lane][element] -> (row, col) for A, B and C/D.
struct Table {
  const char* name;
  int warp, M, N, K, bits, a_elems, b_elems, c_elems;
  std::vector<std::vector<RowCol>> a, b, c;
};

Table sized(const char* name, int warp, int M, int N, int K, int bits) {
  Table t{name, warp, M, N, K, bits, M * K / warp, K * N / warp, M * N / warp, {}, {}, {}};
  t.a.assign(warp, std::vector<RowCol>(t.a_elems, RowCol{-1, -1}));
  t.b.assign(warp, std::vector<RowCol>(t.b_elems, RowCol{-1, -1}));
  t.c.assign(warp, std::vector<RowCol>(t.c_elems, RowCol{-1, -1}));
  return t;
}

// PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type" (.f16 / .bf16):
//   A (a0..a7): row = groupID for a0, a1, a4, a5, groupID + 8 for a2, a3, a6, a7;
//               col = threadID_in_group * 2 + (i & 0x1) for i < 4, the same + 8 for i >= 4.
//   B (b0..b3): row = threadID_in_group * 2 + (i & 0x1) for i < 2, the same + 8 for i >= 2;
//               col = groupID.
//   C/D (c0..c3): row = groupID for c0, c1, groupID + 8 for c2, c3;
//                 col = threadID_in_group * 2 + (i & 0x1).
Table ptx_m16n8k16() {
  Table t = sized("mma.m16n8k16", 32, 16, 8, 16, 16);
  for (int lane = 0; lane < 32; ++lane) {
    const int groupID = lane >> 2, threadID_in_group = lane % 4;
    for (int i = 0; i < 8; ++i) {
      const bool low = i == 0 || i == 1 || i == 4 || i == 5;
      t.a[lane][i] = {low ? groupID : groupID + 8,
                      threadID_in_group * 2 + (i & 0x1) + (i < 4 ? 0 : 8)};
    }
    for (int i = 0; i < 4; ++i)
      t.b[lane][i] = {threadID_in_group * 2 + (i & 0x1) + (i < 2 ? 0 : 8), groupID};
    for (int i = 0; i < 4; ++i)
      t.c[lane][i] = {i < 2 ? groupID : groupID + 8, threadID_in_group * 2 + (i & 0x1)};
  }
  return t;
}

// PTX ISA, "Matrix Fragments for mma.m16n8k8", .tf32:
//   A (a0..a3): row = groupID for a0, a2, groupID + 8 for a1, a3;
//               col = threadID_in_group for a0, a1, threadID_in_group + 4 for a2, a3.
//   B (b0, b1): row = threadID_in_group for b0, threadID_in_group + 4 for b1; col = groupID.
//   C/D: as m16n8k16's.
Table ptx_m16n8k8_tf32() {
  Table t = sized("mma.m16n8k8.tf32", 32, 16, 8, 8, 32);
  const Table f = ptx_m16n8k16();
  for (int lane = 0; lane < 32; ++lane) {
    const int groupID = lane >> 2, threadID_in_group = lane % 4;
    for (int i = 0; i < 4; ++i)
      t.a[lane][i] = {i == 0 || i == 2 ? groupID : groupID + 8,
                      i < 2 ? threadID_in_group : threadID_in_group + 4};
    t.b[lane][0] = {threadID_in_group, groupID};
    t.b[lane][1] = {threadID_in_group + 4, groupID};
    t.c[lane] = f.c[lane];
  }
  return t;
}

// AMD matrix instruction calculator (gfx90a), v_mfma_f32_32x32x8f16 / bf16_1k:
//   A[i][k]: lane i + 32 * (k / 4), item k % 4;   B[k][j]: lane j + 32 * (k / 4), item k % 4;
//   D[i][j]: lane j + 32 * ((i / 4) % 2), item 4 * (i / 8) + i % 4.
// and v_mfma_f32_16x16x16f16 / bf16_1k:
//   A[i][k]: lane i + 16 * (k / 4), item k % 4;   B[k][j]: lane j + 16 * (k / 4), item k % 4;
//   D[i][j]: lane j + 16 * (i / 4), item i % 4.
Table amd_mfma(int size) {
  const bool big = size == 32;
  Table t = big ? sized("v_mfma_f32_32x32x8", 64, 32, 32, 8, 16)
                : sized("v_mfma_f32_16x16x16", 64, 16, 16, 16, 16);
  for (int i = 0; i < t.M; ++i)
    for (int k = 0; k < t.K; ++k) t.a[i + size * (k / 4)][k % 4] = {i, k};
  for (int k = 0; k < t.K; ++k)
    for (int j = 0; j < t.N; ++j) t.b[j + size * (k / 4)][k % 4] = {k, j};
  for (int i = 0; i < t.M; ++i)
    for (int j = 0; j < t.N; ++j) {
      if (big)
        t.c[j + 32 * ((i / 4) % 2)][4 * (i / 8) + i % 4] = {i, j};
      else
        t.c[j + 16 * (i / 4)][i % 4] = {i, j};
    }
  return t;
}

// Each element of each matrix exactly once, and nothing left unset.
void expect_bijective(const Table& t) {
  auto check = [&](const std::vector<std::vector<RowCol>>& f, int rows, int cols, const char* w) {
    std::vector<int> seen(rows * cols, 0);
    for (const auto& lane : f)
      for (const RowCol& rc : lane) {
        ASSERT_TRUE(rc.row >= 0 && rc.row < rows && rc.col >= 0 && rc.col < cols)
            << t.name << " " << w;
        ++seen[rc.row * cols + rc.col];
      }
    for (int v : seen) ASSERT_EQ(v, 1) << t.name << " " << w;
  };
  check(t.a, t.M, t.K, "A");
  check(t.b, t.K, t.N, "B");
  check(t.c, t.M, t.N, "C");
}

// --- the instructions through kernels ------------------------------------------------------

enum Form { kMmaF16, kMmaBF16, kMmaTf32, kMfma32F16, kMfma32BF16, kMfma16F16, kMfma16BF16 };
namespace md = ct::gpu::matrix_detail;
namespace lay = ct::gpu::layout;

template <Form F>
struct Info;
template <>
struct Info<kMmaF16> {
  using L = lay::M16N8K16;
  static constexpr int kType = md::kF16;
  static void call(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2],
                   const float (&c)[4]) {
    ct_mma_m16n8k16_f16(d, a, b, c);
  }
};
template <>
struct Info<kMmaBF16> {
  using L = lay::M16N8K16;
  static constexpr int kType = md::kBF16;
  static void call(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2],
                   const float (&c)[4]) {
    ct_mma_m16n8k16_bf16(d, a, b, c);
  }
};
template <>
struct Info<kMmaTf32> {
  using L = lay::M16N8K8Tf32;
  static constexpr int kType = md::kTf32;
  static void call(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2],
                   const float (&c)[4]) {
    ct_mma_m16n8k8_tf32(d, a, b, c);
  }
};
template <>
struct Info<kMfma32F16> {
  using L = lay::Mfma32x32x8;
  static constexpr int kType = md::kF16;
  static void call(float (&d)[16], const std::uint32_t (&a)[2], const std::uint32_t (&b)[2],
                   const float (&c)[16]) {
    ct_mfma_32x32x8_f16(d, a, b, c);
  }
};
template <>
struct Info<kMfma32BF16> {
  using L = lay::Mfma32x32x8;
  static constexpr int kType = md::kBF16;
  static void call(float (&d)[16], const std::uint32_t (&a)[2], const std::uint32_t (&b)[2],
                   const float (&c)[16]) {
    ct_mfma_32x32x8_bf16(d, a, b, c);
  }
};
template <>
struct Info<kMfma16F16> {
  using L = lay::Mfma16x16x16;
  static constexpr int kType = md::kF16;
  static void call(float (&d)[4], const std::uint32_t (&a)[2], const std::uint32_t (&b)[2],
                   const float (&c)[4]) {
    ct_mfma_16x16x16_f16(d, a, b, c);
  }
};
template <>
struct Info<kMfma16BF16> {
  using L = lay::Mfma16x16x16;
  static constexpr int kType = md::kBF16;
  static void call(float (&d)[4], const std::uint32_t (&a)[2], const std::uint32_t (&b)[2],
                   const float (&c)[4]) {
    ct_mfma_16x16x16_bf16(d, a, b, c);
  }
};

// a: (warp, kARegs), b: (warp, kBRegs), c, d: (warp, kC), lane-major. PORTABLE: the shuffle
// form HIP and older CUDA run instead of the instruction.
template <Form F, bool PORTABLE>
__global__ void CT_LAUNCH_BOUNDS(64)
    mma_kernel(const std::uint32_t* a, const std::uint32_t* b, const float* c, float* d) {
  CT_CHECK_LAUNCH_BOUNDS(64);
  using L = typename Info<F>::L;
  const int l = threadIdx.x;
  std::uint32_t ra[L::kARegs], rb[L::kBRegs];
  float rc[L::kC], rd[L::kC];
  for (int r = 0; r < L::kARegs; ++r) ra[r] = a[l * L::kARegs + r];
  for (int r = 0; r < L::kBRegs; ++r) rb[r] = b[l * L::kBRegs + r];
  for (int e = 0; e < L::kC; ++e) rc[e] = c[l * L::kC + e];
  if constexpr (PORTABLE)
    md::mma_portable<L, Info<F>::kType>(rd, ra, rb, rc);
  else
    Info<F>::call(rd, ra, rb, rc);
  for (int e = 0; e < L::kC; ++e) d[l * L::kC + e] = rd[e];
}

std::uint32_t encode(int type, float v) {
  if (type == md::kTf32) return ct::gpu::f32_bits(v);
  return type == md::kF16 ? ct::gpu::f32_to_f16(v) : ct::gpu::f32_to_bf16(v);
}
float decode(int type, std::uint32_t bits) {
  if (type == md::kTf32) return ct::gpu::bits_f32(bits & 0xffffe000u);
  return type == md::kF16 ? ct::gpu::f16_to_f32(static_cast<std::uint16_t>(bits))
                          : ct::gpu::bf16_to_f32(static_cast<std::uint16_t>(bits));
}

// Matrices as stored bits (row-major), spread over the lanes by the document's table.
struct Operands {
  std::vector<std::uint32_t> a, b;  // element bits, M x K and K x N
  std::vector<float> c;             // M x N
};

template <Form F, bool PORTABLE = false>
std::vector<float> run(ct::simt::Runtime& rt, const Table& t, const Operands& o) {
  using L = typename Info<F>::L;
  const int per = t.bits == 16 ? 2 : 1, shift = t.bits == 16 ? 16 : 0;
  std::vector<std::uint32_t> a(t.warp * L::kARegs, 0), b(t.warp * L::kBRegs, 0);
  std::vector<float> c(t.warp * L::kC), d(t.warp * L::kC, NAN);
  for (int l = 0; l < t.warp; ++l) {
    for (int e = 0; e < t.a_elems; ++e)
      a[l * L::kARegs + e / per] |= o.a[t.a[l][e].row * t.K + t.a[l][e].col] << (shift * (e % per));
    for (int e = 0; e < t.b_elems; ++e)
      b[l * L::kBRegs + e / per] |= o.b[t.b[l][e].row * t.N + t.b[l][e].col] << (shift * (e % per));
    for (int e = 0; e < t.c_elems; ++e) c[l * L::kC + e] = o.c[t.c[l][e].row * t.N + t.c[l][e].col];
  }
  if (t.warp == 32)
    launch<32>(CT_KERNEL(mma_kernel<F, PORTABLE>), dim3(1), dim3(32), 0, &rt, a.data(), b.data(),
               c.data(), d.data());
  else
    launch<64>(CT_KERNEL(mma_kernel<F, PORTABLE>), dim3(1), dim3(64), 0, &rt, a.data(), b.data(),
               c.data(), d.data());
  return d;
}

// A value that names (i, j) and is exact in f16, bf16 and tf32: an odd number times a power of
// two, (2j + 1) 2^(i - 8), for i < 16, j < 32.
float code(int i, int j) {
  return static_cast<float>(2 * j + 1) * std::ldexp(1.0f, i - 8);
}

template <Form F>
void probe_layouts(const Table& t) {
  using L = typename Info<F>::L;
  constexpr int type = Info<F>::kType;
  ct::simt::Runtime rt(1);
  // The implementation's tables (matrix_layouts.h) are the document's.
  for (int l = 0; l < t.warp; ++l) {
    for (int e = 0; e < t.a_elems; ++e) {
      const RowCol rc = L::a(l, e);
      ASSERT_TRUE(rc.row == t.a[l][e].row && rc.col == t.a[l][e].col) << t.name << " A " << l;
    }
    for (int e = 0; e < t.b_elems; ++e) {
      const RowCol rc = L::b(l, e);
      ASSERT_TRUE(rc.row == t.b[l][e].row && rc.col == t.b[l][e].col) << t.name << " B " << l;
    }
    for (int e = 0; e < t.c_elems; ++e) {
      const RowCol rc = L::c(l, e);
      ASSERT_TRUE(rc.row == t.c[l][e].row && rc.col == t.c[l][e].col) << t.name << " C " << l;
    }
  }
  const std::vector<float> zero_c(t.M * t.N, 0.0f);
  // A: lane l's element e set to 1, B coded: D must be B's row k in A's row m, zeros elsewhere.
  for (int l = 0; l < t.warp; ++l)
    for (int e = 0; e < t.a_elems; ++e) {
      const RowCol at = t.a[l][e];
      Operands o{std::vector<std::uint32_t>(t.M * t.K, encode(type, 0)),
                 std::vector<std::uint32_t>(t.K * t.N), zero_c};
      o.a[at.row * t.K + at.col] = encode(type, 1);
      for (int k = 0; k < t.K; ++k)
        for (int n = 0; n < t.N; ++n) o.b[k * t.N + n] = encode(type, code(k, n));
      const std::vector<float> d = run<F>(rt, t, o);
      for (int l2 = 0; l2 < t.warp; ++l2)
        for (int i = 0; i < t.c_elems; ++i) {
          const RowCol dc = t.c[l2][i];
          const float want = dc.row == at.row ? code(at.col, dc.col) : 0.0f;
          ASSERT_EQ(d[l2 * t.c_elems + i], want)
              << t.name << ": A lane " << l << " element " << e << " (document: row " << at.row
              << ", k " << at.col << "); D lane " << l2 << " element " << i << " (row " << dc.row
              << ", col " << dc.col << ")";
        }
    }
  // B: lane l's element e set to 1, A coded: D must be A's column k in B's column n.
  for (int l = 0; l < t.warp; ++l)
    for (int e = 0; e < t.b_elems; ++e) {
      const RowCol bt = t.b[l][e];
      Operands o{std::vector<std::uint32_t>(t.M * t.K),
                 std::vector<std::uint32_t>(t.K * t.N, encode(type, 0)), zero_c};
      o.b[bt.row * t.N + bt.col] = encode(type, 1);
      for (int m = 0; m < t.M; ++m)
        for (int k = 0; k < t.K; ++k) o.a[m * t.K + k] = encode(type, code(k, m));
      const std::vector<float> d = run<F>(rt, t, o);
      for (int l2 = 0; l2 < t.warp; ++l2)
        for (int i = 0; i < t.c_elems; ++i) {
          const RowCol dc = t.c[l2][i];
          const float want = dc.col == bt.col ? code(bt.row, dc.row) : 0.0f;
          ASSERT_EQ(d[l2 * t.c_elems + i], want)
              << t.name << ": B lane " << l << " element " << e << " (document: k " << bt.row
              << ", col " << bt.col << "); D lane " << l2 << " element " << i;
        }
    }
  // D: A[m][0] = m, A[m][1] = 1, B[0][n] = 1, B[1][n] = 64 n: D[m][n] = m + 64 n names its place.
  Operands o{std::vector<std::uint32_t>(t.M * t.K, encode(type, 0)),
             std::vector<std::uint32_t>(t.K * t.N, encode(type, 0)), zero_c};
  for (int m = 0; m < t.M; ++m) {
    o.a[m * t.K] = encode(type, static_cast<float>(m));
    o.a[m * t.K + 1] = encode(type, 1);
  }
  for (int n = 0; n < t.N; ++n) {
    o.b[n] = encode(type, 1);
    o.b[t.N + n] = encode(type, 64.0f * n);
  }
  const std::vector<float> d = run<F>(rt, t, o);
  for (int l = 0; l < t.warp; ++l)
    for (int i = 0; i < t.c_elems; ++i) {
      const float got = d[l * t.c_elems + i];
      const int n = static_cast<int>(got) / 64, m = static_cast<int>(got) % 64;
      EXPECT_TRUE(m == t.c[l][i].row && n == t.c[l][i].col)
          << t.name << ": D lane " << l << " element " << i << " holds (" << m << ", " << n
          << "), the document says (" << t.c[l][i].row << ", " << t.c[l][i].col << ")";
    }
}

// Random A, B, C: D is the triple loop's, bit for bit (acc = c, k ascending, f32), at every lane;
// and the portable form (HIP, older CUDA) gives the same bits.
template <Form F>
void random_products(const Table& t, unsigned seed) {
  constexpr int type = Info<F>::kType;
  ct::simt::Runtime rt(1);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2, 2);
  for (int rep = 0; rep < 4; ++rep) {
    Operands o{std::vector<std::uint32_t>(t.M * t.K), std::vector<std::uint32_t>(t.K * t.N),
               std::vector<float>(t.M * t.N)};
    for (auto& v : o.a) v = encode(type, u(rng));
    for (auto& v : o.b) v = encode(type, u(rng));
    for (auto& v : o.c) v = u(rng);
    const std::vector<float> d = run<F>(rt, t, o), dp = run<F, true>(rt, t, o);
    bool tf32_truncation_mattered = false;
    for (int l = 0; l < t.warp; ++l)
      for (int i = 0; i < t.c_elems; ++i) {
        const int m = t.c[l][i].row, n = t.c[l][i].col;
        float acc = o.c[m * t.N + n], full = acc;
        for (int k = 0; k < t.K; ++k) {
          const float p = decode(type, o.a[m * t.K + k]) * decode(type, o.b[k * t.N + n]);
          acc += p;
          const float pf =
              ct::gpu::bits_f32(o.a[m * t.K + k]) * ct::gpu::bits_f32(o.b[k * t.N + n]);
          full += pf;
        }
        const float got = d[l * t.c_elems + i];
        ASSERT_EQ(ct::gpu::f32_bits(got), ct::gpu::f32_bits(acc))
            << t.name << " lane " << l << " element " << i << " (" << m << ", " << n << "): " << got
            << " vs " << acc;
        ASSERT_EQ(ct::gpu::f32_bits(dp[l * t.c_elems + i]), ct::gpu::f32_bits(got))
            << t.name << " portable form, lane " << l << " element " << i;
        if (type == md::kTf32 && full != acc) tf32_truncation_mattered = true;
      }
    // The random f32 inputs have low mantissa bits set: ignoring them must change some result.
    if (type == md::kTf32) {
      EXPECT_TRUE(tf32_truncation_mattered) << t.name;
    }
  }
}

TEST(SimtMatrixCollectives, DocumentTablesCoverEveryElementOnce) {
  for (const Table& t : {ptx_m16n8k16(), ptx_m16n8k8_tf32(), amd_mfma(32), amd_mfma(16)})
    expect_bijective(t);
}

// The GEMM tile's MmaLayout (kernels/mma.h) is the same table.
TEST(SimtMatrixCollectives, MmaLayoutIsTheDocumentsLayout) {
  const Table t32 = ptx_m16n8k16(), t64 = amd_mfma(32);
  using L32 = ct::gpu::MmaLayout<32>;
  using L64 = ct::gpu::MmaLayout<64>;
  for (int l = 0; l < 32; ++l) {
    for (int i = 0; i < L32::NA; ++i)
      EXPECT_TRUE(L32::a_row(l, i) == t32.a[l][i].row && L32::a_k(l, i) == t32.a[l][i].col) << l;
    for (int i = 0; i < L32::NB; ++i)
      EXPECT_TRUE(L32::b_k(l, i) == t32.b[l][i].row && L32::b_col(l, i) == t32.b[l][i].col) << l;
    for (int i = 0; i < L32::NC; ++i)
      EXPECT_TRUE(L32::c_row(l, i) == t32.c[l][i].row && L32::c_col(l, i) == t32.c[l][i].col) << l;
  }
  for (int l = 0; l < 64; ++l) {
    for (int i = 0; i < L64::NA; ++i)
      EXPECT_TRUE(L64::a_row(l, i) == t64.a[l][i].row && L64::a_k(l, i) == t64.a[l][i].col) << l;
    for (int i = 0; i < L64::NB; ++i)
      EXPECT_TRUE(L64::b_k(l, i) == t64.b[l][i].row && L64::b_col(l, i) == t64.b[l][i].col) << l;
    for (int i = 0; i < L64::NC; ++i)
      EXPECT_TRUE(L64::c_row(l, i) == t64.c[l][i].row && L64::c_col(l, i) == t64.c[l][i].col) << l;
  }
}

TEST(SimtMatrixCollectives, MmaM16n8k16F16LaneByLane) {
  probe_layouts<kMmaF16>(ptx_m16n8k16());
  random_products<kMmaF16>(ptx_m16n8k16(), 1);
}
TEST(SimtMatrixCollectives, MmaM16n8k16BF16LaneByLane) {
  probe_layouts<kMmaBF16>(ptx_m16n8k16());
  random_products<kMmaBF16>(ptx_m16n8k16(), 2);
}
TEST(SimtMatrixCollectives, MmaM16n8k8Tf32LaneByLane) {
  probe_layouts<kMmaTf32>(ptx_m16n8k8_tf32());
  random_products<kMmaTf32>(ptx_m16n8k8_tf32(), 3);
}
TEST(SimtMatrixCollectives, Mfma32x32x8F16LaneByLane) {
  probe_layouts<kMfma32F16>(amd_mfma(32));
  random_products<kMfma32F16>(amd_mfma(32), 4);
}
TEST(SimtMatrixCollectives, Mfma32x32x8BF16LaneByLane) {
  probe_layouts<kMfma32BF16>(amd_mfma(32));
  random_products<kMfma32BF16>(amd_mfma(32), 5);
}
TEST(SimtMatrixCollectives, Mfma16x16x16F16LaneByLane) {
  probe_layouts<kMfma16F16>(amd_mfma(16));
  random_products<kMfma16F16>(amd_mfma(16), 6);
}
TEST(SimtMatrixCollectives, Mfma16x16x16BF16LaneByLane) {
  probe_layouts<kMfma16BF16>(amd_mfma(16));
  random_products<kMfma16BF16>(amd_mfma(16), 7);
}

// ct_f32_to_tf32: to nearest, ties away from zero, at the 13th mantissa bit.
TEST(SimtMatrixCollectives, F32ToTf32RoundsToNearestTiesAway) {
  const std::pair<std::uint32_t, std::uint32_t> cases[] = {
      {0x3f800000u, 0x3f800000u},  // 1 stays
      {0x3f800fffu, 0x3f800000u},  // below half an ulp: down
      {0x3f801000u, 0x3f802000u},  // the tie: away from zero
      {0xbf801000u, 0xbf802000u},  // also when negative
      {0x3f802fffu, 0x3f802000u},  // odd tf32 below the tie: down
      {0x3f803000u, 0x3f804000u},  // odd tie: away, not to even
      {0x3fffffffu, 0x40000000u},  // carries into the exponent
      {0x7f7fffffu, 0x7f800000u},  // past the largest tf32: infinity
      {0x7f800000u, 0x7f800000u},  // infinity stays
      {0x00000fffu, 0x00000000u},  // subnormals round as the rest
      {0x00001000u, 0x00002000u},
  };
  for (auto [in, want] : cases)
    EXPECT_EQ(ct::gpu::f32_bits(ct_f32_to_tf32(ct::gpu::bits_f32(in))), want) << std::hex << in;
  for (std::uint32_t nan : {0x7f800001u, 0x7fc00000u, 0xff801000u})
    EXPECT_TRUE(std::isnan(ct_f32_to_tf32(ct::gpu::bits_f32(nan)))) << std::hex << nan;
}

// --- ldmatrix ------------------------------------------------------------------------------

// m: 4 matrices of 8 x 8 halves (m[j][row][col]); slot[l]: where in shared memory (16-byte rows)
// lane l's row lives -- matrix l / 8, row l % 8 -- so every row has its own address. out: the
// 4 registers of every lane.
template <int COUNT, bool TRANS, bool PORTABLE>
__global__ void CT_LAUNCH_BOUNDS(32)
    ldmatrix_kernel(const std::uint16_t* m, const int* slot, std::uint32_t* out) {
  CT_CHECK_LAUNCH_BOUNDS(32);
  CT_SHARED(std::uint16_t, rows, 64 * 8);
  const int l = threadIdx.x;
  for (int h = 0; h < 8; ++h) rows[slot[l] * 8 + h] = m[l * 8 + h];
  __syncthreads();
  // Lanes past the ones the instruction reads pass no address.
  const void* row = l < 8 * COUNT ? rows + slot[l] * 8 : nullptr;
  std::uint32_t r[COUNT];
  if constexpr (PORTABLE) {
    md::ldmatrix_portable<COUNT, TRANS>(r, row);
  } else if constexpr (COUNT == 1) {
    TRANS ? ct_ldmatrix_x1_trans(r, row) : ct_ldmatrix_x1(r, row);
  } else if constexpr (COUNT == 2) {
    TRANS ? ct_ldmatrix_x2_trans(r, row) : ct_ldmatrix_x2(r, row);
  } else {
    TRANS ? ct_ldmatrix_x4_trans(r, row) : ct_ldmatrix_x4(r, row);
  }
  for (int j = 0; j < 4; ++j) out[l * 4 + j] = j < COUNT ? r[j] : 0u;
}

// PTX ISA, "Warp-level matrix load instruction: ldmatrix": threads 0-7, 8-15, 16-23, 24-31 give
// the row addresses of matrices 0-3; each thread receives one register per matrix holding two
// elements, row = groupID (laneid / 4), columns 2 * threadID_in_group and the next one -- with
// .trans the matrix is delivered transposed: row 2 * threadID_in_group and the next one, column
// groupID.
template <int COUNT, bool TRANS, bool PORTABLE>
void check_ldmatrix() {
  ct::simt::Runtime rt(1);
  std::vector<std::uint16_t> m(4 * 8 * 8);
  for (std::size_t i = 0; i < m.size(); ++i) m[i] = static_cast<std::uint16_t>(0x1000 + 7 * i);
  std::vector<int> slot(32);
  for (int l = 0; l < 32; ++l) slot[l] = (l * 13 + 5) % 32 * 2;  // scattered, distinct
  std::vector<std::uint32_t> out(32 * 4, 0xdeadbeef);
  launch<32>(CT_KERNEL(ldmatrix_kernel<COUNT, TRANS, PORTABLE>), dim3(1), dim3(32), 0, &rt,
             m.data(), slot.data(), out.data());
  for (int lane = 0; lane < 32; ++lane) {
    const int groupID = lane / 4, threadID_in_group = lane % 4;
    for (int j = 0; j < COUNT; ++j) {
      std::uint16_t want[2];
      for (int h = 0; h < 2; ++h) {
        const int row = TRANS ? 2 * threadID_in_group + h : groupID;
        const int col = TRANS ? groupID : 2 * threadID_in_group + h;
        want[h] = m[(j * 8 + row) * 8 + col];
      }
      const std::uint32_t got = out[lane * 4 + j];
      EXPECT_EQ(got, want[0] | static_cast<std::uint32_t>(want[1]) << 16)
          << "x" << COUNT << (TRANS ? ".trans" : "") << (PORTABLE ? " portable" : "") << " lane "
          << lane << " register " << j;
    }
  }
}

TEST(SimtMatrixCollectives, LdmatrixLaneByLane) {
  check_ldmatrix<1, false, false>();
  check_ldmatrix<2, false, false>();
  check_ldmatrix<4, false, false>();
  check_ldmatrix<1, true, false>();
  check_ldmatrix<2, true, false>();
  check_ldmatrix<4, true, false>();
}

TEST(SimtMatrixCollectives, LdmatrixPortableFormLaneByLane) {
  check_ldmatrix<1, false, true>();
  check_ldmatrix<2, false, true>();
  check_ldmatrix<4, false, true>();
  check_ldmatrix<1, true, true>();
  check_ldmatrix<2, true, true>();
  check_ldmatrix<4, true, true>();
}

// --- misuse --------------------------------------------------------------------------------

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

// MODE 0: half the warp at another mma call; 1: lane 5 returns first; 2: half the warp at a
// shuffle; 3: every lane at the same call (for the warp-size and partial-warp checks).
template <int MODE>
__global__ void CT_LAUNCH_BOUNDS(64) bad_mma(float* out) {
  CT_CHECK_LAUNCH_BOUNDS(64);
  const std::uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
  float c[4] = {0, 0, 0, 0};
  const int l = threadIdx.x;
  if (MODE == 1 && l == 5) return;
  if (MODE == 0 && l < 16) {
    ct_mma_m16n8k16_f16(c, a, b, c);
  } else if (MODE == 2 && l < 16) {
    c[0] = ct_shfl_idx(c[0], 0, 32);
  } else {
    ct_mma_m16n8k16_f16(c, a, b, c);
  }
  out[l] = c[0];
}

__global__ void CT_LAUNCH_BOUNDS(32) bad_mfma(float* out) {
  CT_CHECK_LAUNCH_BOUNDS(32);
  const std::uint32_t a[2] = {0, 0}, b[2] = {0, 0};
  float c[4] = {0, 0, 0, 0};
  ct_mfma_16x16x16_f16(c, a, b, c);
  out[threadIdx.x] = c[0];
}

// MODE 0: rows in global memory; 1: a row 2 bytes off 16-byte alignment.
template <int MODE>
__global__ void CT_LAUNCH_BOUNDS(32) bad_ldmatrix(const std::uint16_t* global, std::uint32_t* out) {
  CT_CHECK_LAUNCH_BOUNDS(32);
  CT_SHARED(std::uint16_t, rows, 8 * 8 + 8);
  const int l = threadIdx.x;
  rows[l] = 0;
  __syncthreads();
  const void* row = MODE == 0 ? static_cast<const void*>(global + 8 * (l % 8))
                              : static_cast<const void*>(rows + 8 * (l % 8) + (l == 3 ? 1 : 0));
  std::uint32_t r[1];
  ct_ldmatrix_x1(r, row);
  out[l] = r[0];
}

TEST(SimtMatrixCollectives, MisuseIsReportedNamingTheKernel) {
  ct::simt::Runtime rt(1);
  std::vector<float> out(128);
  std::string e =
      error_of([&] { launch<32>(CT_KERNEL(bad_mma<0>), dim3(1), dim3(32), 0, &rt, out.data()); });
  EXPECT_NE(e.find("simt: kernel bad_mma<0>"), std::string::npos) << e;
  EXPECT_NE(e.find("while its warp waits at mma.m16n8k16.f32.f16"), std::string::npos) << e;

  e = error_of([&] { launch<32>(CT_KERNEL(bad_mma<1>), dim3(1), dim3(32), 0, &rt, out.data()); });
  EXPECT_NE(e.find("simt: kernel bad_mma<1>"), std::string::npos) << e;
  EXPECT_NE(e.find("mma.m16n8k16.f32.f16"), std::string::npos) << e;
  EXPECT_NE(e.find("returned"), std::string::npos) << e;

  e = error_of([&] { launch<32>(CT_KERNEL(bad_mma<2>), dim3(1), dim3(32), 0, &rt, out.data()); });
  EXPECT_NE(e.find("simt: kernel bad_mma<2>"), std::string::npos) << e;
  EXPECT_NE(e.find("shfl_idx"), std::string::npos) << e;
  EXPECT_NE(e.find("mma.m16n8k16.f32.f16"), std::string::npos) << e;

  e = error_of([&] { launch<64>(CT_KERNEL(bad_mma<3>), dim3(1), dim3(64), 0, &rt, out.data()); });
  EXPECT_NE(e.find("simt: kernel bad_mma<3>"), std::string::npos) << e;
  EXPECT_NE(e.find("is a 32-lane instruction; this launch runs warps of 64"), std::string::npos)
      << e;

  e = error_of([&] { launch<32>(CT_KERNEL(bad_mma<3>), dim3(1), dim3(48), 0, &rt, out.data()); });
  EXPECT_NE(e.find("needs a full warp; this one has 16 lanes"), std::string::npos) << e;

  e = error_of([&] { launch<32>(CT_KERNEL(bad_mfma), dim3(1), dim3(32), 0, &rt, out.data()); });
  EXPECT_NE(e.find("simt: kernel bad_mfma"), std::string::npos) << e;
  EXPECT_NE(e.find("v_mfma_f32_16x16x16f16"), std::string::npos) << e;
  EXPECT_NE(e.find("64-lane instruction"), std::string::npos) << e;

  std::vector<std::uint16_t> global(64, 0);
  std::vector<std::uint32_t> regs(32);
  e = error_of([&] {
    launch<32>(CT_KERNEL(bad_ldmatrix<0>), dim3(1), dim3(32), 0, &rt, global.data(), regs.data());
  });
  EXPECT_NE(e.find("simt: kernel bad_ldmatrix<0>"), std::string::npos) << e;
  EXPECT_NE(e.find("lane 0's row address (row 0 of matrix 0) is not in the block's shared memory"),
            std::string::npos)
      << e;
  e = error_of([&] {
    launch<32>(CT_KERNEL(bad_ldmatrix<1>), dim3(1), dim3(32), 0, &rt, global.data(), regs.data());
  });
  EXPECT_NE(e.find("lane 3's row address (row 3 of matrix 0) is not 16-byte aligned"),
            std::string::npos)
      << e;
}

// --- cp.async: copies land when a wait retires their group -----------------------------------

// out (blockDim.x, 7): what thread t reads of its own shared slots along the way. Slot 0 gets
// a[t]'s 16 bytes (group 1), slot 1 b[t]'s (group 2), slot 2 zeros (not yet committed); all
// three hold 0xaaaaaaaa before.
__global__ void CT_LAUNCH_BOUNDS(64)
    async_copies(const std::uint32_t* a, const std::uint32_t* b, std::uint32_t* out) {
  CT_CHECK_LAUNCH_BOUNDS(64);
  CT_SHARED(std::uint32_t, slots, 64 * 12);
  const int t = threadIdx.x;
  std::uint32_t* s = slots + 12 * t;
  std::uint32_t* o = out + 7 * t;
  for (int i = 0; i < 12; ++i) s[i] = 0xaaaaaaaau;
  ct_cp_async_16(s, a + 4 * t, 16);
  ct_cp_async_commit();
  ct_cp_async_16(s + 4, b + 4 * t, 16);
  ct_cp_async_commit();
  ct_cp_async_16(s + 8, a + 4 * t, 0);
  o[0] = s[0], o[1] = s[4];  // nothing landed
  ct_cp_async_wait<1>();
  o[2] = s[0], o[3] = s[4];  // group 1 landed, group 2 not
  ct_cp_async_wait<0>();
  o[4] = s[4], o[5] = s[8];  // group 2 landed; the uncommitted zeros not
  ct_cp_async_commit();
  ct_cp_async_wait<0>();
  o[6] = s[8] | s[9] | s[10] | s[11];  // zeros
}

template <int MODE>
__global__ void CT_LAUNCH_BOUNDS(32) bad_async_copy(const std::uint32_t* a, std::uint32_t* global) {
  CT_CHECK_LAUNCH_BOUNDS(32);
  CT_SHARED(std::uint32_t, s, 32 * 4 + 1);
  const int t = threadIdx.x;
  if (MODE == 0) ct_cp_async_16(global + 4 * t, a + 4 * t, 16);  // global memory
  if (MODE == 1) ct_cp_async_16(s + 4 * t + 1, a + 4 * t, 16);   // not 16-byte aligned
  if (MODE == 2) ct_cp_async_16(s + 4 * t, a + 4 * t, 8);        // 8 bytes
}

TEST(SimtMatrixCollectives, AsyncCopiesLandWhenAWaitRetiresTheirGroup) {
  ct::simt::Runtime rt(2);
  const int threads = 64;
  std::vector<std::uint32_t> a(4 * threads), b(4 * threads), out(7 * threads, 0);
  for (int i = 0; i < 4 * threads; ++i) a[i] = 0x10000u + i, b[i] = 0x20000u + i;
  launch<32>(CT_KERNEL(async_copies), dim3(1), dim3(threads), 0, &rt, a.data(), b.data(),
             out.data());
  for (int t = 0; t < threads; ++t) {
    const std::uint32_t* o = &out[7 * t];
    const std::uint32_t want[7] = {0xaaaaaaaau, 0xaaaaaaaau, a[4 * t], 0xaaaaaaaau,
                                   b[4 * t],    0xaaaaaaaau, 0u};
    for (int i = 0; i < 7; ++i) EXPECT_EQ(o[i], want[i]) << "thread " << t << ", read " << i;
  }

  std::vector<std::uint32_t> global(4 * 32);
  std::string e = error_of([&] {
    launch<32>(CT_KERNEL(bad_async_copy<0>), dim3(1), dim3(32), 0, &rt, a.data(), global.data());
  });
  EXPECT_NE(e.find("simt: kernel bad_async_copy<0>"), std::string::npos) << e;
  EXPECT_NE(e.find("outside the block's shared memory or not 16-byte aligned"), std::string::npos)
      << e;
  e = error_of([&] {
    launch<32>(CT_KERNEL(bad_async_copy<1>), dim3(1), dim3(32), 0, &rt, a.data(), global.data());
  });
  EXPECT_NE(e.find("outside the block's shared memory or not 16-byte aligned"), std::string::npos)
      << e;
  e = error_of([&] {
    launch<32>(CT_KERNEL(bad_async_copy<2>), dim3(1), dim3(32), 0, &rt, a.data(), global.data());
  });
  EXPECT_NE(e.find("cp.async (ct_cp_async_16) of 8 bytes"), std::string::npos) << e;
}

}  // namespace
