// The SIMT runtime's matrix instructions: the arithmetic behind ct::simt::matrix (simt.h), run
// once per warp by the last lane to arrive, over every lane's registers. Which register holds
// which element is backends/gpu/matrix_layouts.h; this file only applies it.
#include <cstring>
#include <string>

#include "backends/gpu/matrix_layouts.h"
#include "backends/gpu/numeric.h"  // the kernels' f16 / bf16 conversions
#include "backends/simt/simt.h"

namespace ct::simt {

const char* matrix_op_name(MatrixOp op) {
  switch (op) {
    case MatrixOp::kMmaF16:
      return "mma.m16n8k16.f32.f16";
    case MatrixOp::kMmaBF16:
      return "mma.m16n8k16.f32.bf16";
    case MatrixOp::kMmaTf32:
      return "mma.m16n8k8.f32.tf32";
    case MatrixOp::kLdmatrixX1:
      return "ldmatrix.m8n8.x1.b16";
    case MatrixOp::kLdmatrixX2:
      return "ldmatrix.m8n8.x2.b16";
    case MatrixOp::kLdmatrixX4:
      return "ldmatrix.m8n8.x4.b16";
    case MatrixOp::kLdmatrixX1Trans:
      return "ldmatrix.m8n8.x1.trans.b16";
    case MatrixOp::kLdmatrixX2Trans:
      return "ldmatrix.m8n8.x2.trans.b16";
    case MatrixOp::kLdmatrixX4Trans:
      return "ldmatrix.m8n8.x4.trans.b16";
    case MatrixOp::kMfma32x32x8F16:
      return "v_mfma_f32_32x32x8f16";
    case MatrixOp::kMfma32x32x8BF16:
      return "v_mfma_f32_32x32x8bf16_1k";
    case MatrixOp::kMfma16x16x16F16:
      return "v_mfma_f32_16x16x16f16";
    case MatrixOp::kMfma16x16x16BF16:
      return "v_mfma_f32_16x16x16bf16_1k";
  }
  return "?";
}

int matrix_op_warp(MatrixOp op) {
  return op >= MatrixOp::kMfma32x32x8F16 ? 64 : 32;
}

namespace detail {
namespace {

namespace layout = ::ct::gpu::layout;

enum class In { kF16, kBF16, kTf32 };

float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
// Element e of a lane's operand registers (see matrix_layouts.h for the numbering).
template <In type>
float element(const std::uint32_t* regs, int e) {
  if constexpr (type ==
                In::kTf32) {  // tf32: the low 13 of the 23 mantissa bits ignored; NaN stays NaN
    const std::uint32_t u = regs[e];
    return from_bits((u & 0x7fffffffu) > 0x7f800000u ? u : u & 0xffffe000u);
  }
  const auto h = static_cast<std::uint16_t>(regs[e / 2] >> (16 * (e % 2)));
  if constexpr (type == In::kF16) return ::ct::gpu::f16_to_f32(h);
  return ::ct::gpu::bf16_to_f32(h);
}

std::string lane_str(int lane) {
  return "lane " + std::to_string(lane);
}

// D = C + A B over the warp, k in order (the order simt.h states): acc[m][n] starts at c and
// takes the products for k = 0, 1, ..; the loop over n runs across independent sums.
template <typename L, In type>
std::string mma(const MatrixArgs* const* lanes) {
  float a[L::M][L::K], b[L::K][L::N], acc[L::M][L::N];
  for (int l = 0; l < L::kWarp; ++l)
    if (!lanes[l]->a || !lanes[l]->b || !lanes[l]->c || !lanes[l]->d)
      return lane_str(l) + " passed no A, B, C or D registers";
  for (int l = 0; l < L::kWarp; ++l) {
    for (int e = 0; e < L::kAElems; ++e) {
      const layout::RowCol rc = L::a(l, e);
      a[rc.row][rc.col] = element<type>(lanes[l]->a, e);
    }
    for (int e = 0; e < L::kBElems; ++e) {
      const layout::RowCol rc = L::b(l, e);
      b[rc.row][rc.col] = element<type>(lanes[l]->b, e);
    }
    for (int e = 0; e < L::kC; ++e) {
      const layout::RowCol rc = L::c(l, e);
      acc[rc.row][rc.col] = lanes[l]->c[e];
    }
  }
  for (int m = 0; m < L::M; ++m)
    for (int k = 0; k < L::K; ++k) {
      const float x = a[m][k];
      for (int n = 0; n < L::N; ++n) {
        const float p = x * b[k][n];  // exact for 16-bit and tf32 inputs
        acc[m][n] += p;
      }
    }
  // Written after every lane's C has been read: d may be c.
  for (int l = 0; l < L::kWarp; ++l)
    for (int e = 0; e < L::kC; ++e) {
      const layout::RowCol rc = L::c(l, e);
      lanes[l]->d[e] = acc[rc.row][rc.col];
    }
  return {};
}

std::string ldmatrix(int count, bool trans, const MatrixArgs* const* lanes,
                     const std::byte* shared_lo, const std::byte* shared_hi) {
  using L = layout::Ldmatrix;
  std::uint16_t m[4][8][8];
  for (int j = 0; j < count; ++j)
    for (int i = 0; i < 8; ++i) {
      const int l = L::address_lane(j, i);
      const auto* p = static_cast<const std::byte*>(lanes[l]->row);
      if (p < shared_lo || p + 16 > shared_hi)
        return lane_str(l) + "'s row address (row " + std::to_string(i) + " of matrix " +
               std::to_string(j) + ") is not in the block's shared memory";
      if (reinterpret_cast<std::uintptr_t>(p) % 16)
        return lane_str(l) + "'s row address (row " + std::to_string(i) + " of matrix " +
               std::to_string(j) + ") is not 16-byte aligned";
      std::memcpy(m[j][i], p, 16);
    }
  for (int l = 0; l < L::kWarp; ++l) {
    if (!lanes[l]->r) return lane_str(l) + " passed no destination registers";
    for (int j = 0; j < count; ++j) {
      std::uint32_t reg = 0;
      for (int h = 0; h < 2; ++h) {
        const layout::RowCol rc = L::element(l, h, trans);
        reg |= static_cast<std::uint32_t>(m[j][rc.row][rc.col]) << (16 * h);
      }
      lanes[l]->r[j] = reg;
    }
  }
  return {};
}

}  // namespace

std::string compute_matrix(MatrixOp op, const MatrixArgs* const* lanes, const std::byte* shared_lo,
                           const std::byte* shared_hi) {
  switch (op) {
    case MatrixOp::kMmaF16:
      return mma<layout::M16N8K16, In::kF16>(lanes);
    case MatrixOp::kMmaBF16:
      return mma<layout::M16N8K16, In::kBF16>(lanes);
    case MatrixOp::kMmaTf32:
      return mma<layout::M16N8K8Tf32, In::kTf32>(lanes);
    case MatrixOp::kLdmatrixX1:
    case MatrixOp::kLdmatrixX2:
    case MatrixOp::kLdmatrixX4:
      return ldmatrix(1 << (static_cast<int>(op) - static_cast<int>(MatrixOp::kLdmatrixX1)), false,
                      lanes, shared_lo, shared_hi);
    case MatrixOp::kLdmatrixX1Trans:
    case MatrixOp::kLdmatrixX2Trans:
    case MatrixOp::kLdmatrixX4Trans:
      return ldmatrix(1 << (static_cast<int>(op) - static_cast<int>(MatrixOp::kLdmatrixX1Trans)),
                      true, lanes, shared_lo, shared_hi);
    case MatrixOp::kMfma32x32x8F16:
      return mma<layout::Mfma32x32x8, In::kF16>(lanes);
    case MatrixOp::kMfma32x32x8BF16:
      return mma<layout::Mfma32x32x8, In::kBF16>(lanes);
    case MatrixOp::kMfma16x16x16F16:
      return mma<layout::Mfma16x16x16, In::kF16>(lanes);
    case MatrixOp::kMfma16x16x16BF16:
      return mma<layout::Mfma16x16x16, In::kBF16>(lanes);
  }
  return "unknown matrix instruction";
}

}  // namespace detail
}  // namespace ct::simt
